/*
 * The Plugin backend: Braid's net ops (net.h) over the NCCL net plugin the
 * process loaded (net_plugin.h), so that a fabric reached through a plugin
 * (aws-ofi-nccl and the like) carries Braid's network steps.
 *
 * The plugin moves the bytes: matching in order, the data path, and how a
 * peer's death or close shows (an error from test(), or not) are its own.
 * What this adapter adds, to keep net.h's contract:
 *   - the job's key. NCCL plugins carry none, so the first message of every
 *     connection is the key (BRAID_NET_KEY_BYTES): connect hands out the comm
 *     once its key has left, accept once a connection's key arrived and
 *     matched; one with another key, or none within PLUGIN_KEY_WAIT_S, is
 *     closed and logged.
 *   - a private, writable copy of the handle for each connect: NCCL plugins
 *     keep a connect's progress in the handle (NCCL calls connect again with
 *     the same one), Braid keeps it in the caller's state.
 *   - max_requests per comm, counted here (NCCL's promise to the plugin).
 *   - a buffer posted without a registration is registered for the
 *     request's lifetime (the tests post unregistered memory).
 *   - sizes held to max_bytes (1 GiB at most: test() reports an int).
 * Device offload, CollNet and the plugin's multi-receives are not used.
 */
#include "transport/net_plugin.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/debug.h"
#include "base/error.h"
#include "base/utils.h"
#include "transport/net.h"

#define PLUGIN_ACCEPT_SLOTS 8 /* connections whose key has not arrived yet, per listener */
#define PLUGIN_KEY_WAIT_S 30.0

_Static_assert(NET_PLUGIN_HANDLE_BYTES == BRAID_NET_HANDLE_BYTES, "a plugin handle fills Braid's");

struct plugin_comm;

struct plugin_req {
  struct plugin_comm* comm;
  void* req;    /* the plugin's */
  void* tmp_mh; /* a registration made for this request alone, or NULL */
  int used;
};

/* A send or receive comm: the plugin's, and the requests under way on it. */
struct plugin_comm {
  void* pc;
  int is_send;
  int outstanding;
  size_t max_bytes;
  struct plugin_req reqs[NET_PLUGIN_MAX_REQUESTS];
};

/* The key's message on a new connection: sent by connect, received by accept. */
struct plugin_key_xfer {
  void* pc; /* the plugin's comm; NULL: slot free */
  void* mh;
  void* req;
  uint8_t* buf; /* BRAID_NET_KEY_BYTES, registered */
  double since;
};

struct plugin_connect_state {
  uint8_t handle[NET_PLUGIN_HANDLE_BYTES] __attribute__((aligned(8)));
  struct plugin_key_xfer key;
};

struct plugin_listen {
  void* lc;
  int dev;
  uint8_t key[BRAID_NET_KEY_BYTES];
  struct plugin_key_xfer pending[PLUGIN_ACCEPT_SLOTS];
};

/* The plugin; every slot but init runs after init found it. */
static const struct net_plugin* plugin(void) { return net_plugin_get(NULL, 0); }

static ncclResult_t plugin_none(void) {
  return braid_err(ncclInternalError, "NET/Plugin: no net plugin is loaded");
}

/* ------------------------------------------------------------ the key */

static ncclResult_t plugin_key_start(const struct net_plugin* p, struct plugin_key_xfer* x,
                                     void* pc, const uint8_t* key) {
  ncclResult_t res = ncclSuccess;
  memset(x, 0, sizeof *x);
  x->pc = pc;
  x->since = braid_time_sec();
  if (posix_memalign((void**)&x->buf, 64, 64) != 0) {
    x->buf = NULL;
    return braid_err(ncclSystemError, "NET/Plugin: out of memory for a connection's key");
  }
  memset(x->buf, 0, 64);
  if (key) memcpy(x->buf, key, BRAID_NET_KEY_BYTES);
  res = net_plugin_reg_mr(p, pc, x->buf, BRAID_NET_KEY_BYTES, NET_PLUGIN_PTR_HOST, &x->mh);
  if (res != ncclSuccess)
    return braid_err(res, "NET/Plugin %s: registering a connection's key buffer failed: %s",
                     p->name, braid_result_str(res));
  return ncclSuccess;
}

