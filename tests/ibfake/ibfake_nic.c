/*
 * ibfake's NIC: one thread per opened device that moves the posted work between processes.
 *
 * Addresses: the NIC listens on a Unix socket in IBFAKE_DIR per address (each GID on RoCE, the
 * LID on InfiniBand), named by the address, so a queue pair reaches its peer by the GID or
 * LID and QPN the application exchanged. A QP's requests go out on a link (a socket this NIC
 * connected, opened with a hello naming the source address); the peer answers on that link.
 *
 * Requests carry the RC protocol's facts: source and destination QPN, PSN, remote address,
 * rkey, immediate. The responder drops what is not for a ready QP whose peer this is (as a
 * real port drops such packets); executes the expected PSN once (a duplicate is acknowledged
 * again, a gap dropped); checks rkey, bounds and access against its own registrations and
 * then receives the payload into its memory; answers with an ACK, a progress note every MiB,
 * a NAK (remote access or invalid request: its QP goes to the error state too) or
 * receiver-not-ready (no receive for a SEND or a WRITE with immediate; it carries the
 * responder's min_rnr_timer). The requester completes WRs on ACKs; without any answer for the
 * QP's timeout (while its frames are still queued on a link that moves, none is due) it counts
 * a retry and goes back to the first unacknowledged WR; past retry_cnt retries the WR fails
 * with IBV_WC_RETRY_EXC_ERR (a peer that died, stopped or was never there). After
 * receiver-not-ready it waits the timer and resends, rnr_retry times (7: always). Times are
 * scaled down (ibfake_timeout_sec).
 *
 * The payload is copied by recv()/send() straight between socket and registered memory, as a
 * NIC's DMA would; ThreadSanitizer, when present, is told to ignore those copies (a NIC's DMA
 * is not a CPU thread's access; the application orders its reads with completions or fences).
 */
#include "ibfake.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define FR_MAGIC 0x4b464249u /* "IBFK" */
#define MAX_LINKS 256
#define IO_CHUNK ((uint64_t)4 << 20)
/* Bytes one link moves per turn, so that the others get theirs. */
#define IO_BUDGET ((uint64_t)16 << 20)
#define PROGRESS_BYTES ((uint64_t)1 << 20)

enum {
  FR_HELLO = 1,
  FR_WRITE,
  FR_SEND,
  FR_READ,
  FR_ACK,
  FR_NAK,
  FR_RNR,
  FR_READ_RESP,
  FR_PROGRESS
};

struct fhdr {
  uint32_t magic;
  uint8_t type, status, has_imm, pad;
  uint32_t src_qpn, dst_qpn, psn, rkey, imm;
  uint64_t raddr, len;
};

struct fseg {
  char* p;
  uint64_t n;
};

struct fframe {
  struct fframe* next;
  struct fhdr hdr;
  size_t hdr_done;
  int nseg, cur;
  struct fseg seg[IBFAKE_MAX_SGE];
  uint64_t off;
  struct fqp* qp; /* a request's QP; NULL for answers and frames detached from their QP */
  char* owned;    /* payload this frame owns */
};

/* What to do once an incoming frame's payload has arrived (or been discarded). */
enum in_action { IN_NONE, IN_HELLO, IN_WRITE, IN_SEND, IN_READ_RESP, IN_DUP, IN_NAK, IN_RNR };

struct flink {
  struct flink* next;
  int fd, outgoing, dead;
  int sgid_index;                 /* outgoing: which of our addresses the hello named */
  char peer[IBFAKE_KEY_BYTES];    /* outgoing: where to; incoming: who, from its hello */
  struct fhdr in;
  size_t in_got;
  int in_nseg, in_cur, in_discard;
  struct fseg in_seg[IBFAKE_MAX_SGE];
  struct fmr* in_mr[IBFAKE_MAX_SGE];
  uint64_t in_off, in_left, in_since_note;
  enum in_action action;
  enum ibv_wc_status nak;       /* IN_NAK: what the requester is told */
  enum ibv_wc_status recv_fail; /* IN_NAK with in_has_recv: how the receive it took completes */
  struct fqp* in_qp;
  int in_has_recv;
  struct frecv in_recv; /* the receive a SEND or WRITE with immediate consumes */
  struct fframe *out_head, *out_tail;
  double last_out; /* when the last bytes went out */
};

static void (*tsan_ignore_begin)(const char*, int);
static void (*tsan_ignore_end)(const char*, int);
static char scratch[1 << 16]; /* discarded payloads land here; only NIC threads write it */

static void dma_begin(void) {
  if (tsan_ignore_begin) tsan_ignore_begin(__FILE__, __LINE__);
}
static void dma_end(void) {
  if (tsan_ignore_end) tsan_ignore_end(__FILE__, __LINE__);
}

/* ---------------------------------------------------------------- frames */

static struct fframe* frame_new(struct flink* l, int type, struct fqp* qp) {
  struct fframe* f = calloc(1, sizeof *f);
  if (f == NULL) return NULL;
  f->hdr.magic = FR_MAGIC;
  f->hdr.type = (uint8_t)type;
  f->qp = qp;
  if (qp) qp->queued_frames++;
  if (l->out_tail) l->out_tail->next = f;
  else l->out_head = f;
  l->out_tail = f;
  return f;
}

static void frame_free(struct fframe* f) {
  if (f->qp) f->qp->queued_frames--;
  free(f->owned);
  free(f);
}

