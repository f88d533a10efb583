/*
 * What sysfs tells about a node, written as NCCL topology XML: the CPU (NUMA
 * domain) a PCI device hangs from, the PCIe switches in between, and the
 * network adapters (InfiniBand/RoCE ports through libibverbs, Ethernet
 * interfaces from /sys/class/net).
 *
 * We read sysfs directly instead of using hwloc (which DESIGN.md lists),
 * neither linked nor loaded with dlopen. Everything the graph needs from
 * the CPU side is four files, the very ones hwloc reads on Linux: the PCI
 * tree is the realpath of /sys/bus/pci/devices/<busid> (every directory on
 * the way is a bridge), link speed and width are max_link_speed/width
 * there, NUMA placement is its numa_node file, CPU masks come from
 * /sys/devices/system/node and the CPU kind from /proc/cpuinfo. What hwloc
 * adds beyond that (caches, cores, NUMA distances, non-Linux systems) the
 * graph does not use, while hwloc would cost one libnccl.so.2 a dependency
 * that must load everywhere. Where sysfs hides the real tree (a VM), no
 * library can recover it: BRAID_TOPO_FILE gives the host's shape instead.
 *
 * A PCIe switch shows up as an upstream port with downstream ports under
 * it; like NCCL we keep the upstream port only (we climb two directories at
 * a time), so GPUs under one switch are "one switch apart" (PIX).
 */
#include <ctype.h>
#include <dirent.h>
#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>

#include "base/debug.h"
#include "base/error.h"
#include "base/utils.h"
#include "graph/topo.h"
#include "graph/topo_detect.h"

/* Reads the first line of `dir`/`file` into out ("" when unreadable). */
void topo_sysfs_read(const char* dir, const char* file, char* out, size_t size) {
  char path[PATH_MAX];
  out[0] = '\0';
  if (snprintf(path, sizeof path, "%s/%s", dir, file) >= (int)sizeof path) return;
  FILE* f = fopen(path, "r");
  if (f == NULL) return;
  if (fgets(out, (int)size, f) == NULL) out[0] = '\0';
  fclose(f);
  out[strcspn(out, "\n")] = '\0';
}

/* Is `s` a PCI address "dddd:bb:dd.f"? */
static int topo_sysfs_is_bdf(const char* s) {
  unsigned a, b, c, d;
  int n = -1;
  return sscanf(s, "%x:%x:%x.%x%n", &a, &b, &c, &d, &n) == 4 && s[n] == '\0';
}

/* The slower of the device's and its upstream port's link: NCCL's choice too. */
static ncclResult_t topo_sysfs_link_attrs(struct xml_node* pci, const char* dir) {
  ncclResult_t res = ncclSuccess;
  char dev_speed[64], port_speed[64], dev_width[16], port_width[16];
  topo_sysfs_read(dir, "max_link_speed", dev_speed, sizeof dev_speed);
  topo_sysfs_read(dir, "../max_link_speed", port_speed, sizeof port_speed);
  topo_sysfs_read(dir, "max_link_width", dev_width, sizeof dev_width);
  topo_sysfs_read(dir, "../max_link_width", port_width, sizeof port_width);
  const char* speed = dev_speed;
  if (port_speed[0] && (!dev_speed[0] || strtod(port_speed, NULL) < strtod(dev_speed, NULL)))
    speed = port_speed;
  long w = strtol(dev_width, NULL, 10), pw = strtol(port_width, NULL, 10);
  if (pw > 0 && (w <= 0 || pw < w)) w = pw;
  BRAID_TRY(xml_attr_init(pci, "link_speed", speed));
  BRAID_TRY(xml_attr_set_int(pci, "link_width", w > 0 ? w : 0));
fail:
  return res;
}

/* Fills the attributes NCCL writes for a <pci> from its sysfs directory. */
static ncclResult_t topo_sysfs_pci_attrs(struct xml_node* pci, const char* dir) {
  ncclResult_t res = ncclSuccess;
  static const char* files[] = {"class", "vendor", "device", "subsystem_vendor",
                                "subsystem_device"};
  char value[64];
  for (size_t i = 0; i < BRAID_ARRAY_LEN(files); i++) {
    topo_sysfs_read(dir, files[i], value, sizeof value);
    if (value[0]) BRAID_TRY(xml_attr_init(pci, files[i], value));
  }
  BRAID_TRY(topo_sysfs_link_attrs(pci, dir));
fail:
  return res;
}

/* x86_64 / vendor / family / model, as NCCL records them on <cpu>. */
static ncclResult_t topo_sysfs_cpu_attrs(struct xml_node* cpu, int numa) {
  ncclResult_t res = ncclSuccess;
  char line[256], dir[64], affinity[1024];
  struct utsname u;
  if (uname(&u) == 0) BRAID_TRY(xml_attr_init(cpu, "arch", u.machine));
  snprintf(dir, sizeof dir, "/sys/devices/system/node/node%d", numa);
  topo_sysfs_read(dir, "cpumap", affinity, sizeof affinity);
  if (numa >= 0 && affinity[0]) BRAID_TRY(xml_attr_init(cpu, "affinity", affinity));
  FILE* f = fopen("/proc/cpuinfo", "r");
  if (f == NULL) return ncclSuccess;
  int found = 0;
  while (found < 3 && fgets(line, sizeof line, f)) {
    char* colon = strchr(line, ':');
    if (colon == NULL) continue;
    char* value = colon + 1;
    while (*value == ' ') value++;
    value[strcspn(value, "\n")] = '\0';
    const char* key = strncmp(line, "vendor_id", 9) == 0     ? "vendor"
                      : strncmp(line, "cpu family", 10) == 0 ? "familyid"
                      : strncmp(line, "model\t", 6) == 0 || strncmp(line, "model ", 6) == 0
                          ? "modelid"
                          : NULL;
    if (key == NULL) continue;
    res = xml_attr_init(cpu, key, value);
    if (res != ncclSuccess) break;
    found++;
  }
  fclose(f);
  return res;
fail:
  return res;
}

