/*
 * The copy-engine exchange of two ranks within a host (ce.c): large
 * collectives of a two-rank communicator whose ranks are joined by P2P move
 * their bytes with cudaMemcpyAsync (the GPU's copy engines) instead of SM
 * kernels, and a small kernel reduces or places what arrives.
 */
#ifndef BRAID_CORE_CE_H
#define BRAID_CORE_CE_H

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

struct ncclComm;

/* One exchange: a rank's send_count is the peer's count (either may be 0). */
struct braid_ce_op {
  const void* send;     /* what goes to the peer: send_count elements */
  size_t send_count;
  const void* own;      /* this rank's data: reduced with the peer's, or copied to own_out */
  void* out;            /* where the peer's value (reduced with own) lands: count elements */
  void* own_out;        /* copy: where `own` goes (NULL: nowhere, or already there) */
  int reduce;           /* 1: out = op(rank 0's, rank 1's); 0: out = the peer's */
  size_t count;         /* elements received (own and own_out hold as many) */
  ncclDataType_t dtype;
  int devop;            /* braid_devop_t */
  uint64_t scalar;
  int scalar_device;
  /*
   * Registered buffers on both ranks (runtime/register.c): `send` goes straight to peer_out (the
   * peer's buffer, mapped here) instead of its slots; `landed`: the peer's data lands in `out`
   * itself (never overlapping what this rank sends or its `own`).
   */
  char* peer_out;
  int landed;
};

/*
 * Whether a collective of `bytes` (its size as nccl-tests counts it) would go
 * through the copy engines on this communicator, before setup: two ranks
 * joined by P2P, BRAID_CE_MIN_BYTES <= bytes. Every rank computes the same.
 */
int ce_candidate(const struct ncclComm* comm, int coll, size_t bytes);
/* Blocks of the exchange's kernel (BRAID_CE_NBLOCKS): the op ledger counts them. */
int ce_nblocks(void);
/* Whether it does now: a candidate, set up on both ranks, and the stream not capturing. */
int ce_ready(const struct ncclComm* comm, int coll, size_t bytes, int capturing);
/* Whether the exchange is set up on both ranks and the stream not capturing (any size). */
int ce_on(const struct ncclComm* comm, int capturing);
/* Asks for setup at the next connection step (a candidate operation is pending). */
void ce_want(struct ncclComm* comm);
/* Whether setup was asked for and not done. */
int ce_pending(const struct ncclComm* comm);
/*
 * Setup, in three phases across communicators (as the transports'
 * connections, so one thread can set up both ranks' comms): allocate and
 * send what the peer needs ...
 */
ncclResult_t ce_setup(struct ncclComm* comm);
/* ... receive the peer's and map it, and tell the peer whether that worked ... */
ncclResult_t ce_connect(struct ncclComm* comm);
/* ... then learn whether the peer's worked: on only when both did (else the kernels run). */
ncclResult_t ce_agree(struct ncclComm* comm);
/*
 * Enqueues one exchange on `stream`: the copy engine sends op->send to the
 * peer, chunk by chunk, while a kernel on `stream` takes the peer's chunks
 * as they land. `ledger_seq`: the op ledger's number for the kernel to
 * report (0: none).
 */
ncclResult_t ce_exchange(struct ncclComm* comm, const struct braid_ce_op* op, cudaStream_t stream,
                         uint64_t ledger_seq);
/*
 * A launch on `stream` that only reports `ledger_seq` to the op ledger, for
 * a group whose last work was an exchange that did not report (send/receive
 * pairs): it runs after the exchanges' sends have left.
 */
ncclResult_t ce_ledger_report(struct ncclComm* comm, cudaStream_t stream, uint64_t ledger_seq);
/*
 * An error when an exchange failed half-way on this communicator: the two
 * ranks' chunk counts no longer agree, so no operation may run (the comm's
 * async error says so too).
 */
ncclResult_t ce_check_intact(struct ncclComm* comm);
/*
 * A launch that held an exchange failed (`res`): the peer's chunk counts
 * have moved on without this rank's, so the exchange is broken for good and
 * the comm's async error set.
 */
void ce_fail(struct ncclComm* comm, ncclResult_t res);
/* Waits until this rank's queued copies are done (before a peer's buffers are unmapped). */
void ce_quiesce(struct ncclComm* comm);
/* Frees what setup made (after the comm's work is done). */
void ce_free(struct ncclComm* comm);

#endif
