/*
 * The bootstrap's insides, shared by its five files and its tests (nothing
 * else should include this): bootstrap.c (id, init, collectives, split),
 * bootstrap_join.c (a rank joining its roots), bootstrap_conn.c (connections
 * and the message queue), bootstrap_root.c (the rendezvous root),
 * bootstrap_listen.c (how both listeners admit connections).
 *
 * Wire layouts first.
 *
 * Every layout is packed and fixed-size, in the host's byte order except for
 * ports (network order): all ranks of a job run on little-endian hosts, and a
 * byte-swapped peer fails the magic check instead of being misread.
 *
 * A connection to a root or to a rank's listener starts with one
 * bootstrap_hello carrying the job's secret. The acceptor reads it within
 * BOOTSTRAP_HELLO_SEC, compares the secret in constant time, and answers with
 * a bootstrap_reply: a rank's listener at once, the root once every rank has
 * joined. A hello in Braid's format that it refuses (wrong secret, wrong rank)
 * gets a reply with the reason, so the sender fails at once with it; anything
 * else (garbage, silence) is closed without a word. The sender of a hello
 * therefore knows that a connection which ends before any reply was dropped
 * unread (a listener swamped with strangers makes room, a finished rendezvous
 * closes its port), and makes it again.
 *
 * Strangers cannot lock real peers out: a listener holds at most
 * BOOTSTRAP_MAX_PENDING connections that have not yet presented a valid hello,
 * and when one more arrives the oldest of them is dropped. A rank presents its
 * hello the moment it connects, so it is the newest, and the listener reads a
 * new connection as soon as it takes it. Rejections are logged as one WARN per
 * burst (BOOTSTRAP_REJECT_WARN_S), not one per connection.
 */
#ifndef BRAID_CORE_BOOTSTRAP_INTERNAL_H
#define BRAID_CORE_BOOTSTRAP_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <poll.h>
#include <pthread.h>

#include "base/socket.h"
#include "base/utils.h"
#include "nccl.h"

/* A wait for a peer's message that has no deadline WARNs this often while it lasts. */
#define BOOTSTRAP_STILL_WAITING_S 60.0

#define BOOTSTRAP_ID_MAGIC 0x44495242u    /* "BRID" */
#define BOOTSTRAP_ID_VERSION 1
#define BOOTSTRAP_WIRE_MAGIC 0x57444252u  /* "RBDW" */
/*
 * 2: failure notices (BOOTSTRAP_CH_FAIL); 3: every hello is answered (bootstrap_reply);
 * 4: a JOIN says which of the caller's ids it is for (several roots)
 */
#define BOOTSTRAP_WIRE_VERSION 4
#define BOOTSTRAP_SECRET_BYTES 16
/*
 * How long a new connection may take to present its hello before it is dropped. A rank sends
 * its hello the moment it is connected; one dropped anyway connects again.
 */
#define BOOTSTRAP_HELLO_SEC 2.0
/* Connections without a valid hello one listener holds at once; past it the oldest is dropped. */
#define BOOTSTRAP_MAX_PENDING 64
/* Connections a listener takes in one turn before it reads the ones it holds again. */
#define BOOTSTRAP_ACCEPT_BATCH 16
/* Rejected connections are WARNed about at most this often per listener; the rest are counted. */
#define BOOTSTRAP_REJECT_WARN_S 10.0
/* Making a connection again after it was dropped or refused: first and longest pause. */
#define BOOTSTRAP_RETRY_MIN_S 0.02
#define BOOTSTRAP_RETRY_MAX_S 1.0
/* Most ranks a rendezvous accepts: bounds what a JOIN can make the root allocate. */
#define BOOTSTRAP_MAX_RANKS (1 << 22)
/* Largest message a rank accepts: a bound on what a corrupt header can make us allocate. */
#define BOOTSTRAP_MAX_MSG ((uint64_t)1 << 30)
/* Longest error text the root sends to a rank. */
#define BOOTSTRAP_MAX_REPLY_TEXT 1000

