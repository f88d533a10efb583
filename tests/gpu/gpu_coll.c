/*
 * The collective matrices: every collective x type x operator x count x in
 * place / out of place x root, then unaligned buffers, then 256 MiB.
 *
 *   types   all 12 (int8 ... fp8 e5m2)
 *   ops     sum, prod, max, min, avg, PreMulSum with a host scalar and with
 *           a device scalar (the collectives that reduce; the others move data)
 *   counts  0, 1, 7, 4097, 1048579 (1M + 3)
 *   roots   0 and nranks - 1 (Broadcast, Reduce, Gather, Scatter)
 *
 * suite_coll covers AllReduce, AllGather, ReduceScatter, Broadcast (ncclBcast
 * when in place) and Reduce; suite_p2pcoll the collectives built on
 * point-to-point: AlltoAll, Gather, Scatter. --quick keeps 4 types, 4
 * operators, counts 0, 7 and 4097, and no 256 MiB cases (for compute-sanitizer).
 */
#include <stddef.h>

#include "gpu_test.h"

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define LARGE_BYTES ((size_t)256 << 20)

struct matrix {
  const ncclDataType_t* types;
  size_t ntypes;
  const gpu_op_t* ops;
  size_t nops;
  const size_t* counts;
  size_t ncounts;
};

static const gpu_op_t all_ops[] = {GPU_OP_SUM, GPU_OP_PROD,        GPU_OP_MAX,       GPU_OP_MIN,
                                   GPU_OP_AVG, GPU_OP_PREMUL_HOST, GPU_OP_PREMUL_DEV};
static const size_t all_counts[] = {0, 1, 7, 4097, 1048579};
static const ncclDataType_t quick_types[] = {ncclInt8, ncclFloat16, ncclFloat32, ncclFloat8e4m3};
static const gpu_op_t quick_ops[] = {GPU_OP_SUM, GPU_OP_MAX, GPU_OP_AVG, GPU_OP_PREMUL_DEV};
static const size_t quick_counts[] = {0, 7, 4097};

static struct matrix matrix_for(const struct gpu_world* w) {
  if (w->opts->quick)
    return (struct matrix){quick_types,          ARRAY_LEN(quick_types), quick_ops,
                           ARRAY_LEN(quick_ops), quick_counts,           ARRAY_LEN(quick_counts)};
  return (struct matrix){gpu_all_types, ARRAY_LEN(gpu_all_types), all_ops, ARRAY_LEN(all_ops),
                         all_counts,    ARRAY_LEN(all_counts)};
}

/* Runs `c` in place and out of place, at every root its collective has; *index numbers cases. */
static void matrix_variants(struct gpu_world* w, struct gpu_case c, unsigned suite, size_t* index) {
  int roots[2] = {0, w->nranks - 1};
  int nroots = !coll_has_root(c.coll) ? 1 : w->nranks > 1 ? 2 : 1;
  for (int inplace = 0; inplace < 2; inplace++) {
    for (int i = 0; i < nroots; i++) {
      c.inplace = inplace;
      c.root = coll_has_root(c.coll) ? roots[i] : -1;
      run_case(w, &c, suite, (*index)++);
    }
  }
}

static void matrix_run(struct gpu_world* w, gpu_coll_t coll, unsigned suite, size_t* index) {
  struct matrix m = matrix_for(w);
  static const gpu_op_t none[] = {GPU_OP_NONE};
  const gpu_op_t* ops = coll_is_reduction(coll) ? m.ops : none;
  size_t nops = coll_is_reduction(coll) ? m.nops : 1;
  for (size_t t = 0; t < m.ntypes; t++)
    for (size_t o = 0; o < nops; o++)
      for (size_t k = 0; k < m.ncounts; k++) {
        struct gpu_case c = {.coll = coll, .type = m.types[t], .op = ops[o], .count = m.counts[k]};
        matrix_variants(w, c, suite, index);
      }
}

