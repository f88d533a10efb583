/*
 * ibfake's queue pairs: creation with the sizes asked for, the RC state machine with the
 * attributes each transition requires and allows (as the kernel's ib_modify_qp_is_ok checks
 * them), posting work requests, polling completions, and the error state with its flush.
 * The NIC thread (ibfake_nic.c) moves the posted work; this file keeps the queues.
 */
#include "ibfake.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PSN_MASK 0xffffffu

int ibfake_psn_cmp(uint32_t a, uint32_t b) {
  uint32_t d = (a - b) & PSN_MASK;
  return d == 0 ? 0 : d < 0x800000u ? 1 : -1;
}

struct fwr* ibfake_sq_at(struct fqp* qp, uint32_t pos) {
  return &qp->sq[pos % qp->cap.max_send_wr];
}

struct fqp* ibfake_qp_find(struct fnic* nic, uint32_t qpn) {
  for (struct fqp* q = nic->qps; q; q = q->next)
    if (q->qp.qp_num == qpn) return q;
  return NULL;
}

static enum ibv_wc_opcode wc_opcode(enum ibv_wr_opcode op) {
  return op == IBV_WR_RDMA_READ ? IBV_WC_RDMA_READ
       : op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM ? IBV_WC_SEND : IBV_WC_RDMA_WRITE;
}

/* Completes send WR `wr` with `status`: a completion if it asked for one or failed. */
static void sq_complete(struct fqp* qp, struct fwr* wr, enum ibv_wc_status status) {
  if (status != IBV_WC_SUCCESS || wr->signaled || qp->sq_sig_all) {
    struct ibv_wc wc = {.wr_id = wr->wr_id, .status = status, .opcode = wc_opcode(wr->op),
                        .byte_len = (uint32_t)wr->len, .qp_num = qp->qp.qp_num};
    ibfake_cq_push(qp->scq, &wc);
  }
  free(wr->inline_data);
  wr->inline_data = NULL;
}

static void rq_flush(struct fqp* qp) {
  for (; qp->rq_head != qp->rq_tail; qp->rq_head++) {
    struct frecv* r = &qp->rq[qp->rq_head % qp->cap.max_recv_wr];
    struct ibv_wc wc = {.wr_id = r->wr_id, .status = IBV_WC_WR_FLUSH_ERR, .opcode = IBV_WC_RECV,
                        .qp_num = qp->qp.qp_num};
    ibfake_cq_push(qp->rcq, &wc);
  }
}

void ibfake_qp_fail(struct fqp* qp, enum ibv_wc_status status, const char* why) {
  struct fnic* nic = (struct fnic*)qp->qp.context;
  ibfake_log(nic, "qp=0x%x ERR status=%d (%s) reason=%s", qp->qp.qp_num, (int)status,
             ibv_wc_status_str(status), why);
  qp->qp.state = IBV_QPS_ERR;
  for (; qp->sq_head != qp->sq_tail; qp->sq_head++, status = IBV_WC_WR_FLUSH_ERR)
    sq_complete(qp, ibfake_sq_at(qp, qp->sq_head), status);
  qp->sq_sent = qp->sq_tail;
  qp->deadline = 0;
  rq_flush(qp);
}

void ibfake_qp_acked(struct fqp* qp, uint32_t psn) {
  uint32_t head = qp->sq_head;
  for (; qp->sq_head != qp->sq_sent; qp->sq_head++) {
    struct fwr* wr = ibfake_sq_at(qp, qp->sq_head);
    if (ibfake_psn_cmp(wr->psn, psn) > 0) break;
    sq_complete(qp, wr, IBV_WC_SUCCESS);
  }
  if (qp->sq_head == head) return; /* nothing new: the retry counts go on */
  /* Forward progress: the counts start again, and so does the wait for the rest. */
  qp->retries_left = qp->retry_cnt;
  qp->rnr_left = qp->rnr_retry;
  qp->deadline = qp->sq_head != qp->sq_sent ? ibfake_now() + ibfake_timeout_sec(qp->timeout) : 0;
}

/* ------------------------------------------------------------- create */

