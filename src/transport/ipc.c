/*
 * Device memory shared between the processes of one host (see ipc.h): cuMem
 * allocations exported as file descriptors and handed over a Unix socket,
 * legacy CUDA IPC handles, or plain pointers inside one process.
 */
#include "transport/ipc.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/un.h>
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

/* ---- The descriptor service. ---- */

#define IPC_MAGIC 0x3144464449415242ull /* "BRAIDFD1" */
#define IPC_REQ_TIMEOUT_MS 1000         /* how long the service waits for one request */

struct ipc_request {
  uint64_t magic;
  uint8_t token[16];
};

struct ipc_reply {
  uint64_t magic;
  int32_t status; /* 0: the descriptor is attached; 1: no such export */
  int32_t pad;
};

struct ipc_export {
  struct ipc_export* next;
  uint8_t token[16];
  int fd;
};

static struct {
  pthread_mutex_t lock;
  int refs;
  pid_t pid; /* the process that started the service (a forked child starts its own) */
  int listen_fd;
  int wake[2];
  pthread_t thread;
  int running;
  uint64_t id;
  struct ipc_export* exports;
  int nexports;
  char why[160]; /* why there is no service, when there is none */
} svc = {.lock = PTHREAD_MUTEX_INITIALIZER, .listen_fd = -1, .wake = {-1, -1}};

static void ipc_sock_name(uint64_t id, struct sockaddr_un* addr, socklen_t* len) {
  memset(addr, 0, sizeof *addr);
  addr->sun_family = AF_UNIX;
  /* Abstract namespace: sun_path[0] is NUL, nothing appears in the file system. */
  int n = snprintf(addr->sun_path + 1, sizeof addr->sun_path - 1, "braid-ipc-%016llx",
                   (unsigned long long)id);
  *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

/* Sends the export's descriptor (or a refusal) to one connected client. */
static void ipc_serve_one(int fd) {
  struct timeval tv = {.tv_sec = IPC_REQ_TIMEOUT_MS / 1000, .tv_usec = 0};
  struct ipc_request req;
  struct ucred cred;
  socklen_t clen = sizeof cred;
  (void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  (void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  /* Only processes of this user: the peers of a job are. */
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0 || cred.uid != getuid()) return;
  size_t got = 0;
  while (got < sizeof req) {
    ssize_t n = recv(fd, (char*)&req + got, sizeof req - got, 0);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      return;
    }
    got += (size_t)n;
  }
  if (req.magic != IPC_MAGIC) return;
  struct ipc_reply rep = {.magic = IPC_MAGIC, .status = 1};
  char cbuf[CMSG_SPACE(sizeof(int))];
  struct iovec iov = {.iov_base = &rep, .iov_len = sizeof rep};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
  pthread_mutex_lock(&svc.lock);
  struct ipc_export* e = svc.exports;
  while (e && memcmp(e->token, req.token, sizeof e->token) != 0) e = e->next;
  if (e) {
    rep.status = 0;
    memset(cbuf, 0, sizeof cbuf);
    msg.msg_control = cbuf;
    msg.msg_controllen = sizeof cbuf;
    struct cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &e->fd, sizeof(int));
  }
  /* Under the lock: the descriptor must not be closed while it is being sent. */
  while (sendmsg(fd, &msg, MSG_NOSIGNAL) < 0 && errno == EINTR) {
  }
  pthread_mutex_unlock(&svc.lock);
}

static void* ipc_service_main(void* arg) {
  const int* fds = arg; /* [listen, wake]: the service's own, fixed while it runs */
  const int listen_fd = fds[0], wake_fd = fds[1];
  free(arg);
  for (;;) {
    struct pollfd p[2] = {{.fd = listen_fd, .events = POLLIN}, {.fd = wake_fd, .events = POLLIN}};
    int n = poll(p, 2, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      WARN("the cuMem descriptor service stops: poll failed: %s", strerror(errno));
      return NULL;
    }
    if (p[1].revents) return NULL;
    if (p[0].revents & POLLIN) {
      int c = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
      if (c < 0) continue;
      ipc_serve_one(c);
      close(c);
    }
  }
}

