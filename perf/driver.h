/*
 * Internal types of the benchmark driver: a job is this process's part of
 * the run, a thread drives -g GPUs, a rank is one GPU with its communicator,
 * stream and buffers. driver.c sets them up and tears them down, bench.c
 * measures, report.c prints.
 *
 * Ownership: the job owns every perf_rank_t (and its comm, stream, buffers);
 * a thread only borrows its slice. Only process 0's thread 0 ("the printer")
 * writes stdout rows and the JSON file.
 */
#ifndef BRAID_PERF_DRIVER_H
#define BRAID_PERF_DRIVER_H

#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>

#include "common.h"
#include "verify.h"
#include "world.h"

typedef struct perf_rank {
  int rank;            /* global rank in the communicator */
  int device;          /* CUDA device ordinal */
  ncclComm_t comm;
  ncclComm_t parent;   /* --split_share: the world comm `comm` was split from */
  cudaStream_t stream;
  void* send;          /* max_bytes each */
  void* recv;
  void* send_reg;            /* -R 1: ncclCommRegister handles */
  void* recv_reg;
  ncclWindow_t send_win;     /* -R 2: symmetric windows */
  ncclWindow_t recv_win;
  unsigned long long* wrong; /* device counter of wrong elements */
  cudaGraph_t graph;         /* while a -G capture is alive */
  cudaGraphExec_t graph_exec;
} perf_rank_t;

/* The threads of this process meet here for barriers and reductions; thread
   0 extends each to the other processes through the world. */
typedef struct perf_team {
  pthread_barrier_t barrier;
  int nthreads;
  double* doubles;   /* one slot per thread */
  int64_t* ints;
  double double_result;
  int64_t int_result;
} perf_team_t;

/* What the loaded libnccl.so.2 says about itself. */
typedef struct perf_libinfo {
  char path[PATH_MAX];  /* canonical path of the file the loader mapped */
  int version;          /* ncclGetVersion */
  char braid[256];      /* braidGetVersionString(), "" when not exported */
} perf_libinfo_t;

typedef struct perf_job {
  const perf_args_t* args;
  const perf_coll_ops_t* coll;
  const char* program;      /* "all_reduce_perf" */
  perf_world_t* world;
  perf_team_t team;
  int local_index;          /* this process among its host's processes */
  int nlocal;               /* ranks in this process: nthreads * ngpus */
  int nranks;               /* ranks in the communicator */
  size_t max_bytes;         /* -e, lowered to what the GPUs hold */
  int types[ncclNumTypes], ntypes;
  int ops[PERF_NUM_OPS], nops;
  int roots_all;            /* -r all: every rank in turn */
  ncclUniqueId id;
  perf_rank_t* ranks;       /* nlocal entries, thread t owns [t*ngpus, (t+1)*ngpus) */
  perf_libinfo_t lib;
  char host[64];
  FILE* json;               /* printer only */
} perf_job_t;

typedef struct perf_thread {
  perf_job_t* job;
  int index;
  perf_rank_t* ranks;       /* ngpus entries */
  pthread_t tid;
  int exit_code;
  uint64_t checks;          /* checked runs so far: the seed of the next one */
  int errors;               /* measurements with wrong elements seen by this thread */
  double busbw_sum;
  int busbw_count;
} perf_thread_t;

/* One place (out of place or in place) of one row. wrong < 0: not checked. */
typedef struct perf_result {
  double time_us, algbw, busbw;
  int64_t wrong;
} perf_result_t;

/* One row: what was measured, and both places. */
typedef struct perf_row {
  size_t bytes;   /* nccl-tests' size column: max(send, recv) bytes */
  size_t count;   /* param_count */
  int type, op, root;
  perf_result_t place[2];
} perf_row_t;

static inline int perf_is_printer(const perf_thread_t* t) {
  return t->job->world->proc == 0 && t->index == 0;
}

/* ---- errors: print once, where understood; evaluate to 0 or -1 ---------- */

int perf_cuda_failed(cudaError_t e, const char* call, const char* file, int line,
                     const perf_rank_t* r);
int perf_nccl_failed(ncclResult_t res, const char* call, const char* file, int line,
                     const perf_rank_t* r);
#define PERF_CUDA(r, call) perf_cuda_failed((call), #call, __FILE__, __LINE__, (r))
#define PERF_NCCL(r, call) perf_nccl_failed((call), #call, __FILE__, __LINE__, (r))
/* Context for error lines: this process's index and host. */
void perf_error_context(int proc, const char* host);

/* ---- team (driver.c) ----------------------------------------------------- */

int perf_team_barrier(perf_thread_t* t);
/* mode: -a's 0 (process 0 thread 0), 1 (mean), 2 (min), 3 (max). */
int perf_team_reduce_double(perf_thread_t* t, double* value, int mode);
int perf_team_sum_int(perf_thread_t* t, int64_t* value);

/* ---- bench.c -------------------------------------------------------------- */

/* Runs every (type, op, root) series of the job on this thread's ranks. */
int perf_bench_thread(perf_thread_t* t);

/* ---- report.c ------------------------------------------------------------- */

void perf_libinfo_read(perf_libinfo_t* lib);
void perf_version_string(int code, char* out, size_t len);
void perf_report_header(const perf_job_t* job);
void perf_report_devices(const perf_job_t* job, const char* lines);
void perf_report_table_header(const perf_job_t* job);
void perf_report_row(perf_job_t* job, const perf_row_t* row);
void perf_report_footer(const perf_job_t* job, int errors, double avg_busbw);

#endif
