// ll128-pass-bench: the bandwidth one block reaches with LL128's loads and stores, no peer.
//
// The ceiling of one channel of the LL128 protocol on this GPU, apart from the link. Each block
// walks its own region of a buffer the way a step of src/device/prims_ll128.h does (a warp
// takes 4 groups of 4 lines per pass, lane l the 16-byte piece l % 8 of line l / 8) in one of
// these modes:
//   send      user words (8-byte loads) -> lines (st.volatile.v2.u64 with flag)
//   send_weak the same with weak stores (st.global.v2.u64)
//   recv      lines (ld.volatile.v2.u64, flags all valid: no waiting) -> user words
//   recv_red  lines + user words -> sum -> user words (the reduce-copy step)
//   copy16    plain 16-byte loads and stores of the same bytes (Simple's floor)
// and prints GB/s of user data per block for 1, 8 and 32 blocks.
//   ll128-pass-bench
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

#include "cuda_check.h"

#define LINE 128
#define WORDS 15 /* data words per line */
#define UNROLL 4 /* groups of 4 lines a warp has in flight */
#define THREADS 512
#define LINES_PER_BLOCK (1 << 16) /* 8 MiB of lines, 7.5 MiB of data per block */
#define REPS 10

enum mode { SEND, SEND_WEAK, RECV, RECV_RED, COPY16, NMODES };
static const char* const names[] = {"send", "send_weak", "recv", "recv_red", "copy16"};

__device__ __forceinline__ void st_vol(char* p, uint64_t a, uint64_t b) {
  asm volatile("st.volatile.global.v2.u64 [%0], {%1,%2};" ::"l"(p), "l"(a), "l"(b) : "memory");
}
__device__ __forceinline__ void st_weak(char* p, uint64_t a, uint64_t b) {
  asm volatile("st.global.v2.u64 [%0], {%1,%2};" ::"l"(p), "l"(a), "l"(b) : "memory");
}
__device__ __forceinline__ void ld_vol(const char* p, uint64_t* a, uint64_t* b) {
  asm volatile("ld.volatile.global.v2.u64 {%0,%1}, [%2];" : "=l"(*a), "=l"(*b) : "l"(p) : "memory");
}

template <int MODE>
__global__ void __launch_bounds__(THREADS) pass_kernel(char* lines, uint64_t* user, uint64_t flag) {
  const int lane = threadIdx.x % 32, j = lane % 8, warp = threadIdx.x / 32;
  const bool flag_thread = j == 7;
  char* my_lines = lines + (size_t)blockIdx.x * LINES_PER_BLOCK * LINE;
  uint64_t* my_user = user + (size_t)blockIdx.x * LINES_PER_BLOCK * WORDS;
  const int per_warp = 4 * UNROLL, stride = (THREADS / 32) * per_warp;
  if constexpr (MODE == COPY16) {
    /* The same bytes as 16-byte vectors, every thread a contiguous piece in turn. */
    uint4* u = (uint4*)my_user;
    const int n = LINES_PER_BLOCK * WORDS / 2;
    for (int i = threadIdx.x; i < n; i += THREADS * UNROLL) {
      uint4 v[UNROLL];
#pragma unroll
      for (int k = 0; k < UNROLL; k++)
        if (i + k * THREADS < n) v[k] = u[i + k * THREADS];
#pragma unroll
      for (int k = 0; k < UNROLL; k++)
        if (i + k * THREADS < n) ((uint4*)my_lines)[i + k * THREADS] = v[k];
    }
  } else {
    for (int first = warp * per_warp; first < LINES_PER_BLOCK; first += stride) {
      uint64_t x[UNROLL], y[UNROLL], a[UNROLL], b[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; u++) {
        const int line = first + 4 * u + lane / 8, w = line * WORDS + 2 * j;
        x[u] = y[u] = 0;
        if (MODE != RECV) {
          x[u] = my_user[w];
          if (!flag_thread) y[u] = my_user[w + 1];
        }
      }
      if (MODE == RECV || MODE == RECV_RED) {
        for (;;) {
          bool stale = false;
#pragma unroll
          for (int u = 0; u < UNROLL; u++) {
            const int line = first + 4 * u + lane / 8;
            ld_vol(my_lines + (size_t)line * LINE + 16 * j, &a[u], &b[u]);
            stale |= flag_thread && b[u] != flag;
          }
          if (!__any_sync(0xffffffffu, stale)) break;
        }
      }
#pragma unroll
      for (int u = 0; u < UNROLL; u++) {
        const int line = first + 4 * u + lane / 8, w = line * WORDS + 2 * j;
        char* p = my_lines + (size_t)line * LINE + 16 * j;
        if (MODE == SEND) {
          __syncwarp();
          st_vol(p, x[u], flag_thread ? flag : y[u]);
        } else if (MODE == SEND_WEAK) {
          __syncwarp();
          st_weak(p, x[u], flag_thread ? flag : y[u]);
        } else {
          uint64_t v0 = a[u] + (MODE == RECV_RED ? x[u] : 0);
          uint64_t v1 = b[u] + (MODE == RECV_RED ? y[u] : 0);
          my_user[w] = v0;
          if (!flag_thread) my_user[w + 1] = v1;
        }
      }
    }
  }
}

template <int MODE>
static float run(int blocks, char* lines, uint64_t* user) {
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  pass_kernel<MODE><<<blocks, THREADS>>>(lines, user, 1); /* warm-up; leaves flags = 1 */
  CHECK(cudaGetLastError());
  CHECK(cudaEventRecord(e0));
  for (int r = 0; r < REPS; r++) pass_kernel<MODE><<<blocks, THREADS>>>(lines, user, 1);
  CHECK(cudaEventRecord(e1));
  CHECK(cudaEventSynchronize(e1));
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, e0, e1));
  CHECK(cudaEventDestroy(e0));
  CHECK(cudaEventDestroy(e1));
  double bytes = (double)REPS * blocks * LINES_PER_BLOCK * WORDS * 8;
  return (float)(bytes / (ms * 1e-3) / 1e9 / blocks);
}

int main(void) {
  const int counts[] = {1, 8, 32};
  char* lines;
  uint64_t* user;
  size_t line_bytes = (size_t)32 * LINES_PER_BLOCK * LINE;
  size_t user_bytes = (size_t)32 * LINES_PER_BLOCK * WORDS * 8;
  CHECK(cudaMalloc(&lines, line_bytes));
  CHECK(cudaMalloc(&user, user_bytes));
  CHECK(cudaMemset(user, 1, user_bytes));
  /* The send modes write flag 1 everywhere first, so the receive modes never wait. */
  run<SEND>(32, lines, user);
  printf("GB/s of user data per block (%d threads, %d line groups in flight per warp)\n", THREADS,
         UNROLL);
  printf("%-10s %8s %8s %8s\n", "mode", "1 block", "8", "32");
  for (int m = 0; m < NMODES; m++) {
    printf("%-10s", names[m]);
    for (int c = 0; c < 3; c++) {
      float g = m == SEND        ? run<SEND>(counts[c], lines, user)
                : m == SEND_WEAK ? run<SEND_WEAK>(counts[c], lines, user)
                : m == RECV      ? run<RECV>(counts[c], lines, user)
                : m == RECV_RED  ? run<RECV_RED>(counts[c], lines, user)
                                 : run<COPY16>(counts[c], lines, user);
      printf(" %8.1f", g);
    }
    printf("\n");
  }
  CHECK(cudaFree(lines));
  CHECK(cudaFree(user));
  return 0;
}
