/*
 * NCCL's topology XML, read into a node graph. The format, as NCCL 2.28
 * writes it:
 *
 *   <system version="1">
 *     <cpu numaid="0" affinity="..." arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="143">
 *       <pci busid="0000:17:00.0" class="0x060400" link_speed="32.0 GT/s PCIe" link_width="16">
 *         <pci busid="0000:19:00.0" class="0x030200" link_speed="..." link_width="16">
 *           <gpu dev="0" sm="90" rank="0" gdr="1">
 *             <nvlink target="fffffff:ff:ff.0" count="18" tclass="0x068000"/>
 *           </gpu>
 *         </pci>
 *         <pci busid="0000:1a:00.0" class="0x020700" ...>
 *           <nic><net name="mlx5_0" dev="0" speed="400000" port="1" guid="0x..." maxconn="131072" gdr="1"/></nic>
 *         </pci>
 *       </pci>
 *     </cpu>
 *   </system>
 *
 * A <pci> is a switch (class 0x0604xx: its upstream port; downstream ports
 * are folded into it), a GPU (has <gpu>) or a NIC (has <nic>); other devices
 * are ignored, as NCCL does. NVLink targets: tclass 0x03xxxx is a GPU (by bus
 * id), 0x068001 the GPU's CPU, anything else the NVSwitch fabric, which is one
 * node however many switch chips there are. Unknown elements and attributes
 * are ignored so that newer NCCL dumps still load; what is read is checked.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/utils.h"
#include "graph/topo.h"

#define TOPO_NVS_ID 0
#define TOPO_CPU_NIC_ID(numa) (-1000 - (int64_t)(numa)) /* a NIC hung directly on a CPU */

ncclResult_t topo_xml_int(const struct xml_doc* doc, const struct xml_node* node, const char* key,
                          int required, long long min, long long max, long long def,
                          long long* out) {
  const char* text = xml_attr_get(node, key);
  *out = def;
  if (text == NULL) {
    if (!required) return ncclSuccess;
    return braid_err(ncclInvalidUsage,
                     "%s:%d: <%s> has no %s attribute: expected %s=\"<integer from %lld to %lld>\"",
                     doc->source, node->line, node->name, key, key, min, max);
  }
  char* end = NULL;
  errno = 0;
  long long v = strtoll(text, &end, 0);
  while (end && (*end == ' ' || *end == '\t')) end++;
  if (errno != 0 || end == text || *end != '\0' || v < min || v > max)
    return braid_err(ncclInvalidUsage,
                     "%s:%d: <%s %s=\"%.64s\">: expected an integer from %lld to %lld", doc->source,
                     node->line, node->name, key, text, min, max);
  *out = v;
  return ncclSuccess;
}

static ncclResult_t topo_xml_float(const struct xml_doc* doc, const struct xml_node* node,
                                   const char* key, double min, double max, double def,
                                   double* out) {
  const char* text = xml_attr_get(node, key);
  *out = def;
  if (text == NULL) return ncclSuccess;
  char* end = NULL;
  errno = 0;
  double v = strtod(text, &end);
  if (errno != 0 || end == text || *end != '\0' || !(v >= min && v <= max))
    return braid_err(ncclInvalidUsage, "%s:%d: <%s %s=\"%.64s\">: expected a number from %g to %g",
                     doc->source, node->line, node->name, key, text, min, max);
  *out = v;
  return ncclSuccess;
}

int topo_busid_parse(const char* text, int64_t* out) {
  unsigned long long dom = 0, bus = 0, dev = 0, fn = 0;
  int n = -1;
  if (strlen(text) > 20) return -1;
  if (sscanf(text, "%llx:%llx:%llx.%llx%n", &dom, &bus, &dev, &fn, &n) != 4 || text[n] != '\0') {
    dom = 0;
    n = -1;
    if (sscanf(text, "%llx:%llx.%llx%n", &bus, &dev, &fn, &n) != 3 || text[n] != '\0') return -1;
  }
  if (text[0] == '-' || text[0] == '+' || dom > 0xffffffffULL || bus > 0xff || dev > 0xff ||
      fn > 0xf)
    return -1;
  *out = (int64_t)((dom << 20) | (bus << 12) | (dev << 4) | fn);
  return 0;
}