/* Takes the unsent rest of a started frame's payload into the frame (its source may go away). */
static void frame_detach(struct fframe* f) {
  uint64_t rest = 0;
  for (int i = f->cur; i < f->nseg; i++) rest += f->seg[i].n - (i == f->cur ? f->off : 0);
  char* copy = malloc(rest ? rest : 1), *at = copy;
  dma_begin();
  for (int i = f->cur; copy && i < f->nseg; i++) {
    uint64_t skip = i == f->cur ? f->off : 0;
    if (f->seg[i].n == skip) continue;
    memcpy(at, f->seg[i].p + skip, f->seg[i].n - skip);
    at += f->seg[i].n - skip;
  }
  dma_end();
  if (copy == NULL) return; /* keeps reading the source; nothing better to do */
  free(f->owned);
  f->owned = copy;
  f->seg[0] = (struct fseg){copy, rest};
  f->nseg = 1;
  f->cur = 0;
  f->off = 0;
}

/* Drops `qp`'s frames with PSN up to `psn` (all of them when all != 0); a started one is kept,
   detached, so that the stream stays whole. */
static void frames_release(struct fnic* nic, struct fqp* qp, uint32_t psn, int all) {
  for (struct flink* l = nic->links; l; l = l->next) {
    struct fframe **p = &l->out_head, *last = NULL;
    while (*p) {
      struct fframe* f = *p;
      if (f->qp != qp || (!all && ibfake_psn_cmp(f->hdr.psn, psn) > 0)) {
        last = f;
        p = &f->next;
      } else if (f == l->out_head && (f->hdr_done > 0)) {
        frame_detach(f);
        qp->queued_frames--;
        f->qp = NULL;
        last = f;
        p = &f->next;
      } else {
        *p = f->next;
        frame_free(f);
      }
    }
    l->out_tail = last;
  }
}

/* An answer to the request in l->in. */
static void answer(struct flink* l, int type, uint32_t psn, enum ibv_wc_status status) {
  struct fframe* f = frame_new(l, type, NULL);
  if (f == NULL) return;
  f->hdr.src_qpn = l->in.dst_qpn;
  f->hdr.dst_qpn = l->in.src_qpn;
  f->hdr.psn = psn;
  f->hdr.status = (uint8_t)status;
}

/* ----------------------------------------------------------------- links */

static const char* nic_dir(char* out, size_t size) {
  const char* dir = getenv("IBFAKE_DIR");
  if (dir && dir[0]) snprintf(out, size, "%s", dir);
  else snprintf(out, size, "/tmp/ibfake-%u", (unsigned)getuid());
  return out;
}

static int addr_of(const char* key, struct sockaddr_un* sa) {
  char dir[IBFAKE_PATH_BYTES];
  memset(sa, 0, sizeof *sa);
  sa->sun_family = AF_UNIX;
  if (snprintf(sa->sun_path, sizeof sa->sun_path, "%s/%s", nic_dir(dir, sizeof dir), key) >=
      (int)sizeof sa->sun_path) {
    errno = ENAMETOOLONG;
    return -1;
  }
  return 0;
}

static struct flink* link_add(struct fnic* nic, int fd, int outgoing) {
  struct flink* l = calloc(1, sizeof *l);
  if (l == NULL) {
    close(fd);
    return NULL;
  }
  int buf = 4 << 20;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
  l->fd = fd;
  l->outgoing = outgoing;
  l->next = nic->links;
  nic->links = l;
  return l;
}

/* The link `qp` sends on, connected (with its hello queued) if there is none; NULL while its
   peer cannot be reached (no such address, its process gone, its backlog full). */
static struct flink* link_for(struct fnic* nic, struct fqp* qp) {
  struct sockaddr_un sa;
  for (struct flink* l = nic->links; l; l = l->next)
    if (l->outgoing && !l->dead && l->sgid_index == qp->sgid_index &&
        strcmp(l->peer, qp->dest_key) == 0)
      return l;
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0 || addr_of(qp->dest_key, &sa) != 0 ||
      connect(fd, (struct sockaddr*)&sa, sizeof sa) != 0) {
    if (fd >= 0) close(fd);
    return NULL;
  }
  struct flink* l = link_add(nic, fd, 1);
  if (l == NULL) return NULL;
  l->sgid_index = qp->sgid_index;
  snprintf(l->peer, sizeof l->peer, "%s", qp->dest_key);
  struct fframe* f = frame_new(l, FR_HELLO, NULL);
  char* key = f ? malloc(IBFAKE_KEY_BYTES) : NULL;
  if (key == NULL) {
    l->dead = 1;
    return NULL;
  }
  memcpy(key, nic->key[qp->sgid_index], IBFAKE_KEY_BYTES);
  f->owned = key;
  f->seg[0] = (struct fseg){key, IBFAKE_KEY_BYTES};
  f->nseg = 1;
  f->hdr.len = IBFAKE_KEY_BYTES;
  ibfake_log(nic, "link to %s from %s", qp->dest_key, nic->key[qp->sgid_index]);
  return l;
}

static void link_free(struct flink* l) {
  while (l->out_head) {
    struct fframe* f = l->out_head;
    l->out_head = f->next;
    frame_free(f);
  }
  if (l->fd >= 0) close(l->fd);
  free(l);
}

static void links_reap(struct fnic* nic) {
  for (struct flink** p = &nic->links; *p;) {
    struct flink* l = *p;
    if (!l->dead) {
      p = &l->next;
      continue;
    }
    *p = l->next;
    link_free(l);
  }
}

