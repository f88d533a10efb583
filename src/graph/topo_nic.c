/*
 * Network adapters of this node, as <nic><net .../></nic> under their PCI
 * device. InfiniBand and RoCE ports are listed when libibverbs loads (dlopen
 * libibverbs.so.1: the verbs devices are what the IB backend can open); their
 * state, rate and GUID come from /sys/class/infiniband so we need no verbs
 * struct layouts. Ethernet interfaces that are up and backed by a PCI device
 * come from /sys/class/net with their speed.
 *
 * Devices are numbered IB ports first (by name, then port), then Ethernet (by
 * name), so every rank of a host numbers them alike.
 */
#include <dirent.h>
#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/debug.h"
#include "base/error.h"
#include "base/utils.h"
#include "graph/topo_detect.h"

#define NIC_MAX 64

struct nic_names {
  int n;
  char name[NIC_MAX][64];
};

static int topo_nic_cmp(const void* a, const void* b) { return strcmp(a, b); }

/* Names of the verbs devices, sorted; none when libibverbs is absent. */
static void topo_nic_ib_names(struct nic_names* out) {
  out->n = 0;
  void* lib = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    INFO(BRAID_LOG_NET, "libibverbs not loaded (%s): no InfiniBand/RoCE ports", dlerror());
    return;
  }
  void** (*get_list)(int*) = (void** (*)(int*))dlsym(lib, "ibv_get_device_list");
  void (*free_list)(void**) = (void (*)(void**))dlsym(lib, "ibv_free_device_list");
  const char* (*get_name)(void*) = (const char* (*)(void*))dlsym(lib, "ibv_get_device_name");
  if (get_list && free_list && get_name) {
    int count = 0;
    void** list = get_list(&count);
    for (int i = 0; list && i < count && out->n < NIC_MAX; i++) {
      const char* name = get_name(list[i]);
      if (name) snprintf(out->name[out->n++], sizeof out->name[0], "%s", name);
    }
    if (list) free_list(list);
  }
  dlclose(lib);
  qsort(out->name, (size_t)out->n, sizeof out->name[0], topo_nic_cmp);
}

/* The last PCI address in the realpath of `link` (a device may be a child of its PCI function). */
static int topo_nic_busid(const char* link, char* out, size_t size) {
  char real[PATH_MAX];
  if (realpath(link, real) == NULL) return -1;
  for (char* slash; (slash = strrchr(real, '/')) != NULL; *slash = '\0') {
    unsigned a, b, c, d;
    int n = -1;
    if (sscanf(slash + 1, "%x:%x:%x.%x%n", &a, &b, &c, &d, &n) == 4 && slash[1 + n] == '\0') {
      snprintf(out, size, "%s", slash + 1);
      return 0;
    }
  }
  return -1;
}

/* Adds <net> under the <nic> of PCI device `busid`. */
static ncclResult_t topo_nic_add(struct xml_doc* doc, const char* busid, const char* name, int dev,
                                 long long mbps, int port, const char* guid, int gdr) {
  ncclResult_t res = ncclSuccess;
  struct xml_node *pci = NULL, *nic = NULL, *net = NULL;
  BRAID_TRY(topo_sysfs_pci_element(doc, busid, &pci));
  nic = xml_child_find(pci, "nic", NULL, NULL);
  if (nic == NULL) BRAID_TRY(xml_node_add(doc, pci, "nic", &nic));
  BRAID_TRY(xml_node_add(doc, nic, "net", &net));
  BRAID_TRY(xml_attr_set(net, "name", name));
  BRAID_TRY(xml_attr_set_int(net, "dev", dev));
  BRAID_TRY(xml_attr_set_int(net, "speed", mbps));
  BRAID_TRY(xml_attr_set_int(net, "port", port));
  BRAID_TRY(xml_attr_set(net, "latency", "0.000000"));
  BRAID_TRY(xml_attr_set(net, "guid", guid));
  BRAID_TRY(xml_attr_set_int(net, "maxconn", 65536));
  BRAID_TRY(xml_attr_set_int(net, "gdr", gdr));
fail:
  return res;
}

/* GPUDirect RDMA through the peer-memory module; dma-buf support is the IB backend's call. */
static int topo_nic_gdr(void) {
  struct stat st;
  return stat("/sys/module/nvidia_peermem", &st) == 0 || stat("/sys/module/nv_peer_mem", &st) == 0;
}

