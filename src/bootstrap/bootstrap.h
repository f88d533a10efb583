/*
 * Bootstrap: how ranks of a communicator find each other before any GPU
 * transport exists, and the out-of-band service later layers use for setup,
 * barriers and error reports.
 *
 * ncclGetUniqueId starts a root listener (a detached thread of the calling
 * process) and packs its address and a 128-bit random secret into the unique
 * id (magic, version and checksum first, so that a damaged or foreign id is
 * refused with ncclInvalidArgument). Each rank opens its own listener,
 * connects to the root, presents the secret and registers; once all have, the
 * root tells each rank where the next one listens and exits (with several
 * ids, each root does so for its block of ranks). The ranks then
 * all-gather their addresses around that ring. From then on ranks talk
 * directly over TCP connections made on first use and kept; every connection
 * starts with the secret, and one without it (a port scanner, a stale job,
 * garbage, silence) is closed and logged (one WARN per burst, with the first
 * address) without disturbing the job, however many there are: a listener
 * keeps at most 64 of them waiting and drops the oldest to make room, and a
 * rank whose connection was dropped before its reply makes it again.
 *
 * Root-less mode: with BRAID_COMM_ID / NCCL_COMM_ID=host:port, rank 0 runs the
 * root at that address and every rank builds the same id from the variable.
 * Its secret is then a digest of the variable's text and of BRAID_COMM_SECRET,
 * a text the launcher gives every rank. Without BRAID_COMM_SECRET it keeps
 * strays and other jobs out, but anyone who can reach the port can compute it
 * (said once at INFO).
 *
 * A rank that never arrives: BRAID_BOOTSTRAP_TIMEOUT seconds after the first
 * rank joined, every waiting rank fails with ncclSystemError naming the
 * missing ranks. Waits after bootstrap_init have no time limit unless the
 * caller gives one (a peer may be busy between setup steps) but end on
 * abort, and when the awaited peer is gone (ncclRemoteError naming it): its
 * connection closed or reset, its host silent for BRAID_SOCKET_KEEPALIVE_SEC,
 * its listener refusing connections.
 *
 * Threading: one struct bootstrap is used by one thread at a time, except
 * bootstrap_abort, which may be called from any thread. There is no helper
 * thread: incoming messages are read while the owner is inside any bootstrap
 * call (see bootstrap_send).
 */
#ifndef BRAID_CORE_BOOTSTRAP_H
#define BRAID_CORE_BOOTSTRAP_H

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

struct bootstrap;

/*
 * Creates an id and starts its root listener (or returns the BRAID_COMM_ID
 * id, starting nothing). The root's thread ends once its rendezvous is done,
 * or BRAID_BOOTSTRAP_TIMEOUT seconds after the first rank joined if not all
 * came. Until a rank joins it waits without limit, as NCCL's does: an id may
 * be used long after it was made.
 */
ncclResult_t bootstrap_get_unique_id(ncclUniqueId* id);
/*
 * Ends every root that bootstrap_get_unique_id started and that is still
 * running (ids not used, or rendezvous not complete), closing their listeners,
 * and waits (up to 2 s) for their threads. Runs when the library is unloaded;
 * for a process that is done with its unused ids.
 */
void bootstrap_roots_stop(void);
/* Rank-independent id from BRAID_COMM_ID (found = 0 when unset). */
ncclResult_t bootstrap_id_from_env(ncclUniqueId* id, int* found);
/* A short printable digest of an id (for logs): never reveals the secret. */
uint64_t bootstrap_id_hash(const ncclUniqueId* id);

/*
 * Checks the unique ids an init was given as bootstrap_init would (a Braid id, whole, of this
 * version; no id twice), before anything waits on them; a refusal's message is led by `api`,
 * the NCCL function the application called.
 */
ncclResult_t bootstrap_ids_validate(const ncclUniqueId* ids, int nids, int nranks, const char* api);

/*
 * Joins the rendezvous as `rank` of `nranks`. With several ids (ncclCommInitRankScalable,
 * every rank passing the same ones in the same order) the ranks are split into blocks, one per
 * id, as NCCL splits them, each rank joining the root of its block's id; ids beyond nranks serve
 * no rank and rank 0 dismisses their roots. With BRAID_COMM_ID only ids[0] counts. Fails with
 * ncclInvalidArgument for a bad or repeated id, or when another rank already claimed `rank` or
 * disagrees about `nranks`, nids or the ids' order; with ncclSystemError, naming the missing
 * ranks, after BRAID_BOOTSTRAP_TIMEOUT. `abort` (may be NULL) interrupts waits.
 */
