/*
 * Device memory shared between the processes of one host (see ipc.h): cuMem
 * allocations exported as file descriptors and handed over a Unix socket (by
 * the descriptor service, ipc_fd.c) or taken with pidfd_getfd, cuMem fabric
 * handles, legacy CUDA IPC handles, or plain pointers inside one process.
 */
#include "transport/ipc.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <cuda.h>

#include "base/debug.h"
#include "base/error.h"
#include "base/param.h"
#include "base/utils.h"
#include "transport/transport.h"

const char* ipc_kind_name(ipc_kind_t kind) {
  switch (kind) {
    case IPC_LOCAL: return "same process";
    case IPC_CUMEM: return "cuMem handles";
    case IPC_FABRIC: return "cuMem fabric handles";
    case IPC_LEGACY: return "CUDA IPC";
    default: return "none";
  }
}

/* ---- The driver's virtual memory functions (Braid does not link libcuda). ---- */

static struct {
  CUresult (*create)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*,
                     unsigned long long);
  CUresult (*release)(CUmemGenericAllocationHandle);
  CUresult (*reserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long);
  CUresult (*addr_free)(CUdeviceptr, size_t);
  CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
  CUresult (*unmap)(CUdeviceptr, size_t);
  CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t);
  CUresult (*granularity)(size_t*, const CUmemAllocationProp*, CUmemAllocationGranularity_flags);
  CUresult (*export_)(void*, CUmemGenericAllocationHandle, CUmemAllocationHandleType,
                      unsigned long long);
  CUresult (*import)(CUmemGenericAllocationHandle*, void*, CUmemAllocationHandleType);
  CUresult (*dev_get)(CUdevice*, int);
  CUresult (*dev_attr)(int*, CUdevice_attribute, CUdevice);
  CUresult (*err_str)(CUresult, const char**);
  CUresult (*retain)(CUmemGenericAllocationHandle*, void*);
  CUresult (*range)(CUdeviceptr*, size_t*, CUdeviceptr);
  CUresult (*dev_count)(int*);
  CUresult (*can_access)(int*, CUdevice, CUdevice);
  CUresult (*props)(CUmemAllocationProp*, CUmemGenericAllocationHandle);
  int ok;
} drv;

static pthread_once_t drv_once = PTHREAD_ONCE_INIT;

static void drv_load(void) {
  drv.create = braid_driver_fn("cuMemCreate");
  drv.release = braid_driver_fn("cuMemRelease");
  drv.reserve = braid_driver_fn("cuMemAddressReserve");
  drv.addr_free = braid_driver_fn("cuMemAddressFree");
  drv.map = braid_driver_fn("cuMemMap");
  drv.unmap = braid_driver_fn("cuMemUnmap");
  drv.set_access = braid_driver_fn("cuMemSetAccess");
  drv.granularity = braid_driver_fn("cuMemGetAllocationGranularity");
  drv.export_ = braid_driver_fn("cuMemExportToShareableHandle");
  drv.import = braid_driver_fn("cuMemImportFromShareableHandle");
  drv.dev_get = braid_driver_fn("cuDeviceGet");
  drv.dev_attr = braid_driver_fn("cuDeviceGetAttribute");
  drv.err_str = braid_driver_fn("cuGetErrorString");
  drv.retain = braid_driver_fn("cuMemRetainAllocationHandle");
  drv.range = braid_driver_fn("cuMemGetAddressRange");
  drv.dev_count = braid_driver_fn("cuDeviceGetCount");
  drv.can_access = braid_driver_fn("cuDeviceCanAccessPeer");
  drv.props = braid_driver_fn("cuMemGetAllocationPropertiesFromHandle");
  drv.ok = drv.create && drv.release && drv.reserve && drv.addr_free && drv.map && drv.unmap &&
           drv.set_access && drv.granularity && drv.export_ && drv.import && drv.dev_get &&
           drv.dev_attr;
}

static const char* drv_err(CUresult r) {
  const char* s = NULL;
  if (drv.err_str == NULL || drv.err_str(r, &s) != CUDA_SUCCESS || s == NULL) return "unknown";
  return s;
}

#define DRV_TRY(call, what)                                                                 \
  do {                                                                                      \
    CUresult r_ = (call);                                                                   \
    if (r_ != CUDA_SUCCESS) {                                                               \
      res = braid_err(ncclUnhandledCudaError, "%s failed: %s (CUresult %d)", (what),        \
                      drv_err(r_), (int)r_);                                                \
      goto fail;                                                                            \
    }                                                                                       \
  } while (0)

/* Whether `cuda_dev` can make and share cuMem allocations; `why` says what is missing. */
static int cumem_usable(int cuda_dev, char* why, size_t why_size) {
  pthread_once(&drv_once, drv_load);
  if (!drv.ok) {
    snprintf(why, why_size, "the CUDA driver lacks the cuMem functions");
    return 0;
  }
  CUdevice dev;
  int vmm = 0, fd = 0;
  if (drv.dev_get(&dev, cuda_dev) != CUDA_SUCCESS ||
      drv.dev_attr(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev) !=
          CUDA_SUCCESS ||
      drv.dev_attr(&fd, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, dev) !=
          CUDA_SUCCESS) {
    snprintf(why, why_size, "the CUDA driver did not answer for device %d", cuda_dev);
    return 0;
  }
  if (!vmm || !fd) {
    snprintf(why, why_size, "GPU %d has no %s", cuda_dev,
             !vmm ? "virtual memory management" : "file-descriptor handles for its memory");
    return 0;
  }
  return 1;
}

