/*
 * The IB backend's verbs-level state (built only with infiniband/verbs.h):
 * libibverbs' entry points loaded with dlopen, the devices (one per active
 * port BRAID_IB_HCA selects), and the comms. Calls go through `ibv_fn`, never
 * through verbs.h's wrapper macros, so the library has no link dependency;
 * the data-path calls (post_send, post_recv, poll_cq) are verbs.h's inline
 * functions, which jump through the device context's own table.
 */
#ifndef BRAID_TRANSPORT_NET_IB_VERBS_H
#define BRAID_TRANSPORT_NET_IB_VERBS_H

#include <infiniband/verbs.h>
#include <pthread.h>

#include "base/socket.h"
#include "transport/net.h"
#include "transport/net_ib.h"

struct ib_fns {
  struct ibv_device** (*get_device_list)(int*);
  void (*free_device_list)(struct ibv_device**);
  const char* (*get_device_name)(struct ibv_device*);
  struct ibv_context* (*open_device)(struct ibv_device*);
  int (*close_device)(struct ibv_context*);
  int (*query_device)(struct ibv_context*, struct ibv_device_attr*);
  int (*query_port)(struct ibv_context*, uint8_t, struct ibv_port_attr*);
  int (*query_gid)(struct ibv_context*, uint8_t, int, union ibv_gid*);
  struct ibv_pd* (*alloc_pd)(struct ibv_context*);
  int (*dealloc_pd)(struct ibv_pd*);
  struct ibv_mr* (*reg_mr)(struct ibv_pd*, void*, size_t, int);
  struct ibv_mr* (*reg_dmabuf_mr)(struct ibv_pd*, uint64_t, size_t, uint64_t, int, int); /* may be NULL */
  struct ibv_mr* (*reg_mr_iova2)(struct ibv_pd*, void*, size_t, uint64_t, unsigned); /* may be NULL */
  int (*dereg_mr)(struct ibv_mr*);
  struct ibv_cq* (*create_cq)(struct ibv_context*, int, void*, struct ibv_comp_channel*, int);
  int (*destroy_cq)(struct ibv_cq*);
  struct ibv_qp* (*create_qp)(struct ibv_pd*, struct ibv_qp_init_attr*);
  int (*destroy_qp)(struct ibv_qp*);
  int (*modify_qp)(struct ibv_qp*, struct ibv_qp_attr*, int);
  const char* (*wc_status_str)(enum ibv_wc_status);
};
extern struct ib_fns ibv_fn;

/* Loads libibverbs.so.1; 0 on success, else -1 with the reason in `why`. */
int ib_verbs_load(char* why, size_t why_size);

struct ib_dev {
  char name[64];          /* "mlx5_0:1" */
  char ibname[64];        /* "mlx5_0" */
  int port;
  struct ibv_context* ctx;
  struct ibv_pd* pd;
  int link_layer;         /* IBV_LINK_LAYER_* */
  uint16_t lid;
  int gid_index;          /* -1 on InfiniBand without GRH */
  union ibv_gid gid;
  enum ibv_mtu mtu;
  int speed_mbps;
  unsigned ptr_support;
  char pci_path[256];
  int ar;                 /* adaptive routing: data and immediate as separate writes */
};

#define IB_MAX_REQS 32
#define IB_MAX_QPS 16 /* BRAID_IB_QPS_PER_CONNECTION's upper bound */
#define IB_MAGIC 0x42444942u /* "BIDB" */
/* 2: the listener's answer carries the key too; 3: several queue pairs, the sender's traffic
   class and service level, and refusals that say why */
#define IB_VERSION 3

/* What a connection's end tells the other: its queue pairs and where they are. */
struct __attribute__((packed)) ib_qp_info {
  uint32_t qpn[IB_MAX_QPS]; /* the first nqps are used */
  uint32_t psn;
  uint16_t lid;
  uint8_t link_layer;
  uint8_t mtu;
  uint8_t gid[16];
  uint64_t cts_addr; /* sender: its CTS FIFO */
  uint32_t cts_rkey;
  uint8_t nqps;      /* BRAID_IB_QPS_PER_CONNECTION: both ends must agree */
  uint8_t tc;        /* the sender's traffic class and service level, used by both ends */
  uint8_t sl;
  uint8_t pad;
};

#define IB_WHY_BYTES 320

struct __attribute__((packed)) ib_hello {
  uint32_t magic;
  uint16_t version;
  uint16_t refused; /* an answer: 1 when the listener refused the connection, for `why` */
  uint8_t key[BRAID_NET_KEY_BYTES]; /* zeros in a refusal */
  struct ib_qp_info info;
  char why[IB_WHY_BYTES]; /* a refusal's reason, NUL-terminated */
};

/* One clear-to-send entry: where the receiver's buffer for message `seq` is. */
struct ib_cts {
  uint64_t addr;
  uint32_t rkey;
  uint32_t size;
  uint64_t seq1; /* seq + 1, written last; 0: empty */
  uint64_t pad;
};

struct ib_comm;

struct ib_req {
  struct ib_comm* comm;
  int used, done;
  int pending;  /* sender, flush: signaled completions still to come (one per queue pair) */
  int pieces;   /* receiver: immediates arrived (one per queue pair) */
  uint32_t got; /* receiver: the message's size, as its immediates say */
  size_t size;
};

