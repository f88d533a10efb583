/*
 * The few GPU kernels of the perf tools, callable from C: fill a rank's input,
 * and count the output elements that differ from what verify.h expects. Each
 * enqueues on the given stream of the current device and returns the CUDA
 * error of the launch (cudaSuccess when it was enqueued).
 */
#ifndef BRAID_PERF_DEVICE_H
#define BRAID_PERF_DEVICE_H

#include <cuda_runtime.h>

#include "common.h"
#include "verify.h"

#ifdef __cplusplus
extern "C" {
#endif

/* buf[k] = input element (first_index + k) of rank, for k < count. */
cudaError_t perf_device_fill(void* buf, size_t count, perf_value_desc_t desc, int rank,
                             size_t first_index, cudaStream_t stream);

/* Adds to *wrong (device memory) the elements of buf that seg says are wrong. */
cudaError_t perf_device_check(const void* buf, perf_segment_t seg, perf_value_desc_t desc,
                              unsigned long long* wrong, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