/* ------------------------------------------------------------- responder */

/* Takes the receive a SEND or WRITE with immediate consumes; 0 if none is ready (RNR). */
static int take_recv(struct flink* l, struct fqp* qp) {
  if (qp->rq_head == qp->rq_tail || ibfake_force_rnr()) return 0;
  l->in_recv = qp->rq[qp->rq_head++ % qp->cap.max_recv_wr];
  l->in_has_recv = 1;
  return 1;
}

static void set_nak(struct flink* l, enum ibv_wc_status nak, enum ibv_wc_status recv_fail) {
  l->action = IN_NAK;
  l->nak = nak;
  l->recv_fail = recv_fail;
  l->in_discard = 1;
}

/* Checks a request in l->in and sets where its payload goes and what follows it. */
static void in_request(struct fnic* nic, struct flink* l) {
  struct fhdr* h = &l->in;
  struct fqp* qp = ibfake_qp_find(nic, h->dst_qpn);
  l->in_left = h->type == FR_READ ? 0 : h->len;
  l->in_has_recv = 0;
  if (ibfake_dropping()) return;
  if (qp == NULL || (qp->qp.state != IBV_QPS_RTR && qp->qp.state != IBV_QPS_RTS) ||
      qp->dest_qpn != h->src_qpn || strcmp(qp->dest_key, l->peer) != 0) {
    ibfake_log(nic, "drop from %s qp=0x%x to qp=0x%x psn=%u: %s", l->peer, h->src_qpn, h->dst_qpn,
               h->psn, qp == NULL ? "no such QP" : qp->dest_qpn != h->src_qpn ||
               strcmp(qp->dest_key, l->peer) != 0 ? "not this QP's peer" : "QP not ready");
    return;
  }
  int order = ibfake_psn_cmp(h->psn, qp->epsn);
  if (order > 0) return; /* a gap: dropped; the requester goes back */
  l->in_qp = qp;
  if (order < 0 && h->type != FR_READ) { /* executed before: acknowledged again, not repeated */
    l->action = IN_DUP;
    return;
  }
  if (h->type == FR_SEND) { /* scattered over the receive's buffers, which must hold it */
    if (!take_recv(l, qp)) {
      l->action = IN_RNR;
      return;
    }
    uint64_t left = h->len;
    int keys = 1;
    for (int i = 0; i < l->in_recv.nsge && left > 0 && keys; i++) {
      struct ibv_sge* s = &l->in_recv.sge[i];
      uint64_t n = s->length < left ? s->length : left;
      l->in_mr[i] = ibfake_mr_find(nic, qp->qp.pd, s->lkey, s->addr, n, IBV_ACCESS_LOCAL_WRITE);
      keys = l->in_mr[i] != NULL;
      l->in_seg[i] = (struct fseg){keys ? ibfake_mr_ptr(l->in_mr[i], s->addr) : NULL, n};
      l->in_nseg = i + 1;
      left -= n;
    }
    l->in_discard = 0;
    l->action = IN_SEND;
    if (!keys) set_nak(l, IBV_WC_REM_OP_ERR, IBV_WC_LOC_PROT_ERR);
    else if (left > 0) set_nak(l, IBV_WC_REM_INV_REQ_ERR, IBV_WC_LOC_LEN_ERR);
    return;
  }
  int need = h->type == FR_READ ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE;
  struct fmr* mr = NULL;
  if (h->len > 0 &&
      ((qp->access & need) != need ||
       (mr = ibfake_mr_find(nic, qp->qp.pd, h->rkey, h->raddr, h->len, need)) == NULL)) {
    ibfake_log(nic, "qp=0x%x remote access error from %s: %s of %llu bytes at 0x%llx rkey 0x%x",
               qp->qp.qp_num, l->peer, h->type == FR_READ ? "read" : "write",
               (unsigned long long)h->len, (unsigned long long)h->raddr, h->rkey);
    set_nak(l, IBV_WC_REM_ACCESS_ERR, IBV_WC_SUCCESS);
    return;
  }
  if (h->type == FR_READ) { /* answered with a copy of the data, at once */
    struct fframe* f = frame_new(l, FR_READ_RESP, NULL);
    if (f == NULL) return;
    f->hdr.src_qpn = h->dst_qpn;
    f->hdr.dst_qpn = h->src_qpn;
    f->hdr.psn = h->psn;
    f->hdr.len = h->len;
    f->owned = malloc(h->len ? h->len : 1);
    dma_begin();
    if (f->owned && h->len) memcpy(f->owned, ibfake_mr_ptr(mr, h->raddr), h->len);
    dma_end();
    f->seg[0] = (struct fseg){f->owned, f->owned ? h->len : 0};
    f->nseg = 1;
    if (order == 0) qp->epsn = (qp->epsn + 1) & 0xffffff;
    return;
  }
  if (h->has_imm && !take_recv(l, qp)) { /* the immediate needs a receive */
    l->action = IN_RNR;
    return;
  }
  l->in_seg[0] = (struct fseg){mr ? ibfake_mr_ptr(mr, h->raddr) : NULL, mr ? h->len : 0};
  l->in_mr[0] = mr;
  l->in_nseg = 1;
  l->in_discard = 0;
  l->action = IN_WRITE;
}

