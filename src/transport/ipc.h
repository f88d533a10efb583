/*
 * Device memory that another process of this host maps: the FIFOs of the P2P
 * transport and the copy engines' scratch.
 *
 * Four ways, chosen per pair of ranks by ipc_choose from what both told the
 * other at init (so both ends reach the same verdict):
 *   - LOCAL: the same process; the other GPU's pointer is used as it is
 *     (peer access enabled once per pair of devices);
 *   - CUMEM: the memory comes from cuMemCreate with a POSIX file descriptor as
 *     its shareable handle; the importer receives the descriptor over a Unix
 *     socket (SCM_RIGHTS) from the owner's descriptor service, or, where that
 *     socket cannot be reached (another network namespace) and the kernel
 *     allows it, takes it straight from the owner's process with pidfd_getfd;
 *     imports it and maps it on its own device. Neither process needs to see
 *     the other's GPU, so this works when each rank sees only its own
 *     (CUDA_VISIBLE_DEVICES per rank);
 *   - FABRIC: cuMemCreate with a fabric handle, 64 bytes that travel in the
 *     connection info itself: no descriptor to pass, so processes of different
 *     users or namespaces can share memory, where the driver offers fabric
 *     handles (an IMEX channel). Chosen when no descriptor can be passed, or
 *     always with BRAID_IPC_FABRIC=1;
 *   - LEGACY: cudaMalloc + cudaIpcGetMemHandle; needs both GPUs visible in
 *     both processes.
 *
 * The descriptor service is one thread per process, started with the first
 * communicator and stopped with the last. It listens on an abstract Unix
 * socket whose name holds a random 64-bit id, learnt by the peers through the
 * authenticated bootstrap; it hands a descriptor only to a request carrying
 * that export's 128-bit random token, which travels the same way. A stranger
 * on the host that connects gets nothing. pidfd_getfd is the kernel's to
 * allow: only a process that may trace the owner (same user, and the ptrace
 * rules of kernel.yama.ptrace_scope) takes its descriptors. The service and the
 * fetch are
 * ipc_fd.c's; the memory, its export and its mapping ipc.c's.
 */
#ifndef BRAID_TRANSPORT_IPC_H
#define BRAID_TRANSPORT_IPC_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include "nccl.h"

struct braid_peer_info;

typedef enum {
  IPC_NONE = 0,
  IPC_LOCAL = 1,
  IPC_CUMEM = 2,
  IPC_LEGACY = 3,
  IPC_FABRIC = 4
} ipc_kind_t;
const char* ipc_kind_name(ipc_kind_t kind);

/* What an owner sends the process that maps its memory (inside a transport's connection info). */
struct ipc_desc {
  uint32_t kind;  /* ipc_kind_t */
  uint32_t owner_rank;
  int32_t owner_dev; /* the owner's device, as numbered in its process (LOCAL) */
  uint32_t pad;
  uint64_t bytes; /* as mapped by the owner (CUMEM: a multiple of `align`) */
  uint64_t align; /* CUMEM: the owner's allocation granularity */
  void* ptr;      /* the owner's address (LOCAL) */
  union {
    cudaIpcMemHandle_t legacy;
    struct {
      uint64_t service;   /* the owner's descriptor service; 0: take it with pidfd_getfd */
      uint8_t token[16];  /* this export's capability */
      int32_t pid;        /* the owner's process and the descriptor's number there (pidfd_getfd) */
      int32_t fd;
      uint64_t start;     /* when the owner's process started (braid_process_start), 0: unknown */
      uint64_t net_ns;    /* the owner's network namespace: its socket is reachable from the same */
      uint64_t file_dev;  /* the descriptor's file (fstat), which a descriptor taken must match
                             (every cuMem export is /dev/nvidiactl to fstat: a weak check) */
      uint64_t file_ino;
    } cumem;
    uint8_t fabric[64];   /* CUmemFabricHandle */
  } u;
};

/* Memory this process owns and exports. */
struct ipc_mem {
  ipc_kind_t kind;
  void* ptr;
  size_t bytes;
  int fd;                     /* CUMEM: the exported descriptor, -1 when none */
  struct ipc_export* export_; /* CUMEM: its entry in the descriptor service */
};

_Static_assert(sizeof(((struct ipc_desc*)0)->u) == sizeof(cudaIpcMemHandle_t),
               "the cuMem and fabric descriptions fit in the legacy handle's room");

/* Another process's memory as mapped here. */
struct ipc_map {
  ipc_kind_t kind;
  void* ptr;
  size_t bytes;
};

/*
 * Process-wide state a communicator holds from init to destroy: the descriptor
 * service runs while anyone holds it. Fills the IPC fields of `me`
 * (ipc_service, ipc_cumem, ipc_pidfd, ipc_fabric, uid, net_ns, the visible
 * GPUs). Never fails: what
 * cannot be had is left out and reported by ipc_choose.
 */
void ipc_acquire(int cuda_dev, struct braid_peer_info* me);
void ipc_release(void);

/*
 * How `me` maps memory `owner` exports (both ends compute the same for the
 * pair). IPC_NONE when the two processes cannot share device memory; `why`
 * then says why and which setting would change it.
 */