IBFAKE_EXPORT struct ibv_qp* ibv_create_qp(struct ibv_pd* pd, struct ibv_qp_init_attr* init) {
  struct fnic* nic = (struct fnic*)pd->context;
  struct ibv_qp_cap* cap = &init->cap;
  if (init->qp_type != IBV_QPT_RC || init->srq != NULL) {
    ibfake_log(nic, "create_qp refused: only RC queue pairs without a shared receive queue");
    errno = EOPNOTSUPP;
    return NULL;
  }
  if (init->send_cq == NULL || init->recv_cq == NULL || init->send_cq->context != pd->context ||
      init->recv_cq->context != pd->context || cap->max_send_wr == 0 ||
      cap->max_send_wr > (1u << 15) || cap->max_recv_wr == 0 || cap->max_recv_wr > (1u << 15) ||
      cap->max_send_sge > IBFAKE_MAX_SGE || cap->max_recv_sge > IBFAKE_MAX_SGE ||
      cap->max_inline_data > 256) {
    ibfake_log(nic, "create_qp refused: invalid queues or sizes");
    errno = EINVAL;
    return NULL;
  }
  struct fqp* qp = calloc(1, sizeof *qp);
  if (qp) qp->sq = calloc(cap->max_send_wr, sizeof *qp->sq);
  if (qp && qp->sq) qp->rq = calloc(cap->max_recv_wr, sizeof *qp->rq);
  if (qp == NULL || qp->sq == NULL || qp->rq == NULL) {
    if (qp) free(qp->sq);
    free(qp);
    errno = ENOMEM;
    return NULL;
  }
  qp->qp.context = pd->context;
  qp->qp.qp_context = init->qp_context;
  qp->qp.pd = pd;
  qp->qp.send_cq = init->send_cq;
  qp->qp.recv_cq = init->recv_cq;
  qp->qp.qp_type = IBV_QPT_RC;
  qp->qp.state = IBV_QPS_RESET;
  pthread_mutex_init(&qp->qp.mutex, NULL);
  pthread_cond_init(&qp->qp.cond, NULL);
  qp->scq = (struct fcq*)init->send_cq;
  qp->rcq = (struct fcq*)init->recv_cq;
  qp->sq_sig_all = init->sq_sig_all;
  qp->cap = *cap;
  pthread_mutex_lock(&nic->lock);
  qp->qp.qp_num = qp->qp.handle = nic->next_qpn++ & PSN_MASK;
  qp->scq->nqp++;
  qp->rcq->nqp++;
  qp->next = nic->qps;
  nic->qps = qp;
  pthread_mutex_unlock(&nic->lock);
  ibfake_log(nic, "qp=0x%x create type=RC max_send_wr=%u max_recv_wr=%u max_send_sge=%u "
             "max_recv_sge=%u max_inline_data=%u sq_sig_all=%d same_cq=%d", qp->qp.qp_num,
             cap->max_send_wr, cap->max_recv_wr, cap->max_send_sge, cap->max_recv_sge,
             cap->max_inline_data, init->sq_sig_all, init->send_cq == init->recv_cq);
  return &qp->qp;
}

IBFAKE_EXPORT int ibv_destroy_qp(struct ibv_qp* ibqp) {
  struct fnic* nic = (struct fnic*)ibqp->context;
  struct fqp* qp = (struct fqp*)ibqp;
  pthread_mutex_lock(&nic->lock);
  for (struct fqp** p = &nic->qps; *p; p = &(*p)->next) {
    if (*p != qp) continue;
    *p = qp->next;
    break;
  }
  ibfake_nic_forget_qp(nic, qp);
  qp->scq->nqp--;
  qp->rcq->nqp--;
  for (uint32_t i = qp->sq_head; i != qp->sq_tail; i++) free(ibfake_sq_at(qp, i)->inline_data);
  pthread_mutex_unlock(&nic->lock);
  ibfake_log(nic, "qp=0x%x destroy", qp->qp.qp_num);
  pthread_mutex_destroy(&qp->qp.mutex);
  pthread_cond_destroy(&qp->qp.cond);
  free(qp->sq);
  free(qp->rq);
  free(qp);
  return 0;
}