/* How the id was made, which decides who runs the root. */
enum bootstrap_id_mode {
  BOOTSTRAP_MODE_ROOT_THREAD = 1, /* ncclGetUniqueId started a root thread at `root` */
  BOOTSTRAP_MODE_RANK0 = 2        /* BRAID_COMM_ID: rank 0 runs the root at `root` */
};

struct __attribute__((packed)) bootstrap_wire_addr {
  uint8_t family; /* 4 or 6 */
  uint8_t pad;
  uint16_t port;  /* network order */
  uint32_t scope_id;
  uint8_t addr[16];
};

/* The 128 bytes of ncclUniqueId. */
struct __attribute__((packed)) bootstrap_id_layout {
  uint32_t magic;   /* BOOTSTRAP_ID_MAGIC */
  uint16_t version; /* BOOTSTRAP_ID_VERSION */
  uint8_t mode;     /* enum bootstrap_id_mode */
  uint8_t reserved; /* zero */
  struct bootstrap_wire_addr root;
  uint8_t secret[BOOTSTRAP_SECRET_BYTES];
  uint8_t zero[76];
  uint32_t check;   /* low 32 bits of braid_hash() of every byte before it */
};

enum bootstrap_hello_kind {
  BOOTSTRAP_HELLO_JOIN = 1,   /* rank -> root: here I am, this is my listener */
  BOOTSTRAP_HELLO_PEER = 2,   /* rank -> rank: messages from `rank` follow */
  BOOTSTRAP_HELLO_DISMISS = 3 /* rank 0 -> the root of an id that serves no rank: exit */
};

struct __attribute__((packed)) bootstrap_hello {
  uint32_t magic;   /* BOOTSTRAP_WIRE_MAGIC */
  uint16_t version; /* BOOTSTRAP_WIRE_VERSION */
  uint8_t kind;     /* enum bootstrap_hello_kind */
  uint8_t pad;
  uint8_t secret[BOOTSTRAP_SECRET_BYTES];
  int32_t rank;
  int32_t nranks;
  int32_t pid;
  uint32_t reserved;
  struct bootstrap_wire_addr listen; /* the sender's listener (JOIN) */
  char host[64];                     /* the sender's host name, for error messages */
  /* JOIN: the ids the sender was given (ncclCommInitRankScalable's nId and commIds). */
  int32_t nids;        /* how many */
  int32_t iroot;       /* which of them this root's is */
  uint64_t ids_digest; /* bootstrap_ids_digest of all of them, in order */
};

/*
 * The answer to a hello. From the root: after everyone joined (status 0), or when the
 * rendezvous failed or refused this join. From a rank's listener: at once, status 0 when the
 * connection is taken. A refusal's reason follows as text.
 */
struct __attribute__((packed)) bootstrap_reply {
  uint32_t magic;    /* BOOTSTRAP_WIRE_MAGIC */
  int32_t status;    /* ncclResult_t */
  uint32_t text_len; /* bytes of error text that follow, at most BOOTSTRAP_MAX_REPLY_TEXT */
  uint32_t pad;
  struct bootstrap_wire_addr next; /* from the root, status 0: listener of rank+1 */
};

/* Rank -> rank, before each message's payload. */
struct __attribute__((packed)) bootstrap_msg_header {
  uint32_t magic;  /* BOOTSTRAP_WIRE_MAGIC */
  uint8_t channel; /* enum bootstrap_channel */
  uint8_t pad[3];
  int32_t tag;
  uint32_t pad2;
  uint64_t size;   /* payload bytes, at most BOOTSTRAP_MAX_MSG */
};

_Static_assert(sizeof(struct bootstrap_id_layout) == NCCL_UNIQUE_ID_BYTES, "id layout is 128 bytes");
_Static_assert(sizeof(struct bootstrap_hello) == 144, "hello is 144 bytes");

