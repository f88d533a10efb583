/*
 * Joining the rendezvous, the rank's side of the root protocol, with one id
 * (ncclCommInitRank) or several (ncclCommInitRankScalable).
 *
 * With several ids the ranks are split into blocks, one per root
 * (bootstrap_root_of, in bootstrap_internal.h, as NCCL splits them). A rank
 * joins the root of its block and learns from it where the next rank listens.
 * The first rank of a block also joins the root of the block before it, as
 * that block's "next", so that the root can tell its last rank where to go:
 * it sends that hello first and reads its answer last, so no rank waits on
 * one root while another waits on it. If that second root fails (a rank of
 * its block never came), this rank tells its own next, which would otherwise
 * wait for it until the deadline; if its own root fails, it tells the second
 * root, which then fails its rendezvous with that reason instead of waiting
 * for it until the timeout.
 *
 * Every hello to a root carries how many ids the rank was given, which of
 * them the root is, and a digest of the whole list in order, so that a root
 * refuses a rank whose ids differ from its first rank's and says how. Each
 * root has its own secret (that of its id); the ranks' own connections use
 * the secret of the first id, which every rank holds.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap/bootstrap.h"
#include "bootstrap/bootstrap_internal.h"
#include "base/debug.h"
#include "base/error.h"
#include "base/socket.h"
#include "base/utils.h"

/* How waits and messages name the two roots a rank may join. */
#define JOIN_PEER_OWN (-1)
#define JOIN_PEER_PREV (-2)

/* ------------------------------------------------------------ the ids */

static int join_u64_compare(const void* a, const void* b) {
  const uint64_t x = *(const uint64_t*)a, y = *(const uint64_t*)b;
  return x < y ? -1 : x > y;
}

/*
 * Digests every id's root (mode and address, never the secret) into hashes[], then the list in
 * its order into *digest, and fails when two ids name one root: each of them must come from
 * its own ncclGetUniqueId, or the ranks of two blocks would meet at one root.
 */
static ncclResult_t join_ids_digest(const ncclUniqueId* ids, int n, uint64_t* hashes,
                                    uint64_t* digest) {
  ncclResult_t res = ncclSuccess;
  uint64_t* sorted = NULL;
  for (int i = 0; i < n; i++) hashes[i] = bootstrap_id_hash(&ids[i]);
  *digest = braid_hash(hashes, (size_t)n * sizeof *hashes);
  if (n < 2) return ncclSuccess;
  BRAID_TRY(BRAID_CALLOC(&sorted, (size_t)n, "the id check"));
  memcpy(sorted, hashes, (size_t)n * sizeof *sorted);
  qsort(sorted, (size_t)n, sizeof *sorted, join_u64_compare);
  for (int k = 1; k < n; k++) {
    if (sorted[k] != sorted[k - 1]) continue;
    int first = -1, second = -1;
    for (int i = 0; i < n && second < 0; i++) {
      if (hashes[i] != sorted[k]) continue;
      if (first < 0) first = i;
      else second = i;
    }
    BRAID_CHECK(0, ncclInvalidArgument,
                "bootstrap: commIds[%d] and commIds[%d] are the same id (one root): each of the "
                "%d ids must come from its own ncclGetUniqueId call", first, second, n);
  }
fail:
  free(sorted);
  return res;
}

ncclResult_t bootstrap_ids_check(const ncclUniqueId* ids, int nids, int nranks,
                                 struct bootstrap_ids* out) {
  ncclResult_t res = ncclSuccess;
  uint64_t* hashes = NULL;
  char which[32];
  memset(out, 0, sizeof *out);
  BRAID_CHECK(ids != NULL && nids >= 1, ncclInvalidArgument, "bootstrap: no unique id given");
  BRAID_TRY(bootstrap_id_unpack(&ids[0], nids > 1 ? "commIds[0]" : "the ncclUniqueId", &out->first,
                                &out->first_root));
  out->ids = ids;
  out->nids = nids;
  if (out->first.mode == BOOTSTRAP_MODE_RANK0 && nids > 1) {
    /* Every rank derives the same id from the variable, so the others are copies of it. */
    INFO(BRAID_LOG_BOOTSTRAP | BRAID_LOG_INIT,
         "bootstrap: BRAID_COMM_ID is set: of the %d ids only the first is used (one root, run "
         "by rank 0), as NCCL does with NCCL_COMM_ID", nids);
    out->nids = 1;
  }
  for (int i = 1; i < out->nids; i++) {
    struct bootstrap_id_layout id;
    union braid_sockaddr root;
    snprintf(which, sizeof which, "commIds[%d]", i);
    BRAID_TRY(bootstrap_id_unpack(&ids[i], which, &id, &root));
    BRAID_CHECK(id.mode == BOOTSTRAP_MODE_ROOT_THREAD, ncclInvalidArgument,
                "bootstrap: commIds[%d] comes from BRAID_COMM_ID but commIds[0] does not: set the "
                "variable for every process or for none", i);
  }
  out->nroots = bootstrap_roots_used(out->nids, nranks);
  BRAID_TRY(BRAID_CALLOC(&hashes, (size_t)out->nids, "the id digests"));
  BRAID_TRY(join_ids_digest(ids, out->nids, hashes, &out->digest));
fail:
  free(hashes);
  return res;
}

