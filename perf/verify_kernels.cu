/*
 * Fill and check kernels of the perf tools. The element functions come from
 * verify.h, shared with the host and the unit tests; these kernels only walk
 * the buffers with a grid-stride loop. Checking on the GPU keeps a 2 GB
 * all-reduce check to milliseconds instead of a host pass of seconds.
 */
#include "device.h"

/* Enough blocks to fill any GPU, few enough that launches stay cheap. */
static unsigned perf_blocks_for(size_t count, unsigned threads) {
  size_t blocks = (count + threads - 1) / threads;
  if (blocks > 4096) blocks = 4096;
  return blocks ? (unsigned)blocks : 1u;
}

__global__ void perf_fill_kernel(void* buf, size_t count, perf_value_desc_t desc, int rank,
                                 size_t first_index) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < count; k += stride)
    perf_store_bits(desc.type, buf, k, perf_input_bits_of(&desc, rank, first_index + k));
}

__global__ void perf_check_kernel(const void* buf, perf_segment_t seg, perf_value_desc_t desc,
                                  unsigned long long* wrong) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  unsigned long long mine = 0;
  for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < seg.count; k += stride)
    mine += (unsigned long long)perf_element_wrong(&desc, seg.src_rank, seg.src_offset + k, buf,
                                                   seg.dst_offset + k);
  if (mine) atomicAdd(wrong, mine);
}

extern "C" cudaError_t perf_device_fill(void* buf, size_t count, perf_value_desc_t desc, int rank,
                                        size_t first_index, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  const unsigned threads = 256;
  perf_fill_kernel<<<perf_blocks_for(count, threads), threads, 0, stream>>>(buf, count, desc, rank,
                                                                           first_index);
  return cudaGetLastError();
}

extern "C" cudaError_t perf_device_check(const void* buf, perf_segment_t seg, perf_value_desc_t desc,
                                         unsigned long long* wrong, cudaStream_t stream) {
  if (seg.count == 0) return cudaSuccess;
  const unsigned threads = 256;
  perf_check_kernel<<<perf_blocks_for(seg.count, threads), threads, 0, stream>>>(buf, seg, desc,
                                                                                wrong);
  return cudaGetLastError();
}
