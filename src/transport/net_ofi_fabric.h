/*
 * What the OFI backend's two files share: libfabric's few real functions
 * (loaded with dlopen) and the devices chosen at init. net_ofi_fabric.c
 * finds the devices and opens their domains; net_ofi.c makes its endpoints
 * on them.
 * Built only where rdma/fabric.h was found (BRAID_HAVE_LIBFABRIC).
 */
#ifndef BRAID_TRANSPORT_NET_OFI_FABRIC_H
#define BRAID_TRANSPORT_NET_OFI_FABRIC_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>

#include "nccl.h"
#include "transport/net.h"

#define OFI_MAX_REQS 32 /* data requests in flight per comm (max_requests) */

/* The few real functions of libfabric; the rest are inline calls through its objects. */
struct ofi_lib {
  int (*getinfo)(uint32_t, const char*, const char*, uint64_t, const struct fi_info*, struct fi_info**);
  void (*freeinfo)(struct fi_info*);
  struct fi_info* (*dupinfo)(const struct fi_info*);
  int (*fabric)(struct fi_fabric_attr*, struct fid_fabric**, void*);
  const char* (*strerror)(int);
};
extern struct ofi_lib fi;

struct ofi_dev {
  struct fi_info* info;
  struct fid_fabric* fabric; /* opened on first use */
  struct fid_domain* domain;
};

struct ofi_state {
  pthread_mutex_t lock;
  int loaded;
  void* lib;
  struct fi_info* list;
  int ndev;
  struct ofi_dev devs[BRAID_NET_MAX_DEVS];
  int directed; /* the provider honours a receive's source address (FI_DIRECTED_RECV) */
  int hmem;     /* the devices take CUDA memory (FI_HMEM): see ofi_hmem_setup */
  int hmem_flush; /* received GPU data is flushed before a kernel reads it (ofi_iflush) */
  char why[256];
};
extern struct ofi_state ofi;

/* The init and get_properties slots of the backend's ops table (net.h). */
ncclResult_t ofi_init(int* ndev, char* why, size_t why_size);
ncclResult_t ofi_props(int dev, struct braid_net_props* props);

/* The error of a libfabric call `what` that returned `rc` (a negative fi_errno), through
 * braid_err: logged and kept for ncclGetLastError(). */
ncclResult_t ofi_fail(const char* what, int rc);

/* Device `dev`'s domain, its fabric and domain opened on first use. */
ncclResult_t ofi_domain_get(int dev, struct fid_domain** out);

#endif