ipc_kind_t ipc_choose(const struct braid_peer_info* me, const struct braid_peer_info* owner,
                      char* why, size_t why_size);

/*
 * The same for memory the application allocated (ncclMemAlloc: a descriptor handle, no fabric
 * handle): windows and registered buffers. Never IPC_FABRIC.
 */
ipc_kind_t ipc_choose_fd(const struct braid_peer_info* me, const struct braid_peer_info* owner,
                         char* why, size_t why_size);

/* Whether the process of `p` sees the GPU at PCI bus id `bus` (CUDA_VISIBLE_DEVICES). */
int ipc_sees_gpu(const struct braid_peer_info* p, int64_t bus);

/* Allocates `bytes` of the current device's memory, zeroed, exportable as `kind`; fills *desc. */
ncclResult_t ipc_mem_alloc(ipc_kind_t kind, int owner_rank, size_t bytes, struct ipc_mem* mem,
                           struct ipc_desc* desc);
/* Releases what ipc_mem_alloc made (safe on a zeroed or half-made ipc_mem). */
void ipc_mem_free(struct ipc_mem* mem);

/*
 * Maps `desc` (from rank desc->owner_rank) on the current device. `abort_flag`
 * (may be NULL) ends a wait for the owner's descriptor service early.
 */
ncclResult_t ipc_mem_map(const struct ipc_desc* desc, int my_rank, volatile uint32_t* abort_flag,
                         struct ipc_map* map);
void ipc_mem_unmap(struct ipc_map* map);

/*
 * ncclMemAlloc's memory: cuMem on the current device, mapped for every GPU of
 * the process that can reach it, exportable (NCCL_CUMEM_ENABLE=0, or no cuMem:
 * cudaMalloc). ipc_user_free releases either kind.
 */
ncclResult_t ipc_user_alloc(void** out, size_t bytes);
ncclResult_t ipc_user_free(void* ptr);

/*
 * The descriptor service's two ends, used by the above and by tests: offer
 * `fd` (kept open by the caller until it withdraws it) and fill the service
 * and token of `desc`; fetch the descriptor `desc` names from its owner's
 * service (a new descriptor, the caller's to close).
 */
ncclResult_t ipc_fd_offer(int fd, struct ipc_desc* desc, struct ipc_export** out);
void ipc_fd_withdraw(struct ipc_export* e);
ncclResult_t ipc_fd_fetch(const struct ipc_desc* desc, int my_rank, volatile uint32_t* abort_flag,
                          int* out_fd);
/*
 * Whether a descriptor offered by this process's service comes back through its socket (a
 * seccomp profile or security module may forbid passing descriptors); `why` says what failed.
 * Needs the service held (ipc_service_hold).
 */
int ipc_fd_socket_works(char* why, size_t why_size);

/* BRAID_IPC_FD_PASSING: how descriptors are fetched (auto: the socket, then pidfd_getfd). */
enum { IPC_PASS_AUTO = 0, IPC_PASS_SOCKET = 1, IPC_PASS_PIDFD = 2 };
int ipc_fd_passing(void);
/*
 * Whether this process may take other processes' descriptors with pidfd_getfd and have its own
 * taken, as far as it can tell alone: the kernel has the calls and no seccomp filter stops them
 * (tried on itself), kernel.yama.ptrace_scope is 0 (or 1-2 with CAP_SYS_PTRACE), it is dumpable,
 * and BRAID_IPC_FD_PASSING allows it. A security module or different groups can still refuse a
 * take (ipc_fd_fetch then fails, saying so). `why` says what is missing.
 */
int ipc_pidfd_usable(char* why, size_t why_size);
/*
 * The service's part of ipc_acquire (ipc_fd.c): one more holder, the service started by the
 * first. Returns its id, or 0 with `why` saying why there is none. ipc_release lets go.
 */
uint64_t ipc_service_hold(char* why, size_t why_size);

/*
 * Windows (symmetric memory): each rank's buffer, a cuMem allocation, is mapped whole at an
 * address of the mapper's choosing.
 * ipc_win_export describes the allocation holding `buff` (desc->ptr its start, desc->bytes its
 * size, desc->align its granularity, *offset where buff lies in it); `kind` IPC_LOCAL for
 * mappers of this process, IPC_CUMEM to offer a descriptor to other processes (released with
 * ipc_mem_free(keep), which leaves the memory itself alone).
 * ipc_map_at maps the allocation `desc` names at `va` (reserved with ipc_va_reserve, aligned
 * to desc->align) for this thread's device; ipc_unmap_at undoes it.
 */
ncclResult_t ipc_win_export(ipc_kind_t kind, void* buff, int owner_rank, struct ipc_mem* keep,
                            struct ipc_desc* desc, size_t* offset);
ncclResult_t ipc_va_reserve(size_t bytes, size_t align, void** va);
void ipc_va_release(void* va, size_t bytes);
ncclResult_t ipc_map_at(const struct ipc_desc* desc, void* va, int my_rank,
                        volatile uint32_t* abort_flag);
void ipc_unmap_at(void* va, size_t bytes);

/* For tests: exports whose descriptors the service still holds, in this process. */
int ipc_exports_live(void);

#endif
