// cuda-call-cost: host time of each CUDA call a collective's enqueue path makes, and of a call.
//
// Each CUDA runtime call the enqueue path makes runs in a loop of N calls, so that the path can
// be budgeted call by call (a small all-reduce is host-bound: the GPU waits for the host).
// Then the same for the library's own calls on a one-rank communicator: ncclAllReduce of 0
// elements (the enqueue path without a launch) and of 2. "with the GPU": the loop's time up to
// the stream's end, per call (the launch rate where the GPU keeps up).
//   cuda-call-cost
// It links libnccl.so.2 with a RUNPATH: LD_LIBRARY_PATH=/path/to/nccl/lib measures NVIDIA's.
#include <cuda.h>
#include <cuda_runtime.h>
#include "nccl.h"
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "call_timer.h"
#include "cuda_check.h"

#define N 20000

struct small_args { char b[64]; };
struct big_args { char b[3968]; };

__global__ void k_small(const __grid_constant__ small_args a) { (void)a; }
__global__ void k_big(const __grid_constant__ big_args a) { (void)a; }

#define TIME(label, ...)                                                     \
  do {                                                                       \
    double host_, all_;                                                      \
    CALL_TIMER(s, N, host_, all_, __VA_ARGS__);                              \
    printf("%-44s %7.3f us/call on the host, %7.3f with the GPU\n", label, \
           host_, all_);                                                     \
  } while (0)

