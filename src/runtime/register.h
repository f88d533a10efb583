/*
 * Buffer registration (ncclCommRegister); memory windows are window.h's.
 *
 * A registration records a device buffer with its communicator and hands back a handle that
 * ncclCommDeregister checks. With BRAID_CE_REG_MIN_BYTES >= 0 (default -1: off, as measured;
 * docs/tuning.md, BRAID_CE_REG_MIN_BYTES), registered buffers are used in place: on two ranks
 * joined by P2P, an all-reduce, reduce-scatter, all-gather or send/receive pair of at least that
 * size whose buffers both ranks registered (NCCL's rule: every rank or none, source and
 * destination) moves through the copy engines straight into the peer's registered buffer, no
 * scratch slot and no second copy (runtime/ce.c). Otherwise registered buffers go through the
 * FIFOs (or the scratch) like any other, as NCCL does where its zero-copy paths do not apply.
 * On 3 to 8 ranks that all map each other's memory, registered all-gathers from
 * BRAID_CE_FAN_MIN_BYTES go through the copy-engine fan instead (runtime/ce_fan.c): each rank's
 * copy engine writes its part into every peer's output.
 * A buffer in use in place cannot be deregistered until its operation is done.
 *
 * Each such operation costs one message each way between two ranks' hosts (between every pair,
 * on more ranks) at group end: each says where the peer's data may land in its memory (the cuMem
 * allocation, exported once per registration through the descriptor service, and the offset),
 * or why it may not (not registered, not cuMem memory, overlapping what it sends). Every rank
 * then decides alike: in place when all may. A peer's allocation is mapped at its first use and kept until that peer
 * deregisters something (its messages count deregistrations) or the communicator goes.
 */
#ifndef BRAID_CORE_REGISTER_H
#define BRAID_CORE_REGISTER_H

#include <stddef.h>

#include <cuda_runtime.h>

#include "nccl.h"

struct ncclComm;
struct braid_op;

/*
 * One operation that may land in place, as the enqueue module sees it: `land` (land_bytes)
 * is where the peer's data would land in this rank's memory; `send` and `own` what this rank
 * reads (its data for the peer; its own contribution or copy). `send_op` carries the send
 * (gets reg_peer_out), `recv_op` the receive (the same op for a collective). Every rank lists
 * its operations in the same order.
 */
struct reg_want {
  struct braid_op* send_op;
  struct braid_op* recv_op;
  void* land;
  size_t land_bytes;
  const void* send;
  size_t send_bytes;
  const void* own;
  size_t own_bytes;
  const void* in_place; /* where `send` may lie inside `land` (an all-gather's own part), or NULL */
};

/*
 * Whether `comm` may use registered buffers at all: two ranks joined by P2P and the setting, or
 * 3 to 8 ranks of one LSA team and the fan's setting.
 */
int register_possible(const struct ncclComm* comm);
/* Whether [ptr, ptr + bytes) lies in one registration of `comm`. */
int register_covers(struct ncclComm* comm, const void* ptr, size_t bytes);
/* Forgets the operations of a group that did not get to its exchange. */
void register_wants_clear(struct ncclComm* comm);
/* Adds an operation for the next exchange (enqueue_reg_needs); 0 when out of memory (skipped). */
int register_want(struct ncclComm* comm, const struct reg_want* w);
/* Whether operations wait for the exchange. */
int register_pending(const struct ncclComm* comm);
/*
 * The exchange, in two phases across communicators (group.c, after the copy engines are set
 * up): send this rank's word on each operation; then receive the peer's, map what it offers
 * and mark the operations that go in place (reg_peer_out / reg_direct of struct braid_op).
 */
ncclResult_t register_offer(struct ncclComm* comm);
ncclResult_t register_accept(struct ncclComm* comm);
/* After the group's launch on `stream`: the registrations it used in place are busy until then. */
void register_mark_used(struct ncclComm* comm, cudaStream_t stream);
/* Frees every registration left on `comm` (at destroy; NCCL releases them there too). */
void register_free_all(struct ncclComm* comm);
/* Unmaps the peers' allocations mapped here (at destroy, once the comm's work is done). */
void register_unmap_all(struct ncclComm* comm);

#endif
