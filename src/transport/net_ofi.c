/*
 * The OFI backend: libfabric reliable-datagram (FI_EP_RDM) endpoints with
 * tagged messages, loaded with dlopen so that one library runs where
 * libfabric is absent. Built only where rdma/fabric.h was found; otherwise
 * every slot reports "not built". Tested with the "tcp;ofi_rxm" provider;
 * BRAID_OFI_PROVIDER (alias FI_PROVIDER) picks another.
 *
 * A device is one fi_info of the chosen provider (one per interface), found
 * and opened in net_ofi_fabric.c. Each comm has its own endpoint, address
 * vector and completion queue on the device's shared domain, and is
 * progressed by reading its queue.
 *
 * Handshake, all with tagged messages: the listener's endpoint name is the
 * handle. The sender makes an endpoint and sends OFI_TAG_CONNECT {key, a
 * random token, its name}; the listener checks the key (a wrong one is
 * dropped and logged), makes a dedicated endpoint for the connection and
 * answers OFI_TAG_ACCEPT {key, the token, its name} from it. Data messages
 * then carry their sequence number as the tag, so the n-th send matches the
 * n-th receive whatever the arrival order.
 *
 * Liveness messages (probes, the goodbye) carry the key and the connection's
 * token, which only its two ends know; the goodbye must also come from the
 * peer's endpoint where the provider can tell (FI_DIRECTED_RECV). Anything
 * else on those tags is ignored (one WARN every OFI_STRAY_WARN_SEC at most).
 *
 * GPU memory: where the provider offers FI_HMEM and a device buffer
 * registers at init (ofi_hmem_setup), the devices advertise CUDA pointers,
 * device buffers are registered with fi_mr_regattr (FI_HMEM_CUDA) and go
 * to the provider as they are, so the net transport can skip host staging
 * where BRAID_NET_GDR_LEVEL allows. Elsewhere, or with BRAID_OFI_HMEM=0,
 * every message stages through host memory; one NET INFO line says why.
 */
#include "transport/net.h"
#include "transport/net_ofi.h"

#ifndef BRAID_HAVE_LIBFABRIC

#include <stdio.h>

static ncclResult_t ofi_init(int* ndev, char* why, size_t why_size) {
  *ndev = 0;
  snprintf(why, why_size, "not built: rdma/fabric.h (libfabric-dev) was missing at build time");
  return ncclSuccess;
}
static ncclResult_t ofi_none(void) { return net_unsupported("OFI", "anything (not built)"); }
static ncclResult_t ofi_props(int d, struct braid_net_props* p) { return ofi_none(); }
static ncclResult_t ofi_listen(int d, const uint8_t* k, void* h, void** l) { return ofi_none(); }
static ncclResult_t ofi_connect(int d, const uint8_t* k, const void* h, void** st, void** s) {
  return ofi_none();
}
static void ofi_connect_abandon(void* st) {}
static ncclResult_t ofi_accept(void* l, void** r) { return ofi_none(); }
static ncclResult_t ofi_reg_mr(void* c, void* d, size_t s, int cu, void** m) { return ofi_none(); }
static ncclResult_t ofi_reg_mr_dmabuf(void* c, void* d, size_t s, uint64_t o, int fd, void** m) {
  return ofi_none();
}
static ncclResult_t ofi_dereg_mr(void* c, void* m) { return ncclSuccess; }
static ncclResult_t ofi_isend(void* c, void* d, size_t s, void* m, void** r) { return ofi_none(); }
static ncclResult_t ofi_irecv(void* c, void* d, size_t s, void* m, void** r) { return ofi_none(); }
static ncclResult_t ofi_iflush(void* c, void* d, size_t s, void* m, void** r) { return ofi_none(); }
static ncclResult_t ofi_test(void* r, int* done, size_t* size) { return ofi_none(); }
static ncclResult_t ofi_idle(void* c) { return ofi_none(); }
static ncclResult_t ofi_close(void* c) { return ncclSuccess; }
#define ofi_close_send ofi_close
#define ofi_close_recv ofi_close
#define ofi_close_listen ofi_close
#define ofi_close_abort ofi_close

size_t net_ofi_comm_name(void* comm, void* name, size_t size) { return 0; }

#else /* BRAID_HAVE_LIBFABRIC */

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <netinet/in.h>
#include <sys/socket.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>

#include "base/debug.h"
#include "base/error.h"
#include "base/utils.h"
#include "transport/net_ofi_fabric.h"
#include "transport/net_ofi_hmem.h"

#define OFI_MAGIC 0x2049464fu /* "OFI " */
#define OFI_VERSION 3         /* 3: a connection token; probes and goodbye authenticated */
#define OFI_NAME_MAX 80
#define OFI_TAG_CTRL (1ull << 62)
#define OFI_TAG_CONNECT (OFI_TAG_CTRL | 1)
#define OFI_TAG_ACCEPT (OFI_TAG_CTRL | 2)
#define OFI_TAG_PROBE (OFI_TAG_CTRL | 3)
#define OFI_TAG_BYE (OFI_TAG_CTRL | 4)
#define OFI_PROBE_SEC 1.0      /* a comm with requests but no completion for this long probes its peer */
#define OFI_PROBE_FAIL_SEC 5.0 /* a probe not taken within this long means the peer is gone */
#define OFI_STRAY_WARN_SEC 10.0 /* stray liveness messages: one WARN this often at most */
#define OFI_TAG_DATA_MASK (OFI_TAG_CTRL - 1)

