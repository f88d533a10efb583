/*
 * Finding, opening and initializing an NCCL net plugin (see net_plugin.h for
 * which library), and calling it in its own version's terms.
 *
 * The library is looked up once per process. Its table is the first of
 * ncclNetPlugin_v11 ... ncclNetPlugin_v6 it exports, the versions NCCL 2.28
 * loads; a CollNet table beside it is reported and left alone (Braid has no
 * CollNet). Braid's backends are per process, so the plugin is initialized
 * once (a v11 plugin gets one context, comm id 0), and stays loaded for the
 * life of the process: its threads may outlive any one communicator.
 *
 * Every outcome is logged: INFO when nothing was asked for and nothing
 * is there (as with NCCL), WARN when a library asked for cannot be opened, or
 * one that was found cannot be used (no known version, a slot missing, init
 * or device listing failing, device offload Braid cannot drive). The WARN
 * says what comes next: the list's next entry, or, after the last, Braid's
 * own backends.
 */
#include "transport/net_plugin.h"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/debug.h"
#include "base/error.h"
#include "base/param.h"
#include "base/plugin_lib.h"
#include "base/utils.h"
#include "transport/net.h"

#define NET_PLUGIN_DEFAULT_LIB "libnccl-net.so"
#define NET_PLUGIN_TAG 0 /* every message of a comm: matched in order, as Braid's backends are */
#define NET_PLUGIN_VERSIONS "ncclNetPlugin_v11, _v10, _v9, _v8, _v7 or _v6"

static const int plugin_versions[] = {11, 10, 9, 8, 7, 6};

static struct {
  pthread_once_t once;
  int usable;
  int more; /* entries of the list remain after the one being tried */
  struct net_plugin p;
  char why[BRAID_ERROR_MAX];
} loaded = {.once = PTHREAD_ONCE_INIT};

/* --------------------------------------------------------- callbacks */

/*
 * NCCL's subsystem bits from INIT up to PROXY are Braid's, the higher ones differ (NCCL's
 * NVLS is Braid's BOOTSTRAP), so only those are kept; none left counts as NET.
 */
#define PLUGIN_LOG_SHARED_BITS 0x7ffu

static uint32_t plugin_log_bits(unsigned long flags) {
  uint32_t bits = (uint32_t)(flags & PLUGIN_LOG_SHARED_BITS);
  return bits ? bits : BRAID_LOG_NET;
}

/* The subsystem a line is shown under: NET when it is one of the line's, else its lowest. */
static uint32_t plugin_log_subsys(uint32_t bits) {
  return (bits & BRAID_LOG_NET) ? BRAID_LOG_NET : bits & -bits;
}