/*
 * Several roots (ncclCommInitRankScalable with nId ids): the ranks are split into nroots
 * blocks of consecutive ranks, as NCCL splits them, nroots being min(nId, nranks): the first
 * nranks % nroots roots serve nranks / nroots + 1 ranks each, the others nranks / nroots. Each
 * rank joins the root of its block. The first rank of each block also joins the root of the
 * block before it (the block of rank nranks-1, for rank 0) as that block's "next": so every
 * root can tell each of its ranks where the next rank listens, and the ring closes across the
 * blocks with no root talking to another. With one root, its block is every rank.
 */
static inline int bootstrap_roots_used(int nids, int nranks) { return nids < nranks ? nids : nranks; }

/* The first rank of root `root`'s block. */
static inline int bootstrap_root_first(int root, int nranks, int nroots) {
  const int per = nranks / nroots, extra = nranks % nroots;
  return root * per + (root < extra ? root : extra);
}

/* How many ranks root `root` serves (its block, without the next block's first rank). */
static inline int bootstrap_root_count(int root, int nranks, int nroots) {
  return nranks / nroots + (root < nranks % nroots ? 1 : 0);
}

/* The root whose block holds `rank`. */
static inline int bootstrap_root_of(int rank, int nranks, int nroots) {
  const int per = nranks / nroots, extra = nranks % nroots, big = extra * (per + 1);
  return rank < big ? rank / (per + 1) : extra + (rank - big) / per;
}

static inline void bootstrap_wire_addr_pack(const union braid_sockaddr* in,
                                            struct bootstrap_wire_addr* out) {
  memset(out, 0, sizeof *out);
  if (in->sa.sa_family == AF_INET) {
    out->family = 4;
    out->port = in->sin.sin_port;
    memcpy(out->addr, &in->sin.sin_addr, 4);
  } else if (in->sa.sa_family == AF_INET6) {
    out->family = 6;
    out->port = in->sin6.sin6_port;
    out->scope_id = in->sin6.sin6_scope_id;
    memcpy(out->addr, &in->sin6.sin6_addr, 16);
  }
}

/* Returns 0, or -1 when the bytes are not an address (unknown family or port 0). */
static inline int bootstrap_wire_addr_unpack(const struct bootstrap_wire_addr* in,
                                             union braid_sockaddr* out) {
  memset(out, 0, sizeof *out);
  if (in->port == 0) return -1;
  if (in->family == 4) {
    out->sin.sin_family = AF_INET;
    out->sin.sin_port = in->port;
    memcpy(&out->sin.sin_addr, in->addr, 4);
    return 0;
  }
  if (in->family == 6) {
    out->sin6.sin6_family = AF_INET6;
    out->sin6.sin6_port = in->port;
    out->sin6.sin6_scope_id = in->scope_id;
    memcpy(&out->sin6.sin6_addr, in->addr, 16);
    return 0;
  }
  return -1;
}

/* Constant-time comparison, so that response timing reveals nothing about the secret. */
static inline int bootstrap_secret_equal(const uint8_t* a, const uint8_t* b) {
  return braid_equal_ct(a, b, BOOTSTRAP_SECRET_BYTES);
}

/*
 * Why the first `got` bytes of a hello already show it is not one (NULL: they may be), so that
 * garbage is dropped at its first bytes instead of holding a place until the hello limit.
 */
static inline const char* bootstrap_hello_prefix_check(const struct bootstrap_hello* hello,
                                                       size_t got) {
  if (got >= sizeof hello->magic && hello->magic != BOOTSTRAP_WIRE_MAGIC)
    return "not a Braid bootstrap hello (bad magic)";
  if (got >= offsetof(struct bootstrap_hello, kind) && hello->version != BOOTSTRAP_WIRE_VERSION)
    return "another Braid bootstrap version";
  return NULL;
}