/* What travels to the sender: the listener's endpoint name. Nothing else. */
struct ofi_handle {
  uint32_t magic;
  uint16_t version;
  uint16_t namelen;
  char name[OFI_NAME_MAX];
};
_Static_assert(sizeof(struct ofi_handle) <= BRAID_NET_HANDLE_BYTES, "OFI handle must fit");

/* A connection request (OFI_TAG_CONNECT) or its answer (OFI_TAG_ACCEPT). */
struct ofi_ctrl_msg {
  uint32_t magic;
  uint16_t version;
  uint16_t namelen;
  uint8_t key[BRAID_NET_KEY_BYTES];
  uint64_t token; /* the connecting side's random pick, echoed by the answer; never 0 */
  char name[OFI_NAME_MAX];
};

/* A liveness probe (OFI_TAG_PROBE) or the goodbye of a closing sender (OFI_TAG_BYE). */
enum { OFI_LIVE_PROBE = 1, OFI_LIVE_BYE = 2 };
struct ofi_live_msg {
  uint32_t magic;
  uint16_t version;
  uint16_t kind; /* OFI_LIVE_*, as its tag says */
  uint8_t key[BRAID_NET_KEY_BYTES];
  uint64_t token; /* the connection's */
  uint64_t seq;
};

/* A registration (the mhandle): host memory where the provider needs it, or CUDA memory. */
struct ofi_mr {
  struct fid_mr* mr;
  int cuda_dev; /* the GPU owning the memory; -1: host memory */
};

struct ofi_req {
  struct fi_context ctx; /* first: completions point back at the request */
  struct ofi_comm* comm;
  int used, done;
  size_t size;
};

struct ofi_comm {
  int dev;
  int is_send;
  struct fid_ep* ep;
  struct fid_av* av;
  struct fid_cq* cq;
  fi_addr_t peer;
  char self_name[OFI_NAME_MAX];
  size_t self_len;
  uint64_t seq;                /* data messages posted */
  struct ofi_req reqs[OFI_MAX_REQS];
  struct ofi_req ctrl_send, ctrl_recv; /* handshake messages */
  struct ofi_ctrl_msg ctrl_out, ctrl_in;
  int ctrl_recv_posted;
  uint8_t key[BRAID_NET_KEY_BYTES]; /* what connections (and liveness messages) must present */
  uint64_t token;             /* the connection's (connecting and connected comms) */
  ncclResult_t failed;
  /* Liveness: a stalled comm probes its peer; a send to a dead one fails (see ofi_probe). */
  char peer_name[OFI_NAME_MAX];
  struct ofi_comm* prober;    /* a second endpoint the probes go out from */
  struct ofi_comm* accepting; /* listener: accepted, its answer not yet posted (EAGAIN) */
  struct ofi_req probe_send, probe_recv, bye_recv;
  struct ofi_live_msg probe_out, probe_in, bye_in;
  int probing;                /* the probe's receive is posted (connected data comms) */
  int bye_posted;             /* the goodbye's receive is posted */
  int peer_done;              /* the peer said goodbye: no error, nothing more will come */
  double last_completion;
  double probe_started;       /* prober: when the probe in flight was first tried (0: none) */
  double probe_looked;        /* prober: when ofi_probe last looked at that probe */
  int outstanding;            /* data requests posted and not yet completed */
};

/* ----------------------------------------------------------- endpoints */

static void ofi_comm_free(struct ofi_comm* c) {
  if (c == NULL) return;
  ofi_comm_free(c->prober);
  ofi_comm_free(c->accepting);
  if (c->ep) fi_close(&c->ep->fid);
  if (c->cq) fi_close(&c->cq->fid);
  if (c->av) fi_close(&c->av->fid);
  free(c);
}

/* A new comm with its endpoint enabled and its own name known. */
static ncclResult_t ofi_comm_new(int dev, int is_send, struct ofi_comm** out) {
  ncclResult_t res = ncclSuccess;
  struct ofi_comm* c = NULL;
  struct fid_domain* domain = NULL;
  struct fi_av_attr av_attr = {.type = FI_AV_TABLE};
  struct fi_cq_attr cq_attr = {.format = FI_CQ_FORMAT_TAGGED, .size = 4 * OFI_MAX_REQS};
  int rc;
  *out = NULL;
  if (dev < 0 || dev >= ofi.ndev) return braid_err(ncclInternalError, "net OFI: no device %d", dev);
  BRAID_TRY(ofi_domain_get(dev, &domain));
  BRAID_TRY(BRAID_CALLOC(&c, 1, "an OFI connection"));
  c->dev = dev;
  c->is_send = is_send;
  c->peer = FI_ADDR_UNSPEC;
  if ((rc = fi_endpoint(domain, ofi.devs[dev].info, &c->ep, NULL)) != 0) goto fail_rc;
  if ((rc = fi_av_open(domain, &av_attr, &c->av, NULL)) != 0) goto fail_rc;
  if ((rc = fi_cq_open(domain, &cq_attr, &c->cq, NULL)) != 0) goto fail_rc;
  if ((rc = fi_ep_bind(c->ep, &c->av->fid, 0)) != 0) goto fail_rc;
  if ((rc = fi_ep_bind(c->ep, &c->cq->fid, FI_TRANSMIT | FI_RECV)) != 0) goto fail_rc;
  if ((rc = fi_enable(c->ep)) != 0) goto fail_rc;
  c->self_len = sizeof c->self_name;
  if ((rc = fi_getname(&c->ep->fid, c->self_name, &c->self_len)) != 0) goto fail_rc;
  *out = c;
  return ncclSuccess;
fail_rc:
  res = ofi_fail("creating an endpoint", rc);
fail:
  ofi_comm_free(c);
  return res;
}

