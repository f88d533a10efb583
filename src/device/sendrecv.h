/*
 * Send/receive. A work pairs at most one send and one receive; the block
 * splits in two halves that run them at the same time (each half with its
 * own named barrier), so a rank that sends to X while receiving from Y never
 * waits on itself; only in place (one peer's send and receive over the same
 * bytes) does the receive half wait for the send half, never the other way
 * (sendrecv_half). Data is split across the work's channels the same way on
 * both sides: by the byte count, which matching calls agree on.
 */
#ifndef BRAID_DEVICE_SENDRECV_H
#define BRAID_DEVICE_SENDRECV_H

#include "device/ring.h"

namespace braid {

/* Barrier ids: 1 = whole block, 2 = send half, 3 = receive half. */
#define BRAID_BARRIER_BLOCK 1
#define BRAID_BARRIER_SEND 2
#define BRAID_BARRIER_RECV 3

/*
 * One half's share [r.begin, r.begin + r.count) of the bytes, in steps of `chunk`.
 * In place (`sent` not null: the send and the receive of one peer over the same bytes, as an
 * in-place all-to-all has them), the send half publishes in *sent how many bytes of its share
 * it has read, once every thread of the half is past them, and the receive half writes no byte
 * before it has been read: its thread 0 waits, and the others wait for thread 0 (Simple: at
 * the step's opening barrier; LL, whose threads read their lines on their own: at one more,
 * `ll`). The send half never waits on the receive half of its own block, only on the peer's,
 * whose wait points at an earlier step of this rank's send, so the two ranks of a pair cannot
 * wait on each other in a circle. The wait ends early when the send half gave up (abort); the
 * receive then fails on the communicator's abort flag as well.
 */
template <typename P>
__device__ __forceinline__ void sendrecv_half(P& p, const struct braid_work& w, bool sender,
                                              elem_range r, int64_t chunk, bool ll,
                                              volatile long long* sent, volatile int* aborted) {
  for (int64_t off = 0; off < r.count; off += chunk) {
    int64_t len = r.count - off < chunk ? r.count - off : chunk;
    if (sent && !sender) {
      if (p.tid == 0)
        while (*sent < off + len && !aborted[0]) {
        }
      if (ll) p.barrier();
    }
    bool ok = sender ? p.send_from((const uint8_t*)w.sendbuff + r.begin + off, len)
                     : p.recv_to((uint8_t*)w.recvbuff + r.begin + off, len);
    if (!ok) return;
    if (sent && sender) {
      /* Simple's step ends at a barrier of the half; LL's does not. */
      if (ll) p.barrier();
      if (p.tid == 0) *sent = off + len;
    }
  }
  p.save();
}

static __device__ __noinline__ void sendrecv_run(const struct braid_work& w, struct braid_dev_comm* comm,
                                          struct braid_dev_channel* chan, int ch,
                                          volatile int* aborted) {
  typedef uint8_t T;
  typedef op_copy<T> Op;
  if (w.peer_send == comm->rank) {
    /* Self-exchange (a send and a receive of the same size): the whole block copies. */
    if (w.recvbuff == w.sendbuff || ch >= w.nch_send) return;
    elem_range r = channel_range<T>((int64_t)w.count, w.nch_send, ch);
    reduce_copy<BRAID_UNROLL, T, Op, 1, 1, false, false>(threadIdx.x, blockDim.x, Op(),
                                                         (const T*)w.sendbuff + r.begin, nullptr,
                                                         (T*)w.recvbuff + r.begin, nullptr, r.count);
    return;
  }
  __shared__ volatile long long sent; /* in place: bytes the send half has read */
  const bool in_place = w.peer_send == w.peer_recv && w.sendbuff == w.recvbuff &&
                        w.count == w.recv_count && w.nch_send == w.nch_recv;
  if (in_place) {
    if (threadIdx.x == 0) sent = 0;
    __syncthreads();
  }
  const int half = blockDim.x / 2;
  const bool sender = threadIdx.x < half;
  const int tid = sender ? threadIdx.x : threadIdx.x - half;
  const int peer = sender ? w.peer_send : w.peer_recv;
  const int nch = sender ? w.nch_send : w.nch_recv;
  if (peer < 0 || ch >= nch) return;
  const int64_t bytes = sender ? (int64_t)w.count : (int64_t)w.recv_count;
  /* The receive half uses the second abort flag so the halves never race on one. */
  volatile int* my_abort = aborted + (sender ? 0 : 1);

  struct braid_dev_conn* conn = sender ? &chan->p2p_send[peer] : &chan->p2p_recv[peer];
  elem_range r = channel_range<T>(bytes, nch, ch);
  const int barrier = sender ? BRAID_BARRIER_SEND : BRAID_BARRIER_RECV;
  struct braid_dev_conn* rc = sender ? nullptr : conn;
  struct braid_dev_conn* sc = sender ? conn : nullptr;
  if (w.flags & (sender ? BRAID_WORK_SEND_LL : BRAID_WORK_RECV_LL)) {
    prims_ll<T, Op> p(tid, half, barrier, Op(), rc, sc, comm->abort_flag, my_abort);
    sendrecv_half(p, w, sender, r, conn->ll_slot_bytes / 2, true, in_place ? &sent : nullptr,
                  aborted);
  } else {
    prims_simple<T, Op> p(tid, half, barrier, Op(), rc, sc, comm->abort_flag, my_abort);
    sendrecv_half(p, w, sender, r, conn->slot_bytes, false, in_place ? &sent : nullptr, aborted);
  }
}

}  // namespace braid

#endif