/* Whether a hello is in Braid's format and version, so that its sender reads a reply. */
static inline int bootstrap_hello_is_ours(const struct bootstrap_hello* hello) {
  return hello->magic == BOOTSTRAP_WIRE_MAGIC && hello->version == BOOTSTRAP_WIRE_VERSION;
}

/* Why a hello must be refused (NULL: it is acceptable as `kind`). Terminates hello->host. */
static inline const char* bootstrap_hello_check(struct bootstrap_hello* hello, const uint8_t* secret) {
  hello->host[sizeof hello->host - 1] = '\0';
  if (hello->magic != BOOTSTRAP_WIRE_MAGIC) return "not a Braid bootstrap hello (bad magic)";
  if (hello->version != BOOTSTRAP_WIRE_VERSION) return "another Braid bootstrap version";
  if (!bootstrap_secret_equal(hello->secret, secret))
    return "wrong secret (a stale job, or a process of another job)";
  if (hello->kind < BOOTSTRAP_HELLO_JOIN || hello->kind > BOOTSTRAP_HELLO_DISMISS)
    return "unknown hello kind";
  return NULL;
}

/* ------------------------------------------------------------------------
 * Admission of incoming connections, bootstrap_listen.c: what a rank's
 * listener and the root's share. Each keeps a table of the connections it
 * took, reads their hellos, drops the oldest one still without a valid hello
 * when more than BOOTSTRAP_MAX_PENDING wait, drops those past their hello
 * deadline, and logs rejections one WARN per burst. What a connection carries
 * after its hello (a rank's messages, a JOIN waiting for the root's answer)
 * is the owner's, reached through struct bootstrap_listener_ops.
 */

/*
 * A connection a listener took. An owner that keeps more per connection puts this first in
 * its own record (ops->conn_size says how large that is).
 */
struct bootstrap_incoming {
  int fd;                /* -1 once closed; freed by bootstrap_listener_sweep */
  int rank;              /* -1 until the owner accepts its hello */
  double since;          /* when it was accepted */
  double hello_deadline; /* still without an accepted hello then: dropped */
  union braid_sockaddr remote;
  size_t got;            /* bytes of the hello received */
  struct bootstrap_hello hello;
};

/* What a listener's owner does with its connections; every slot is filled. */
struct bootstrap_listener_ops {
  /* Bytes of the owner's record of a connection, which starts with struct bootstrap_incoming. */
  size_t conn_size;
  /*
   * Reads what has arrived on `c` (open), its hello through bootstrap_listener_hello_read
   * while c->rank < 0. Returns nonzero when the owner takes no more connections now.
   */
  int (*read)(void* owner, struct bootstrap_incoming* c);
  /*
   * Closes `c` (open): its fd, and whatever the owner keeps for it, since the listener frees
   * the record itself once it is closed.
   */
  void (*close)(void* owner, struct bootstrap_incoming* c);
  /* Who the listener is, for its log lines ("bootstrap root 10.0.0.1:41234"). */
  const char* (*name)(const void* owner, char* buf, size_t size);
};

struct bootstrap_listener {
  const struct bootstrap_listener_ops* ops;
  void* owner;
  struct bootstrap_incoming** conns; /* in the order they were taken */
  int n, cap;
  /*
   * Rejected connections: the first of a burst is a WARN naming its address and the reason,
   * the others within BOOTSTRAP_REJECT_WARN_S are only counted (TRACE), and the count comes
   * with the next WARN, or at INFO when the listener closes.
   */
  double warned;  /* when the last WARN was printed; 0: never */
  unsigned quiet; /* rejections since, not printed */
};

/* An empty table whose connections `owner` serves through `ops`. */
void bootstrap_listener_init(struct bootstrap_listener* l, const struct bootstrap_listener_ops* ops,
                             void* owner);
/* Registers an accepted connection in its hello phase; NULL when out of memory. */
struct bootstrap_incoming* bootstrap_listener_add(struct bootstrap_listener* l, int fd,
                                                  const union braid_sockaddr* remote);
