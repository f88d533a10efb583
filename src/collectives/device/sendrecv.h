/*
 * Send/receive. A work pairs at most one send and one receive; the block
 * splits in two halves that run them at the same time (each half with its
 * own named barrier), so a rank that sends to X while receiving from Y never
 * waits on itself. Data is split across the work's channels the same way on
 * both sides: by the byte count, which matching calls agree on.
 */
#ifndef BRAID_DEVICE_SENDRECV_H
#define BRAID_DEVICE_SENDRECV_H

#include "collectives/device/ring.h"

namespace braid {

/* Barrier ids: 1 = whole block, 2 = send half, 3 = receive half. */
#define BRAID_BARRIER_BLOCK 1
#define BRAID_BARRIER_SEND 2
#define BRAID_BARRIER_RECV 3

static __device__ __noinline__ void sendrecv_run(const struct braid_work& w, struct braid_dev_comm* comm,
                                          struct braid_dev_channel* chan, int ch,
                                          volatile int* aborted) {
  typedef uint8_t T;
  typedef op_copy<T> Op;
  const int half = blockDim.x / 2;
  const bool sender = threadIdx.x < half;
  const int tid = sender ? threadIdx.x : threadIdx.x - half;
  const int peer = sender ? w.peer_send : w.peer_recv;
  const int nch = sender ? w.nch_send : w.nch_recv;
  if (peer < 0 || ch >= nch) return;
  const int64_t bytes = sender ? (int64_t)w.count : (int64_t)w.recv_count;
  /* The receive half uses the second abort flag so the halves never race on one. */
  volatile int* my_abort = aborted + (sender ? 0 : 1);

  if (peer == comm->rank) {
    /* Self-exchange: the send half copies; the receive half has nothing to do. */
    if (!sender || w.recvbuff == w.sendbuff) return;
    elem_range r = channel_range<T>(bytes, nch, ch);
    reduce_copy<BRAID_UNROLL, T, Op, 1, 1, false, false>(tid, half, Op(), (const T*)w.sendbuff + r.begin,
                                                         nullptr, (T*)w.recvbuff + r.begin, nullptr,
                                                         r.count);
    return;
  }
  struct braid_dev_conn* conn = sender ? &chan->p2p_send[peer] : &chan->p2p_recv[peer];
  prims_simple<T, Op> p(tid, half, sender ? BRAID_BARRIER_SEND : BRAID_BARRIER_RECV, Op(),
                        sender ? nullptr : conn, sender ? conn : nullptr, comm->abort_flag, my_abort);
  elem_range r = channel_range<T>(bytes, nch, ch);
  const int64_t chunk = conn->slot_bytes;
  for (int64_t off = 0; off < r.count; off += chunk) {
    int64_t len = r.count - off < chunk ? r.count - off : chunk;
    bool ok = sender ? p.send_from((const T*)w.sendbuff + r.begin + off, len)
                     : p.recv_to((T*)w.recvbuff + r.begin + off, len);
    if (!ok) return;
  }
  p.save();
}

}  // namespace braid

#endif