static void ofi_addr_text(struct ofi_comm* c, const void* name, char* out, size_t size) {
  size_t len = size;
  if (fi_av_straddr(c->av, name, out, &len) == NULL) snprintf(out, size, "(unknown address)");
}

/*
 * Why `len` bytes of `name`, from a peer, cannot be an endpoint name on device `dev`, or NULL.
 * Socket addresses must be IPv4 or IPv6 of their exact size; other formats as long as this
 * device's own address.
 */
static const char* ofi_name_check(int dev, const char* name, size_t len) {
  if (dev < 0 || dev >= ofi.ndev) return "for no device of this process";
  if (len == 0 || len > OFI_NAME_MAX) return "an address of a length no endpoint has";
  const struct fi_info* i = ofi.devs[dev].info;
  if (i->addr_format == FI_SOCKADDR || i->addr_format == FI_SOCKADDR_IN ||
      i->addr_format == FI_SOCKADDR_IN6) {
    sa_family_t family = 0;
    if (len >= sizeof family) memcpy(&family, name, sizeof family);
    if ((family == AF_INET && len == sizeof(struct sockaddr_in)) ||
        (family == AF_INET6 && len == sizeof(struct sockaddr_in6)))
      return NULL;
    return "not an IPv4 or IPv6 socket address";
  }
  if (i->src_addrlen != 0 && len != i->src_addrlen)
    return "an address of another length than this device's";
  return NULL;
}

/*
 * A liveness message that is not the peer's (wrong key, token, size or kind; or too large to
 * take): ignored. Strangers may send many, so they are logged once every OFI_STRAY_WARN_SEC
 * at most, with how many went unlogged.
 */
static void ofi_stray(struct ofi_comm* c, const char* what, const char* why) {
  static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
  static double last;
  static unsigned long unlogged;
  double now = braid_time_sec();
  unsigned long before = 0;
  int say = 0;
  pthread_mutex_lock(&lock);
  if (last == 0 || now - last >= OFI_STRAY_WARN_SEC) {
    say = 1;
    before = unlogged;
    unlogged = 0;
    last = now;
  } else {
    unlogged++;
  }
  pthread_mutex_unlock(&lock);
  if (!say) return;
  char addr[128], more[96] = "";
  ofi_addr_text(c, c->peer_name, addr, sizeof addr);
  if (before > 0)
    snprintf(more, sizeof more, "; %lu more were ignored since the last one", before);
  WARN("net OFI: ignored %s on the connection with %s: %s (one such warning every %.0f s at "
       "most%s)", what, addr, why, OFI_STRAY_WARN_SEC, more);
}

/* Why a liveness message (`len` bytes) is not the peer's, or NULL. */
static const char* ofi_live_check(const struct ofi_comm* c, const struct ofi_live_msg* m,
                                  size_t len, int kind) {
  uint8_t diff = 0;
  if (len != sizeof *m) return "a message of the wrong size";
  for (int i = 0; i < BRAID_NET_KEY_BYTES; i++) diff |= (uint8_t)(m->key[i] ^ c->key[i]);
  if (m->magic != OFI_MAGIC || m->version != OFI_VERSION || m->kind != kind)
    return "not a Braid OFI liveness message";
  if (diff != 0) return "wrong key (a process of another job, or a stale one)";
  if (m->token != c->token) return "the token of another connection";
  return NULL;
}

/* A completed receive of the peer's probe or goodbye: checked, and to be posted again. */
static void ofi_live_taken(struct ofi_comm* c, struct ofi_req* r) {
  if (r == &c->probe_recv) {
    /* A probe only has to be taken (its sender's completion is the signal): nothing changes. */
    const char* why = ofi_live_check(c, &c->probe_in, r->size, OFI_LIVE_PROBE);
    if (why) ofi_stray(c, "a liveness probe", why);
    c->probing = 0;
    return;
  }
  const char* why = ofi_live_check(c, &c->bye_in, r->size, OFI_LIVE_BYE);
  if (why) {
    ofi_stray(c, "a goodbye", why);
    c->bye_posted = 0;
    return;
  }
  c->peer_done = 1; /* the receive stays consumed: nothing more comes */
}

