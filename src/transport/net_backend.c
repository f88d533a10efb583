/*
 * The list of net backends and the process's choice among them
 * (BRAID_NET / NCCL_NET, else the net plugin's network when one loads, as
 * NCCL prefers it, else IB when a port is usable, else Socket). The
 * choice is made once per process and logged with the reason, so a job log
 * always says which network carried the data and why.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "base/debug.h"
#include "base/error.h"
#include "base/param.h"
#include "base/utils.h"
#include "transport/net.h"

/* Preference order of the default choice; OFI is listed but only taken when asked for. */
static const struct braid_net_ops* const backends[] = {&braid_net_plugin, &braid_net_ib,
                                                       &braid_net_socket, &braid_net_ofi};

int net_backend_count(void) { return (int)BRAID_ARRAY_LEN(backends); }

const struct braid_net_ops* net_backend_at(int index) {
  return index >= 0 && index < net_backend_count() ? backends[index] : NULL;
}

const struct braid_net_ops* net_backend_find(const char* name) {
  for (int i = 0; name && i < net_backend_count(); i++)
    if (strcasecmp(backends[i]->name, name) == 0) return backends[i];
  return NULL;
}

int net_refused_too_long(double* since, int err) {
  if (err != ECONNREFUSED) {
    *since = 0.0;
    return 0;
  }
  const double now = braid_time_sec();
  if (*since == 0.0) *since = now;
  return now - *since >= NET_REFUSED_GRACE_S;
}

void net_connect_try_init(struct net_connect_try* t) {
  memset(t, 0, sizeof *t);
  t->fd = -1;
  t->pause = 0.001;
}

void net_connect_try_close(struct net_connect_try* t) { socket_close(&t->fd); }

/* Whether a failed connect may succeed later (the listener is busy, or the network slow). */
static int net_connect_retryable(int err) {
  return err == ETIMEDOUT || err == EAGAIN || err == EINTR || err == ECONNREFUSED ||
         err == EHOSTUNREACH || err == ENETUNREACH || err == ECONNRESET || err == ECONNABORTED;
}

ncclResult_t net_connect_try_step(struct net_connect_try* t, const union braid_sockaddr* addr,
                                  const char* backend, const char* peer, int* fd) {
  const double now = braid_time_sec();
  int err = 0, r = 0;
  *fd = -1;
  if (t->fd < 0) {
    if (now < t->next_try) return ncclSuccess;
    t->since = now;
  }
  r = socket_connect_step(addr, &t->fd, &err);
  if (r == 0 && now - t->since < NET_CONNECT_ATTEMPT_S) return ncclSuccess;
  if (r == 0) { /* unanswered (a lost SYN, a silent host): start over */
    socket_close(&t->fd);
    err = ETIMEDOUT;
  }
  if (r == 1) {
    *fd = t->fd;
    t->fd = -1;
    t->refused_since = 0.0;
    t->pause = 0.001;
    return ncclSuccess;
  }
  if (net_refused_too_long(&t->refused_since, err))
    return braid_err(ncclRemoteError,
                     "net %s: %s has refused connections for %.0f s: the receiving rank's "
                     "listener is gone (its process exited or closed the connection)",
                     backend, peer, NET_REFUSED_GRACE_S);
  if (!net_connect_retryable(err))
    return braid_err(ncclSystemError, "net %s: cannot connect to %s: %s", backend, peer,
                     strerror(err));
  t->next_try = now + t->pause;
  t->pause = BRAID_MIN(t->pause * 2.0, 0.1);
  return ncclSuccess;
}

void net_topo_name(const char* props_name, int ib, char* out, size_t size) {
  size_t len = strcspn(props_name, ib ? " " : " :");
  if (size == 0) return;
  if (len >= size) len = size - 1;
  memcpy(out, props_name, len);
  out[len] = '\0';
  char* colon = strrchr(out, ':');
  if (colon && strcmp(colon, ":1") == 0) *colon = '\0';
}

ncclResult_t net_unsupported(const char* backend, const char* what) {
  return braid_err(ncclInternalError, "net %s: %s is not supported by this backend", backend, what);
}

static struct {
  pthread_mutex_t lock;
  int chosen;
  ncclResult_t res;
  const struct braid_net_ops* ops;
  int ndev;
  char why[BRAID_ERROR_MAX]; /* the first attempt's error, repeated to later callers */
} selected = {.lock = PTHREAD_MUTEX_INITIALIZER};

static const char* net_param_name(void) {
  return braid_param_source(BRAID_P_NET) == BRAID_PARAM_FROM_NCCL_ENV ? "NCCL_NET" : "BRAID_NET";
}

