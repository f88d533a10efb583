/* The pipeline example's device operations (see stage_kernels.h). */
#include "stage_kernels.h"

__global__ static void fill_kernel(float* buf, size_t count, int microbatch) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count;
       i += (size_t)gridDim.x * blockDim.x)
    buf[i] = STAGE_INPUT((size_t)microbatch, i);
}

__global__ static void add_kernel(float* buf, size_t count, float value) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count;
       i += (size_t)gridDim.x * blockDim.x)
    buf[i] += value;
}

static unsigned grid_for(size_t count) {
  size_t blocks = (count + 255) / 256;
  return (unsigned)(blocks < 1024 ? (blocks > 0 ? blocks : 1) : 1024);
}

extern "C" cudaError_t stage_fill(float* buf, size_t count, int microbatch, cudaStream_t stream) {
  fill_kernel<<<grid_for(count), 256, 0, stream>>>(buf, count, microbatch);
  return cudaGetLastError();
}

extern "C" cudaError_t stage_add(float* buf, size_t count, float value, cudaStream_t stream) {
  add_kernel<<<grid_for(count), 256, 0, stream>>>(buf, count, value);
  return cudaGetLastError();
}