struct ib_comm {
  int dev;
  int is_send;
  int fd;                       /* the handshake's TCP socket: liveness */
  char peer[80];
  struct ibv_cq* cq;
  int nqps;                     /* queue pairs; a message is split across all of them */
  struct ibv_qp* qps[IB_MAX_QPS];
  uint64_t qp_done[IB_MAX_QPS]; /* receiver: immediates taken on each queue pair */
  int ar;                       /* sender: adaptive routing (the device's, or the parameter) */
  size_t ar_threshold;          /* sender: BRAID_IB_AR_THRESHOLD */
  uint8_t tc, sl;               /* the sender's, on both ends */
  uint8_t timeout, retry_cnt;   /* this end's BRAID_IB_TIMEOUT, BRAID_IB_RETRY_CNT */
  struct ibv_qp* flush_qp;      /* receiver with GPU buffers: RDMA read from itself */
  struct ib_cts* cts;           /* sender: FIFO the receiver writes; receiver: staging */
  struct ibv_mr* cts_mr;
  uint64_t remote_cts_addr;     /* receiver: the sender's FIFO */
  uint32_t remote_cts_rkey;
  char* scratch;                /* flush target */
  struct ibv_mr* scratch_mr;
  uint64_t seq;                 /* messages posted */
  struct ib_req reqs[IB_MAX_REQS];
  struct ib_req* recv_order[IB_MAX_REQS]; /* receiver: request of message seq % max */
  int ready;                    /* receiver: the sender's queue pair is ready for our writes */
  int peer_done;                /* the peer closed its end with a goodbye: no error, no more data */
  double next_liveness;
  ncclResult_t failed;
};

/* The receiver's listener, and the handle a sender connects with. */
struct ib_pending {
  int fd;
  size_t got;
  double deadline;
  struct ib_hello hello;
  union braid_sockaddr remote;
};

struct ib_listen {
  int dev;
  int fd;
  char addr[80];
  uint8_t key[BRAID_NET_KEY_BYTES];
  struct ib_pending pending[16];
};

/* A connect in progress: the sender's own state, never in a handle (net.h, connect). */
struct ib_connecting {
  union braid_sockaddr addr; /* the listener's, from the checked handle */
  struct ib_comm* comm;
  int stage;          /* 0: TCP connect; 1: hello sent, reading the answer */
  size_t got;
  struct ib_hello answer;
  struct net_connect_try connect_try; /* stage 0's TCP connect */
};

/* What travels to the sender: where the listener is. Nothing else. */
struct ib_handle {
  uint32_t magic;
  uint32_t version;
  union braid_sockaddr addr;
};

/* Loaded devices (net_ib.c). */
int ib_dev_count(void);
struct ib_dev* ib_dev_get(int dev);

/* The IB parameters a connection uses, read once per connection (net_ib.c). */
struct ib_knobs {
  int timeout, retry_cnt, tc, sl, nqps;
};
/* The knobs from the parameters; an error names the one out of range. */
ncclResult_t ib_knobs_get(struct ib_knobs* k);
/* Whether data registrations take IBV_ACCESS_RELAXED_ORDERING (BRAID_IB_PCI_RELAXED_ORDERING). */
int ib_relaxed_ordering(void);

/* Queue pairs (net_ib.c): k->nqps of them, with k's traffic class and service level (a
   receiver passes the sender's, from its hello) and k's timeout and retry count. */
ncclResult_t ib_comm_create(int dev, int is_send, const struct ib_knobs* k, struct ib_comm** out);
void ib_comm_destroy(struct ib_comm* c);
/* A queue pair on the comm's device and completion queue, in INIT. */
ncclResult_t ib_qp_create(struct ib_comm* c, struct ibv_qp** out);
/* This end's queue pairs `qps[0..n)` and addresses, for the other end. */
void ib_qp_info_fill(const struct ib_comm* c, struct ibv_qp* const* qps, int n, struct ib_qp_info* info);
/* Moves `qp` to RTR and RTS, connected to queue pair `remote_qpn` that `remote` describes. */
ncclResult_t ib_qp_connect(struct ib_comm* c, struct ibv_qp* qp, const struct ib_qp_info* remote,
                           uint32_t remote_qpn);
/* Posts n zero-length receives (for immediates) on queue pair q. */
ncclResult_t ib_post_recvs(struct ib_comm* c, int q, int n);

/* Data path (net_ib_data.c). */
ncclResult_t ib_reg_mr(void* comm, void* data, size_t size, int is_cuda, void** mhandle);
ncclResult_t ib_reg_mr_dmabuf(void* comm, void* data, size_t size, uint64_t offset, int fd,
                              void** mhandle);
ncclResult_t ib_dereg_mr(void* comm, void* mhandle);
ncclResult_t ib_isend(void* send_comm, void* data, size_t size, void* mhandle, void** request);
ncclResult_t ib_irecv(void* recv_comm, void* data, size_t size, void* mhandle, void** request);
ncclResult_t ib_iflush(void* recv_comm, void* data, size_t size, void* mhandle, void** request);
ncclResult_t ib_test(void* request, int* done, size_t* size);

#endif