static ncclResult_t topo_nic_ib(struct xml_doc* doc, int* dev) {
  ncclResult_t res = ncclSuccess;
  struct nic_names names;
  topo_nic_ib_names(&names);
  for (int i = 0; i < names.n; i++) {
    char dir[128], link[PATH_MAX], busid[32], guid_text[64], guid[32] = "0x0";
    snprintf(dir, sizeof dir, "/sys/class/infiniband/%s", names.name[i]);
    snprintf(link, sizeof link, "%s/device", dir);
    if (topo_nic_busid(link, busid, sizeof busid) != 0) continue;
    topo_sysfs_read(dir, "node_guid", guid_text, sizeof guid_text);
    unsigned g[4];
    if (sscanf(guid_text, "%4x:%4x:%4x:%4x", &g[0], &g[1], &g[2], &g[3]) == 4)
      snprintf(guid, sizeof guid, "0x%04x%04x%04x%04x", g[0], g[1], g[2], g[3]);
    for (int port = 1; port <= 8; port++) {
      char pdir[160], state[64], rate[64], name[80];
      snprintf(pdir, sizeof pdir, "%s/ports/%d", dir, port);
      topo_sysfs_read(pdir, "state", state, sizeof state);
      if (strstr(state, "ACTIVE") == NULL) continue;
      topo_sysfs_read(pdir, "rate", rate, sizeof rate); /* "400 Gb/sec (4X NDR)" */
      long long mbps = (long long)(strtod(rate, NULL) * 1000.0);
      if (port == 1)
        snprintf(name, sizeof name, "%s", names.name[i]);
      else
        snprintf(name, sizeof name, "%s:%d", names.name[i], port);
      BRAID_TRY(topo_nic_add(doc, busid, name, (*dev)++, mbps > 0 ? mbps : -1, port, guid,
                             topo_nic_gdr()));
    }
  }
fail:
  return res;
}

static ncclResult_t topo_nic_ethernet(struct xml_doc* doc, int* dev, int skip_rdma) {
  ncclResult_t res = ncclSuccess;
  struct nic_names names = {0};
  DIR* d = opendir("/sys/class/net");
  if (d == NULL) return ncclSuccess;
  for (struct dirent* e; (e = readdir(d)) != NULL && names.n < NIC_MAX;)
    if (e->d_name[0] != '.' && strcmp(e->d_name, "lo") != 0 &&
        strlen(e->d_name) < sizeof names.name[0])
      memcpy(names.name[names.n++], e->d_name, strlen(e->d_name) + 1);
  closedir(d);
  qsort(names.name, (size_t)names.n, sizeof names.name[0], topo_nic_cmp);
  for (int i = 0; i < names.n; i++) {
    char dir[128], link[PATH_MAX], rdma[PATH_MAX], busid[32], state[32], speed[32];
    struct stat st;
    snprintf(dir, sizeof dir, "/sys/class/net/%s", names.name[i]);
    snprintf(link, sizeof link, "%s/device", dir);
    snprintf(rdma, sizeof rdma, "%s/device/infiniband", dir);
    if (topo_nic_busid(link, busid, sizeof busid) != 0) continue; /* virtual interface */
    if (skip_rdma && stat(rdma, &st) == 0) continue;              /* listed as a verbs port */
    topo_sysfs_read(dir, "operstate", state, sizeof state);
    if (strcmp(state, "up") != 0) continue;
    topo_sysfs_read(dir, "speed", speed, sizeof speed);
    long long mbps = speed[0] ? strtoll(speed, NULL, 10) : -1;
    BRAID_TRY(topo_nic_add(doc, busid, names.name[i], (*dev)++, mbps > 0 ? mbps : -1, 0, "0x0", 0));
  }
fail:
  return res;
}

/* Is there a <net> anywhere under `node`? */
static int topo_nic_present(const struct xml_node* node) {
  if (strcmp(node->name, "net") == 0) return 1;
  for (int i = 0; i < node->nchildren; i++)
    if (topo_nic_present(node->children[i])) return 1;
  return 0;
}

ncclResult_t topo_nic_detect(struct xml_doc* doc) {
  ncclResult_t res = ncclSuccess;
  int dev = 0;
  if (doc->root && topo_nic_present(doc->root)) return ncclSuccess;
  BRAID_TRY(topo_nic_ib(doc, &dev));
  BRAID_TRY(topo_nic_ethernet(doc, &dev, dev > 0));
  INFO(BRAID_LOG_GRAPH, "detected %d network port%s", dev, dev == 1 ? "" : "s");
fail:
  return res;
}