/*
 * Takes up to BOOTSTRAP_ACCEPT_BATCH connections waiting on `listen_fd`, reading each at once:
 * a rank's hello is usually there already, and it is then taken before strangers that arrive
 * after it can crowd it out. Stops early when ops->read says the owner is done. Returns -1,
 * errno telling why, when accept() failed (the caller reports it: socket_accept_failed).
 */
int bootstrap_listener_accept(struct bootstrap_listener* l, int listen_fd);
/* One pollfd (POLLIN) per connection, l->n of them; a closed one's fd is -1, which poll skips. */
void bootstrap_listener_poll_fill(const struct bootstrap_listener* l, struct pollfd* pfds);
/*
 * Reads each of the first n connections (still open) whose pollfd, from
 * bootstrap_listener_poll_fill, shows activity, stopping once ops->read says the owner is
 * done; returns whether it did.
 */
int bootstrap_listener_poll_read(struct bootstrap_listener* l, const struct pollfd* pfds, int n);
/*
 * Reads what has arrived of c's hello. Returns 1 once all of it is there (the owner checks
 * it), 0 while the rest is on its way, -1 when `c` was rejected: it closed early, or its first
 * bytes are not a hello.
 */
int bootstrap_listener_hello_read(struct bootstrap_listener* l, struct bootstrap_incoming* c);
/* Rejects `c` (a stranger, garbage, a stale job): logged by burst, then closed. */
void bootstrap_listener_reject(struct bootstrap_listener* l, struct bootstrap_incoming* c,
                               const char* why);
/*
 * Refuses c's hello: a sender in Braid's format gets `status` and `text` as its answer (it
 * fails at once with that reason), and `c` is rejected for `why`.
 */
void bootstrap_listener_refuse(struct bootstrap_listener* l, struct bootstrap_incoming* c,
                               ncclResult_t status, const char* text, const char* why);
/* Drops connections past their hello deadline, and frees the closed ones. */
void bootstrap_listener_sweep(struct bootstrap_listener* l);
/*
 * Closes every connection and frees the table. With `why`, each one still without an
 * accepted hello is rejected for it, and what was only counted is said (INFO); NULL closes
 * without a word (a teardown after the listener's close was said).
 */
void bootstrap_listener_close(struct bootstrap_listener* l, const char* why);
/*
 * Answers a hello with `status` and `text` without waiting (best effort: a fresh connection's
 * socket buffer holds it), reading first what the sender sent, so that closing the connection
 * afterwards ends it with the answer rather than a reset that could discard it.
 */
void bootstrap_reply_now(int fd, ncclResult_t status, const char* text);

/* ------------------------------------------------------------------------
 * A rank's bootstrap state (struct bootstrap) and its message engine,
 * bootstrap_conn.c.
 */

/* Message streams that never match each other: user send/recv and each internal collective. */
enum bootstrap_channel {
  BOOTSTRAP_CH_P2P = 0,
  BOOTSTRAP_CH_INFO = 1,
  BOOTSTRAP_CH_ALLGATHER = 2,
  BOOTSTRAP_CH_BARRIER = 3,
  BOOTSTRAP_CH_SPLIT = 4,
  BOOTSTRAP_CH_FAIL = 5, /* a rank's notice that its init failed (bootstrap_report_failure) */
  BOOTSTRAP_CH_COUNT
};
#define BOOTSTRAP_HOST_LEN 64
#define BOOTSTRAP_FAIL_TEXT 512
#define BOOTSTRAP_TEXT 96

struct bootstrap_msg {
  struct bootstrap_msg* next;
  int peer, channel, tag;
  size_t size;
  unsigned char data[];
};

/* An incoming connection of a rank's listener: a hello, then messages of one rank. */
struct bootstrap_in {
  struct bootstrap_incoming base; /* first: the listener's record (rank: the sender, once known) */
  size_t got;                     /* bytes of the header or payload being read */
  struct bootstrap_msg_header header;
  struct bootstrap_msg* msg;      /* payload being read; NULL while reading a header */
};