struct xml_node* topo_xml_find_gpu(struct xml_node* node, int64_t busid) {
  int64_t id;
  const char* text = xml_attr_get(node, "busid");
  if (strcmp(node->name, "pci") == 0 && text && topo_busid_parse(text, &id) == 0 && id == busid)
    return xml_child_find(node, "gpu", NULL, NULL);
  for (int i = 0; i < node->nchildren; i++) {
    struct xml_node* gpu = topo_xml_find_gpu(node->children[i], busid);
    if (gpu) return gpu;
  }
  return NULL;
}

ncclResult_t topo_xml_busid(const struct xml_doc* doc, const struct xml_node* node, const char* key,
                            int64_t* out) {
  const char* text = xml_attr_get(node, key);
  if (text == NULL)
    return braid_err(ncclInvalidUsage,
                     "%s:%d: <%s> has no %s attribute: expected %s=\"dddd:bb:dd.f\" (a PCI bus id)",
                     doc->source, node->line, node->name, key, key);
  if (topo_busid_parse(text, out) != 0)
    return braid_err(ncclInvalidUsage,
                     "%s:%d: <%s %s=\"%.64s\">: expected a PCI bus id such as 0000:1b:00.0",
                     doc->source, node->line, node->name, key, text);
  return ncclSuccess;
}

/* Reads the CPU kind (for the socket-to-socket bandwidth). */
static ncclResult_t topo_xml_cpu_kind(const struct xml_doc* doc, const struct xml_node* xml,
                                      struct topo_node* cpu) {
  ncclResult_t res = ncclSuccess;
  const char* arch = xml_attr_get(xml, "arch");
  const char* vendor = xml_attr_get(xml, "vendor");
  long long family = 0, model = 0;
  cpu->u.cpu.arch = TUNE_CPU_ARCH_UNKNOWN;
  if (arch && strcmp(arch, "x86_64") == 0) cpu->u.cpu.arch = TUNE_CPU_ARCH_X86;
  if (arch && (strcmp(arch, "arm64") == 0 || strcmp(arch, "aarch64") == 0))
    cpu->u.cpu.arch = TUNE_CPU_ARCH_ARM;
  if (arch && strncmp(arch, "ppc64", 5) == 0) cpu->u.cpu.arch = TUNE_CPU_ARCH_POWER;
  if (vendor && strcmp(vendor, "GenuineIntel") == 0) cpu->u.cpu.vendor = TUNE_CPU_VENDOR_INTEL;
  if (vendor && strcmp(vendor, "AuthenticAMD") == 0) cpu->u.cpu.vendor = TUNE_CPU_VENDOR_AMD;
  if (vendor && (strcmp(vendor, "CentaurHauls") == 0 || strstr(vendor, "Shanghai") != NULL))
    cpu->u.cpu.vendor = TUNE_CPU_VENDOR_ZHAOXIN;
  BRAID_TRY(topo_xml_int(doc, xml, "familyid", 0, 0, 1 << 20, 0, &family));
  BRAID_TRY(topo_xml_int(doc, xml, "modelid", 0, 0, 1 << 20, 0, &model));
  /* Intel models, as NCCL classifies them: Sapphire/Emerald Rapids, Skylake and later. */
  if (cpu->u.cpu.vendor == TUNE_CPU_VENDOR_INTEL && family == 6) {
    cpu->u.cpu.model = model == 0xCF   ? TUNE_CPU_MODEL_ERP
                       : model == 0x8F ? TUNE_CPU_MODEL_SRP
                       : model >= 0x55 ? TUNE_CPU_MODEL_SKL
                                       : TUNE_CPU_MODEL_BDW;
  }
fail:
  return res;
}

