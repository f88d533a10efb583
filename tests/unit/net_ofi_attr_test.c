/*
 * The OFI backend's GPU memory pieces alone (net_ofi_hmem.c), without a
 * provider: what fi_getinfo is asked for with and without FI_HMEM, the
 * fi_mr_attr of a device buffer, and what the GPU check says where there is
 * no GPU. Skipped where rdma/fabric.h was missing at build time.
 */
#include <stdio.h>
#include <string.h>

#include "test.h"

#ifndef BRAID_TEST_HAVE_LIBFABRIC_H

int main(void) {
  TEST_SKIP("rdma/fabric.h was missing at build time: the OFI backend is not built");
}

#else

#include <cuda_runtime.h>

#include "transport/net_ofi_hmem.h"

/* A hints structure as fi_dupinfo(NULL) gives one: zeroed, with its attribute structures. */
struct hints_mem {
  struct fi_info info;
  struct fi_ep_attr ep;
  struct fi_domain_attr domain;
};

static struct fi_info* hints_new(struct hints_mem* m) {
  memset(m, 0, sizeof *m);
  m->info.ep_attr = &m->ep;
  m->info.domain_attr = &m->domain;
  return &m->info;
}

static void test_hints(void) {
  const uint64_t caps = FI_TAGGED | FI_MSG | FI_DIRECTED_RECV;
  const uint64_t host_modes = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
  struct hints_mem m;
  struct fi_info* h = hints_new(&m);
  ofi_hmem_hints_fill(h, caps, 0);
  TEST_CHECK(h->caps == caps, "host: caps %#llx", (unsigned long long)h->caps);
  TEST_CHECK(h->domain_attr->mr_mode == (int)host_modes, "host: mr_mode %#x",
             h->domain_attr->mr_mode);
  TEST_CHECK(h->mode == FI_CONTEXT, "host: mode %#llx", (unsigned long long)h->mode);
  TEST_CHECK(h->ep_attr->type == FI_EP_RDM, "host: endpoint type %d", (int)h->ep_attr->type);
  TEST_CHECK(h->domain_attr->threading == FI_THREAD_SAFE, "host: threading %d",
             (int)h->domain_attr->threading);

  h = hints_new(&m);
  ofi_hmem_hints_fill(h, caps, 1);
  TEST_CHECK(h->caps == (caps | FI_HMEM), "hmem: caps %#llx", (unsigned long long)h->caps);
  TEST_CHECK(h->domain_attr->mr_mode == (int)(host_modes | FI_MR_HMEM), "hmem: mr_mode %#x",
             h->domain_attr->mr_mode);
  TEST_CHECK(h->mode == FI_CONTEXT && h->ep_attr->type == FI_EP_RDM &&
                 h->domain_attr->threading == FI_THREAD_SAFE,
             "hmem: the rest as for host memory");
}

static void test_mr_attr(void) {
  static char buf[256];
  struct fi_mr_attr attr;
  struct iovec iov = {0};
  memset(&attr, 0xa5, sizeof attr); /* every field must be set, not left as found */
  ofi_hmem_mr_attr_fill(&attr, &iov, buf + 64, 128, 3);
  TEST_CHECK(attr.mr_iov == &iov && attr.iov_count == 1, "one iovec, the caller's");
  TEST_CHECK(iov.iov_base == buf + 64 && iov.iov_len == 128, "iovec %p+%zu", iov.iov_base,
             iov.iov_len);
  TEST_CHECK(attr.access == (FI_SEND | FI_RECV), "access %#llx", (unsigned long long)attr.access);
  TEST_CHECK(attr.iface == FI_HMEM_CUDA, "iface %d", (int)attr.iface);
  TEST_CHECK(attr.device.cuda == 3, "device %d", attr.device.cuda);
  TEST_CHECK(attr.offset == 0 && attr.requested_key == 0 && attr.context == NULL &&
                 attr.auth_key_size == 0 && attr.auth_key == NULL,
             "the other fields zero");
}

/* Without a GPU the check fails and says so; with one it names the current device. */
static void test_gpu_find(void) {
  struct ofi_hmem_gpu gpu;
  char why[256] = "";
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  (void)cudaGetLastError();
  int ok = ofi_hmem_gpu_find(&gpu, why, sizeof why);
  if (count == 0) {
    TEST_CHECK(!ok, "a GPU found where CUDA sees none");
    TEST_CHECK(strstr(why, "no CUDA device") != NULL, "why: %s", why);
    TEST_CHECK(ofi_hmem_ptr_dev(why) == -1, "host memory taken for device memory");
    printf("without a GPU: %s\n", why);
  } else if (ok) {
    int dev = -1;
    cudaGetDevice(&dev);
    TEST_CHECK(gpu.dev == dev, "GPU %d, current device %d", gpu.dev, dev);
  } else {
    TEST_CHECK(strstr(why, "flush") != NULL, "a GPU refused for no stated reason: %s", why);
  }
}

int main(void) {
  test_hints();
  test_mr_attr();
  test_gpu_find();
  return test_summary();
}

#endif
