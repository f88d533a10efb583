/*
 * The IB backend's data path (protocol in net_ib.h): memory registration,
 * clear-to-send entries, RDMA write with immediate, the flush for GPUDirect
 * RDMA receives, completion polling and the liveness check.
 */
#ifdef BRAID_HAVE_IBVERBS

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/debug.h"
#include "base/error.h"
#include "base/utils.h"
#include "transport/net_ib_verbs.h"

#define IB_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)
#define IB_LIVENESS_SEC 0.1

/* ------------------------------------------------------------ registration */

/* A receiver with GPU buffers flushes with an RDMA read through a queue pair connected to itself. */
static ncclResult_t ib_flush_setup(struct ib_comm* c) {
  ncclResult_t res = ncclSuccess;
  struct ib_dev* d = ib_dev_get(c->dev);
  struct ib_qp_info self;
  if (c->is_send || c->flush_qp) return ncclSuccess;
  c->scratch = aligned_alloc(64, 64);
  BRAID_CHECK(c->scratch != NULL, ncclSystemError, "net IB: out of memory for a flush buffer");
  c->scratch_mr = ibv_fn.reg_mr(d->pd, c->scratch, 64, IBV_ACCESS_LOCAL_WRITE);
  BRAID_CHECK(c->scratch_mr != NULL, ncclSystemError, "net IB: registering a flush buffer on %s failed: %s",
              d->name, strerror(errno));
  BRAID_TRY(ib_qp_create(c, &c->flush_qp));
  ib_qp_info_fill(c, &c->flush_qp, 1, &self);
  BRAID_TRY(ib_qp_connect(c, c->flush_qp, &self, self.qpn[0]));
  return ncclSuccess;
fail:
  return res;
}

static ncclResult_t ib_reg_failed(struct ib_comm* c, size_t size, int err, const char* what) {
  char advice[512];
  if (err == ENOMEM || err == EPERM || err == EAGAIN) {
    ib_memlock_advice(size, err, advice, sizeof advice);
  } else {
    snprintf(advice, sizeof advice, "registering %zu bytes failed: %s", size, strerror(err));
  }
  return braid_err(ncclSystemError, "net IB: %s on %s: %s", what, ib_dev_get(c->dev)->name, advice);
}

/* The access of a data registration: relaxed ordering where BRAID_IB_PCI_RELAXED_ORDERING allows. */
static int ib_data_access(void) {
  return IB_ACCESS | (ib_relaxed_ordering() ? IBV_ACCESS_RELAXED_ORDERING : 0);
}

ncclResult_t ib_reg_mr(void* comm, void* data, size_t size, int is_cuda, void** mhandle) {
  struct ib_comm* c = comm;
  struct ib_dev* d = ib_dev_get(c->dev);
  *mhandle = NULL;
  if (is_cuda && !(d->ptr_support & BRAID_NET_PTR_CUDA))
    return braid_err(ncclInvalidUsage, "net IB: %s cannot register GPU memory without nvidia-peermem "
                     "(modprobe nvidia_peermem) or dma-buf", d->name);
  const int access = ib_data_access();
  struct ibv_mr* mr = (access & IBV_ACCESS_RELAXED_ORDERING)
                          ? ibv_fn.reg_mr_iova2(d->pd, data, size, (uint64_t)(uintptr_t)data, (unsigned)access)
                          : ibv_fn.reg_mr(d->pd, data, size, access);
  if (mr == NULL) return ib_reg_failed(c, size, errno, is_cuda ? "GPU memory (peer memory)" : "host memory");
  *mhandle = mr;
  return is_cuda ? ib_flush_setup(c) : ncclSuccess;
}

ncclResult_t ib_reg_mr_dmabuf(void* comm, void* data, size_t size, uint64_t offset, int fd,
                              void** mhandle) {
  struct ib_comm* c = comm;
  *mhandle = NULL;
  if (ibv_fn.reg_dmabuf_mr == NULL)
    return braid_err(ncclInvalidUsage, "net IB: this rdma-core has no ibv_reg_dmabuf_mr (version 34 "
                     "or later needed for GPUDirect RDMA through dma-buf)");
  struct ibv_mr* mr = ibv_fn.reg_dmabuf_mr(ib_dev_get(c->dev)->pd, offset, size, (uint64_t)(uintptr_t)data,
                                           fd, ib_data_access());
  if (mr == NULL) return ib_reg_failed(c, size, errno, "GPU memory (dma-buf)");
  *mhandle = mr;
  return ib_flush_setup(c);
}

