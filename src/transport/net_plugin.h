/*
 * The NCCL net plugin the process loaded (net_plugin_load.c), and its calls
 * in one set of terms whatever its version: the backend built on it
 * (net_plugin.c, braid_net_plugin) sees only this.
 *
 * Which library: BRAID_NET_PLUGIN (alias NCCL_NET_PLUGIN), a comma list
 * tried in order until one loads and initializes. Each entry is opened as
 * given (a path, or a name dlopen searches for), then, when it is a bare name
 * and not already "lib....so", as libnccl-net-<name>.so, as NCCL does. "none"
 * loads nothing. Unset: libnccl-net.so, quietly absent (INFO) as with NCCL.
 */
#ifndef BRAID_TRANSPORT_NET_PLUGIN_H
#define BRAID_TRANSPORT_NET_PLUGIN_H

#include <limits.h>
#include <stddef.h>

#include "nccl.h"
#include "transport/net_plugin_abi.h"

struct net_plugin {
  int version;      /* 6 ... 11 */
  const char* name; /* the network's name, from the plugin's table */
  char path[PATH_MAX];
  int ndev;
  int max_requests; /* per comm, as NCCL promises the plugin (8 for v6, else 32) */
  void* ctx;        /* v11: the context init made */
  union {
    const nccl_net_v6_t* v6;
    const nccl_net_v7_t* v7;
    const nccl_net_v8_t* v8;
    const nccl_net_v9_t* v9;
    const nccl_net_v10_t* v10;
    const nccl_net_v11_t* v11;
  } t;
  /* The slots alike in every version, copied from the table. */
  nccl_net_devices_fn devices;
  nccl_net_reg_dmabuf_fn reg_mr_dmabuf;
  nccl_net_dereg_fn dereg_mr;
  nccl_net_iflush_fn iflush;
  nccl_net_test_fn test;
  nccl_net_close_fn close_send;
  nccl_net_close_fn close_recv;
  nccl_net_close_fn close_listen;
};

/* What Braid needs of a device's properties, whatever the version. */
struct net_plugin_props {
  const char* name;     /* may be NULL */
  const char* pci_path; /* may be NULL */
  int ptr_support;      /* NET_PLUGIN_PTR_* */
  int speed;            /* Mb/s */
  int port;
  float latency;    /* µs */
  int device_type;  /* NET_PLUGIN_DEVICE_HOST before v7 */
  size_t max_bytes; /* largest transfer */
};

/*
 * The plugin, loaded and initialized on the first call (thread-safe; what
 * happened is logged once, at INFO or WARN); NULL when there is none or it
 * cannot be used, with the reason in `why`.
 */
const struct net_plugin* net_plugin_get(char* why, size_t why_size);

/* The version's calls, in the newest version's terms (a NULL device-offload handle). */
ncclResult_t net_plugin_props(const struct net_plugin* p, int dev, struct net_plugin_props* out);
ncclResult_t net_plugin_listen(const struct net_plugin* p, int dev, void* handle,
                               void** listen_comm);
ncclResult_t net_plugin_connect(const struct net_plugin* p, int dev, void* handle,
                                void** send_comm);
ncclResult_t net_plugin_accept(const struct net_plugin* p, void* listen_comm, void** recv_comm);
/* Host memory or CUDA (type NET_PLUGIN_PTR_*); fails before v8 past 2 GiB. */
ncclResult_t net_plugin_reg_mr(const struct net_plugin* p, void* comm, void* data, size_t size,
                               int type, void** mhandle);
/* One message (a receive of one buffer); sizes past the version's int fail. */
ncclResult_t net_plugin_isend(const struct net_plugin* p, void* send_comm, void* data, size_t size,
                              void* mhandle, void** request);
ncclResult_t net_plugin_irecv(const struct net_plugin* p, void* recv_comm, void* data, size_t size,
                              void* mhandle, void** request);

#endif