/* Moves the key's message on; *done = 1 once it left (send) or arrived (receive). */
static ncclResult_t plugin_key_step(const struct net_plugin* p, struct plugin_key_xfer* x,
                                    int is_send, int* done) {
  int size = 0;
  ncclResult_t res = ncclSuccess;
  *done = 0;
  if (x->req == NULL) {
    res = is_send ? net_plugin_isend(p, x->pc, x->buf, BRAID_NET_KEY_BYTES, x->mh, &x->req)
                  : net_plugin_irecv(p, x->pc, x->buf, BRAID_NET_KEY_BYTES, x->mh, &x->req);
    if (res != ncclSuccess || x->req == NULL) return res;
  }
  res = p->test(x->req, done, &size);
  if (res == ncclSuccess && *done && !is_send && size != BRAID_NET_KEY_BYTES) *done = -1;
  return res;
}

/* Releases the key's buffer; and the connection too with `close_comm`. */
static void plugin_key_release(const struct net_plugin* p, struct plugin_key_xfer* x, int is_send,
                               int close_comm) {
  if (x->pc && x->mh) p->dereg_mr(x->pc, x->mh);
  if (x->pc && close_comm) (is_send ? p->close_send : p->close_recv)(x->pc);
  free(x->buf);
  memset(x, 0, sizeof *x);
}

/* ------------------------------------------------------------- comms */

static ncclResult_t plugin_comm_new(const struct net_plugin* p, int dev, void* pc, int is_send,
                                    struct plugin_comm** out) {
  struct net_plugin_props props;
  struct plugin_comm* c = calloc(1, sizeof *c);
  *out = NULL;
  if (c == NULL) return braid_err(ncclSystemError, "NET/Plugin: out of memory for a connection");
  c->pc = pc;
  c->is_send = is_send;
  c->max_bytes = NET_PLUGIN_MAX_SIZE;
  if (net_plugin_props(p, dev, &props) == ncclSuccess) c->max_bytes = props.max_bytes;
  for (int i = 0; i < NET_PLUGIN_MAX_REQUESTS; i++) c->reqs[i].comm = c;
  *out = c;
  return ncclSuccess;
}

/*
 * close_send, close_recv and close_abort. NCCL's interface has one close per end and no abort:
 * what the peer's pending requests see (an error at once, as with NCCL's socket plugin, or
 * nothing, where the plugin's peer does not notice a close) is the plugin's behaviour, whether
 * Braid closes cleanly or aborts.
 */
static ncclResult_t plugin_close(void* comm) {
  const struct net_plugin* p = plugin();
  struct plugin_comm* c = comm;
  if (c == NULL || p == NULL) return ncclSuccess;
  for (int i = 0; i < p->max_requests; i++) /* abandoned requests' own registrations first */
    if (c->reqs[i].used && c->reqs[i].tmp_mh) p->dereg_mr(c->pc, c->reqs[i].tmp_mh);
  ncclResult_t res = (c->is_send ? p->close_send : p->close_recv)(c->pc);
  if (res != ncclSuccess) /* a close never fails (net.h); the plugin may have said more */
    INFO(BRAID_LOG_NET, "NET/Plugin %s: closing a %s connection: %s", p->name,
         c->is_send ? "send" : "receive", braid_result_str(res));
  free(c);
  return ncclSuccess;
}

/* ------------------------------------------------------------ the ops */

static ncclResult_t plugin_init(int* ndev, char* why, size_t why_size) {
  const struct net_plugin* p = net_plugin_get(why, why_size);
  *ndev = p ? p->ndev : 0;
  return ncclSuccess;
}

