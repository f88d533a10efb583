/*
 * The IB backend: InfiniBand and RoCE through rdma-core's verbs, loaded
 * with dlopen. One device per active port that BRAID_IB_HCA / NCCL_IB_HCA
 * selects; RC queue pairs; RDMA write with immediate (net_ib_data.c);
 * GPUDirect RDMA through dma-buf (ibv_reg_dmabuf_mr) or nvidia-peermem.
 * Built only where infiniband/verbs.h was found; otherwise every slot says
 * "not built".
 *
 * This file: finding devices (and saying precisely why none is usable: no
 * device, port down, no GID, HCA filter), and the handshake. The listener
 * is a TCP socket on the bootstrap's interface; the sender connects,
 * presents the job's key and its queue pair, the receiver answers with the
 * key and its own, the sender moves its queue pair to ready-to-send and says
 * "ready". The socket stays open as the connection's liveness signal. What
 * comes from the other side (the handle, a hello, the answer) is checked
 * field by field before use; the sender's progress stays in its own state.
 */
#include "transport/net.h"

#ifndef BRAID_HAVE_IBVERBS

#include <stdio.h>

static ncclResult_t ib_init(int* ndev, char* why, size_t why_size) {
  *ndev = 0;
  snprintf(why, why_size, "not built: infiniband/verbs.h (libibverbs-dev) was missing at build time");
  return ncclSuccess;
}
static ncclResult_t ib_none(void) { return net_unsupported("IB", "anything (not built)"); }
static ncclResult_t ib_props(int d, struct braid_net_props* p) { return ib_none(); }
static ncclResult_t ib_listen(int d, const uint8_t* k, void* h, void** l) { return ib_none(); }
static ncclResult_t ib_connect(int d, const uint8_t* k, const void* h, void** st, void** s) {
  return ib_none();
}
static void ib_connect_abandon(void* st) {}
static ncclResult_t ib_accept(void* l, void** r) { return ib_none(); }
static ncclResult_t ib_reg_mr(void* c, void* d, size_t s, int cu, void** m) { return ib_none(); }
static ncclResult_t ib_reg_mr_dmabuf(void* c, void* d, size_t s, uint64_t o, int fd, void** m) {
  return ib_none();
}
static ncclResult_t ib_dereg_mr(void* c, void* m) { return ncclSuccess; }
static ncclResult_t ib_isend(void* c, void* d, size_t s, void* m, void** r) { return ib_none(); }
static ncclResult_t ib_irecv(void* c, void* d, size_t s, void* m, void** r) { return ib_none(); }
static ncclResult_t ib_iflush(void* c, void* d, size_t s, void* m, void** r) { return ib_none(); }
static ncclResult_t ib_test(void* r, int* done, size_t* size) { return ib_none(); }
static ncclResult_t ib_close(void* c) { return ncclSuccess; }
#define ib_close_send ib_close
#define ib_close_recv ib_close
#define ib_close_listen ib_close
#define ib_close_abort ib_close

#else /* BRAID_HAVE_IBVERBS */

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/debug.h"
#include "base/error.h"
#include "base/param.h"
#include "base/utils.h"
#include "transport/net_ib_verbs.h"

#define IB_HELLO_SEC 5.0
#define IB_MAX_PENDING 16

static struct {
  pthread_mutex_t lock;
  int loaded;
  int ndev;
  struct ib_dev devs[BRAID_NET_MAX_DEVS];
  char why[512];
} ib = {.lock = PTHREAD_MUTEX_INITIALIZER};

int ib_dev_count(void) { return ib.ndev; }
struct ib_dev* ib_dev_get(int dev) { return dev >= 0 && dev < ib.ndev ? &ib.devs[dev] : NULL; }

/* ---------------------------------------------------------------- devices */

static void ib_sysfs_text(const char* dev, int port, const char* file, char* out, size_t size) {
  char path[256];
  snprintf(path, sizeof path, "/sys/class/infiniband/%s/ports/%d/%s", dev, port, file);
  FILE* f = fopen(path, "r");
  out[0] = '\0';
  if (f == NULL) return;
  if (fgets(out, (int)size, f) == NULL) out[0] = '\0';
  out[strcspn(out, "\n")] = '\0';
  fclose(f);
}

/* The GID table of a RoCE port, with each entry's type from sysfs; returns the chosen index. */
static int ib_port_gid(struct ib_dev* d, const struct ibv_port_attr* pa, char* why, size_t why_size) {
  struct ib_gid_cand cands[128];
  int n = 0;
  for (int i = 0; i < pa->gid_tbl_len && n < 128; i++) {
    union ibv_gid gid;
    char type[64], file[64];
    if (ibv_fn.query_gid(d->ctx, (uint8_t)d->port, i, &gid) != 0) continue;
    snprintf(file, sizeof file, "gid_attrs/types/%d", i);
    ib_sysfs_text(d->ibname, d->port, file, type, sizeof type);
    cands[n].index = i;
    cands[n].type = strstr(type, "v2") ? IB_GID_ROCE_V2 : strstr(type, "RoCE") ? IB_GID_ROCE_V1 : IB_GID_IB;
    memcpy(cands[n].raw, gid.raw, 16);
    n++;
  }
  int index = ib_gid_choose(cands, n, (int)braid_param_int(BRAID_P_IB_GID_INDEX), why, why_size);
  for (int i = 0; index >= 0 && i < n; i++)
    if (cands[i].index == index) memcpy(d->gid.raw, cands[i].raw, 16);
  return index;
}

