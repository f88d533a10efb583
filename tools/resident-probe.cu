/*
 * resident-probe: could a kernel that stays resident run small exchanges faster than a launch
 * each? Two GPUs, one host thread each, N ops of one 8-byte exchange (each GPU stores a word
 * with its flag into the other's memory and waits for the other's), three ways:
 *   launch   one kernel launch per op (what Braid does);
 *   memops   a kernel resident for all N ops on a side stream; per op the user's stream gets a
 *            write of "go k" into device memory and a wait for "done >= k"
 *            (cuStreamBatchMemOp), so the op starts after the stream's earlier work and the
 *            stream's later work waits for it;
 *   event    the same kernel; per op an event recorded on the user's stream (its earlier work
 *            done) that a helper thread polls and answers with "go k" in mapped host memory,
 *            and the wait for "done >= k" on the user's stream.
 * Per op: host time of the submitting loop, and time to the stream's end. The data is checked.
 *   nvcc -O2 -arch=sm_90 -Itools -o /tmp/resident-probe tools/resident-probe.cu -lcuda -lpthread
 */
#include <cuda.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "call_timer.h"
#include "cuda_check.h"

#define NOPS 20000
#define NEVENTS 64

struct side {
  int dev;
  cudaStream_t user, resident;
  uint64_t* inbox;      /* this GPU's: the peer writes {value, flag} pairs here (2 slots) */
  uint64_t* peer_inbox; /* the peer's inbox */
  uint32_t* go_dev;     /* memops: the user's stream writes k here */
  volatile uint32_t* go_host; /* event: the helper writes k here (mapped host memory) */
  uint32_t* go_host_dev;
  uint32_t* done;       /* the kernel writes k here once op k is done */
  uint64_t* result;     /* what the peer sent in the last op */
  cudaEvent_t ev[NEVENTS];
  volatile int helper_at, user_at, stop;
  double host_us, end_us;
  int bad;
};

static struct side sides[2];
static pthread_barrier_t barrier;

/* One exchange: op k sends (rank + 1) * k and expects (peer + 1) * k. Thread 0 only. */
__device__ __forceinline__ uint64_t exchange(uint64_t* inbox, uint64_t* peer_inbox, uint32_t k,
                                             int rank) {
  volatile uint64_t* out = peer_inbox + 2 * (k & 1);
  volatile uint64_t* in = inbox + 2 * (k & 1);
  out[0] = (uint64_t)(rank + 1) * k;
  __threadfence_system();
  out[1] = k;
  while (in[1] != k) {
  }
  return in[0];
}

__global__ void k_one(uint64_t* inbox, uint64_t* peer_inbox, uint32_t k, int rank,
                      uint64_t* result) {
  if (threadIdx.x == 0) *result = exchange(inbox, peer_inbox, k, rank);
}

/* Resident for n ops: waits for go >= k, exchanges, writes done = k. */
__global__ void k_resident(uint64_t* inbox, uint64_t* peer_inbox, const uint32_t* go, int n,
                           int rank, uint32_t* done, uint64_t* result) {
  if (threadIdx.x != 0) return;
  for (uint32_t k = 1; k <= (uint32_t)n; k++) {
    while (*(volatile const uint32_t*)go < k) {
    }
    *result = exchange(inbox, peer_inbox, k, rank);
    __threadfence_system();
    *(volatile uint32_t*)done = k;
  }
}

static void* helper_main(void* arg) {
  struct side* s = (struct side*)arg;
  CHECK(cudaSetDevice(s->dev));
  for (int k = 1; k <= NOPS && !s->stop; k++) {
    while (s->user_at < k && !s->stop) {
    }
    cudaError_t e;
    while ((e = cudaEventQuery(s->ev[k % NEVENTS])) == cudaErrorNotReady) {
    }
    CHECK(e);
    *s->go_host = (uint32_t)k;
    __atomic_store_n(&s->helper_at, k, __ATOMIC_RELEASE);
  }
  return NULL;
}

