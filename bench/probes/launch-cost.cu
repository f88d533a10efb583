// launch-cost: host time of one kernel launch, and what each kernel or process property adds.
//
// A launch of a kernel like Braid's can cost more on the host than cuda-call-cost's launch of an
// empty one, and a second launch right after the first costs as much: something about the
// kernel or the process, not cold caches. Each line is one property changed against the first:
// the parameter space declared, a stack frame (local memory), clusters, a kernel the GPU is
// still running when the next launch comes, peer access to the other GPUs, a large allocation.
//   launch-cost [GPU [stack|order]]
// Run one copy per GPU at once to see the other process's effect: launch-cost 0 & launch-cost 1.
// "stack": stack frames of 0-2 KB against 112 B or 4 KB of parameters passed, each changed
// alone. "order": an eager launch's bookkeeping calls next to a bare launch, and whether a
// stream wait on a programmatic event (CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT) orders a kernel
// after another.
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "call_timer.h"
#include "cuda_check.h"

#define N 20000

struct big_args {
  int n;         /* 0 at run time: the kernels do no work */
  int pad;
  long long spin; /* k_spin: clock cycles to wait */
  char b[3952];
};

__global__ void __launch_bounds__(512) k_big(const __grid_constant__ big_args a) { (void)a; }

/* The same, with a 2 KB stack frame a thread (Braid's kernels spill ~2 KB). */
__global__ void __launch_bounds__(512) k_lmem(const __grid_constant__ big_args a, int* out) {
  volatile char buf[2048];
  for (int i = 0; i < a.n; i++) buf[(i * 131 + a.b[i & 63]) & 2047] = (char)i;
  if (a.n > 0 && out != nullptr) *out = buf[a.b[0] & 2047];
}

/* Holds the GPU for a.spin cycles: the next launch comes while it runs. */
__global__ void __launch_bounds__(512) k_spin(const __grid_constant__ big_args a) {
  long long t0 = clock64();
  while (clock64() - t0 < a.spin) {
  }
}

/*
 * A stack frame of FRAME bytes a thread and nothing else, the pointer first so that the launch can
 * pass as few bytes as Braid's one-work launch does (112) or the whole struct (4 KB): which of
 * the two makes k_lmem's launch dearer, the frame or the bytes passed ("stack" mode).
 */
template <int FRAME>
__global__ void __launch_bounds__(512) k_stack(int* out, const __grid_constant__ big_args a) {
  volatile char buf[FRAME];
  for (int i = 0; i < a.n; i++) buf[(i * 131 + a.b[i & 63]) % FRAME] = (char)i;
  if (a.n > 0 && out != nullptr) *out = buf[a.b[0] % FRAME];
}

/* "order" mode: A spins, then sets *flag; B (another stream, after a wait on A's event) reads it. */
__global__ void k_set_after(int* flag, long long spin) {
  long long t0 = clock64();
  while (clock64() - t0 < spin) {
  }
  __threadfence_system();
  *(volatile int*)flag = 1;
}
template <int WAIT>
__global__ void k_read_flag(const int* flag, int* seen) {
  if (WAIT) asm volatile("griddepcontrol.wait;" ::: "memory");
  *seen = *(const volatile int*)flag;
}

static int dev;

#define TIME(label, ...)                                                              \
  do {                                                                                \
    double host_, all_;                                                               \
    CALL_TIMER(s, N, host_, all_, __VA_ARGS__);                                       \
    printf("GPU %d %-52s %7.3f us/call on the host, %7.3f with the GPU\n", dev, label, \
           host_, all_);                                                              \
  } while (0)