static unsigned ib_ptr_support(void) {
  unsigned ptr = BRAID_NET_PTR_HOST;
  if (access("/sys/module/nvidia_peermem", F_OK) == 0 ||
      access("/sys/kernel/mm/memory_peers/nv_mem/version", F_OK) == 0)
    ptr |= BRAID_NET_PTR_CUDA;
  if (ibv_fn.reg_dmabuf_mr) ptr |= BRAID_NET_PTR_DMABUF;
  return ptr;
}

/* Fills `d` for an active port; returns 0, or -1 with why it is unusable appended to ib.why. */
static int ib_port_setup(struct ib_dev* d, const struct ibv_port_attr* pa) {
  char why[256] = "", rate[64], link[128], real[PATH_MAX];
  if (pa->state != IBV_PORT_ACTIVE) {
    snprintf(why, sizeof why, "port is %s", pa->state == IBV_PORT_DOWN ? "DOWN (no link: cable, switch?)"
                                            : pa->state == IBV_PORT_INIT ? "INIT (no subnet manager?)"
                                                                          : "not active");
  } else if (pa->link_layer == IBV_LINK_LAYER_ETHERNET &&
             (d->gid_index = ib_port_gid(d, pa, why, sizeof why)) < 0) {
    /* why is set */
  } else {
    if (pa->link_layer != IBV_LINK_LAYER_ETHERNET) d->gid_index = -1;
    d->link_layer = pa->link_layer;
    d->lid = pa->lid;
    d->mtu = pa->active_mtu;
    ib_sysfs_text(d->ibname, d->port, "rate", rate, sizeof rate);
    d->speed_mbps = atoi(rate) > 0 ? atoi(rate) * 1000 : 100000;
    d->ptr_support = ib_ptr_support();
    /* Adaptive routing: NCCL's default, on for InfiniBand and off for RoCE, unless set. */
    const int ar = (int)braid_param_int(BRAID_P_IB_ADAPTIVE_ROUTING);
    d->ar = ar == -2 ? pa->link_layer == IBV_LINK_LAYER_INFINIBAND : ar != 0;
    snprintf(link, sizeof link, "/sys/class/infiniband/%s/device", d->ibname);
    if (realpath(link, real) && strlen(real) < sizeof d->pci_path) memcpy(d->pci_path, real, strlen(real) + 1);
    return 0;
  }
  size_t used = strlen(ib.why);
  snprintf(ib.why + used, sizeof ib.why - used, "%s%s: %s", used ? "; " : "", d->name, why);
  return -1;
}

/* Opens one device and keeps its selected, usable ports. */
static void ib_open_device(struct ibv_device* device, const char* spec) {
  const char* name = ibv_fn.get_device_name(device);
  struct ibv_device_attr attr;
  struct ibv_context* ctx = ibv_fn.open_device(device);
  int kept = 0;
  if (ctx == NULL || ibv_fn.query_device(ctx, &attr) != 0) {
    size_t used = strlen(ib.why);
    snprintf(ib.why + used, sizeof ib.why - used, "%s%s: cannot open (%s)", used ? "; " : "", name,
             strerror(errno));
    if (ctx) ibv_fn.close_device(ctx);
    return;
  }
  struct ibv_pd* pd = ibv_fn.alloc_pd(ctx);
  for (int port = 1; pd && port <= attr.phys_port_cnt && ib.ndev < BRAID_NET_MAX_DEVS; port++) {
    struct ibv_port_attr pa;
    memset(&pa, 0, sizeof pa);
    if (!ib_hca_match(spec, name, port) || ibv_fn.query_port(ctx, (uint8_t)port, &pa) != 0) continue;
    struct ib_dev* d = &ib.devs[ib.ndev];
    memset(d, 0, sizeof *d);
    snprintf(d->ibname, sizeof d->ibname, "%s", name);
    snprintf(d->name, sizeof d->name, "%s:%d", name, port);
    d->port = port;
    d->ctx = ctx;
    d->pd = pd;
    if (ib_port_setup(d, &pa) == 0) {
      ib.ndev++;
      kept++;
    }
  }
  if (kept == 0) {
    if (pd) ibv_fn.dealloc_pd(pd);
    ibv_fn.close_device(ctx);
  }
}

