/*
 * ibfake: a userspace verbs provider written for tests (README.md says what it is for and what
 * it cannot show). Braid's IB backend loads it in place of libibverbs.so.1 when
 * BRAID_IB_VERBS_LIB names it; it exports the libibverbs functions the backend looks up with
 * dlsym, and fills the context's ops table (post_send, post_recv, poll_cq) that verbs.h's inline
 * functions jump through. Objects are laid out as rdma-core's verbs.h declares them: each fake
 * object starts with the verbs struct the application holds.
 *
 * Each opened device is a "NIC": a thread that owns Unix stream sockets in IBFAKE_DIR, one
 * listening per address (a GID on RoCE, the LID on InfiniBand) and one per peer NIC it talks
 * to. RDMA writes, sends and reads travel as frames; the responder checks the rkey and bounds
 * against its own registrations and copies into its own memory (ibfake_nic.c).
 *
 *   ibfake_dev.c  configuration, devices, contexts, PDs, MRs, CQs, the attribute log
 *   ibfake_qp.c   queue pairs: the RC state machine, posting, completions, the error state
 *   ibfake_nic.c  the NIC thread: links, frames, responder checks, acks, retries, timeouts
 *
 * Locking: one mutex per context (fnic.lock) guards every object of that context; verbs
 * calls take it, and so does the NIC thread while it handles a socket event.
 */
#ifndef IBFAKE_H
#define IBFAKE_H

#include <infiniband/verbs.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define IBFAKE_EXPORT __attribute__((visibility("default")))
#define IBFAKE_MAX_DEVS 8
#define IBFAKE_MAX_SGE 4
#define IBFAKE_KEY_BYTES 40 /* an address as text: "g" and 32 hex digits, or "l" and a LID */
#define IBFAKE_NGID 2       /* RoCE: index 0 link-local, index 1 a unique local address */
#define IBFAKE_PATH_BYTES 108

/* Configuration of one device, read from the environment by ibv_get_device_list. */
struct fdev {
  struct ibv_device ibdev; /* first: what ibv_get_device_list hands out */
  int index;
  enum ibv_port_state state;
  enum ibv_mtu mtu;
  int link_layer; /* IBV_LINK_LAYER_ETHERNET (RoCE) or IBV_LINK_LAYER_INFINIBAND */
};

struct fqp;
struct fmr;
struct flink;

/* An opened device: the context the application holds, and its NIC. */
struct fnic {
  struct ibv_context ctx; /* first */
  struct fdev dev;        /* a copy of the configuration at open */
  pthread_mutex_t lock;
  pthread_t thread;
  int thread_started;
  int wake_fd; /* eventfd: work was posted */
  int stop;
  int ngid;
  union ibv_gid gid[IBFAKE_NGID];
  uint16_t lid;
  int listen_fd[IBFAKE_NGID];
  char key[IBFAKE_NGID][IBFAKE_KEY_BYTES]; /* this NIC's addresses, one per GID (or the LID) */
  char path[IBFAKE_NGID][IBFAKE_PATH_BYTES];
  int gid_gone[IBFAKE_NGID]; /* entries removed after open (ibfake_del_gid): all zero now */
  uint32_t next_qpn, next_key;
  struct fnic* next_open;    /* the process's open contexts (ibfake_dev.c) */
  struct fqp* qps;
  struct fmr* mrs;
  struct flink* links;
  int npd, ncq;
};

struct fpd {
  struct ibv_pd pd; /* first */
};

struct fmr {
  struct ibv_mr mr; /* first */
  struct fmr* next;
  int access;
  char* host;     /* where the NIC finds byte mr.addr: mr.addr itself, or a dma-buf's mapping */
  size_t map_len; /* a dma-buf's mapping (munmap at deregistration); 0 for host memory */
};

struct fcq {
  struct ibv_cq cq; /* first */
  struct ibv_wc* wc;
  int cap, head, count;
  int overflow; /* more completions than entries: the CQ is in error */
  int nqp;
};

/* A send work request, copied when posted. */
struct fwr {
  uint64_t wr_id;
  enum ibv_wr_opcode op;
  int signaled;
  int nsge;
  struct ibv_sge sge[IBFAKE_MAX_SGE];
  uint64_t len;
  uint64_t raddr;
  uint32_t rkey;
  uint32_t imm; /* as posted: the application's byte order */
  uint32_t psn;
  char* inline_data; /* IBV_SEND_INLINE: the data, owned */
};

struct frecv {
  uint64_t wr_id;
  int nsge;
  struct ibv_sge sge[IBFAKE_MAX_SGE];
};