int main(void) {
  cudaStream_t s;
  cudaEvent_t ev;
  void* buf;
  small_args sa = {};
  big_args ba = {};
  CHECK(cudaSetDevice(0));
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  CHECK(cudaMalloc(&buf, 1 << 20));
  void* psmall[] = {&sa};
  void* pbig[] = {&ba};
  for (int w = 0; w < 2; w++) {
    TIME("cudaLaunchKernel, 64 B of arguments, 1 x 512", CHECK(cudaLaunchKernel((const void*)k_small, dim3(1), dim3(512), psmall, 0, s)));
    TIME("cudaLaunchKernel, 3968 B of arguments, 1 x 512", CHECK(cudaLaunchKernel((const void*)k_big, dim3(1), dim3(512), pbig, 0, s)));
  }
  /* The driver's launch with only the bytes in use passed (the rest of the struct undefined). */
  CUfunction fbig;
  CHECK(cudaGetFuncBySymbol(&fbig, (const void*)k_big));
  size_t used = 128, whole = sizeof ba;
  void* extra_used[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &ba, CU_LAUNCH_PARAM_BUFFER_SIZE, &used, CU_LAUNCH_PARAM_END};
  void* extra_whole[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &ba, CU_LAUNCH_PARAM_BUFFER_SIZE, &whole, CU_LAUNCH_PARAM_END};
  for (int w = 0; w < 2; w++) {
    TIME("cuLaunchKernel, 3968 B kernel, 128 B passed", CHECK_CU(cuLaunchKernel(fbig, 1, 1, 1, 512, 1, 1, 0, s, NULL, extra_used)));
    TIME("cuLaunchKernel, 3968 B kernel, all passed", CHECK_CU(cuLaunchKernel(fbig, 1, 1, 1, 512, 1, 1, 0, s, NULL, extra_whole)));
  }
  /* What a launch costs with the attributes Braid passes (one block: no clusters). */
  CUlaunchAttribute attrs[1];
  attrs[0].id = CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN;
  attrs[0].value.memSyncDomain = CU_LAUNCH_MEM_SYNC_DOMAIN_REMOTE;
  CUlaunchConfig cfg = cost_launch_config(1, 512, s, attrs, 0);
  for (int w = 0; w < 2; w++) {
    cfg.numAttrs = 0;
    TIME("cuLaunchKernelEx, 128 B passed, no attributes", CHECK_CU(cuLaunchKernelEx(&cfg, fbig, NULL, extra_used)));
    cfg.numAttrs = 1;
    TIME("cuLaunchKernelEx, 128 B passed, sync domain", CHECK_CU(cuLaunchKernelEx(&cfg, fbig, NULL, extra_used)));
  }
  /* Stream memory operations: what ordering a stream by a flag in memory would cost. */
  CUdeviceptr word = (CUdeviceptr)(uintptr_t)buf;
  CHECK(cudaMemset(buf, 0, 64));
  CHECK(cudaDeviceSynchronize());
  /* i_ is TIME's loop counter: each write stores a new value. */
  TIME("cuStreamWriteValue32", CHECK_CU(cuStreamWriteValue32(s, word, (cuuint32_t)i_, 0)));
  TIME("cuStreamWaitValue32 (met)", CHECK_CU(cuStreamWaitValue32(s, word, 0, CU_STREAM_WAIT_VALUE_GEQ)));
  CUstreamBatchMemOpParams ops[2] = {};
  ops[0].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
  ops[0].writeValue.address = word + 8;
  ops[0].writeValue.value = 1;
  ops[1].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
  ops[1].waitValue.address = word + 8;
  ops[1].waitValue.value = 1;
  ops[1].waitValue.flags = CU_STREAM_WAIT_VALUE_GEQ;
  TIME("cuStreamBatchMemOp, write + wait", CHECK_CU(cuStreamBatchMemOp(s, 2, ops, 0)));
  CUevent cev = (CUevent)ev;
  TIME("cuEventRecord", CHECK_CU(cuEventRecord(cev, s)));
  TIME("cuStreamIsCapturing", { CUstreamCaptureStatus st; CHECK_CU(cuStreamIsCapturing(s, &st)); });
  TIME("cudaStreamGetId", { unsigned long long id; CHECK(cudaStreamGetId(s, &id)); });
  TIME("cuStreamGetId", { unsigned long long id; CHECK_CU(cuStreamGetId(s, &id)); });
  TIME("cudaLaunchKernel 64 B + cudaEventRecord", CHECK(cudaLaunchKernel((const void*)k_small, dim3(1), dim3(512), psmall, 0, s)); CHECK(cudaEventRecord(ev, s)));
  TIME("cudaEventRecord", CHECK(cudaEventRecord(ev, s)));
  struct cudaPointerAttributes attr;
  TIME("cudaPointerGetAttributes", CHECK(cudaPointerGetAttributes(&attr, buf)));
  enum cudaStreamCaptureStatus cs;
  TIME("cudaStreamIsCapturing", CHECK(cudaStreamIsCapturing(s, &cs)));
  int d;
  TIME("cudaGetDevice", CHECK(cudaGetDevice(&d)));
  TIME("cudaSetDevice (same device)", CHECK(cudaSetDevice(0)));
  TIME("cudaStreamGetFlags", { unsigned f; CHECK(cudaStreamGetFlags(s, &f)); });
  TIME("calloc+free 4 KiB", { void* p = calloc(1, 4096); free(p); });
  TIME("cudaLaunchKernel, 3968 B, 32 x 512", CHECK(cudaLaunchKernel((const void*)k_big, dim3(32), dim3(512), pbig, 0, s)));
  TIME("enqueue path: 2 x attributes, capturing?, launch 32 x 512 of 3968 B, event", {
    CHECK(cudaPointerGetAttributes(&attr, buf));
    CHECK(cudaPointerGetAttributes(&attr, buf));
    CHECK(cudaStreamIsCapturing(s, &cs));
    CHECK(cudaLaunchKernel((const void*)k_big, dim3(32), dim3(512), pbig, 0, s));
    CHECK(cudaEventRecord(ev, s));
  });

  ncclComm_t comm;
  int dev0 = 0;
  if (ncclCommInitAll(&comm, 1, &dev0) != ncclSuccess) {
    fprintf(stderr, "ncclCommInitAll failed\n");
    return 1;
  }
#define NCCLCHECK(x) do { if ((x) != ncclSuccess) { fprintf(stderr, "%s failed\n", #x); exit(1); } } while (0)
  for (int w = 0; w < 2; w++) {
    TIME("ncclGroupStart + ncclGroupEnd (empty)", { NCCLCHECK(ncclGroupStart()); NCCLCHECK(ncclGroupEnd()); });
    TIME("ncclAllReduce of 0 floats, 1 rank", NCCLCHECK(ncclAllReduce(buf, (char*)buf + 4096, 0, ncclFloat, ncclSum, comm, s)));
    TIME("ncclAllReduce of 2 floats, 1 rank", NCCLCHECK(ncclAllReduce(buf, (char*)buf + 4096, 2, ncclFloat, ncclSum, comm, s)));
  }
  ncclCommDestroy(comm);
  return 0;
}
