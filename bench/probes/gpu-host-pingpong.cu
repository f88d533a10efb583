// gpu-host-pingpong: the time of one GPU <-> host crossing through mapped host memory.
//
// What the GPU side of a network hop costs, with no network. A kernel (one thread) and a host
// thread pass a counter back and forth through pinned, device-mapped host memory, the way a
// kernel and the proxy meet in a network FIFO:
//   GPU: write 8 bytes of "data" to host memory, then publish the counter (st.release.sys, as
//        the Simple protocol publishes its tail); wait for the host's answer with
//        ld.acquire.sys polls (as the receiver waits on the tail); read the host's 8 bytes back.
//   CPU: spin on the counter, answer with data then counter (release).
// Half a round trip is what one crossing GPU -> host (or host -> GPU) costs when both sides
// spin; the hop through sockets adds the proxy and TCP on top. Also printed: the time of one
// st.release.sys and one ld.acquire.sys to host memory, each in a loop on the GPU
// (globaltimer).
//   gpu-host-pingpong [iters]
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/prims_common.h" /* ld_acquire_sys, st_release_sys: the kernels' own */
#include "cuda_check.h"

struct shared_mem {
  uint64_t to_host; /* counter the GPU publishes */
  char pad0[120];
  uint64_t to_gpu; /* counter the host publishes */
  char pad1[120];
  uint64_t data_up; /* the GPU's 8 bytes of data */
  char pad2[120];
  uint64_t data_down; /* the host's */
};

__device__ __forceinline__ uint64_t now_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

/* Round trips with the host; times[i] = ns of round trip i; bad counts wrong data. */
__global__ void pingpong(shared_mem* m, int iters, uint64_t* times, int* bad) {
  for (int i = 0; i < iters; i++) {
    uint64_t t0 = now_ns();
    *(volatile uint64_t*)&m->data_up = 0x1000 + i;
    braid::st_release_sys(&m->to_host, i + 1);
    while (braid::ld_acquire_sys(&m->to_gpu) < (uint64_t)i + 1) {
    }
    if (*(volatile uint64_t*)&m->data_down != 0x2000 + (uint64_t)i) (*bad)++;
    times[i] = now_ns() - t0;
  }
}

/* ns per st.release.sys and per ld.acquire.sys to host memory, `n` of each. */
__global__ void op_costs(shared_mem* m, int n, uint64_t* out) {
  uint64_t t0 = now_ns();
  for (int i = 0; i < n; i++) braid::st_release_sys(&m->data_up, i);
  uint64_t t1 = now_ns();
  uint64_t sum = 0;
  for (int i = 0; i < n; i++) sum += braid::ld_acquire_sys(&m->data_down);
  uint64_t t2 = now_ns();
  out[0] = (t1 - t0) / n;
  out[1] = (t2 - t1) / n;
  out[2] = sum;
}

static shared_mem* host_mem;
static int host_iters;

static void* host_side(void* arg) {
  (void)arg;
  for (int i = 0; i < host_iters; i++) {
    while (__atomic_load_n(&host_mem->to_host, __ATOMIC_ACQUIRE) < (uint64_t)i + 1) {
    }
    if (__atomic_load_n(&host_mem->data_up, __ATOMIC_RELAXED) != 0x1000 + (uint64_t)i)
      fprintf(stderr, "host: wrong data at %d\n", i);
    __atomic_store_n(&host_mem->data_down, 0x2000 + (uint64_t)i, __ATOMIC_RELAXED);
    __atomic_store_n(&host_mem->to_gpu, (uint64_t)i + 1, __ATOMIC_RELEASE);
  }
  return NULL;
}

static int cmp_u64(const void* a, const void* b) {
  uint64_t x = *(const uint64_t*)a, y = *(const uint64_t*)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char** argv) {
  int iters = argc > 1 ? atoi(argv[1]) : 20000;
  if (iters < 10) iters = 10;
  shared_mem* m;
  shared_mem* dm;
  uint64_t *times, *costs;
  int* bad;
  CHECK(cudaHostAlloc((void**)&m, sizeof *m, cudaHostAllocMapped));
  CHECK(cudaHostGetDevicePointer((void**)&dm, m, 0));
  CHECK(cudaMalloc((void**)&times, sizeof(uint64_t) * iters));
  CHECK(cudaMalloc((void**)&costs, sizeof(uint64_t) * 3));
  CHECK(cudaMalloc((void**)&bad, sizeof(int)));
  CHECK(cudaMemset(bad, 0, sizeof(int)));
  memset(m, 0, sizeof *m);

  op_costs<<<1, 1>>>(dm, 2000, costs);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  uint64_t c[3];
  CHECK(cudaMemcpy(c, costs, sizeof c, cudaMemcpyDeviceToHost));
  memset(m, 0, sizeof *m);

  host_mem = m;
  host_iters = iters;
  pthread_t th;
  if (pthread_create(&th, NULL, host_side, NULL) != 0) return 1;
  pingpong<<<1, 1>>>(dm, iters, times, bad);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  pthread_join(th, NULL);
  uint64_t* t = (uint64_t*)malloc(sizeof(uint64_t) * iters);
  int nbad = 0;
  CHECK(cudaMemcpy(t, times, sizeof(uint64_t) * iters, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(&nbad, bad, sizeof nbad, cudaMemcpyDeviceToHost));
  qsort(t, iters, sizeof *t, cmp_u64);
  printf(
      "GPU <-> host through mapped host memory, %d round trips: half a round trip "
      "min %.2f  median %.2f  p90 %.2f us; wrong data %d\n",
      iters, t[0] / 2e3, t[iters / 2] / 2e3, t[iters * 9 / 10] / 2e3, nbad);
  printf("one st.release.sys to host memory %.2f us, one ld.acquire.sys from it %.2f us\n",
         c[0] / 1e3, c[1] / 1e3);
  free(t);
  return nbad != 0;
}