static void ipc_service_close_fds(void) {
  if (svc.listen_fd >= 0) close(svc.listen_fd);
  for (int i = 0; i < 2; i++)
    if (svc.wake[i] >= 0) close(svc.wake[i]);
  svc.listen_fd = -1;
  svc.wake[0] = svc.wake[1] = -1;
}

/* Starts the service; on failure leaves svc.id 0 and svc.why set. Called with the lock held. */
static void ipc_service_start(void) {
  struct sockaddr_un addr;
  socklen_t len;
  svc.id = 0;
  svc.why[0] = '\0';
  svc.pid = getpid();
  if (braid_random_bytes(&svc.id, sizeof svc.id) != ncclSuccess || svc.id == 0) {
    snprintf(svc.why, sizeof svc.why, "no random bytes for its socket name");
    svc.id = 0;
    return;
  }
  svc.listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ipc_sock_name(svc.id, &addr, &len);
  if (svc.listen_fd < 0 || bind(svc.listen_fd, (struct sockaddr*)&addr, len) != 0 ||
      listen(svc.listen_fd, 128) != 0 || pipe2(svc.wake, O_CLOEXEC) != 0) {
    snprintf(svc.why, sizeof svc.why, "its Unix socket could not be set up: %s", strerror(errno));
    ipc_service_close_fds();
    svc.id = 0;
    return;
  }
  int* fds = malloc(2 * sizeof(int));
  int err = ENOMEM;
  if (fds) {
    fds[0] = svc.listen_fd;
    fds[1] = svc.wake[0];
    err = pthread_create(&svc.thread, NULL, ipc_service_main, fds);
    if (err != 0) free(fds);
  }
  if (err != 0) {
    snprintf(svc.why, sizeof svc.why, "its thread could not start: %s", strerror(err));
    ipc_service_close_fds();
    svc.id = 0;
    return;
  }
  svc.running = 1;
}

/*
 * Stops the service. Called with the lock held; drops it while joining the
 * thread (which takes the lock to serve a request) and takes it again. A
 * communicator starting meanwhile starts a service of its own.
 */
static void ipc_service_stop(void) {
  pthread_t thread = svc.thread;
  int running = svc.running;
  int listen_fd = svc.listen_fd, wake0 = svc.wake[0], wake1 = svc.wake[1];
  svc.running = 0;
  svc.listen_fd = svc.wake[0] = svc.wake[1] = -1;
  svc.id = 0;
  pthread_mutex_unlock(&svc.lock);
  if (running) {
    char b = 1;
    while (write(wake1, &b, 1) < 0 && errno == EINTR) {
    }
    pthread_join(thread, NULL);
  }
  if (listen_fd >= 0) close(listen_fd);
  if (wake0 >= 0) close(wake0);
  if (wake1 >= 0) close(wake1);
  pthread_mutex_lock(&svc.lock);
}

int ipc_sees_gpu(const struct braid_peer_info* p, int64_t bus) {
  for (int i = 0; i < p->nvisible && i < BRAID_MAX_VISIBLE_GPUS; i++)
    if (p->visible_bus[i] == bus) return 1;
  return 0;
}

void ipc_acquire(int cuda_dev, struct braid_peer_info* me) {
  char why[160] = "";
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
  pthread_mutex_lock(&svc.lock);
  if (svc.refs > 0 && svc.pid != getpid()) {
    /* A forked child: the parent's thread is not here and its sockets are the parent's. */
    ipc_service_close_fds();
    svc.running = 0;
    svc.refs = 0;
    svc.exports = NULL;
    svc.nexports = 0;
  }
  if (svc.refs++ == 0) ipc_service_start();
  me->ipc_service = svc.id;
  if (usable && svc.id == 0) {
    snprintf(why, sizeof why, "its descriptor service is off: %s", svc.why);
    usable = 0;
  }
  pthread_mutex_unlock(&svc.lock);
  me->ipc_cumem = usable;
  if (!want)
    INFO(BRAID_LOG_INIT | BRAID_LOG_ENV, "cuMem memory sharing off (NCCL_CUMEM_ENABLE=0)");
  else if (!usable)
    INFO(BRAID_LOG_INIT, "cuMem memory sharing unavailable on GPU %d: %s", cuda_dev, why);
}