/* Reads completions into their requests; a failed one fails the comm. */
static ncclResult_t ofi_progress(struct ofi_comm* c) {
  struct fi_cq_tagged_entry e[16];
  if (c->failed != ncclSuccess) return c->failed;
  for (;;) {
    ssize_t n = fi_cq_read(c->cq, e, 16);
    if (n == -FI_EAGAIN) return ncclSuccess;
    if (n == -FI_EAVAIL) {
      struct fi_cq_err_entry err;
      memset(&err, 0, sizeof err);
      fi_cq_readerr(c->cq, &err, 0);
      char buf[256];
      const char* text = fi_cq_strerror(c->cq, err.prov_errno, err.err_data, buf, sizeof buf);
      if (err.op_context == &c->ctrl_recv.ctx && (err.err == FI_ETRUNC || err.err == FI_EMSGSIZE)) {
        /* A handshake receive takes from anyone: a message that does not fit (not ours) is
           dropped, and the receive posted again, instead of failing the listener for good. */
        WARN("net OFI: dropped a malformed handshake message: %s (%s)", fi.strerror(err.err),
             text ? text : "");
        c->ctrl_recv_posted = 0;
        c->ctrl_recv.done = 0;
        continue;
      }
      if ((err.op_context == &c->probe_recv.ctx || err.op_context == &c->bye_recv.ctx) &&
          (err.err == FI_ETRUNC || err.err == FI_EMSGSIZE)) {
        /* The same for the liveness receives: a stranger's oversized message fails nothing. */
        int probe = err.op_context == &c->probe_recv.ctx;
        ofi_stray(c, probe ? "a liveness probe" : "a goodbye", "a message larger than ours");
        if (probe) c->probing = 0;
        else c->bye_posted = 0;
        continue;
      }
      c->failed = braid_err(err.err == FI_ETRUNC ? ncclInternalError : ncclRemoteError,
                            "net OFI: a %s %s failed: %s (%s)", c->is_send ? "send to" : "receive from",
                            "the peer", fi.strerror(err.err), text ? text : "");
      return c->failed;
    }
    if (n < 0) return c->failed = ofi_fail("fi_cq_read", (int)n);
    for (ssize_t i = 0; i < n; i++) {
      struct ofi_req* r = e[i].op_context;
      r->size = e[i].len;
      r->done = 1;
      if (r >= c->reqs && r < c->reqs + OFI_MAX_REQS) {
        c->outstanding--;
        /* Only the peer's data says it is alive: what anyone can send (a probe) does not. */
        c->last_completion = braid_time_sec();
      } else if (r == &c->probe_recv || r == &c->bye_recv) {
        ofi_live_taken(c, r);
      }
    }
  }
}

static ncclResult_t ofi_peer_insert(struct ofi_comm* c, const void* name);
static ncclResult_t ofi_comm_new(int dev, int is_send, struct ofi_comm** out);

/* Keeps a connected comm's receives for its peer's probes and goodbye posted. */
static ncclResult_t ofi_live_post(struct ofi_comm* c) {
  ssize_t rc;
  if (!c->probing) {
    c->probe_recv = (struct ofi_req){.comm = c, .used = 1};
    /* From any address: the peer probes from an endpoint of its own (its prober), whose
       address is not known here. A probe only has to be taken; it changes nothing here. */
    rc = fi_trecv(c->ep, &c->probe_in, sizeof c->probe_in, NULL, FI_ADDR_UNSPEC, OFI_TAG_PROBE,
                  0, &c->probe_recv.ctx);
    if (rc == -FI_EAGAIN) return ncclSuccess; /* retried on the next turn */
    if (rc != 0) return c->failed = ofi_fail("posting a liveness probe receive", (int)rc);
    c->probing = 1;
  }
  if (!c->bye_posted && !c->peer_done) {
    c->bye_recv = (struct ofi_req){.comm = c, .used = 1};
    /* From the peer's endpoint only, where the provider honours the source (FI_DIRECTED_RECV). */
    rc = fi_trecv(c->ep, &c->bye_in, sizeof c->bye_in, NULL, c->peer, OFI_TAG_BYE, 0,
                  &c->bye_recv.ctx);
    if (rc == -FI_EAGAIN) return ncclSuccess;
    if (rc != 0) return c->failed = ofi_fail("posting a goodbye receive", (int)rc);
    c->bye_posted = 1;
  }
  return ncclSuccess;
}

/* A liveness message of comm `c` (its key and token) into `m`. */
static void ofi_live_fill(const struct ofi_comm* c, struct ofi_live_msg* m, int kind,
                          uint64_t seq) {
  memset(m, 0, sizeof *m);
  m->magic = OFI_MAGIC;
  m->version = OFI_VERSION;
  m->kind = (uint16_t)kind;
  memcpy(m->key, c->key, BRAID_NET_KEY_BYTES);
  m->token = c->token;
  m->seq = seq;
}

/*
 * Liveness. With reliable datagrams a receive waiting for a dead peer, or a
 * large send waiting for a dead receiver's rendezvous, never completes in
 * error by itself, and a probe on the same endpoint would queue behind the
 * stalled transfer. So a comm whose requests have seen no completion for
 * OFI_PROBE_SEC sends its peer a tiny probe from a second endpoint of its
 * own (a fresh path); the peer keeps a receive posted for probes. A probe to
 * a live peer completes; one to a dead peer fails, and so does the comm.
 */