/* ------------------------------------------------------------- modify */

/* The attributes transition cur -> next requires and allows for RC; -1: not a transition. */
static int qp_transition(enum ibv_qp_state cur, enum ibv_qp_state next, int* req, int* opt) {
  *req = *opt = 0;
  if (next == IBV_QPS_RESET || next == IBV_QPS_ERR) return 0;
  if (cur == IBV_QPS_RESET && next == IBV_QPS_INIT) {
    *req = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
  } else if (cur == IBV_QPS_INIT && next == IBV_QPS_INIT) {
    *opt = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
  } else if (cur == IBV_QPS_INIT && next == IBV_QPS_RTR) {
    *req = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
           IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    *opt = IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX;
  } else if (cur == IBV_QPS_RTR && next == IBV_QPS_RTS) {
    *req = IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
           IBV_QP_MAX_QP_RD_ATOMIC;
    *opt = IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER |
           IBV_QP_PATH_MIG_STATE;
  } else if (cur == IBV_QPS_RTS && next == IBV_QPS_RTS) {
    *opt = IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE |
           IBV_QP_MIN_RNR_TIMER;
  } else {
    return -1;
  }
  return 0;
}

/* The address vector: where the QP sends (its peer's address key) and from which of our GIDs. */
static const char* qp_set_av(struct fnic* nic, struct fqp* qp, const struct ibv_ah_attr* ah) {
  if (ah->port_num != 1) return "address vector on a port other than 1";
  if (nic->dev.link_layer == IBV_LINK_LAYER_ETHERNET) {
    if (!ah->is_global) return "RoCE needs a GRH (is_global)";
    if (ah->grh.sgid_index >= nic->ngid) return "sgid_index beyond the GID table";
    if (nic->gid_gone[ah->grh.sgid_index]) return "sgid_index names an empty GID table entry";
    char* k = qp->dest_key;
    k += sprintf(k, "g");
    for (int i = 0; i < 16; i++) k += sprintf(k, "%02x", ah->grh.dgid.raw[i]);
    qp->sgid_index = ah->grh.sgid_index;
  } else {
    if (ah->dlid == 0) return "InfiniBand needs a destination LID";
    snprintf(qp->dest_key, sizeof qp->dest_key, "l%u", ah->dlid);
    qp->sgid_index = 0;
  }
  qp->ah = *ah;
  return NULL;
}

/* Applies the attributes in `mask`; NULL, or why they are invalid. */
static const char* qp_apply(struct fnic* nic, struct fqp* qp, const struct ibv_qp_attr* a,
                            int mask) {
  const char* why = NULL;
  if ((mask & IBV_QP_PKEY_INDEX) && a->pkey_index != 0)
    return "pkey_index beyond the table (1 entry)";
  if ((mask & IBV_QP_PORT) && a->port_num != 1) return "no such port";
  if ((mask & IBV_QP_PATH_MTU) && (a->path_mtu < IBV_MTU_256 || a->path_mtu > nic->dev.mtu))
    return "path_mtu above the port's active MTU";
  if ((mask & IBV_QP_TIMEOUT) && a->timeout > 31) return "timeout above 31";
  if ((mask & IBV_QP_RETRY_CNT) && a->retry_cnt > 7) return "retry_cnt above 7";
  if ((mask & IBV_QP_RNR_RETRY) && a->rnr_retry > 7) return "rnr_retry above 7";
  if ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && a->max_rd_atomic > 16) return "max_rd_atomic above 16";
  if ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && a->max_dest_rd_atomic > 16)
    return "max_dest_rd_atomic above 16";
  if ((mask & IBV_QP_DEST_QPN) && a->dest_qp_num > PSN_MASK) return "dest_qp_num above 24 bits";
  if ((mask & IBV_QP_AV) && (why = qp_set_av(nic, qp, &a->ah_attr)) != NULL) return why;
  if (mask & IBV_QP_PKEY_INDEX) qp->pkey_index = a->pkey_index;
  if (mask & IBV_QP_PORT) qp->port = a->port_num;
  if (mask & IBV_QP_ACCESS_FLAGS) qp->access = (int)a->qp_access_flags;
  if (mask & IBV_QP_PATH_MTU) qp->mtu = a->path_mtu;
  if (mask & IBV_QP_DEST_QPN) qp->dest_qpn = a->dest_qp_num;
  if (mask & IBV_QP_RQ_PSN) qp->rq_psn = qp->epsn = a->rq_psn & PSN_MASK;
  if (mask & IBV_QP_SQ_PSN) qp->sq_psn = qp->next_psn = a->sq_psn & PSN_MASK;
  if (mask & IBV_QP_MAX_DEST_RD_ATOMIC) qp->max_dest_rd_atomic = a->max_dest_rd_atomic;
  if (mask & IBV_QP_MAX_QP_RD_ATOMIC) qp->max_rd_atomic = a->max_rd_atomic;
  if (mask & IBV_QP_MIN_RNR_TIMER) qp->min_rnr_timer = a->min_rnr_timer;
  if (mask & IBV_QP_TIMEOUT) qp->timeout = a->timeout;
  if (mask & IBV_QP_RETRY_CNT) qp->retry_cnt = qp->retries_left = a->retry_cnt;
  if (mask & IBV_QP_RNR_RETRY) qp->rnr_retry = qp->rnr_left = a->rnr_retry;
  return NULL;
}

