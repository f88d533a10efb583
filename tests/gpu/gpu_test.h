/*
 * The GPU correctness suite (gpu_coll): what its files share.
 *
 * The suite drives the public NCCL API only (include/nccl.h plus the CUDA
 * runtime), so the same binary also runs against NVIDIA's libnccl.so.2 by
 * LD_LIBRARY_PATH. Every case fills its inputs with seeded random values,
 * poisons its outputs, runs one or more NCCL calls on every rank and
 * compares what came back with a reference computed on the host.
 *
 *   gpu_ref.c      element types, input values, reference results, tolerances
 *   gpu_case.c     one collective call: buffers, layout, issue, check
 *   gpu_world.c    the ranks: one process over all GPUs or one process per GPU
 *   gpu_coll.c     the collective matrices (AllReduce ... Scatter)
 *   gpu_p2p.c      send/receive patterns (ring, exchange, self, ...)
 *   gpu_inflight.c many calls in flight: two communicators, several streams, groups
 *   gpu_errors.c   the API's answers to wrong arguments
 *   gpu_sym.c      all-reduces whose input lies in a symmetric window
 *   gpu_main.c     options and the suites
 */
#ifndef BRAID_TESTS_GPU_TEST_H
#define BRAID_TESTS_GPU_TEST_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include "nccl.h"

#define GPU_MAX_RANKS 8
#define GPU_SKIP_CODE 77 /* CTest's SKIP_RETURN_CODE */
#define GPU_POISON 0xA5  /* every output byte before a call: a missed write shows */
#define GPU_GUARD 64     /* poisoned bytes after every receive buffer: an overrun shows */
#define GPU_ID_SLOTS 9   /* unique ids the procs children share: 0 first comm, 1 second, 2.. tests */

/* ---- element types, values and reference results (gpu_ref.c) ------------------------------- */

/* What a case computes. GPU_OP_NONE: the call moves data without reducing it. */
typedef enum {
  GPU_OP_NONE = 0,
  GPU_OP_SUM,
  GPU_OP_PROD,
  GPU_OP_MAX,
  GPU_OP_MIN,
  GPU_OP_AVG,
  GPU_OP_PREMUL_HOST, /* ncclRedOpCreatePreMulSum, scalar ncclScalarHostImmediate */
  GPU_OP_PREMUL_DEV,  /* ncclRedOpCreatePreMulSum, scalar ncclScalarDevice */
  GPU_OP_PREMUL_SAME, /* ncclRedOpCreatePreMulSum, ncclScalarHostImmediate, one scalar for all */
  GPU_OP_COUNT
} gpu_op_t;

struct gpu_type {
  const char* name; /* short, for case names: "f16" */
  size_t size;
  int is_float;
  int is_signed;
  double rel_tol; /* floating: allowed error per rank, relative to the sum of |terms| */
  double abs_tol; /* floating: allowed error per rank near zero (the smallest subnormal) */
};

extern const ncclDataType_t gpu_all_types[ncclNumTypes];

void ref_init(void); /* builds the decoding tables; call once before anything below */
const struct gpu_type* ref_type(ncclDataType_t t);
const char* ref_op_name(gpu_op_t op);
/* 1 for the PreMulSum operators (GPU_OP_PREMUL_*). */
int ref_op_is_premul(gpu_op_t op);

/* Fills n elements with values for `op` on `nranks` ranks (never zero, never overflowing). */
void ref_fill(ncclDataType_t t, gpu_op_t op, int nranks, uint64_t seed, void* buf, size_t n);

/* Writes the PreMulSum scalar rank `rank` uses (one element of type t) to `out`. */
void ref_premul_scalar(ncclDataType_t t, gpu_op_t op, int rank, void* out);

/* What one reduction over the ranks must produce for one element. */
struct ref_ctx {
  ncclDataType_t type;
  gpu_op_t op;
  int nranks;
  double fscalar[GPU_MAX_RANKS];   /* PreMulSum scalar per rank, floating types */
  uint64_t iscalar[GPU_MAX_RANKS]; /* the same, integer types (sign-extended) */
};

void ref_ctx_init(struct ref_ctx* c, ncclDataType_t t, gpu_op_t op, int nranks);