static inline struct bootstrap_in* bootstrap_in_of(struct bootstrap_incoming* c) {
  return (struct bootstrap_in*)c;
}

struct bootstrap_peer {
  union braid_sockaddr addr; /* its listener */
  int out_fd;                /* our connection to it, made on first send */
  int closed;                /* its connection to us ended: waits on it fail */
  int gone;                  /* our connection to it ended, or its listener refuses: it is gone */
  int lost_errno;            /* why either ended: 0 closed, ETIMEDOUT host silent, other errno */
  int send_cut;              /* a message to it stopped part-way: sends to it fail */
  int pid;
  char host[BOOTSTRAP_HOST_LEN];
};

/* What ranks tell each other at init, and members at a split. */
struct __attribute__((packed)) bootstrap_peer_wire {
  struct bootstrap_wire_addr listen;
  int32_t pid;
  uint32_t pad;
  uint8_t secret[BOOTSTRAP_SECRET_BYTES]; /* split: member 0's becomes the new group's */
  char host[BOOTSTRAP_HOST_LEN];
};

struct bootstrap {
  int rank, nranks;
  uint8_t secret[BOOTSTRAP_SECRET_BYTES];
  double timeout;                /* BRAID_BOOTSTRAP_TIMEOUT */
  double deadline;               /* waits fail after this (init only); negative: no limit */
  /*
   * The caller's bound on one call after init (bootstrap_send_until, bootstrap_recv_until),
   * negative: none. Its waits then end quietly at that time, call_late telling why.
   */
  double call_deadline;
  int call_late;
  volatile uint32_t* abort_flag; /* the caller's, may be NULL */
  uint32_t aborted;              /* set by bootstrap_abort (atomic) */
  int listen_fd;
  union braid_sockaddr listen_addr;
  char root_text[BOOTSTRAP_TEXT]; /* the root's address, while joining (peer -1) */
  char prev_root_text[BOOTSTRAP_TEXT]; /* the root of the block before ours (peer -2) */
  struct bootstrap_peer* peers;   /* [nranks] */
  int* out_peers;                 /* [nranks]: ranks we have a connection to, watched for its end */
  int nout;
  struct bootstrap_listener listener; /* connections to listen_fd: struct bootstrap_in */
  struct pollfd* pfds;
  int pfd_cap;
  struct bootstrap_msg* queue;    /* unexpected messages, oldest first */
  struct bootstrap_msg** queue_tail;
  uint32_t allgather_seq, barrier_seq;
  /* The first rank whose failure notice arrived (-1: none), and its reason: waits then fail. */
  int failed_peer;
  char failed_why[BOOTSTRAP_FAIL_TEXT];
  int init_done;  /* the caller's init is through: notices are neither sent nor heeded */
  int reporting;  /* bootstrap_report_failure is sending: a notice does not stop its waits */
  /*
   * Held by every collective and point-to-point entry point, so that two
   * threads (a nonblocking split running on its own thread and the user's
   * thread connecting send/recv peers) never interleave on one connection.
   */
  pthread_mutex_t lock;
};

/* Whether bootstrap_abort or the caller's abort flag stopped `b`. */
static inline int bootstrap_aborted(const struct bootstrap* b) {
  return __atomic_load_n(&b->aborted, __ATOMIC_ACQUIRE) ||
         (b->abort_flag && __atomic_load_n(b->abort_flag, __ATOMIC_RELAXED));
}