void ipc_release(void) {
  pthread_mutex_lock(&svc.lock);
  /* Exports still listed (memory not freed yet) stay listed: their owners close them. */
  if (svc.refs > 0 && svc.pid == getpid() && --svc.refs == 0) ipc_service_stop();
  pthread_mutex_unlock(&svc.lock);
}

int ipc_exports_live(void) {
  pthread_mutex_lock(&svc.lock);
  int n = svc.nexports;
  pthread_mutex_unlock(&svc.lock);
  return n;
}

ipc_kind_t ipc_choose(const struct braid_peer_info* me, const struct braid_peer_info* owner,
                      char* why, size_t why_size) {
  if (me->pid_hash == owner->pid_hash) return IPC_LOCAL;
  if (me->ipc_cumem && owner->ipc_cumem && me->uid == owner->uid && me->net_ns == owner->net_ns)
    return IPC_CUMEM;
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
  else
    snprintf(why, why_size,
             "ranks %d and %d are in different network namespaces, so their Unix sockets cannot "
             "meet to pass memory handles",
             me->rank, owner->rank);
  size_t used = strlen(why);
  if (used < why_size)
    snprintf(why + used, why_size - used,
             ", and legacy CUDA IPC needs both GPUs visible in both processes (CUDA_VISIBLE_DEVICES)");
  return IPC_NONE;
}

/* ---- Allocation and export. ---- */

void ipc_fd_withdraw(struct ipc_export* e) {
  pthread_mutex_lock(&svc.lock);
  for (struct ipc_export** p = &svc.exports; *p; p = &(*p)->next) {
    if (*p == e) {
      *p = e->next;
      svc.nexports--;
      free(e);
      break;
    }
  }
  pthread_mutex_unlock(&svc.lock);
}

ncclResult_t ipc_fd_offer(int fd, struct ipc_desc* desc, struct ipc_export** out) {
  ncclResult_t res = ncclSuccess;
  struct ipc_export* e = NULL;
  BRAID_TRY(BRAID_CALLOC(&e, 1, "descriptor export"));
  BRAID_TRY(braid_random_bytes(e->token, sizeof e->token));
  e->fd = fd;
  pthread_mutex_lock(&svc.lock);
  if (svc.id == 0) {
    pthread_mutex_unlock(&svc.lock);
    BRAID_CHECK(0, ncclInternalError, "no descriptor service runs in this process (%s)",
                svc.why[0] ? svc.why : "no communicator holds it");
  }
  e->next = svc.exports;
  svc.exports = e;
  svc.nexports++;
  desc->u.cumem.service = svc.id;
  pthread_mutex_unlock(&svc.lock);
  memcpy(desc->u.cumem.token, e->token, sizeof e->token);
  *out = e;
  return ncclSuccess;
fail:
  free(e);
  return res;
}

/* A cuMem allocation: its address range and granularity. */
struct cumem_block {
  CUdeviceptr va;
  size_t size;
  size_t gran;
};

/*
 * Allocates at least `bytes` on the current device with cuMem, mapped there readable and
 * writable, with a file-descriptor handle; `fd` non-NULL: exported too (close-on-exec, the
 * caller's). On failure nothing is left.
 */