static ncclResult_t ofi_probe(struct ofi_comm* c) {
  ncclResult_t res = ncclSuccess;
  if (c->peer_done) return ncclSuccess; /* it closed its end: its silence is no error */
  BRAID_TRY(ofi_live_post(c));
  if (c->outstanding == 0 || braid_time_sec() - c->last_completion < OFI_PROBE_SEC) return ncclSuccess;
  if (c->prober == NULL) {
    BRAID_TRY(ofi_comm_new(c->dev, 1, &c->prober));
    BRAID_TRY(ofi_peer_insert(c->prober, c->peer_name));
  }
  struct ofi_comm* p = c->prober;
  if ((res = ofi_progress(p)) != ncclSuccess) return c->failed = res;
  if (p->probe_send.done) p->probe_started = 0; /* answered: the peer is alive */
  double now = braid_time_sec();
  /* Only time this side spent looking counts against the peer: when this thread was away (a
     starved or descheduled process, another comm's long turn), the deadline moves with it. */
  if (p->probe_started > 0 && now - p->probe_looked > OFI_PROBE_SEC)
    p->probe_started += now - p->probe_looked;
  p->probe_looked = now;
  if (p->probe_started > 0 && now - p->probe_started > OFI_PROBE_FAIL_SEC) {
    char addr[128];
    ofi_addr_text(c, c->peer_name, addr, sizeof addr);
    return c->failed = braid_err(ncclRemoteError,
                                 "net OFI: the peer at %s took no liveness probe within %.0f s while "
                                 "%d request%s waited: it died, or its process stopped making progress",
                                 addr, OFI_PROBE_FAIL_SEC, c->outstanding, c->outstanding == 1 ? "" : "s");
  }
  if (p->probe_send.used && !p->probe_send.done) return ncclSuccess;
  if (p->probe_started == 0) p->probe_started = now;
  p->probe_send = (struct ofi_req){.comm = p, .used = 1};
  ofi_live_fill(c, &p->probe_out, OFI_LIVE_PROBE, p->probe_out.seq + 1);
  ssize_t rc = fi_tsend(p->ep, &p->probe_out, sizeof p->probe_out, NULL, p->peer, OFI_TAG_PROBE,
                        &p->probe_send.ctx);
  if (rc == -FI_EAGAIN) { /* connecting to the peer: keeps failing when it is gone */
    p->probe_send.used = 0;
    return ncclSuccess;
  }
  if (rc != 0) return c->failed = ofi_fail("sending a liveness probe", (int)rc);
  c->last_completion = now; /* the next probe waits a full period */
  return ncclSuccess;
fail:
  return c->failed = res;
}

/* ------------------------------------------------------------ handshake */

static ncclResult_t ofi_post_ctrl_recv(struct ofi_comm* c, uint64_t tag) {
  c->ctrl_recv = (struct ofi_req){.comm = c};
  ssize_t rc = fi_trecv(c->ep, &c->ctrl_in, sizeof c->ctrl_in, NULL, FI_ADDR_UNSPEC, tag, 0,
                        &c->ctrl_recv.ctx);
  if (rc == -FI_EAGAIN) return ncclSuccess; /* retried on the next call */
  if (rc != 0) return ofi_fail("posting a handshake receive", (int)rc);
  c->ctrl_recv_posted = 1;
  return ncclSuccess;
}

/*
 * Posts the handshake message once. -FI_EAGAIN (the provider is still setting
 * up its connection to the peer, which needs the peer's progress too) leaves
 * it unposted for the caller's next turn: spinning here instead would hold the
 * proxy thread, and two proxies connecting to each other would each wait for
 * the other's progress.
 */
static ncclResult_t ofi_send_ctrl(struct ofi_comm* c, uint64_t tag, const uint8_t* key) {
  if (c->ctrl_send.used) return ncclSuccess;
  memset(&c->ctrl_out, 0, sizeof c->ctrl_out);
  c->ctrl_out.magic = OFI_MAGIC;
  c->ctrl_out.version = OFI_VERSION;
  c->ctrl_out.namelen = (uint16_t)c->self_len;
  memcpy(c->ctrl_out.name, c->self_name, c->self_len);
  if (key) memcpy(c->ctrl_out.key, key, BRAID_NET_KEY_BYTES);
  c->ctrl_out.token = c->token;
  c->ctrl_send = (struct ofi_req){.comm = c};
  ssize_t rc = fi_tsend(c->ep, &c->ctrl_out, sizeof c->ctrl_out, NULL, c->peer, tag, &c->ctrl_send.ctx);
  if (rc == -FI_EAGAIN) return ofi_progress(c);
  if (rc != 0) return ofi_fail("sending a handshake message", (int)rc);
  c->ctrl_send.used = 1;
  return ncclSuccess;
}

static ncclResult_t ofi_listen(int dev, const uint8_t* key, void* handle, void** listen_comm) {
  ncclResult_t res = ncclSuccess;
  struct ofi_comm* l = NULL;
  struct ofi_handle* h = handle;
  *listen_comm = NULL;
  BRAID_TRY(ofi_comm_new(dev, 0, &l));
  memcpy(l->key, key, BRAID_NET_KEY_BYTES);
  BRAID_TRY(ofi_post_ctrl_recv(l, OFI_TAG_CONNECT));
  memset(h, 0, BRAID_NET_HANDLE_BYTES);
  h->magic = OFI_MAGIC;
  h->version = OFI_VERSION;
  h->namelen = (uint16_t)l->self_len;
  memcpy(h->name, l->self_name, l->self_len);
  *listen_comm = l;
  return ncclSuccess;
fail:
  ofi_comm_free(l);
  return res;
}

static void ofi_connect_abandon(void* state) { ofi_comm_free(state); }

/* Inserts a peer's endpoint name (checked with ofi_name_check) into the comm's address vector. */
static ncclResult_t ofi_peer_insert(struct ofi_comm* c, const void* name) {
  memcpy(c->peer_name, name, OFI_NAME_MAX);
  int n = fi_av_insert(c->av, name, 1, &c->peer, 0, NULL);
  return n == 1 ? ncclSuccess : ofi_fail("fi_av_insert", n < 0 ? n : -FI_EINVAL);
}

