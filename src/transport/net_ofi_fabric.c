/*
 * The OFI backend's devices (see net_ofi_fabric.h): libfabric loaded with
 * dlopen, the provider and its domains chosen at init (with FI_DIRECTED_RECV,
 * and FI_HMEM where GPU memory can go to the provider as it is), and each
 * device's fabric and domain opened on first use. The endpoints, handshake,
 * liveness and data path on them are net_ofi.c's.
 */
#ifdef BRAID_HAVE_LIBFABRIC

#include "transport/net_ofi_fabric.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/debug.h"
#include "base/error.h"
#include "base/param.h"
#include "base/socket.h"
#include "transport/net_ofi_hmem.h"

#define OFI_API FI_VERSION(1, 10) /* also the size of struct fi_mr_attr the provider reads */

struct ofi_lib fi;

struct ofi_state ofi = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* --------------------------------------------------------------- loading */

static int ofi_sym(void** out, const char* name) {
  *out = dlsym(ofi.lib, name);
  if (*out == NULL) snprintf(ofi.why, sizeof ofi.why, "libfabric.so.1 lacks %s", name);
  return *out != NULL;
}

static int ofi_load_lib(void) {
  ofi.lib = dlopen("libfabric.so.1", RTLD_NOW | RTLD_LOCAL);
  if (ofi.lib == NULL) {
    snprintf(ofi.why, sizeof ofi.why, "libfabric.so.1 not found (%s)", dlerror());
    return 0;
  }
  return ofi_sym((void**)&fi.getinfo, "fi_getinfo") && ofi_sym((void**)&fi.freeinfo, "fi_freeinfo") &&
         ofi_sym((void**)&fi.dupinfo, "fi_dupinfo") && ofi_sym((void**)&fi.fabric, "fi_fabric") &&
         ofi_sym((void**)&fi.strerror, "fi_strerror");
}

/* Every domain of the providers that offer tagged reliable datagrams (with FI_HMEM: `hmem`). */
static int ofi_getinfo(uint64_t caps, int hmem, const char* prov, struct fi_info** list) {
  struct fi_info* hints = fi.dupinfo(NULL);
  if (hints == NULL) return -FI_ENOMEM;
  ofi_hmem_hints_fill(hints, caps, hmem);
  if (prov && prov[0]) hints->fabric_attr->prov_name = strdup(prov);
  int rc = fi.getinfo(OFI_API, NULL, NULL, 0, hints, list);
  fi.freeinfo(hints);
  return rc;
}

/* The devices of `list` into `devs`: one per domain of its first provider; returns how many. */
static int ofi_devs_pick(struct fi_info* list, struct ofi_dev* devs) {
  const char* first = list->fabric_attr->prov_name;
  const char* ifspec = braid_param_str(BRAID_P_SOCKET_IFNAME);
  int ndev = 0;
  for (struct fi_info* i = list; i && ndev < BRAID_NET_MAX_DEVS; i = i->next) {
    if (strcmp(i->fabric_attr->prov_name, first) != 0) continue;
    if (ifspec && ifspec[0] && !socket_ifname_match(ifspec, i->domain_attr->name)) continue;
    int d = 0;
    while (d < ndev && strcmp(devs[d].info->domain_attr->name, i->domain_attr->name) != 0) d++;
    if (d == ndev)
      devs[ndev++] = (struct ofi_dev){.info = i};
    else if (i->addr_format == FI_SOCKADDR_IN && devs[d].info->addr_format != FI_SOCKADDR_IN)
      devs[d].info = i; /* IPv4 reaches more peers than a link-local IPv6 address */
  }
  return ndev;
}

/*
 * Whether `dev` (fabric and domain opened here, kept on success) can register
 * CUDA memory of `gpu` (ofi_hmem_register_check). Else 0 with the reason in
 * `why`, nothing left open.
 */