struct fqp {
  struct ibv_qp qp; /* first */
  struct fqp* next;
  struct fcq *scq, *rcq;
  int sq_sig_all;
  struct ibv_qp_cap cap;
  /* What modify_qp set. */
  int access, port, pkey_index;
  enum ibv_mtu mtu;
  uint32_t dest_qpn, rq_psn, sq_psn;
  struct ibv_ah_attr ah;
  uint8_t timeout, retry_cnt, rnr_retry, min_rnr_timer, max_rd_atomic, max_dest_rd_atomic;
  char dest_key[IBFAKE_KEY_BYTES];
  int sgid_index; /* the source address: index into nic->key */
  /* Send queue: positions are counters, entry i at sq[i % max_send_wr]. Between head and
     sent: on the wire, not acknowledged; between sent and tail: not sent yet. */
  struct fwr* sq;
  uint32_t sq_head, sq_sent, sq_tail;
  uint32_t next_psn;
  struct frecv* rq;
  uint32_t rq_head, rq_tail;
  uint32_t epsn;      /* responder: the PSN expected next */
  double deadline;    /* requester: no answer by then is a timeout (0: none pending) */
  int retries_left;   /* timeouts still allowed */
  int rnr_left;       /* receiver-not-ready answers still allowed (rnr_retry 7: no limit) */
  double resume_at;   /* after a receiver-not-ready answer: no sending before then */
  int queued_frames;  /* frames of this QP waiting in a link's output */
};

/* ----------------------------------------------------------- ibfake_dev.c */

/* Appends one line to the attribute log (IBFAKE_LOG), prefixed with pid and device. */
void ibfake_log(const struct fnic* nic, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
/* Seconds a QP waits for an answer before a retry: 4.096 us * 2^timeout / IBFAKE_TIME_SCALE,
   at least IBFAKE_MIN_WINDOW_MS; 0 for timeout 0 (wait forever). */
double ibfake_timeout_sec(uint8_t timeout);
/* The registration `key` of `pd` covering [addr, addr+len) with `access`; NULL if none. */
struct fmr* ibfake_mr_find(struct fnic* nic, struct ibv_pd* pd, uint32_t key, uint64_t addr,
                           uint64_t len, int access);
/* Where the NIC reads or writes address `addr` of registration `mr` (inside it). */
char* ibfake_mr_ptr(const struct fmr* mr, uint64_t addr);
/* Whether requests needing a receive are to be answered receiver-not-ready though one is
   posted (IBFAKE_RNR counts them down, for the whole process). */
int ibfake_force_rnr(void);
double ibfake_now(void);
/* Whether requests arriving here are dropped (ibfake_set_drop, IBFAKE_DROP). */
int ibfake_dropping(void);
/* Exported for tests, found with dlsym: turns dropping on or off. */
IBFAKE_EXPORT void ibfake_set_drop(int on);
/* Exported for tests: the port of device `dev` (ibfake<dev>) changes under the application, in
   this process's open contexts: its active MTU becomes `mtu` bytes (a link that came back with
   a smaller MTU), or GID table entry `index` is removed (its address was deleted). 0, or -1. */
IBFAKE_EXPORT int ibfake_set_mtu(int dev, int mtu);
IBFAKE_EXPORT int ibfake_del_gid(int dev, int index);
/* Exported for tests: how many send work requests with `opcode` (enum ibv_wr_opcode) this
   process's queue pairs accepted. */
IBFAKE_EXPORT long ibfake_posted(int opcode);

/* ------------------------------------------------------------ ibfake_qp.c */

/* Adds a completion to `cq` (the caller holds the lock). */
void ibfake_cq_push(struct fcq* cq, const struct ibv_wc* wc);
/* Completes the first send WR with `status`, moves the QP to the error state and flushes the
   rest of its send and receive queues. */
void ibfake_qp_fail(struct fqp* qp, enum ibv_wc_status status, const char* why);
/* Requester: the send WRs up to PSN `psn` (included) are acknowledged. */
void ibfake_qp_acked(struct fqp* qp, uint32_t psn);
struct fqp* ibfake_qp_find(struct fnic* nic, uint32_t qpn);
/* PSN order with wrap-around (24 bits): <0 a before b, 0 equal, >0 after. */
int ibfake_psn_cmp(uint32_t a, uint32_t b);
struct fwr* ibfake_sq_at(struct fqp* qp, uint32_t pos);
void ibfake_qp_ops_fill(struct ibv_context_ops* ops);

/* ----------------------------------------------------------- ibfake_nic.c */

/* Binds this NIC's addresses and starts its thread; 0, or -1 with errno. */
int ibfake_nic_start(struct fnic* nic);
void ibfake_nic_stop(struct fnic* nic);
/* Wakes the NIC thread: work was posted. */
void ibfake_nic_wake(struct fnic* nic);
/* A QP is being destroyed: drop its frames and anything arriving for it (lock held). */
void ibfake_nic_forget_qp(struct fnic* nic, struct fqp* qp);
/* A registration is going away: payloads landing in it are discarded, and frames not started
   that would read it are dropped (lock held). */
void ibfake_nic_forget_mr(struct fnic* nic, struct fmr* mr);
/* GID entry `index` is gone: its address stops listening (lock held). */
void ibfake_nic_forget_gid(struct fnic* nic, int index);

#endif