static void ib_find_devices(void) {
  int count = 0;
  const char* spec = braid_param_str(BRAID_P_IB_HCA);
  if (ib_verbs_load(ib.why, sizeof ib.why) != 0) return;
  struct ibv_device** list = ibv_fn.get_device_list(&count);
  if (list == NULL || count == 0) {
    snprintf(ib.why, sizeof ib.why, "no InfiniBand/RoCE device (libibverbs found none: is the HCA "
             "driver loaded and /dev/infiniband present?)");
    if (list) ibv_fn.free_device_list(list);
    return;
  }
  for (int i = 0; i < count; i++) ib_open_device(list[i], spec && spec[0] ? spec : NULL);
  ibv_fn.free_device_list(list);
  if (ib.ndev == 0 && ib.why[0] == '\0')
    snprintf(ib.why, sizeof ib.why, "BRAID_IB_HCA=\"%s\" selects none of the %d device(s)", spec, count);
  for (int i = 0; i < ib.ndev; i++) {
    char gid[64] = "-";
    if (ib.devs[i].gid_index >= 0) ib_gid_str(ib.devs[i].gid.raw, gid, sizeof gid);
    INFO(BRAID_LOG_NET, "net IB: device %d: %s, %s, %d Mb/s, GID index %d (%s), adaptive routing "
         "%s, relaxed ordering %s", i, ib.devs[i].name,
         ib.devs[i].link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand",
         ib.devs[i].speed_mbps, ib.devs[i].gid_index, gid, ib.devs[i].ar ? "on" : "off",
         ib_relaxed_ordering() ? "on" : "off");
  }
}

/*
 * Relaxed ordering needs ibv_reg_mr_iova2 (the IBVERBS_1.8 API, through which
 * rdma-core passes the optional access flags, dropping them where the kernel
 * lacks them). 2: when present; 1: the same, warning once when absent; 0: off.
 */
