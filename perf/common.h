/*
 * Braid's perf tools: the types every benchmark shares.
 *
 * Nine programs (all_reduce_perf, ..., scatter_perf) are one driver plus one
 * small file per collective. The collective file fills a perf_coll_ops_t: how
 * big its buffers are, how to turn a time into algbw/busbw, where each output
 * element must come from, and how to call the library. Everything else (flags,
 * launch modes, timing, CUDA graphs, result checks, the nccl-tests-format
 * table, JSON lines) lives in the driver, written once.
 *
 * The benchmarks use only the public NCCL API, so the same binary measures
 * Braid or NCCL depending on which libnccl.so.2 the loader finds.
 */
#ifndef BRAID_PERF_COMMON_H
#define BRAID_PERF_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

/* "-d all", "-o all", "-r all". */
#define PERF_ALL (-1)
/* nccl-tests' sixth operator: ncclRedOpCreatePreMulSum with a per-rank scalar. */
#define PERF_OP_MULSUM ((int)ncclNumOps)
#define PERF_NUM_OPS (PERF_OP_MULSUM + 1)

/* Exit codes of every benchmark (also printed by -h). */
enum {
  PERF_EXIT_OK = 0,
  PERF_EXIT_WRONG = 1,   /* ran, but some result elements were wrong */
  PERF_EXIT_USAGE = 2,   /* bad command line */
  PERF_EXIT_FAILED = 3   /* a CUDA, NCCL or system call failed, or a timeout */
};

/* What the user asked for on the command line. Defaults are nccl-tests'. */
typedef struct perf_args {
  int nthreads;           /* -t: threads per process */
  int ngpus;              /* -g: GPUs per thread */
  size_t min_bytes;       /* -b */
  size_t max_bytes;       /* -e */
  size_t step_bytes;      /* -i: used when step_factor <= 1 */
  size_t step_factor;     /* -f: multiply sizes when > 1 */
  int iters;              /* -n */
  int warmup_iters;       /* -w */
  int agg_iters;          /* -m: operations per group in each iteration */
  int run_cycles;         /* -N: 0 means forever */
  int check;              /* -c: check iterations per size, 0 = no check */
  int type;               /* -d: ncclDataType_t or PERF_ALL */
  int op;                 /* -o: ncclRedOp_t, PERF_OP_MULSUM or PERF_ALL */
  int root;               /* -r: a rank or PERF_ALL */
  int blocking;           /* -z: nonzero: sync + barrier after each op */
  int stream_null;        /* -y: use the legacy default stream */
  int timeout_s;          /* -T: abort when an op takes longer, 0 = never */
  int graph_launches;     /* -G: capture the timed loop in a CUDA graph, replay N times */
  int report_cputime;     /* -C: report enqueue time instead of completion time */
  int average;            /* -a: 0 rank 0, 1 mean, 2 min, 3 max across ranks */
  int procs;              /* -p N (N >= 2): fork N processes, one rendezvous */
  int parallel_init;      /* -p 1: each thread creates its own communicators */
  int alloc_cuda;         /* --alloc cuda: cudaMalloc instead of ncclMemAlloc */
  int local_register;     /* -R: 0 none, 1 ncclCommRegister, 2 symmetric windows */
  int split_share;        /* --split_share: run on a split child with this splitShare; -1: no */
  const char* json_path;  /* -J: JSON lines file, NULL for none */
  int help;               /* -h */
  double min_bw;          /* NCCL_TESTS_MIN_BW: fail below 0.9x this average busbw; < 0: none */
  int device0;            /* NCCL_TESTS_DEVICE: first GPU of each process; -1: by local rank */
} perf_args_t;

/* Buffer layout of one size, in elements (nccl-tests' getCollByteCount). */
typedef struct perf_counts {
  size_t send_count;           /* elements each rank's send buffer holds */
  size_t recv_count;           /* elements each rank's receive buffer holds */
  size_t param_count;          /* the count argument given to the library */
  size_t send_inplace_offset;  /* in place: send = recv + rank * this */
  size_t recv_inplace_offset;  /* in place: recv = recv + rank * this */
} perf_counts_t;

/*
 * Where a run of output elements must come from. Input element i of rank q
 * holds perf_input(q, i) (see verify.h); output element dst_offset + k must
 * equal the input element src_offset + k of src_rank, or, when src_rank is
 * PERF_SEG_REDUCE, the reduction over all ranks of that input element, or,
 * when it is PERF_SEG_POISON, still the poison.
 */
#define PERF_SEG_REDUCE (-1)
#define PERF_SEG_POISON (-2) /* untouched since it was poisoned (perf_poison_byte) */
typedef struct perf_segment {
  size_t dst_offset;
  size_t count;
  int src_rank;
  size_t src_offset;
} perf_segment_t;