ncclResult_t bootstrap_init(const ncclUniqueId* ids, int nids, int rank, int nranks,
                            volatile uint32_t* abort, struct bootstrap** out);

int bootstrap_rank(const struct bootstrap* b);
int bootstrap_nranks(const struct bootstrap* b);
/*
 * The job's 16-byte secret, which transports present in their own handshakes
 * (the net backends' key). Never log it. Valid until bootstrap_close.
 */
const uint8_t* bootstrap_secret(const struct bootstrap* b);
/*
 * Where rank `rank`'s bootstrap listener is, and the short host name it
 * reported (for error messages of later layers); NULL when out of range.
 * Valid until bootstrap_close.
 */
union braid_sockaddr;
const union braid_sockaddr* bootstrap_peer_addr(const struct bootstrap* b, int rank);
const char* bootstrap_peer_host(const struct bootstrap* b, int rank);

/*
 * `data` holds nranks blocks of `size` bytes; block `rank` is ours; on return
 * all are filled. A ring: nranks-1 steps over two persistent connections.
 */
ncclResult_t bootstrap_allgather(struct bootstrap* b, void* data, size_t size);
/* Returns once every rank has entered (dissemination: ceil(log2 nranks) rounds). */
ncclResult_t bootstrap_barrier(struct bootstrap* b);
/*
 * Point to point, matched by (peer, tag), in order within one (peer, tag).
 * Send does not wait for the matching recv: the receiver queues whatever
 * arrives while it is inside any bootstrap call, so a message that fits the
 * socket buffers returns at once, and a larger one returns once the receiver
 * enters some bootstrap call. The first message to a peer also waits for the
 * peer to take the connection, which it does inside any bootstrap call.
 * Recv of a message whose size differs from `size` fails with
 * ncclInternalError. peer == own rank is allowed.
 */
ncclResult_t bootstrap_send(struct bootstrap* b, int peer, int tag, const void* data, size_t size);
ncclResult_t bootstrap_recv(struct bootstrap* b, int peer, int tag, void* data, size_t size);
/*
 * The same, given up at `until` (braid_time_sec()'s clock): the wait then ends quietly (no
 * message kept) with ncclRemoteError and *late = 1. A message already queued is still taken
 * after `until`, so a caller that waits for several peers up to one time learns about each. A
 * send given up mid-message leaves its connection unusable, as after an abort. Abort and a lost
 * peer end these waits as they end bootstrap_send/recv, *late = 0.
 */
ncclResult_t bootstrap_send_until(struct bootstrap* b, int peer, int tag, const void* data,
                                  size_t size, double until, int* late);
ncclResult_t bootstrap_recv_until(struct bootstrap* b, int peer, int tag, void* data, size_t size,
                                  double until, int* late);

/*
 * A new bootstrap among a subset of this one's ranks (comm split/shrink):
 * `ranks` lists the parent ranks of the new group in new-rank order, and
 * every member calls this with the same list. Collective over the members
 * only: ranks left out (dead ones, after a shrink) are never contacted.
 * The new bootstrap's waits poll `abort_flag` (the new communicator's; may
 * be NULL), not the parent's.
 */
ncclResult_t bootstrap_split(struct bootstrap* parent, const int* ranks, int nranks, int new_rank,
                             volatile uint32_t* abort_flag, struct bootstrap** out);

/*
 * This rank's initialization failed (after the bootstrap was up): tells the ranks it has a
 * connection to (its ring next at least), whose bootstrap waits then fail at once with `why`
 * and who pass it on the same way when it fails their init (a failure caused by a notice
 * passes that notice on). At most a second is spent on ranks that do not take it; nothing
 * after an abort, a second report, or bootstrap_init_done.
 */
void bootstrap_report_failure(struct bootstrap* b, const char* why);
/* The caller's init is through: failure notices are no longer sent or heeded. */
void bootstrap_init_done(struct bootstrap* b);
/* Closes every connection and frees `b`. */
ncclResult_t bootstrap_close(struct bootstrap* b);
/* Makes every current and future wait of `b` fail with ncclRemoteError; thread-safe. */
void bootstrap_abort(struct bootstrap* b);

#endif