/*
 * Unaligned buffers: send and receive pointers 3 and 1 elements past the
 * allocation (3 and 1 bytes for int8, 12 and 4 for float), so neither is
 * 16-byte aligned and they are misaligned differently.
 */
static void unaligned_run(struct gpu_world* w, const struct gpu_case* list, size_t n,
                          unsigned suite, size_t* index) {
  static const size_t counts[] = {1, 7, 4097, 1048579};
  size_t ncounts = w->opts->quick ? 2 : ARRAY_LEN(counts);
  for (size_t i = 0; i < n; i++)
    for (size_t k = 0; k < ncounts; k++) {
      struct gpu_case c = list[i];
      c.count = counts[w->opts->quick ? k + 1 : k];
      c.unaligned = 1;
      matrix_variants(w, c, suite, index);
    }
}

/*
 * 256 MiB: the largest buffer of a rank (the receive side of AllGather, the
 * send side of ReduceScatter, ...) holds 256 MiB. The host reference is what
 * costs here (about 2^28 element checks per case and rank), so this size runs
 * a restricted set only: every collective with float sum (float data for the
 * ones that do not reduce), plus bfloat16 sum and int8 max for AllReduce; out
 * of place, and in place for AllReduce and AlltoAll float only; root nranks - 1 (root 0 is
 * the easy one and is covered by the smaller sizes).
 */
static void large_run(struct gpu_world* w, const struct gpu_case* list, size_t n, unsigned suite,
                      size_t* index) {
  if (w->opts->quick) return;
  for (size_t i = 0; i < n; i++) {
    struct gpu_case c = list[i];
    size_t elems = LARGE_BYTES / ref_type(c.type)->size;
    int blocks = c.coll == COLL_ALLGATHER || c.coll == COLL_REDUCESCATTER ||
                 c.coll == COLL_ALLTOALL || c.coll == COLL_GATHER || c.coll == COLL_SCATTER;
    c.count = blocks ? elems / (size_t)w->nranks : elems;
    c.root = coll_has_root(c.coll) ? w->nranks - 1 : -1;
    run_case(w, &c, suite, (*index)++);
  }
}

void suite_coll(struct gpu_world* w) {
  static const gpu_coll_t colls[] = {COLL_ALLREDUCE, COLL_ALLGATHER, COLL_REDUCESCATTER,
                                     COLL_BROADCAST, COLL_REDUCE};
  static const struct gpu_case unaligned[] = {
      {.coll = COLL_ALLREDUCE, .type = ncclFloat32, .op = GPU_OP_SUM},
      {.coll = COLL_ALLREDUCE, .type = ncclInt8, .op = GPU_OP_SUM},
      {.coll = COLL_ALLREDUCE, .type = ncclFloat16, .op = GPU_OP_PREMUL_DEV},
      {.coll = COLL_ALLGATHER, .type = ncclFloat32},
      {.coll = COLL_ALLGATHER, .type = ncclInt8},
      {.coll = COLL_REDUCESCATTER, .type = ncclFloat32, .op = GPU_OP_SUM},
      {.coll = COLL_REDUCESCATTER, .type = ncclInt8, .op = GPU_OP_MAX},
      {.coll = COLL_BROADCAST, .type = ncclFloat32},
      {.coll = COLL_BROADCAST, .type = ncclInt8},
      {.coll = COLL_REDUCE, .type = ncclBfloat16, .op = GPU_OP_SUM},
  };
  static const struct gpu_case large[] = {
      {.coll = COLL_ALLREDUCE, .type = ncclFloat32, .op = GPU_OP_SUM},
      {.coll = COLL_ALLREDUCE, .type = ncclFloat32, .op = GPU_OP_SUM, .inplace = 1},
      {.coll = COLL_ALLREDUCE, .type = ncclBfloat16, .op = GPU_OP_SUM},
      {.coll = COLL_ALLREDUCE, .type = ncclInt8, .op = GPU_OP_MAX},
      {.coll = COLL_ALLGATHER, .type = ncclFloat32},
      {.coll = COLL_REDUCESCATTER, .type = ncclFloat32, .op = GPU_OP_SUM},
      {.coll = COLL_BROADCAST, .type = ncclFloat32},
      {.coll = COLL_REDUCE, .type = ncclFloat32, .op = GPU_OP_SUM},
  };
  size_t index = 0;
  for (size_t i = 0; i < ARRAY_LEN(colls); i++) matrix_run(w, colls[i], SUITE_COLL, &index);
  unaligned_run(w, unaligned, ARRAY_LEN(unaligned), SUITE_COLL, &index);
  large_run(w, large, ARRAY_LEN(large), SUITE_COLL, &index);
}

