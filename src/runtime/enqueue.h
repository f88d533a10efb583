/*
 * Turning a communicator's pending operations into kernel launches: choose
 * channels and chunk size per operation (through the tuning model), write
 * the work items, launch one kernel per run of compatible work on the
 * user's stream, and keep this communicator's kernels ordered across
 * streams.
 */
#ifndef BRAID_CORE_ENQUEUE_H
#define BRAID_CORE_ENQUEUE_H

#include "runtime/group.h"
#include "nccl.h"

struct ncclComm;

/* Marks the send/recv connections the pending operations need. */
void enqueue_p2p_needs(struct ncclComm* comm);
/* Plans and launches every pending operation of `comm`, then clears the list. */
ncclResult_t enqueue_launch(struct ncclComm* comm);
/*
 * What one checked operation becomes: itself, or with BRAID_DETERMINISTIC=1
 * on 3+ ranks an all-reduce becomes a reduce and a broadcast (enqueue.c says
 * why). Fills out[0..n) and returns n (1 or 2).
 */
int enqueue_expand(const struct ncclComm* comm, const struct braid_op* op, struct braid_op out[2]);

/*
 * The tuning model's time for `comm`'s pending operations, one after the
 * other, in microseconds (ncclGroupSimulateEnd). Launches nothing.
 */
ncclResult_t enqueue_estimate(struct ncclComm* comm, float* time_us);

#endif
