/*
 * NVLink state from NVML, loaded at run time (dlopen libnvidia-ml.so.1) so
 * that one libnccl.so.2 runs where the driver's NVML is absent (containers,
 * CI). We declare the few NVML types we use ourselves; their layout is
 * NVML's stable ABI (nvmlPciInfo_t: 16-byte legacy id, five unsigned ints,
 * 32-byte bus id).
 *
 * NVML is initialized once per process and never shut down: NCCL does the
 * same, and other users of NVML in the process keep their own reference.
 */
#include <ctype.h>
#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

#include "base/debug.h"
#include "base/error.h"
#include "graph/topo_detect.h"

typedef int nvml_return_t;
typedef struct nvml_device* nvml_device_t;
typedef struct {
  char bus_id_legacy[16];
  unsigned domain, bus, device, pci_device_id, pci_subsystem_id;
  char bus_id[32];
} nvml_pci_info_t;

enum { NVML_OK = 0, NVML_FEATURE_ENABLED = 1, NVML_CAP_P2P_SUPPORTED = 0 };
enum { NVML_REMOTE_GPU = 0, NVML_REMOTE_IBMNPU = 1, NVML_REMOTE_SWITCH = 2 };

static struct {
  int ok;
  nvml_return_t (*init)(void);
  const char* (*error_string)(nvml_return_t);
  nvml_return_t (*handle_by_bus_id)(const char*, nvml_device_t*);
  nvml_return_t (*link_state)(nvml_device_t, unsigned, int*);
  nvml_return_t (*link_cap)(nvml_device_t, unsigned, int, unsigned*);
  nvml_return_t (*remote_pci)(nvml_device_t, unsigned, nvml_pci_info_t*);
  nvml_return_t (*remote_type)(nvml_device_t, unsigned, int*); /* may be NULL (old drivers) */
} nvml;

static pthread_once_t nvml_once = PTHREAD_ONCE_INIT;

static void topo_nvml_load(void) {
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    INFO(BRAID_LOG_GRAPH, "NVML not loaded (%s): NVLink taken from CUDA peer access", dlerror());
    return;
  }
  nvml.init = (nvml_return_t(*)(void))dlsym(lib, "nvmlInit_v2");
  nvml.error_string = (const char* (*)(nvml_return_t))dlsym(lib, "nvmlErrorString");
  nvml.handle_by_bus_id =
      (nvml_return_t(*)(const char*, nvml_device_t*))dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2");
  nvml.link_state =
      (nvml_return_t(*)(nvml_device_t, unsigned, int*))dlsym(lib, "nvmlDeviceGetNvLinkState");
  nvml.link_cap = (nvml_return_t(*)(nvml_device_t, unsigned, int, unsigned*))dlsym(
      lib, "nvmlDeviceGetNvLinkCapability");
  nvml.remote_pci = (nvml_return_t(*)(nvml_device_t, unsigned, nvml_pci_info_t*))dlsym(
      lib, "nvmlDeviceGetNvLinkRemotePciInfo_v2");
  nvml.remote_type = (nvml_return_t(*)(nvml_device_t, unsigned, int*))dlsym(
      lib, "nvmlDeviceGetNvLinkRemoteDeviceType");
  if (!nvml.init || !nvml.handle_by_bus_id || !nvml.link_state || !nvml.remote_pci) {
    INFO(BRAID_LOG_GRAPH, "NVML too old (missing NVLink queries): NVLink taken from CUDA");
    return;
  }
  nvml_return_t rc = nvml.init();
  if (rc != NVML_OK) {
    INFO(BRAID_LOG_GRAPH, "nvmlInit_v2 failed (%s): NVLink taken from CUDA",
         nvml.error_string ? nvml.error_string(rc) : "?");
    return;
  }
  nvml.ok = 1; /* `lib` stays loaded for the life of the process */
}

/* NVML prints "00000000:3B:00.0"; NCCL's XML has "0000:3b:00.0". */
static void topo_nvml_busid(const nvml_pci_info_t* pci, char* out, size_t size) {
  unsigned dom = pci->domain, bus = pci->bus, dev = pci->device;
  if (dom == 0xffffffffu || (dom == 0 && bus == 0 && dev == 0 && pci->bus_id[0] == 'F')) {
    snprintf(out, size, "fffffff:ff:ff.0");
    return;
  }
  snprintf(out, size, "%04x:%02x:%02x.0", dom, bus, dev);
}

/* Remote end class: NVML's own answer, else guessed from the bus id (switches show all-F). */
static const char* topo_nvml_tclass(nvml_device_t dev, unsigned link, const char* target) {
  int type = -1;
  if (nvml.remote_type && nvml.remote_type(dev, link, &type) != NVML_OK) type = -1;
  if (type == NVML_REMOTE_SWITCH) return "0x068000";
  if (type == NVML_REMOTE_IBMNPU) return "0x068001";
  if (type == NVML_REMOTE_GPU) return "0x030200";
  return strncmp(target, "fffffff", 7) == 0 ? "0x068000" : "0x030200";
}

static void topo_nvml_count(struct topo_nvlink* links, int* n, const char* target,
                            const char* tclass) {
  for (int i = 0; i < *n; i++) {
    if (strcmp(links[i].target, target) == 0) {
      links[i].count++;
      return;
    }
  }
  if (*n >= TOPO_NVLINK_MAX) return;
  snprintf(links[*n].target, sizeof links[*n].target, "%s", target);
  links[*n].tclass = tclass;
  links[*n].count = 1;
  (*n)++;
}

ncclResult_t topo_nvml_links(const char* busid, struct topo_nvlink* links, int* n, int* have_nvml) {
  char upper[32];
  nvml_device_t dev;
  *n = 0;
  pthread_once(&nvml_once, topo_nvml_load);
  *have_nvml = nvml.ok;
  if (!nvml.ok) return ncclSuccess;
  snprintf(upper, sizeof upper, "%s", busid);
  for (char* c = upper; *c; c++) *c = (char)toupper((unsigned char)*c);
  nvml_return_t rc = nvml.handle_by_bus_id(upper, &dev);
  if (rc != NVML_OK) {
    INFO(BRAID_LOG_GRAPH, "NVML does not know GPU %s (%s): NVLink taken from CUDA", busid,
         nvml.error_string ? nvml.error_string(rc) : "?");
    *have_nvml = 0;
    return ncclSuccess;
  }
  for (unsigned l = 0; l < TOPO_NVLINK_MAX; l++) {
    int active = 0;
    unsigned p2p = 1;
    nvml_pci_info_t pci;
    char target[32];
    if (nvml.link_state(dev, l, &active) != NVML_OK || active != NVML_FEATURE_ENABLED) continue;
    if (nvml.link_cap && nvml.link_cap(dev, l, NVML_CAP_P2P_SUPPORTED, &p2p) == NVML_OK && !p2p)
      continue;
    memset(&pci, 0, sizeof pci);
    if (nvml.remote_pci(dev, l, &pci) != NVML_OK) continue;
    topo_nvml_busid(&pci, target, sizeof target);
    topo_nvml_count(links, n, target, topo_nvml_tclass(dev, l, target));
  }
  return ncclSuccess;
}
