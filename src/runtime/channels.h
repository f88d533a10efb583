/*
 * The channels of a communicator: its rings and their connections, plus the
 * send/recv connections made per peer the first time a group needs them.
 * Owned by the comm (comm->channels); every connector in it is set up and
 * freed here, through the transports' ops tables (transport/transport.h).
 */
#ifndef BRAID_RUNTIME_CHANNELS_H
#define BRAID_RUNTIME_CHANNELS_H

#include "transport/transport.h"

struct ncclComm;

struct braid_channels {
  int nchannels;     /* ring channels */
  int p2p_nchannels; /* channels send/recv may spread over */
  int ll_ok;         /* every ring connection has LL slots */
  int ll128_ok;      /* every ring connection has LL128 slots (P2P) */
  int p2p_marked;    /* send/recv connections marked and not yet connected */
  struct braid_connector ring_send[BRAID_MAX_CHANNELS];
  struct braid_connector ring_recv[BRAID_MAX_CHANNELS];
  struct braid_connector* p2p_send; /* [BRAID_MAX_CHANNELS * nranks] */
  struct braid_connector* p2p_recv;
  int* ring_ranks_host;             /* [nchannels * nranks], ring order starting at this rank */
};

/* Builds the ring connections of every channel; collective over the comm. */
ncclResult_t channels_rings_connect(struct ncclComm* comm);

/* Marks the send/recv connections a group needs. Connected later by channels_p2p_connect. */
void channels_p2p_need(struct ncclComm* comm, int peer, int is_send, int nchannels);
/* The same for one channel `c` only (tree edges differ from channel to channel). */
void channels_p2p_need_channel(struct ncclComm* comm, int peer, int is_send, int c);
/* Whether connections are marked and not yet connected (nothing to do otherwise). */
int channels_p2p_pending(const struct ncclComm* comm);
/* Phase 1 of connecting what was marked: set up local ends and send infos to peers. */
ncclResult_t channels_p2p_setup(struct ncclComm* comm);
/* Phase 2: read the peers' answers (runtime/share.h: offers to borrow a parent's connection). */
ncclResult_t channels_p2p_answer(struct ncclComm* comm);
/* Phase 3: connect, or borrow, and upload. */
ncclResult_t channels_p2p_connect(struct ncclComm* comm);

/* Frees every connection and the channels struct. */
void channels_free(struct ncclComm* comm);
/*
 * channels_free for a teardown whose kernels did not exit: every transport keeps the memory
 * the kernels may touch (transport.h: braid_connector.kept) and adds its bytes to *kept.
 */
void channels_free_keeping(struct ncclComm* comm, size_t* kept);
/* The same for a channels struct of `nranks` ranks that no comm holds (runtime/share.c). */
void channels_release(struct braid_channels* ch, int nranks);
/* Frees the connections no other comm can borrow (all but P2P and SHM); keeps the rest. */
void channels_keep_lendable(struct braid_channels* ch, int nranks);

#endif