static ncclResult_t plugin_get_properties(int dev, struct braid_net_props* props) {
  const struct net_plugin* p = plugin();
  struct net_plugin_props q;
  if (p == NULL) return plugin_none();
  if (dev < 0 || dev >= p->ndev)
    return braid_err(ncclInvalidArgument, "NET/Plugin %s: no device %d", p->name, dev);
  ncclResult_t res = net_plugin_props(p, dev, &q);
  if (res != ncclSuccess)
    return braid_err(res, "NET/Plugin %s: getProperties(%d) failed", p->name, dev);
  memset(props, 0, sizeof *props);
  if (q.name)
    snprintf(props->name, sizeof props->name, "%s", q.name);
  else
    snprintf(props->name, sizeof props->name, "%s%d", p->name, dev);
  if (q.pci_path) snprintf(props->pci_path, sizeof props->pci_path, "%s", q.pci_path);
  props->speed_mbps = q.speed;
  props->latency_us = q.latency > 0 ? (int)(q.latency + 0.5f) : 0;
  props->port = q.port;
  /* Host memory always: NCCL, too, expects every plugin to take it (host-staged protocols). */
  props->ptr_support = BRAID_NET_PTR_HOST;
  if (q.ptr_support & NET_PLUGIN_PTR_CUDA) props->ptr_support |= BRAID_NET_PTR_CUDA;
  if ((q.ptr_support & NET_PLUGIN_PTR_DMABUF) && p->reg_mr_dmabuf)
    props->ptr_support |= BRAID_NET_PTR_DMABUF;
  props->max_requests = p->max_requests;
  props->max_bytes = q.max_bytes;
  return ncclSuccess;
}

static ncclResult_t plugin_listen(int dev, const uint8_t* key, void* handle, void** listen_comm) {
  const struct net_plugin* p = plugin();
  struct plugin_listen* l = NULL;
  *listen_comm = NULL;
  if (p == NULL) return plugin_none();
  l = calloc(1, sizeof *l);
  if (l == NULL) return braid_err(ncclSystemError, "NET/Plugin: out of memory for a listener");
  l->dev = dev;
  memcpy(l->key, key, BRAID_NET_KEY_BYTES);
  memset(handle, 0, BRAID_NET_HANDLE_BYTES);
  ncclResult_t res = net_plugin_listen(p, dev, handle, &l->lc);
  if (res != ncclSuccess || l->lc == NULL) {
    free(l);
    return braid_err(res != ncclSuccess ? res : ncclInternalError,
                     "NET/Plugin %s: listen on device %d failed: %s", p->name, dev,
                     braid_result_str(res));
  }
  *listen_comm = l;
  return ncclSuccess;
}

static void plugin_connect_abandon(void* state) {
  struct plugin_connect_state* st = state;
  const struct net_plugin* p = plugin();
  if (st == NULL) return;
  if (p && st->key.pc) plugin_key_release(p, &st->key, 1, 1);
  free(st);
}

/* The plugin's connect on a copy of the handle, then the key: the comm once the key has left. */
static ncclResult_t plugin_connect(int dev, const uint8_t* key, const void* handle, void** state,
                                   void** send_comm) {
  const struct net_plugin* p = plugin();
  struct plugin_connect_state* st = *state;
  struct plugin_comm* c = NULL;
  ncclResult_t res = ncclSuccess;
  int done = 0;
  *send_comm = NULL;
  if (p == NULL) return plugin_none();
  if (st == NULL) {
    st = calloc(1, sizeof *st);
    if (st == NULL) return braid_err(ncclSystemError, "NET/Plugin: out of memory for a connect");
    memcpy(st->handle, handle, sizeof st->handle);
    *state = st;
  }
  if (st->key.pc == NULL) {
    void* pc = NULL;
    res = net_plugin_connect(p, dev, st->handle, &pc);
    if (res != ncclSuccess) {
      braid_err(res, "NET/Plugin %s: connecting on device %d to a peer's listener failed: %s",
                p->name, dev, braid_result_str(res));
      goto fail;
    }
    if (pc == NULL) return ncclSuccess;           /* not yet: call again */
    res = plugin_key_start(p, &st->key, pc, key); /* st->key owns pc now */
    if (res != ncclSuccess) goto fail;
  }
  res = plugin_key_step(p, &st->key, 1, &done);
  if (res != ncclSuccess) {
    braid_err(res, "NET/Plugin %s: sending the job's key on a new connection failed: %s", p->name,
              braid_result_str(res));
    goto fail;
  }
  if (!done) return ncclSuccess;
  res = plugin_comm_new(p, dev, st->key.pc, 1, &c);
  if (res != ncclSuccess) goto fail;
  plugin_key_release(p, &st->key, 1, 0); /* the comm is c's now */
  free(st);
  *state = NULL;
  *send_comm = c;
  return ncclSuccess;
fail:
  plugin_connect_abandon(st);
  *state = NULL;
  return res;
}