static ncclResult_t topo_xml_add_net(const struct xml_doc* doc, struct topo_system* sys,
                                     const struct xml_node* xml, int nic) {
  ncclResult_t res = ncclSuccess;
  long long dev, speed, port, maxconn, gdr;
  double latency;
  int index;
  if (xml_attr_get(xml, "dev") == NULL) return ncclSuccess; /* NCCL skips ports it did not keep */
  BRAID_TRY(topo_xml_int(doc, xml, "dev", 1, 0, 65535, 0, &dev));
  BRAID_TRY(topo_xml_int(doc, xml, "speed", 0, -1, 100000000, 0, &speed));
  BRAID_TRY(topo_xml_int(doc, xml, "port", 0, 0, 65535, 0, &port));
  BRAID_TRY(topo_xml_int(doc, xml, "maxconn", 0, 0, (1LL << 31) - 1, 65536, &maxconn));
  BRAID_TRY(topo_xml_int(doc, xml, "gdr", 0, 0, 1, 0, &gdr));
  BRAID_TRY(topo_xml_float(doc, xml, "latency", 0.0, 1e9, 0.0, &latency));
  int dup = topo_node_find(sys, TOPO_NET, dev);
  BRAID_CHECK(dup < 0, ncclInvalidUsage,
              "%s:%d: <net dev=\"%lld\"> appears twice (also line %d): expected "
              "one <net> per dev",
              doc->source, xml->line, dev, sys->nodes[dup].line);
  BRAID_TRY(topo_node_add(sys, TOPO_NET, dev, &index));
  struct topo_node* net = &sys->nodes[index];
  const char* name = xml_attr_get(xml, "name");
  const char* guid = xml_attr_get(xml, "guid");
  net->line = xml->line;
  snprintf(net->u.net.name, sizeof net->u.net.name, "%s", name ? name : "");
  if (name == NULL) snprintf(net->u.net.name, sizeof net->u.net.name, "net%lld", dev);
  net->u.net.dev = (int)dev;
  net->u.net.port = (int)port;
  net->u.net.maxconn = (int)maxconn;
  net->u.net.gdr = (int)gdr;
  net->u.net.latency = (float)latency;
  net->u.net.guid = guid ? strtoull(guid, NULL, 16) : (uint64_t)dev;
  net->u.net.bw = speed > 0 ? (float)speed / 8000.0f : tune_table.net_default_bw;
  BRAID_TRY(topo_link_add_both(sys, nic, index, TOPO_LINK_NET, net->u.net.bw));
fail:
  return res;
}

static ncclResult_t topo_xml_add_nic(const struct xml_doc* doc, struct topo_system* sys,
                                     const struct xml_node* xml, int nic) {
  ncclResult_t res = ncclSuccess;
  for (int i = 0; i < xml->nchildren; i++)
    if (strcmp(xml->children[i]->name, "net") == 0)
      BRAID_TRY(topo_xml_add_net(doc, sys, xml->children[i], nic));
fail:
  return res;
}

static ncclResult_t topo_xml_add_gpu(const struct xml_doc* doc, struct topo_system* sys,
                                     const struct xml_node* xml, int64_t busid, int* index) {
  ncclResult_t res = ncclSuccess;
  long long dev, sm, gdr, mem;
  int dup = topo_node_find(sys, TOPO_GPU, busid);
  BRAID_CHECK(dup < 0, ncclInvalidUsage,
              "%s:%d: the GPU at this bus id appears twice (also line %d): expected one <gpu> "
              "per bus id",
              doc->source, xml->line, sys->nodes[dup].line);
  BRAID_TRY(topo_xml_int(doc, xml, "dev", 1, 0, 65535, 0, &dev));
  BRAID_TRY(topo_xml_int(doc, xml, "sm", 1, 10, 10000, 0, &sm));
  BRAID_TRY(topo_xml_int(doc, xml, "gdr", 0, 0, 1, 0, &gdr));
  BRAID_TRY(topo_xml_int(doc, xml, "mem", 0, 0, 1LL << 40, 0, &mem)); /* Braid's, MiB */
  BRAID_TRY(topo_node_add(sys, TOPO_GPU, busid, index));
  struct topo_node* gpu = &sys->nodes[*index];
  gpu->line = xml->line;
  gpu->u.gpu.dev = (int)dev;
  gpu->u.gpu.sm = (int)sm;
  gpu->u.gpu.gdr = (int)gdr;
  gpu->u.gpu.mem_mib = mem;
fail:
  return res;
}

static ncclResult_t topo_xml_add_pci(const struct xml_doc* doc, struct topo_system* sys,
                                     const struct xml_node* xml, int parent);

/* Adds the children of a switch or CPU element. */
static ncclResult_t topo_xml_add_children(const struct xml_doc* doc, struct topo_system* sys,
                                          const struct xml_node* xml, int parent) {
  ncclResult_t res = ncclSuccess;
  for (int i = 0; i < xml->nchildren; i++)
    if (strcmp(xml->children[i]->name, "pci") == 0)
      BRAID_TRY(topo_xml_add_pci(doc, sys, xml->children[i], parent));
fail:
  return res;
}