/* Why a handshake message (a request, or the answer) must be refused, or NULL. */
static const char* ofi_request_check(const struct ofi_comm* l, const struct ofi_ctrl_msg* m) {
  uint8_t diff = 0;
  for (int i = 0; i < BRAID_NET_KEY_BYTES; i++) diff |= (uint8_t)(m->key[i] ^ l->key[i]);
  if (m->magic != OFI_MAGIC || m->version != OFI_VERSION) return "not a Braid OFI request";
  const char* why = ofi_name_check(l->dev, m->name, m->namelen);
  if (why) return why;
  if (diff != 0) return "wrong key (a process of another job, or a stale one)";
  if (m->token == 0) return "no connection token";
  return NULL;
}

/* Why a listener's handle, from a peer, cannot be connected to from device `dev`, or NULL. */
static const char* ofi_handle_check(int dev, const struct ofi_handle* h) {
  if (h->magic != OFI_MAGIC) return "not an OFI backend's (both ends must use the same BRAID_NET)";
  if (h->version != OFI_VERSION) return "another version of Braid's OFI protocol";
  return ofi_name_check(dev, h->name, h->namelen);
}

/* A connect's state: the connecting comm, its request to the listener under way. */
static ncclResult_t ofi_connecting_new(int dev, const struct ofi_handle* h, struct ofi_comm** out) {
  ncclResult_t res = ncclSuccess;
  struct ofi_comm* c = NULL;
  BRAID_TRY(ofi_comm_new(dev, 1, &c));
  do {
    BRAID_TRY(braid_random_bytes(&c->token, sizeof c->token));
  } while (c->token == 0);
  BRAID_TRY(ofi_peer_insert(c, h->name));
  BRAID_TRY(ofi_post_ctrl_recv(c, OFI_TAG_ACCEPT));
  *out = c;
  return ncclSuccess;
fail:
  ofi_comm_free(c);
  return res;
}

static ncclResult_t ofi_connect(int dev, const uint8_t* key, const void* handle, void** state,
                                void** send_comm) {
  ncclResult_t res = ncclSuccess;
  struct ofi_comm* c = *state;
  *send_comm = NULL;
  if (c == NULL) {
    struct ofi_handle h;
    memcpy(&h, handle, sizeof h);
    const char* why = ofi_handle_check(dev, &h);
    if (why)
      return braid_err(ncclInternalError, "net OFI: cannot use the connection handle: %s", why);
    BRAID_TRY(ofi_connecting_new(dev, &h, &c));
    memcpy(c->key, key, BRAID_NET_KEY_BYTES);
    *state = c;
  }
  if (!c->ctrl_recv_posted) BRAID_TRY(ofi_post_ctrl_recv(c, OFI_TAG_ACCEPT));
  BRAID_TRY(ofi_send_ctrl(c, OFI_TAG_CONNECT, key));
  BRAID_TRY(ofi_progress(c));
  if (!c->ctrl_send.used || !c->ctrl_recv.done || !c->ctrl_send.done)
    return ncclSuccess; /* not yet: call again */
  const char* why = ofi_request_check(c, &c->ctrl_in);
  if (why == NULL && c->ctrl_in.token != c->token) why = "an answer to another request";
  if (why) { /* not the listener's answer: dropped, and the answer still awaited */
    char addr[128];
    if (ofi_name_check(c->dev, c->ctrl_in.name, c->ctrl_in.namelen) == NULL)
      ofi_addr_text(c, c->ctrl_in.name, addr, sizeof addr);
    else
      snprintf(addr, sizeof addr, "(a malformed address)");
    WARN("net OFI: dropped an answer to a connection request from %s: %s", addr, why);
    c->ctrl_recv_posted = 0;
    c->ctrl_recv.done = 0;
    return ncclSuccess;
  }
  fi_av_remove(c->av, &c->peer, 1, 0); /* from now on the peer is its dedicated endpoint */
  BRAID_TRY(ofi_peer_insert(c, c->ctrl_in.name));
  BRAID_TRY(ofi_live_post(c)); /* probes and the goodbye from the peer */
  *state = NULL;
  *send_comm = c;
  return ncclSuccess;
fail:
  ofi_connect_abandon(*state);
  *state = NULL;
  return res;
}