/*
 * Compares element `j` of `got` with the reduction of element `idx` of every
 * rank's input `in[r]`. Returns 1 when it matches; otherwise 0 and, when `why`
 * is given, a description "got ..., expected ...".
 */
int ref_check_reduced(const struct ref_ctx* c, const void* const* in, size_t idx, const void* got,
                      size_t j, char* why, size_t why_len);

/* Compares element `j` of `got` with element `idx` of `want`, bit for bit. */
int ref_check_copied(ncclDataType_t t, const void* want, size_t idx, const void* got, size_t j,
                     char* why, size_t why_len);

/* Writes element i as text ("-1.5 (0xbe00)"). */
void ref_format(ncclDataType_t t, const void* buf, size_t i, char* out, size_t len);

/* ---- the ranks (gpu_world.c) ----------------------------------------------------------------- */

struct gpu_opts {
  const char* mode;  /* "threads", "procs", "hosts" (procs, each rank its own host),
                        "sharegpu", "isolated" (procs, each rank seeing its GPU alone) or
                        "mixed" (the even ranks isolated) */
  const char* suite; /* "all", "coll", "p2p", "inflight", "errors", "api", "leaks",
                        "sym", "deadpeer", "hang", "hangsend", "abortwait",
                        "abortpeer", "abortstuck", "shmfiles" */
  int nranks;
  int ranks_per_host; /* hosts mode: consecutive ranks per emulated host (P2P among them) */
  int quick;
  int list; /* print the case names, run nothing (needs no GPU) */
  /* Run no case on purpose: making and destroying the communicators is the test. */
  int no_cases;
  int init_fails; /* with no_cases: every rank's init must return an error */
  int verbose;
  const char* filter;
  uint64_t seed;
  unsigned case_timeout_s; /* a case running longer is reported as hung */
  double timeout_s;        /* procs: the whole run */
};

struct gpu_tally; /* case counts; shared by every process in procs mode */

struct gpu_world {
  const struct gpu_opts* opts;
  int nranks;
  int nlocal; /* ranks this process drives: all of them (threads) or one (procs) */
  int rank0;  /* global rank of local rank 0 */
  int dev[GPU_MAX_RANKS];
  ncclComm_t comm[GPU_MAX_RANKS];
  cudaStream_t stream[GPU_MAX_RANKS];
  ncclComm_t comm2[GPU_MAX_RANKS]; /* a second communicator (world_comm2), or NULL */
  cudaStream_t stream2[GPU_MAX_RANKS];
  const ncclUniqueId* ids; /* procs: the two communicators' ids */
  struct gpu_shared* shared; /* procs: what the children share (gpu_world.c) */
  struct gpu_tally* tally;
  /* the case now running */
  int ordinal;  /* cases begun so far, the same sequence in every process */
  int failures; /* cases this process saw fail */
  int case_failed;
  char case_name[224];
};

/* Runs `suites` on the world opts->mode asks for; returns the exit status (0, 1 or 77). */
int world_main(const struct gpu_opts* opts, void (*suites)(struct gpu_world* w));

/* 1 when the case named `name` is to run now (it passes the filter and this is no listing). */
int world_case_begin(struct gpu_world* w, const char* name);
/*
 * The case `name` cannot run here: when it passes the filter (and this is no
 * listing), prints "SKIP <name>: <why>" once and counts it as skipped. Every
 * process of the run must make the same call (they count cases alike).
 */
void world_case_skip(struct gpu_world* w, const char* name, const char* why);
/* `fits`, after skipping the case (world_case_skip) with `why` when it is 0. */
int world_case_fits(struct gpu_world* w, const char* name, int fits, const char* why);
/*
 * Ends the case now running (in place of world_case_end) as skipped: once
 * begun, it found nothing it could check here; prints "SKIP <name>: <why>".
 * A case that failed already stays failed.
 */