void bootstrap_dismiss_unused(const struct bootstrap_ids* ids, volatile uint32_t* abort) {
  for (int i = ids->nroots; i < ids->nids; i++) {
    struct bootstrap_id_layout id;
    union braid_sockaddr root;
    struct bootstrap_hello hello;
    int fd = -1, err = 0;
    size_t sent = 0;
    memcpy(&id, &ids->ids[i], sizeof id);
    if (bootstrap_wire_addr_unpack(&id.root, &root) != 0) continue;
    if (socket_connect_quiet(&root, 1.0, abort, &fd, &err) != ncclSuccess) continue;
    bootstrap_hello_fill(NULL, BOOTSTRAP_HELLO_DISMISS, id.secret, &hello);
    socket_send_some(fd, &hello, sizeof hello, &sent);
    socket_close(&fd);
  }
}

/* ------------------------------------------------------------ joining */

/* "the root at 10.0.0.1:41234" or, with several ids, "... (commIds[2])", for messages. */
static const char* join_root_name(const struct bootstrap_ids* ids, int iroot, const char* addr,
                                  char* buf, size_t size) {
  if (ids->nids > 1) snprintf(buf, size, "the root at %s (commIds[%d])", addr, iroot);
  else snprintf(buf, size, "the root at %s", addr);
  return buf;
}

/*
 * Presents a JOIN to root `iroot` (peer JOIN_PEER_OWN or JOIN_PEER_PREV) and, with `reply`,
 * waits for its answer; *fd is then the connection. A JOIN that is refused (the root is not
 * up yet: with BRAID_COMM_ID rank 0 starts it) or dropped before its answer (a root swamped
 * with strangers makes room; with BRAID_COMM_ID the port serves one rendezvous after another,
 * and a finished root closing its listener drops what waited in its backlog) is sent again,
 * with backoff, until the deadline.
 */
static ncclResult_t join_dial(struct bootstrap* b, const struct bootstrap_ids* ids, int iroot,
                              int peer, struct bootstrap_reply* reply, int* fd) {
  ncclResult_t res = ncclSuccess;
  struct bootstrap_id_layout id;
  struct bootstrap_hello hello;
  union braid_sockaddr root;
  char name[BOOTSTRAP_TEXT + 32];
  int again = 0, err = 0, tries = 0;
  double pause = BOOTSTRAP_RETRY_MIN_S;
  const double start = braid_time_sec();
  char* text = peer == JOIN_PEER_PREV ? b->prev_root_text : b->root_text;
  BRAID_TRY(bootstrap_id_unpack(&ids->ids[iroot], "an id", &id, &root)); /* checked before */
  socket_addr_str(&root, text, BOOTSTRAP_TEXT);
  join_root_name(ids, iroot, text, name, sizeof name);
  bootstrap_hello_fill(b, BOOTSTRAP_HELLO_JOIN, id.secret, &hello);
  hello.nids = ids->nids;
  hello.iroot = iroot;
  hello.ids_digest = ids->digest;
  for (;;) {
    res = bootstrap_dial(b, &root, peer, &hello, reply, fd, &again, &err);
    if (res == ncclSuccess || !again) break;
    if (++tries == 1)
      INFO(BRAID_LOG_BOOTSTRAP, "bootstrap: rank %d's join at %s %s; joining again", b->rank, name,
           err ? strerror(err) : "was dropped before its answer");
    if (braid_time_sec() >= b->deadline) break;
    BRAID_TRY(bootstrap_retry_pause(b, peer, &pause));
  }
  BRAID_CHECK(res == ncclSuccess || (!again && err == 0), ncclSystemError,
              "bootstrap: rank %d of %d cannot reach %s within %.0f s (%d attempts; the last one: "
              "%s): %s",
              b->rank, b->nranks, name, braid_time_sec() - start, BRAID_MAX(tries, 1),
              err ? strerror(err) : "dropped before the answer",
              id.mode == BOOTSTRAP_MODE_RANK0
                  ? "with BRAID_COMM_ID rank 0 runs the root: did it start, with the same value?"
                  : "the process that called ncclGetUniqueId must live until every rank has joined");
fail:
  return res;
}