static ncclResult_t topo_xml_add_pci(const struct xml_doc* doc, struct topo_system* sys,
                                     const struct xml_node* xml, int parent) {
  ncclResult_t res = ncclSuccess;
  int64_t busid;
  long long width;
  int index = -1;
  BRAID_TRY(topo_xml_busid(doc, xml, "busid", &busid));
  BRAID_TRY(topo_xml_int(doc, xml, "link_width", 0, 0, 64, 0, &width));
  /* sysfs leaves width/speed empty in some VMs: NCCL then assumes x16 Gen3. */
  float bw = (float)(width ? width : 16) * tune_pcie_lane_bw(xml_attr_get(xml, "link_speed"));
  const struct xml_node* gpu = xml_child_find(xml, "gpu", NULL, NULL);
  const struct xml_node* nic = xml_child_find(xml, "nic", NULL, NULL);
  const char* cls = xml_attr_get(xml, "class");
  if (gpu) {
    BRAID_TRY(topo_xml_add_gpu(doc, sys, gpu, busid, &index));
  } else if (nic) {
    int64_t id = busid & ~(int64_t)0xf; /* ports of one adapter share its PCI link */
    index = topo_node_find(sys, TOPO_NIC, id);
    if (index < 0) {
      BRAID_TRY(topo_node_add(sys, TOPO_NIC, id, &index));
      BRAID_TRY(topo_link_add_both(sys, index, parent, TOPO_LINK_PCI, bw));
    }
    sys->nodes[index].line = xml->line;
    BRAID_TRY(topo_xml_add_nic(doc, sys, nic, index));
    return ncclSuccess;
  } else if (cls == NULL || strncmp(cls, "0x0604", 6) == 0) {
    int dup = topo_node_find(sys, TOPO_PCI, busid);
    BRAID_CHECK(dup < 0, ncclInvalidUsage,
                "%s:%d: <pci busid=\"%s\"> appears twice (also line %d): expected one "
                "<pci> per bus id",
                doc->source, xml->line, xml_attr_get(xml, "busid"), sys->nodes[dup].line);
    BRAID_TRY(topo_node_add(sys, TOPO_PCI, busid, &index));
    const char* vendor = xml_attr_get(xml, "vendor");
    const char* device = xml_attr_get(xml, "device");
    sys->nodes[index].u.pci.ids = ((vendor ? strtoull(vendor, NULL, 16) & 0xffff : 0) << 16) |
                                  (device ? strtoull(device, NULL, 16) & 0xffff : 0);
  } else {
    return ncclSuccess; /* another kind of device (NVMe, a GPU no rank uses...) */
  }
  sys->nodes[index].line = xml->line;
  if (!gpu) sys->nodes[index].u.pci.bw = bw; /* a GPU's union holds its own fields (gdr...) */
  BRAID_TRY(topo_link_add_both(sys, index, parent, TOPO_LINK_PCI, bw));
  if (!gpu) BRAID_TRY(topo_xml_add_children(doc, sys, xml, index));
fail:
  return res;
}

static ncclResult_t topo_xml_add_cpu(const struct xml_doc* doc, struct topo_system* sys,
                                     const struct xml_node* xml) {
  ncclResult_t res = ncclSuccess;
  long long numa;
  int index;
  BRAID_TRY(topo_xml_int(doc, xml, "numaid", 1, -1, 65535, 0, &numa));
  int dup = topo_node_find(sys, TOPO_CPU, numa);
  BRAID_CHECK(dup < 0, ncclInvalidUsage,
              "%s:%d: <cpu numaid=\"%lld\"> appears twice (also line %d): expected one <cpu> "
              "per numaid",
              doc->source, xml->line, numa, sys->nodes[dup].line);
  BRAID_TRY(topo_node_add(sys, TOPO_CPU, numa, &index));
  sys->nodes[index].line = xml->line;
  BRAID_TRY(topo_xml_cpu_kind(doc, xml, &sys->nodes[index]));
  BRAID_TRY(topo_xml_add_children(doc, sys, xml, index));
  for (int i = 0; i < xml->nchildren; i++) {
    if (strcmp(xml->children[i]->name, "nic") != 0) continue;
    int nic = topo_node_find(sys, TOPO_NIC, TOPO_CPU_NIC_ID(numa));
    if (nic < 0) {
      BRAID_TRY(topo_node_add(sys, TOPO_NIC, TOPO_CPU_NIC_ID(numa), &nic));
      sys->nodes[nic].line = xml->children[i]->line;
      BRAID_TRY(topo_link_add_both(sys, nic, index, TOPO_LINK_PCI, tune_table.loc_bw));
    }
    BRAID_TRY(topo_xml_add_nic(doc, sys, xml->children[i], nic));
  }
fail:
  return res;
}