ncclResult_t ib_dereg_mr(void* comm, void* mhandle) {
  if (mhandle) ibv_fn.dereg_mr(mhandle);
  return ncclSuccess;
}

/* -------------------------------------------------------------- progress */

static ncclResult_t ib_wc_failed(struct ib_comm* c, const struct ibv_wc* wc) {
  const char* hint = wc->status == IBV_WC_RETRY_EXC_ERR ? " (the peer stopped answering: it died, or "
                                                          "the link or its GID/route is wrong)"
                   : wc->status == IBV_WC_REM_ACCESS_ERR ? " (the peer's buffer registration is gone)"
                   : wc->status == IBV_WC_LOC_PROT_ERR ? " (a buffer was not registered)"
                   : wc->status == IBV_WC_WR_FLUSH_ERR ? " (the queue pair is in the error state: an "
                                                         "earlier work request failed, here or at the peer)"
                   : "";
  c->failed = braid_err(wc->status == IBV_WC_RETRY_EXC_ERR ? ncclRemoteError : ncclSystemError,
                        "net IB: a work request with %s on %s failed: %s (%d)%s", c->peer,
                        ib_dev_get(c->dev)->name, ibv_fn.wc_status_str(wc->status), wc->status, hint);
  return c->failed;
}

/* The index of the comm's queue pair numbered `qpn`, or -1. */
static int ib_qp_index(const struct ib_comm* c, uint32_t qpn) {
  for (int q = 0; q < c->nqps; q++)
    if (c->qps[q]->qp_num == qpn) return q;
  return -1;
}

/*
 * An immediate: one piece of a message arrived. Each queue pair delivers its
 * pieces in message order, so the piece is of message qp_done[q]; it must be a
 * receive posted and not done, all pieces must give the same size, and the
 * message is complete when every queue pair has delivered its piece.
 */
static ncclResult_t ib_recv_piece(struct ib_comm* c, const struct ibv_wc* wc) {
  const int q = ib_qp_index(c, wc->qp_num);
  if (q < 0)
    return c->failed = braid_err(ncclInternalError, "net IB: a completion for queue pair 0x%x, "
                                 "not one of the connection with %s", wc->qp_num, c->peer);
  const uint64_t m = c->qp_done[q];
  const int slot = (int)(m % IB_MAX_REQS);
  struct ib_req* r = m < c->seq ? c->recv_order[slot] : NULL;
  if (r == NULL)
    return c->failed = braid_err(ncclInternalError, "net IB: %s sent a message no receive was "
                                 "posted for", c->peer);
  const uint32_t got = ntohl(wc->imm_data);
  if (got > r->size) /* its write ran past the slot it was cleared for */
    return c->failed = braid_err(ncclRemoteError, "net IB: %s wrote %u bytes into a receive of %zu "
                                 "bytes (message %llu)", c->peer, got, r->size, (unsigned long long)m);
  if (r->pieces > 0 && got != r->got)
    return c->failed = braid_err(ncclRemoteError, "net IB: the pieces of message %llu from %s "
                                 "disagree on its size (%u and %u bytes)", (unsigned long long)m,
                                 c->peer, r->got, got);
  r->got = got;
  c->qp_done[q]++;
  if (++r->pieces == c->nqps) {
    c->recv_order[slot] = NULL;
    r->size = got;
    r->done = 1;
  }
  return ib_post_recvs(c, q, 1);
}

static ncclResult_t ib_wc_handle(struct ib_comm* c, const struct ibv_wc* wc) {
  if (wc->status != IBV_WC_SUCCESS) return ib_wc_failed(c, wc);
  if (wc->opcode == IBV_WC_RECV_RDMA_WITH_IMM) return ib_recv_piece(c, wc);
  if (wc->wr_id != 0) { /* a send's piece, or a flush */
    struct ib_req* r = (struct ib_req*)(uintptr_t)wc->wr_id;
    if (--r->pending <= 0) r->done = 1;
  }
  return ncclSuccess;
}

/*
 * The handshake socket: the sender's "ready" byte, a goodbye byte from a
 * peer that closed its end ('B': no error, nothing more will come), and the
 * end of the stream without goodbye when the peer's process died.
 */
