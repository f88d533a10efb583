/*
 * The pipeline example's two device operations, callable from C: the first
 * stage fills a micro-batch with known values, every stage then adds its
 * "layer" (here: rank + 1) to each value. Both run on the given stream.
 */
#ifndef EXAMPLES_STAGE_KERNELS_H
#define EXAMPLES_STAGE_KERNELS_H

#include <stddef.h>
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The value the first stage puts at index i of micro-batch m: a small integer,
 * exact in float after any number of stages. */
#define STAGE_INPUT(m, i) ((float)(((m)*131 + (i)) % 4096))

cudaError_t stage_fill(float* buf, size_t count, int microbatch, cudaStream_t stream);
cudaError_t stage_add(float* buf, size_t count, float value, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* EXAMPLES_STAGE_KERNELS_H */