ncclResult_t topo_sysfs_cpu_element(struct xml_doc* doc, int numa, struct xml_node** out) {
  ncclResult_t res = ncclSuccess;
  char id[16];
  struct xml_node* cpu = NULL;
  if (doc->root == NULL) {
    struct xml_node* sys = NULL;
    BRAID_TRY(xml_node_add(doc, NULL, "system", &sys));
    BRAID_TRY(xml_attr_set(sys, "version", "1"));
  }
  snprintf(id, sizeof id, "%d", numa);
  cpu = xml_child_find(doc->root, "cpu", "numaid", id);
  if (cpu == NULL) {
    BRAID_TRY(xml_node_add(doc, doc->root, "cpu", &cpu));
    BRAID_TRY(xml_attr_set(cpu, "numaid", id));
    BRAID_TRY(topo_sysfs_cpu_attrs(cpu, numa));
  }
  *out = cpu;
fail:
  return res;
}

/* Finds or creates <pci busid=`busid`> under `parent`, filled from `dir`. */
static ncclResult_t topo_sysfs_pci_child(struct xml_doc* doc, struct xml_node* parent,
                                         const char* busid, const char* dir,
                                         struct xml_node** out) {
  ncclResult_t res = ncclSuccess;
  struct xml_node* pci = xml_child_find(parent, "pci", "busid", busid);
  if (pci == NULL) {
    BRAID_TRY(xml_node_add(doc, parent, "pci", &pci));
    BRAID_TRY(xml_attr_set(pci, "busid", busid));
    if (dir) BRAID_TRY(topo_sysfs_pci_attrs(pci, dir));
  }
  *out = pci;
fail:
  return res;
}

/* The PCI addresses along a sysfs device path, with where each one's directory ends. */
struct sysfs_chain {
  int n;
  char name[32][16];
  size_t end[32];
};

static void topo_sysfs_chain_split(const char* real, struct sysfs_chain* c) {
  const char* p = real;
  c->n = 0;
  while (*p) {
    if (*p == '/') p++;
    const char* s = p;
    while (*p && *p != '/') p++;
    size_t len = (size_t)(p - s);
    char name[16];
    if (len == 0 || len >= sizeof name) continue;
    memcpy(name, s, len);
    name[len] = '\0';
    if (!topo_sysfs_is_bdf(name)) continue;
    if (c->n == 32) memmove(&c->name[0], &c->name[1], sizeof c->name - sizeof c->name[0]);
    if (c->n == 32) memmove(&c->end[0], &c->end[1], sizeof c->end - sizeof c->end[0]);
    if (c->n < 32) c->n++;
    snprintf(c->name[c->n - 1], sizeof c->name[0], "%s", name);
    c->end[c->n - 1] = (size_t)(p - real);
  }
}

ncclResult_t topo_sysfs_pci_element(struct xml_doc* doc, const char* busid, struct xml_node** out) {
  ncclResult_t res = ncclSuccess;
  char link[PATH_MAX], real[PATH_MAX], dir[PATH_MAX], numa_text[16], lower[32];
  struct sysfs_chain chain;
  struct xml_node* parent = NULL;
  snprintf(lower, sizeof lower, "%s", busid);
  for (char* c = lower; *c; c++) *c = (char)tolower((unsigned char)*c);
  snprintf(link, sizeof link, "/sys/bus/pci/devices/%s", lower);
  if (realpath(link, real) == NULL) {
    /* No sysfs entry (a container hiding it): hang the device on an unknown CPU. */
    BRAID_TRY(topo_sysfs_cpu_element(doc, -1, &parent));
    return topo_sysfs_pci_child(doc, parent, lower, NULL, out);
  }
  topo_sysfs_read(real, "numa_node", numa_text, sizeof numa_text);
  BRAID_TRY(topo_sysfs_cpu_element(doc, numa_text[0] ? atoi(numa_text) : -1, &parent));
  topo_sysfs_chain_split(real, &chain);
  if (chain.n == 0) return topo_sysfs_pci_child(doc, parent, lower, real, out);
  /* Switch upstream ports: every second directory above the device (root ports skipped). */
  int first = (chain.n - 1) % 2 == 0 ? 0 : 1;
  for (int i = first; i < chain.n; i += 2) {
    snprintf(dir, sizeof dir, "%.*s", (int)chain.end[i], real);
    const char* name = i == chain.n - 1 ? lower : chain.name[i];
    BRAID_TRY(topo_sysfs_pci_child(doc, parent, name, dir, &parent));
  }
  *out = parent;
fail:
  return res;
}