/* A pinned allocation on device `dev` whose handle can be exported as `type`. */
static void cumem_prop(CUmemAllocationProp* prop, int dev, CUmemAllocationHandleType type) {
  memset(prop, 0, sizeof *prop);
  prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop->location.id = dev;
  prop->requestedHandleTypes = type;
}

/*
 * Whether `cuda_dev` makes cuMem allocations with fabric handles: the GPU says it can, and one
 * granule made and exported that way works (it needs an IMEX channel the user may open). Asked
 * once per device and remembered.
 */
#define IPC_FABRIC_DEVS 64
static pthread_mutex_t fabric_lock = PTHREAD_MUTEX_INITIALIZER;
static signed char fabric_known[IPC_FABRIC_DEVS]; /* 0: not asked, 1: yes, -1: no */
static char fabric_why[IPC_FABRIC_DEVS][120];

static int fabric_probe(int cuda_dev, char* why, size_t why_size) {
  CUdevice dev;
  int attr = 0;
  CUresult r;
  if (drv.dev_get(&dev, cuda_dev) != CUDA_SUCCESS ||
      drv.dev_attr(&attr, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, dev) != CUDA_SUCCESS ||
      !attr) {
    snprintf(why, why_size, "GPU %d does not offer them", cuda_dev);
    return 0;
  }
  CUmemAllocationProp prop;
  cumem_prop(&prop, dev, CU_MEM_HANDLE_TYPE_FABRIC);
  size_t gran = 0;
  CUmemGenericAllocationHandle h;
  CUmemFabricHandle fh;
  if ((r = drv.granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM)) != CUDA_SUCCESS ||
      (r = drv.create(&h, gran ? gran : 2 << 20, &prop, 0)) != CUDA_SUCCESS) {
    snprintf(why, why_size, "cuMemCreate with a fabric handle failed: %s (no IMEX channel?)",
             drv_err(r));
    return 0;
  }
  r = drv.export_(&fh, h, CU_MEM_HANDLE_TYPE_FABRIC, 0);
  (void)drv.release(h);
  if (r != CUDA_SUCCESS) {
    snprintf(why, why_size, "exporting a fabric handle failed: %s", drv_err(r));
    return 0;
  }
  return 1;
}

static int fabric_usable(int cuda_dev, char* why, size_t why_size) {
  if (cuda_dev < 0 || cuda_dev >= IPC_FABRIC_DEVS) {
    snprintf(why, why_size, "device %d is beyond the %d asked about", cuda_dev, IPC_FABRIC_DEVS);
    return 0;
  }
  pthread_mutex_lock(&fabric_lock);
  if (fabric_known[cuda_dev] == 0) {
    char w[120] = "";
    fabric_known[cuda_dev] = fabric_probe(cuda_dev, w, sizeof w) ? 1 : -1;
    snprintf(fabric_why[cuda_dev], sizeof fabric_why[cuda_dev], "%s", w);
  }
  const int ok = fabric_known[cuda_dev] > 0;
  if (!ok) snprintf(why, why_size, "%s", fabric_why[cuda_dev]);
  pthread_mutex_unlock(&fabric_lock);
  return ok;
}

int ipc_sees_gpu(const struct braid_peer_info* p, int64_t bus) {
  for (int i = 0; i < p->nvisible && i < BRAID_MAX_VISIBLE_GPUS; i++)
    if (p->visible_bus[i] == bus) return 1;
  return 0;
}