static int ofi_hmem_check(struct ofi_dev* dev, const struct ofi_hmem_gpu* gpu, char* why,
                          size_t why_size) {
  int rc = fi.fabric(dev->info->fabric_attr, &dev->fabric, NULL);
  if (rc != 0)
    dev->fabric = NULL;
  else if ((rc = fi_domain(dev->fabric, dev->info, &dev->domain, NULL)) != 0)
    dev->domain = NULL;
  if (rc != 0)
    snprintf(why, why_size, "opening provider %s's domain %s with FI_HMEM failed: %s",
             dev->info->fabric_attr->prov_name, dev->info->domain_attr->name, fi.strerror(-rc));
  else if (ofi_hmem_register_check(dev->domain, dev->info->domain_attr->name, gpu, fi.strerror, why,
                                   why_size))
    return 1;
  if (dev->domain) fi_close(&dev->domain->fid);
  if (dev->fabric) fi_close(&dev->fabric->fid);
  dev->domain = NULL;
  dev->fabric = NULL;
  return 0;
}

/*
 * GPU memory straight to the provider (FI_HMEM) where it offers it, this
 * process has a GPU, and a device buffer registers on the first device: the
 * devices are then the same provider's domains asked for FI_HMEM too. Else
 * (or with BRAID_OFI_HMEM=0) they stay as found, host memory only. Either
 * way one NET INFO line says which, and why.
 */
static void ofi_hmem_setup(void) {
  const char* prov = ofi.list->fabric_attr->prov_name;
  uint64_t caps = FI_TAGGED | FI_MSG | (ofi.directed ? FI_DIRECTED_RECV : 0);
  struct fi_info* list = NULL;
  struct ofi_dev devs[BRAID_NET_MAX_DEVS];
  struct ofi_hmem_gpu gpu;
  char why[256];
  int ndev = 0;
  if (braid_param_int(BRAID_P_OFI_HMEM) == 0) {
    snprintf(why, sizeof why, "turned off by BRAID_OFI_HMEM=0");
  } else if (ofi_getinfo(caps, 1, prov, &list) != 0 || list == NULL) {
    list = NULL;
    snprintf(why, sizeof why, "provider %s does not offer FI_HMEM (fi_getinfo found no match)",
             prov);
  } else if ((ndev = ofi_devs_pick(list, devs)) == 0) {
    snprintf(why, sizeof why,
             "provider %s offers FI_HMEM on no domain that BRAID_SOCKET_IFNAME selects", prov);
  } else if (ofi_hmem_gpu_find(&gpu, why, sizeof why) &&
             ofi_hmem_check(&devs[0], &gpu, why, sizeof why)) {
    fi.freeinfo(ofi.list);
    ofi.list = list;
    memcpy(ofi.devs, devs, sizeof devs);
    ofi.ndev = ndev;
    ofi.hmem = 1;
    ofi.hmem_flush = gpu.needs_flush;
    INFO(BRAID_LOG_NET,
         "net OFI: GPU memory on: provider %s offers FI_HMEM and GPU %d memory registers "
         "(mr_mode %#x%s); CUDA buffers go to the provider as they are",
         prov, gpu.dev, (unsigned)list->domain_attr->mr_mode,
         gpu.needs_flush ? "; received data is flushed" : "");
    return;
  }
  if (list) fi.freeinfo(list);
  INFO(BRAID_LOG_NET, "net OFI: GPU memory off: %s; staging every message through host memory",
       why);
}

/*
 * Receives name their sender (FI_DIRECTED_RECV) where the provider can: a stray process that
 * learnt an endpoint's address can then not slip a message into a connection. Without it a
 * connection's endpoint is known to its peer only, and both handshake messages carry the key.
 */
