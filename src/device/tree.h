/*
 * Tree all-reduce: each chunk is reduced up the channel's tree (a chain
 * inside a host, a double binary tree across hosts: graph/search_tree.c)
 * and the result broadcast back down. The tree's edges are the channel's
 * send/recv connections to the parent and the children.
 *
 * Per chunk, in this order on every rank:
 *   up:   a leaf sends pre(own) to its parent; a node with k children
 *         receives from child 1 and combines with pre(own) into recvbuff,
 *         then from each further child combines into recvbuff, and the last
 *         combination goes to the parent instead (the root keeps it and
 *         applies post, e.g. the division of ncclAvg);
 *   down: the root sends the result to each child; any other node receives
 *         it from its parent into recvbuff and passes it to each child.
 * A rank waits only on its children going up and on its parent coming
 * down, so the chunks cannot deadlock; up and down do not overlap within a
 * rank (a latency algorithm: the model picks it for small sizes across
 * hosts).
 */
#ifndef BRAID_DEVICE_TREE_H
#define BRAID_DEVICE_TREE_H

#include "device/sendrecv.h"

namespace braid {

/*
 * One combination of the up phase on `p` (which receives from a child):
 * with this rank's own input (`own`, through pre) or with the partial
 * result already in `out`; the last child's goes to the parent, or at the
 * root into `out` through post.
 */
template <typename T, typename Op, typename PT>
__device__ __forceinline__ bool tree_combine(PT& p, bool own, bool last, bool to_parent,
                                             const T* in, T* out, int64_t n) {
  if (last && to_parent)
    return own ? p.template recv_combine_send<Op::has_pre>(in, n)
               : p.template recv_combine_send<false>(out, n);
  if (last)
    return own ? p.template recv_combine_to<Op::has_pre, Op::has_post>(in, out, n)
               : p.template recv_combine_to<false, Op::has_post>(out, out, n);
  return own ? p.template recv_combine_to<Op::has_pre, false>(in, out, n)
             : p.template recv_combine_to<false, false>(out, out, n);
}

template <typename T, typename Op, template <typename, typename> class P>
__device__ void tree_allreduce(const Op& op, const struct braid_work& w,
                               struct braid_dev_comm* comm, struct braid_dev_channel* chan, int ch,
                               volatile int* aborted) {
  elem_range r = channel_range<T>(w.count, w.nchannels, ch);
  const T* in = (const T*)w.sendbuff + r.begin;
  T* out = (T*)w.recvbuff + r.begin;
  const int up = chan->tree_up;
  const bool has_up = up >= 0;
  int c0 = -1, c1 = -1, c2 = -1, k = 0; /* the children, packed */
  for (int i = 0; i < 3; i++) {
    const int d = chan->tree_down[i];
    if (d < 0) continue;
    if (k == 0) c0 = d;
    else if (k == 1) c1 = d;
    else c2 = d;
    k++;
  }
  struct braid_dev_conn* to_parent = has_up ? &chan->p2p_send[up] : nullptr;
  struct braid_dev_conn* from_parent = has_up ? &chan->p2p_recv[up] : nullptr;
  struct braid_dev_conn* from_child[3] = {k > 0 ? &chan->p2p_recv[c0] : nullptr,
                                          k > 1 ? &chan->p2p_recv[c1] : nullptr,
                                          k > 2 ? &chan->p2p_recv[c2] : nullptr};
  struct braid_dev_conn* to_child[3] = {k > 0 ? &chan->p2p_send[c0] : nullptr,
                                        k > 1 ? &chan->p2p_send[c1] : nullptr,
                                        k > 2 ? &chan->p2p_send[c2] : nullptr};
  /*
   * One step on a connection pair: one set of primitives is pointed at the
   * pair, steps, and saves. A node has up to six connections; primitives for
   * all of them at once took over 1 KiB of local memory per thread (the ring
   * kernels take under 200 B), and such kernels failed under CUDA MPS. The
   * save is thread 0's; the barrier makes it visible before the next bind.
   */
  P<T, Op> p(threadIdx.x, blockDim.x, BRAID_BARRIER_BLOCK, op, nullptr, nullptr,
             comm->abort_flag, aborted);
#define TREE_STEP(recv_conn, send_conn, call) \
  do {                                        \
    p.bind(recv_conn, send_conn);             \
    if (!(call)) return;                      \
    p.save();                                 \
    __syncthreads();                          \
  } while (0)
  const int64_t chunk = chunk_elems<T>(w.chunk_bytes);
  for (int64_t off = 0; off < r.count; off += chunk) {
    const int64_t len = r.count - off < chunk ? r.count - off : chunk;
    /* Up: a leaf sends its input; otherwise one combination per child, the last one upwards. */
    if (k == 0 && has_up) TREE_STEP(nullptr, to_parent, p.send_from(in + off, len));
    for (int i = 0; i < k; i++) {
      const bool last = i == k - 1;
      TREE_STEP(from_child[i], last ? to_parent : nullptr,
                (tree_combine<T, Op>(p, i == 0, last, has_up, in + off, out + off, len)));
    }
    /* Down: from the parent (or, at the root, the result) to each child. */
    if (has_up && k > 0)
      TREE_STEP(from_parent, to_child[0], p.recv_copy_send(out + off, len));
    else if (has_up)
      TREE_STEP(from_parent, nullptr, p.recv_to(out + off, len));
    else if (k > 0)
      TREE_STEP(nullptr, to_child[0], p.send_copy(out + off, len));
    for (int i = 1; i < k; i++) TREE_STEP(nullptr, to_child[i], p.send_copy(out + off, len));
  }
#undef TREE_STEP
}

}  // namespace braid

#endif
