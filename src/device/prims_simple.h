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
 *
 * With a post warp (the connection's post_warp, BRAID_SIMPLE_POST_WARP: by default
 * send/recv over P2P; groups of 128 threads or more) the group's last warp only
 * posts: the other threads wait on a barrier of their own (barrier id + 4) before
 * moving data, so they start the next step while the post warp's release waits
 * for the step's stores to reach the peer. The release stays after the barrier
 * that closes the step, so the ordering argument above holds. It is this rank's
 * choice alone: the peer sees the same counters either way.
 */
#ifndef BRAID_DEVICE_PRIMS_SIMPLE_H
#define BRAID_DEVICE_PRIMS_SIMPLE_H

#include "device/prims_common.h"

namespace braid {

/* A group of threads running Simple-protocol steps over up to one recv and one send connection. */
template <typename T, typename Op>
struct prims_simple : prims_base<T, Op>, prims_named<prims_simple<T, Op>, T, Op> {
  BRAID_PRIMS_BASE(T, Op);

  /* Thread 0 of the group: spin until the needed slots are ready or the comm aborts. */
  __device__ bool wait_ready(bool need_recv, bool need_send) {
    if (need_recv && !conn_wait_tail(recv.tail, recv.step, abort_flag)) return false;
    if (need_send && !conn_wait_credit(&send, abort_flag)) return false;
    return true;
  }

  /* Whether the group's last warp posts (a group's connections carry the same flag). */
  __device__ __forceinline__ bool split() const {
    return nthreads >= 128 &&
           ((this->has_recv && recv.post_warp) || (this->has_send && send.post_warp));
  }

  /*
   * One pipeline step. Sources: the received slot (if RECV) then `src` (if
   * SRC); destinations: `dst` (if DST) then the send slot (if SEND).
   * Returns false when the communicator aborted.
   */
  template <bool RECV, bool SEND, bool SRC, bool DST, bool PRE, bool POST>
  __device__ __forceinline__ bool step(const T* src, T* dst, int64_t nelem) {
    if constexpr (steps_inline<T, Op>::value)
      return step_body<RECV, SEND, SRC, DST, PRE, POST>(src, dst, nelem);
    else
      return step_outline<RECV, SEND, SRC, DST, PRE, POST>(src, dst, nelem);
  }

  /* The step of the operators whose steps are out of line (reduce_ops.h, steps_inline). */
  template <bool RECV, bool SEND, bool SRC, bool DST, bool PRE, bool POST>
  __device__ __noinline__ bool step_outline(const T* src, T* dst, int64_t nelem) {
    return step_body<RECV, SEND, SRC, DST, PRE, POST>(src, dst, nelem);
  }

  /*
   * The members the copy loop reads are copied to locals first: out of line, a store through
   * `dst` or the send slot could otherwise make the compiler read them again from the object.
   */
  template <bool RECV, bool SEND, bool SRC, bool DST, bool PRE, bool POST>
  __device__ __forceinline__ bool step_body(const T* src, T* dst, int64_t nelem) {
    const Op op = this->op;
    const int tid = this->tid, nthreads = this->nthreads;
    const bool post_warp = split();
    const int nworkers = post_warp ? nthreads - 32 : nthreads;
    if (tid == 0) {
      bool ok = wait_ready(RECV, SEND);
      if (!ok) *aborted = 1;
    }
    if (!post_warp) {
      barrier();
      if (*aborted) return false;
    } else if (tid < nworkers) {
      group_barrier(this->barrier_id + 4, nworkers);
    }
    const T* rslot = RECV ? conn_slot<T>(recv) : nullptr;
    T* sslot = SEND ? conn_slot<T>(send) : nullptr;
    if (nelem > 0 && tid < nworkers && !*aborted) {
      if (RECV && SRC) {
        /* combine(received, own input) -> dst and/or the send slot */
        if (DST && SEND)
          reduce_copy<BRAID_UNROLL, T, Op, 2, 2, PRE, POST>(tid, nworkers, op, rslot, src, dst, sslot, nelem);
        else if (DST)
          reduce_copy<BRAID_UNROLL, T, Op, 2, 1, PRE, POST>(tid, nworkers, op, rslot, src, dst, nullptr, nelem);
        else
          reduce_copy<BRAID_UNROLL, T, Op, 2, 1, PRE, POST>(tid, nworkers, op, rslot, src, sslot, nullptr, nelem);
      } else {
        const T* s = RECV ? rslot : src;
        if (DST && SEND)
          reduce_copy<BRAID_UNROLL, T, Op, 1, 2, PRE, POST>(tid, nworkers, op, s, nullptr, dst, sslot, nelem);
        else if (DST)
          reduce_copy<BRAID_UNROLL, T, Op, 1, 1, PRE, POST>(tid, nworkers, op, s, nullptr, dst, nullptr, nelem);
        else
          reduce_copy<BRAID_UNROLL, T, Op, 1, 1, PRE, POST>(tid, nworkers, op, s, nullptr, sslot, nullptr, nelem);
      }
    }
    barrier();
    if (post_warp && *aborted) return false;
    if (tid == (post_warp ? nworkers : 0)) {
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
};

}  // namespace braid

#endif
