/*
 * The MPI world: processes started by mpirun (or srun with PMI). Compiled
 * only when CMake finds MPI. MPI is initialized only when a launcher's
 * environment is present (perf_world_launcher), so the same binary also
 * runs without mpirun and never needs MPI's singleton mode. Only the main
 * thread calls MPI (MPI_THREAD_FUNNELED), except MPI_Abort on a failure.
 */
#include <limits.h>
#include <mpi.h>
#include <stdio.h>

#include "common.h"
#include "world.h"

static int mpi_check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return 0;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  fprintf(stderr, "perf: %s failed: %s\n", what, text);
  return -1;
}

static int mpi_barrier(perf_world_t* w) { return mpi_check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }

static int mpi_allgather(perf_world_t* w, const void* mine, void* all, size_t len) {
  if (len > INT_MAX) {
    fprintf(stderr, "perf: MPI_Allgather of %zu bytes is too large\n", len);
    return -1;
  }
  return mpi_check(MPI_Allgather(mine, (int)len, MPI_BYTE, all, (int)len, MPI_BYTE, MPI_COMM_WORLD),
                   "MPI_Allgather");
}

/* Wrong results (exit 1) end cleanly on every rank; a failure aborts the job. */
static void mpi_finish(perf_world_t* w, int exit_code) {
  fflush(stdout);
  fflush(stderr);
  if (exit_code >= PERF_EXIT_USAGE)
    MPI_Abort(MPI_COMM_WORLD, exit_code);
  else
    MPI_Finalize();
}

static const perf_world_ops_t mpi_ops = {
    .size = sizeof(perf_world_ops_t),
    .name = "mpi",
    .barrier = mpi_barrier,
    .allgather = mpi_allgather,
    .finish = mpi_finish,
};

int perf_world_mpi(perf_world_t* w, int* argc, char*** argv) {
  int provided = 0;
  if (mpi_check(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread"))
    return -1;
  w->ops = &mpi_ops;
  w->state = NULL;
  if (mpi_check(MPI_Comm_rank(MPI_COMM_WORLD, &w->proc), "MPI_Comm_rank") ||
      mpi_check(MPI_Comm_size(MPI_COMM_WORLD, &w->nprocs), "MPI_Comm_size"))
    return -1;
  return 0;
}