static void qp_log_state(struct fnic* nic, struct fqp* qp, enum ibv_qp_state next) {
  const struct ibv_ah_attr* ah = &qp->ah;
  char dgid[40], *k = dgid;
  for (int i = 0; i < 16; i++) k += sprintf(k, "%02x", ah->grh.dgid.raw[i]);
  if (next == IBV_QPS_INIT)
    ibfake_log(nic, "qp=0x%x INIT port=%d pkey_index=%d access=0x%x", qp->qp.qp_num, qp->port,
               qp->pkey_index, qp->access);
  else if (next == IBV_QPS_RTR)
    ibfake_log(nic, "qp=0x%x RTR path_mtu=%d dest_qp=0x%x rq_psn=%u max_dest_rd_atomic=%u "
               "min_rnr_timer=%u is_global=%d sgid_index=%u traffic_class=%u hop_limit=%u "
               "flow_label=%u sl=%u dlid=%u static_rate=%u dgid=%s dest=%s", qp->qp.qp_num,
               (int)qp->mtu, qp->dest_qpn, qp->rq_psn, qp->max_dest_rd_atomic, qp->min_rnr_timer,
               ah->is_global, ah->grh.sgid_index, ah->grh.traffic_class, ah->grh.hop_limit,
               ah->grh.flow_label, ah->sl, ah->dlid, ah->static_rate, dgid, qp->dest_key);
  else if (next == IBV_QPS_RTS)
    ibfake_log(nic, "qp=0x%x RTS timeout=%u retry_cnt=%u rnr_retry=%u sq_psn=%u max_rd_atomic=%u",
               qp->qp.qp_num, qp->timeout, qp->retry_cnt, qp->rnr_retry, qp->sq_psn,
               qp->max_rd_atomic);
}