int main(int argc, char** argv) {
  dev = argc > 1 ? atoi(argv[1]) : 0;
  cudaStream_t s;
  big_args a = {};
  int* out = NULL;
  CHECK(cudaSetDevice(dev));
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CHECK(cudaMalloc(&out, 64));
  CUfunction fbig, flmem, fspin;
  CHECK(cudaGetFuncBySymbol(&fbig, (const void*)k_big));
  CHECK(cudaGetFuncBySymbol(&flmem, (const void*)k_lmem));
  CHECK(cudaGetFuncBySymbol(&fspin, (const void*)k_spin));
  struct cudaFuncAttributes fa;
  CHECK(cudaFuncGetAttributes(&fa, (const void*)k_lmem));
  printf("GPU %d k_lmem: %zu B of local memory a thread, %d registers\n", dev, fa.localSizeBytes,
         fa.numRegs);
  int clock_khz = 0;
  CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, dev));
  size_t used = 112;
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &a, CU_LAUNCH_PARAM_BUFFER_SIZE, &used,
                   CU_LAUNCH_PARAM_END};
  /* k_lmem's parameters: the struct, then the pointer (at its aligned offset). */
  struct {
    big_args a;
    int* out;
  } lp = {a, out};
  size_t lused = sizeof lp;
  void* lextra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &lp, CU_LAUNCH_PARAM_BUFFER_SIZE, &lused,
                    CU_LAUNCH_PARAM_END};
  CUlaunchAttribute attrs[2];
  attrs[0].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
  attrs[0].value.clusterDim.x = 4;
  attrs[0].value.clusterDim.y = attrs[0].value.clusterDim.z = 1;
  attrs[1].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE;
  attrs[1].value.clusterSchedulingPolicyPreference = CU_CLUSTER_SCHEDULING_POLICY_SPREAD;
  CUlaunchConfig cfg = cost_launch_config(4, 512, s, attrs, 2);

  if (argc > 2 && strcmp(argv[2], "stack") == 0) {
    /* Stack frame by bytes passed, each alone; then the empty kernel again (drift). */
    const void* ks[] = {(const void*)k_big, (const void*)k_stack<16>, (const void*)k_stack<256>,
                        (const void*)k_stack<2048>};
    const char* names[] = {"no frame (empty kernel)", "16 B frame", "256 B frame", "2 KB frame"};
    struct {
      int* out;
      big_args a;
    } sp = {NULL, a};
    for (int rep = 0; rep < 2; rep++) {
      for (int k = 0; k < 4; k++) {
        CUfunction f;
        CHECK(cudaGetFuncBySymbol(&f, ks[k]));
        CHECK(cudaFuncGetAttributes(&fa, ks[k]));
        for (int big = 0; big < 2; big++) {
          /* The empty kernel takes the struct alone: pass it from the struct's start. */
          void* base = k == 0 ? (void*)&a : (void*)&sp;
          size_t bytes = big ? (k == 0 ? sizeof a : sizeof sp) : (size_t)112;
          void* ex[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, base, CU_LAUNCH_PARAM_BUFFER_SIZE, &bytes,
                        CU_LAUNCH_PARAM_END};
          char label[96];
          snprintf(label, sizeof label, "%s (%zu B local), %zu B passed, 1 x 512", names[k],
                   fa.localSizeBytes, bytes);
          TIME(label, CHECK_CU(cuLaunchKernel(f, 1, 1, 1, 512, 1, 1, 0, s, NULL, ex)));
        }
      }
    }
    return 0;
  }
  if (argc > 2 && strcmp(argv[2], "order") == 0) {
    /*
     * What an eager launch's bookkeeping costs in place, each next to a bare launch: the
     * ordering event (cuEventRecord after the launch, or the programmatic event given with
     * the launch), the stream queries, two buffer-id queries, the device get/set; then
     * whether a wait on a programmatic event orders a kernel that does not sync on it.
     */
    CUevent ev;
    CUstream s2;
    CHECK_CU(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
    CHECK_CU(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
    CUlaunchAttribute pa[1];
    pa[0].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT;
    pa[0].value.programmaticEvent.event = ev;
    pa[0].value.programmaticEvent.flags = 0;
    pa[0].value.programmaticEvent.triggerAtBlockStart = 0;
    CUlaunchConfig pc = cost_launch_config(1, 512, s, pa, 1);
    CUlaunchConfig nc = pc;
    nc.numAttrs = 0;
    CUdeviceptr p1 = (CUdeviceptr)(uintptr_t)out, p2 = 0;
    CHECK_CU(cuMemAlloc(&p2, 4096));
    for (int rep = 0; rep < 3; rep++) {
      TIME("launch", CHECK_CU(cuLaunchKernel(fbig, 1, 1, 1, 512, 1, 1, 0, s, NULL, extra)));
      TIME("launchEx, no attribute", CHECK_CU(cuLaunchKernelEx(&nc, fbig, NULL, extra)));
      TIME("launch + cuEventRecord", {
        CHECK_CU(cuLaunchKernel(fbig, 1, 1, 1, 512, 1, 1, 0, s, NULL, extra));
        CHECK_CU(cuEventRecord(ev, s));
      });
      TIME("launchEx with the programmatic event", CHECK_CU(cuLaunchKernelEx(&pc, fbig, NULL, extra)));
      TIME("launch + cuStreamGetId + cudaStreamIsCapturing", {
        unsigned long long id;
        cudaStreamCaptureStatus st;
        CHECK_CU(cuStreamGetId(s, &id));
        CHECK(cudaStreamIsCapturing(s, &st));
        CHECK_CU(cuLaunchKernel(fbig, 1, 1, 1, 512, 1, 1, 0, s, NULL, extra));
      });
      TIME("launch + 2 buffer-id queries", {
        unsigned long long b1, b2;
        CHECK_CU(cuPointerGetAttribute(&b1, CU_POINTER_ATTRIBUTE_BUFFER_ID, p1));
        CHECK_CU(cuPointerGetAttribute(&b2, CU_POINTER_ATTRIBUTE_BUFFER_ID, p2));
        CHECK_CU(cuLaunchKernel(fbig, 1, 1, 1, 512, 1, 1, 0, s, NULL, extra));
      });
      TIME("launch + cudaGetDevice", {
        int d;
        CHECK(cudaGetDevice(&d));
        CHECK_CU(cuLaunchKernel(fbig, 1, 1, 1, 512, 1, 1, 0, s, NULL, extra));
      });
      TIME("launch + cuCtxGetCurrent", {
        CUcontext c;
        CHECK_CU(cuCtxGetCurrent(&c));
        CHECK_CU(cuLaunchKernel(fbig, 1, 1, 1, 512, 1, 1, 0, s, NULL, extra));
      });
      TIME("launch + cudaStreamIsCapturing", {
        cudaStreamCaptureStatus st;
        CHECK(cudaStreamIsCapturing(s, &st));
        CHECK_CU(cuLaunchKernel(fbig, 1, 1, 1, 512, 1, 1, 0, s, NULL, extra));
      });
      TIME("launch + cuStreamIsCapturing", {
        CUstreamCaptureStatus st;
        CHECK_CU(cuStreamIsCapturing(s, &st));
        CHECK_CU(cuLaunchKernel(fbig, 1, 1, 1, 512, 1, 1, 0, s, NULL, extra));
      });
      TIME("launch + cuStreamGetId", {
        unsigned long long id;
        CHECK_CU(cuStreamGetId(s, &id));
        CHECK_CU(cuLaunchKernel(fbig, 1, 1, 1, 512, 1, 1, 0, s, NULL, extra));
      });
      TIME("launch + cudaGetDevice + cudaSetDevice", {
        int d;
        CHECK(cudaGetDevice(&d));
        CHECK(cudaSetDevice(d));
        CHECK_CU(cuLaunchKernel(fbig, 1, 1, 1, 512, 1, 1, 0, s, NULL, extra));
      });
    }
    /* How long after a 20 us kernel's end cuEventQuery first says done, by how it was recorded. */
    for (int mode = 0; mode < 2; mode++) {
      double lat[50];
      a.spin = (long long)clock_khz * 20 / 1000;
      CUlaunchConfig c = pc;
      c.numAttrs = mode;
      for (int t = 0; t < 50; t++) {
        CHECK(cudaStreamSynchronize(s));
        double t0 = call_timer_now_us();
        CHECK_CU(cuLaunchKernelEx(&c, fspin, NULL, extra));
        if (mode == 0) CHECK_CU(cuEventRecord(ev, s));
        CUresult q;
        while ((q = cuEventQuery(ev)) == CUDA_ERROR_NOT_READY) {
        }
        CHECK_CU(q);
        lat[t] = call_timer_now_us() - t0;
      }
      a.spin = 0;
      for (int i = 1; i < 50; i++)
        for (int j = i; j > 0 && lat[j - 1] > lat[j]; j--) {
          double x = lat[j];
          lat[j] = lat[j - 1];
          lat[j - 1] = x;
        }
      printf("GPU %d 20 us kernel, launch to cuEventQuery done, %s: min %.1f median %.1f max %.1f us\n",
             dev, mode ? "programmatic event" : "cuEventRecord", lat[0], lat[25], lat[49]);
    }
    /* Ordering: B reads A's flag after a stream wait on A's event (100 tries each). */
    int *flag = NULL, *seen = NULL;
    CHECK(cudaMalloc(&flag, sizeof(int)));
    CHECK(cudaMalloc(&seen, sizeof(int)));
    CUfunction fa_set, fb_plain, fb_wait;
    CHECK(cudaGetFuncBySymbol(&fa_set, (const void*)k_set_after));
    CHECK(cudaGetFuncBySymbol(&fb_plain, (const void*)k_read_flag<0>));
    CHECK(cudaGetFuncBySymbol(&fb_wait, (const void*)k_read_flag<1>));
    long long spin = (long long)clock_khz * 50 / 1000; /* 50 us */
    const char* how[] = {"cuEventRecord after A, B plain", "programmatic event on A, B plain",
                         "programmatic event on A, B griddepcontrol.wait first"};
    for (int mode = 0; mode < 3; mode++) {
      int early = 0, late = 0;
      for (int t = 0; t < 100; t++) {
        int got = -1;
        CHECK(cudaMemset(flag, 0, sizeof(int)));
        CHECK(cudaMemset(seen, 0xff, sizeof(int)));
        CHECK(cudaDeviceSynchronize());
        void* aargs[] = {&flag, &spin};
        void* bargs[] = {&flag, &seen};
        if (mode == 0) {
          CHECK_CU(cuLaunchKernel(fa_set, 1, 1, 1, 32, 1, 1, 0, s, aargs, NULL));
          CHECK_CU(cuEventRecord(ev, s));
        } else {
          CUlaunchConfig c = pc;
          c.blockDimX = 32;
          CHECK_CU(cuLaunchKernelEx(&c, fa_set, aargs, NULL));
        }
        CHECK_CU(cuStreamWaitEvent(s2, ev, 0));
        CHECK_CU(cuLaunchKernel(mode == 2 ? fb_wait : fb_plain, 1, 1, 1, 32, 1, 1, 0, s2, bargs, NULL));
        CHECK(cudaDeviceSynchronize());
        CHECK(cudaMemcpy(&got, seen, sizeof(int), cudaMemcpyDeviceToHost));
        if (got == 0) early++;
        else if (got == 1) late++;
      }
      printf("GPU %d ordering, %s: B saw the flag unset %d times, set %d times of 100\n", dev,
             how[mode], early, late);
    }
    return 0;
  }
  for (int round = 0; round < 3; round++) {
    if (round == 1) {
      int n = 0, ok = 0;
      CHECK(cudaGetDeviceCount(&n));
      for (int p = 0; p < n; p++) {
        int can = 0;
        if (p == dev) continue;
        CHECK(cudaDeviceCanAccessPeer(&can, dev, p));
        if (can && cudaDeviceEnablePeerAccess(p, 0) == cudaSuccess) ok++;
        (void)cudaGetLastError();
      }
      printf("GPU %d -- with peer access to %d other GPUs\n", dev, ok);
    }
    if (round == 2) {
      void* big = NULL;
      CHECK(cudaMalloc(&big, (size_t)8 << 30));
      printf("GPU %d -- with 8 GiB more allocated\n", dev);
    }
    TIME("empty kernel, 112 B passed, 1 x 512", CHECK_CU(cuLaunchKernel(fbig, 1, 1, 1, 512, 1, 1, 0, s, NULL, extra)));
    TIME("empty kernel, 112 B passed, 32 x 512", CHECK_CU(cuLaunchKernel(fbig, 32, 1, 1, 512, 1, 1, 0, s, NULL, extra)));
    TIME("2 KB stack frame, 1 x 512", CHECK_CU(cuLaunchKernel(flmem, 1, 1, 1, 512, 1, 1, 0, s, NULL, lextra)));
    TIME("2 KB stack frame, 32 x 512", CHECK_CU(cuLaunchKernel(flmem, 32, 1, 1, 512, 1, 1, 0, s, NULL, lextra)));
    TIME("empty kernel, clusters of 4, 4 x 512", CHECK_CU(cuLaunchKernelEx(&cfg, fbig, NULL, extra)));
    a.spin = (long long)clock_khz * 2 / 1000; /* 2 us (kHz: cycles a ms): the GPU keeps up */
    TIME("kernel of 2 us on the GPU, 1 x 512", CHECK_CU(cuLaunchKernel(fspin, 1, 1, 1, 512, 1, 1, 0, s, NULL, extra)));
    TIME("empty, then 2 KB frame, alternating", {
      if (i_ & 1)
        CHECK_CU(cuLaunchKernel(flmem, 1, 1, 1, 512, 1, 1, 0, s, NULL, lextra));
      else
        CHECK_CU(cuLaunchKernel(fbig, 1, 1, 1, 512, 1, 1, 0, s, NULL, extra));
    });
    a.spin = 0;
  }
  return 0;
}
