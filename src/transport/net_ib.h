/*
 * The IB backend's insides, shared by its files and its unit test:
 *   net_ib_util.c   what needs no device: BRAID_IB_HCA matching, GID choice
 *                   for RoCE, the advice for a too-low memlock limit
 *   net_ib_verbs.c  libibverbs loaded with dlopen (no link dependency)
 *   net_ib.c        devices, listen/connect/accept, queue pairs
 *   net_ib_data.c   registration, isend/irecv (RDMA write with immediate),
 *                   flush, test, close
 *
 * Data protocol, per connection (BRAID_IB_QPS_PER_CONNECTION RC queue pairs,
 * one by default): the receiver's irecv writes a clear-to-send entry
 * {address, rkey, size, seq} into the sender's CTS FIFO with an RDMA write on
 * the first queue pair; the sender's isend waits (returns no request) until
 * entry `seq` is there, then splits the message in one piece per queue pair
 * (ib_split) and RDMA-writes each piece into its place in that buffer, with
 * the message's size as the immediate; with adaptive routing, a piece above
 * BRAID_IB_AR_THRESHOLD goes as a plain RDMA write followed by a zero-byte
 * write with immediate. The receiver keeps zero-length receives posted on
 * every queue pair to take the immediates; on each queue pair they complete
 * in message order, and a message is complete when every queue pair has
 * delivered its immediate. A TCP socket from the handshake stays open beside
 * the queue pairs: the kernel closes it when a peer process dies, which is
 * how a receiver waiting on a dead sender learns of it.
 */
#ifndef BRAID_TRANSPORT_NET_IB_H
#define BRAID_TRANSPORT_NET_IB_H

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

/* ----------------------------------------------- net_ib_util.c (no verbs) */

/*
 * Whether device `name` port `port` is selected by `spec` (BRAID_IB_HCA /
 * NCCL_IB_HCA): "mlx5_0:1,mlx5_1" prefixes with optional ports, "^mlx5_3"
 * excludes, "=mlx5_0" exact names, "^=mlx5_0:2" both. NULL/empty: all.
 */
int ib_hca_match(const char* spec, const char* name, int port);

enum ib_gid_type { IB_GID_IB = 0, IB_GID_ROCE_V1 = 1, IB_GID_ROCE_V2 = 2 };

struct ib_gid_cand {
  int index;
  enum ib_gid_type type;
  uint8_t raw[16];
};

/*
 * The GID index to use on a port. forced >= 0 (BRAID_IB_GID_INDEX) must name
 * a non-zero entry; otherwise: RoCE v2 with an IPv4-mapped address, then
 * RoCE v2 with a global IPv6 address, then RoCE v1, then any non-zero,
 * non-link-local entry, then a link-local one (RoCE v2 first). Returns the index, or -1 with
 * the reason in `why`.
 */
int ib_gid_choose(const struct ib_gid_cand* cands, int n, int forced, char* why, size_t why_size);

/* The fix to suggest when registering `bytes` failed with `err`, given the memlock limit. */
void ib_memlock_advice(size_t bytes, int err, char* out, size_t size);

/* A GID as text: IPv6, or dotted IPv4 when it is IPv4-mapped. */
void ib_gid_str(const uint8_t* raw, char* out, size_t size);

/* The alignment of the pieces a message is split into across queue pairs. */
#define IB_PIECE_ALIGN 128

/*
 * Piece q of a `size`-byte message split across nqps queue pairs: the pieces
 * are ceil(size / nqps) rounded up to IB_PIECE_ALIGN bytes, in order, the
 * last ones shorter or empty. *off and *len say where piece q is.
 */
void ib_split(size_t size, int nqps, int q, size_t* off, size_t* len);

#endif