/* A new connection of the plugin's into a free slot, its key's receive posted. */
static ncclResult_t plugin_accept_new(const struct net_plugin* p, struct plugin_listen* l) {
  struct plugin_key_xfer* slot = NULL;
  for (int i = 0; i < PLUGIN_ACCEPT_SLOTS && slot == NULL; i++)
    if (l->pending[i].pc == NULL) slot = &l->pending[i];
  if (slot == NULL) return ncclSuccess; /* the others wait in the plugin until a slot frees */
  void* pc = NULL;
  ncclResult_t res = net_plugin_accept(p, l->lc, &pc);
  if (res != ncclSuccess)
    return braid_err(res, "NET/Plugin %s: accept on device %d failed: %s", p->name, l->dev,
                     braid_result_str(res));
  if (pc == NULL) return ncclSuccess;
  res = plugin_key_start(p, slot, pc, NULL);
  if (res != ncclSuccess) plugin_key_release(p, slot, 0, 1);
  return res;
}

/* One connection waiting for its key: 1 when it presented this job's key. */
static int plugin_accept_check(const struct net_plugin* p, struct plugin_listen* l,
                               struct plugin_key_xfer* x) {
  int done = 0;
  const char* why = NULL;
  ncclResult_t res = plugin_key_step(p, x, 0, &done);
  if (res != ncclSuccess)
    why = braid_result_str(res);
  else if (done < 0)
    why = "a first message that is not a key";
  else if (done && memcmp(x->buf, l->key, BRAID_NET_KEY_BYTES) != 0)
    why = "a wrong key (not this job's)";
  else if (!done && braid_time_sec() - x->since > PLUGIN_KEY_WAIT_S)
    why = "no key in time";
  if (why) {
    WARN("NET/Plugin %s: a connection to the listener on device %d presented %s%s; closed it",
         p->name, l->dev, res != ncclSuccess ? "an error: " : "", why);
    plugin_key_release(p, x, 0, 1);
  }
  return why == NULL && done;
}

static ncclResult_t plugin_accept(void* listen_comm, void** recv_comm) {
  const struct net_plugin* p = plugin();
  struct plugin_listen* l = listen_comm;
  struct plugin_comm* c = NULL;
  *recv_comm = NULL;
  if (p == NULL) return plugin_none();
  ncclResult_t res = plugin_accept_new(p, l);
  if (res != ncclSuccess) return res;
  for (int i = 0; i < PLUGIN_ACCEPT_SLOTS; i++) {
    struct plugin_key_xfer* x = &l->pending[i];
    if (x->pc == NULL || !plugin_accept_check(p, l, x)) continue;
    res = plugin_comm_new(p, l->dev, x->pc, 0, &c);
    if (res != ncclSuccess) {
      plugin_key_release(p, x, 0, 1);
      return res;
    }
    plugin_key_release(p, x, 0, 0); /* the comm is c's now */
    *recv_comm = c;
    return ncclSuccess;
  }
  return ncclSuccess;
}

static ncclResult_t plugin_close_listen(void* listen_comm) {
  const struct net_plugin* p = plugin();
  struct plugin_listen* l = listen_comm;
  if (l == NULL || p == NULL) return ncclSuccess;
  for (int i = 0; i < PLUGIN_ACCEPT_SLOTS; i++)
    if (l->pending[i].pc) plugin_key_release(p, &l->pending[i], 0, 1);
  ncclResult_t res = p->close_listen(l->lc);
  free(l);
  return res;
}

