/*
 * The OFI backend's GPU memory (FI_HMEM) pieces that need no provider: what
 * fi_getinfo is asked for, the fi_mr_attr of a device buffer, whether this
 * process's GPU can take a provider's writes, and the flush after them.
 * net_ofi_fabric.c and net_ofi.c drive them; tests/unit/net_ofi_attr_test.c checks
 * them alone.
 * Built only where rdma/fabric.h was found (BRAID_HAVE_LIBFABRIC).
 */
#ifndef BRAID_TRANSPORT_NET_OFI_HMEM_H
#define BRAID_TRANSPORT_NET_OFI_HMEM_H

#include <stddef.h>
#include <stdint.h>

#include <sys/uio.h>

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>

#include "nccl.h"

/* The memory registration modes the backend can honour on host memory. */
#define OFI_MR_MODE_HOST (FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY)

/*
 * Fills `hints` (from fi_dupinfo(NULL)) for tagged reliable datagrams with
 * capabilities `caps`, completions that carry an fi_context, thread-safe
 * domains, and the host registration modes. `hmem` nonzero: FI_HMEM is
 * added to the capabilities, and FI_MR_HMEM to the modes the backend can
 * honour (it then registers every device buffer and passes its descriptor).
 */
void ofi_hmem_hints_fill(struct fi_info* hints, uint64_t caps, int hmem);

/*
 * The registration of `size` bytes of CUDA device memory at `data`, on GPU
 * `cuda_dev`, for sends and receives: one iovec (`iov`, the caller's, which
 * must outlive the fi_mr_regattr call), iface FI_HMEM_CUDA, the device id.
 */
void ofi_hmem_mr_attr_fill(struct fi_mr_attr* attr, struct iovec* iov, void* data, size_t size,
                           int cuda_dev);

/* This process's GPU, as the device-memory check at init sees it. */
struct ofi_hmem_gpu {
  int dev;         /* the current CUDA device */
  int needs_flush; /* writes from the NIC need a flush before a kernel reads them */
};

/*
 * The current CUDA device and whether received data needs a flush there (as
 * NCCL decides: GPUs before compute capability 9.0), or 0 with the reason in
 * `why`: no GPU, or one that needs a flush its driver cannot do
 * (cudaDeviceFlushGPUDirectRDMAWrites).
 */
int ofi_hmem_gpu_find(struct ofi_hmem_gpu* gpu, char* why, size_t why_size);

/*
 * Whether `domain` (named `name`) registers CUDA memory of `gpu`: one buffer
 * of OFI_HMEM_CHECK_BYTES, registered with fi_mr_regattr and released, once
 * at init. Else 0 with the reason in `why` (`fi_strerror`: libfabric's).
 */
#define OFI_HMEM_CHECK_BYTES 4096
int ofi_hmem_register_check(struct fid_domain* domain, const char* name,
                            const struct ofi_hmem_gpu* gpu, const char* (*fi_strerror_fn)(int),
                            char* why, size_t why_size);

/* The GPU that owns device pointer `data`, or -1 when it is not CUDA device memory. */
int ofi_hmem_ptr_dev(const void* data);

/* Makes the NIC's writes into GPU `cuda_dev`'s memory visible to its kernels; blocks until they
 * are. */
ncclResult_t ofi_hmem_flush(int cuda_dev);

#endif
