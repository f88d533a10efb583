/*
 * Bootstrap, the ranks' side: the unique id, joining the rendezvous, and the
 * out-of-band service later layers use before and beside any GPU transport
 * (all-gather, barrier, send/recv, split). Joining the roots lives in
 * bootstrap_join.c, connections and the message queue in bootstrap_conn.c,
 * the root in bootstrap_root.c, what both listeners share in
 * bootstrap_listen.c, the wire layouts in bootstrap_internal.h.
 *
 * Joining: a rank opens its listener, sends its root a JOIN hello (secret,
 * rank, nranks, listener, which of its ids the root's is), and gets back the
 * listener of the next rank. The ranks then all-gather their listeners and
 * host names around that ring. A JOIN (or a connection to a rank) that is
 * refused, or dropped before its reply, is made again with backoff until the
 * deadline, as NCCL retries.
 *
 * Waits during bootstrap_init end at BRAID_BOOTSTRAP_TIMEOUT; later waits
 * last as long as needed (a peer may be busy for minutes between setup
 * steps) but end on abort, and when the awaited peer is gone (its connection
 * closed or reset, its host silent past BRAID_SOCKET_KEEPALIVE_SEC).
 */
#include "bootstrap/bootstrap.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bootstrap/bootstrap_internal.h"
#include "base/debug.h"
#include "base/error.h"
#include "base/param.h"
#include "base/socket.h"
#include "base/utils.h"

/* ------------------------------------------------------------ the id */

static uint32_t bootstrap_id_checksum(const struct bootstrap_id_layout* id) {
  return (uint32_t)braid_hash(id, offsetof(struct bootstrap_id_layout, check));
}

static void bootstrap_id_pack(int mode, const union braid_sockaddr* root, const uint8_t* secret,
                              ncclUniqueId* out) {
  struct bootstrap_id_layout id;
  memset(&id, 0, sizeof id);
  id.magic = BOOTSTRAP_ID_MAGIC;
  id.version = BOOTSTRAP_ID_VERSION;
  id.mode = (uint8_t)mode;
  bootstrap_wire_addr_pack(root, &id.root);
  memcpy(id.secret, secret, BOOTSTRAP_SECRET_BYTES);
  id.check = bootstrap_id_checksum(&id);
  memcpy(out, &id, sizeof id);
}

ncclResult_t bootstrap_id_unpack(const ncclUniqueId* in, const char* which,
                                 struct bootstrap_id_layout* id, union braid_sockaddr* root) {
  static const uint8_t zero[sizeof id->zero];
  memcpy(id, in, sizeof *id);
  if (id->magic != BOOTSTRAP_ID_MAGIC)
    return braid_err(ncclInvalidArgument,
                     "bootstrap: %s is not a Braid id (magic 0x%08x, expected 0x%08x): give every "
                     "rank the bytes ncclGetUniqueId returned, unchanged; ids of another NCCL build "
                     "cannot be mixed with Braid", which, id->magic, BOOTSTRAP_ID_MAGIC);
  if (id->version != BOOTSTRAP_ID_VERSION)
    return braid_err(ncclInvalidArgument,
                     "bootstrap: %s has version %u, this Braid speaks %u: every rank must load the "
                     "same library", which, id->version, BOOTSTRAP_ID_VERSION);
  const char* why = NULL;
  if (id->check != bootstrap_id_checksum(id)) why = "checksum mismatch";
  else if (id->mode != BOOTSTRAP_MODE_ROOT_THREAD && id->mode != BOOTSTRAP_MODE_RANK0) why = "bad mode";
  else if (id->reserved != 0 || memcmp(id->zero, zero, sizeof zero) != 0) why = "nonzero padding";
  else if (bootstrap_wire_addr_unpack(&id->root, root) != 0) why = "no root address";
  if (why != NULL)
    return braid_err(ncclInvalidArgument,
                     "bootstrap: %s is corrupt (%s): was it copied or broadcast only in part?",
                     which, why);
  return ncclSuccess;
}

