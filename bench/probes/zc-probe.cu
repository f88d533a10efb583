// zc-probe: bandwidth between two GPUs, kernels on the peer's memory against the copy engines.
//
// What two GPUs joined by NVLink move when each works on the other's memory in place (zero
// copy), against the copy engines: the ceilings a direct two-rank all-reduce, reduce-scatter
// and all-gather could reach without FIFOs. One process, both GPUs (peer access), both
// directions at once, float32. Prints, per test and grid, the best of 5 runs: time and GB/s per
// direction (for "ar" tests: the all-reduce busbw of a 2 x half all-reduce).
//   zc-probe [MB per half]
//   zc-probe MB chunks: the copy-engine exchange's shape (src/runtime/ce.c): 16 / 64 MB copies
//     on one or two streams, a one-thread kernel before each, with or without a local-copy
//     kernel beside them.
//   zc-probe MB ipc: two processes, one GPU each, copies into the other's IPC mapping.
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cuda_check.h"

#define UNROLL 4

// out[i] = a[i] + b[i] (b usually the peer's); out2, when set, gets the sum too.
__global__ void sum_kernel(float4* out, float4* out2, const float4* a, const float4* b, size_t n) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + (UNROLL - 1) * stride < n; i += UNROLL * stride) {
    float4 x[UNROLL], y[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; u++) y[u] = b[i + u * stride];
#pragma unroll
    for (int u = 0; u < UNROLL; u++) x[u] = a[i + u * stride];
#pragma unroll
    for (int u = 0; u < UNROLL; u++) {
      float4 v = make_float4(x[u].x + y[u].x, x[u].y + y[u].y, x[u].z + y[u].z, x[u].w + y[u].w);
      out[i + u * stride] = v;
      if (out2) out2[i + u * stride] = v;
    }
  }
  for (; i < n; i += stride) {
    float4 x = a[i], y = b[i];
    float4 v = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
    out[i] = v;
    if (out2) out2[i] = v;
  }
}

__global__ void copy_kernel(float4* dst, const float4* src, size_t n) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + (UNROLL - 1) * stride < n; i += UNROLL * stride) {
    float4 x[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; u++) x[u] = src[i + u * stride];
#pragma unroll
    for (int u = 0; u < UNROLL; u++) dst[i + u * stride] = x[u];
  }
  for (; i < n; i += stride) dst[i] = src[i];
}

static size_t half_bytes;
static float4 *in[2], *out[2];
static cudaStream_t st[2];
static cudaEvent_t ev0[2], ev1[2];

enum test { CE_BOTH, CE_ONE, PUSH, PULL, RS_PULL, AR_FUSED, AR_PULL_CE, AR_PULL_PUSH };
static const char* names[] = {"ce_both", "ce_one",   "push",       "pull",
                              "rs_pull", "ar_fused", "ar_pull_ce", "ar_pull_push"};

// Half h of rank r's buffers: rank r owns half r.
static float4* half(float4* base, int h) { return (float4*)((char*)base + h * half_bytes); }

static void phase(int t, int phase2, int grid, int threads) {
  size_t n = half_bytes / sizeof(float4);
  for (int r = 0; r < 2; r++) {
    int p = 1 - r;
    CHECK(cudaSetDevice(r));
    if (t == CE_BOTH || (t == CE_ONE && r == 0) || (t == AR_PULL_CE && phase2)) {
      // my half of my buffer to the peer's (all-gather's step)
      float4* src = t == AR_PULL_CE ? half(out[r], r) : half(in[r], r);
      CHECK(cudaMemcpyPeerAsync(half(out[p], r), p, src, r, half_bytes, st[r]));
    } else if (t == PUSH || (t == AR_PULL_PUSH && phase2)) {
      float4* src = t == PUSH ? half(in[r], r) : half(out[r], r);
      copy_kernel<<<grid, threads, 0, st[r]>>>(half(out[p], r), src, n);
    } else if (t == PULL) {
      copy_kernel<<<grid, threads, 0, st[r]>>>(half(out[r], p), half(in[p], p), n);
    } else if (t == RS_PULL || t == AR_PULL_CE || t == AR_PULL_PUSH) {
      sum_kernel<<<grid, threads, 0, st[r]>>>(half(out[r], r), NULL, half(in[r], r),
                                              half(in[p], r), n);
    } else if (t == AR_FUSED) {
      sum_kernel<<<grid, threads, 0, st[r]>>>(half(out[r], r), half(out[p], r), half(in[r], r),
                                              half(in[p], r), n);
    }
    CHECK(cudaGetLastError());
  }
}