/* The payload of a request arrived: complete it and answer. */
static void in_request_done(struct fnic* nic, struct flink* l) {
  struct fhdr* h = &l->in;
  struct fqp* qp = l->in_qp;
  if (qp == NULL || l->action == IN_NONE) return;
  if (l->action == IN_DUP) { /* acknowledges everything executed so far */
    answer(l, FR_ACK, (qp->epsn - 1) & 0xffffff, IBV_WC_SUCCESS);
  } else if (l->action == IN_RNR) { /* the requester waits the responder's min_rnr_timer */
    answer(l, FR_RNR, h->psn, (enum ibv_wc_status)qp->min_rnr_timer);
    ibfake_log(nic, "qp=0x%x receiver not ready for %s psn=%u", qp->qp.qp_num, l->peer, h->psn);
  } else if (l->action == IN_NAK) {
    answer(l, FR_NAK, h->psn, l->nak);
    if (l->in_has_recv) { /* the receive it took fails too */
      struct ibv_wc wc = {.wr_id = l->in_recv.wr_id, .status = l->recv_fail,
                          .opcode = h->type == FR_SEND ? IBV_WC_RECV : IBV_WC_RECV_RDMA_WITH_IMM,
                          .qp_num = qp->qp.qp_num, .src_qp = h->src_qpn};
      ibfake_cq_push(qp->rcq, &wc);
    }
    ibfake_qp_fail(qp, IBV_WC_WR_FLUSH_ERR, l->nak == IBV_WC_REM_ACCESS_ERR
                   ? "responder: remote access violation" : "responder: invalid request");
    frames_release(nic, qp, 0, 1);
  } else { /* IN_WRITE, IN_SEND */
    if (l->in_has_recv) {
      struct ibv_wc wc = {.wr_id = l->in_recv.wr_id, .status = IBV_WC_SUCCESS,
                          .opcode = h->type == FR_SEND ? IBV_WC_RECV : IBV_WC_RECV_RDMA_WITH_IMM,
                          .byte_len = (uint32_t)h->len, .qp_num = qp->qp.qp_num,
                          .src_qp = h->src_qpn, .wc_flags = h->has_imm ? IBV_WC_WITH_IMM : 0};
      wc.imm_data = h->imm;
      ibfake_cq_push(qp->rcq, &wc);
    }
    qp->epsn = (qp->epsn + 1) & 0xffffff;
    answer(l, FR_ACK, h->psn, IBV_WC_SUCCESS);
  }
}

/* ------------------------------------------------------------- requester */

/* The RNR timer an RNR NAK carries (IBA's encoding of min_rnr_timer), in seconds. */
static double rnr_timer_sec(unsigned code) {
  static const double ms[32] = {655.36, 0.01, 0.02, 0.03, 0.04, 0.06, 0.08, 0.12, 0.16, 0.24, 0.32,
                                0.48, 0.64, 0.96, 1.28, 1.92, 2.56, 3.84, 5.12, 7.68, 10.24, 15.36,
                                20.48, 30.72, 40.96, 61.44, 81.92, 122.88, 163.84, 245.76, 327.68,
                                491.52};
  return ms[code & 31] / 1e3;
}

/* An answer for one of our QPs arrived (header only, or a read's data that landed). */
static void in_answer(struct fnic* nic, struct flink* l) {
  struct fhdr* h = &l->in;
  struct fqp* qp = ibfake_qp_find(nic, h->dst_qpn);
  if (qp == NULL || qp->qp.state != IBV_QPS_RTS) return;
  uint32_t before = (h->psn - 1) & 0xffffff;
  switch (h->type) {
  case FR_ACK:
    ibfake_qp_acked(qp, h->psn);
    frames_release(nic, qp, h->psn, 0);
    break;
  case FR_PROGRESS:
    qp->retries_left = qp->retry_cnt;
    qp->deadline = ibfake_now() + ibfake_timeout_sec(qp->timeout);
    break;
  case FR_NAK:
    ibfake_qp_acked(qp, before);
    ibfake_log(nic, "qp=0x%x NAK from %s psn=%u status=%d", qp->qp.qp_num, l->peer, h->psn,
               h->status);
    ibfake_qp_fail(qp, (enum ibv_wc_status)h->status, "NAK from the responder");
    frames_release(nic, qp, 0, 1);
    break;
  case FR_RNR:
    ibfake_qp_acked(qp, before);
    if (qp->rnr_retry != 7 && qp->rnr_left-- == 0) {
      ibfake_qp_fail(qp, IBV_WC_RNR_RETRY_EXC_ERR, "receiver not ready, rnr_retry exhausted");
      frames_release(nic, qp, 0, 1);
      break;
    }
    frames_release(nic, qp, 0, 1);
    qp->sq_sent = qp->sq_head; /* from the refused WR on, again after the RNR timer */
    qp->resume_at = ibfake_now() + rnr_timer_sec(h->status);
    qp->deadline = 0; /* an answer: the transport timer starts again when it resends */
    ibfake_log(nic, "qp=0x%x RNR from %s psn=%u: resending", qp->qp.qp_num, l->peer, h->psn);
    break;
  case FR_READ_RESP:
    ibfake_qp_acked(qp, h->psn);
    frames_release(nic, qp, h->psn, 0);
    break;
  }
}