static ncclResult_t cumem_create(size_t bytes, int* fd, struct cumem_block* b) {
  ncclResult_t res = ncclSuccess;
  int dev = -1;
  CUmemGenericAllocationHandle h = 0;
  int have_handle = 0, reserved = 0, mapped = 0;
  CUmemAllocationProp prop;
  CUmemAccessDesc access;
  memset(b, 0, sizeof *b);
  if (fd) *fd = -1;
  BRAID_CUDA_TRY(cudaGetDevice(&dev));
  pthread_once(&drv_once, drv_load);
  BRAID_CHECK(drv.ok, ncclSystemError, "the CUDA driver lacks the cuMem functions");
  memset(&prop, 0, sizeof prop);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
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
  if (fd) {
    DRV_TRY(drv.export_(fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
            "cuMemExportToShareableHandle");
    (void)fcntl(*fd, F_SETFD, FD_CLOEXEC); /* not inherited by programs this process starts */
  }
  /* The mapping holds the memory from here on; the handle is not needed any more. */
  (void)drv.release(h);
  return ncclSuccess;
fail:
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
  BRAID_TRY(cumem_create(bytes, &fd, &b));
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
  if (mem->kind == IPC_CUMEM) {
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

/*
 * How long a fetch waits for the owner's descriptor service. The service answers at once while
 * its process runs, so only an owner that is stopped or hung makes a fetch wait: BRAID_TIMEOUT,
 * when set below it, bounds this wait as it bounds every other wait for a peer.
 */
#define IPC_FETCH_TIMEOUT_SEC 30.0
static double ipc_fetch_timeout(void) {
  const int64_t t = braid_param_int(BRAID_P_TIMEOUT);
  return t > 0 && (double)t < IPC_FETCH_TIMEOUT_SEC ? (double)t : IPC_FETCH_TIMEOUT_SEC;
}

/* The process behind a connected Unix socket (SO_PEERCRED), 0 when unknown. */
static int ipc_peer_pid(int s) {
  struct ucred cred;
  socklen_t len = sizeof cred;
  return getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 ? (int)cred.pid : 0;
}

/*
 * Whether the owner's process is gone. A process that dies closes its sockets a moment before
 * it turns into a zombie, so after an end of stream this looks again for up to `settle` s.
 */
static int ipc_owner_gone(int pid, uint64_t start, double settle) {
  const double until = braid_time_sec() + settle;
  for (;;) {
    if (braid_process_gone(pid, start)) return 1;
    if (braid_time_sec() >= until) return 0;
    usleep(5 * 1000);
  }
}

/* The owner's service took the request but gave no answer: what its process is doing. */
static ncclResult_t ipc_fetch_unanswered(int my_rank, unsigned owner, int pid, double waited,
                                         int gone) {
  if (gone)
    return braid_err(ncclRemoteError,
                     "rank %d: rank %u's process (pid %d) is gone: it exited while handing over "
                     "a memory handle",
                     my_rank, owner, pid);
  const char* what = pid > 0 && braid_process_stopped(pid) ? "is stopped (a signal or a debugger)"
                                                           : "does not answer (hung, or starved)";
  return braid_err(ncclRemoteError,
                   "rank %d: rank %u's process (pid %d) %s: its descriptor service took the "
                   "request for a memory handle and gave no answer in %.1f s",
                   my_rank, owner, pid, what, waited);
}

/*
 * Asks the owner's descriptor service for the export's descriptor. Waits at
 * most ipc_fetch_timeout() for the service (it answers at once when its
 * process runs), less when the abort flag rises or the owner's process is
 * found gone.
 */
ncclResult_t ipc_fd_fetch(const struct ipc_desc* desc, int my_rank, volatile uint32_t* abort_flag,
                          int* out_fd) {
  const double timeout_sec = ipc_fetch_timeout();
  double start = braid_time_sec();
  struct sockaddr_un addr;
  socklen_t len;
  int err = 0;
  ipc_sock_name(desc->u.cumem.service, &addr, &len);
  for (;;) {
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0)
      return braid_err(ncclSystemError, "rank %d: socket(AF_UNIX) failed: %s", my_rank, strerror(errno));
    struct timeval tv = {.tv_sec = 0, .tv_usec = 200 * 1000};
    (void)setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    (void)setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(s, (struct sockaddr*)&addr, len) == 0) {
      const int owner_pid = ipc_peer_pid(s);
      const uint64_t owner_start = owner_pid > 0 ? braid_process_start(owner_pid) : 0;
      struct ipc_request req = {.magic = IPC_MAGIC};
      memcpy(req.token, desc->u.cumem.token, sizeof req.token);
      if (send(s, &req, sizeof req, MSG_NOSIGNAL) == (ssize_t)sizeof req) {
        struct ipc_reply rep;
        char cbuf[CMSG_SPACE(sizeof(int))];
        struct iovec iov = {.iov_base = &rep, .iov_len = sizeof rep};
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
                             .msg_controllen = sizeof cbuf};
        for (;;) {
          ssize_t n = recvmsg(s, &msg, MSG_CMSG_CLOEXEC);
          const int rerr = n < 0 ? errno : 0;
          const int timed_out = rerr == EINTR || rerr == EAGAIN;
          const int gone =
              n <= 0 && owner_pid > 0 && ipc_owner_gone(owner_pid, owner_start, timed_out ? 0 : 0.2);
          if (timed_out && !gone && braid_time_sec() - start < timeout_sec &&
              !(abort_flag && *abort_flag))
            continue;
          int fd = -1;
          struct cmsghdr* c = n > 0 ? CMSG_FIRSTHDR(&msg) : NULL;
          if (c && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS &&
              c->cmsg_len == CMSG_LEN(sizeof(int)))
            memcpy(&fd, CMSG_DATA(c), sizeof fd);
          close(s);
          if (n == (ssize_t)sizeof rep && rep.magic == IPC_MAGIC && rep.status == 0 && fd >= 0) {
            *out_fd = fd;
            return ncclSuccess;
          }
          if (fd >= 0) close(fd);
          if (n == (ssize_t)sizeof rep && rep.magic == IPC_MAGIC)
            return braid_err(ncclInternalError,
                             "rank %d: rank %u's descriptor service does not know the buffer it "
                             "offered (freed already?)",
                             my_rank, desc->owner_rank);
          if (abort_flag && *abort_flag)
            return braid_err(ncclRemoteError,
                             "rank %d: aborted while waiting for rank %u's descriptor service",
                             my_rank, desc->owner_rank);
          if (gone || (timed_out && owner_pid > 0))
            return ipc_fetch_unanswered(my_rank, desc->owner_rank, owner_pid,
                                        braid_time_sec() - start, gone);
          return braid_err(ncclSystemError,
                           "rank %d: rank %u's descriptor service did not hand over a memory "
                           "handle (%s); a seccomp profile or security module may forbid passing "
                           "descriptors: set NCCL_CUMEM_ENABLE=0 (legacy CUDA IPC, needs every GPU "
                           "visible) or NCCL_P2P_DISABLE=1 (through host memory, slower)",
                           my_rank, desc->owner_rank,
                           n < 0 ? strerror(rerr) : n == 0 ? "connection closed" : "short reply");
        }
      }
    }
    err = errno;
    close(s);
    /* The service runs from before the owner's info went out until its communicators are gone:
     * no listener means the owner process is gone or unreachable. Only a full backlog waits. */
    if (err != EAGAIN && err != EINTR) break;
    if (braid_time_sec() - start >= timeout_sec || (abort_flag && *abort_flag)) break;
    usleep(10 * 1000);
  }
  return braid_err(ncclSystemError,
                   "rank %d cannot reach rank %u's descriptor service to map its GPU memory (%s): "
                   "the process is gone, or in another network namespace, where handles cannot "
                   "be passed: set "
                   "NCCL_CUMEM_ENABLE=0 (legacy CUDA IPC, needs every GPU visible) or "
                   "NCCL_P2P_DISABLE=1 (through host memory, slower)",
                   my_rank, desc->owner_rank, abort_flag && *abort_flag ? "aborted" : strerror(err));
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
  BRAID_TRY(ipc_fd_fetch(desc, my_rank, abort_flag, &fd));
  DRV_TRY(drv.import(&h, (void*)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
          "cuMemImportFromShareableHandle");
  have_handle = 1;
  close(fd);
  fd = -1;
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
  map->kind = IPC_CUMEM;
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
  } else if (map->kind == IPC_CUMEM && map->ptr) {
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
  BRAID_TRY(cumem_create(bytes, NULL, &blk));
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
