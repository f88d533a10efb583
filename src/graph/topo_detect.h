/*
 * Helpers of topology detection, shared by topo_detect.c (GPUs), topo_sysfs.c
 * (PCI tree, CPUs), topo_nic.c (network adapters) and topo_nvml.c (NVLink).
 * Each adds NCCL topology XML elements to a document; none of them fails
 * because a piece of information is missing (a VM hides sysfs, a container
 * has no NVML): they leave it out and say so at INFO.
 */
#ifndef BRAID_GRAPH_TOPO_DETECT_H
#define BRAID_GRAPH_TOPO_DETECT_H

#include <stddef.h>

#include "graph/xml.h"
#include "nccl.h"

/* First line of `dir`/`file`, "" when unreadable. */
void topo_sysfs_read(const char* dir, const char* file, char* out, size_t size);
/* <cpu numaid=`numa`> (created with its arch/vendor/affinity when new); creates <system> too. */
ncclResult_t topo_sysfs_cpu_element(struct xml_doc* doc, int numa, struct xml_node** out);
/* <pci busid=`busid`> of a device, with its CPU and the PCIe switches above it. */
ncclResult_t topo_sysfs_pci_element(struct xml_doc* doc, const char* busid, struct xml_node** out);

/* Adds every usable network port (<nic><net>), once per document. */
ncclResult_t topo_nic_detect(struct xml_doc* doc);

/* One NVLink neighbour of a GPU, as the <nvlink> element describes it. */
struct topo_nvlink {
  char target[32];    /* bus id of the remote end ("fffffff:ff:ff.0" for NVSwitch) */
  const char* tclass; /* "0x030200" GPU, "0x068000" NVSwitch, "0x068001" CPU */
  int count;          /* active links to it */
};
#define TOPO_NVLINK_MAX 18 /* NVML_NVLINK_MAX_LINKS */

/*
 * The active NVLinks of the GPU at `busid`, grouped by remote end. *have_nvml
 * is 0 when libnvidia-ml.so.1 is missing or unusable (then *n = 0).
 */
ncclResult_t topo_nvml_links(const char* busid, struct topo_nvlink* links, int* n, int* have_nvml);

#endif