static ncclResult_t ofi_accept(void* listen_comm, void** recv_comm) {
  ncclResult_t res = ncclSuccess;
  struct ofi_comm* l = listen_comm;
  struct ofi_comm* c = NULL;
  *recv_comm = NULL;
  if (l->accepting) {
    c = l->accepting;
    l->accepting = NULL;
    goto answer;
  }
  if (!l->ctrl_recv_posted) BRAID_TRY(ofi_post_ctrl_recv(l, OFI_TAG_CONNECT));
  BRAID_TRY(ofi_progress(l));
  if (!l->ctrl_recv_posted || !l->ctrl_recv.done) return ncclSuccess;
  struct ofi_ctrl_msg m = l->ctrl_in;
  l->ctrl_recv_posted = 0;
  BRAID_TRY(ofi_post_ctrl_recv(l, OFI_TAG_CONNECT)); /* for the next request */
  const char* why = ofi_request_check(l, &m);
  if (why) {
    char addr[128];
    if (ofi_name_check(l->dev, m.name, m.namelen) == NULL)
      ofi_addr_text(l, m.name, addr, sizeof addr);
    else
      snprintf(addr, sizeof addr, "(a malformed address)");
    WARN("net OFI: dropped a connection request from %s: %s", addr, why);
    return ncclSuccess;
  }
  BRAID_TRY(ofi_comm_new(l->dev, 0, &c));
  memcpy(c->key, l->key, BRAID_NET_KEY_BYTES);
  c->token = m.token;
  BRAID_TRY(ofi_peer_insert(c, m.name));
answer:
  BRAID_TRY(ofi_send_ctrl(c, OFI_TAG_ACCEPT, l->key)); /* the connecting side checks it too */
  if (!c->ctrl_send.used) { /* not posted yet: the listener keeps it for the next call */
    l->accepting = c;
    return ncclSuccess;
  }
  BRAID_TRY(ofi_live_post(c)); /* probes and the goodbye from the peer */
  *recv_comm = c;
  return ncclSuccess;
fail:
  ofi_comm_free(c);
  return res;
}

/* ------------------------------------------------------------ data path */

/* The mhandle for registration `mr` of memory owned by `cuda_dev` (-1: host). */
static ncclResult_t ofi_mr_wrap(struct fid_mr* mr, int cuda_dev, void** mhandle) {
  ncclResult_t res = ncclSuccess;
  struct ofi_mr* m = NULL;
  BRAID_TRY(BRAID_CALLOC(&m, 1, "an OFI memory registration"));
  m->mr = mr;
  m->cuda_dev = cuda_dev;
  *mhandle = m;
  return ncclSuccess;
fail:
  fi_close(&mr->fid);
  return res;
}

/* CUDA device memory, where the devices take it (ofi.hmem): fi_mr_regattr with FI_HMEM_CUDA. */
static ncclResult_t ofi_reg_cuda(struct ofi_comm* c, void* data, size_t size, void** mhandle) {
  ncclResult_t res = ncclSuccess;
  struct fid_domain* domain = NULL;
  struct fid_mr* mr = NULL;
  struct fi_mr_attr attr;
  struct iovec iov;
  if (!ofi.hmem)
    return net_unsupported("OFI",
                           "registering GPU memory without FI_HMEM (see the NET INFO line "
                           "\"net OFI: GPU memory off\")");
  int cuda_dev = ofi_hmem_ptr_dev(data);
  if (cuda_dev < 0)
    return braid_err(ncclInvalidUsage,
                     "net OFI: %p, registered as GPU memory, is no CUDA device memory", data);
  BRAID_TRY(ofi_domain_get(c->dev, &domain));
  ofi_hmem_mr_attr_fill(&attr, &iov, data, size, cuda_dev);
  int rc = fi_mr_regattr(domain, &attr, 0, &mr);
  if (rc != 0) return ofi_fail("fi_mr_regattr of GPU memory", rc);
  return ofi_mr_wrap(mr, cuda_dev, mhandle);
fail:
  return res;
}

static ncclResult_t ofi_reg_mr(void* comm, void* data, size_t size, int is_cuda, void** mhandle) {
  ncclResult_t res = ncclSuccess;
  struct ofi_comm* c = comm;
  struct fid_domain* domain = NULL;
  struct fid_mr* mr = NULL;
  *mhandle = NULL;
  if (is_cuda) return ofi_reg_cuda(c, data, size, mhandle);
  if (!(ofi.devs[c->dev].info->domain_attr->mr_mode & FI_MR_LOCAL)) return ncclSuccess;
  BRAID_TRY(ofi_domain_get(c->dev, &domain));
  int rc = fi_mr_reg(domain, data, size, FI_SEND | FI_RECV, 0, 0, 0, &mr, NULL);
  if (rc != 0) return ofi_fail("fi_mr_reg", rc);
  return ofi_mr_wrap(mr, -1, mhandle);
fail:
  return res;
}

static ncclResult_t ofi_reg_mr_dmabuf(void* comm, void* data, size_t size, uint64_t offset, int fd,
                                      void** mhandle) {
  *mhandle = NULL;
  return net_unsupported("OFI", "registering a dma-buf");
}

static ncclResult_t ofi_dereg_mr(void* comm, void* mhandle) {
  struct ofi_mr* m = mhandle;
  if (m == NULL) return ncclSuccess;
  fi_close(&m->mr->fid);
  free(m);
  return ncclSuccess;
}

static ncclResult_t ofi_post(struct ofi_comm* c, void* data, size_t size, void* mhandle, void** request) {
  *request = NULL;
  ncclResult_t res = ofi_progress(c);
  if (res != ncclSuccess) return res;
  if (!c->ctrl_send.done) return ncclSuccess; /* the accept answer goes first */
  struct ofi_req* r = &c->reqs[c->seq % OFI_MAX_REQS];
  if (r->used) return ncclSuccess;
  *r = (struct ofi_req){.comm = c, .used = 1};
  void* desc = mhandle ? fi_mr_desc(((struct ofi_mr*)mhandle)->mr) : NULL;
  uint64_t tag = c->seq & OFI_TAG_DATA_MASK;
  ssize_t rc = c->is_send ? fi_tsend(c->ep, data, size, desc, c->peer, tag, &r->ctx)
                          : fi_trecv(c->ep, data, size, desc, c->peer, tag, 0, &r->ctx);
  if (rc == -FI_EAGAIN) {
    r->used = 0;
    return ncclSuccess;
  }
  if (rc != 0) {
    r->used = 0;
    return c->failed = ofi_fail(c->is_send ? "fi_tsend" : "fi_trecv", (int)rc);
  }
  c->seq++;
  if (c->outstanding++ == 0) c->last_completion = braid_time_sec();
  *request = r;
  return ncclSuccess;
}