/* A read's answer: its data goes where the read WR (first unacknowledged) asked. */
static void in_read_resp(struct fnic* nic, struct flink* l) {
  struct fhdr* h = &l->in;
  struct fqp* qp = ibfake_qp_find(nic, h->dst_qpn);
  l->in_left = h->len;
  l->action = IN_READ_RESP;
  if (qp == NULL || qp->qp.state != IBV_QPS_RTS || qp->sq_head == qp->sq_sent) return;
  struct fwr* wr = ibfake_sq_at(qp, qp->sq_head);
  if (wr->op != IBV_WR_RDMA_READ || wr->psn != h->psn || wr->len != h->len) return;
  int keys = 1;
  for (int i = 0; i < wr->nsge; i++) {
    struct fmr* mr = wr->sge[i].length == 0 ? NULL
                   : ibfake_mr_find(nic, qp->qp.pd, wr->sge[i].lkey, wr->sge[i].addr,
                                    wr->sge[i].length, IBV_ACCESS_LOCAL_WRITE);
    keys &= mr != NULL || wr->sge[i].length == 0;
    l->in_seg[i] =
        (struct fseg){mr ? ibfake_mr_ptr(mr, wr->sge[i].addr) : NULL, mr ? wr->sge[i].length : 0};
    l->in_mr[i] = mr;
  }
  l->in_nseg = wr->nsge;
  l->in_qp = qp;
  l->in_discard = !keys;
  if (!keys) { /* deregistered since it was posted: the data has nowhere to go */
    l->action = IN_NAK;
    l->nak = IBV_WC_LOC_PROT_ERR;
  }
}

/* Sends what `qp` has not sent yet, as far as its peer can be reached. */
static void qp_transmit(struct fnic* nic, struct fqp* qp, double now) {
  if (qp->qp.state != IBV_QPS_RTS || now < qp->resume_at) return;
  while (qp->sq_sent != qp->sq_tail) {
    struct fwr* wr = ibfake_sq_at(qp, qp->sq_sent);
    int access = wr->op == IBV_WR_RDMA_READ ? IBV_ACCESS_LOCAL_WRITE : 0, bad = 0;
    char* at[IBFAKE_MAX_SGE] = {NULL};
    for (int i = 0; i < wr->nsge && !wr->inline_data; i++) {
      if (wr->sge[i].length == 0) continue;
      struct fmr* mr = ibfake_mr_find(nic, qp->qp.pd, wr->sge[i].lkey, wr->sge[i].addr,
                                      wr->sge[i].length, access);
      if (mr) at[i] = ibfake_mr_ptr(mr, wr->sge[i].addr);
      else bad = 1;
    }
    if (bad) { /* fails once the WRs before it completed, as a NIC's in-order processing would */
      if (qp->sq_sent == qp->sq_head)
        ibfake_qp_fail(qp, IBV_WC_LOC_PROT_ERR, "local key or bounds");
      return;
    }
    struct flink* l = link_for(nic, qp);
    if (l == NULL) return;
    int type = wr->op == IBV_WR_RDMA_READ ? FR_READ
             : wr->op == IBV_WR_SEND || wr->op == IBV_WR_SEND_WITH_IMM ? FR_SEND : FR_WRITE;
    struct fframe* f = frame_new(l, type, qp);
    if (f == NULL) return;
    f->hdr.src_qpn = qp->qp.qp_num;
    f->hdr.dst_qpn = qp->dest_qpn;
    f->hdr.psn = wr->psn;
    f->hdr.rkey = wr->rkey;
    f->hdr.raddr = wr->raddr;
    f->hdr.len = wr->len;
    f->hdr.imm = wr->imm;
    f->hdr.has_imm = wr->op == IBV_WR_RDMA_WRITE_WITH_IMM || wr->op == IBV_WR_SEND_WITH_IMM;
    if (wr->inline_data && (f->owned = malloc(wr->len ? wr->len : 1)) != NULL) {
      memcpy(f->owned, wr->inline_data, wr->len);
      f->seg[0] = (struct fseg){f->owned, wr->len};
      f->nseg = 1;
    } else if (type != FR_READ) {
      for (int i = 0; i < wr->nsge; i++)
        f->seg[i] = (struct fseg){at[i], at[i] ? wr->sge[i].length : 0};
      f->nseg = wr->nsge;
    }
    qp->sq_sent++;
    if (qp->deadline == 0) qp->deadline = now + ibfake_timeout_sec(qp->timeout);
  }
}

/* No answer within the timeout: retry from the first unacknowledged WR, or fail. */
static void qp_timer(struct fnic* nic, struct fqp* qp, double now) {
  if (qp->qp.state != IBV_QPS_RTS || qp->sq_head == qp->sq_tail || qp->timeout == 0) return;
  if (qp->deadline == 0) qp->deadline = now + ibfake_timeout_sec(qp->timeout);
  if (now < qp->deadline) return;
  if (qp->queued_frames > 0) { /* not all on the wire yet: no answer is due while the link moves */
    for (struct flink* l = nic->links; l; l = l->next) {
      if (!l->outgoing || l->dead || l->sgid_index != qp->sgid_index ||
          strcmp(l->peer, qp->dest_key) != 0 || now - l->last_out > ibfake_timeout_sec(qp->timeout))
        continue;
      qp->deadline = now + ibfake_timeout_sec(qp->timeout);
      return;
    }
  }
  if (qp->retries_left == 0) {
    char why[96];
    snprintf(why, sizeof why, "no answer from %s after %d tries", qp->dest_key, qp->retry_cnt + 1);
    ibfake_qp_fail(qp, IBV_WC_RETRY_EXC_ERR, why);
    frames_release(nic, qp, 0, 1);
    return;
  }
  qp->retries_left--;
  ibfake_log(nic, "qp=0x%x timeout waiting for %s: retry (%d left)", qp->qp.qp_num, qp->dest_key,
             qp->retries_left);
  if (qp->queued_frames == 0) qp->sq_sent = qp->sq_head;
  qp->deadline = now + ibfake_timeout_sec(qp->timeout);
}