IBFAKE_EXPORT int ibv_modify_qp(struct ibv_qp* ibqp, struct ibv_qp_attr* attr, int mask) {
  struct fnic* nic = (struct fnic*)ibqp->context;
  struct fqp* qp = (struct fqp*)ibqp;
  int req = 0, opt = 0, err = 0;
  const char* why = NULL;
  pthread_mutex_lock(&nic->lock);
  enum ibv_qp_state cur = qp->qp.state;
  enum ibv_qp_state next = (mask & IBV_QP_STATE) ? attr->qp_state : cur;
  if ((mask & IBV_QP_CUR_STATE) && attr->cur_qp_state != cur) why = "cur_qp_state is not the state";
  else if (qp_transition(cur, next, &req, &opt) != 0) why = "not a transition of an RC queue pair";
  else if ((mask & req) != req) why = "required attributes missing";
  else if (mask & ~(req | opt | IBV_QP_STATE)) why = "attributes this transition does not take";
  else why = qp_apply(nic, qp, attr, mask);
  if (why) {
    ibfake_log(nic, "qp=0x%x modify refused %d->%d mask=0x%x required=0x%x allowed=0x%x: %s",
               qp->qp.qp_num, (int)cur, (int)next, mask, req, req | opt, why);
    err = EINVAL;
  } else if (next == IBV_QPS_ERR) {
    ibfake_qp_fail(qp, IBV_WC_WR_FLUSH_ERR, "modify_qp to ERR");
  } else {
    if (next == IBV_QPS_RESET) { /* discards every work request without a completion */
      for (uint32_t i = qp->sq_head; i != qp->sq_tail; i++) free(ibfake_sq_at(qp, i)->inline_data);
      qp->sq_head = qp->sq_sent = qp->sq_tail = 0;
      qp->rq_head = qp->rq_tail = 0;
      qp->deadline = 0;
    }
    qp->qp.state = next;
    qp_log_state(nic, qp, next);
  }
  pthread_mutex_unlock(&nic->lock);
  return err;
}

/* ------------------------------------------------------------ posting */

static int wr_copy(struct fqp* qp, const struct ibv_send_wr* w, struct fwr* out) {
  if (w->num_sge < 0 || w->num_sge > (int)qp->cap.max_send_sge) return EINVAL;
  if (w->opcode != IBV_WR_RDMA_WRITE && w->opcode != IBV_WR_RDMA_WRITE_WITH_IMM &&
      w->opcode != IBV_WR_SEND && w->opcode != IBV_WR_SEND_WITH_IMM &&
      w->opcode != IBV_WR_RDMA_READ)
    return EINVAL;
  memset(out, 0, sizeof *out);
  out->wr_id = w->wr_id;
  out->op = w->opcode;
  out->signaled = (w->send_flags & IBV_SEND_SIGNALED) != 0;
  out->nsge = w->num_sge;
  for (int i = 0; i < w->num_sge; i++) {
    out->sge[i] = w->sg_list[i];
    out->len += w->sg_list[i].length;
  }
  out->raddr = w->wr.rdma.remote_addr;
  out->rkey = w->wr.rdma.rkey;
  out->imm = w->imm_data;
  if ((w->send_flags & IBV_SEND_INLINE) && w->opcode != IBV_WR_RDMA_READ) {
    if (out->len > qp->cap.max_inline_data) return EINVAL;
    out->inline_data = malloc(out->len ? out->len : 1);
    if (out->inline_data == NULL) return ENOMEM;
    for (int i = 0, off = 0; i < w->num_sge; off += (int)w->sg_list[i].length, i++)
      memcpy(out->inline_data + off, (void*)(uintptr_t)w->sg_list[i].addr, w->sg_list[i].length);
  }
  return 0;
}

/* Send work requests accepted in this process, by opcode (ibfake_posted). */
static long posted[16];

IBFAKE_EXPORT long ibfake_posted(int opcode) {
  return opcode >= 0 && opcode < 16 ? __atomic_load_n(&posted[opcode], __ATOMIC_RELAXED) : -1;
}

static int qp_post_send(struct ibv_qp* ibqp, struct ibv_send_wr* wr, struct ibv_send_wr** bad) {
  struct fnic* nic = (struct fnic*)ibqp->context;
  struct fqp* qp = (struct fqp*)ibqp;
  int err = 0;
  pthread_mutex_lock(&nic->lock);
  for (; wr; wr = wr->next) {
    struct fwr w;
    if (qp->qp.state != IBV_QPS_RTS && qp->qp.state != IBV_QPS_ERR) err = EINVAL;
    else if (qp->sq_tail - qp->sq_head == qp->cap.max_send_wr) err = ENOMEM;
    else err = wr_copy(qp, wr, &w);
    if (err) break;
    if ((unsigned)w.op < 16) __atomic_add_fetch(&posted[w.op], 1, __ATOMIC_RELAXED);
    if (qp->qp.state == IBV_QPS_ERR) { /* completes at once, flushed */
      sq_complete(qp, &w, IBV_WC_WR_FLUSH_ERR);
      continue;
    }
    w.psn = qp->next_psn;
    qp->next_psn = (qp->next_psn + 1) & PSN_MASK;
    *ibfake_sq_at(qp, qp->sq_tail++) = w;
  }
  if (err) {
    *bad = wr;
    ibfake_log(nic, "qp=0x%x post_send refused: %s (state %d)", qp->qp.qp_num, strerror(err),
               (int)qp->qp.state);
  }
  pthread_mutex_unlock(&nic->lock);
  ibfake_nic_wake(nic);
  return err;
}

