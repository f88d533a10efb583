/*
 * Transports: how one end of a connection (channel c, peer p, send or
 * receive) gets the memory the kernels use. A transport is an ops table; the
 * network transport of a later layer plugs in with the same table.
 *
 * Connecting is two-sided and the same for every transport:
 *   1. each end runs its setup (send_setup / recv_setup), which allocates
 *      what it owns and writes a braid_conn_info for the other end;
 *   2. the ends swap their infos through the bootstrap;
 *   3. each end runs its connect (send_connect / recv_connect) with the
 *      peer's info and fills the braid_dev_conn the kernels read.
 * Ownership rule (see dev_comm.h): the FIFO's memory belongs to the
 * receiver; the sender only maps it. So p2p and shm do their allocation in
 * recv_setup and their mapping in send_connect.
 *
 * The channels module owns every connector; a transport owns what it hangs
 * on `connector->state` and releases it in its free slot.
 */
#ifndef BRAID_TRANSPORT_TRANSPORT_H
#define BRAID_TRANSPORT_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "collectives/device/dev_comm.h"
#include "nccl.h"

struct ncclComm;
struct braid_peer_info;

/* What one end tells the other, opaque to everyone but the transport. */
#define BRAID_CONN_INFO_BYTES 256
struct braid_conn_info {
  char data[BRAID_CONN_INFO_BYTES];
};

/* One end of a connection, host side. */
struct braid_connector {
  const struct braid_transport_ops* transport; /* NULL until set up */
  void* state;                                 /* the transport's, freed by its free slot */
  struct braid_dev_conn dev;                   /* what the kernels get (filled by connect) */
  int peer;
  int channel;
  int is_send;
  size_t buff_bytes;                           /* FIFO size requested (all BRAID_STEPS slots) */
  /* Connecting (transport.c): 0 to do, 1 info sent, 2 answer read, 3 connected. */
  int phase;
  int setup_tag;                       /* the bootstrap tag of the info this end sent */
  const struct braid_connector* offer; /* phases 1-2: the parent's end it offered to borrow */
  struct conn_msg* answer;             /* phase 2: the peer's message */
  int borrowed;                        /* `dev` is a parent's connection (core/share.h):
                                          nothing here to free */
  uint64_t* step_home;                 /* borrowed: where its step lives, the first lender's
                                          step word (device memory; dev_comm.h) */
  int lendable;                        /* (atomic) the kernels have it: a child may borrow */
};

struct braid_transport_ops {
  size_t size;      /* sizeof(struct braid_transport_ops): tables only grow by appending */
  const char* name; /* "P2P", "SHM", "NET" */
  /* Sets *ok when this transport can connect `me` and `peer` (both ends must agree). */
  ncclResult_t (*can_connect)(struct ncclComm* comm, const struct braid_peer_info* me,
                              const struct braid_peer_info* peer, int* ok);
  /* Sender side: prepare; write what the receiver needs into *info. */
  ncclResult_t (*send_setup)(struct ncclComm* comm, struct braid_connector* conn,
                             struct braid_conn_info* info);
  /* Receiver side: allocate the FIFO; write what the sender needs to map it into *info. */
  ncclResult_t (*recv_setup)(struct ncclComm* comm, struct braid_connector* conn,
                             struct braid_conn_info* info);
  /* Sender side: map the receiver's FIFO from its info; fill conn->dev. */
  ncclResult_t (*send_connect)(struct ncclComm* comm, struct braid_connector* conn,
                               const struct braid_conn_info* peer_info);
  /* Receiver side: finish with the sender's info; fill conn->dev. */
  ncclResult_t (*recv_connect)(struct ncclComm* comm, struct braid_connector* conn,
                               const struct braid_conn_info* peer_info);
  /* Releases conn->state and everything the end allocated or mapped; safe after a failed setup. */
  ncclResult_t (*free)(struct braid_connector* conn);
};

/*
 * The FIFO layout of the transports whose receiver owns plain memory (p2p,
 * shm): the tail and head counters on their own 128-byte lines, the Simple
 * slots, the LL slots, then (p2p only: `ll128`) the LL128 slots. All of it
 * must start zeroed (flags of 0 never match a step's flag). LL128 lines must
 * not straddle 128-byte boundaries: the allocation is 256-byte aligned and
 * every offset before them is a multiple of 128 (buff_bytes is rounded to
 * BRAID_STEPS * 128 bytes).
 */
#define BRAID_FIFO_TAIL_OFFSET 0
#define BRAID_FIFO_HEAD_OFFSET 128
#define BRAID_FIFO_BUFF_OFFSET 256
/* Bytes of one LL128 slot (BRAID_LL128_BUFFSIZE / BRAID_STEPS, whole lines, 4 KiB to 4 MiB). */
size_t transport_ll128_slot_bytes(void);
static inline size_t transport_fifo_bytes(const struct braid_connector* conn, int ll128) {
  return BRAID_FIFO_BUFF_OFFSET + conn->buff_bytes + BRAID_LL_BYTES +
         (ll128 ? BRAID_STEPS * transport_ll128_slot_bytes() : 0);
}
/* Fills conn->dev for a FIFO of the layout above at `base` (an address the kernels can use). */
void transport_fifo_fill_dev(struct braid_connector* conn, char* base, int ll128);

extern const struct braid_transport_ops braid_transport_p2p;
extern const struct braid_transport_ops braid_transport_shm;
extern const struct braid_transport_ops braid_transport_net; /* between hosts (net.c) */

/*
 * The channels of a communicator: rings and their connections, plus lazily
 * made send/recv connections per peer. Owned by the comm (comm->channels).
 */
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
ncclResult_t transport_rings_connect(struct ncclComm* comm);

/* Marks the send/recv connections a group needs. Connected later by transport_p2p_connect. */
void transport_p2p_need(struct ncclComm* comm, int peer, int is_send, int nchannels);
/* The same for one channel `c` only (tree edges differ from channel to channel). */
void transport_p2p_need_channel(struct ncclComm* comm, int peer, int is_send, int c);
/* Bytes per slot of every send/recv connection (BRAID_P2P_BUFFSIZE / BRAID_STEPS). */
uint32_t transport_p2p_slot_bytes(void);
/* Whether connections are marked and not yet connected (nothing to do otherwise). */
int transport_p2p_pending(const struct ncclComm* comm);
/* Phase 1 of connecting what was marked: set up local ends and send infos to peers. */
ncclResult_t transport_p2p_setup(struct ncclComm* comm);
/* Phase 2: read the peers' answers (core/share.h: offers to borrow a parent's connection). */
ncclResult_t transport_p2p_answer(struct ncclComm* comm);
/* Phase 3: connect, or borrow, and upload. */
ncclResult_t transport_p2p_connect(struct ncclComm* comm);

/* Frees every connection and the channels struct. */
void transport_channels_free(struct ncclComm* comm);
/* The same for a channels struct of `nranks` ranks that no comm holds (core/share.c). */
void transport_channels_release(struct braid_channels* ch, int nranks);
/* Frees the connections no other comm can borrow (all but P2P and SHM); keeps the rest. */
void transport_channels_keep_lendable(struct braid_channels* ch, int nranks);

#endif