/* "rank 3 (pid 42 on node2, 10.0.0.3:41234)", or "the root at ..." for peer -1. */
const char* bootstrap_peer_describe(const struct bootstrap* b, int peer, char* buf, size_t size);
/* Checked on every turn of a wait: fails on abort and, while initializing, at the deadline. */
ncclResult_t bootstrap_wait_check(struct bootstrap* b, int peer, const char* what);
/* Moves all of buf over fd (to/from `peer`, -1: the root), serving incoming traffic meanwhile. */
ncclResult_t bootstrap_fd_move(struct bootstrap* b, int fd, void* buf, size_t size, int sending, int peer);
/*
 * One attempt at a connection to `addr` (of `peer`; -1: our root, -2: the root of the block
 * before ours) that presents `hello`: connects (serving our own listener meanwhile), sends the
 * hello and, unless `reply` is NULL, reads the fixed part of the reply into *reply (see
 * bootstrap_dial_answer); *fd is then the connection. Fails with *again = 1 where a new attempt
 * may work: the connect was refused or unreachable (during init only: the listener may not be
 * up yet; after it, a refusal means the peer's bootstrap is gone), or the connection ended
 * before the first byte of the reply (dropped unread: a listener making room, or with
 * BRAID_COMM_ID a finished rendezvous closing the port that the next one is to use). A failed
 * connect leaves its errno in *err (0 for other failures) and, like a dropped connection, is
 * not logged: the caller knows whether to try again.
 */
ncclResult_t bootstrap_dial(struct bootstrap* b, const union braid_sockaddr* addr, int peer,
                            const struct bootstrap_hello* hello, struct bootstrap_reply* reply,
                            int* fd, int* again, int* err);
/*
 * Reads the fixed part of the reply to a hello sent on `fd` (bootstrap_dial without a reply):
 * fails with *again = 1, quietly, when the connection ended before its first byte.
 */
ncclResult_t bootstrap_dial_answer(struct bootstrap* b, int fd, int peer,
                                   struct bootstrap_reply* reply, int* again);
/* A reply with a nonzero status: reads its text and fails with that status and text. */
ncclResult_t bootstrap_reply_fail(struct bootstrap* b, int fd, int peer,
                                  const struct bootstrap_reply* reply);
/*
 * Waits before the next attempt, serving our listener meanwhile: about *pause seconds (with
 * jitter, so that ranks retrying together spread out), which then doubles up to
 * BOOTSTRAP_RETRY_MAX_S; never past the init deadline, which the caller reports. Fails on abort
 * or a failure notice.
 */
ncclResult_t bootstrap_retry_pause(struct bootstrap* b, int peer, double* pause);
/* A hello of `kind` with `secret`, from `b` (NULL: from no rank, as for DISMISS). */
void bootstrap_hello_fill(const struct bootstrap* b, int kind, const uint8_t* secret,
                          struct bootstrap_hello* h);
/*
 * Connects to the ring's next rank now, not at the first message: a failure notice goes over
 * connections already made only (bootstrap_report_failure), and every rank must have one.
 */
ncclResult_t bootstrap_connect_next(struct bootstrap* b);
/* Queues a message at `peer` (connecting on first use); never waits for the matching recv. */
ncclResult_t bootstrap_msg_send(struct bootstrap* b, int peer, int channel, int tag, const void* data,
                                size_t size);
/*
 * The next message from `peer` on `channel` with `tag`; collectives pass
 * any_tag, take messages in arrival order and fail if the tag (their
 * sequence number) is not `tag`. A size other than `size` fails too.
 * After init the wait has no deadline while the peer is alive, but fails with
 * ncclRemoteError naming it once it is gone: its connection closed or reset,
 * its host silent past BRAID_SOCKET_KEEPALIVE_SEC, or (when there is no
 * connection to watch) its listener refusing connections.
 */
ncclResult_t bootstrap_msg_recv(struct bootstrap* b, int peer, int channel, int tag, int any_tag,
                                void* data, size_t size);
/*
 * Readies the message engine of a new `b`: an empty queue, a listener table without connections,
 * no bound on calls.
 */
void bootstrap_conn_init(struct bootstrap* b);
/* Closes every connection of `b` and frees its queue (the listener stays). */
void bootstrap_conn_release(struct bootstrap* b);

/* ------------------------------------------------------------------------
 * Joining the rendezvous, bootstrap_join.c (and the id, bootstrap.c).
 */

