/*
 * Families: a communicator and the children split or shrunk from it with
 * splitShare/shrinkShare (NCCL_COMM_SPLIT_SHARE_RESOURCES), which share its
 * connections. What a family holds in common:
 *   - the connections: a child's ring or send/recv connection whose two ends
 *     both find the parent's connection between the same two GPUs on the same
 *     channel (P2P or SHM) borrows it instead of making its own FIFO
 *     (transport.c); the step counter stays the lender's word (dev_comm.h);
 *   - the order of kernels (one launch event, dev_state.h), since two
 *     kernels on one connection must not run at once; a family's groups
 *     launch one at a time (share_lock);
 *   - aborts, as NCCL's shared abort flag: aborting (or stopping) one member
 *     raises every member's flag, so every member's kernels stop, and the
 *     others then fail with a message (share_break). Each member keeps its
 *     own flag: one raised before its join is never lost to a swap.
 * Members must issue their operations in the same order on every rank (as
 * with NCCL): the shared connections see one stream of steps. With
 * NCCL_GRAPH_MIXING_SUPPORT=0 graph replays are not ordered against eager
 * launches, so a family must not mix them (a borrower's kernel writes back
 * every borrowed step of its channels, used or not: dev_comm.h).
 *
 * Lifetime: a member leaving while others remain keeps its connections and
 * device state (their step words) in the family (it may be a lender); the
 * last member to leave frees them all.
 */
#ifndef BRAID_CORE_SHARE_H
#define BRAID_CORE_SHARE_H

#include <pthread.h>

#include "runtime/dev_state.h"
#include "nccl.h"

struct ncclComm;
struct braid_connector;
struct share_grave;

struct braid_share {
  pthread_mutex_t lock;         /* the launch order: held across a member's launches */
  pthread_mutex_t members_lock; /* members, graves, broken: never held across a launch or a
                                   connection (only members' own locks nest in it), so an
                                   abort (share_break) always gets through */
  int nmembers;
  int cap;
  struct ncclComm** members; /* the live members */
  struct braid_launch_order order;
  struct share_grave* graves;    /* what members that left keep for the others */
  int broken; /* (atomic) a member was aborted or stopped: the connections are spoilt */
};

/*
 * What a sharing child may borrow: its parent's connections as the parent's
 * kernels keep them. Valid until the family ends (the parent's part of it
 * stays in the family when the parent goes first).
 */
struct braid_lender {
  const struct braid_channels* ch;     /* the parent's connectors */
  struct braid_dev_comm* dev_comm;     /* device address of the parent's braid_dev_comm */
  struct braid_dev_conn* dev_p2p_send; /* device addresses of its send/recv connections */
  struct braid_dev_conn* dev_p2p_recv;
  int nranks;       /* the parent's */
  int* parent_rank; /* [child nranks]: each child rank's rank in the parent */
};

/* A family of one, for a communicator about to get its device state. */
ncclResult_t share_create(struct ncclComm* comm);
/*
 * Before `child`'s init: it joins `parent`'s family (and its aborts) when
 * its config asks for sharing and the parent can lend; `members`
 * maps child ranks to parent ranks. Otherwise nothing (said at INFO).
 */
ncclResult_t share_join(struct ncclComm* child, struct ncclComm* parent, const int* members,
                        int nmembers, int shrink);
/*
 * The parent's connector this child's end (ring when `ring`, else send/recv;
 * peer and channel as in `conn`) may borrow, or NULL: only P2P/SHM
 * connections to the same GPU on the same channel, fully set up on this side.
 */
const struct braid_connector* share_lender_conn(const struct ncclComm* comm,
                                                const struct braid_connector* conn, int ring);
/* Makes `conn` the borrower of `lender` (share_lender_conn's answer). */
void share_borrow(const struct ncclComm* comm, struct braid_connector* conn,
                  const struct braid_connector* lender, int ring);
/* Launches of one member at a time. */
void share_lock(struct ncclComm* comm);
void share_unlock(struct ncclComm* comm);
/*
 * `comm` was aborted or stopped mid-operation (abort, revoke, a group left
 * half launched): every other member's abort flag goes up, and it fails with
 * ncclRemoteError naming `comm`; the family shares no more. Any thread.
 */
void share_break(struct ncclComm* comm, const char* why);
/*
 * Out of the family, before the comm's device state and channels are freed:
 * while other members remain, what they may borrow moves into the family
 * (the comm's pointers to it are cleared). The last member gets the family
 * back, to share_free once everything of its own is freed.
 */
struct braid_share* share_leave(struct ncclComm* comm);
void share_free(struct braid_share* sh);

#endif