/* -------------------------------------------------------------------- I/O */

/* The header of an incoming frame is complete: where does its payload go? */
static int in_header(struct fnic* nic, struct flink* l) {
  struct fhdr* h = &l->in;
  l->in_nseg = l->in_cur = 0;
  l->in_off = l->in_since_note = 0;
  l->in_discard = 1;
  l->in_qp = NULL;
  l->action = IN_NONE;
  l->in_left = 0;
  if (h->magic != FR_MAGIC) return -1;
  if (h->type == FR_HELLO) {
    if (l->outgoing || h->len != IBFAKE_KEY_BYTES) return -1;
    l->in_seg[0] = (struct fseg){l->peer, IBFAKE_KEY_BYTES};
    l->in_nseg = 1;
    l->in_discard = 0;
    l->in_left = h->len;
    l->action = IN_HELLO;
  } else if (h->type == FR_WRITE || h->type == FR_SEND || h->type == FR_READ) {
    if (l->outgoing || l->peer[0] == '\0') return -1;
    in_request(nic, l);
  } else if (h->type == FR_READ_RESP) {
    if (!l->outgoing) return -1;
    in_read_resp(nic, l);
  } else if (h->type >= FR_ACK && h->type <= FR_PROGRESS) {
    if (!l->outgoing) return -1;
  } else {
    return -1;
  }
  return 0;
}

static void in_frame_done(struct fnic* nic, struct flink* l) {
  struct fhdr* h = &l->in;
  if (h->type == FR_HELLO) l->peer[IBFAKE_KEY_BYTES - 1] = '\0';
  else if (h->type == FR_WRITE || h->type == FR_SEND || h->type == FR_READ) in_request_done(nic, l);
  else if (h->type == FR_READ_RESP && l->in_qp && l->action == IN_NAK) {
    ibfake_qp_fail(l->in_qp, l->nak, "read response for a deregistered buffer");
    frames_release(nic, l->in_qp, 0, 1);
  } else if (h->type != FR_READ_RESP || l->in_qp) {
    in_answer(nic, l);
  }
  l->in_got = 0;
}

/* Reads what the link has, up to a budget; marks it dead at its end or on garbage. */
static void link_read(struct fnic* nic, struct flink* l) {
  uint64_t moved = 0;
  ssize_t n = 1;
  while (!l->dead && moved < IO_BUDGET) {
    if (l->in_got < sizeof l->in) {
      n = recv(l->fd, (char*)&l->in + l->in_got, sizeof l->in - l->in_got, MSG_DONTWAIT);
      if (n <= 0) break;
      l->in_got += (size_t)n;
      if (l->in_got < sizeof l->in) continue;
      if (in_header(nic, l) != 0) {
        ibfake_log(nic, "link from %s: not a frame; closed", l->peer);
        l->dead = 1;
        return;
      }
    } else {
      while (!l->in_discard && l->in_cur < l->in_nseg && l->in_off == l->in_seg[l->in_cur].n) {
        l->in_cur++;
        l->in_off = 0;
      }
      int discard = l->in_discard || l->in_cur >= l->in_nseg;
      struct fseg* s = &l->in_seg[l->in_cur];
      uint64_t want = discard ? l->in_left : s->n - l->in_off;
      if (want > l->in_left) want = l->in_left;
      if (want > IO_CHUNK) want = IO_CHUNK;
      if (discard && want > sizeof scratch) want = sizeof scratch;
      dma_begin();
      n = recv(l->fd, discard ? scratch : s->p + l->in_off, want, MSG_DONTWAIT);
      dma_end();
      if (n <= 0) break;
      moved += (uint64_t)n;
      l->in_left -= (uint64_t)n;
      l->in_since_note += (uint64_t)n;
      if (!discard) l->in_off += (uint64_t)n;
      if (l->in_since_note >= PROGRESS_BYTES && l->in_left > 0 && !l->outgoing) {
        answer(l, FR_PROGRESS, l->in.psn, IBV_WC_SUCCESS);
        l->in_since_note = 0;
      }
    }
    if (l->in_left == 0) in_frame_done(nic, l);
  }
  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) l->dead = 1;
}