/*
 * The backend the user named, or the net plugin's network by its name; fails with the reason
 * when it cannot run here.
 */
static ncclResult_t net_select_named(const char* name) {
  char why[BRAID_ERROR_MAX] = "";
  int ndev = 0;
  const struct braid_net_ops* ops = net_backend_find(name);
  const char* plugin_net = NULL;
  if (ops == NULL) { /* perhaps the plugin's network: loading it says what happened */
    braid_net_plugin.init(&ndev, why, sizeof why);
    plugin_net = net_plugin_network_name();
    if (plugin_net && strcasecmp(plugin_net, name) == 0) ops = &braid_net_plugin;
  }
  if (ops == NULL && plugin_net)
    return braid_err(ncclInvalidUsage,
                     "%s=\"%s\" names no network backend; use Socket, IB, OFI, or the net "
                     "plugin's network \"%s\" (or Plugin)",
                     net_param_name(), name, plugin_net);
  if (ops == NULL)
    return braid_err(ncclInvalidUsage,
                     "%s=\"%s\" names no network backend; use Socket, IB or OFI (there is no "
                     "net plugin's network to name: %s)",
                     net_param_name(), name, why);
  ndev = 0;
  why[0] = '\0';
  ncclResult_t res = ops->init(&ndev, why, sizeof why);
  if (res != ncclSuccess) return res;
  if (ndev == 0)
    return braid_err(ncclSystemError, "%s=%s, but the %s backend cannot run here: %s",
                     net_param_name(), name, ops->name, why);
  selected.ops = ops;
  selected.ndev = ndev;
  INFO(BRAID_LOG_INIT, "NET/%s selected: %s=%s (%d device%s)", ops->name,
       net_param_name(), name, ndev, ndev == 1 ? "" : "s");
  return ncclSuccess;
}

/* The net plugin's network when one loads (its loading logs what happened otherwise). */
static int net_select_plugin(void) {
  char why[BRAID_ERROR_MAX] = "";
  int ndev = 0;
  if (braid_net_plugin.init(&ndev, why, sizeof why) != ncclSuccess || ndev == 0) return 0;
  selected.ops = &braid_net_plugin;
  selected.ndev = ndev;
  INFO(BRAID_LOG_INIT, "NET/Plugin selected: Using network %s, the net plugin's (%d device%s; "
       "set BRAID_NET=IB or Socket to use Braid's own)", net_plugin_network_name(), ndev,
       ndev == 1 ? "" : "s");
  return 1;
}

/* IB when it has a usable port, else Socket; the log line says why IB was passed over. */
static ncclResult_t net_select_default(void) {
  char why[256] = "", sock_why[256] = "";
  int ndev = 0;
  if (net_select_plugin()) return ncclSuccess;
  ncclResult_t res = braid_net_ib.init(&ndev, why, sizeof why);
  if (res == ncclSuccess && ndev > 0) {
    selected.ops = &braid_net_ib;
    selected.ndev = ndev;
    INFO(BRAID_LOG_INIT,
         "NET/IB selected: %d usable InfiniBand/RoCE port%s (set BRAID_NET=Socket to use TCP)",
         ndev, ndev == 1 ? "" : "s");
    return ncclSuccess;
  }
  res = braid_net_socket.init(&selected.ndev, sock_why, sizeof sock_why);
  if (res != ncclSuccess) return res;
  if (selected.ndev == 0)
    return braid_err(ncclSystemError, "no network backend can run here: IB: %s; Socket: %s", why,
                     sock_why);
  selected.ops = &braid_net_socket;
  INFO(BRAID_LOG_INIT, "NET/Socket selected: IB not usable (%s); %d interface%s",
       why, selected.ndev, selected.ndev == 1 ? "" : "s");
  return ncclSuccess;
}

ncclResult_t net_backend_select(const struct braid_net_ops** out, int* ndev) {
  pthread_mutex_lock(&selected.lock);
  int first = !selected.chosen;
  if (first) {
    const char* name = braid_param_str(BRAID_P_NET);
    selected.res = (name && name[0]) ? net_select_named(name) : net_select_default();
    if (selected.res != ncclSuccess) snprintf(selected.why, sizeof selected.why, "%s", braid_err_last());
    selected.chosen = 1;
  }
  ncclResult_t res = selected.res;
  *out = selected.ops;
  *ndev = selected.ndev;
  pthread_mutex_unlock(&selected.lock);
  if (res != ncclSuccess && !first) return braid_err(res, "%s", selected.why); /* again, for this caller */
  return res;
}