/* The logger handed to the plugin's init: its lines go to Braid's log at the same level. */
static void plugin_log(int level, unsigned long flags, const char* file, int line, const char* fmt,
                       ...) {
  braid_log_level_t lvl = BRAID_LOG_NONE;
  if (level == NET_PLUGIN_LOG_WARN || level == NET_PLUGIN_LOG_ABORT)
    lvl = BRAID_LOG_WARN;
  else if (level == NET_PLUGIN_LOG_INFO)
    lvl = BRAID_LOG_INFO;
  else if (level == NET_PLUGIN_LOG_TRACE)
    lvl = BRAID_LOG_TRACE;
  uint32_t bits = plugin_log_bits(flags);
  if (lvl == BRAID_LOG_NONE || fmt == NULL ||
      !braid_log_enabled(lvl, lvl == BRAID_LOG_WARN ? BRAID_LOG_ALL : bits))
    return;
  char text[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  braid_log_emit(lvl, plugin_log_subsys(bits), file ? file : "net plugin", line, "%s", text);
}

/* The profiler callback of v10 and later: Braid records no network events, so none is made. */
static ncclResult_t plugin_profiler_event(void** event, int type, void* parent, int64_t plugin_id,
                                          void* ext_data) {
  if (event) *event = NULL;
  return ncclSuccess;
}

/* ----------------------------------------------------------- opening */

/* The slots every version places alike, from a table of any version. */
#define PLUGIN_COPY_COMMON(p, table)           \
  do {                                         \
    (p)->name = (table)->name;                 \
    (p)->devices = (table)->devices;           \
    (p)->reg_mr_dmabuf = (table)->regMrDmaBuf; \
    (p)->dereg_mr = (table)->deregMr;          \
    (p)->iflush = (table)->iflush;             \
    (p)->test = (table)->test;                 \
    (p)->close_send = (table)->closeSend;      \
    (p)->close_recv = (table)->closeRecv;      \
    (p)->close_listen = (table)->closeListen;  \
  } while (0)

/* The newest known net table the library exports; 0 when it has none. */
static int plugin_find_table(void* dl, struct net_plugin* p) {
  for (size_t i = 0; i < BRAID_ARRAY_LEN(plugin_versions); i++) {
    char sym[32];
    snprintf(sym, sizeof sym, "ncclNetPlugin_v%d", plugin_versions[i]);
    const void* table = dlsym(dl, sym);
    if (table == NULL) continue;
    p->version = plugin_versions[i];
    switch (p->version) {
      case 6:
        p->t.v6 = table;
        PLUGIN_COPY_COMMON(p, p->t.v6);
        break;
      case 7:
        p->t.v7 = table;
        PLUGIN_COPY_COMMON(p, p->t.v7);
        break;
      case 8:
        p->t.v8 = table;
        PLUGIN_COPY_COMMON(p, p->t.v8);
        break;
      case 9:
        p->t.v9 = table;
        PLUGIN_COPY_COMMON(p, p->t.v9);
        break;
      case 10:
        p->t.v10 = table;
        PLUGIN_COPY_COMMON(p, p->t.v10);
        break;
      default:
        p->t.v11 = table;
        PLUGIN_COPY_COMMON(p, p->t.v11);
        break;
    }
    p->max_requests = p->version == 6 ? NET_PLUGIN_MAX_REQUESTS_V6 : NET_PLUGIN_MAX_REQUESTS;
    return 1;
  }
  return 0;
}

/* A CollNet table beside the net one: said, and left unused. */
static void plugin_report_collnet(void* dl, const char* path) {
  for (size_t i = 0; i < BRAID_ARRAY_LEN(plugin_versions); i++) {
    char sym[32];
    snprintf(sym, sizeof sym, "ncclCollNetPlugin_v%d", plugin_versions[i]);
    const nccl_collnet_head_t* coll = dlsym(dl, sym);
    if (coll == NULL) continue;
    INFO(BRAID_LOG_INIT,
         "NET/Plugin: %s also exports %s (\"%s\"); Braid has no CollNet support, so it is not used",
         path, sym, coll->name ? coll->name : "");
    return;
  }
}

/* The first slot NCCL requires that a table of any version leaves empty, or NULL. */
#define PLUGIN_MISSING(t)                  \
  (!(t)->init            ? "init"          \
   : !(t)->devices       ? "devices"       \
   : !(t)->getProperties ? "getProperties" \
   : !(t)->listen        ? "listen"        \
   : !(t)->connect       ? "connect"       \
   : !(t)->accept        ? "accept"        \
   : !(t)->regMr         ? "regMr"         \
   : !(t)->deregMr       ? "deregMr"       \
   : !(t)->isend         ? "isend"         \
   : !(t)->irecv         ? "irecv"         \
   : !(t)->test          ? "test"          \
   : !(t)->closeSend     ? "closeSend"     \
   : !(t)->closeRecv     ? "closeRecv"     \
   : !(t)->closeListen   ? "closeListen"   \
                         : NULL)

static const char* plugin_missing_slot(const struct net_plugin* p) {
  switch (p->version) {
    case 6:
      return PLUGIN_MISSING(p->t.v6);
    case 7:
      return PLUGIN_MISSING(p->t.v7);
    case 8:
      return PLUGIN_MISSING(p->t.v8);
    case 9:
      return PLUGIN_MISSING(p->t.v9);
    case 10:
      return PLUGIN_MISSING(p->t.v10);
    default:
      return PLUGIN_MISSING(p->t.v11);
  }
}

/* The version's init, with Braid's logger (and, from v10, a profiler callback that records
 * nothing). */
static ncclResult_t plugin_init(struct net_plugin* p) {
  static nccl_net_comm_config_t config = {.trafficClass = NET_PLUGIN_TRAFFIC_CLASS_UNDEF};
  switch (p->version) {
    case 6:
      return p->t.v6->init(plugin_log);
    case 7:
      return p->t.v7->init(plugin_log);
    case 8:
      return p->t.v8->init(plugin_log);
    case 9:
      return p->t.v9->init(plugin_log);
    case 10:
      return p->t.v10->init(plugin_log, plugin_profiler_event);
    default:
      return p->t.v11->init(&p->ctx, 0, &config, plugin_log, plugin_profiler_event);
  }
}

/* ------------------------------------------------------------ loading */

/*
 * Says why the plugin is not used (WARN, or INFO when nothing was asked for), and what happens
 * instead: the list's next entry, or Braid's own backends. Keeps the reason for init's `why`.
 */
static void plugin_refuse(int warn, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static void plugin_refuse(int warn, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(loaded.why, sizeof loaded.why, fmt, ap);
  va_end(ap);
  const char* next =
      loaded.more ? "trying the next entry of " : "using Braid's own network backends";
  if (warn)
    WARN("NET/Plugin: %s; %s%s", loaded.why, next, loaded.more ? braid_param_var(BRAID_P_NET_PLUGIN) : "");
  else
    INFO(BRAID_LOG_INIT, "NET/Plugin: %s", loaded.why);
}

/* A v11 plugin's context, given back when the plugin initialized but cannot be used. */
static void plugin_finalize(struct net_plugin* p) {
  if (p->version != 11 || p->t.v11->finalize == NULL) return;
  ncclResult_t res = p->t.v11->finalize(p->ctx);
  if (res != ncclSuccess)
    INFO(BRAID_LOG_INIT, "NET/Plugin: %s: finalize failed: %s", p->name, braid_result_str(res));
  p->ctx = NULL;
}

/*
 * After init: its devices, and that the first is one Braid can drive (no
 * device offload: that needs NCCL's device code). 1 when usable.
 */
static int plugin_check_devices(struct net_plugin* p, int asked) {
  struct net_plugin_props props;
  ncclResult_t res = p->devices(&p->ndev);
  if (res != ncclSuccess) {
    plugin_refuse(1, "%s (v%d, %s): devices() failed: %s (%d)", p->name, p->version, p->path,
                  braid_result_str(res), (int)res);
    return 0;
  }
  if (p->ndev <= 0) {
    plugin_refuse(asked, "%s (v%d, %s) has no device", p->name, p->version, p->path);
    return 0;
  }
  if (p->ndev > BRAID_NET_MAX_DEVS) p->ndev = BRAID_NET_MAX_DEVS;
  res = net_plugin_props(p, 0, &props);
  if (res != ncclSuccess || props.device_type != NET_PLUGIN_DEVICE_HOST) {
    plugin_refuse(1, "%s (v%d, %s): %s", p->name, p->version, p->path,
                  res != ncclSuccess ? "getProperties(0) failed"
                                     : "its devices need device offload (netDeviceType "
                                       "other than host), which Braid does not implement");
    return 0;
  }
  return 1;
}

/* One entry of the list: 1 when its plugin is loaded, initialized and usable. */
static int plugin_try(const char* entry, int asked) {
  struct net_plugin* p = &loaded.p;
  char tried[BRAID_ERROR_MAX / 2] = "";
  memset(p, 0, sizeof *p);
  void* dl = braid_plugin_open("net", entry, tried, sizeof tried);
  if (dl == NULL) {
    if (asked)
      plugin_refuse(1, "cannot load %s=%s: %s", braid_param_var(BRAID_P_NET_PLUGIN), entry, tried);
    else
      plugin_refuse(0, "no net plugin: %s", tried);
    return 0;
  }
  braid_plugin_path(dl, entry, p->path, sizeof p->path);
  if (!plugin_find_table(dl, p)) {
    plugin_refuse(1, "%s exports none of the net plugin versions Braid loads (%s)", p->path,
                  NET_PLUGIN_VERSIONS);
    dlclose(dl);
    return 0;
  }
  if (p->name == NULL) p->name = "(unnamed)";
  const char* missing = plugin_missing_slot(p);
  if (missing) {
    plugin_refuse(1, "%s (v%d, %s) leaves %s empty", p->name, p->version, p->path, missing);
    dlclose(dl);
    return 0;
  }
  INFO(BRAID_LOG_INIT, "NET/Plugin: loaded net plugin %s (v%d) from %s", p->name, p->version,
       p->path);
  plugin_report_collnet(dl, p->path);
  ncclResult_t res = plugin_init(p); /* from here the library stays: it may have started threads */
  if (res != ncclSuccess) {
    plugin_refuse(1, "%s (v%d, %s): init failed: %s (%d)", p->name, p->version, p->path,
                  braid_result_str(res), (int)res);
    return 0;
  }
  if (plugin_check_devices(p, asked)) return 1;
  plugin_finalize(p);
  return 0;
}

static void plugin_load_once(void) {
  const char* spec = braid_param_str(BRAID_P_NET_PLUGIN);
  int asked = spec != NULL;
  if (asked && (spec[0] == '\0' || strcasecmp(spec, "none") == 0)) {
    snprintf(loaded.why, sizeof loaded.why, "net plugin disabled (%s=%s)", braid_param_var(BRAID_P_NET_PLUGIN),
             spec[0] ? spec : "\"\"");
    INFO(BRAID_LOG_INIT, "NET/Plugin: %s", loaded.why);
    return;
  }
  char list[PATH_MAX];
  snprintf(list, sizeof list, "%s", asked ? spec : NET_PLUGIN_DEFAULT_LIB);
  char* save = NULL;
  for (char* entry = strtok_r(list, ",", &save); entry; entry = strtok_r(NULL, ",", &save)) {
    loaded.more = save && save[strspn(save, ",")] != '\0';
    if (!plugin_try(entry, asked)) continue;
    loaded.usable = 1;
    INFO(BRAID_LOG_INIT, "NET/Plugin: initialized net plugin %s (v%d, %s): %d device%s",
         loaded.p.name, loaded.p.version, loaded.p.path, loaded.p.ndev,
         loaded.p.ndev == 1 ? "" : "s");
    return;
  }
}

const struct net_plugin* net_plugin_get(char* why, size_t why_size) {
  pthread_once(&loaded.once, plugin_load_once);
  if (loaded.usable) return &loaded.p;
  if (why && why_size) snprintf(why, why_size, "%s", loaded.why[0] ? loaded.why : "no net plugin");
  return NULL;
}

/* ------------------------------------------------------ version calls */

/* What every version's properties have. */
#define PLUGIN_PROPS_COMMON(out, q)      \
  do {                                   \
    (out)->name = (q).name;              \
    (out)->pci_path = (q).pciPath;       \
    (out)->ptr_support = (q).ptrSupport; \
    (out)->speed = (q).speed;            \
    (out)->port = (q).port;              \
    (out)->latency = (q).latency;        \
  } while (0)

ncclResult_t net_plugin_props(const struct net_plugin* p, int dev, struct net_plugin_props* out) {
  ncclResult_t res;
  memset(out, 0, sizeof *out);
  out->device_type = NET_PLUGIN_DEVICE_HOST;
  out->max_bytes = NET_PLUGIN_MAX_SIZE; /* what NCCL assumes before v9 */
  if (p->version == 6) {
    nccl_net_props_v6_t q = {0};
    res = p->t.v6->getProperties(dev, &q);
    PLUGIN_PROPS_COMMON(out, q);
  } else if (p->version == 7) {
    nccl_net_props_v7_t q = {0};
    res = p->t.v7->getProperties(dev, &q);
    PLUGIN_PROPS_COMMON(out, q);
    out->device_type = q.netDeviceType;
  } else if (p->version == 8) {
    nccl_net_props_v8_t q = {0};
    res = p->t.v8->getProperties(dev, &q);
    PLUGIN_PROPS_COMMON(out, q);
    out->device_type = q.netDeviceType;
  } else if (p->version <= 10) {
    nccl_net_props_v9_t q = {0};
    res = p->version == 9 ? p->t.v9->getProperties(dev, &q) : p->t.v10->getProperties(dev, &q);
    PLUGIN_PROPS_COMMON(out, q);
    out->device_type = q.netDeviceType;
    if (q.maxP2pBytes > 0) out->max_bytes = BRAID_MIN(q.maxP2pBytes, out->max_bytes);
  } else {
    nccl_net_props_v11_t q = {0};
    res = p->t.v11->getProperties(dev, &q);
    PLUGIN_PROPS_COMMON(out, q);
    out->device_type = q.netDeviceType;
    if (q.maxP2pBytes > 0) out->max_bytes = BRAID_MIN(q.maxP2pBytes, out->max_bytes);
  }
  return res;
}

ncclResult_t net_plugin_listen(const struct net_plugin* p, int dev, void* handle,
                               void** listen_comm) {
  switch (p->version) {
    case 6:
      return p->t.v6->listen(dev, handle, listen_comm);
    case 7:
      return p->t.v7->listen(dev, handle, listen_comm);
    case 8:
      return p->t.v8->listen(dev, handle, listen_comm);
    case 9:
      return p->t.v9->listen(dev, handle, listen_comm);
    case 10:
      return p->t.v10->listen(dev, handle, listen_comm);
    default:
      return p->t.v11->listen(p->ctx, dev, handle, listen_comm);
  }
}

ncclResult_t net_plugin_connect(const struct net_plugin* p, int dev, void* handle,
                                void** send_comm) {
  static nccl_net_comm_config_t config = {.trafficClass = NET_PLUGIN_TRAFFIC_CLASS_UNDEF};
  void* offload = NULL; /* no device offload asked for */
  switch (p->version) {
    case 6:
      return p->t.v6->connect(dev, handle, send_comm);
    case 7:
      return p->t.v7->connect(dev, handle, send_comm, &offload);
    case 8:
      return p->t.v8->connect(dev, handle, send_comm, &offload);
    case 9:
      return p->t.v9->connect(dev, handle, send_comm, &offload);
    case 10:
      return p->t.v10->connect(dev, &config, handle, send_comm, &offload);
    default:
      return p->t.v11->connect(p->ctx, dev, handle, send_comm, &offload);
  }
}

ncclResult_t net_plugin_accept(const struct net_plugin* p, void* listen_comm, void** recv_comm) {
  void* offload = NULL;
  switch (p->version) {
    case 6:
      return p->t.v6->accept(listen_comm, recv_comm);
    case 7:
      return p->t.v7->accept(listen_comm, recv_comm, &offload);
    case 8:
      return p->t.v8->accept(listen_comm, recv_comm, &offload);
    case 9:
      return p->t.v9->accept(listen_comm, recv_comm, &offload);
    case 10:
      return p->t.v10->accept(listen_comm, recv_comm, &offload);
    default:
      return p->t.v11->accept(listen_comm, recv_comm, &offload);
  }
}

ncclResult_t net_plugin_reg_mr(const struct net_plugin* p, void* comm, void* data, size_t size,
                               int type, void** mhandle) {
  if (p->version <= 7 && size > (size_t)INT32_MAX)
    return braid_err(ncclInvalidUsage,
                     "NET/Plugin %s (v%d): cannot register %zu bytes at once "
                     "(this version takes an int)",
                     p->name, p->version, size);
  switch (p->version) {
    case 6:
      return p->t.v6->regMr(comm, data, (int)size, type, mhandle);
    case 7:
      return p->t.v7->regMr(comm, data, (int)size, type, mhandle);
    case 8:
      return p->t.v8->regMr(comm, data, size, type, mhandle);
    case 9:
      return p->t.v9->regMr(comm, data, size, type, mhandle);
    case 10:
      return p->t.v10->regMr(comm, data, size, type, mhandle);
    default:
      return p->t.v11->regMr(comm, data, size, type, mhandle);
  }
}

ncclResult_t net_plugin_isend(const struct net_plugin* p, void* send_comm, void* data, size_t size,
                              void* mhandle, void** request) {
  *request = NULL;
  switch (p->version) { /* sizes were held to max_bytes (1 GiB at most) by the caller */
    case 6:
      return p->t.v6->isend(send_comm, data, (int)size, NET_PLUGIN_TAG, mhandle, request);
    case 7:
      return p->t.v7->isend(send_comm, data, (int)size, NET_PLUGIN_TAG, mhandle, request);
    case 8:
      return p->t.v8->isend(send_comm, data, (int)size, NET_PLUGIN_TAG, mhandle, request);
    case 9:
      return p->t.v9->isend(send_comm, data, size, NET_PLUGIN_TAG, mhandle, request);
    case 10:
      return p->t.v10->isend(send_comm, data, size, NET_PLUGIN_TAG, mhandle, NULL, request);
    default:
      return p->t.v11->isend(send_comm, data, size, NET_PLUGIN_TAG, mhandle, NULL, request);
  }
}

ncclResult_t net_plugin_irecv(const struct net_plugin* p, void* recv_comm, void* data, size_t size,
                              void* mhandle, void** request) {
  int tag = NET_PLUGIN_TAG, isize = (int)size;
  void* phandle = NULL;
  *request = NULL;
  switch (p->version) {
    case 6:
      return p->t.v6->irecv(recv_comm, 1, &data, &isize, &tag, &mhandle, request);
    case 7:
      return p->t.v7->irecv(recv_comm, 1, &data, &isize, &tag, &mhandle, request);
    case 8:
      return p->t.v8->irecv(recv_comm, 1, &data, &isize, &tag, &mhandle, request);
    case 9:
      return p->t.v9->irecv(recv_comm, 1, &data, &size, &tag, &mhandle, request);
    case 10:
      return p->t.v10->irecv(recv_comm, 1, &data, &size, &tag, &mhandle, &phandle, request);
    default:
      return p->t.v11->irecv(recv_comm, 1, &data, &size, &tag, &mhandle, &phandle, request);
  }
}