void ipc_acquire(int cuda_dev, struct braid_peer_info* me) {
  char why[512] = "";
  struct stat st;
  me->uid = (uint32_t)getuid();
  me->net_ns = stat("/proc/self/ns/net", &st) == 0 ? (uint64_t)st.st_ino : 0;
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess) {
    (void)cudaGetLastError();
    ndev = 0;
  }
  me->nvisible = 0;
  for (int d = 0; d < ndev && me->nvisible < BRAID_MAX_VISIBLE_GPUS; d++) {
    char busid[32];
    if (cudaDeviceGetPCIBusId(busid, sizeof busid, d) != cudaSuccess) {
      (void)cudaGetLastError();
      continue;
    }
    me->visible_bus[me->nvisible++] = braid_busid_to_int(busid);
  }
  int want = braid_param_int(BRAID_P_CUMEM_ENABLE) != 0;
  int usable = want && cumem_usable(cuda_dev, why, sizeof why);
  char off[160] = "", pwhy[160] = "", fwhy[160] = "";
  me->ipc_service = ipc_service_hold(off, sizeof off);
  if (usable && me->ipc_service == 0) {
    snprintf(why, sizeof why, "its descriptor service is off: %s", off);
    usable = 0;
  }
  const int mode = ipc_fd_passing();
  me->ipc_pidfd = usable && ipc_pidfd_usable(pwhy, sizeof pwhy);
  char swhy[200] = "";
  if (usable && mode != IPC_PASS_PIDFD && !ipc_fd_socket_works(swhy, sizeof swhy)) {
    /* Peers then take the descriptors with pidfd_getfd, or go another way (ipc_choose). */
    static int warned;
    if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
      WARN("rank %d: memory descriptors do not pass over a Unix socket in this process (%s); a "
           "seccomp profile or security module may forbid it. Peers %s",
           me->rank, swhy,
           me->ipc_pidfd ? "take them with pidfd_getfd instead"
                         : "use fabric handles, legacy CUDA IPC (every GPU visible) or host memory "
                           "(several times slower over NVLink) instead");
    me->ipc_service = 0;
    if (!me->ipc_pidfd) {
      snprintf(why, sizeof why, "descriptors pass neither over a Unix socket (%s) nor by "
               "pidfd_getfd (%s)", swhy, pwhy);
      usable = 0;
    }
  }
  if (usable && mode == IPC_PASS_PIDFD) {
    me->ipc_service = 0; /* pidfd_getfd only: no peer asks the service */
    if (!me->ipc_pidfd) {
      snprintf(why, sizeof why, "BRAID_IPC_FD_PASSING=pidfd, but %s", pwhy);
      usable = 0;
    }
  }
  me->ipc_cumem = usable;
  const int64_t fabric = braid_param_int(BRAID_P_IPC_FABRIC);
  me->ipc_fabric = 0;
  if (want && fabric >= 0 && drv.ok && fabric_usable(cuda_dev, fwhy, sizeof fwhy))
    me->ipc_fabric = fabric == 1 ? 2 : 1;
  if (!want)
    INFO(BRAID_LOG_INIT | BRAID_LOG_ENV, "cuMem memory sharing off (NCCL_CUMEM_ENABLE=0)");
  else if (!usable)
    INFO(BRAID_LOG_INIT, "cuMem memory sharing unavailable on GPU %d: %s", cuda_dev, why);
  else
    INFO(BRAID_LOG_INIT, "cuMem memory sharing on GPU %d: descriptors %s%s%s%s; %s%s", cuda_dev,
         me->ipc_service ? "from the descriptor service" : "by pidfd_getfd only",
         me->ipc_service && me->ipc_pidfd ? ", or by pidfd_getfd across network namespaces" : "",
         me->ipc_service && !me->ipc_pidfd ? ", not by pidfd_getfd: " : "",
         me->ipc_service && !me->ipc_pidfd ? pwhy : "",
         me->ipc_fabric ? "fabric handles work" : "no fabric handles: ",
         me->ipc_fabric ? (me->ipc_fabric == 2 ? ", used for every pair (BRAID_IPC_FABRIC=1)" : "")
                        : (fabric < 0 ? "BRAID_IPC_FABRIC=-1" : fwhy));
}

static ipc_kind_t choose(const struct braid_peer_info* me, const struct braid_peer_info* owner,
                         int allow_fabric, char* why, size_t why_size) {
  if (me->pid_hash == owner->pid_hash) return IPC_LOCAL;
  const int fabric = allow_fabric && me->ipc_fabric && owner->ipc_fabric;
  if (fabric && me->ipc_fabric == 2 && owner->ipc_fabric == 2) return IPC_FABRIC;
  const int cumem = me->ipc_cumem && owner->ipc_cumem && me->uid == owner->uid;
  /* The descriptor service's socket where both share a network namespace; else pidfd_getfd,
   * where pids compare. */
  if (cumem && me->ipc_service && owner->ipc_service && me->net_ns == owner->net_ns)
    return IPC_CUMEM;
  /* pidfd_getfd needs pids that compare (a known, shared pid namespace) and start times that
   * tell a reused pid. */
  if (cumem && me->ipc_pidfd && owner->ipc_pidfd && me->pid_ns != 0 &&
      me->pid_ns == owner->pid_ns && me->start_time != 0 && owner->start_time != 0)
    return IPC_CUMEM;
  if (fabric) return IPC_FABRIC;
  if (ipc_sees_gpu(me, owner->dev_bus_id) && ipc_sees_gpu(owner, me->dev_bus_id)) return IPC_LEGACY;
  /* Why cuMem sharing is out, for the message. */
  if (!me->ipc_cumem || !owner->ipc_cumem)
    snprintf(why, why_size,
             "rank %d cannot share device memory through cuMem handles (NCCL_CUMEM_ENABLE=0, or "
             "the driver or GPU does not allow it: its INFO log says which)",
             !me->ipc_cumem ? me->rank : owner->rank);
  else if (me->uid != owner->uid)
    snprintf(why, why_size, "ranks %d and %d run as different users (uid %u and %u)", me->rank,
             owner->rank, me->uid, owner->uid);
  else if (me->net_ns == owner->net_ns)
    snprintf(why, why_size,
             "rank %d cannot pass memory descriptors over a Unix socket (its WARN says why, or "
             "BRAID_IPC_FD_PASSING=pidfd) and pidfd_getfd is not allowed on both",
             !me->ipc_service ? me->rank : owner->rank);
  else
    snprintf(why, why_size,
             "ranks %d and %d are in different network namespaces, so their Unix sockets cannot "
             "meet to pass memory handles, and %s",
             me->rank, owner->rank,
             me->pid_ns != owner->pid_ns ? "in different pid namespaces, where pidfd_getfd cannot "
                                           "name the other"
                                         : "pidfd_getfd is not allowed (the INFO log of the rank "
                                           "says why)");
  size_t used = strlen(why);
  if (used < why_size)
    snprintf(why + used, why_size - used, "; %s, and legacy CUDA IPC needs both GPUs visible in "
             "both processes (CUDA_VISIBLE_DEVICES)",
             allow_fabric ? "no cuMem fabric handles on both (an IMEX channel)"
                          : "application memory has no fabric handle");
  return IPC_NONE;
}