static ncclResult_t ib_liveness(struct ib_comm* c) {
  double now = braid_time_sec();
  if (c->peer_done || (c->ready && now < c->next_liveness)) return ncclSuccess;
  c->next_liveness = now + IB_LIVENESS_SEC;
  char byte = 0;
  size_t n = 0;
  if (socket_recv_some(c->fd, &byte, 1, &n) != ncclSuccess)
    return c->failed = braid_err(ncclRemoteError, "net IB: the connection with %s ended without a "
                                 "goodbye (the peer's process died?)", c->peer);
  if (n == 1 && byte == 'R') c->ready = 1;
  if (n == 1 && byte == 'B') {
    INFO(BRAID_LOG_NET, "net IB: %s closed the connection", c->peer);
    c->peer_done = 1;
  }
  return ncclSuccess;
}

static ncclResult_t ib_progress(struct ib_comm* c) {
  struct ibv_wc wc[16];
  if (c->failed != ncclSuccess) return c->failed;
  ncclResult_t res = ib_liveness(c);
  if (res != ncclSuccess) return res;
  for (;;) {
    int n = ibv_poll_cq(c->cq, 16, wc);
    if (n < 0) return c->failed = braid_err(ncclSystemError, "net IB: polling the completion queue for %s failed", c->peer);
    for (int i = 0; i < n; i++)
      if ((res = ib_wc_handle(c, &wc[i])) != ncclSuccess) return res;
    if (n < 16) return ncclSuccess;
  }
}

static struct ib_req* ib_req_get(struct ib_comm* c) {
  struct ib_req* r = &c->reqs[c->seq % IB_MAX_REQS];
  if (r->used) return NULL;
  *r = (struct ib_req){.comm = c, .used = 1};
  return r;
}

/* ------------------------------------------------------------- requests */

/*
 * Piece q of a message: an RDMA write with immediate into its place in the
 * receiver's buffer or, with adaptive routing and above the threshold, a plain
 * RDMA write followed by a zero-byte write with immediate on the same queue
 * pair (the immediate then completes only after all the data is placed, even
 * where the fabric reorders the write's packets). Only the last is signaled.
 */
static int ib_post_piece(struct ib_comm* c, int q, struct ib_req* r, char* data, size_t off,
                         size_t len, uint32_t size, const struct ibv_mr* mr, uint64_t raddr,
                         uint32_t rkey) {
  struct ibv_sge sge = {.addr = (uint64_t)(uintptr_t)(data + off), .length = (uint32_t)len,
                        .lkey = mr ? mr->lkey : 0};
  struct ibv_send_wr wr[2], *bad = NULL;
  const int split = c->ar && len > c->ar_threshold;
  memset(wr, 0, sizeof wr);
  wr[0].sg_list = len ? &sge : NULL;
  wr[0].num_sge = len ? 1 : 0;
  wr[0].wr.rdma.remote_addr = raddr + off;
  wr[0].wr.rdma.rkey = rkey;
  wr[1] = wr[0];
  struct ibv_send_wr* last = split ? &wr[1] : &wr[0];
  if (split) {
    wr[0].opcode = IBV_WR_RDMA_WRITE;
    wr[0].next = &wr[1];
    wr[1].sg_list = NULL;
    wr[1].num_sge = 0;
  }
  last->opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  last->imm_data = htonl(size);
  last->send_flags = IBV_SEND_SIGNALED;
  last->wr_id = (uint64_t)(uintptr_t)r;
  return ibv_post_send(c->qps[q], &wr[0], &bad);
}

ncclResult_t ib_isend(void* send_comm, void* data, size_t size, void* mhandle, void** request) {
  struct ib_comm* c = send_comm;
  struct ibv_mr* mr = mhandle;
  *request = NULL;
  ncclResult_t res = ib_progress(c);
  if (res != ncclSuccess) return res;
  volatile struct ib_cts* cts = &c->cts[c->seq % IB_MAX_REQS];
  if (cts->seq1 != c->seq + 1) return ncclSuccess; /* the receiver has not posted it yet */
  __atomic_thread_fence(__ATOMIC_ACQUIRE);
  if (size > cts->size)
    return c->failed = braid_err(ncclInternalError, "net IB: a %zu-byte message to %s does not fit its "
                                 "%u-byte receive (truncation)", size, c->peer, cts->size);
  struct ib_req* r = ib_req_get(c);
  if (r == NULL) return ncclSuccess;
  const uint64_t raddr = cts->addr;
  const uint32_t rkey = cts->rkey;
  r->pending = c->nqps;
  for (int q = 0; q < c->nqps; q++) {
    size_t off, len;
    ib_split(size, c->nqps, q, &off, &len);
    int err = ib_post_piece(c, q, r, data, off, len, (uint32_t)size, mr, raddr, rkey);
    if (err != 0) {
      if (q == 0) r->used = 0; /* pieces already posted would complete into it */
      return c->failed = braid_err(ncclSystemError, "net IB: posting a send to %s failed: %s",
                                   c->peer, strerror(err));
    }
  }
  r->size = size;
  c->seq++;
  *request = r;
  return ncclSuccess;
}