/* One call of a collective, as the driver hands it to the ops table. */
typedef struct perf_coll_call {
  const void* send;
  void* recv;
  size_t count;  /* perf_counts_t.param_count */
  ncclDataType_t type;
  ncclRedOp_t op;
  int root;
  int rank;
  int nranks;
  ncclComm_t comm;
  cudaStream_t stream;
} perf_coll_call_t;

/*
 * A collective, as the driver sees it. Size first; every slot filled. The
 * functions are pure except run, and none keeps state between calls.
 */
typedef struct perf_coll_ops {
  size_t size;        /* sizeof(perf_coll_ops_t): the driver refuses a table of another size */
  const char* name;   /* "all_reduce": names the program (<name>_perf) and JSON rows */
  int uses_op;        /* loops over -o and prints its name; otherwise redop is "none" */
  int uses_root;      /* loops over -r and prints it; otherwise root is -1 */
  int in_place_checked;  /* 0 where nccl-tests reports N/A for in place (the library's
                            in-place semantics are undefined there) */
  /* Layout for count elements of the requested size on nranks ranks. */
  void (*counts)(size_t count, size_t type_size, int nranks, perf_counts_t* out);
  /* algbw and busbw in GB/s for one call on param_count elements taking sec seconds. */
  void (*bandwidth)(size_t param_count, size_t type_size, double sec, int nranks,
                    double* algbw, double* busbw);
  /* Input elements rank must fill before a checked run (0: the library reads none). */
  size_t (*input_count)(const perf_counts_t* c, int rank, int root);
  /* Fills seg (room for nranks entries) with what rank's output must hold;
     returns how many segments were written, 0 when nothing is checked there. */
  int (*expected)(const perf_counts_t* c, int nranks, int rank, int root, perf_segment_t* seg);
  /* Enqueues the operation on call->stream; returns what the library returned. */
  ncclResult_t (*run)(const perf_coll_call_t* call);
} perf_coll_ops_t;

/* nccl-tests' per-rank share of count: count / nranks, rounded down to a
   multiple of 16 bytes (so 8-byte sizes give 0 elements on 2+ ranks). */
static inline size_t perf_rank_share(size_t count, size_t type_size, int nranks) {
  size_t share = count / (size_t)nranks;
  size_t align = type_size < 16 ? 16 / type_size : 1;
  return share - share % align;
}

/* Bytes per second in GB/s (10^9, as nccl-tests), 0 for no time. */
static inline double perf_gbps(double bytes, double sec) { return sec > 0 ? bytes / 1.0e9 / sec : 0.0; }

/* The nine collectives, one per coll_*.c file. */
extern const perf_coll_ops_t perf_coll_all_reduce;
extern const perf_coll_ops_t perf_coll_all_gather;
extern const perf_coll_ops_t perf_coll_reduce_scatter;
extern const perf_coll_ops_t perf_coll_broadcast;
extern const perf_coll_ops_t perf_coll_reduce;
extern const perf_coll_ops_t perf_coll_sendrecv;
extern const perf_coll_ops_t perf_coll_alltoall;
extern const perf_coll_ops_t perf_coll_gather;
extern const perf_coll_ops_t perf_coll_scatter;

/* ---- args.c: command line (no GPU, no library calls) -------------------- */

void perf_args_defaults(perf_args_t* a);
/* Parses argv into a (after defaults). Returns 0, or -1 with a sentence in err. */
int perf_args_parse(perf_args_t* a, int argc, char** argv, char* err, size_t err_len);
/* Parses "32M", "1.5k", "8": K/M/G are powers of 1024. Returns 0 or -1. */
int perf_parse_size(const char* text, size_t* out);
void perf_usage(const char* program, const char* collective);

/* The size sequence: for (s = min; ok; ok = perf_size_next(a, s, &s)). */
int perf_size_next(const perf_args_t* a, size_t size, size_t* next);

const char* perf_type_name(int type);
int perf_type_parse(const char* name);      /* ncclDataType_t, PERF_ALL, or -2 */
const char* perf_op_name(int op);
int perf_op_parse(const char* name);        /* op, PERF_ALL, or -2 */

/* ---- format.c: the nccl-tests table, as text ----------------------------- */

/* nccl-tests' number style: width columns, fewer decimals as values grow. */
void perf_format_number(double value, int width, char* out, size_t out_len);
/* "<time> <algbw> <busbw> <#wrong>" for one place; wrong < 0 prints N/A. */
void perf_format_result(double time_us, double algbw, double busbw, int64_t wrong, char* out,
                        size_t out_len);
/* JSON string escaping (quotes included). */
void perf_json_string(const char* in, char* out, size_t out_len);

/* ---- driver.c ------------------------------------------------------------ */

/* The whole program: parse, launch, measure, report. Returns an exit code. */
int perf_main(const perf_coll_ops_t* coll, int argc, char** argv);

#endif