static ncclResult_t plugin_reg_mr(void* comm, void* data, size_t size, int is_cuda,
                                  void** mhandle) {
  const struct net_plugin* p = plugin();
  struct plugin_comm* c = comm;
  *mhandle = NULL;
  if (p == NULL) return plugin_none();
  ncclResult_t res = net_plugin_reg_mr(
      p, c->pc, data, size, is_cuda ? NET_PLUGIN_PTR_CUDA : NET_PLUGIN_PTR_HOST, mhandle);
  if (res != ncclSuccess)
    return braid_err(res, "NET/Plugin %s: registering %zu bytes of %s memory failed: %s", p->name,
                     size, is_cuda ? "GPU" : "host", braid_result_str(res));
  return ncclSuccess;
}

static ncclResult_t plugin_reg_mr_dmabuf(void* comm, void* data, size_t size, uint64_t offset,
                                         int fd, void** mhandle) {
  const struct net_plugin* p = plugin();
  struct plugin_comm* c = comm;
  *mhandle = NULL;
  if (p == NULL) return plugin_none();
  if (p->reg_mr_dmabuf == NULL) return net_unsupported("Plugin", "dma-buf registration");
  ncclResult_t res = p->reg_mr_dmabuf(c->pc, data, size, NET_PLUGIN_PTR_CUDA, offset, fd, mhandle);
  if (res != ncclSuccess)
    return braid_err(res,
                     "NET/Plugin %s: registering %zu bytes of GPU memory as a dma-buf "
                     "failed: %s",
                     p->name, size, braid_result_str(res));
  return ncclSuccess;
}

static ncclResult_t plugin_dereg_mr(void* comm, void* mhandle) {
  const struct net_plugin* p = plugin();
  struct plugin_comm* c = comm;
  if (p == NULL || mhandle == NULL) return ncclSuccess;
  return p->dereg_mr(c->pc, mhandle);
}

/* A free request of `c`, or NULL when max_requests are under way. */
static struct plugin_req* plugin_req_free(const struct net_plugin* p, struct plugin_comm* c) {
  if (c->outstanding >= p->max_requests) return NULL;
  for (int i = 0; i < p->max_requests; i++)
    if (!c->reqs[i].used) return &c->reqs[i];
  return NULL;
}

static ncclResult_t plugin_post(struct plugin_comm* c, void* data, size_t size, void* mhandle,
                                void** request) {
  const struct net_plugin* p = plugin();
  ncclResult_t res = ncclSuccess;
  *request = NULL;
  if (p == NULL) return plugin_none();
  if (c->is_send && size > c->max_bytes)
    return braid_err(ncclInvalidUsage,
                     "NET/Plugin %s: a %zu-byte message is larger than the "
                     "network's largest (%zu bytes)",
                     p->name, size, c->max_bytes);
  if (!c->is_send) size = BRAID_MIN(size, c->max_bytes); /* no message is larger */
  struct plugin_req* r = plugin_req_free(p, c);
  if (r == NULL) return ncclSuccess;
  void* tmp = NULL;
  if (mhandle == NULL && data != NULL) {
    res = net_plugin_reg_mr(p, c->pc, data, size ? size : 1, NET_PLUGIN_PTR_HOST, &tmp);
    if (res != ncclSuccess)
      return braid_err(res, "NET/Plugin %s: registering an unregistered buffer failed: %s", p->name,
                       braid_result_str(res));
    mhandle = tmp;
  }
  res = c->is_send ? net_plugin_isend(p, c->pc, data, size, mhandle, &r->req)
                   : net_plugin_irecv(p, c->pc, data, size, mhandle, &r->req);
  if (res != ncclSuccess || r->req == NULL) {
    if (tmp) p->dereg_mr(c->pc, tmp);
    if (res != ncclSuccess)
      return braid_err(res, "NET/Plugin %s: posting a %s of %zu bytes failed: %s", p->name,
                       c->is_send ? "send" : "receive", size, braid_result_str(res));
    return ncclSuccess; /* the plugin says later */
  }
  r->used = 1;
  r->tmp_mh = tmp;
  c->outstanding++;
  *request = r;
  return ncclSuccess;
}