static int qp_post_recv(struct ibv_qp* ibqp, struct ibv_recv_wr* wr, struct ibv_recv_wr** bad) {
  struct fnic* nic = (struct fnic*)ibqp->context;
  struct fqp* qp = (struct fqp*)ibqp;
  int err = 0;
  pthread_mutex_lock(&nic->lock);
  for (; wr; wr = wr->next) {
    if (qp->qp.state == IBV_QPS_RESET || wr->num_sge < 0 || wr->num_sge > (int)qp->cap.max_recv_sge)
      err = EINVAL;
    else if (qp->rq_tail - qp->rq_head == qp->cap.max_recv_wr)
      err = ENOMEM;
    if (err) break;
    struct frecv* r = &qp->rq[qp->rq_tail++ % qp->cap.max_recv_wr];
    r->wr_id = wr->wr_id;
    r->nsge = wr->num_sge;
    if (wr->num_sge > 0) memcpy(r->sge, wr->sg_list, sizeof *r->sge * (size_t)wr->num_sge);
    if (qp->qp.state == IBV_QPS_ERR) rq_flush(qp);
  }
  if (err) {
    *bad = wr;
    ibfake_log(nic, "qp=0x%x post_recv refused: %s", qp->qp.qp_num, strerror(err));
  }
  pthread_mutex_unlock(&nic->lock);
  return err;
}

static int cq_poll(struct ibv_cq* ibcq, int n, struct ibv_wc* wc) {
  struct fnic* nic = (struct fnic*)ibcq->context;
  struct fcq* cq = (struct fcq*)ibcq;
  int got = 0;
  pthread_mutex_lock(&nic->lock);
  if (cq->overflow) got = -1;
  for (; got >= 0 && got < n && cq->count > 0; got++) {
    wc[got] = cq->wc[cq->head];
    cq->head = (cq->head + 1) % cq->cap;
    cq->count--;
  }
  pthread_mutex_unlock(&nic->lock);
  return got;
}

static int cq_req_notify(struct ibv_cq* cq, int solicited_only) { return EOPNOTSUPP; }
static int srq_post_recv(struct ibv_srq* srq, struct ibv_recv_wr* wr, struct ibv_recv_wr** bad) {
  *bad = wr;
  return EOPNOTSUPP;
}
static struct ibv_mw* mw_alloc(struct ibv_pd* pd, enum ibv_mw_type type) {
  errno = EOPNOTSUPP;
  return NULL;
}
static int mw_bind(struct ibv_qp* qp, struct ibv_mw* mw, struct ibv_mw_bind* bind) {
  return EOPNOTSUPP;
}
static int mw_dealloc(struct ibv_mw* mw) { return EOPNOTSUPP; }

void ibfake_qp_ops_fill(struct ibv_context_ops* ops) {
  memset(ops, 0, sizeof *ops);
  ops->poll_cq = cq_poll;             /* ibv_poll_cq */
  ops->req_notify_cq = cq_req_notify; /* no completion channels: polling only */
  ops->post_send = qp_post_send;      /* ibv_post_send */
  ops->post_recv = qp_post_recv;      /* ibv_post_recv */
  ops->post_srq_recv = srq_post_recv; /* no shared receive queues */
  ops->alloc_mw = mw_alloc;           /* no memory windows */
  ops->bind_mw = mw_bind;
  ops->dealloc_mw = mw_dealloc;
}