ipc_kind_t ipc_choose(const struct braid_peer_info* me, const struct braid_peer_info* owner,
                      char* why, size_t why_size) {
  return choose(me, owner, 1, why, why_size);
}

ipc_kind_t ipc_choose_fd(const struct braid_peer_info* me, const struct braid_peer_info* owner,
                         char* why, size_t why_size) {
  return choose(me, owner, 0, why, why_size);
}

/* ---- Allocation and export. ---- */

/* A cuMem allocation: its address range and granularity. */
struct cumem_block {
  CUdeviceptr va;
  size_t size;
  size_t gran;
};

/*
 * Allocates at least `bytes` on the current device with cuMem, mapped there readable and
 * writable, with a file-descriptor handle (IPC_FABRIC: a fabric handle); `exported` non-NULL:
 * exported too, into an int (a descriptor, close-on-exec, the caller's) or a CUmemFabricHandle.
 * On failure nothing is left.
 */
static ncclResult_t cumem_create(size_t bytes, ipc_kind_t kind, void* exported,
                                 struct cumem_block* b) {
  ncclResult_t res = ncclSuccess;
  int dev = -1;
  CUmemGenericAllocationHandle h = 0;
  int have_handle = 0, reserved = 0, mapped = 0;
  CUmemAllocationProp prop;
  CUmemAccessDesc access;
  const int fabric = kind == IPC_FABRIC;
  int* fd = fabric ? NULL : exported;
  memset(b, 0, sizeof *b);
  if (fd) *fd = -1;
  BRAID_CUDA_TRY(cudaGetDevice(&dev));
  pthread_once(&drv_once, drv_load);
  BRAID_CHECK(drv.ok, ncclSystemError, "the CUDA driver lacks the cuMem functions");
  cumem_prop(&prop, dev,
             fabric ? CU_MEM_HANDLE_TYPE_FABRIC : CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  DRV_TRY(drv.granularity(&b->gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
          "cuMemGetAllocationGranularity");
  if (b->gran == 0) b->gran = 2 << 20;
  b->size = BRAID_ALIGN_UP(bytes, b->gran);
  DRV_TRY(drv.create(&h, b->size, &prop, 0), "cuMemCreate");
  have_handle = 1;
  DRV_TRY(drv.reserve(&b->va, b->size, b->gran, 0, 0), "cuMemAddressReserve");
  reserved = 1;
  DRV_TRY(drv.map(b->va, b->size, 0, h, 0), "cuMemMap");
  mapped = 1;
  memset(&access, 0, sizeof access);
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = dev;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  DRV_TRY(drv.set_access(b->va, b->size, &access, 1), "cuMemSetAccess");
  if (fabric && exported) {
    DRV_TRY(drv.export_(exported, h, CU_MEM_HANDLE_TYPE_FABRIC, 0),
            "cuMemExportToShareableHandle (fabric)");
  } else if (fd) {
    DRV_TRY(drv.export_(fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
            "cuMemExportToShareableHandle");
    (void)fcntl(*fd, F_SETFD, FD_CLOEXEC); /* not inherited by programs this process starts */
  }
  /* The mapping holds the memory from here on; the handle is not needed any more. */
  (void)drv.release(h);
  return ncclSuccess;
fail:
  if (fd && *fd >= 0) close(*fd);
  if (fd) *fd = -1;
  if (mapped) (void)drv.unmap(b->va, b->size);
  if (reserved) (void)drv.addr_free(b->va, b->size);
  if (have_handle) (void)drv.release(h);
  (void)cudaGetLastError();
  memset(b, 0, sizeof *b);
  return res;
}

static CUresult cumem_destroy(CUdeviceptr va, size_t size) {
  CUresult r = drv.unmap(va, size);
  return r == CUDA_SUCCESS ? drv.addr_free(va, size) : r;
}

static ncclResult_t cumem_alloc(size_t bytes, struct ipc_mem* mem, struct ipc_desc* desc) {
  ncclResult_t res = ncclSuccess;
  int fd = -1;
  struct cumem_block b;
  struct ipc_export* e = NULL;
  BRAID_TRY(cumem_create(bytes, IPC_CUMEM, &fd, &b));
  /* Zero before the descriptor goes out: a peer may write its first steps as soon as it maps. */
  BRAID_TRY(braid_cuda_zero((void*)(uintptr_t)b.va, b.size));
  BRAID_TRY(ipc_fd_offer(fd, desc, &e));
  desc->align = b.gran;
  desc->bytes = b.size;
  mem->kind = IPC_CUMEM;
  mem->ptr = (void*)(uintptr_t)b.va;
  mem->bytes = b.size;
  mem->fd = fd;
  mem->export_ = e;
  return ncclSuccess;
fail:
  if (fd >= 0) close(fd);
  if (b.va) (void)cumem_destroy(b.va, b.size);
  (void)cudaGetLastError();
  return res;
}

static ncclResult_t fabric_alloc(size_t bytes, struct ipc_mem* mem, struct ipc_desc* desc) {
  ncclResult_t res = ncclSuccess;
  struct cumem_block b;
  _Static_assert(sizeof(CUmemFabricHandle) == sizeof desc->u.fabric, "a fabric handle's size");
  BRAID_TRY(cumem_create(bytes, IPC_FABRIC, desc->u.fabric, &b));
  BRAID_TRY(braid_cuda_zero((void*)(uintptr_t)b.va, b.size)); /* before the handle goes out */
  desc->align = b.gran;
  desc->bytes = b.size;
  mem->kind = IPC_FABRIC;
  mem->ptr = (void*)(uintptr_t)b.va;
  mem->bytes = b.size;
  return ncclSuccess;
fail:
  if (b.va) (void)cumem_destroy(b.va, b.size);
  (void)cudaGetLastError();
  return res;
}

ncclResult_t ipc_mem_alloc(ipc_kind_t kind, int owner_rank, size_t bytes, struct ipc_mem* mem,
                           struct ipc_desc* desc) {
  ncclResult_t res = ncclSuccess;
  int dev = -1;
  memset(mem, 0, sizeof *mem);
  mem->fd = -1;
  memset(desc, 0, sizeof *desc);
  desc->kind = (uint32_t)kind;
  desc->owner_rank = (uint32_t)owner_rank;
  BRAID_CUDA_TRY(cudaGetDevice(&dev));
  desc->owner_dev = dev;
  if (kind == IPC_CUMEM) return cumem_alloc(bytes, mem, desc);
  if (kind == IPC_FABRIC) return fabric_alloc(bytes, mem, desc);
  BRAID_CHECK(kind == IPC_LOCAL || kind == IPC_LEGACY, ncclInternalError,
              "no way to share memory (kind %d)", (int)kind);
  BRAID_CUDA_TRY(cudaMalloc(&mem->ptr, bytes));
  mem->kind = kind;
  mem->bytes = bytes;
  BRAID_TRY(braid_cuda_zero(mem->ptr, bytes));
  if (kind == IPC_LEGACY) BRAID_CUDA_TRY(cudaIpcGetMemHandle(&desc->u.legacy, mem->ptr));
  desc->ptr = mem->ptr;
  desc->bytes = bytes;
  return ncclSuccess;
fail:
  ipc_mem_free(mem);
  return res;
}

void ipc_mem_free(struct ipc_mem* mem) {
  if (mem->kind == IPC_CUMEM || mem->kind == IPC_FABRIC) {
    if (mem->export_) ipc_fd_withdraw(mem->export_);
    if (mem->fd >= 0) close(mem->fd);
    if (mem->ptr) {
      CUresult r = cumem_destroy((CUdeviceptr)(uintptr_t)mem->ptr, mem->bytes);
      if (r != CUDA_SUCCESS) WARN("releasing %zu bytes of cuMem memory failed: %s", mem->bytes, drv_err(r));
    }
  } else if (mem->ptr && cudaFree(mem->ptr) != cudaSuccess) {
    WARN("cudaFree of %zu bytes of shared device memory failed: %s", mem->bytes,
         cudaGetErrorString(cudaGetLastError()));
  }
  memset(mem, 0, sizeof *mem);
  mem->fd = -1;
}

/* ---- Mapping another process's memory. ---- */

/*
 * Peer access for this thread's device to `peer_dev`, inside one process. A
 * process-wide property of a pair of devices: the pairs this process enabled
 * are remembered (asking twice returns an error, which tools such as
 * compute-sanitizer report even when it is expected).
 */
#define IPC_MAX_DEVS 64
static pthread_mutex_t peer_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t peer_enabled[IPC_MAX_DEVS]; /* bit p of [d]: d reaches p */

static ncclResult_t enable_peer_access(int peer_dev) {
  ncclResult_t res = ncclSuccess;
  int dev = -1;
  BRAID_CUDA_TRY(cudaGetDevice(&dev));
  if (dev == peer_dev) return ncclSuccess;
  int known = dev >= 0 && dev < IPC_MAX_DEVS && peer_dev >= 0 && peer_dev < IPC_MAX_DEVS;
  pthread_mutex_lock(&peer_lock);
  if (!known || !(peer_enabled[dev] >> peer_dev & 1)) {
    cudaError_t err = cudaDeviceEnablePeerAccess(peer_dev, 0);
    if (err == cudaErrorPeerAccessAlreadyEnabled) {
      (void)cudaGetLastError(); /* enabled by the application itself */
      err = cudaSuccess;
    }
    if (err == cudaSuccess && known) peer_enabled[dev] |= 1ull << peer_dev;
    pthread_mutex_unlock(&peer_lock);
    BRAID_CUDA_TRY(err);
    return ncclSuccess;
  }
  pthread_mutex_unlock(&peer_lock);
  return ncclSuccess;
fail:
  return res;
}

static ncclResult_t cumem_map(const struct ipc_desc* desc, int my_rank, volatile uint32_t* abort_flag,
                              struct ipc_map* map) {
  ncclResult_t res = ncclSuccess;
  int dev = -1, fd = -1;
  CUmemGenericAllocationHandle h = 0;
  int have_handle = 0, reserved = 0, mapped = 0;
  CUdeviceptr va = 0;
  size_t size = (size_t)desc->bytes;
  CUmemAccessDesc access;
  BRAID_CUDA_TRY(cudaGetDevice(&dev));
  pthread_once(&drv_once, drv_load);
  BRAID_CHECK(drv.ok, ncclSystemError, "the CUDA driver lacks the cuMem functions");
  BRAID_CHECK(desc->align != 0 && size % desc->align == 0, ncclInternalError,
              "rank %u offered %zu bytes of cuMem memory with granularity %llu", desc->owner_rank,
              size, (unsigned long long)desc->align);
  if (desc->kind == IPC_FABRIC) {
    DRV_TRY(drv.import(&h, (void*)desc->u.fabric, CU_MEM_HANDLE_TYPE_FABRIC),
            "cuMemImportFromShareableHandle (fabric)");
  } else {
    BRAID_TRY(ipc_fd_fetch(desc, my_rank, abort_flag, &fd));
    DRV_TRY(drv.import(&h, (void*)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
            "cuMemImportFromShareableHandle");
    close(fd);
    fd = -1;
  }
  have_handle = 1;
  DRV_TRY(drv.reserve(&va, size, desc->align, 0, 0), "cuMemAddressReserve");
  reserved = 1;
  DRV_TRY(drv.map(va, size, 0, h, 0), "cuMemMap");
  mapped = 1;
  (void)drv.release(h);
  have_handle = 0;
  memset(&access, 0, sizeof access);
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = dev;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  DRV_TRY(drv.set_access(va, size, &access, 1), "cuMemSetAccess (the GPUs may not reach each other)");
  map->kind = (ipc_kind_t)desc->kind;
  map->ptr = (void*)(uintptr_t)va;
  map->bytes = size;
  return ncclSuccess;
fail:
  if (fd >= 0) close(fd);
  if (mapped) (void)drv.unmap(va, size);
  if (reserved) (void)drv.addr_free(va, size);
  if (have_handle) (void)drv.release(h);
  (void)cudaGetLastError();
  return res;
}

ncclResult_t ipc_mem_map(const struct ipc_desc* desc, int my_rank, volatile uint32_t* abort_flag,
                         struct ipc_map* map) {
  ncclResult_t res = ncclSuccess;
  memset(map, 0, sizeof *map);
  switch ((ipc_kind_t)desc->kind) {
    case IPC_LOCAL:
      BRAID_TRY(enable_peer_access(desc->owner_dev));
      map->kind = IPC_LOCAL;
      map->ptr = desc->ptr;
      map->bytes = desc->bytes;
      return ncclSuccess;
    case IPC_LEGACY: {
      void* p = NULL;
      cudaError_t err = cudaIpcOpenMemHandle(&p, desc->u.legacy, cudaIpcMemLazyEnablePeerAccess);
      if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return braid_err(ncclUnhandledCudaError,
                         "rank %d cannot map rank %u's GPU memory (cudaIpcOpenMemHandle: %s). Both "
                         "processes must see both GPUs (check CUDA_VISIBLE_DEVICES), or leave "
                         "NCCL_CUMEM_ENABLE on, or set NCCL_P2P_DISABLE=1 to go through host memory",
                         my_rank, desc->owner_rank, cudaGetErrorString(err));
      }
      map->kind = IPC_LEGACY;
      map->ptr = p;
      map->bytes = desc->bytes;
      return ncclSuccess;
    }
    case IPC_CUMEM:
    case IPC_FABRIC:
      return cumem_map(desc, my_rank, abort_flag, map);
    default:
      break;
  }
  BRAID_CHECK(0, ncclInternalError, "rank %u offered memory shared in an unknown way (%u)",
              desc->owner_rank, desc->kind);
fail:
  return res;
}

void ipc_mem_unmap(struct ipc_map* map) {
  if (map->kind == IPC_LEGACY && map->ptr && cudaIpcCloseMemHandle(map->ptr) != cudaSuccess) {
    WARN("cudaIpcCloseMemHandle of a peer's buffer failed: %s", cudaGetErrorString(cudaGetLastError()));
  } else if ((map->kind == IPC_CUMEM || map->kind == IPC_FABRIC) && map->ptr) {
    CUresult r = cumem_destroy((CUdeviceptr)(uintptr_t)map->ptr, map->bytes);
    if (r != CUDA_SUCCESS) WARN("unmapping a peer's cuMem memory failed: %s", drv_err(r));
  }
  memset(map, 0, sizeof *map);
}

/* ---- ncclMemAlloc's memory. ---- */

ncclResult_t ipc_user_alloc(void** out, size_t bytes) {
  ncclResult_t res = ncclSuccess;
  char why[160];
  int dev = -1;
  struct cumem_block blk;
  memset(&blk, 0, sizeof blk);
  *out = NULL;
  BRAID_CUDA_TRY(cudaGetDevice(&dev));
  if (!braid_param_int(BRAID_P_CUMEM_ENABLE) || !cumem_usable(dev, why, sizeof why)) {
    cudaError_t err = cudaMalloc(out, bytes);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      *out = NULL;
      return braid_err(ncclUnhandledCudaError,
                       "ncclMemAlloc: cudaMalloc of size = %zu bytes failed: %s", bytes,
                       cudaGetErrorString(err));
    }
    /* Zeroed, as the cuMem path: programs use such buffers for flags that start at zero. */
    if ((res = braid_cuda_zero(*out, bytes)) != ncclSuccess) {
      (void)cudaFree(*out);
      *out = NULL;
    }
    return res;
  }
  BRAID_TRY(cumem_create(bytes, IPC_CUMEM, NULL, &blk));
  /* Fresh physical memory is not promised to be zero; programs (PyTorch's symmetric memory
   * signal pads) count on ncclMemAlloc's buffers starting at zero. */
  BRAID_TRY(braid_cuda_zero((void*)(uintptr_t)blk.va, blk.size));
  /* Readable and writable by every GPU of this process that can reach it too, as NCCL's
   * ncclMemAlloc: kernels of other devices may use the buffer directly. */
  int ndev = 0;
  if (drv.dev_count == NULL || drv.dev_count(&ndev) != CUDA_SUCCESS) ndev = 0;
  for (int d = 0; d < ndev; d++) {
    int ok = 0;
    CUdevice a, b;
    if (d == dev || drv.can_access == NULL || drv.dev_get(&a, d) != CUDA_SUCCESS ||
        drv.dev_get(&b, dev) != CUDA_SUCCESS || drv.can_access(&ok, a, b) != CUDA_SUCCESS || !ok)
      continue;
    CUmemAccessDesc access;
    memset(&access, 0, sizeof access);
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = d;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    DRV_TRY(drv.set_access(blk.va, blk.size, &access, 1), "ncclMemAlloc: cuMemSetAccess");
  }
  *out = (void*)(uintptr_t)blk.va;
  return ncclSuccess;
fail:
  if (blk.va) (void)cumem_destroy(blk.va, blk.size);
  (void)cudaGetLastError();
  return res;
}

ncclResult_t ipc_user_free(void* ptr) {
  ncclResult_t res = ncclSuccess;
  CUmemGenericAllocationHandle h;
  pthread_once(&drv_once, drv_load);
  /* A cuMem allocation answers cuMemRetainAllocationHandle; cudaMalloc memory does not. */
  if (drv.ok && drv.retain && drv.range && drv.retain(&h, ptr) == CUDA_SUCCESS) {
    CUdeviceptr base = 0;
    size_t size = 0;
    (void)drv.release(h); /* the reference the retain took */
    DRV_TRY(drv.range(&base, &size, (CUdeviceptr)(uintptr_t)ptr), "ncclMemFree: cuMemGetAddressRange");
    BRAID_CHECK(base == (CUdeviceptr)(uintptr_t)ptr, ncclInvalidArgument,
                "ncclMemFree: ptr %p is not the start of an allocation (it begins at %p)", ptr,
                (void*)(uintptr_t)base);
    DRV_TRY(drv.unmap(base, size), "ncclMemFree: cuMemUnmap");
    DRV_TRY(drv.addr_free(base, size), "ncclMemFree: cuMemAddressFree");
    return ncclSuccess;
  }
  cudaError_t err = cudaFree(ptr);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return braid_err(ncclUnhandledCudaError, "ncclMemFree: cudaFree(ptr = %p) failed: %s", ptr,
                     cudaGetErrorString(err));
  }
  return ncclSuccess;
fail:
  (void)cudaGetLastError();
  return res;
}

/* ---- Windows: a peer's whole allocation mapped at an address the caller chose. ---- */

ncclResult_t ipc_win_export(ipc_kind_t kind, void* buff, int owner_rank, struct ipc_mem* keep,
                            struct ipc_desc* desc, size_t* offset) {
  ncclResult_t res = ncclSuccess;
  CUmemGenericAllocationHandle h = 0;
  int have_handle = 0, dev = -1, fd = -1;
  CUdeviceptr base = 0;
  size_t size = 0, gran = 0;
  CUmemAllocationProp prop;
  memset(keep, 0, sizeof *keep);
  keep->fd = -1;
  memset(desc, 0, sizeof *desc);
  BRAID_CUDA_TRY(cudaGetDevice(&dev));
  pthread_once(&drv_once, drv_load);
  BRAID_CHECK(drv.ok && drv.retain && drv.range && drv.props, ncclSystemError,
              "the CUDA driver lacks the cuMem functions that windows need");
  CUresult r = drv.retain(&h, buff);
  if (r != CUDA_SUCCESS) {
    (void)cudaGetLastError();
    BRAID_CHECK(0, ncclInvalidArgument,
                "buff %p is not cuMem memory (%s): a window's buffer comes from ncclMemAlloc", buff,
                drv_err(r));
  }
  have_handle = 1;
  DRV_TRY(drv.range(&base, &size, (CUdeviceptr)(uintptr_t)buff), "cuMemGetAddressRange");
  DRV_TRY(drv.props(&prop, h), "cuMemGetAllocationPropertiesFromHandle");
  DRV_TRY(drv.granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
          "cuMemGetAllocationGranularity");
  BRAID_CHECK(gran != 0 && size % gran == 0 && base % gran == 0, ncclInvalidArgument,
              "buff %p lies in a cuMem range (%p, %zu bytes) that is not whole granules of %zu "
              "bytes", buff, (void*)(uintptr_t)base, size, gran);
  if (kind == IPC_CUMEM) {
    BRAID_CHECK(prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                ncclInvalidArgument,
                "buff %p is cuMem memory made without a file-descriptor handle type, so other "
                "processes cannot map it: allocate it with ncclMemAlloc", buff);
    DRV_TRY(drv.export_(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
            "cuMemExportToShareableHandle");
    (void)fcntl(fd, F_SETFD, FD_CLOEXEC);
    BRAID_TRY(ipc_fd_offer(fd, desc, &keep->export_));
    keep->kind = IPC_CUMEM;
    keep->fd = fd;
    fd = -1;
  } else {
    BRAID_CHECK(kind == IPC_LOCAL, ncclInternalError, "windows map memory of one process or "
                "through cuMem handles (kind %d)", (int)kind);
    keep->kind = IPC_LOCAL;
  }
  (void)drv.release(h);
  desc->kind = (uint32_t)kind;
  desc->owner_rank = (uint32_t)owner_rank;
  desc->owner_dev = dev;
  desc->bytes = size;
  desc->align = gran;
  desc->ptr = (void*)(uintptr_t)base;
  *offset = (size_t)((uintptr_t)buff - (uintptr_t)base);
  return ncclSuccess;
fail:
  if (fd >= 0) close(fd);
  if (have_handle) (void)drv.release(h);
  (void)cudaGetLastError();
  return res;
}

ncclResult_t ipc_va_reserve(size_t bytes, size_t align, void** va) {
  ncclResult_t res = ncclSuccess;
  CUdeviceptr p = 0;
  *va = NULL;
  pthread_once(&drv_once, drv_load);
  BRAID_CHECK(drv.ok, ncclSystemError, "the CUDA driver lacks the cuMem functions");
  DRV_TRY(drv.reserve(&p, bytes, align, 0, 0), "cuMemAddressReserve");
  *va = (void*)(uintptr_t)p;
  return ncclSuccess;
fail:
  (void)cudaGetLastError();
  return res;
}

void ipc_va_release(void* va, size_t bytes) {
  if (va == NULL) return;
  CUresult r = drv.addr_free((CUdeviceptr)(uintptr_t)va, bytes);
  if (r != CUDA_SUCCESS) WARN("releasing %zu bytes of address space failed: %s", bytes, drv_err(r));
}

ncclResult_t ipc_map_at(const struct ipc_desc* desc, void* va, int my_rank,
                        volatile uint32_t* abort_flag) {
  ncclResult_t res = ncclSuccess;
  CUmemGenericAllocationHandle h = 0;
  int have_handle = 0, mapped = 0, dev = -1, fd = -1;
  const CUdeviceptr at = (CUdeviceptr)(uintptr_t)va;
  const size_t size = (size_t)desc->bytes;
  CUmemAccessDesc access;
  BRAID_CUDA_TRY(cudaGetDevice(&dev));
  pthread_once(&drv_once, drv_load);
  BRAID_CHECK(drv.ok && drv.retain, ncclSystemError, "the CUDA driver lacks the cuMem functions");
  if (desc->kind == IPC_LOCAL) {
    DRV_TRY(drv.retain(&h, desc->ptr), "cuMemRetainAllocationHandle");
  } else {
    BRAID_CHECK(desc->kind == IPC_CUMEM, ncclInternalError, "rank %u's window memory cannot be "
                "mapped here (kind %u)", desc->owner_rank, desc->kind);
    BRAID_TRY(ipc_fd_fetch(desc, my_rank, abort_flag, &fd));
    DRV_TRY(drv.import(&h, (void*)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
            "cuMemImportFromShareableHandle");
    close(fd);
    fd = -1;
  }
  have_handle = 1;
  DRV_TRY(drv.map(at, size, 0, h, 0), "cuMemMap");
  mapped = 1;
  (void)drv.release(h); /* the mapping holds the memory */
  have_handle = 0;
  memset(&access, 0, sizeof access);
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = dev;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  DRV_TRY(drv.set_access(at, size, &access, 1),
          "cuMemSetAccess (this GPU may not reach the owner's)");
  return ncclSuccess;
fail:
  if (fd >= 0) close(fd);
  if (mapped) (void)drv.unmap(at, size);
  if (have_handle) (void)drv.release(h);
  (void)cudaGetLastError();
  return res;
}

void ipc_unmap_at(void* va, size_t bytes) {
  if (va == NULL) return;
  CUresult r = drv.unmap((CUdeviceptr)(uintptr_t)va, bytes);
  if (r != CUDA_SUCCESS) WARN("unmapping %zu bytes of a window failed: %s", bytes, drv_err(r));
}