void world_case_end_skipped(struct gpu_world* w, const char* why);
void world_case_end(struct gpu_world* w);
/* Reports a failure of the current case, prefixed with its name and this process's ranks. */
void world_case_fail(struct gpu_world* w, const char* fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Seconds on CLOCK_MONOTONIC: one clock for every process of the machine. */
double world_now(void);

/* Check helpers: 0 on success; otherwise report (CUDA or NCCL error text) and return -1. */
int world_cuda(struct gpu_world* w, cudaError_t err, const char* what);
int world_nccl(struct gpu_world* w, ncclResult_t res, ncclComm_t comm, const char* what);

/* ncclGroupStart/End around one call per local rank, reported as failures of the case. */
int world_group_start(struct gpu_world* w);
int world_group_end(struct gpu_world* w);
/* Waits for every stream of every local rank. */
int world_sync(struct gpu_world* w);
/*
 * A unique id every process agrees on, for a communicator the suite makes
 * itself: in procs mode rank 0 makes id slot `slot` (2 or more, each used
 * once) and the others wait for it; in threads mode a fresh one. 0 on success.
 */
int world_id(struct gpu_world* w, int slot, ncclUniqueId* id);
/* world_id, made by the process that runs rank `maker` (so that a root lives there). */
int world_id_from(struct gpu_world* w, int slot, int maker, ncclUniqueId* id);
/* Slot i (0..3) of a few doubles every process of the run shares (zero at start). */
volatile double* world_stamp(struct gpu_world* w, int i);
/* Creates the second communicator over the same GPUs (once); 0 on success. */
int world_comm2(struct gpu_world* w);
/* A seed for the inputs of (suite, case, rank), derived from the run's seed. */
uint64_t world_seed(const struct gpu_world* w, unsigned suite, size_t index, int rank);

/* ---- test buffers, registered with GPU_REGISTER=1 (gpu_regbuf.c) ---------------------------- */

int gpu_register_on(void);
/* cudaMalloc, or ncclMemAlloc with GPU_REGISTER=1; gpu_buf_free frees either. */
int gpu_buf_alloc(struct gpu_world* w, char** p, size_t bytes);
void gpu_buf_free(void* p);
/* With GPU_REGISTER=1: ncclCommRegister(comm, p, bytes) into *handle; else *handle = NULL. */
int gpu_buf_register(struct gpu_world* w, ncclComm_t comm, void* p, size_t bytes, void** handle);
void gpu_buf_deregister(struct gpu_world* w, ncclComm_t comm, void** handle);

/* ---- one collective call (gpu_case.c) ------------------------------------------------------- */

typedef enum {
  COLL_ALLREDUCE,
  COLL_ALLGATHER,
  COLL_REDUCESCATTER,
  COLL_BROADCAST,
  COLL_REDUCE,
  COLL_ALLTOALL,
  COLL_GATHER,
  COLL_SCATTER,
  COLL_COUNT
} gpu_coll_t;

struct gpu_case {
  gpu_coll_t coll;
  ncclDataType_t type;
  gpu_op_t op;  /* GPU_OP_NONE for the collectives that do not reduce */
  size_t count; /* NCCL's count argument: per rank (AllGather, AlltoAll, ...) */
  int inplace;
  int root;      /* -1 for the collectives without one */
  int unaligned; /* buffers offset from the allocation: not 16-byte aligned */
};

/* One rank's buffers and operator for a call. */
struct gpu_rank_bufs {
  char* send_alloc; /* NULL in place */
  char* recv_alloc;
  size_t send_alloc_bytes, recv_alloc_bytes;
  char* send; /* what NCCL gets */
  char* recv;
  size_t used_begin, used_end; /* bytes of recv_alloc the call may write or read */
  void* dev_scalar;            /* GPU_OP_PREMUL_DEV */
  ncclRedOp_t op;
  ncclComm_t op_comm; /* where `op` was created, when it was */
  ncclComm_t reg_comm; /* GPU_REGISTER=1: where the allocations are registered */
  void* send_reg;
  void* recv_reg;
  int issued;
};

struct gpu_run {
  struct gpu_case c;
  char name[192];
  char label[224]; /* prefix of failure messages ("[17] AllReduce ...: "); empty in run_case */
  size_t send_elems, recv_elems; /* per rank */
  void* in[GPU_MAX_RANKS];       /* every rank's input, on the host */
  struct gpu_rank_bufs b[GPU_MAX_RANKS];
};

int coll_is_reduction(gpu_coll_t c);
int coll_has_root(gpu_coll_t c);
const char* coll_name(gpu_coll_t c);
/* "AllReduce f16 sum count=4097 inplace root=- mode=threads" */
void case_format_name(const struct gpu_world* w, const struct gpu_case* c, char* out, size_t len);

/* Allocates, fills and poisons every local rank's buffers; 0 on success (else reported). */
int run_prepare(struct gpu_world* w, struct gpu_run* run, const struct gpu_case* c, uint64_t seed);
/* Creates the PreMulSum operator on `comm` for local rank `l` (nothing for other ops). */
int run_bind(struct gpu_world* w, struct gpu_run* run, int l, ncclComm_t comm);
/* Issues the call of local rank `l`; inside a group in threads mode. */
int run_issue(struct gpu_world* w, struct gpu_run* run, int l, ncclComm_t comm,
              cudaStream_t stream);
/* After world_sync: fetches every local rank's buffers and compares; 0 when all match. */
int run_check(struct gpu_world* w, struct gpu_run* run);
/* Destroys operators and frees everything; safe on a half-prepared run. */
void run_release(struct gpu_world* w, struct gpu_run* run);

/* One case from start to end on the world's first communicator: prepare, issue, sync, check. */
void run_case(struct gpu_world* w, const struct gpu_case* c, unsigned suite, size_t index);
/* run_case, then a checked output's hash on stdout: "hash <case> rank <r> <hex>". */
void run_case_hashed(struct gpu_world* w, const struct gpu_case* c, unsigned suite, size_t index);

/* ---- the suites ------------------------------------------------------------------------------ */

/* Salts for world_seed, so that the suites' inputs differ. */
enum {
  SUITE_COLL = 1,
  SUITE_P2P = 2,
  SUITE_SENDRECV = 3,
  SUITE_INFLIGHT = 4,
  SUITE_ERRORS = 5,
  SUITE_API = 6,
  SUITE_DETERMINISM = 7,
  SUITE_SYM = 8
};

void suite_coll(struct gpu_world* w);     /* gpu_coll.c */
void suite_p2pcoll(struct gpu_world* w);  /* gpu_coll.c: AlltoAll, Gather, Scatter */
void suite_p2p(struct gpu_world* w);      /* gpu_p2p.c */
void suite_inflight(struct gpu_world* w); /* gpu_inflight.c */
void suite_errors(struct gpu_world* w);   /* gpu_errors.c */
void suite_api(struct gpu_world* w);      /* gpu_api.c: split, shrink, nonblocking, graphs, ... */
void suite_leaks(struct gpu_world* w);    /* gpu_leaks.c: 100, then 1000 communicators */
void suite_deadpeer(struct gpu_world* w); /* gpu_faults.c: a rank SIGKILLed mid-collective */
void suite_hang(struct gpu_world* w);     /* gpu_faults.c: a rank skips a collective */
void suite_hang_send(struct gpu_world* w); /* gpu_faults.c: a rank skips a large receive */
void suite_hang_graph(struct gpu_world* w); /* gpu_faults.c: a rank skips a graph replay */
void suite_abort_wait(struct gpu_world* w); /* gpu_faults.c: abort beside a blocked call */
void suite_abort_peer(struct gpu_world* w); /* gpu_faults.c: a peer aborts (network path) */
void suite_abort_stuck(struct gpu_world* w); /* gpu_faults.c: abort with a launch never started */
void suite_shm_files(struct gpu_world* w);   /* gpu_faults.c: no /dev/shm file while alive */
/* gpu_sym.c: all-reduces from symmetric windows (ncclCommWindowRegister), checked */
void suite_sym(struct gpu_world* w);
/* gpu_coll.c: reductions whose output hashes determinism_check.sh compares across settings */
void suite_determinism(struct gpu_world* w);

/* Send/receive patterns, also used inside groups by the in-flight suite (gpu_p2p.c). */
struct p2p_run;
struct p2p_run* p2p_ring_prepare(struct gpu_world* w, ncclDataType_t t, size_t count,
                                 uint64_t seed);
int p2p_issue(struct gpu_world* w, struct p2p_run* p, int l, ncclComm_t comm, cudaStream_t stream);
int p2p_check(struct gpu_world* w, struct p2p_run* p);
void p2p_release(struct gpu_world* w, struct p2p_run* p);

#endif
