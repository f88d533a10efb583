// cuda_check.h: CHECK (runtime call) and CHECK_CU (driver call) stop a probe at a failed call.
#ifndef BRAID_PROBES_CUDA_CHECK_H
#define BRAID_PROBES_CUDA_CHECK_H

#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(x)                                                                  \
  do {                                                                            \
    cudaError_t e_ = (x);                                                         \
    if (e_ != cudaSuccess) {                                                      \
      fprintf(stderr, "%s failed: %s\n", #x, cudaGetErrorString(e_));              \
      exit(1);                                                                    \
    }                                                                             \
  } while (0)

/* The same for a driver call (link with -lcuda). */
#define CHECK_CU(x)                                                               \
  do {                                                                            \
    CUresult r_ = (x);                                                            \
    if (r_ != CUDA_SUCCESS) {                                                     \
      fprintf(stderr, "%s failed: CUresult %d\n", #x, (int)r_);                    \
      exit(1);                                                                    \
    }                                                                             \
  } while (0)

#endif
