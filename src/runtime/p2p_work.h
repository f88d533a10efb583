/*
 * The works of send/recv: the order in which a group's messages go (the schedule, alike on
 * both ends of every message), how many channels a message spreads over, where they start,
 * and whether it goes with LL; every choice from what both ends of the message share, so the
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

/*
 * The group's sends and receives in the order every rank walks them, in pairs that run in one
 * work: its self messages (d = 0); then, where p2p_alltoall_pairwise, the all-to-alls' rounds
 * (d = k: the send to the round's partner and the receive from it); then the shift rounds
 * d = 1 .. nranks - 1 (the send to rank + d and the receive from rank - d; all-to-all messages
 * not among them where they had their own rounds). `fn` gets each pair, s or r NULL where one
 * side has fewer messages, with its round's d (p2p_work_pair's channel key, alike on both ends)
 * and its index among the pairs of its round and peers. A self-send without a self-receive of
 * its size is the caller's error (ncclInvalidUsage); an error from `fn` stops the walk.
 */
typedef ncclResult_t (*p2p_pair_fn)(void* ctx, const struct braid_op* s, const struct braid_op* r,
                                    int d, int index);
ncclResult_t p2p_schedule(const struct braid_group_comm* g, int rank, int nranks, p2p_pair_fn fn,
                          void* ctx);

/* The index-th pending send to `peer` (is_send) or receive from it, of any kind, or NULL. */
const struct braid_op* p2p_find(const struct braid_group_comm* g, int peer, int is_send, int index);

#endif