/*
 * Waits for the answer to the JOIN sent on *fd to root `iroot`; a connection dropped before the
 * answer is made again, waiting for the answer now. A refusal fails with its reason. *fd stays
 * open on failure while the root may still read it (the caller tells it why we leave).
 */
static ncclResult_t join_answer(struct bootstrap* b, const struct bootstrap_ids* ids, int iroot,
                                int peer, int* fd, struct bootstrap_reply* reply) {
  ncclResult_t res = ncclSuccess;
  int again = 0;
  res = bootstrap_dial_answer(b, *fd, peer, reply, &again);
  if (res != ncclSuccess && again) {
    socket_close(fd);
    res = join_dial(b, ids, iroot, peer, reply, fd);
  }
  BRAID_TRY(res);
  if (reply->status != ncclSuccess) {
    res = bootstrap_reply_fail(b, *fd, peer, reply);
    socket_close(fd); /* the root closed it */
  }
fail:
  return res;
}

/*
 * We leave root `fd` for good while it waits for us (our other root failed, or a failure notice
 * came): it fails its rendezvous with our reason at once, instead of waiting until its timeout
 * and then naming us among the ranks that never came. Closes *fd.
 */
static void join_leave(struct bootstrap* b, int* fd, ncclResult_t res) {
  if (*fd >= 0 && !bootstrap_aborted(b)) bootstrap_reply_now(*fd, res, braid_err_last());
  socket_close(fd);
}

/* Joins our own root and learns where the next rank listens. */
static ncclResult_t join_own(struct bootstrap* b, const struct bootstrap_ids* ids, int own) {
  ncclResult_t res = ncclSuccess;
  struct bootstrap_reply reply;
  int fd = -1;
  const int next = (b->rank + 1) % b->nranks;
  BRAID_TRY(join_dial(b, ids, own, JOIN_PEER_OWN, NULL, &fd));
  BRAID_TRY(join_answer(b, ids, own, JOIN_PEER_OWN, &fd, &reply));
  socket_close(&fd);
  BRAID_CHECK(bootstrap_wire_addr_unpack(&reply.next, &b->peers[next].addr) == 0, ncclSystemError,
              "bootstrap: the root at %s sent rank %d no valid address for rank %d", b->root_text,
              b->rank, next);
fail:
  join_leave(b, &fd, res);
  return res;
}

/*
 * Our join failed after our own root answered: the next rank, which got our address from that
 * root, would wait for our part of the address exchange until its deadline. It is told why
 * instead (bootstrap_report_failure), within a second.
 */
static void join_tell_next(struct bootstrap* b) {
  char why[BRAID_ERROR_MAX];
  if (b->nranks < 2 || bootstrap_aborted(b)) return;
  snprintf(why, sizeof why, "%s", braid_err_last());
  b->deadline = braid_time_sec() + 1.0;
  if (bootstrap_connect_next(b) == ncclSuccess) bootstrap_report_failure(b, why);
  braid_err_restore(why);
}

ncclResult_t bootstrap_join(struct bootstrap* b, const struct bootstrap_ids* ids) {
  ncclResult_t res = ncclSuccess;
  const int n = b->nranks, own = bootstrap_root_of(b->rank, n, ids->nroots);
  int prev = -1, prev_fd = -1, joined = 0;
  if (ids->nroots > 1 && b->rank == bootstrap_root_first(own, n, ids->nroots))
    prev = bootstrap_root_of((b->rank + n - 1) % n, n, ids->nroots);
  /* Sent first, answered once that block is complete: its root waits for it, never we for it. */
  if (prev >= 0) BRAID_TRY(join_dial(b, ids, prev, JOIN_PEER_PREV, NULL, &prev_fd));
  BRAID_TRY(join_own(b, ids, own));
  joined = 1;
  if (prev >= 0) {
    struct bootstrap_reply reply;
    BRAID_TRY(join_answer(b, ids, prev, JOIN_PEER_PREV, &prev_fd, &reply));
    socket_close(&prev_fd);
  }
  return ncclSuccess;
fail:
  join_leave(b, &prev_fd, res);
  if (joined) join_tell_next(b);
  return res;
}

ncclResult_t bootstrap_ids_validate(const ncclUniqueId* ids, int nids, int nranks, const char* api) {
  struct bootstrap_ids checked;
  ncclResult_t res = bootstrap_ids_check(ids, nids, nranks, &checked);
  if (res == ncclSuccess) return ncclSuccess;
  char why[512];
  snprintf(why, sizeof why, "%s", braid_err_last());
  return braid_err(res, "%s: %s", api, why);
}