static double run(int t, int grid, int threads) {
  double best = 1e30;
  for (int rep = 0; rep < 5; rep++) {
    for (int r = 0; r < 2; r++) {
      CHECK(cudaSetDevice(r));
      CHECK(cudaDeviceSynchronize());
    }
    for (int r = 0; r < 2; r++) {
      CHECK(cudaSetDevice(r));
      CHECK(cudaEventRecord(ev0[r], st[r]));
    }
    phase(t, 0, grid, threads);
    if (t == AR_PULL_CE || t == AR_PULL_PUSH) {
      // both halves reduced before either is sent on: wait on the other GPU's first phase
      for (int r = 0; r < 2; r++) {
        CHECK(cudaSetDevice(r));
        CHECK(cudaEventRecord(ev1[r], st[r]));
      }
      for (int r = 0; r < 2; r++) {
        CHECK(cudaSetDevice(r));
        CHECK(cudaStreamWaitEvent(st[r], ev1[1 - r], 0));
      }
      phase(t, 1, grid, threads);
    }
    double worst = 0;
    for (int r = 0; r < 2; r++) {
      CHECK(cudaSetDevice(r));
      CHECK(cudaEventRecord(ev1[r], st[r]));
    }
    for (int r = 0; r < 2; r++) {
      float ms;
      CHECK(cudaEventSynchronize(ev1[r]));
      CHECK(cudaEventElapsedTime(&ms, ev0[r], ev1[r]));
      if (ms > worst) worst = ms;
    }
    if (worst < best) best = worst;
  }
  return best * 1e3;  // us
}

// The copy-engine exchange's shape (src/runtime/ce.c): chunks copied to the peer on `nstreams` streams
// in turn, a one-thread kernel before each copy (when `steps`), and when `load` a kernel of
// `load` blocks copying locally meanwhile (as the receiving kernel's pass).
__global__ void step_kernel(volatile uint32_t* word, uint32_t v) { *word = v; }

__global__ void load_kernel(float4* dst, const float4* src, size_t n, int iters) {
  // `iters` local copies of n float4s: the receiving kernel's pass beside the copies (finite: a
  // kernel that waits for a word could share a hardware queue with the step kernels and hang)
  for (int it = 0; it < iters; it++)
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
      dst[i] = src[i];
}

static void chunks(size_t chunk, int nstreams, int steps, int load) {
  cudaStream_t cs[2][2], sp[2];
  uint32_t* word[2];
  for (int r = 0; r < 2; r++) {
    CHECK(cudaSetDevice(r));
    for (int i = 0; i < 2; i++) CHECK(cudaStreamCreateWithFlags(&cs[r][i], cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&sp[r], cudaStreamNonBlocking));
    CHECK(cudaMalloc(&word[r], 4096));
    CHECK(cudaMemset(word[r], 0, 4096));
  }
  double best = 1e30;
  for (int rep = 0; rep < 3; rep++) {
    for (int r = 0; r < 2; r++) {
      CHECK(cudaSetDevice(r));
      CHECK(cudaDeviceSynchronize());
      CHECK(cudaMemset(word[r], 0, 4096));
      CHECK(cudaDeviceSynchronize());
      if (load)
        load_kernel<<<load, 512, 0, sp[r]>>>((float4*)((char*)half(in[r], 1 - r) + (512u << 20)),
                                               half(in[r], 1 - r), /* the half not sent */
                                               (256u << 20) / sizeof(float4), 8);
      CHECK(cudaEventRecord(ev0[r], cs[r][0]));
      if (nstreams > 1) CHECK(cudaStreamWaitEvent(cs[r][1], ev0[r], 0));
    }
    size_t n = half_bytes / chunk;
    for (size_t k = 0; k < n; k++)
      for (int r = 0; r < 2; r++) {
        CHECK(cudaSetDevice(r));
        cudaStream_t s = cs[r][k % nstreams];
        if (steps) step_kernel<<<1, 1, 0, s>>>(word[r] + 64, (uint32_t)k);
        CHECK(cudaMemcpyPeerAsync((char*)half(out[1 - r], r) + k * chunk, 1 - r,
                                  (char*)half(in[r], r) + k * chunk, r, chunk, s));
      }
    double worst = 0;
    for (int r = 0; r < 2; r++) {
      CHECK(cudaSetDevice(r));
      if (nstreams > 1) {
        CHECK(cudaEventRecord(ev1[r], cs[r][1]));
        CHECK(cudaStreamWaitEvent(cs[r][0], ev1[r], 0));
      }
      CHECK(cudaEventRecord(ev1[r], cs[r][0]));
    }
    for (int r = 0; r < 2; r++) {
      float ms;
      CHECK(cudaSetDevice(r));
      CHECK(cudaEventSynchronize(ev1[r]));
      CHECK(cudaEventElapsedTime(&ms, ev0[r], ev1[r]));
      if (ms > worst) worst = ms;
    }
    for (int r = 0; r < 2; r++) {
      CHECK(cudaSetDevice(r));
      CHECK(cudaDeviceSynchronize());
    }
    if (worst < best) best = worst;
  }
  printf("chunks %4zu MB x %zu, %d stream(s), steps %d, local copier %3d blocks: %8.1f us %6.1f GB/s each way\n",
         chunk >> 20, half_bytes / chunk, nstreams, steps, load, best * 1e3,
         half_bytes / (best * 1e6));
  fflush(stdout);
}