int ib_relaxed_ordering(void) {
  static int warned;
  const int mode = (int)braid_param_int(BRAID_P_IB_PCI_RELAXED_ORDERING);
  if (mode == 0) return 0;
  if (ibv_fn.reg_mr_iova2) return 1;
  if (mode == 1 && !__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
    WARN("net IB: BRAID_IB_PCI_RELAXED_ORDERING=1 but the verbs library has no ibv_reg_mr_iova2 "
         "(rdma-core older than the IBVERBS_1.8 API): registering without relaxed ordering");
  return 0;
}

static ncclResult_t ib_knob(braid_param_id_t id, const char* name, int lo, int hi, int* out) {
  const int64_t v = braid_param_int(id);
  if (v < lo || v > hi)
    return braid_err(ncclInvalidUsage, "net IB: BRAID_%s (or NCCL_%s) is %lld; it must be %d to %d",
                     name, name, (long long)v, lo, hi);
  *out = (int)v;
  return ncclSuccess;
}

ncclResult_t ib_knobs_get(struct ib_knobs* k) {
  ncclResult_t res = ncclSuccess;
  BRAID_TRY(ib_knob(BRAID_P_IB_TIMEOUT, "IB_TIMEOUT", 1, 31, &k->timeout));
  BRAID_TRY(ib_knob(BRAID_P_IB_RETRY_CNT, "IB_RETRY_CNT", 0, 7, &k->retry_cnt));
  BRAID_TRY(ib_knob(BRAID_P_IB_TC, "IB_TC", 0, 255, &k->tc));
  BRAID_TRY(ib_knob(BRAID_P_IB_SL, "IB_SL", 0, 15, &k->sl));
  BRAID_TRY(ib_knob(BRAID_P_IB_QPS_PER_CONNECTION, "IB_QPS_PER_CONNECTION", 1, IB_MAX_QPS, &k->nqps));
  return ncclSuccess;
fail:
  return res;
}

static ncclResult_t ib_init(int* ndev, char* why, size_t why_size) {
  if (braid_param_int(BRAID_P_IB_DISABLE) != 0) { /* read on every call: tests reload parameters */
    *ndev = 0;
    snprintf(why, why_size, "disabled (BRAID_IB_DISABLE / NCCL_IB_DISABLE is %lld)",
             (long long)braid_param_int(BRAID_P_IB_DISABLE));
    return ncclSuccess;
  }
  pthread_mutex_lock(&ib.lock);
  if (!ib.loaded) {
    ib.loaded = 1;
    ib_find_devices();
  }
  *ndev = ib.ndev;
  snprintf(why, why_size, "%s", ib.why);
  pthread_mutex_unlock(&ib.lock);
  return ncclSuccess;
}

static ncclResult_t ib_props(int dev, struct braid_net_props* props) {
  struct ib_dev* d = ib_dev_get(dev);
  if (d == NULL) return braid_err(ncclInternalError, "net IB: no device %d", dev);
  memset(props, 0, sizeof *props);
  snprintf(props->name, sizeof props->name, "%s", d->name);
  memcpy(props->pci_path, d->pci_path, sizeof props->pci_path);
  props->speed_mbps = d->speed_mbps;
  props->latency_us = 2;
  props->port = d->port;
  props->ptr_support = d->ptr_support;
  props->max_requests = IB_MAX_REQS;
  props->max_bytes = (size_t)1 << 30;
  return ncclSuccess;
}

/* ----------------------------------------------------------- queue pairs */

void ib_comm_destroy(struct ib_comm* c) {
  if (c == NULL) return;
  for (int q = 0; q < IB_MAX_QPS; q++)
    if (c->qps[q]) ibv_fn.destroy_qp(c->qps[q]);
  if (c->flush_qp) ibv_fn.destroy_qp(c->flush_qp);
  if (c->cq) ibv_fn.destroy_cq(c->cq);
  if (c->cts_mr) ibv_fn.dereg_mr(c->cts_mr);
  if (c->scratch_mr) ibv_fn.dereg_mr(c->scratch_mr);
  free(c->cts);
  free(c->scratch);
  socket_close(&c->fd);
  free(c);
}

ncclResult_t ib_qp_create(struct ib_comm* c, struct ibv_qp** out) {
  struct ib_dev* d = ib_dev_get(c->dev);
  struct ibv_qp_init_attr init;
  memset(&init, 0, sizeof init);
  init.send_cq = c->cq;
  init.recv_cq = c->cq;
  init.qp_type = IBV_QPT_RC;
  init.cap.max_send_wr = 2 * IB_MAX_REQS + 8; /* with adaptive routing, two writes a message */
  init.cap.max_recv_wr = IB_MAX_REQS + 8;
  init.cap.max_send_sge = 1;
  init.cap.max_recv_sge = 1;
  *out = ibv_fn.create_qp(d->pd, &init);
  if (*out == NULL)
    return braid_err(ncclSystemError, "net IB: ibv_create_qp on %s failed: %s", d->name, strerror(errno));
  struct ibv_qp_attr attr;
  memset(&attr, 0, sizeof attr);
  attr.qp_state = IBV_QPS_INIT;
  attr.port_num = (uint8_t)d->port;
  attr.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  int err = ibv_fn.modify_qp(*out, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  if (err != 0)
    return braid_err(ncclSystemError, "net IB: moving a queue pair on %s to INIT failed: %s", d->name,
                     strerror(err));
  return ncclSuccess;
}

ncclResult_t ib_comm_create(int dev, int is_send, const struct ib_knobs* k, struct ib_comm** out) {
  ncclResult_t res = ncclSuccess;
  struct ib_comm* c = NULL;
  struct ib_dev* d = ib_dev_get(dev);
  size_t cts_bytes = sizeof(struct ib_cts) * IB_MAX_REQS;
  *out = NULL;
  BRAID_CHECK(d != NULL, ncclInternalError, "net IB: no device %d", dev);
  BRAID_CHECK(k->nqps >= 1 && k->nqps <= IB_MAX_QPS, ncclInternalError,
              "net IB: %d queue pairs per connection", k->nqps);
  BRAID_TRY(BRAID_CALLOC(&c, 1, "an IB connection"));
  c->fd = -1;
  c->dev = dev;
  c->is_send = is_send;
  c->nqps = k->nqps;
  c->tc = (uint8_t)k->tc;
  c->sl = (uint8_t)k->sl;
  c->timeout = (uint8_t)k->timeout;
  c->retry_cnt = (uint8_t)k->retry_cnt;
  c->ar = d->ar;
  c->ar_threshold = (size_t)BRAID_MAX(braid_param_int(BRAID_P_IB_AR_THRESHOLD), 0);
  /* Every queue pair's completions: a sender's writes, a receiver's immediates and its
     clear-to-send writes, up to IB_MAX_REQS outstanding each (and the flush). */
  c->cq = ibv_fn.create_cq(d->ctx, (c->nqps + 1) * 2 * IB_MAX_REQS + 16, NULL, NULL, 0);
  BRAID_CHECK(c->cq != NULL, ncclSystemError, "net IB: ibv_create_cq on %s failed: %s", d->name,
              strerror(errno));
  for (int q = 0; q < c->nqps; q++) BRAID_TRY(ib_qp_create(c, &c->qps[q]));
  c->cts = aligned_alloc(4096, BRAID_ALIGN_UP(cts_bytes, 4096));
  BRAID_CHECK(c->cts != NULL, ncclSystemError, "net IB: out of memory for a CTS FIFO");
  memset(c->cts, 0, cts_bytes);
  /* No relaxed ordering here: an entry's seq1 must not land before the rest of it. */
  c->cts_mr = ibv_fn.reg_mr(d->pd, c->cts, cts_bytes, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (c->cts_mr == NULL) {
    char advice[512];
    ib_memlock_advice(cts_bytes, errno, advice, sizeof advice);
    res = braid_err(ncclSystemError, "net IB: %s: %s", d->name, advice);
    goto fail;
  }
  *out = c;
  return ncclSuccess;
fail:
  ib_comm_destroy(c);
  return res;
}

void ib_qp_info_fill(const struct ib_comm* c, struct ibv_qp* const* qps, int n, struct ib_qp_info* info) {
  const struct ib_dev* d = ib_dev_get(c->dev);
  memset(info, 0, sizeof *info);
  for (int q = 0; q < n; q++) info->qpn[q] = qps[q]->qp_num;
  info->nqps = (uint8_t)n;
  info->psn = 0;
  info->lid = d->lid;
  info->link_layer = (uint8_t)d->link_layer;
  info->mtu = (uint8_t)d->mtu;
  memcpy(info->gid, d->gid.raw, 16);
  info->cts_addr = (uint64_t)(uintptr_t)c->cts;
  info->cts_rkey = c->cts_mr->rkey;
  info->tc = c->tc;
  info->sl = c->sl;
}

/*
 * Why moving a queue pair to RTR was refused, from what the port says now:
 * an MTU below the path MTU the two ends agreed on, the GID entry gone, the
 * port no longer active; otherwise, for RoCE, the GID type both ends must share.
 */
static void ib_rtr_hint(const struct ib_dev* d, int path_mtu, char* out, size_t size) {
  struct ibv_port_attr pa;
  union ibv_gid gid;
  memset(&pa, 0, sizeof pa);
  out[0] = '\0';
  if (ibv_fn.query_port(d->ctx, (uint8_t)d->port, &pa) == 0) {
    if (pa.state != IBV_PORT_ACTIVE) {
      snprintf(out, size, " (the port is no longer active: link down?)");
      return;
    }
    if ((int)pa.active_mtu < path_mtu) {
      snprintf(out, size, " (the port's MTU is now %d bytes, below the path MTU of %d both ends "
               "read at init: the link came back with another MTU; set the same MTU on every "
               "port and switch, and restart the job)", 128 << pa.active_mtu, 128 << path_mtu);
      return;
    }
  }
  if (d->gid_index < 0) return;
  int zero = 1;
  if (ibv_fn.query_gid(d->ctx, (uint8_t)d->port, d->gid_index, &gid) == 0)
    for (int i = 0; i < 16; i++) zero &= gid.raw[i] == 0;
  if (zero)
    snprintf(out, size, " (GID index %d of this port is now empty: its address was removed; "
             "check the interface's IP address, or BRAID_IB_GID_INDEX)", d->gid_index);
  else
    snprintf(out, size, " (with RoCE, check that both hosts use the same GID type: "
             "BRAID_IB_GID_INDEX)");
}

ncclResult_t ib_qp_connect(struct ib_comm* c, struct ibv_qp* qp, const struct ib_qp_info* remote,
                           uint32_t remote_qpn) {
  const struct ib_dev* d = ib_dev_get(c->dev);
  struct ibv_qp_attr a;
  char hint[320];
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = (enum ibv_mtu)BRAID_MIN((int)d->mtu, (int)remote->mtu);
  a.dest_qp_num = remote_qpn;
  a.rq_psn = remote->psn;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.port_num = (uint8_t)d->port;
  a.ah_attr.dlid = remote->lid;
  a.ah_attr.sl = c->sl;
  if (d->gid_index >= 0) {
    a.ah_attr.is_global = 1;
    memcpy(a.ah_attr.grh.dgid.raw, remote->gid, 16);
    a.ah_attr.grh.sgid_index = (uint8_t)d->gid_index;
    a.ah_attr.grh.hop_limit = 255;
    a.ah_attr.grh.traffic_class = c->tc;
  }
  int err = ibv_fn.modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                         IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  if (err != 0) {
    ib_rtr_hint(d, (int)a.path_mtu, hint, sizeof hint);
    return braid_err(ncclSystemError, "net IB: connecting a queue pair on %s to %s failed (RTR): %s%s",
                     d->name, c->peer, strerror(err), hint);
  }
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTS;
  a.timeout = c->timeout;
  a.retry_cnt = c->retry_cnt;
  a.rnr_retry = 7;
  a.sq_psn = 0;
  a.max_rd_atomic = 1;
  err = ibv_fn.modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                     IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
  if (err != 0)
    return braid_err(ncclSystemError, "net IB: connecting a queue pair on %s to %s failed (RTS): %s",
                     d->name, c->peer, strerror(err));
  return ncclSuccess;
}

ncclResult_t ib_post_recvs(struct ib_comm* c, int q, int n) {
  for (int i = 0; i < n; i++) {
    struct ibv_recv_wr wr, *bad = NULL;
    memset(&wr, 0, sizeof wr);
    wr.wr_id = 0; /* immediates: matched to requests in order, per queue pair */
    int err = ibv_post_recv(c->qps[q], &wr, &bad);
    if (err != 0)
      return braid_err(ncclSystemError, "net IB: posting a receive for %s failed: %s", c->peer,
                       strerror(err));
  }
  return ncclSuccess;
}

/* ---------------------------------------------------------- listen, accept */

static struct braid_netif ib_ctrl_if;
static int ib_ctrl_if_found;

static ncclResult_t ib_listen(int dev, const uint8_t* key, void* handle, void** listen_comm) {
  ncclResult_t res = ncclSuccess;
  struct ib_listen* l = NULL;
  struct ib_handle* h = handle;
  int nif = 0;
  *listen_comm = NULL;
  pthread_mutex_lock(&ib.lock);
  if (!ib_ctrl_if_found && socket_find_interfaces(&ib_ctrl_if, 1, &nif) == ncclSuccess && nif == 1)
    ib_ctrl_if_found = 1;
  pthread_mutex_unlock(&ib.lock);
  BRAID_CHECK(ib_ctrl_if_found, ncclSystemError, "net IB: no network interface for the handshake");
  BRAID_TRY(BRAID_CALLOC(&l, 1, "an IB listener"));
  l->dev = dev;
  l->fd = -1;
  for (int i = 0; i < IB_MAX_PENDING; i++) l->pending[i].fd = -1;
  memcpy(l->key, key, BRAID_NET_KEY_BYTES);
  memset(h, 0, BRAID_NET_HANDLE_BYTES);
  h->addr = ib_ctrl_if.addr;
  h->addr.sin.sin_port = 0;
  BRAID_TRY(socket_listen(&h->addr, &l->fd));
  socket_addr_str(&h->addr, l->addr, sizeof l->addr);
  h->magic = IB_MAGIC;
  h->version = IB_VERSION;
  *listen_comm = l;
  return ncclSuccess;
fail:
  free(l);
  return res;
}

/* Tells the connecting end why it is refused (it reports that instead of a closed socket). */
static void ib_refuse(int fd, const char* why) {
  struct ib_hello no;
  memset(&no, 0, sizeof no);
  no.magic = IB_MAGIC;
  no.version = IB_VERSION;
  no.refused = 1;
  if (strncmp(why, "net IB: ", 8) == 0) why += 8;
  snprintf(no.why, sizeof no.why, "%s", why);
  socket_send_all(fd, &no, sizeof no, 1.0, NULL); /* best effort: it may be gone already */
}

static void ib_drop(struct ib_listen* l, struct ib_pending* p, const char* why, int answer) {
  char text[80];
  WARN("net IB: listener %s dropped a connection from %s: %s", l->addr,
       socket_addr_str(&p->remote, text, sizeof text), why);
  if (answer) ib_refuse(p->fd, why);
  socket_close(&p->fd);
}

/* Why a queue pair's description from the other end cannot be connected to from `dev`, or NULL. */
static const char* ib_qp_info_check(int dev, const struct ib_qp_info* q) {
  const struct ib_dev* d = ib_dev_get(dev);
  if (d == NULL) return "for no device of this process";
  if (q->mtu < IBV_MTU_256 || q->mtu > IBV_MTU_4096) return "a path MTU out of range";
  if (q->link_layer != (uint8_t)d->link_layer)
    return "another link layer (InfiniBand and RoCE do not connect)";
  if (q->nqps < 1 || q->nqps > IB_MAX_QPS) return "a queue pair count out of range";
  for (int i = 0; i < q->nqps; i++)
    if ((q->qpn[i] & 0xff000000u) != 0) return "a queue pair number out of range";
  if (q->sl > 15) return "a service level out of range";
  return NULL;
}

/* Why a hello (or the answer to one) must be refused, or NULL. */
static const char* ib_hello_check(int dev, const uint8_t* key, const struct ib_hello* h) {
  uint8_t diff = 0;
  for (int i = 0; i < BRAID_NET_KEY_BYTES; i++) diff |= (uint8_t)(h->key[i] ^ key[i]);
  if (h->magic != IB_MAGIC) return "not a Braid IB connection (bad magic)";
  if (h->version != IB_VERSION) return "another version of Braid's IB protocol";
  if (diff != 0) return "wrong key (a process of another job, or a stale one)";
  return ib_qp_info_check(dev, &h->info);
}

/* Both ends of a connection must split messages alike. */
static ncclResult_t ib_nqps_mismatch(const char* peer, int mine, int theirs) {
  return braid_err(ncclInvalidUsage, "net IB: %s uses %d queue pair%s per connection and this "
                   "process %d: set BRAID_IB_QPS_PER_CONNECTION (or NCCL_IB_QPS_PER_CONNECTION) "
                   "to the same value for every rank", peer, theirs, theirs == 1 ? "" : "s", mine);
}

/* A complete, valid hello: make our queue pairs, connect them, answer. The comm takes the fd. */
static ncclResult_t ib_accept_finish(struct ib_listen* l, struct ib_pending* p, void** recv_comm) {
  ncclResult_t res = ncclSuccess;
  struct ib_comm* c = NULL;
  struct ib_hello answer;
  struct ib_knobs k;
  char peer[80];
  const struct ib_qp_info* in = &p->hello.info;
  socket_addr_str(&p->remote, peer, sizeof peer);
  BRAID_TRY(ib_knobs_get(&k));
  if (in->nqps != k.nqps) {
    char why[IB_WHY_BYTES];
    res = ib_nqps_mismatch(peer, k.nqps, in->nqps);
    snprintf(why, sizeof why, "the receiver uses %d queue pair%s per connection and this sender "
             "%d: set BRAID_IB_QPS_PER_CONNECTION (or NCCL_IB_QPS_PER_CONNECTION) to the same "
             "value for every rank", k.nqps, k.nqps == 1 ? "" : "s", in->nqps);
    ib_refuse(p->fd, why);
    socket_close(&p->fd);
    return res;
  }
  k.tc = in->tc; /* the sender's class, so that both directions travel in it */
  k.sl = in->sl;
  BRAID_TRY(ib_comm_create(l->dev, 0, &k, &c));
  snprintf(c->peer, sizeof c->peer, "%s", peer);
  c->remote_cts_addr = in->cts_addr;
  c->remote_cts_rkey = in->cts_rkey;
  for (int q = 0; q < c->nqps; q++) {
    BRAID_TRY(ib_qp_connect(c, c->qps[q], in, in->qpn[q]));
    BRAID_TRY(ib_post_recvs(c, q, IB_MAX_REQS));
  }
  memset(&answer, 0, sizeof answer);
  answer.magic = IB_MAGIC;
  answer.version = IB_VERSION;
  memcpy(answer.key, l->key, BRAID_NET_KEY_BYTES);
  ib_qp_info_fill(c, c->qps, c->nqps, &answer.info);
  BRAID_TRY(socket_send_all(p->fd, &answer, sizeof answer, IB_HELLO_SEC, NULL));
  c->fd = p->fd;
  p->fd = -1;
  INFO(BRAID_LOG_NET, "net IB: accepted a connection from %s on %s (%d queue pair%s, traffic "
       "class %d, service level %d)", c->peer, ib_dev_get(l->dev)->name, c->nqps,
       c->nqps == 1 ? "" : "s", c->tc, c->sl);
  *recv_comm = c;
  return ncclSuccess;
fail:
  if (p->fd >= 0) ib_refuse(p->fd, braid_err_last()); /* the sender says why, not "closed" */
  socket_close(&p->fd);
  ib_comm_destroy(c);
  return res;
}

static ncclResult_t ib_accept(void* listen_comm, void** recv_comm) {
  struct ib_listen* l = listen_comm;
  double now = braid_time_sec();
  *recv_comm = NULL;
  for (int i = 0; i < IB_MAX_PENDING; i++) {
    struct ib_pending* p = &l->pending[i];
    if (p->fd < 0) {
      if (socket_accept_some(l->fd, &p->fd, &p->remote) != ncclSuccess)
        return braid_err(ncclSystemError, "net IB: accept on %s failed: %s", l->addr, strerror(errno));
      p->got = 0;
      p->deadline = now + IB_HELLO_SEC;
      if (p->fd < 0) continue;
    }
    size_t n = 0;
    if (socket_recv_some(p->fd, (char*)&p->hello + p->got, sizeof p->hello - p->got, &n) != ncclSuccess) {
      ib_drop(l, p, "it closed before presenting its hello", 0);
      continue;
    }
    p->got += n;
    if (p->got < sizeof p->hello) {
      if (now >= p->deadline) ib_drop(l, p, "no hello within 5 s", 0);
      continue;
    }
    const char* why = ib_hello_check(l->dev, l->key, &p->hello);
    if (why) {
      ib_drop(l, p, why, 1);
      continue;
    }
    return ib_accept_finish(l, p, recv_comm);
  }
  return ncclSuccess;
}

static ncclResult_t ib_close_listen(void* listen_comm) {
  struct ib_listen* l = listen_comm;
  if (l == NULL) return ncclSuccess;
  for (int i = 0; i < IB_MAX_PENDING; i++) socket_close(&l->pending[i].fd);
  socket_close(&l->fd);
  free(l);
  return ncclSuccess;
}

/* ---------------------------------------------------------------- connect */

static void ib_connect_abandon(void* state) {
  struct ib_connecting* cg = state;
  if (cg == NULL) return;
  net_connect_try_close(&cg->connect_try);
  ib_comm_destroy(cg->comm);
  free(cg);
}

/* Why a handle that came from a peer cannot be used, or NULL. */
static const char* ib_handle_check(const struct ib_handle* h) {
  if (h->magic != IB_MAGIC) return "not an IB backend's (both ends must use the same BRAID_NET)";
  if (h->version != IB_VERSION) return "another version of Braid's IB protocol";
  if (h->addr.sa.sa_family != AF_INET && h->addr.sa.sa_family != AF_INET6)
    return "its address is neither IPv4 nor IPv6";
  if (socket_port(&h->addr) == 0) return "its address has no port";
  return NULL;
}

/* Stage 0: the TCP connection and our hello; *sent = 0 while the listener is not reachable yet. */
static ncclResult_t ib_connect_hello(struct ib_connecting* cg, const uint8_t* key, int dev,
                                     int* sent) {
  ncclResult_t res = ncclSuccess;
  struct ib_hello hello;
  *sent = 0;
  if (cg->comm == NULL) {
    struct ib_knobs k;
    BRAID_TRY(ib_knobs_get(&k));
    BRAID_TRY(ib_comm_create(dev, 1, &k, &cg->comm));
    socket_addr_str(&cg->addr, cg->comm->peer, sizeof cg->comm->peer);
  }
  BRAID_TRY(net_connect_try_step(&cg->connect_try, &cg->addr, "IB", cg->comm->peer, &cg->comm->fd));
  if (cg->comm->fd < 0) return ncclSuccess;
  memset(&hello, 0, sizeof hello);
  hello.magic = IB_MAGIC;
  hello.version = IB_VERSION;
  memcpy(hello.key, key, BRAID_NET_KEY_BYTES);
  ib_qp_info_fill(cg->comm, cg->comm->qps, cg->comm->nqps, &hello.info);
  BRAID_TRY(socket_send_all(cg->comm->fd, &hello, sizeof hello, IB_HELLO_SEC, NULL));
  *sent = 1;
  return ncclSuccess;
fail:
  return res;
}

/* The listener's complete answer: a refusal, or its queue pairs to connect ours to. */
static ncclResult_t ib_connect_answer(struct ib_connecting* cg, const uint8_t* key, int dev) {
  ncclResult_t res = ncclSuccess;
  struct ib_comm* c = cg->comm;
  struct ib_hello* a = &cg->answer;
  if (a->magic == IB_MAGIC && a->version == IB_VERSION && a->refused) {
    a->why[sizeof a->why - 1] = '\0';
    return braid_err(ncclRemoteError, "net IB: %s refused the connection: %s", c->peer, a->why);
  }
  const char* why = ib_hello_check(dev, key, a);
  BRAID_CHECK(why == NULL, ncclRemoteError, "net IB: %s answered with %s", c->peer, why ? why : "");
  if (a->info.nqps != c->nqps) return ib_nqps_mismatch(c->peer, c->nqps, a->info.nqps);
  for (int q = 0; q < c->nqps; q++) BRAID_TRY(ib_qp_connect(c, c->qps[q], &a->info, a->info.qpn[q]));
  BRAID_TRY(socket_send_all(c->fd, "R", 1, IB_HELLO_SEC, NULL)); /* our queue pairs are ready */
  INFO(BRAID_LOG_NET, "net IB: connected to %s on %s (%d queue pair%s, traffic class %d, service "
       "level %d, timeout %d, retry count %d, adaptive routing %s)", c->peer, ib_dev_get(dev)->name,
       c->nqps, c->nqps == 1 ? "" : "s", c->tc, c->sl, c->timeout, c->retry_cnt, c->ar ? "on" : "off");
  return ncclSuccess;
fail:
  return res;
}

static ncclResult_t ib_connect(int dev, const uint8_t* key, const void* handle, void** state,
                               void** send_comm) {
  ncclResult_t res = ncclSuccess;
  struct ib_connecting* cg = *state;
  *send_comm = NULL;
  if (cg == NULL) {
    struct ib_handle h;
    memcpy(&h, handle, sizeof h);
    const char* why = ib_handle_check(&h);
    if (why)
      return braid_err(ncclInternalError, "net IB: cannot use the connection handle: %s", why);
    BRAID_TRY(BRAID_CALLOC(&cg, 1, "an IB connection in progress"));
    cg->addr = h.addr;
    net_connect_try_init(&cg->connect_try);
    *state = cg;
  }
  if (cg->stage == 0) {
    int sent = 0;
    BRAID_TRY(ib_connect_hello(cg, key, dev, &sent));
    if (!sent) return ncclSuccess;
    cg->stage = 1;
  }
  size_t n = 0;
  res = socket_recv_some(cg->comm->fd, (char*)&cg->answer + cg->got, sizeof cg->answer - cg->got, &n);
  BRAID_CHECK(res == ncclSuccess, ncclRemoteError, "net IB: %s closed the connection during the "
              "handshake without answering (its process exited?)", cg->comm->peer);
  cg->got += n;
  if (cg->got < sizeof cg->answer) return ncclSuccess;
  BRAID_TRY(ib_connect_answer(cg, key, dev));
  cg->comm->ready = 1; /* a sender waits for no "ready" byte */
  *send_comm = cg->comm;
  cg->comm = NULL;
  ib_connect_abandon(cg);
  *state = NULL;
  return ncclSuccess;
fail:
  ib_connect_abandon(*state);
  *state = NULL;
  return res;
}

/* Says goodbye on the handshake socket (the peer then knows this end closed, not died), closes. */
static ncclResult_t ib_close_comm(void* comm) {
  struct ib_comm* c = comm;
  size_t sent = 0;
  if (c && c->fd >= 0 && c->failed == ncclSuccess) socket_send_some(c->fd, "B", 1, &sent);
  ib_comm_destroy(c);
  return ncclSuccess;
}
#define ib_close_send ib_close_comm
#define ib_close_recv ib_close_comm

/* An abort: no goodbye, so the peer takes the closed socket as the failure it is. */
static ncclResult_t ib_close_abort(void* comm) {
  ib_comm_destroy(comm);
  return ncclSuccess;
}

#endif /* BRAID_HAVE_IBVERBS */

const struct braid_net_ops braid_net_ib = {
  .size = sizeof(struct braid_net_ops),
  .name = "IB",
  .init = ib_init,
  .get_properties = ib_props,
  .listen = ib_listen,
  .connect = ib_connect,
  .connect_abandon = ib_connect_abandon,
  .accept = ib_accept,
  .reg_mr = ib_reg_mr,
  .reg_mr_dmabuf = ib_reg_mr_dmabuf,
  .dereg_mr = ib_dereg_mr,
  .isend = ib_isend,
  .irecv = ib_irecv,
  .iflush = ib_iflush,
  .test = ib_test,
  .close_send = ib_close_send,
  .close_recv = ib_close_recv,
  .close_listen = ib_close_listen,
  .close_abort = ib_close_abort,
};
