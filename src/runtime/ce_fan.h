/*
 * The copy-engine all-gather of 3 to 8 ranks into registered buffers (ce_fan.c): each rank's
 * copy engine writes its part straight into every peer's registered output, one peer after
 * another, while a small kernel on the user's stream places the rank's own part and waits.
 */
#ifndef BRAID_CORE_CE_FAN_H
#define BRAID_CORE_CE_FAN_H

#include <cuda_runtime.h>
#include <stddef.h>

#include "abi/ce_args.h"
#include "nccl.h"

struct ncclComm;

/*
 * Whether an all-gather of `bytes` (nccl-tests' size: the whole output) may go the fan's way
 * on this communicator, before its buffers are looked at: 3 to BRAID_CE_FAN_MAX ranks that
 * all map each other's memory (one LSA team), BRAID_CE_FAN_MIN_BYTES <= bytes. Every rank
 * computes the same.
 */
int fan_candidate(const struct ncclComm* comm, size_t bytes);
/* Whether the fan is set up on every rank and the stream is not capturing. */
int fan_on(const struct ncclComm* comm, int capturing);
/* Whether setup was asked for (ce_want) and not done. */
int fan_pending(const struct ncclComm* comm);
/* How peers map this rank's registered buffers: IPC_LOCAL or IPC_CUMEM (set up only). */
int fan_ipc_kind(const struct ncclComm* comm);
/*
 * Setup, in three phases across communicators as the pair exchange's (ce.h): allocate the flag
 * page and send it to every peer; map every peer's and tell each whether that worked; learn
 * whether every rank's worked (the fan is on only then).
 */
ncclResult_t fan_setup(struct ncclComm* comm);
ncclResult_t fan_connect(struct ncclComm* comm);
ncclResult_t fan_agree(struct ncclComm* comm);

/* One all-gather: `bytes` of this rank's part, placed at rank * bytes of every output. */
struct fan_op {
  const void* send;
  void* recv;
  size_t bytes;
  char* peer_out[BRAID_CE_FAN_MAX]; /* each peer's output, mapped here (NULL: this rank) */
};
/* Enqueues it on `stream`; `ledger_seq`: the op ledger's number for the kernel (0: none). */
ncclResult_t fan_all_gather(struct ncclComm* comm, const struct fan_op* op, cudaStream_t stream,
                            uint64_t ledger_seq);
/* Blocks of the fan's kernel (the op ledger counts them). */
int fan_nblocks(void);
/*
 * An error when an all-gather failed half-way on this communicator: the ranks' operation
 * numbers no longer agree (the comm's async error says so too).
 */
ncclResult_t fan_check_intact(struct ncclComm* comm);
/* A group holding an all-gather failed before all of it went out (`res`): broken for good. */
void fan_fail(struct ncclComm* comm, ncclResult_t res);
/* Waits until this rank's queued copies are done (before a peer's buffers are unmapped). */
void fan_quiesce(struct ncclComm* comm);
/* Frees what setup made (after the comm's work is done). */
void fan_free(struct ncclComm* comm);

#endif
