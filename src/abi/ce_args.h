/*
 * What the host hands the copy-engine exchange's kernel (runtime/ce.c says how
 * the exchange goes). Plain C, shared by the host and the kernel.
 */
#ifndef BRAID_DEVICE_CE_ARGS_H
#define BRAID_DEVICE_CE_ARGS_H

#include <stdint.h>

#include "abi/dev_comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Threads per block of the exchange's kernel (its blocks: BRAID_CE_NBLOCKS, runtime/ce.c). */
#define BRAID_CE_THREADS 512
/* Most scratch slots a communicator may have (the flag words are sized by it). */
#define BRAID_CE_MAX_SLOTS 16

/*
 * The words of a rank's flag page (the first BRAID_CE_FLAGS_BYTES of its
 * scratch allocation). Sequence numbers count chunks over the communicator's
 * life; chunk g uses slot g % nslots; a word holds the last chunk + 1.
 */
struct braid_ce_flags {
  uint32_t arrived[BRAID_CE_MAX_SLOTS]; /* written by the peer's copy stream: chunk g is in slot */
  uint32_t freed[BRAID_CE_MAX_SLOTS];   /* written by the peer's kernel: it is done with its slot */
  uint32_t sent[2];                     /* written by this rank's copy streams: chunk g copied out
                                           (chunk g goes on stream g % 2) */
  uint32_t ready;                       /* written by the peer's kernel: its landing operations
                                           begun (this rank may copy straight into its buffer) */
  uint32_t pad[13];
  uint32_t done[BRAID_CE_MAX_SLOTS];    /* this rank's kernel: blocks through the slot's chunk */
};
#define BRAID_CE_FLAGS_BYTES 4096

/* How the kernel treats what arrives. */
enum braid_ce_mode {
  BRAID_CE_REDUCE = 0, /* out = op(rank 0's value, rank 1's value), own being this rank's */
  BRAID_CE_COPY = 1    /* out = the peer's value (and own_out = own, where given) */
};

/* When the kernel may write its output, where that overlaps what this rank sends. */
enum braid_ce_sent {
  BRAID_CE_SENT_NONE = 0,  /* no overlap */
  BRAID_CE_SENT_CHUNK = 1  /* out == send, one size: chunk k once this rank's chunk k is out
                              (other overlaps send from a copy: runtime/ce.c) */
};

struct braid_ce_args {
  struct braid_dev_comm* comm;  /* the abort flag and the ledger */
  struct braid_ce_flags* flags; /* this rank's */
  uint32_t* peer_freed;         /* the peer's `freed` words */
  const char* slots;            /* this rank's scratch slots */
  const void* own;              /* REDUCE: this rank's contribution; COPY: copied to own_out */
  void* out;                    /* `count` elements */
  void* own_out;                /* COPY: where `own` goes, or NULL */
  uint64_t count;               /* elements */
  uint64_t chunk_elems;         /* elements per chunk (at most a slot) */
  uint64_t slot_bytes;
  uint64_t scalar;              /* PreMulSum: the scalar's bits, or a device pointer to it */
  uint64_t ledger_seq;          /* 0: no ledger report */
  uint32_t seq0;                /* the operation's first chunk received */
  uint32_t nslots;
  int32_t mode;                 /* braid_ce_mode */
  int32_t mine_first;           /* REDUCE: this rank is rank 0, its value goes first */
  int32_t wait_sent;            /* braid_ce_sent: out overlaps what this rank's copies read */
  uint32_t sent0;               /* SENT_CHUNK: this rank's first chunk sent */
  int32_t scalar_device;        /* `scalar` is a device pointer */
  /*
   * Before the ledger report: copy stream i has sent this rank's last chunk of the operation,
   * sent[i] >= sent_last[i] (bit i of sent_wait). The operation is done only when what it sends
   * has left too, or a peer that never frees a slot would hang it with nothing pending.
   */
  uint32_t sent_last[2];
  int32_t sent_wait;
  /*
   * The peer's chunks land in `out` itself (registered buffers, runtime/register.c), not in the
   * slots: REDUCE reduces `out` with `own` in place, COPY only waits. At the start the kernel
   * tells the peer it may copy (the peer's `ready` word = ready_value).
   */
  int32_t landed;
  uint32_t ready_value;
  uint32_t* peer_ready;
};

/*
 * One step of a copy stream, between two of its copies: publish the copy
 * before (the peer's arrived word and, in place, this rank's sent word),
 * then wait until the slot of the copy after is free.
 */
struct braid_ce_step {
  uint32_t* arrived;   /* the peer's arrived[slot] of the copy before, or NULL */
  uint32_t* sent;      /* this rank's sent word, or NULL */
  uint32_t value;      /* the copy before's chunk + 1 */
  uint32_t want;       /* wait until *freed >= want */
  const uint32_t* freed; /* this rank's freed[slot] of the copy after, or NULL */
  volatile uint32_t* abort_flag;
};

/*
 * The all-gather of 3 to BRAID_CE_FAN_MAX ranks into registered buffers (runtime/ce_fan.c): each
 * rank's copy engine writes its part into every peer's output, one peer after another. A rank's
 * flag page (the first BRAID_CE_FLAGS_BYTES of its fan allocation); every word holds the number
 * of the last operation it speaks of (operations are numbered alike on every rank, from 1).
 */
#define BRAID_CE_FAN_MAX 8
struct braid_ce_fan_flags {
  uint32_t ready[BRAID_CE_FAN_MAX];   /* by rank p's kernel: its output may be written */
  uint32_t arrived[BRAID_CE_FAN_MAX]; /* by rank p's copy stream: its part is in this output */
  uint32_t sent;                      /* by this rank's copy stream: every copy of it is out */
};

/*
 * A step of the fan's copy stream (one block): publish the copies before it (each peer's
 * arrived word for this rank, and this rank's sent word), then wait until every `wait` word
 * has reached `value`. NULL entries are skipped.
 */
struct braid_ce_fan_step {
  uint32_t* publish[BRAID_CE_FAN_MAX];
  uint32_t* sent;
  const uint32_t* wait[BRAID_CE_FAN_MAX];
  uint32_t value;
  volatile uint32_t* abort_flag;
};

/* What the fan's kernel on the user's stream gets. */
struct braid_ce_fan_args {
  struct braid_dev_comm* comm;              /* the abort flag and the ledger */
  struct braid_ce_fan_flags* flags;         /* this rank's */
  uint32_t* peer_ready[BRAID_CE_FAN_MAX];   /* rank p's ready word for this rank (NULL: itself) */
  const void* own;                          /* this rank's part, copied to own_out (NULL: none) */
  void* own_out;
  uint64_t own_bytes;
  uint64_t ledger_seq;                      /* 0: no report */
  uint32_t value;                           /* the operation's number */
  int32_t nranks;
};

#ifdef __cplusplus
}
#endif

#endif
