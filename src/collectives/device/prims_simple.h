/*
 * The Simple protocol: data goes into a FIFO slot with ordinary stores, then
 * a fence, then the tail counter says the slot is full. Best at large sizes.
 *
 * A group of threads (the whole block, or half of it for send/recv) runs the
 * primitives together. One thread of the group waits on the counters and
 * posts them; a named barrier hands the go-ahead to the others. Each
 * primitive moves one pipeline step: at most one slot received from the
 * previous rank and at most one slot sent to the next.
 *
 * Memory ordering: the sender's threads store into the peer's slot; the
 * barrier orders those stores before the posting thread's system-scope
 * release of `tail`, which is cumulative, so a receiver that acquires `tail`
 * sees the data. Symmetrically the receiver releases `head` after its reads,
 * and the sender acquires it before overwriting the slot.
 *
 * Abort: every wait loop polls the communicator's host-mapped abort flag; on
 * abort the group leaves the collective and the kernel ends.
 */
#ifndef BRAID_DEVICE_PRIMS_SIMPLE_H
#define BRAID_DEVICE_PRIMS_SIMPLE_H

#include "collectives/device/prims_common.h"

namespace braid {

/* A group of threads running Simple-protocol steps over up to one recv and one send connection. */
template <typename T, typename Op>
struct prims_simple {
  typedef Op op_type;
  int tid;          /* index within the group */
  int nthreads;     /* threads in the group */
  int barrier_id;   /* named barrier of the group (1..15) */
  Op op;
  conn_end recv, send;
  bool has_recv, has_send;
  volatile uint32_t* abort_flag;
  volatile int* aborted; /* shared-memory flag of the group */

  __device__ prims_simple(int tid_, int nthreads_, int barrier_, const Op& op_,
                          struct braid_dev_conn* recv_conn, struct braid_dev_conn* send_conn,
                          volatile uint32_t* abort_, volatile int* aborted_)
      : tid(tid_), nthreads(nthreads_), barrier_id(barrier_), op(op_),
        has_recv(recv_conn != nullptr), has_send(send_conn != nullptr), abort_flag(abort_),
        aborted(aborted_) {
    if (has_recv) conn_end_load(&recv, recv_conn);
    if (has_send) conn_end_load(&send, send_conn);
  }

  __device__ __forceinline__ void barrier() { group_barrier(barrier_id, nthreads); }

  /* Thread 0 of the group: spin until the needed slots are ready or the comm aborts. */
  __device__ bool wait_ready(bool need_recv, bool need_send) {
    if (need_recv && !conn_wait_tail(recv.tail, recv.step, abort_flag)) return false;
    if (need_send && !conn_wait_credit(&send, abort_flag)) return false;
    return true;
  }

  /*
   * One pipeline step. Sources: the received slot (if RECV) then `src`;
   * destinations: `dst` (if given) then the send slot (if SEND).
   * Returns false when the communicator aborted.
   */
  template <bool RECV, bool SEND, bool PRE, bool POST>
  __device__ bool step(const T* src, T* dst, int64_t nelem) {
    if (tid == 0) {
      bool ok = wait_ready(RECV, SEND);
      if (!ok) *aborted = 1;
    }
    barrier();
    if (*aborted) return false;
    const T* rslot = RECV ? conn_slot<T>(recv) : nullptr;
    T* sslot = SEND ? conn_slot<T>(send) : nullptr;
    if (nelem > 0) {
      if (RECV && src != nullptr) {
        /* combine(received, own input) -> dst and/or the send slot */
        if (dst && SEND)
          reduce_copy<BRAID_UNROLL, T, Op, 2, 2, PRE, POST>(tid, nthreads, op, rslot, src, dst, sslot, nelem);
        else if (dst)
          reduce_copy<BRAID_UNROLL, T, Op, 2, 1, PRE, POST>(tid, nthreads, op, rslot, src, dst, nullptr, nelem);
        else
          reduce_copy<BRAID_UNROLL, T, Op, 2, 1, PRE, POST>(tid, nthreads, op, rslot, src, sslot, nullptr, nelem);
      } else {
        const T* s = RECV ? rslot : src;
        if (dst && SEND)
          reduce_copy<BRAID_UNROLL, T, Op, 1, 2, PRE, POST>(tid, nthreads, op, s, nullptr, dst, sslot, nelem);
        else if (dst)
          reduce_copy<BRAID_UNROLL, T, Op, 1, 1, PRE, POST>(tid, nthreads, op, s, nullptr, dst, nullptr, nelem);
        else
          reduce_copy<BRAID_UNROLL, T, Op, 1, 1, PRE, POST>(tid, nthreads, op, s, nullptr, sslot, nullptr, nelem);
      }
    }
    barrier();
    if (tid == 0) {
      /* The size first: the release of `tail` publishes it along with the data. */
      if (SEND && send.sizes)
        *(volatile uint32_t*)&send.sizes[send.step % BRAID_STEPS] = (uint32_t)(nelem * (int64_t)sizeof(T));
      if (SEND) st_release_sys(send.tail, send.step + 1);
      if (RECV) st_release_sys(recv.head, recv.step + 1);
    }
    if (SEND) send.step++;
    if (RECV) recv.step++;
    return true;
  }

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

  /* The named primitives of the ring algorithms. */
  __device__ bool send_from(const T* src, int64_t n) { return step<false, true, Op::has_pre, false>(src, nullptr, n); }
  __device__ bool copy_send(const T* src, T* dst, int64_t n) { return step<false, true, false, false>(src, dst, n); }
  __device__ bool recv_to(T* dst, int64_t n) { return step<true, false, false, false>(nullptr, dst, n); }
  __device__ bool recv_copy_send(T* dst, int64_t n) { return step<true, true, false, false>(nullptr, dst, n); }
  __device__ bool recv_reduce_send(const T* src, int64_t n) { return step<true, true, Op::has_pre, false>(src, nullptr, n); }
  __device__ bool recv_reduce_copy(const T* src, T* dst, int64_t n) { return step<true, false, Op::has_pre, Op::has_post>(src, dst, n); }
  __device__ bool recv_reduce_copy_send(const T* src, T* dst, int64_t n) { return step<true, true, Op::has_pre, Op::has_post>(src, dst, n); }

  /* For trees, where a partial result is combined again: pre/post chosen by the caller. */
  __device__ bool send_copy(const T* src, int64_t n) { return step<false, true, false, false>(src, nullptr, n); }
  template <bool PRE, bool POST>
  __device__ bool recv_combine_to(const T* src, T* dst, int64_t n) { return step<true, false, PRE, POST>(src, dst, n); }
  template <bool PRE>
  __device__ bool recv_combine_send(const T* src, int64_t n) { return step<true, true, PRE, false>(src, nullptr, n); }
};

}  // namespace braid

#endif
