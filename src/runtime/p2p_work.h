/*
 * The works of send/recv: how many channels a message spreads over, where they start, and
 * whether it goes with LL; every choice from what both ends of the message share, so the
 * sender's and the receiver's kernels agree.
 */
#ifndef BRAID_CORE_P2P_WORK_H
#define BRAID_CORE_P2P_WORK_H

#include "abi/dev_comm.h"
#include "runtime/group.h"
#include "nccl.h"

struct ncclComm;

/*
 * The works of the send s to rank + d and the receive r from rank - d (either may be NULL;
 * d == 0: a rank's exchange with itself): *nw of them in w, in the order the kernel must run
 * them; none for empty messages only.
 */
ncclResult_t p2p_work_pair(struct ncclComm* comm, const struct braid_op* s,
                           const struct braid_op* r, int d, struct braid_work w[2], int* nw);

/*
 * The all-to-all's pairwise rounds (nranks even, at least 4): the rank that `rank` exchanges
 * with in round k, 1 <= k < nranks. Every round pairs all ranks off (the partner's partner is
 * `rank`), and over the rounds every rank meets every other once. In a round both ranks of a
 * pair send to each other, so the message to a peer and the one coming back from it, which in
 * place share a block of the buffer, run in one work (sendrecv.h orders them there).
 */
int p2p_alltoall_partner(int rank, int nranks, int k);

/* Whether a communicator of nranks runs its all-to-alls in those rounds (nranks even, >= 4). */
static inline int p2p_alltoall_pairwise(int nranks) { return nranks >= 4 && nranks % 2 == 0; }

#endif