/* Unpacks and checks the id called `which` in messages ("commIds[2]"); ncclInvalidArgument, why. */
ncclResult_t bootstrap_id_unpack(const ncclUniqueId* in, const char* which,
                                 struct bootstrap_id_layout* id, union braid_sockaddr* root);

/* The ids given to bootstrap_init, checked. */
struct bootstrap_ids {
  const ncclUniqueId* ids;
  int nids;        /* those that count: all, or 1 with BRAID_COMM_ID (as NCCL's NCCL_COMM_ID) */
  int nroots;      /* roots that serve ranks: bootstrap_roots_used(nids, nranks) */
  uint64_t digest; /* of the roots of ids[0..nids-1], in order (the hellos carry it) */
  struct bootstrap_id_layout first; /* ids[0]: its secret is the job's */
  union braid_sockaddr first_root;
};
/*
 * Checks every id (ncclInvalidArgument naming it: corrupt, of another version, from
 * BRAID_COMM_ID beside ncclGetUniqueId's, the same id twice) and fills *out.
 */
ncclResult_t bootstrap_ids_check(const ncclUniqueId* ids, int nids, int nranks,
                                 struct bootstrap_ids* out);
/*
 * Joins the root of our block and, as the first rank of a block with several roots, the root
 * of the block before it; afterwards b->peers[next].addr says where the next rank listens.
 * Fails with the root's refusal or failure (the missing ranks after its timeout), or at
 * b->deadline.
 */
ncclResult_t bootstrap_join(struct bootstrap* b, const struct bootstrap_ids* ids);
/* Tells the roots of ids that serve no rank (more ids than ranks) to go; best effort. */
void bootstrap_dismiss_unused(const struct bootstrap_ids* ids, volatile uint32_t* abort);

/* ------------------------------------------------------------------------
 * The root, bootstrap_root.c, run by a thread (ncclGetUniqueId's, detached,
 * or rank 0's in BRAID_COMM_ID mode, joined by bootstrap_init).
 */
struct bootstrap_root;
/*
 * Listens at `addr` (port 0 picks one; the bound address is written back)
 * and starts the thread. A detached root frees itself when it is done;
 * otherwise `*out` must be passed to bootstrap_root_join. A root waits for its
 * first rank as long as it takes (an id may be used long after it was made);
 * the timeout counts from the first JOIN.
 */
ncclResult_t bootstrap_root_start(union braid_sockaddr* addr, const uint8_t* secret,
                                  double timeout_sec, int detached, struct bootstrap_root** out);
/* Waits for a joinable root to finish (stop_now: tell it to stop serving first), then frees it. */
void bootstrap_root_join(struct bootstrap_root* root, int stop_now);

/*
 * The root without its thread or listener, for its fuzzer: connections are
 * handed in by bootstrap_root_add (0, or -1 when out of memory) and served by
 * bootstrap_root_serve (one poll round of at most wait_ms, then the hello
 * limits and the timeout; returns 1 once the rendezvous is over), exactly as
 * the thread serves them.
 */
ncclResult_t bootstrap_root_create(const uint8_t* secret, double timeout_sec,
                                   struct bootstrap_root** out);
int bootstrap_root_add(struct bootstrap_root* root, int fd, const union braid_sockaddr* remote);
int bootstrap_root_serve(struct bootstrap_root* root, int wait_ms);
void bootstrap_root_destroy(struct bootstrap_root* root);

/*
 * An incoming connection of the listener (bootstrap_conn.c), registered with
 * bootstrap_listener_add(&b->listener, ...): read as far as its bytes go (hello, then
 * header/payload pairs; a bad one is rejected and closed), closed. Used by the listener's
 * progress and by the parser's fuzzer.
 */
void bootstrap_in_read(struct bootstrap* b, struct bootstrap_in* c);
void bootstrap_in_close(struct bootstrap_in* c);

#endif