/* Writes queued frames, up to a budget. */
static void link_write(struct flink* l) {
  uint64_t moved = 0;
  while (!l->dead && l->out_head && moved < IO_BUDGET) {
    struct fframe* f = l->out_head;
    ssize_t n;
    if (f->hdr_done < sizeof f->hdr) {
      n = send(l->fd, (char*)&f->hdr + f->hdr_done, sizeof f->hdr - f->hdr_done,
               MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n > 0) f->hdr_done += (size_t)n;
    } else if (f->cur < f->nseg && f->seg[f->cur].n > f->off) {
      uint64_t want = f->seg[f->cur].n - f->off;
      dma_begin();
      n = send(l->fd, f->seg[f->cur].p + f->off, want > IO_CHUNK ? IO_CHUNK : want,
               MSG_DONTWAIT | MSG_NOSIGNAL);
      dma_end();
      if (n > 0) f->off += (uint64_t)n;
    } else if (f->cur < f->nseg) { /* an empty segment */
      f->cur++;
      f->off = 0;
      continue;
    } else {
      l->out_head = f->next;
      if (l->out_head == NULL) l->out_tail = NULL;
      frame_free(f);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (n <= 0) {
      l->dead = 1;
      return;
    }
    moved += (uint64_t)n;
    l->last_out = ibfake_now();
  }
}

/* ---------------------------------------------------------------- thread */

static void nic_accept(struct fnic* nic, int lfd) {
  for (;;) {
    int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    link_add(nic, fd, 0);
  }
}

static void* nic_main(void* arg) {
  struct fnic* nic = arg;
  struct pollfd pfd[MAX_LINKS + IBFAKE_NGID + 1];
  struct flink* who[MAX_LINKS + IBFAKE_NGID + 1];
  pthread_mutex_lock(&nic->lock);
  while (!nic->stop) {
    int n = 0, busy = 0;
    pfd[n++] = (struct pollfd){.fd = nic->wake_fd, .events = POLLIN};
    for (int i = 0; i < nic->ngid; i++)
      pfd[n++] = (struct pollfd){.fd = nic->listen_fd[i], .events = POLLIN};
    int first_link = n;
    for (struct flink* l = nic->links; l && n < (int)(sizeof pfd / sizeof pfd[0]); l = l->next) {
      who[n] = l;
      pfd[n++] =
          (struct pollfd){.fd = l->fd, .events = (short)(POLLIN | (l->out_head ? POLLOUT : 0))};
    }
    for (struct fqp* q = nic->qps; q; q = q->next) busy |= q->sq_head != q->sq_tail;
    pthread_mutex_unlock(&nic->lock);
    poll(pfd, (nfds_t)n, busy ? 2 : 50);
    pthread_mutex_lock(&nic->lock);
    uint64_t count;
    if (pfd[0].revents & POLLIN) (void)!read(nic->wake_fd, &count, sizeof count);
    for (int i = 0; i < nic->ngid; i++)
      if (pfd[1 + i].revents & POLLIN) nic_accept(nic, nic->listen_fd[i]);
    for (int i = first_link; i < n; i++) {
      if (pfd[i].revents & (POLLIN | POLLHUP | POLLERR)) link_read(nic, who[i]);
      if (pfd[i].revents & POLLOUT) link_write(who[i]);
    }
    double now = ibfake_now();
    for (struct fqp* q = nic->qps; q; q = q->next) {
      qp_transmit(nic, q, now);
      qp_timer(nic, q, now);
    }
    for (struct flink* l = nic->links; l; l = l->next) link_write(l);
    links_reap(nic);
  }
  pthread_mutex_unlock(&nic->lock);
  return NULL;
}

void ibfake_nic_wake(struct fnic* nic) {
  uint64_t one = 1;
  if (nic->wake_fd >= 0) (void)!write(nic->wake_fd, &one, sizeof one);
}

/* ---------------------------------------------------------- start, stop */

/* Removes sockets in the directory whose NIC is gone (a connect is refused). */
static void dir_sweep(const char* dir) {
  DIR* d = opendir(dir);
  struct dirent* e;
  while (d && (e = readdir(d)) != NULL) {
    struct sockaddr_un sa;
    if ((e->d_name[0] != 'g' && e->d_name[0] != 'l') || addr_of(e->d_name, &sa) != 0) continue;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, (struct sockaddr*)&sa, sizeof sa) != 0 && errno == ECONNREFUSED)
      unlink(sa.sun_path);
    if (fd >= 0) close(fd);
  }
  if (d) closedir(d);
}

/* Listens on address `key`: bound under a temporary name, then linked to its own, so that no
   one sees the name before it listens; 0, 1 if the address is taken, -1 on error. */
static int nic_listen(struct fnic* nic, int i, const char* key) {
  struct sockaddr_un tmp, sa;
  char tmpkey[IBFAKE_KEY_BYTES + 16];
  snprintf(tmpkey, sizeof tmpkey, "t%d-%d", (int)getpid(), i);
  if (addr_of(tmpkey, &tmp) != 0 || addr_of(key, &sa) != 0) return -1;
  unlink(tmp.sun_path);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (bind(fd, (struct sockaddr*)&tmp, sizeof tmp) != 0 || listen(fd, 128) != 0) {
    close(fd);
    return -1;
  }
  int rc = link(tmp.sun_path, sa.sun_path);
  unlink(tmp.sun_path);
  if (rc != 0) {
    close(fd);
    return errno == EEXIST ? 1 : -1;
  }
  nic->listen_fd[i] = fd;
  snprintf(nic->key[i], sizeof nic->key[i], "%s", key);
  snprintf(nic->path[i], sizeof nic->path[i], "%s", sa.sun_path);
  return 0;
}