/*
 * The key of a BRAID_COMM_ID rendezvous. Every rank must derive the same one without talking,
 * so it is a digest of the variable's text and of BRAID_COMM_SECRET, which the launcher gives
 * every rank. Without that secret the text alone keeps strays and jobs with another
 * BRAID_COMM_ID out, but anyone who can reach the port can compute the key: said once at INFO.
 */
static ncclResult_t bootstrap_env_secret(const char* text, const char* name, uint64_t secret[2]) {
  static int told; /* atomic */
  const char* shared = braid_param_str(BRAID_P_COMM_SECRET);
  if (shared == NULL) shared = "";
  if (shared[0] == '\0' && !__atomic_exchange_n(&told, 1, __ATOMIC_RELAXED))
    INFO(BRAID_LOG_BOOTSTRAP | BRAID_LOG_INIT,
         "bootstrap: %s is set without BRAID_COMM_SECRET: the key to join the rendezvous derives "
         "from that text alone, so the bootstrap is only as private as the port; give every rank "
         "the same BRAID_COMM_SECRET to keep other processes out", name);
  const size_t len = strlen(text) + strlen(shared) + 40;
  char* salted = malloc(len);
  if (salted == NULL) return braid_err(ncclSystemError, "bootstrap: out of memory for %s", name);
  snprintf(salted, len, "braid-comm-id:%s\n%s", text, shared);
  secret[0] = braid_hash(salted, strlen(salted));
  snprintf(salted, len, "%s\n%s:braid-comm-id", shared, text);
  secret[1] = braid_hash(salted, strlen(salted));
  free(salted);
  return ncclSuccess;
}

ncclResult_t bootstrap_id_from_env(ncclUniqueId* id, int* found) {
  ncclResult_t res = ncclSuccess;
  union braid_sockaddr root;
  const char* text = braid_param_str(BRAID_P_COMM_ID);
  *found = 0;
  if (text == NULL || text[0] == '\0') return ncclSuccess;
  const char* name = braid_param_source(BRAID_P_COMM_ID) == BRAID_PARAM_FROM_NCCL_ENV ? "NCCL_COMM_ID"
                                                                                    : "BRAID_COMM_ID";
  BRAID_TRY(socket_addr_parse_named(text, name, &root));
  BRAID_CHECK(socket_port(&root) != 0,
              ncclInvalidArgument,
              "%s=%s names port 0: rank 0 listens there for the others, so give it a fixed port "
              "(host:port)",
              name, text);
  uint64_t secret[2];
  BRAID_TRY(bootstrap_env_secret(text, name, secret));
  bootstrap_id_pack(BOOTSTRAP_MODE_RANK0, &root, (const uint8_t*)secret, id);
  *found = 1;
fail:
  return res;
}

static double bootstrap_timeout_param(void) {
  int64_t sec = braid_param_int(BRAID_P_BOOTSTRAP_TIMEOUT);
  return sec < 1 ? 1.0 : (double)sec;
}

