/*
 * What the host hands the kernels: the communicator's device-side state
 * (channels, rings, connections) and the work items of one launch. Plain C,
 * included by the host planner and by the CUDA kernels, so both agree on
 * every offset.
 *
 * Connections. A connection is a FIFO of BRAID_STEPS slots from a sender to
 * a receiver. All of its memory belongs to the receiver: the slots, the
 * `tail` counter (steps the sender has filled; written by the sender) and the
 * `head` counter (steps the receiver has drained; written by the receiver,
 * read by the sender). Keeping everything on the receiver's side means that
 * once a rank's last kernel has finished, no peer will ever write into its
 * memory again (every write a peer makes is one the receiver waited for), so
 * a communicator can free its buffers at destroy without a barrier with its
 * peers. The sender caches the head it last saw and only reads the remote
 * counter when the FIFO looks full, so the remote read costs nothing while
 * the pipeline flows.
 *
 * Both ends keep their own `step` (the next step to fill or drain) in device
 * memory, so it survives from one kernel to the next. A connection a split
 * child shares with its parent (splitShare) has one true step word, the
 * lender's; the borrower's kernels copy it into their own word as they start
 * and back as they end (struct braid_borrows), and the family's kernels run
 * one after another (runtime/share.c), so the word is never used by two kernels
 * at once. The steps of every other connection cost nothing for it.
 */
#ifndef BRAID_DEVICE_DEV_COMM_H
#define BRAID_DEVICE_DEV_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "abi/coll.h"

