/*
 * Detection of this process's GPUs, written as NCCL topology XML so that a
 * detected node and a node read from BRAID_TOPO_FILE go through the same
 * rules (topo_xml.c). For one GPU we record: its PCI chain and CPU (sysfs),
 * SM version, memory and GPUDirect RDMA support (CUDA), its NVLinks (NVML;
 * without NVML, CUDA peer access: see topo_detect_peer_links), and the
 * node's network ports.
 */
#include <ctype.h>
#include <cuda_runtime.h>
#include <string.h>

#include "base/debug.h"
#include "base/error.h"
#include "graph/topo.h"
#include "graph/topo_detect.h"

/* Links an NVLink GPU of this SM version usually has, for when NVML cannot count them. */
static int topo_detect_typical_nvlinks(int sm) {
  return sm >= 90 ? 18 : sm >= 80 ? 12 : sm >= 70 ? 6 : 4;
}

/*
 * Without NVML we still learn which visible GPUs are NVLink peers: CUDA
 * reports native peer atomics over NVLink and not over PCIe. The link count
 * is then a guess (the usual one for the architecture), said at INFO.
 */
static ncclResult_t topo_detect_peer_links(struct xml_doc* doc, struct xml_node* gpu, int cuda_dev,
                                           int sm) {
  ncclResult_t res = ncclSuccess;
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess) {
    cudaGetLastError();
    return ncclSuccess;
  }
  for (int d = 0; d < ndev; d++) {
    int can = 0, atomics = 0;
    char busid[32];
    struct xml_node* link = NULL;
    if (d == cuda_dev) continue;
    if (cudaDeviceCanAccessPeer(&can, cuda_dev, d) != cudaSuccess || !can) continue;
    if (cudaDeviceGetP2PAttribute(&atomics, cudaDevP2PAttrNativeAtomicSupported, cuda_dev, d) !=
            cudaSuccess ||
        !atomics)
      continue;
    if (cudaDeviceGetPCIBusId(busid, sizeof busid, d) != cudaSuccess) continue;
    for (char* c = busid; *c; c++) *c = (char)tolower((unsigned char)*c);
    BRAID_TRY(xml_node_add(doc, gpu, "nvlink", &link));
    BRAID_TRY(xml_attr_set(link, "target", busid));
    BRAID_TRY(xml_attr_set_int(link, "count", topo_detect_typical_nvlinks(sm)));
    BRAID_TRY(xml_attr_set(link, "tclass", "0x030200"));
    INFO(BRAID_LOG_GRAPH, "no NVML: GPU %d reaches GPU %d (%s) over NVLink, assuming %d links",
         cuda_dev, d, busid, topo_detect_typical_nvlinks(sm));
  }
  cudaGetLastError(); /* peer queries on GPUs we cannot use must not leak into later calls */
fail:
  return res;
}

static ncclResult_t topo_detect_nvlinks(struct xml_doc* doc, struct xml_node* gpu,
                                        const char* busid, int cuda_dev, int sm) {
  ncclResult_t res = ncclSuccess;
  struct topo_nvlink links[TOPO_NVLINK_MAX];
  int n = 0, have_nvml = 0;
  BRAID_TRY(topo_nvml_links(busid, links, &n, &have_nvml));
  if (!have_nvml) return topo_detect_peer_links(doc, gpu, cuda_dev, sm);
  for (int i = 0; i < n; i++) {
    struct xml_node* link = NULL;
    BRAID_TRY(xml_node_add(doc, gpu, "nvlink", &link));
    BRAID_TRY(xml_attr_set(link, "target", links[i].target));
    BRAID_TRY(xml_attr_set_int(link, "count", links[i].count));
    BRAID_TRY(xml_attr_set(link, "tclass", links[i].tclass));
  }
fail:
  return res;
}

ncclResult_t topo_detect_gpu(struct xml_doc* doc, const char* busid, int cuda_dev, int rank) {
  ncclResult_t res = ncclSuccess;
  struct cudaDeviceProp prop;
  struct xml_node *pci = NULL, *gpu = NULL;
  char lower[32];
  int gdr = 0;
  snprintf(lower, sizeof lower, "%s", busid);
  for (char* c = lower; *c; c++) *c = (char)tolower((unsigned char)*c);
  BRAID_CUDA_TRY(cudaGetDeviceProperties(&prop, cuda_dev));
  if (cudaDeviceGetAttribute(&gdr, cudaDevAttrGPUDirectRDMASupported, cuda_dev) != cudaSuccess) {
    cudaGetLastError();
    gdr = 0;
  }
  int sm = prop.major * 10 + prop.minor;
  int64_t id;
  /* Given by the topology file (or by another rank of this process): it is authoritative. */
  if (doc->root && topo_busid_parse(lower, &id) == 0 && topo_xml_find_gpu(doc->root, id))
    return ncclSuccess;
  BRAID_TRY(topo_sysfs_pci_element(doc, lower, &pci));
  BRAID_TRY(xml_attr_init(pci, "class", "0x030200"));
  BRAID_TRY(xml_node_add(doc, pci, "gpu", &gpu));
  BRAID_TRY(xml_attr_set_int(gpu, "dev", cuda_dev));
  BRAID_TRY(xml_attr_set_int(gpu, "sm", sm));
  if (rank >= 0) BRAID_TRY(xml_attr_set_int(gpu, "rank", rank));
  BRAID_TRY(xml_attr_set_int(gpu, "gdr", gdr ? 1 : 0));
  BRAID_TRY(xml_attr_set_int(gpu, "mem", (long long)(prop.totalGlobalMem >> 20)));
  BRAID_TRY(topo_detect_nvlinks(doc, gpu, lower, cuda_dev, sm));
  INFO(BRAID_LOG_GRAPH, "GPU %d %s at %s: SM %d, %zu MiB", cuda_dev, prop.name, lower, sm,
       (size_t)(prop.totalGlobalMem >> 20));
fail:
  return res;
}

ncclResult_t topo_detect_all(struct xml_doc** out, int* ngpus) {
  ncclResult_t res = ncclSuccess;
  struct xml_doc* doc = NULL;
  int n = 0;
  *out = NULL;
  *ngpus = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess || n == 0) {
    cudaGetLastError();
    return braid_err(ncclSystemError,
                     "no CUDA device is visible (%s); to study a machine, give its topology "
                     "with --topo-file FILE (NCCL topology XML)",
                     err != cudaSuccess ? cudaGetErrorString(err) : "device count is 0");
  }
  BRAID_TRY(xml_doc_create("detected", &doc));
  for (int d = 0; d < n; d++) {
    char busid[32];
    BRAID_CUDA_TRY(cudaDeviceGetPCIBusId(busid, sizeof busid, d));
    BRAID_TRY(topo_detect_gpu(doc, busid, d, d));
  }
  BRAID_TRY(topo_nic_detect(doc));
  *out = doc;
  *ngpus = n;
  return ncclSuccess;
fail:
  xml_doc_free(doc);
  return res;
}
