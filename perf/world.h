/*
 * The processes of one benchmark run and the little they exchange outside
 * the library under test: the unique id, device and library reports, times
 * to average, wrong-element counts. Three ways to start them, one ops table:
 *   single  one process (threads and GPUs inside it come from -t and -g);
 *   fork    -p N: the launcher forks N children; they meet in a shared
 *           anonymous mapping made before fork (no CUDA call before fork);
 *   mpi     started by mpirun/srun; only when built with MPI.
 * None of them is on the measured path: they run between timed loops.
 */
#ifndef BRAID_PERF_WORLD_H
#define BRAID_PERF_WORLD_H

#include <stddef.h>

typedef struct perf_world perf_world_t;

typedef struct perf_world_ops {
  size_t size;       /* sizeof(perf_world_ops_t) */
  const char* name;  /* "single", "fork" or "mpi": printed in the header */
  /* Returns when every process has called it. 0, or -1 after printing why. */
  int (*barrier)(perf_world_t* w);
  /* all = every process's len bytes of mine, in process order. 0 or -1. */
  int (*allgather)(perf_world_t* w, const void* mine, void* all, size_t len);
  /* Last call of a process, with its exit code. A failure code (>= 2) makes
     the other processes stop too, so none waits forever for this one. */
  void (*finish)(perf_world_t* w, int exit_code);
} perf_world_ops_t;

struct perf_world {
  const perf_world_ops_t* ops;
  int proc;    /* this process, 0 .. nprocs-1 */
  int nprocs;
  void* state; /* owned by the implementation */
};

/* One process. Always succeeds. */
void perf_world_single(perf_world_t* w);

/*
 * Forks nprocs processes. Returns 0 in each child, with w set up. In the
 * launcher it waits for all children, stops them all if one fails, and
 * returns 1 with *launcher_exit set to the run's exit code. Returns -1 when
 * the processes could not be started (after printing why).
 */
int perf_world_fork(perf_world_t* w, int nprocs, int* launcher_exit);

/* A launcher's name when the environment says mpirun/srun started us, else NULL;
   *size gets the job's process count when the launcher tells it. */
const char* perf_world_launcher(int* size);

/* Started by mpirun: MPI_Init and the world. 0, or -1 when built without MPI
   or when MPI could not start (after printing why). */
int perf_world_mpi(perf_world_t* w, int* argc, char*** argv);

/* This process's index among the processes on its host (picks its GPUs). */
int perf_world_local_index(perf_world_t* w, int* local_index);

#endif