static ncclResult_t ofi_isend(void* comm, void* data, size_t size, void* mhandle, void** request) {
  return ofi_post(comm, data, size, mhandle, request);
}

static ncclResult_t ofi_irecv(void* comm, void* data, size_t size, void* mhandle, void** request) {
  return ofi_post(comm, data, size, mhandle, request);
}

/*
 * Received GPU data: on GPUs that need it (ofi.hmem_flush, as NCCL decides:
 * before compute capability 9.0) the NIC's writes are flushed here, before
 * returning, so there is never a request to test. Host memory needs nothing.
 */
static ncclResult_t ofi_iflush(void* comm, void* data, size_t size, void* mhandle, void** request) {
  const struct ofi_mr* m = mhandle;
  *request = NULL;
  if (m == NULL || m->cuda_dev < 0 || !ofi.hmem_flush) return ncclSuccess;
  return ofi_hmem_flush(m->cuda_dev);
}

static ncclResult_t ofi_test(void* request, int* done, size_t* size) {
  struct ofi_req* r = request;
  *done = 0;
  ncclResult_t res = ofi_progress(r->comm);
  if (res == ncclSuccess && !r->done) res = ofi_probe(r->comm);
  if (res != ncclSuccess) return res;
  if (!r->done) return ncclSuccess;
  *done = 1;
  if (size) *size = r->size;
  r->used = 0;
  return ncclSuccess;
}

/*
 * An idle comm's turn: its completion queue read, so that the provider
 * (manual progress) accepts the peer prober's connection and completes its
 * probes, and a consumed probe receive posted again. Without it a sender
 * with nothing to send for OFI_PROBE_SEC + OFI_PROBE_FAIL_SEC looked dead
 * to its receiver, whose receives are always posted.
 */
static ncclResult_t ofi_idle(void* comm) {
  struct ofi_comm* c = comm;
  ncclResult_t res = ofi_progress(c);
  return res != ncclSuccess ? res : ofi_probe(c);
}

/*
 * Says goodbye to a connected peer (OFI_TAG_BYE from this comm's own endpoint, with the key and
 * the connection's token, waited for a moment), so that its pending receives read as "nothing
 * more comes", not as a dead peer.
 */
static void ofi_say_bye(struct ofi_comm* c) {
  if (c == NULL || c->peer == FI_ADDR_UNSPEC || c->failed != ncclSuccess || c->peer_done) return;
  struct ofi_req bye = {.comm = c, .used = 1};
  struct ofi_live_msg msg;
  double end = braid_time_sec() + 0.2;
  ssize_t rc;
  ofi_live_fill(c, &msg, OFI_LIVE_BYE, 0);
  while ((rc = fi_tsend(c->ep, &msg, sizeof msg, NULL, c->peer, OFI_TAG_BYE, &bye.ctx)) ==
             -FI_EAGAIN &&
         braid_time_sec() < end)
    ofi_progress(c);
  while (rc == 0 && !bye.done && c->failed == ncclSuccess && braid_time_sec() < end) ofi_progress(c);
}

static ncclResult_t ofi_close_comm(void* comm) {
  struct ofi_comm* c = comm;
  if (c && c->is_send) ofi_say_bye(c);
  ofi_comm_free(c);
  return ncclSuccess;
}
static ncclResult_t ofi_close_listen(void* comm) {
  ofi_comm_free(comm);
  return ncclSuccess;
}
#define ofi_close_send ofi_close_comm
#define ofi_close_recv ofi_close_comm

/* An abort: no goodbye (and no wait for one to go out), so the peer's receives fail. */
static ncclResult_t ofi_close_abort(void* comm) {
  ofi_comm_free(comm);
  return ncclSuccess;
}

size_t net_ofi_comm_name(void* comm, void* name, size_t size) {
  const struct ofi_comm* c = comm;
  if (c == NULL || c->self_len > size) return 0;
  memcpy(name, c->self_name, c->self_len);
  return c->self_len;
}

#endif /* BRAID_HAVE_LIBFABRIC */

const struct braid_net_ops braid_net_ofi = {
  .size = sizeof(struct braid_net_ops),
  .name = "OFI",
  .init = ofi_init,
  .get_properties = ofi_props,
  .listen = ofi_listen,
  .connect = ofi_connect,
  .connect_abandon = ofi_connect_abandon,
  .accept = ofi_accept,
  .reg_mr = ofi_reg_mr,
  .reg_mr_dmabuf = ofi_reg_mr_dmabuf,
  .dereg_mr = ofi_dereg_mr,
  .isend = ofi_isend,
  .irecv = ofi_irecv,
  .iflush = ofi_iflush,
  .test = ofi_test,
  .close_send = ofi_close_send,
  .close_recv = ofi_close_recv,
  .close_listen = ofi_close_listen,
  .close_abort = ofi_close_abort,
  .idle = ofi_idle,
};