static void ofi_find_devices(void) {
  const char* prov = braid_param_str(BRAID_P_OFI_PROVIDER);
  int rc = ofi_getinfo(FI_TAGGED | FI_MSG, 0, prov, &ofi.list);
  /* The provider chosen without it, then the same one asked for FI_DIRECTED_RECV too. */
  struct fi_info* directed = NULL;
  if (rc == 0 && ofi.list &&
      ofi_getinfo(FI_TAGGED | FI_MSG | FI_DIRECTED_RECV, 0, ofi.list->fabric_attr->prov_name,
                  &directed) == 0 &&
      directed != NULL) {
    fi.freeinfo(ofi.list);
    ofi.list = directed;
    ofi.directed = 1;
  } else if (rc == 0 && ofi.list) {
    INFO(BRAID_LOG_NET,
         "net OFI: provider %s does not offer FI_DIRECTED_RECV: a connection "
         "takes messages from whoever has its endpoint's address",
         ofi.list->fabric_attr->prov_name);
  }
  if (rc != 0 || ofi.list == NULL) {
    snprintf(ofi.why, sizeof ofi.why, "no libfabric provider%s%s offers tagged reliable datagrams: %s",
             prov ? " matching " : "", prov ? prov : "", fi.strerror(-rc));
    ofi.list = NULL;
    return;
  }
  ofi.ndev = ofi_devs_pick(ofi.list, ofi.devs);
  if (ofi.ndev == 0) {
    const char* ifspec = braid_param_str(BRAID_P_SOCKET_IFNAME);
    snprintf(ofi.why, sizeof ofi.why,
             "provider %s has no domain that BRAID_SOCKET_IFNAME=\"%s\" selects",
             ofi.list->fabric_attr->prov_name, ifspec ? ifspec : "");
    return;
  }
  ofi_hmem_setup();
}

ncclResult_t ofi_init(int* ndev, char* why, size_t why_size) {
  pthread_mutex_lock(&ofi.lock);
  if (!ofi.loaded) {
    ofi.loaded = 1;
    if (ofi_load_lib()) ofi_find_devices();
  }
  *ndev = ofi.ndev;
  snprintf(why, why_size, "%s", ofi.why);
  pthread_mutex_unlock(&ofi.lock);
  return ncclSuccess;
}

ncclResult_t ofi_props(int dev, struct braid_net_props* props) {
  if (dev < 0 || dev >= ofi.ndev) return braid_err(ncclInternalError, "net OFI: no device %d", dev);
  const struct fi_info* i = ofi.devs[dev].info;
  memset(props, 0, sizeof *props);
  snprintf(props->name, sizeof props->name, "%s (%s)", i->domain_attr->name, i->fabric_attr->prov_name);
  props->speed_mbps = i->nic && i->nic->link_attr ? (int)(i->nic->link_attr->speed / 1000000) : 10000;
  if (props->speed_mbps <= 0) props->speed_mbps = 10000;
  props->ptr_support = BRAID_NET_PTR_HOST | (ofi.hmem ? BRAID_NET_PTR_CUDA : 0);
  props->max_requests = OFI_MAX_REQS;
  props->max_bytes = i->ep_attr->max_msg_size;
  return ncclSuccess;
}

/* ------------------------------------------------------------- domains */

ncclResult_t ofi_fail(const char* what, int rc) {
  return braid_err(ncclSystemError, "net OFI: %s failed: %s (%d)", what, fi.strerror(-rc), rc);
}

ncclResult_t ofi_domain_get(int dev, struct fid_domain** out) {
  ncclResult_t res = ncclSuccess;
  struct ofi_dev* d = &ofi.devs[dev];
  int rc = 0;
  pthread_mutex_lock(&ofi.lock);
  if (d->fabric == NULL && (rc = fi.fabric(d->info->fabric_attr, &d->fabric, NULL)) != 0) {
    d->fabric = NULL;
    res = ofi_fail("fi_fabric", rc);
  } else if (d->domain == NULL && (rc = fi_domain(d->fabric, d->info, &d->domain, NULL)) != 0) {
    d->domain = NULL;
    res = ofi_fail("fi_domain", rc);
  }
  *out = d->domain;
  pthread_mutex_unlock(&ofi.lock);
  return res;
}

#endif /* BRAID_HAVE_LIBFABRIC */