ncclResult_t ib_irecv(void* recv_comm, void* data, size_t size, void* mhandle, void** request) {
  struct ib_comm* c = recv_comm;
  struct ibv_mr* mr = mhandle;
  *request = NULL;
  ncclResult_t res = ib_progress(c);
  if (res != ncclSuccess || !c->ready) return res; /* the sender's queue pair is not ready yet */
  struct ib_req* r = ib_req_get(c);
  if (r == NULL) return ncclSuccess;
  int slot = (int)(c->seq % IB_MAX_REQS);
  struct ib_cts* entry = &c->cts[slot];
  *entry = (struct ib_cts){.addr = (uint64_t)(uintptr_t)data, .rkey = mr ? mr->rkey : 0,
                           .size = (uint32_t)BRAID_MIN(size, (size_t)UINT32_MAX), .seq1 = c->seq + 1};
  struct ibv_sge sge = {.addr = (uint64_t)(uintptr_t)entry, .length = sizeof *entry, .lkey = c->cts_mr->lkey};
  struct ibv_send_wr wr, *bad = NULL;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = 0;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = c->remote_cts_addr + (uint64_t)slot * sizeof *entry;
  wr.wr.rdma.rkey = c->remote_cts_rkey;
  r->size = entry->size; /* the most the sender may write: its immediate is checked against it */
  c->recv_order[slot] = r;
  int err = ibv_post_send(c->qps[0], &wr, &bad); /* clear-to-send entries go on the first */
  if (err != 0) {
    c->recv_order[slot] = NULL;
    r->used = 0;
    return c->failed = braid_err(ncclSystemError, "net IB: posting a clear-to-send to %s failed: %s",
                                 c->peer, strerror(err));
  }
  c->seq++;
  *request = r;
  return ncclSuccess;
}

ncclResult_t ib_iflush(void* recv_comm, void* data, size_t size, void* mhandle, void** request) {
  struct ib_comm* c = recv_comm;
  struct ibv_mr* mr = mhandle;
  *request = NULL;
  if (c->flush_qp == NULL || size == 0) return ncclSuccess; /* host memory: nothing to flush */
  struct ib_req* r = NULL;
  for (int i = 0; i < IB_MAX_REQS && r == NULL; i++)
    if (!c->reqs[i].used) r = &c->reqs[i];
  if (r == NULL) return braid_err(ncclInternalError, "net IB: no request free for a flush");
  *r = (struct ib_req){.comm = c, .used = 1, .pending = 1};
  struct ibv_sge sge = {.addr = (uint64_t)(uintptr_t)c->scratch, .length = 1, .lkey = c->scratch_mr->lkey};
  struct ibv_send_wr wr, *bad = NULL;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = (uint64_t)(uintptr_t)r;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_READ;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = (uint64_t)(uintptr_t)data;
  wr.wr.rdma.rkey = mr->rkey;
  int err = ibv_post_send(c->flush_qp, &wr, &bad);
  if (err != 0) {
    r->used = 0;
    return braid_err(ncclSystemError, "net IB: posting a flush failed: %s", strerror(err));
  }
  *request = r;
  return ncclSuccess;
}

ncclResult_t ib_test(void* request, int* done, size_t* size) {
  struct ib_req* r = request;
  *done = 0;
  ncclResult_t res = ib_progress(r->comm);
  if (res != ncclSuccess) return res;
  if (!r->done) return ncclSuccess;
  *done = 1;
  if (size) *size = r->size;
  r->used = 0;
  return ncclSuccess;
}

#endif /* BRAID_HAVE_IBVERBS */
