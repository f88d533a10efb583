/*
 * The OFI backend's GPU memory (FI_HMEM) pieces that need no provider (see
 * net_ofi_hmem.h): the hints, a device buffer's registration attributes, and
 * the CUDA side of taking a provider's writes into GPU memory.
 */
#ifdef BRAID_HAVE_LIBFABRIC

#include "transport/net_ofi_hmem.h"

#include <stdio.h>
#include <string.h>

#include <cuda_runtime.h>

#include "base/error.h"

void ofi_hmem_hints_fill(struct fi_info* hints, uint64_t caps, int hmem) {
  hints->caps = caps | (hmem ? FI_HMEM : 0);
  hints->mode = FI_CONTEXT;
  hints->ep_attr->type = FI_EP_RDM;
  hints->domain_attr->threading = FI_THREAD_SAFE;
  hints->domain_attr->mr_mode = OFI_MR_MODE_HOST | (hmem ? FI_MR_HMEM : 0);
}

void ofi_hmem_mr_attr_fill(struct fi_mr_attr* attr, struct iovec* iov, void* data, size_t size,
                           int cuda_dev) {
  iov->iov_base = data;
  iov->iov_len = size;
  memset(attr, 0, sizeof *attr);
  attr->mr_iov = iov;
  attr->iov_count = 1;
  attr->access = FI_SEND | FI_RECV;
  attr->iface = FI_HMEM_CUDA;
  attr->device.cuda = cuda_dev;
}

int ofi_hmem_gpu_find(struct ofi_hmem_gpu* gpu, char* why, size_t why_size) {
  int dev = -1, major = 0, flush_options = 0;
  memset(gpu, 0, sizeof *gpu);
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
    snprintf(why, why_size, "no CUDA device to register memory of (%s)",
             cudaGetErrorString(cudaGetLastError()));
    return 0;
  }
  gpu->dev = dev;
  gpu->needs_flush = major < 9;
  if (!gpu->needs_flush) return 1;
  if (cudaDeviceGetAttribute(&flush_options, cudaDevAttrGPUDirectRDMAFlushWritesOptions, dev) !=
      cudaSuccess)
    flush_options = 0;
  (void)cudaGetLastError();
  if (flush_options & cudaFlushGPUDirectRDMAWritesOptionHost) return 1;
  snprintf(why, why_size,
           "GPU %d (compute capability %d.x) needs received data flushed and its driver cannot "
           "(no cudaDeviceFlushGPUDirectRDMAWrites)",
           dev, major);
  return 0;
}

int ofi_hmem_register_check(struct fid_domain* domain, const char* name,
                            const struct ofi_hmem_gpu* gpu, const char* (*fi_strerror_fn)(int),
                            char* why, size_t why_size) {
  struct fi_mr_attr attr;
  struct iovec iov;
  struct fid_mr* mr = NULL;
  void* buf = NULL;
  int rc;
  if (cudaMalloc(&buf, OFI_HMEM_CHECK_BYTES) != cudaSuccess) { /* on gpu->dev, the current device */
    snprintf(why, why_size, "GPU %d gave no memory to register (%s)", gpu->dev,
             cudaGetErrorString(cudaGetLastError()));
    return 0;
  }
  ofi_hmem_mr_attr_fill(&attr, &iov, buf, OFI_HMEM_CHECK_BYTES, gpu->dev);
  rc = fi_mr_regattr(domain, &attr, 0, &mr);
  if (rc == 0)
    fi_close(&mr->fid);
  else
    snprintf(why, why_size,
             "registering GPU %d memory with fi_mr_regattr (FI_HMEM_CUDA) on %s failed: %s",
             gpu->dev, name, fi_strerror_fn(-rc));
  cudaFree(buf);
  return rc == 0;
}

int ofi_hmem_ptr_dev(const void* data) {
  struct cudaPointerAttributes attr;
  if (cudaPointerGetAttributes(&attr, data) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return attr.type == cudaMemoryTypeDevice ? attr.device : -1;
}

/*
 * cudaDeviceFlushGPUDirectRDMAWrites acts on the calling thread's current
 * device: the proxy thread's is switched to `cuda_dev` for it and back.
 */
ncclResult_t ofi_hmem_flush(int cuda_dev) {
  ncclResult_t res = ncclSuccess;
  int was = -1;
  BRAID_CUDA_TRY(cudaGetDevice(&was));
  if (was != cuda_dev) BRAID_CUDA_TRY(cudaSetDevice(cuda_dev));
  cudaError_t err = cudaDeviceFlushGPUDirectRDMAWrites(
      cudaFlushGPUDirectRDMAWritesTargetCurrentDevice, cudaFlushGPUDirectRDMAWritesToOwner);
  if (was != cuda_dev) cudaSetDevice(was);
  if (err != cudaSuccess)
    return braid_err(ncclUnhandledCudaError, "net OFI: flushing received data on GPU %d failed: %s",
                     cuda_dev, cudaGetErrorString(err));
  return ncclSuccess;
fail:
  return res;
}

#endif /* BRAID_HAVE_LIBFABRIC */