#ifdef __cplusplus
extern "C" {
#endif

struct braid_dev_conn {
  char* buff;          /* BRAID_STEPS slots of slot_bytes, in the receiver's memory */
  char* ll_buff;       /* BRAID_STEPS LL slots of ll_slot_bytes, or NULL: no LL on this link */
  uint64_t* tail;      /* steps filled (Simple): written by the sender */
  uint64_t* head;      /* steps drained (every protocol): written by the receiver */
  uint32_t* sizes;     /* sender, or NULL: bytes of each step, published before `tail` (net: the
                          proxy sends only those bytes, not the whole slot) */
  uint64_t step;       /* this end's next step (persists across kernels) */
  uint64_t seen_head;  /* sender: the head value it last read (saves a remote read per launch) */
  uint32_t slot_bytes; /* bytes per slot, a multiple of 16 */
  uint32_t ll_slot_bytes; /* bytes of LL lines per slot (half of it is data), a multiple of 16 */
  uint32_t connected;
  uint32_t ll128_slot_bytes; /* bytes of LL128 lines per slot, a multiple of 128 */
  char* ll128_buff;    /* BRAID_STEPS LL128 slots, or NULL: no LL128 on this link (not P2P) */
  uint32_t post_warp;  /* Simple: a warp of its own posts each step (BRAID_SIMPLE_POST_WARP) */
};

/*
 * The LL protocol. A line is 16 bytes: 8 bytes of data split in two 4-byte
 * halves, each followed by a 4-byte flag, written with one 16-byte store, so
 * a receiver that sees both flags equal to the step's flag sees the data too,
 * without a fence or a tail counter. Steps and `head` are shared with the
 * Simple protocol: step s uses slot s % BRAID_STEPS of whichever buffer its
 * protocol owns, and `head` frees the slot for step s + BRAID_STEPS either
 * way, so the protocols can alternate from one operation to the next.
 */
#define BRAID_LL_SLOT_BYTES (32 << 10)       /* lines per slot: 2048, carrying 16 KiB */
#define BRAID_LL_BYTES (BRAID_STEPS * BRAID_LL_SLOT_BYTES)
#define BRAID_LL_FLAG(step) ((uint32_t)((step) + 1))

/*
 * The LL128 protocol. A line is 128 bytes: 15 words (8 bytes) of data, then
 * an 8-byte flag, written by 8 threads of one warp with one 16-byte store
 * each (the eighth carries the last word and the flag). NVLink delivers a
 * warp's 128-byte store whole, so a receiver that sees the flag sees the
 * line, with 120 of every 128 bytes carrying data. That holds on NVLink
 * only (as NCCL relies on it: sm70 and later): the P2P transport alone
 * provides LL128 slots, and the tuning model enables the protocol only where
 * the ring's links are NVLink. Steps and `head` are shared with the other
 * protocols, as LL's are.
 */
#define BRAID_LL128_LINE_BYTES 128
#define BRAID_LL128_LINE_WORDS 15            /* data words per line */
#define BRAID_LL128_SLOT_BYTES (64 << 10)    /* 512 lines per slot, carrying 60 KiB */
#define BRAID_LL128_SLOT_DATA \
  (BRAID_LL128_SLOT_BYTES / BRAID_LL128_LINE_BYTES * BRAID_LL128_LINE_WORDS * 8)
#define BRAID_LL128_BYTES (BRAID_STEPS * BRAID_LL128_SLOT_BYTES)
#define BRAID_LL128_FLAG(step) ((uint64_t)(step) + 1)

struct braid_dev_channel {
  int ring_prev;
  int ring_next;
  int ring_index;                   /* my position in this channel's ring */
  int* ring_ranks;                  /* [nranks] the ring starting at me: ring_ranks[0] = rank */
  struct braid_dev_conn ring_send;  /* to ring_next */
  struct braid_dev_conn ring_recv;  /* from ring_prev */
  struct braid_dev_conn* p2p_send;  /* [nranks] per destination peer */
  struct braid_dev_conn* p2p_recv;  /* [nranks] per source peer */
  /* This rank in the channel's tree (-1 = none); its edges use the p2p connections above. */
  int tree_up;
  int tree_down[3];
};

struct braid_dev_comm {
  int rank;
  int nranks;
  int nchannels;
  volatile uint32_t* abort_flag; /* host-mapped; nonzero: every wait loop returns */
  struct braid_dev_channel channels[BRAID_MAX_CHANNELS];
  /*
   * The op ledger (runtime/watchdog.c): each block of a launch that carries a
   * sequence number writes it here, at its block index, once through. A
   * comm's launches run one after another, so a launch of `grid` blocks is
   * complete when the first `grid` words have reached its number.
   */
  uint64_t ledger_done[BRAID_MAX_GRID];
  /*
   * Graph replays, which the ledger does not follow (their arguments are fixed at capture):
   * one word per block, its high half the capture id of the launch the block is in (0: none),
   * its low half the block's clock when it last left one. A block of a captured launch writes
   * the high half as it starts, and the whole word (id 0, the clock) when through. The watchdog
   * reads them: a block whose id stays set while no low half moves is stuck in that launch.
   */
  struct braid_graph_words {
    uint64_t word[BRAID_MAX_GRID];
  } graph;
#define BRAID_GRAPH_LIVE(word) ((uint32_t)((word) >> 32))
#define BRAID_GRAPH_ENDED(word) ((uint32_t)(word))
};

/* Reduction operators as the device runs them (ncclAvg becomes one of the last two). */
typedef enum {
  BRAID_DEVOP_SUM = 0,
  BRAID_DEVOP_PROD = 1,
  BRAID_DEVOP_MAX = 2,
  BRAID_DEVOP_MIN = 3,
  BRAID_DEVOP_PREMULSUM = 4,  /* sum of scalar * input; also ncclAvg on floating types */
  BRAID_DEVOP_SUMPOSTDIV = 5, /* sum, then divide by nranks; ncclAvg on integer types */
  BRAID_DEVOP_COUNT = 6
} braid_devop_t;

/* Work flags. */
#define BRAID_WORK_SCALAR_DEVICE 0x1 /* `scalar` is a device pointer to the premul scalar */
#define BRAID_WORK_SEND_LL 0x2       /* SendRecv: the send half uses LL (else Simple) */
#define BRAID_WORK_RECV_LL 0x4       /* SendRecv: the receive half uses LL (else Simple) */
#define BRAID_WORK_PAIR 0x8 /* 2 ranks: AllReduce (Simple, LL128), AllGather (Simple): pair.h */
#define BRAID_WORK_SYM 0x10 /* AllReduce read from a symmetric window (sym.h; algo DIRECT) */
/* Output bytes a block of the symmetric all-reduce holds per round (sym.h: shared memory). */
#define BRAID_SYM_ROUND_BYTES 16384
/*
 * The symmetric all-reduce's LL variant (sym.h: each rank pushes its input to every peer as
 * LL lines, no meeting): output bytes a block moves, the most blocks it runs on (so inputs up
 * to BRAID_SYM_LL_BYTES * BRAID_SYM_LL_GRID take it, fewer where the comm has fewer channels),
 * and where its slots lie in a rank's sync memory: after the inboxes and epochs, per block,
 * per epoch parity and per sending rank, one slot of BRAID_SYM_LL_SLOT bytes.
 */
#define BRAID_SYM_LL_BYTES 4096
#define BRAID_SYM_LL_GRID 32
#define BRAID_SYM_LL_SLOT (2 * BRAID_SYM_LL_BYTES)
#define BRAID_SYM_LL_OFFSET(n) \
  ((((size_t)BRAID_MAX_GRID * ((size_t)(n) + 1) * sizeof(uint32_t)) + 15) & ~(size_t)15)
/* A rank's sync memory for a team of n ranks (runtime/window.c makes it, zeroed). */
#define BRAID_SYM_SYNC_BYTES(n) \
  (BRAID_SYM_LL_OFFSET(n) + (size_t)BRAID_SYM_LL_GRID * 2 * (size_t)(n) * BRAID_SYM_LL_SLOT)

/*
 * One operation of a launch. Collectives: every block b with
 * channel_lo <= b < channel_lo + nchannels takes its share. Send/recv: a
 * work pairs at most one send (to `peer_send`) with one receive (from
 * `peer_recv`); the two halves of the block run them concurrently, which is
 * what lets matching sends and receives of a group make progress together.
 */
struct braid_work {
  uint8_t coll;        /* braid_coll_t */
  uint8_t devop;       /* braid_devop_t */
  uint8_t dtype;       /* ncclDataType_t */
  uint8_t proto;       /* braid_proto_t */
  uint8_t algo;        /* braid_algo_t */
  uint8_t channel_lo;
  uint8_t nchannels;   /* blocks that take part: channel_lo .. channel_lo + nchannels - 1 */
  uint8_t flags;
  uint8_t nch_send;    /* SendRecv: channels the send is split over */
  uint8_t nch_recv;    /* SendRecv: channels the receive is split over */
  uint16_t pad;
  int32_t root;        /* rank for Broadcast/Reduce */
  int32_t peer_send;   /* SendRecv: destination, -1 when none */
  int32_t peer_recv;   /* SendRecv: source, -1 when none */
  uint32_t chunk_bytes;/* bytes per pipeline step, a multiple of 16 */
  const void* sendbuff;
  void* recvbuff;
  size_t count;        /* elements: total (AllReduce, Broadcast, Reduce), per rank (AllGather,
                          ReduceScatter), sent (SendRecv) */
  size_t recv_count;   /* SendRecv: elements received */
  uint64_t scalar;     /* PREMULSUM: the scalar's bits (host value) or a device pointer */
};

#define BRAID_MAX_WORK 48

/*
 * The connections a split child borrows (splitShare; runtime/share.c), by channel: each one's own
 * step word, which its kernels use, and the lender's, where the step lives between kernels.
 * A kernel with a table copies its channel's lenders' words into its own as it starts and back
 * as it ends. Pairs are only ever appended (a pair first, then its channel's count), so a
 * kernel still running when one comes sees either the old count or the new, whole pair.
 */
struct braid_borrow {
  uint64_t* own;
  uint64_t* home;
};

struct braid_borrows {
  uint32_t count[BRAID_MAX_CHANNELS]; /* pairs in use of each channel */
  uint32_t per_channel;               /* room for pairs per channel */
  uint32_t pad;
  /* then the pairs (BRAID_BORROW_PAIRS): channel c's at [c * per_channel, + count[c]) */
};
#define BRAID_BORROW_PAIRS(b) ((struct braid_borrow*)((b) + 1))

struct braid_kernel_args {
  struct braid_dev_comm* comm;
  const struct braid_borrows* borrows; /* NULL: the comm borrows no connection */
  int nwork;
  uint32_t graph_op;   /* a captured launch: its id in the watchdog's capture table; 0: eager */
  uint64_t ledger_seq; /* written to comm->ledger_done[block] by every block once through; 0: not */
  uint32_t borrows_per; /* borrows->per_channel (no load to wait for) */
  uint32_t pad;
  struct braid_work work[BRAID_MAX_WORK];
};

#ifdef __cplusplus
}
#endif

#endif
