/*
 * Symmetric memory windows (ncclCommWindowRegister) and the device API's
 * communicator (ncclDevCommCreate, nccl_device.h), with the teams both use.
 *
 * The LSA team ("load/store accessible") is a block of consecutive ranks of
 * one host whose GPUs are close enough for P2P (NCCL_P2P_LEVEL) and whose
 * processes can share cuMem memory; its size is the same everywhere (the
 * greatest common divisor of the hosts' runs of ranks), or 1. A window maps every member's buffer in every member's
 * address space at one stride (abi/dev_api.h); the kernels that programs
 * compile from NCCL's headers then load and store peers' memory directly.
 *
 * Registration is collective over the communicator: each rank offers its
 * buffer (a cuMem allocation, as ncclMemAlloc makes), all ranks learn every
 * offer through the bootstrap, each maps its team's, and a second exchange
 * makes every rank fail together when any rank could not. Deregistration and
 * ncclDevCommDestroy are local: a mapping holds its memory until it goes, so
 * a peer that deregisters first takes nothing from the others.
 */
#ifndef BRAID_RUNTIME_WINDOW_H
#define BRAID_RUNTIME_WINDOW_H

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

struct ncclComm;

/* This rank's LSA team: its size and this rank's place in it (computed once per comm). */
void window_lsa(struct ncclComm* comm, int* size, int* rank);

/*
 * Where a window maps its team's buffers. Member i's allocation (`bytes`
 * from its start, granule `align`, the buffer `offset` into it) is mapped
 * whole at base + i * stride - offset, base = reservation + lead: cuMem maps
 * allocations from their start, so the part before the buffer lies below the
 * member's slot; `lead` leaves room for the largest such part and keeps every
 * mapping on its granule, which needs the offsets to agree modulo the
 * granule. The stride is a multiple of 4 GiB. Fails with a message naming
 * the member whose offset disagrees.
 */
struct window_part {
  size_t offset, bytes, align;
};
ncclResult_t window_layout(const struct window_part* parts, int n, size_t* gran, size_t* lead,
                           size_t* stride);

/*
 * Where an all-reduce's input of `bytes` at `ptr` lies in a window that every rank registered
 * with NCCL_WIN_COLL_SYMMETRIC and one size (the caller promises, as NCCL's users do, the same
 * offset in it on every rank), and the comm has the symmetric all-reduce's sync window (its LSA
 * team is the whole comm): its address in the window's flat mapping as rank 0's, the strides
 * (in units of 4 GiB) and rank 0's sync words (device/sym.h). 1 if so, else 0.
 */
struct window_sym {
  char* input;
  uint32_t stride4g;
  char* sync;
  uint32_t sync_stride4g;
};
int window_sym_input(struct ncclComm* comm, const void* ptr, size_t bytes,
                     struct window_sym* out);
/*
 * The comm's sync window alone, for the one-shot all-reduce of buffers in no window (its input
 * is read only by its own rank): out->sync and out->sync_stride4g set, out->input NULL,
 * out->stride4g 0. 1 if the comm has one, else 0.
 */
int window_sync(struct ncclComm* comm, struct window_sym* out);
/*
 * At init, once the peers, the topology and the connections are there (every rank calls it at
 * the same point): where BRAID_ONESHOT_MAX_BYTES > 0 and the whole comm of 3 or more ranks is
 * one LSA team, makes the sync window the one-shot all-reduce pushes through. Collective; a
 * failure (on any rank: all ranks learn it) leaves the comm without it, said at INFO.
 */
void window_oneshot_prepare(struct ncclComm* comm);

/* Frees every window and device communicator left on `comm` (at destroy, as NCCL). */
void window_free_all(struct ncclComm* comm);
/*
 * The same for a teardown whose kernels did not exit: the host records go, while the device
 * records, the window table, the mappings and their address ranges stay (freeing them could
 * wait for those kernels, which may still read them). Returns the bytes of device memory kept
 * (the windows' buffers themselves are the caller's).
 */
size_t window_keep_all(struct ncclComm* comm);

#endif
