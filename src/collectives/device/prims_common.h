/*
 * What every protocol's primitives share: one end of a connection as a
 * running group of threads sees it (loaded from the braid_dev_conn the host
 * set up, saved back after the last step so the next kernel continues the
 * step count), the system-scope counter accesses, and named barriers.
 */
#ifndef BRAID_DEVICE_PRIMS_COMMON_H
#define BRAID_DEVICE_PRIMS_COMMON_H

#include "collectives/device/reduce_copy.h"

namespace braid {

#define BRAID_UNROLL 4
#define BRAID_ABORT_CHECK_SPINS 1024

__device__ __forceinline__ uint64_t ld_acquire_sys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void st_release_sys(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

/*
 * A release to several counters at once: one fence, then plain (relaxed)
 * stores, each of which publishes everything before the fence, as a
 * st.release.sys would, without a fence per counter.
 */
__device__ __forceinline__ void fence_acq_rel_sys() {
  asm volatile("fence.acq_rel.sys;" ::: "memory");
}

__device__ __forceinline__ void st_relaxed_sys(uint64_t* p, uint64_t v) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ void group_barrier(int id, int nthreads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(nthreads) : "memory");
}

/* One end of a connection as a running group sees it. */
struct conn_end {
  struct braid_dev_conn* global; /* where `step` is saved at the end */
  char* buff;
  uint64_t* tail;
  uint64_t* head;
  uint32_t* sizes; /* sender: per-slot byte counts for the proxy, or NULL */
  uint64_t step;
  uint64_t seen_head; /* sender: the last head value read */
  uint32_t slot_bytes;
  char* ll_buff;
  uint32_t ll_slot_bytes;
};

__device__ __forceinline__ void conn_end_load(conn_end* c, struct braid_dev_conn* g) {
  c->global = g;
  c->buff = g->buff;
  c->tail = g->tail;
  c->head = g->head;
  c->sizes = g->sizes;
  c->step = g->step;
  c->seen_head = g->seen_head;
  c->slot_bytes = g->slot_bytes;
  c->ll_buff = g->ll_buff;
  c->ll_slot_bytes = g->ll_slot_bytes;
}

template <typename T>
__device__ __forceinline__ T* conn_slot(const conn_end& c) {
  return (T*)(c.buff + (size_t)(c.step % BRAID_STEPS) * c.slot_bytes);
}

/* Saves an end's step (and a sender's cached head) for the next kernel. */
__device__ __forceinline__ void conn_end_save(const conn_end& c, bool is_send) {
  c.global->step = c.step;
  if (is_send) c.global->seen_head = c.seen_head;
}

/*
 * Sender credit, by one thread: spin until slot `c->step` is free (the
 * receiver drained step - BRAID_STEPS). False when the communicator aborted.
 */
__device__ __forceinline__ bool conn_wait_credit(conn_end* c, volatile uint32_t* abort_flag) {
  int spins = 0;
  while (c->seen_head + BRAID_STEPS < c->step + 1) {
    c->seen_head = ld_acquire_sys(c->head);
    if (c->seen_head + BRAID_STEPS >= c->step + 1) break;
    if (++spins == BRAID_ABORT_CHECK_SPINS) {
      spins = 0;
      if (*abort_flag) return false;
    }
  }
  return true;
}

/*
 * Receiver, by one thread: spin until the sender has filled `step` (its
 * tail passed it). False when the communicator aborted.
 */
__device__ __forceinline__ bool conn_wait_tail(const uint64_t* tail, uint64_t step,
                                               volatile uint32_t* abort_flag) {
  int spins = 0;
  while (ld_acquire_sys(tail) < step + 1) {
    if (++spins == BRAID_ABORT_CHECK_SPINS) {
      spins = 0;
      if (*abort_flag) return false;
    }
  }
  return true;
}

}  // namespace braid

#endif