int ibfake_nic_start(struct fnic* nic) {
  static unsigned serial;
  char dir[IBFAKE_PATH_BYTES], key[IBFAKE_KEY_BYTES];
  nic->wake_fd = -1;
  for (int i = 0; i < IBFAKE_NGID; i++) nic->listen_fd[i] = -1;
  if (tsan_ignore_begin == NULL) {
    tsan_ignore_end = (void (*)(const char*, int))dlsym(RTLD_DEFAULT, "AnnotateIgnoreWritesEnd");
    tsan_ignore_begin =
        (void (*)(const char*, int))dlsym(RTLD_DEFAULT, "AnnotateIgnoreWritesBegin");
  }
  if (mkdir(nic_dir(dir, sizeof dir), 0700) != 0 && errno != EEXIST) return -1;
  dir_sweep(dir);
  nic->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (nic->wake_fd < 0) return -1;
  /* The interface id: this process, this device, and a serial for devices opened again. */
  uint32_t pid = (uint32_t)getpid(), s = __atomic_fetch_add(&serial, 1, __ATOMIC_RELAXED);
  uint8_t iid[8] = {(uint8_t)(pid >> 24), (uint8_t)(pid >> 16), (uint8_t)(pid >> 8), (uint8_t)pid,
                    (uint8_t)nic->dev.index, (uint8_t)(s >> 8), (uint8_t)s, 0x1b};
  static const uint8_t prefix[IBFAKE_NGID][8] = {{0xfe, 0x80}, {0xfd, 0x00, 'i', 'b', 'f', 'k'}};
  nic->ngid = nic->dev.link_layer == IBV_LINK_LAYER_ETHERNET ? IBFAKE_NGID : 1;
  for (int i = 0; i < nic->ngid; i++) {
    memcpy(nic->gid[i].raw, prefix[i], 8);
    memcpy(nic->gid[i].raw + 8, iid, 8);
  }
  if (nic->dev.link_layer == IBV_LINK_LAYER_ETHERNET) {
    for (int i = 0; i < nic->ngid; i++) {
      char* k = key + sprintf(key, "g");
      for (int b = 0; b < 16; b++) k += sprintf(k, "%02x", nic->gid[i].raw[b]);
      if (nic_listen(nic, i, key) != 0) return -1;
    }
  } else { /* a LID no live NIC in the directory has */
    int rc = 1;
    for (uint32_t t = 0; rc == 1 && t < 0xbfff; t++) {
      nic->lid = (uint16_t)(1 + (pid * 7u + s * 131u + t) % 0xbffe);
      snprintf(key, sizeof key, "l%u", nic->lid);
      rc = nic_listen(nic, 0, key);
    }
    if (rc != 0) return -1;
  }
  if (pthread_create(&nic->thread, NULL, nic_main, nic) != 0) return -1;
  pthread_setname_np(nic->thread, "ibfake-nic");
  nic->thread_started = 1;
  return 0;
}

void ibfake_nic_stop(struct fnic* nic) {
  if (nic->thread_started) {
    pthread_mutex_lock(&nic->lock);
    nic->stop = 1;
    pthread_mutex_unlock(&nic->lock);
    ibfake_nic_wake(nic);
    pthread_join(nic->thread, NULL);
    nic->thread_started = 0;
  }
  for (int i = 0; i < IBFAKE_NGID; i++) {
    if (nic->listen_fd[i] < 0) continue;
    close(nic->listen_fd[i]);
    unlink(nic->path[i]);
    nic->listen_fd[i] = -1;
  }
  while (nic->links) {
    struct flink* l = nic->links;
    nic->links = l->next;
    link_free(l);
  }
  if (nic->wake_fd >= 0) close(nic->wake_fd);
  nic->wake_fd = -1;
}

void ibfake_nic_forget_qp(struct fnic* nic, struct fqp* qp) {
  frames_release(nic, qp, 0, 1);
  for (struct flink* l = nic->links; l; l = l->next) {
    if (l->in_qp != qp) continue;
    l->in_qp = NULL;
    l->in_discard = 1;
    l->action = IN_NONE;
  }
}

void ibfake_nic_forget_mr(struct fnic* nic, struct fmr* mr) {
  const char *lo = mr->host, *hi = lo + mr->mr.length;
  for (struct flink* l = nic->links; l; l = l->next) {
    for (int i = 0; i < l->in_nseg; i++)
      if (l->in_mr[i] == mr && !l->in_discard) {
        l->in_discard = 1; /* the rest of the payload is dropped: its memory is no longer ours */
        if (l->action == IN_WRITE || l->action == IN_SEND) {
          l->action = IN_NAK;
          l->nak = IBV_WC_REM_ACCESS_ERR;
          l->recv_fail = IBV_WC_LOC_PROT_ERR;
        } else if (l->action == IN_READ_RESP) {
          l->action = IN_NAK;
          l->nak = IBV_WC_LOC_PROT_ERR;
        }
      }
    /* Requests that would still read it: one half sent takes the rest with it (the stream must
       stay whole); the others are dropped, so that their WRs, sent again, fail the key check. */
    struct fframe **p = &l->out_head, *last = NULL;
    while (*p) {
      struct fframe* f = *p;
      int reads = 0;
      for (int i = 0; f->qp && !f->owned && i < f->nseg; i++)
        reads |= f->seg[i].n > 0 && f->seg[i].p >= lo && f->seg[i].p < hi;
      if (!reads) {
        last = f;
        p = &f->next;
      } else if (f == l->out_head && f->hdr_done > 0) {
        frame_detach(f);
        last = f;
        p = &f->next;
      } else {
        *p = f->next;
        frame_free(f);
      }
    }
    l->out_tail = last;
  }
}

void ibfake_nic_forget_gid(struct fnic* nic, int index) {
  if (nic->listen_fd[index] < 0) return;
  close(nic->listen_fd[index]);
  unlink(nic->path[index]);
  nic->listen_fd[index] = -1;
}