__global__ void fill(float4* p, size_t n, float base) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    p[i] = make_float4(base + (float)(i & 1023), 1.f, 2.f, 3.f);
}

// Two processes, one GPU each (as the library's ranks): each opens the other's buffer by
// cudaIpcOpenMemHandle and copies `half` to it in chunks, cuMemcpyDtoDAsync (as src/runtime/ce.c)
// or cudaMemcpyAsync, both processes at once.
static void ipc_child(int r, int wr, int rd, size_t chunk, int driver) {
  CHECK(cudaSetDevice(r));
  void *src, *dst;
  CHECK(cudaMalloc(&src, half_bytes));
  CHECK(cudaMalloc(&dst, half_bytes));
  cudaIpcMemHandle_t mine, theirs;
  CHECK(cudaIpcGetMemHandle(&mine, dst));
  if (write(wr, &mine, sizeof mine) != sizeof mine || read(rd, &theirs, sizeof theirs) != sizeof theirs)
    exit(2);
  void* peer;
  CHECK(cudaIpcOpenMemHandle(&peer, theirs, cudaIpcMemLazyEnablePeerAccess));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  float best = 1e30f;
  for (int rep = 0; rep < 4; rep++) {
    CHECK(cudaDeviceSynchronize());
    char c = 0;  // line up with the other process
    if (write(wr, &c, 1) != 1 || read(rd, &c, 1) != 1) exit(2);
    CHECK(cudaEventRecord(a, s));
    for (size_t k = 0; k < half_bytes / chunk; k++) {
      if (driver) {
        CUresult e = cuMemcpyDtoDAsync((CUdeviceptr)peer + k * chunk, (CUdeviceptr)src + k * chunk,
                                       chunk, (CUstream)s);
        if (e != CUDA_SUCCESS) exit(3);
      } else {
        CHECK(cudaMemcpyAsync((char*)peer + k * chunk, (char*)src + k * chunk, chunk,
                              cudaMemcpyDeviceToDevice, s));
      }
    }
    CHECK(cudaEventRecord(b, s));
    CHECK(cudaEventSynchronize(b));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    if (ms < best) best = ms;
  }
  printf("ipc rank %d: chunks %4zu MB, %s: %8.1f us %6.1f GB/s\n", r, chunk >> 20,
         driver ? "cuMemcpyDtoDAsync" : "cudaMemcpyAsync", best * 1e3, half_bytes / (best * 1e6));
  fflush(stdout);
  char c = 0;
  if (write(wr, &c, 1) != 1 || read(rd, &c, 1) != 1) exit(2);
  CHECK(cudaIpcCloseMemHandle(peer));
  exit(0);
}

