/*
 * Error checks shared by the examples.
 *
 * Every CUDA runtime and NCCL call in the examples goes through CUDA_CHECK or
 * NCCL_CHECK: on failure they print the file, line, the call itself and the
 * library's own description of the error, then end the process with status 1.
 * Ending the process is the right reaction in a small program: the other ranks
 * see their peer vanish and fail (or are killed by mpirun or by the
 * self-launching parent) instead of hanging.
 *
 * Only the public API is used (nccl.h and the CUDA runtime), so the examples
 * build unchanged against NVIDIA's NCCL.
 */
#ifndef EXAMPLES_CHECK_H
#define EXAMPLES_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime.h>
#include <nccl.h>

/* The exit status that tells CTest (and the reader) "skipped: not enough GPUs". */
#define EXAMPLE_EXIT_SKIP 77

#define CUDA_CHECK(call)                                                        \
  do {                                                                          \
    cudaError_t cuda_err_ = (call);                                             \
    if (cuda_err_ != cudaSuccess) {                                             \
      fprintf(stderr, "%s:%d: %s failed: %s (%s)\n", __FILE__, __LINE__, #call, \
              cudaGetErrorString(cuda_err_), cudaGetErrorName(cuda_err_));      \
      exit(1);                                                                  \
    }                                                                           \
  } while (0)

/* ncclGetLastError(NULL) returns the last error message NCCL recorded for this
 * thread: usually more precise than the generic string of the result code. */
#define NCCL_CHECK(call)                                                                \
  do {                                                                                  \
    ncclResult_t nccl_res_ = (call);                                                    \
    if (nccl_res_ != ncclSuccess) {                                                     \
      const char* nccl_last_ = ncclGetLastError(NULL);                                  \
      fprintf(stderr, "%s:%d: %s failed: %s%s%s\n", __FILE__, __LINE__, #call,          \
              ncclGetErrorString(nccl_res_), (nccl_last_ && nccl_last_[0]) ? ": " : "", \
              nccl_last_ ? nccl_last_ : "");                                            \
      exit(1);                                                                          \
    }                                                                                   \
  } while (0)

#endif /* EXAMPLES_CHECK_H */