/* The CPU element above `xml`, as a node index, or -1. */
static int topo_xml_cpu_of(const struct topo_system* sys, const struct xml_node* xml) {
  while (xml && strcmp(xml->name, "cpu") != 0) xml = xml->parent;
  if (xml == NULL) return -1;
  const char* numa = xml_attr_get(xml, "numaid");
  return numa ? topo_node_find(sys, TOPO_CPU, strtoll(numa, NULL, 0)) : -1;
}

/* One <nvlink> or <c2c> of the GPU node `gpu`. */
static ncclResult_t topo_xml_add_nvlink(const struct xml_doc* doc, struct topo_system* sys,
                                        const struct xml_node* xml, int gpu) {
  ncclResult_t res = ncclSuccess;
  long long count, c2c_bw;
  int remote = -1;
  float link_bw = tune_nvlink_bw(sys->nodes[gpu].u.gpu.sm);
  BRAID_TRY(topo_xml_int(doc, xml, "count", 1, 1, 1024, 0, &count));
  const char* tclass = xml_attr_get(xml, "tclass");
  if (strcmp(xml->name, "c2c") == 0) {
    BRAID_TRY(topo_xml_int(doc, xml, "bw", 1, 1, 100000000, 0, &c2c_bw));
    link_bw = (float)c2c_bw / 1000.0f; /* NCCL: MB/s per link */
    tclass = "0x068001";
  }
  if (tclass && strncmp(tclass, "0x03", 4) == 0) {
    int64_t target;
    BRAID_TRY(topo_xml_busid(doc, xml, "target", &target));
    remote = topo_node_find(sys, TOPO_GPU, target);
    if (remote < 0 || remote == gpu) return ncclSuccess; /* a GPU none of our ranks uses */
    return topo_link_add(sys, gpu, remote, TOPO_LINK_NVL, (float)count * link_bw);
  }
  if (tclass && strcmp(tclass, "0x068001") == 0) {
    remote = topo_xml_cpu_of(sys, xml);
    if (remote < 0) return ncclSuccess;
  } else {
    if (tclass == NULL) {
      /* No class: a GPU when the target is one of ours, else the switch fabric. */
      int64_t target;
      BRAID_TRY(topo_xml_busid(doc, xml, "target", &target));
      remote = topo_node_find(sys, TOPO_GPU, target);
      if (remote == gpu) return ncclSuccess;
      if (remote >= 0)
        return topo_link_add(sys, gpu, remote, TOPO_LINK_NVL, (float)count * link_bw);
    }
    remote = topo_node_find(sys, TOPO_NVS, TOPO_NVS_ID);
    if (remote < 0) BRAID_TRY(topo_node_add(sys, TOPO_NVS, TOPO_NVS_ID, &remote));
  }
  BRAID_TRY(topo_link_add_both(sys, gpu, remote, TOPO_LINK_NVL, (float)count * link_bw));
fail:
  return res;
}

/* Second pass: NVLinks, once every GPU exists. */
static ncclResult_t topo_xml_add_nvlinks(const struct xml_doc* doc, struct topo_system* sys,
                                         const struct xml_node* xml) {
  ncclResult_t res = ncclSuccess;
  if (strcmp(xml->name, "gpu") == 0) {
    const struct xml_node* pci = xml->parent;
    int64_t busid;
    BRAID_CHECK(pci && strcmp(pci->name, "pci") == 0, ncclInvalidUsage,
                "%s:%d: <gpu> inside <%s>: expected it inside a <pci busid=...> element",
                doc->source, xml->line, pci ? pci->name : "nothing");
    BRAID_TRY(topo_xml_busid(doc, pci, "busid", &busid));
    int gpu = topo_node_find(sys, TOPO_GPU, busid);
    if (gpu < 0) return ncclSuccess; /* outside any <cpu>: never added */
    for (int i = 0; i < xml->nchildren; i++) {
      const struct xml_node* c = xml->children[i];
      if (strcmp(c->name, "nvlink") == 0 || strcmp(c->name, "c2c") == 0)
        BRAID_TRY(topo_xml_add_nvlink(doc, sys, c, gpu));
    }
    return ncclSuccess;
  }
  for (int i = 0; i < xml->nchildren; i++)
    BRAID_TRY(topo_xml_add_nvlinks(doc, sys, xml->children[i]));
fail:
  return res;
}