void suite_p2pcoll(struct gpu_world* w) {
  static const gpu_coll_t colls[] = {COLL_ALLTOALL, COLL_GATHER, COLL_SCATTER};
  static const struct gpu_case unaligned[] = {
      {.coll = COLL_ALLTOALL, .type = ncclFloat32}, {.coll = COLL_ALLTOALL, .type = ncclInt8},
      {.coll = COLL_GATHER, .type = ncclFloat32},   {.coll = COLL_GATHER, .type = ncclInt8},
      {.coll = COLL_SCATTER, .type = ncclFloat32},  {.coll = COLL_SCATTER, .type = ncclInt8},
  };
  static const struct gpu_case large[] = {
      {.coll = COLL_ALLTOALL, .type = ncclFloat32},
      {.coll = COLL_ALLTOALL, .type = ncclFloat32, .inplace = 1},
      {.coll = COLL_GATHER, .type = ncclFloat32},
      {.coll = COLL_SCATTER, .type = ncclFloat32},
  };
  size_t index = 0;
  for (size_t i = 0; i < ARRAY_LEN(colls); i++) matrix_run(w, colls[i], SUITE_P2P, &index);
  unaligned_run(w, unaligned, ARRAY_LEN(unaligned), SUITE_P2P, &index);
  large_run(w, large, ARRAY_LEN(large), SUITE_P2P, &index);
}

/*
 * Reductions whose bits must not depend on protocol, channel count or chunk
 * size under BRAID_DETERMINISTIC=1. Those come from the environment when the
 * library loads, so one run cannot vary them: each checked output's hash is
 * printed, and tests/gpu/determinism_check.sh runs this suite under several
 * settings (same --seed) and compares the hashes. Inputs are floating point
 * with full mantissas (gpu_ref.c's fill), so a different order of additions
 * shows in the bits; each output is also checked against the reference, so
 * identical wrong answers cannot pass.
 */
void suite_determinism(struct gpu_world* w) {
  static const struct gpu_case cases[] = {
      {.coll = COLL_ALLREDUCE, .type = ncclFloat32, .op = GPU_OP_SUM, .count = 4099},
      {.coll = COLL_ALLREDUCE, .type = ncclFloat32, .op = GPU_OP_SUM, .count = (1u << 20) + 3},
      {.coll = COLL_ALLREDUCE, .type = ncclFloat32, .op = GPU_OP_SUM, .count = (1u << 20) + 3,
       .inplace = 1},
      {.coll = COLL_ALLREDUCE, .type = ncclFloat64, .op = GPU_OP_SUM, .count = 300007},
      {.coll = COLL_ALLREDUCE, .type = ncclFloat32, .op = GPU_OP_PROD, .count = 65539},
      {.coll = COLL_ALLREDUCE, .type = ncclFloat32, .op = GPU_OP_AVG, .count = 65539},
      {.coll = COLL_REDUCESCATTER, .type = ncclFloat32, .op = GPU_OP_SUM, .count = 262147},
      {.coll = COLL_REDUCE, .type = ncclFloat32, .op = GPU_OP_SUM, .count = 262147, .root = 1},
  };
  for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
    struct gpu_case c = cases[i];
    if (!coll_has_root(c.coll)) c.root = -1;
    if (c.root >= w->nranks) c.root = w->nranks - 1;
    run_case_hashed(w, &c, SUITE_DETERMINISM, i);
  }
}