ncclResult_t bootstrap_get_unique_id(ncclUniqueId* id) {
  ncclResult_t res = ncclSuccess;
  struct braid_netif netif;
  uint8_t secret[BOOTSTRAP_SECRET_BYTES];
  int found = 0, count = 0;
  BRAID_CHECK(id != NULL, ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
  BRAID_TRY(bootstrap_id_from_env(id, &found));
  if (found) return ncclSuccess; /* rank 0 runs the root in bootstrap_init */
  BRAID_TRY(socket_find_interfaces(&netif, 1, &count));
  BRAID_TRY(braid_random_bytes(secret, sizeof secret));
  if (netif.addr.sa.sa_family == AF_INET) netif.addr.sin.sin_port = 0;
  else netif.addr.sin6.sin6_port = 0;
  BRAID_TRY(bootstrap_root_start(&netif.addr, secret, bootstrap_timeout_param(), 1, NULL));
  bootstrap_id_pack(BOOTSTRAP_MODE_ROOT_THREAD, &netif.addr, secret, id);
fail:
  return res;
}

uint64_t bootstrap_id_hash(const ncclUniqueId* id) {
  /* Mode and root address only: a digest that includes the secret would leak part of it. */
  return braid_hash(id, offsetof(struct bootstrap_id_layout, secret));
}

/*
 * All-gather around a ring of n members (ring[i]: member i's rank, NULL for
 * the identity; we are member `me`). Step s passes on the block received in
 * step s-1 (first our own) to the next member and receives the block of
 * member me-s-1 from the previous: n-1 steps over two persistent connections.
 */
static ncclResult_t bootstrap_ring_allgather(struct bootstrap* b, const int* ring, int n, int me,
                                             int channel, int tag, void* data, size_t size) {
  ncclResult_t res = ncclSuccess;
  char* base = data;
  int next = ring ? ring[(me + 1) % n] : (me + 1) % n;
  int prev = ring ? ring[(me + n - 1) % n] : (me + n - 1) % n;
  for (int s = 0; s < n - 1; s++) {
    int send_block = (me - s + n) % n, recv_block = (me - s - 1 + n) % n;
    BRAID_TRY(bootstrap_msg_send(b, next, channel, tag, base + (size_t)send_block * size, size));
    BRAID_TRY(bootstrap_msg_recv(b, prev, channel, tag, 1, base + (size_t)recv_block * size, size));
  }
fail:
  return res;
}

/* ---------------------------------------------------------- lifecycle */

static ncclResult_t bootstrap_alloc(int rank, int nranks, volatile uint32_t* abort, struct bootstrap** out) {
  ncclResult_t res = ncclSuccess;
  struct bootstrap* b = NULL;
  BRAID_TRY(BRAID_CALLOC(&b, 1, "the bootstrap"));
  b->rank = rank;
  b->nranks = nranks;
  b->abort_flag = abort;
  b->listen_fd = -1;
  b->deadline = -1.0;
  b->timeout = bootstrap_timeout_param();
  bootstrap_conn_init(b);
  b->failed_peer = -1;
  b->nout = 0;
  pthread_mutex_init(&b->lock, NULL);
  BRAID_TRY(BRAID_CALLOC(&b->peers, (size_t)nranks, "the bootstrap peer table"));
  for (int r = 0; r < nranks; r++) b->peers[r].out_fd = -1;
  *out = b;
  return ncclSuccess;
fail:
  bootstrap_close(b);
  return res;
}

/*
 * Our listener, on the address of `where` (any port the kernel gives), never on the port of
 * `avoid` (with BRAID_COMM_ID: the port rank 0's root is to listen on; a rank whose listener
 * took it first, say because it started before rank 0, would answer the others in the root's
 * place and fail the job). A pick of that port is held bound, not listening, while another is
 * asked for (socket_listen_avoiding): a listener there, closed after, would reset the
 * connections other ranks made to it meanwhile, meant for the root.
 */
static ncclResult_t bootstrap_listen_on(struct bootstrap* b, const union braid_sockaddr* where,
                                        const union braid_sockaddr* avoid) {
  b->listen_addr = *where;
  if (where->sa.sa_family == AF_INET) b->listen_addr.sin.sin_port = 0;
  else b->listen_addr.sin6.sin6_port = 0;
  return socket_listen_avoiding(&b->listen_addr, avoid ? socket_port(avoid) : 0, &b->listen_fd);
}

static void bootstrap_self_wire(const struct bootstrap* b, struct bootstrap_peer_wire* w) {
  memset(w, 0, sizeof *w);
  bootstrap_wire_addr_pack(&b->listen_addr, &w->listen);
  w->pid = (int32_t)getpid();
  snprintf(w->host, sizeof w->host, "%s", braid_log_hostname());
}

/* Fills the peer table from the gathered blocks, one per rank. */
static ncclResult_t bootstrap_peers_fill(struct bootstrap* b, struct bootstrap_peer_wire* all) {
  for (int r = 0; r < b->nranks; r++) {
    struct bootstrap_peer* p = &b->peers[r];
    all[r].host[sizeof all[r].host - 1] = '\0';
    if (bootstrap_wire_addr_unpack(&all[r].listen, &p->addr) != 0)
      return braid_err(ncclInternalError, "bootstrap: rank %d received no valid address for rank %d",
                       b->rank, r);
    p->pid = all[r].pid;
    snprintf(p->host, sizeof p->host, "%s", all[r].host);
  }
  return ncclSuccess;
}

ncclResult_t bootstrap_init(const ncclUniqueId* ids, int nids, int rank, int nranks,
                            volatile uint32_t* abort, struct bootstrap** out) {
  ncclResult_t res = ncclSuccess;
  struct bootstrap* b = NULL;
  struct bootstrap_root* root = NULL;
  struct bootstrap_ids checked;
  struct bootstrap_peer_wire* all = NULL;
  struct braid_netif netif;
  int count = 0, joined = 0;
  double start = braid_time_sec();
  BRAID_CHECK(out != NULL, ncclInvalidArgument, "bootstrap: no place for the result");
  *out = NULL;
  BRAID_CHECK(nranks >= 1 && rank >= 0 && rank < nranks, ncclInvalidArgument,
              "bootstrap: rank %d is out of range for %d ranks", rank, nranks);
  BRAID_CHECK(nranks <= BOOTSTRAP_MAX_RANKS, ncclInvalidArgument,
              "bootstrap: %d ranks, more than a bootstrap supports (%d)", nranks, BOOTSTRAP_MAX_RANKS);
  BRAID_TRY(bootstrap_ids_check(ids, nids, nranks, &checked));
  const int rank0_mode = checked.first.mode == BOOTSTRAP_MODE_RANK0;
  BRAID_TRY(bootstrap_alloc(rank, nranks, abort, &b));
  memcpy(b->secret, checked.first.secret, sizeof b->secret);
  /* A little longer than the root's own limit, so that its list of missing ranks arrives first. */
  b->deadline = start + b->timeout + BRAID_MAX(2.0, 0.1 * b->timeout);
  BRAID_TRY(socket_find_interfaces(&netif, 1, &count));
  BRAID_TRY(bootstrap_listen_on(b, &netif.addr, rank0_mode ? &checked.first_root : NULL));
  if (rank0_mode && rank == 0)
    BRAID_TRY(bootstrap_root_start(&checked.first_root, checked.first.secret, b->timeout, 0, &root));
  if (rank == 0) bootstrap_dismiss_unused(&checked, abort);
  BRAID_TRY(bootstrap_join(b, &checked));
  joined = 1;
  BRAID_TRY(BRAID_CALLOC(&all, (size_t)nranks, "the bootstrap address table"));
  bootstrap_self_wire(b, &all[rank]);
  BRAID_TRY(bootstrap_ring_allgather(b, NULL, nranks, rank, BOOTSTRAP_CH_INFO, 0, all, sizeof *all));
  BRAID_TRY(bootstrap_peers_fill(b, all));
  bootstrap_root_join(root, 0);
  root = NULL;
  b->deadline = -1.0;
  char self[BOOTSTRAP_TEXT];
  INFO(BRAID_LOG_BOOTSTRAP,
       "bootstrap: rank %d of %d ready in %.3f s (listener %s on %s, root %s, %d of %d)", rank,
       nranks, braid_time_sec() - start, socket_addr_str(&b->listen_addr, self, sizeof self),
       netif.name, b->root_text, bootstrap_root_of(rank, nranks, checked.nroots) + 1,
       checked.nroots);
  free(all);
  *out = b;
  return ncclSuccess;
fail:
  /* Ranks waiting for our part of the address exchange learn why (a notice's cause, passed on). */
  if (joined) bootstrap_report_failure(b, braid_err_last());
  bootstrap_root_join(root, 1);
  free(all);
  bootstrap_close(b);
  return res;
}

/* ------------------------------------------------------- the service */

int bootstrap_rank(const struct bootstrap* b) { return b->rank; }
int bootstrap_nranks(const struct bootstrap* b) { return b->nranks; }

const uint8_t* bootstrap_secret(const struct bootstrap* b) { return b->secret; }

const union braid_sockaddr* bootstrap_peer_addr(const struct bootstrap* b, int rank) {
  return b && rank >= 0 && rank < b->nranks ? &b->peers[rank].addr : NULL;
}

const char* bootstrap_peer_host(const struct bootstrap* b, int rank) {
  return b && rank >= 0 && rank < b->nranks ? b->peers[rank].host : NULL;
}

ncclResult_t bootstrap_allgather(struct bootstrap* b, void* data, size_t size) {
  ncclResult_t res = ncclSuccess;
  BRAID_CHECK(b != NULL && (data != NULL || size == 0) && size <= BOOTSTRAP_MAX_MSG, ncclInvalidArgument,
              "bootstrap_allgather: invalid arguments (data %p, %zu bytes per rank)", data, size);
  pthread_mutex_lock(&b->lock);
  int tag = (int)(b->allgather_seq++ & 0x7fffffff);
  res = bootstrap_ring_allgather(b, NULL, b->nranks, b->rank, BOOTSTRAP_CH_ALLGATHER, tag, data, size);
  pthread_mutex_unlock(&b->lock);
fail:
  return res;
}

/* Dissemination barrier: in round k we signal rank+2^k and wait for rank-2^k; ceil(log2 n) rounds. */
static ncclResult_t bootstrap_barrier_locked(struct bootstrap* b) {
  ncclResult_t res = ncclSuccess;
  uint32_t seq = b->barrier_seq++;
  for (int k = 0, dist = 1; dist < b->nranks; k++, dist <<= 1) {
    int tag = (int)(((seq << 5) | (uint32_t)k) & 0x7fffffff);
    BRAID_TRY(bootstrap_msg_send(b, (b->rank + dist) % b->nranks, BOOTSTRAP_CH_BARRIER, tag, NULL, 0));
    BRAID_TRY(bootstrap_msg_recv(b, (b->rank - dist + b->nranks) % b->nranks, BOOTSTRAP_CH_BARRIER, tag,
                                 1, NULL, 0));
  }
fail:
  return res;
}

ncclResult_t bootstrap_barrier(struct bootstrap* b) {
  if (b == NULL) return braid_err(ncclInvalidArgument, "bootstrap_barrier: no bootstrap");
  pthread_mutex_lock(&b->lock);
  ncclResult_t res = bootstrap_barrier_locked(b);
  pthread_mutex_unlock(&b->lock);
  return res;
}

static ncclResult_t bootstrap_p2p_check(const struct bootstrap* b, int peer, const void* data,
                                        size_t size, const char* api) {
  if (b == NULL) return braid_err(ncclInvalidArgument, "%s: no bootstrap", api);
  if (peer < 0 || peer >= b->nranks)
    return braid_err(ncclInvalidArgument, "%s: peer %d is out of range for %d ranks", api, peer, b->nranks);
  if ((data == NULL && size > 0) || size > BOOTSTRAP_MAX_MSG)
    return braid_err(ncclInvalidArgument, "%s: invalid buffer (%p, %zu bytes)", api, data, size);
  return ncclSuccess;
}

ncclResult_t bootstrap_send(struct bootstrap* b, int peer, int tag, const void* data, size_t size) {
  ncclResult_t res = bootstrap_p2p_check(b, peer, data, size, "bootstrap_send");
  if (res != ncclSuccess) return res;
  pthread_mutex_lock(&b->lock);
  res = bootstrap_msg_send(b, peer, BOOTSTRAP_CH_P2P, tag, data, size);
  pthread_mutex_unlock(&b->lock);
  return res;
}

ncclResult_t bootstrap_recv(struct bootstrap* b, int peer, int tag, void* data, size_t size) {
  ncclResult_t res = bootstrap_p2p_check(b, peer, data, size, "bootstrap_recv");
  if (res != ncclSuccess) return res;
  pthread_mutex_lock(&b->lock);
  res = bootstrap_msg_recv(b, peer, BOOTSTRAP_CH_P2P, tag, 0, data, size);
  pthread_mutex_unlock(&b->lock);
  return res;
}

ncclResult_t bootstrap_send_until(struct bootstrap* b, int peer, int tag, const void* data,
                                  size_t size, double until, int* late) {
  ncclResult_t res = bootstrap_p2p_check(b, peer, data, size, "bootstrap_send_until");
  *late = 0;
  if (res != ncclSuccess) return res;
  pthread_mutex_lock(&b->lock);
  b->call_deadline = until;
  b->call_late = 0;
  res = bootstrap_msg_send(b, peer, BOOTSTRAP_CH_P2P, tag, data, size);
  *late = res != ncclSuccess && b->call_late;
  b->call_deadline = -1.0;
  b->call_late = 0;
  pthread_mutex_unlock(&b->lock);
  return res;
}

ncclResult_t bootstrap_recv_until(struct bootstrap* b, int peer, int tag, void* data, size_t size,
                                  double until, int* late) {
  ncclResult_t res = bootstrap_p2p_check(b, peer, data, size, "bootstrap_recv_until");
  *late = 0;
  if (res != ncclSuccess) return res;
  pthread_mutex_lock(&b->lock);
  b->call_deadline = until;
  b->call_late = 0;
  res = bootstrap_msg_recv(b, peer, BOOTSTRAP_CH_P2P, tag, 0, data, size);
  *late = res != ncclSuccess && b->call_late;
  b->call_deadline = -1.0;
  b->call_late = 0;
  pthread_mutex_unlock(&b->lock);
  return res;
}

/* Checks a split's member list: in range, no repeats, and we are member new_rank. */
static ncclResult_t bootstrap_split_check(const struct bootstrap* parent, const int* ranks, int nranks,
                                          int new_rank) {
  ncclResult_t res = ncclSuccess;
  uint8_t* seen = NULL;
  BRAID_CHECK(parent != NULL && ranks != NULL && nranks >= 1 && nranks <= parent->nranks &&
              new_rank >= 0 && new_rank < nranks, ncclInvalidArgument,
              "bootstrap_split: invalid arguments (%d members, new rank %d)", nranks, new_rank);
  BRAID_CHECK(ranks[new_rank] == parent->rank, ncclInvalidArgument,
              "bootstrap_split: member %d is rank %d, but the caller is rank %d", new_rank,
              ranks[new_rank], parent->rank);
  BRAID_TRY(BRAID_CALLOC(&seen, (size_t)parent->nranks, "the split member check"));
  for (int i = 0; i < nranks; i++) {
    BRAID_CHECK(ranks[i] >= 0 && ranks[i] < parent->nranks && !seen[ranks[i]], ncclInvalidArgument,
                "bootstrap_split: member %d is rank %d, out of range or listed twice", i, ranks[i]);
    seen[ranks[i]] = 1;
  }
fail:
  free(seen);
  return res;
}

ncclResult_t bootstrap_split(struct bootstrap* parent, const int* ranks, int nranks, int new_rank,
                             volatile uint32_t* abort_flag, struct bootstrap** out) {
  ncclResult_t res = ncclSuccess;
  struct bootstrap* child = NULL;
  struct bootstrap_peer_wire* all = NULL;
  BRAID_CHECK(out != NULL, ncclInvalidArgument, "bootstrap_split: no place for the result");
  *out = NULL;
  BRAID_TRY(bootstrap_split_check(parent, ranks, nranks, new_rank));
  BRAID_TRY(bootstrap_alloc(new_rank, nranks, abort_flag, &child));
  BRAID_TRY(bootstrap_listen_on(child, &parent->listen_addr, NULL));
  BRAID_TRY(BRAID_CALLOC(&all, (size_t)nranks, "the split address table"));
  bootstrap_self_wire(child, &all[new_rank]);
  BRAID_TRY(braid_random_bytes(all[new_rank].secret, BOOTSTRAP_SECRET_BYTES));
  /* The tag is a digest of the member list, so members that disagree about it find out. */
  int tag = (int)(braid_hash(ranks, (size_t)nranks * sizeof *ranks) & 0x7fffffff);
  pthread_mutex_lock(&parent->lock);
  res = bootstrap_ring_allgather(parent, ranks, nranks, new_rank, BOOTSTRAP_CH_SPLIT, tag, all,
                                 sizeof *all);
  pthread_mutex_unlock(&parent->lock);
  BRAID_TRY(res);
  memcpy(child->secret, all[0].secret, sizeof child->secret);
  BRAID_TRY(bootstrap_peers_fill(child, all));
  BRAID_TRY(bootstrap_connect_next(child)); /* as bootstrap_init's allgather leaves it */
  free(all);
  *out = child;
  return ncclSuccess;
fail:
  free(all);
  bootstrap_close(child);
  return res;
}

void bootstrap_init_done(struct bootstrap* b) {
  pthread_mutex_lock(&b->lock);
  b->init_done = 1;
  pthread_mutex_unlock(&b->lock);
}

void bootstrap_report_failure(struct bootstrap* b, const char* why) {
  struct {
    int32_t origin;
    char text[BOOTSTRAP_FAIL_TEXT];
  } notice;
  char saved_err[BRAID_ERROR_MAX];
  if (b == NULL || bootstrap_aborted(b)) return;
  snprintf(saved_err, sizeof saved_err, "%s", braid_err_last());
  pthread_mutex_lock(&b->lock);
  if (b->init_done) goto out;
  /* This rank's own failure, or (a notice made it fail) that notice, passed on once. */
  notice.origin = b->failed_peer >= 0 ? b->failed_peer : b->rank;
  snprintf(notice.text, sizeof notice.text, "%s",
           b->failed_peer >= 0 ? b->failed_why
           : why && why[0]     ? why
                               : "no reason was given");
  /* A dead or hung peer must not hold this rank's failure up: a second for all of them. */
  const double saved = b->deadline;
  b->deadline = braid_time_sec() + 1.0;
  b->reporting = 1;
  /*
   * Over the connections already made only (every rank has one to its next, from the
   * bootstrap's own allgather): whoever the notice stops passes it on the same way, so it goes
   * round the ring. A new connection could reach whatever process took a departed rank's port,
   * and a large job's ranks would open n of them each.
   */
  for (int r = 0; r < b->nranks; r++) {
    if (r == b->rank || r == notice.origin || b->peers[r].closed || b->peers[r].out_fd < 0)
      continue;
    if (bootstrap_msg_send(b, r, BOOTSTRAP_CH_FAIL, 0, &notice,
                           sizeof notice.origin + strlen(notice.text) + 1) != ncclSuccess)
      INFO(BRAID_LOG_BOOTSTRAP, "bootstrap: rank %d could not tell rank %d of the failure", b->rank,
           r);
  }
  b->reporting = 0;
  b->deadline = saved;
  b->init_done = 1; /* once */
out:
  pthread_mutex_unlock(&b->lock);
  braid_err_restore(saved_err); /* the failure's own message, not a send's on the way */
}

ncclResult_t bootstrap_close(struct bootstrap* b) {
  if (b == NULL) return ncclSuccess;
  bootstrap_conn_release(b);
  socket_close(&b->listen_fd);
  free(b->pfds);
  free(b->out_peers);
  free(b->peers);
  pthread_mutex_destroy(&b->lock);
  free(b);
  return ncclSuccess;
}

void bootstrap_abort(struct bootstrap* b) {
  if (b) __atomic_store_n(&b->aborted, 1, __ATOMIC_RELEASE);
}