static ncclResult_t plugin_isend(void* send_comm, void* data, size_t size, void* mhandle,
                                 void** request) {
  return plugin_post(send_comm, data, size, mhandle, request);
}

static ncclResult_t plugin_irecv(void* recv_comm, void* data, size_t size, void* mhandle,
                                 void** request) {
  return plugin_post(recv_comm, data, size, mhandle, request);
}

static ncclResult_t plugin_iflush(void* recv_comm, void* data, size_t size, void* mhandle,
                                  void** request) {
  const struct net_plugin* p = plugin();
  struct plugin_comm* c = recv_comm;
  *request = NULL;
  if (p == NULL) return plugin_none();
  if (p->iflush == NULL || mhandle == NULL) return ncclSuccess; /* nothing to flush */
  struct plugin_req* r = plugin_req_free(p, c);
  if (r == NULL)
    return braid_err(ncclInternalError, "NET/Plugin %s: a flush with %d requests under way",
                     p->name, c->outstanding);
  int isize = (int)BRAID_MIN(size, c->max_bytes);
  ncclResult_t res = p->iflush(c->pc, 1, &data, &isize, &mhandle, &r->req);
  if (res != ncclSuccess)
    return braid_err(res, "NET/Plugin %s: flushing received GPU data failed: %s", p->name,
                     braid_result_str(res));
  if (r->req == NULL) return ncclSuccess;
  r->used = 1;
  r->tmp_mh = NULL;
  c->outstanding++;
  *request = r;
  return ncclSuccess;
}

static ncclResult_t plugin_test(void* request, int* done, size_t* size) {
  const struct net_plugin* p = plugin();
  struct plugin_req* r = request;
  struct plugin_comm* c = r->comm;
  int isize = 0;
  *done = 0;
  if (p == NULL) return plugin_none();
  ncclResult_t res = p->test(r->req, done, &isize);
  if (res != ncclSuccess)
    return braid_err(res, "NET/Plugin %s: a %s failed: %s", p->name,
                     c->is_send ? "send" : "receive", braid_result_str(res));
  if (!*done) return ncclSuccess;
  if (size) *size = isize > 0 ? (size_t)isize : 0;
  if (r->tmp_mh) p->dereg_mr(c->pc, r->tmp_mh);
  r->tmp_mh = NULL;
  r->req = NULL;
  r->used = 0;
  c->outstanding--;
  return ncclSuccess;
}

const struct braid_net_ops braid_net_plugin = {
    .size = sizeof(struct braid_net_ops),
    .name = "Plugin",
    .init = plugin_init,
    .get_properties = plugin_get_properties,
    .listen = plugin_listen,
    .connect = plugin_connect,
    .connect_abandon = plugin_connect_abandon,
    .accept = plugin_accept,
    .reg_mr = plugin_reg_mr,
    .reg_mr_dmabuf = plugin_reg_mr_dmabuf,
    .dereg_mr = plugin_dereg_mr,
    .isend = plugin_isend,
    .irecv = plugin_irecv,
    .iflush = plugin_iflush,
    .test = plugin_test,
    .close_send = plugin_close,
    .close_recv = plugin_close,
    .close_listen = plugin_close_listen,
    /* recv_fd, recv_busy: none (NCCL's interface has no descriptor); every receive is tested. */
    .recv_fd = NULL,
    .recv_busy = NULL,
    .close_abort = plugin_close, /* the plugin's close: its interface has no other */
    .idle = NULL,                /* the plugin progresses in its own test() or threads */
};

const char* net_plugin_network_name(void) {
  const struct net_plugin* p = plugin();
  return p ? p->name : NULL;
}

const char* net_plugin_library_path(void) {
  const struct net_plugin* p = plugin();
  return p ? p->path : NULL;
}
