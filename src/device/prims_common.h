/*
 * What every protocol's primitives share: one end of a connection as a
 * running group of threads sees it (loaded from the braid_dev_conn the host
 * set up, saved back after the last step so the next kernel continues the
 * step count), the system-scope counter accesses, named barriers, the state
 * of a group (prims_base) and the named primitives the algorithms call
 * (prims_named), which every protocol maps onto its own step().
 */
#ifndef BRAID_DEVICE_PRIMS_COMMON_H
#define BRAID_DEVICE_PRIMS_COMMON_H

#include "device/reduce_copy.h"

namespace braid {

#define BRAID_UNROLL 4
#define BRAID_ABORT_CHECK_SPINS 1024
/*
 * The FIFO waits below poll a word in the peer's or the host's memory, ~0.5-2 us a read: 1024
 * of them before each look at the abort flag held every queued kernel of an aborted comm for
 * ~1 ms, so an abort behind many queued kernels took a large part of a second. A wait of 64
 * polls is a stalled peer anyway. (A look by SM clock instead, clock64() on every poll, cost
 * the kernels 10-37% of their bandwidth from 16 MB, for a reason not found: ptxas showed no
 * more spills for it.) See docs/tuning.md, Abort check interval.
 */
#define BRAID_FIFO_ABORT_CHECK_SPINS 64

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
  uint32_t ll128_slot_bytes;
  char* ll128_buff;
  bool post_warp;
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
  c->ll128_buff = g->ll128_buff;
  c->ll128_slot_bytes = g->ll128_slot_bytes;
  c->post_warp = g->post_warp != 0;
}

/* The slot of step `step` in one protocol's buffer of a connection. */
__device__ __forceinline__ char* slot_at(char* buff, uint32_t slot_bytes, uint64_t step) {
  return buff + (size_t)(step % BRAID_STEPS) * slot_bytes;
}

template <typename T>
__device__ __forceinline__ T* conn_slot(const conn_end& c) {
  return (T*)slot_at(c.buff, c.slot_bytes, c.step);
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
    if (++spins == BRAID_FIFO_ABORT_CHECK_SPINS) {
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
    if (++spins == BRAID_FIFO_ABORT_CHECK_SPINS) {
      spins = 0;
      if (*abort_flag) return false;
    }
  }
  return true;
}

/*
 * A group of threads running one protocol's steps over up to one receive
 * and one send connection: what every protocol keeps.
 */
template <typename T, typename Op>
struct prims_base {
  typedef Op op_type;
  int tid;        /* index within the group */
  int nthreads;   /* threads in the group */
  int barrier_id; /* named barrier of the group (1..15) */
  Op op;
  conn_end recv, send;
  bool has_recv, has_send;
  volatile uint32_t* abort_flag;
  volatile int* aborted; /* shared-memory flag of the group */

  __device__ prims_base(int tid_, int nthreads_, int barrier_, const Op& op_,
                        struct braid_dev_conn* recv_conn, struct braid_dev_conn* send_conn,
                        volatile uint32_t* abort_, volatile int* aborted_)
      : tid(tid_), nthreads(nthreads_), barrier_id(barrier_), op(op_), abort_flag(abort_),
        aborted(aborted_) {
    bind(recv_conn, send_conn);
  }

  __device__ __forceinline__ void barrier() { group_barrier(barrier_id, nthreads); }

  /* Points the primitives at other connections (after save() of the previous ones). */
  __device__ void bind(struct braid_dev_conn* recv_conn, struct braid_dev_conn* send_conn) {
    has_recv = recv_conn != nullptr;
    has_send = send_conn != nullptr;
    if (has_recv) conn_end_load(&recv, recv_conn);
    if (has_send) conn_end_load(&send, send_conn);
  }

  /* Saves the steps for the next kernel. Call once, after the last step. */
  __device__ void save() {
    if (tid != 0) return;
    if (has_recv) conn_end_save(recv, false);
    if (has_send) conn_end_save(send, true);
  }

  /* Flag protocols (LL, LL128), before writing the send slot: one thread waits for credit. */
  __device__ __forceinline__ bool begin_send() {
    if (tid == 0 && !conn_wait_credit(&send, abort_flag)) *aborted = 1;
    barrier();
    return !*aborted;
  }

  /*
   * Flag protocols, after reading the receive slot: every thread is done with it, so free it.
   * A relaxed store: every line's value was loaded and used before the barrier, so no later
   * write of the sender's can reach it, and nothing else needs publishing (the data travels
   * with its flags). A release would wait for this thread's own stores of the step (lines
   * sent on over the link) to land first, on every step.
   */
  __device__ __forceinline__ bool end_recv(bool ok) {
    if (!ok) *aborted = 1;
    barrier();
    if (*aborted) return false;
    if (tid == 0) st_relaxed_sys(recv.head, recv.step + 1);
    return true;
  }
};

/* prims_base's members by name inside a protocol's struct (a dependent base hides them). */
#define BRAID_PRIMS_BASE(T, Op)       \
  typedef prims_base<T, Op> base;     \
  using base::base;                   \
  using base::tid;                    \
  using base::nthreads;               \
  using base::op;                     \
  using base::recv;                   \
  using base::send;                   \
  using base::abort_flag;             \
  using base::aborted;                \
  using base::barrier;                \
  using base::begin_send;             \
  using base::end_recv

/*
 * The named primitives of the algorithms, for protocol P whose
 * step<RECV, SEND, SRC, DST, PRE, POST>(src, dst, n) moves one pipeline
 * step: value = [received] combined with [pre(src)], then post() if POST,
 * to dst and/or the send slot.
 */
template <class P, typename T, typename Op>
struct prims_named {
  __device__ __forceinline__ P& self() { return *static_cast<P*>(this); }

  /* The ring algorithms'. */
  __device__ bool send_from(const T* src, int64_t n) {
    return self().template step<false, true, true, false, Op::has_pre, false>(src, nullptr, n);
  }
  __device__ bool copy_send(const T* src, T* dst, int64_t n) {
    return self().template step<false, true, true, true, false, false>(src, dst, n);
  }
  __device__ bool recv_to(T* dst, int64_t n) {
    return self().template step<true, false, false, true, false, false>(nullptr, dst, n);
  }
  __device__ bool recv_copy_send(T* dst, int64_t n) {
    return self().template step<true, true, false, true, false, false>(nullptr, dst, n);
  }
  __device__ bool recv_reduce_send(const T* src, int64_t n) {
    return self().template step<true, true, true, false, Op::has_pre, false>(src, nullptr, n);
  }
  __device__ bool recv_reduce_copy(const T* src, T* dst, int64_t n) {
    return self().template step<true, false, true, true, Op::has_pre, Op::has_post>(src, dst, n);
  }
  __device__ bool recv_reduce_copy_send(const T* src, T* dst, int64_t n) {
    return self().template step<true, true, true, true, Op::has_pre, Op::has_post>(src, dst, n);
  }

  /* For trees, where a partial result is combined again: pre/post chosen by the caller. */
  __device__ bool send_copy(const T* src, int64_t n) {
    return self().template step<false, true, true, false, false, false>(src, nullptr, n);
  }
  template <bool PRE, bool POST>
  __device__ bool recv_combine_to(const T* src, T* dst, int64_t n) {
    return self().template step<true, false, true, true, PRE, POST>(src, dst, n);
  }
  template <bool PRE>
  __device__ bool recv_combine_send(const T* src, int64_t n) {
    return self().template step<true, true, true, false, PRE, false>(src, nullptr, n);
  }
};

}  // namespace braid

#endif