/* Every pair of sockets is joined by the slower of their interconnects. */
static ncclResult_t topo_xml_connect_cpus(struct topo_system* sys) {
  ncclResult_t res = ncclSuccess;
  for (int a = 0; a < sys->nnodes; a++) {
    for (int b = a + 1; b < sys->nnodes; b++) {
      const struct topo_node* x = &sys->nodes[a];
      const struct topo_node* y = &sys->nodes[b];
      if (x->type != TOPO_CPU || y->type != TOPO_CPU) continue;
      float bw = BRAID_MIN(tune_cpu_bw(x->u.cpu.arch, x->u.cpu.vendor, x->u.cpu.model),
                           tune_cpu_bw(y->u.cpu.arch, y->u.cpu.vendor, y->u.cpu.model));
      BRAID_TRY(topo_link_add_both(sys, a, b, TOPO_LINK_SYS, bw));
    }
  }
fail:
  return res;
}

ncclResult_t topo_xml_to_system(const struct xml_doc* doc, struct topo_system** out) {
  ncclResult_t res = ncclSuccess;
  struct topo_system* sys = NULL;
  *out = NULL;
  BRAID_CHECK(doc->root && strcmp(doc->root->name, "system") == 0, ncclInvalidUsage,
              "%s:%d: the root element is <%s>: expected <system version=\"1\">", doc->source,
              doc->root ? doc->root->line : 1, doc->root ? doc->root->name : "");
  BRAID_TRY(topo_system_create(doc->source, &sys));
  for (int i = 0; i < doc->root->nchildren; i++)
    if (strcmp(doc->root->children[i]->name, "cpu") == 0)
      BRAID_TRY(topo_xml_add_cpu(doc, sys, doc->root->children[i]));
  BRAID_TRY(topo_xml_add_nvlinks(doc, sys, doc->root));
  BRAID_TRY(topo_xml_connect_cpus(sys));
  *out = sys;
  return ncclSuccess;
fail:
  topo_system_free(sys);
  return res;
}

/* The attribute that tells two elements of the same tag apart when merging. */
static const char* topo_xml_key(const char* tag) {
  if (strcmp(tag, "cpu") == 0) return "numaid";
  if (strcmp(tag, "pci") == 0) return "busid";
  if (strcmp(tag, "net") == 0) return "name";
  if (strcmp(tag, "nvlink") == 0) return "target";
  return NULL; /* gpu, nic, c2c: one per parent */
}

static ncclResult_t topo_xml_fuse_node(struct xml_doc* dst, struct xml_node* into,
                                       const struct xml_node* from) {
  ncclResult_t res = ncclSuccess;
  for (int i = 0; i < from->nattrs; i++)
    BRAID_TRY(xml_attr_init(into, from->attrs[i].key, from->attrs[i].value));
  for (int i = 0; i < from->nchildren; i++) {
    const struct xml_node* c = from->children[i];
    const char* key = topo_xml_key(c->name);
    const char* value = key ? xml_attr_get(c, key) : NULL;
    struct xml_node* match = (key && !value) ? NULL : xml_child_find(into, c->name, key, value);
    if (match)
      BRAID_TRY(topo_xml_fuse_node(dst, match, c));
    else
      BRAID_TRY(xml_node_copy(dst, into, c, NULL));
  }
fail:
  return res;
}

ncclResult_t topo_xml_fuse(struct xml_doc* dst, const struct xml_doc* src) {
  if (src->root == NULL) return ncclSuccess;
  if (dst->root == NULL) return xml_node_copy(dst, NULL, src->root, NULL);
  if (strcmp(dst->root->name, src->root->name) != 0)
    return braid_err(ncclInvalidUsage, "%s: root <%s> cannot be merged with <%s> of %s",
                     src->source, src->root->name, dst->root->name, dst->source);
  return topo_xml_fuse_node(dst, dst->root, src->root);
}