static void ipc(size_t chunk, int driver) {
  int p01[2], p10[2];
  if (pipe(p01) || pipe(p10)) exit(2);
  pid_t kid[2];
  for (int r = 0; r < 2; r++) {
    kid[r] = fork();
    if (kid[r] == 0) {
      if (r == 0) ipc_child(0, p01[1], p10[0], chunk, driver);
      else ipc_child(1, p10[1], p01[0], chunk, driver);
    }
  }
  for (int r = 0; r < 2; r++) waitpid(kid[r], NULL, 0);
}

int main(int argc, char** argv) {
  if (argc > 2 && strcmp(argv[2], "ipc") == 0) {  // before any CUDA call: the children fork clean
    half_bytes = strtoull(argv[1], NULL, 10) << 20;
    size_t sizes[] = {16 << 20, 64 << 20, half_bytes};
    for (int c = 0; c < 3; c++)
      for (int d = 0; d <= 1; d++) ipc(sizes[c], d);
    return 0;
  }
  size_t mb = argc > 1 ? strtoull(argv[1], NULL, 10) : 1024;
  half_bytes = mb << 20;
  int ndev = 0;
  CHECK(cudaGetDeviceCount(&ndev));
  if (ndev < 2) {
    fprintf(stderr, "needs two GPUs\n");
    return 1;
  }
  for (int r = 0; r < 2; r++) {
    CHECK(cudaSetDevice(r));
    CHECK(cudaDeviceEnablePeerAccess(1 - r, 0));
    CHECK(cudaMalloc(&in[r], 2 * half_bytes));
    CHECK(cudaMalloc(&out[r], 2 * half_bytes));
    CHECK(cudaStreamCreateWithFlags(&st[r], cudaStreamNonBlocking));
    CHECK(cudaEventCreate(&ev0[r]));
    CHECK(cudaEventCreate(&ev1[r]));
    fill<<<1024, 256>>>(in[r], 2 * half_bytes / sizeof(float4), (float)r);
    CHECK(cudaDeviceSynchronize());
  }
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  printf("%s x2, %d SMs, half = %zu MB\n", prop.name, prop.multiProcessorCount, mb);
  int sms = prop.multiProcessorCount;
  if (argc > 2 && strcmp(argv[2], "chunks") == 0) {
    size_t sizes[] = {16 << 20, 64 << 20};
    for (int c = 0; c < 2; c++)
      for (int ns = 1; ns <= 2; ns++)
        for (int load = 64; load >= 0; load -= 64) chunks(sizes[c], ns, 1, load);
    return 0;
  }
  int grids[] = {32, 64, sms, 2 * sms, 4 * sms};
  int thr[] = {512, 1024};
  for (int t = CE_BOTH; t <= AR_PULL_PUSH; t++) {
    int ce_only = t == CE_BOTH || t == CE_ONE;
    for (int gi = 0; gi < (ce_only ? 1 : 5); gi++)
      for (int ti = 0; ti < (ce_only ? 1 : 2); ti++) {
        if (thr[ti] == 1024 && grids[gi] > 2 * sms) continue;
        double us = run(t, grids[gi], thr[ti]);
        int ar = t >= AR_FUSED;
        // per direction: one half (twice for the all-reduces) each way
        double gbs = (ar ? 2.0 : 1.0) * half_bytes / (us * 1e3);
        printf("%-13s grid %4d x %4d: %9.1f us  %6.1f GB/s%s\n", names[t], ce_only ? 0 : grids[gi],
               ce_only ? 0 : thr[ti], us, gbs, ar ? " (all-reduce busbw)" : " each way");
        fflush(stdout);
      }
  }
  // Check one all-reduce's result: in0 + in1 on both GPUs.
  run(AR_PULL_CE, sms, 512);
  float4 h0[2], h1[2];
  for (int r = 0; r < 2; r++) {
    CHECK(cudaSetDevice(r));
    CHECK(cudaMemcpy(r ? h1 : h0, (char*)out[r] + half_bytes - sizeof(float4), 2 * sizeof(float4),
                     cudaMemcpyDeviceToHost));
  }
  printf("check: %g %g %g %g (want equal, .y 2, .z 4)\n", h0[0].x, h1[0].x, h0[1].y, h1[1].z);
  return 0;
}