static void run_side(struct side* s, int rank, const char* mode) {
  CHECK(cudaSetDevice(s->dev));
  CHECK(cudaMemset(s->inbox, 0, 64));
  CHECK(cudaMemset(s->go_dev, 0, 4));
  CHECK(cudaMemset(s->done, 0, 4));
  *s->go_host = 0;
  s->user_at = s->helper_at = s->stop = 0;
  CHECK(cudaDeviceSynchronize());
  pthread_barrier_wait(&barrier);
  pthread_t helper;
  int is_launch = strcmp(mode, "launch") == 0, is_event = strcmp(mode, "event") == 0;
  if (!is_launch)
    k_resident<<<1, 32, 0, s->resident>>>(s->inbox, s->peer_inbox,
                                          is_event ? s->go_host_dev : s->go_dev, NOPS, rank,
                                          s->done, s->result);
  if (is_event) pthread_create(&helper, NULL, helper_main, s);
  CHECK(cudaGetLastError());
  pthread_barrier_wait(&barrier);
  double t0 = call_timer_now_us();
  for (uint32_t k = 1; k <= NOPS; k++) {
    if (is_launch) {
      k_one<<<1, 32, 0, s->user>>>(s->inbox, s->peer_inbox, k, rank, s->result);
    } else if (is_event) {
      while ((int)k - __atomic_load_n(&s->helper_at, __ATOMIC_ACQUIRE) >= NEVENTS - 2) {
      }
      CHECK(cudaEventRecord(s->ev[k % NEVENTS], s->user));
      __atomic_store_n(&s->user_at, (int)k, __ATOMIC_RELEASE);
      CHECK_CU(cuStreamWaitValue32((CUstream)s->user, (CUdeviceptr)s->done, k,
                                   CU_STREAM_WAIT_VALUE_GEQ));
    } else {
      CUstreamBatchMemOpParams ops[2];
      memset(ops, 0, sizeof ops);
      ops[0].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
      ops[0].writeValue.address = (CUdeviceptr)s->go_dev;
      ops[0].writeValue.value = k;
      ops[1].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
      ops[1].waitValue.address = (CUdeviceptr)s->done;
      ops[1].waitValue.value = k;
      ops[1].waitValue.flags = CU_STREAM_WAIT_VALUE_GEQ;
      CHECK_CU(cuStreamBatchMemOp((CUstream)s->user, 2, ops, 0));
    }
  }
  double t1 = call_timer_now_us();
  CHECK(cudaStreamSynchronize(s->user));
  double t2 = call_timer_now_us();
  CHECK(cudaStreamSynchronize(s->resident));
  if (is_event) pthread_join(helper, NULL);
  uint64_t got = 0;
  CHECK(cudaMemcpy(&got, s->result, 8, cudaMemcpyDeviceToHost));
  s->bad = got != (uint64_t)(2 - rank) * NOPS;
  s->host_us = (t1 - t0) / NOPS;
  s->end_us = (t2 - t0) / NOPS;
}

static const char* mode_now;

static void* side_main(void* arg) {
  int rank = (int)(intptr_t)arg;
  run_side(&sides[rank], rank, mode_now);
  return NULL;
}

int main(void) {
  int n = 0;
  CHECK(cudaGetDeviceCount(&n));
  if (n < 2) {
    fprintf(stderr, "resident-probe: needs two GPUs, found %d\n", n);
    return 2;
  }
  for (int r = 0; r < 2; r++) {
    struct side* s = &sides[r];
    s->dev = r;
    CHECK(cudaSetDevice(r));
    CHECK(cudaDeviceEnablePeerAccess(1 - r, 0));
    CHECK(cudaStreamCreateWithFlags(&s->user, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&s->resident, cudaStreamNonBlocking));
    CHECK(cudaMalloc(&s->inbox, 64));
    CHECK(cudaMalloc(&s->go_dev, 64));
    CHECK(cudaMalloc(&s->done, 64));
    CHECK(cudaMalloc(&s->result, 64));
    uint32_t* h = NULL;
    CHECK(cudaHostAlloc(&h, 64, cudaHostAllocMapped));
    s->go_host = h;
    CHECK(cudaHostGetDevicePointer(&s->go_host_dev, h, 0));
    for (int e = 0; e < NEVENTS; e++)
      CHECK(cudaEventCreateWithFlags(&s->ev[e], cudaEventDisableTiming));
  }
  sides[0].peer_inbox = sides[1].inbox;
  sides[1].peer_inbox = sides[0].inbox;
  pthread_barrier_init(&barrier, NULL, 2);
  const char* modes[] = {"launch", "memops", "event", "launch", "memops", "event"};
  for (int m = 0; m < 6; m++) {
    pthread_t t[2];
    mode_now = modes[m];
    for (int r = 0; r < 2; r++) pthread_create(&t[r], NULL, side_main, (void*)(intptr_t)r);
    for (int r = 0; r < 2; r++) pthread_join(t[r], NULL);
    printf("%-7s GPU 0: %6.2f us/op on the host, %6.2f to the stream's end%s | GPU 1: %6.2f, %6.2f%s\n",
           modes[m], sides[0].host_us, sides[0].end_us, sides[0].bad ? " WRONG DATA" : "",
           sides[1].host_us, sides[1].end_us, sides[1].bad ? " WRONG DATA" : "");
  }
  return 0;
}
