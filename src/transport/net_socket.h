/*
 * The socket backend's insides, shared by net_socket.c (devices, listen,
 * connect, accept, close) and net_socket_data.c (requests, the control
 * stream, helper threads), and by its unit test.
 *
 * A connection is one control stream plus `nstreams` data streams (TCP
 * connections), BRAID_SOCKET_NTHREADS x BRAID_NSOCKS_PERTHREAD of them. The
 * control stream carries, in order, one header per message (its size) and
 * the whole payload of small messages (at most SOCK_INLINE_BYTES), moved by
 * the calling thread itself so that a small message costs no thread
 * hand-off. A larger message is cut into at most `nstreams` pieces of at
 * least SOCK_MIN_PIECE bytes (net_socket_share); each piece is a task queued
 * on one data stream, and helper threads, each owning some streams, move
 * them. Sender and receiver compute the same pieces from the size, so each
 * data stream is a plain sequence of pieces in message order.
 *
 * Ownership: the caller (the proxy) owns the requests and the control
 * stream; helper thread i alone touches the streams s with s % nthreads == i
 * and pops their task queues. A task queue is single-producer (the caller)
 * single-consumer (the helper).
 */
#ifndef BRAID_TRANSPORT_NET_SOCKET_H
#define BRAID_TRANSPORT_NET_SOCKET_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "base/socket.h"
#include "nccl.h"
#include "transport/net.h"

#define SOCK_MAX_STREAMS 64
#define SOCK_MAX_THREADS 16
#define SOCK_MAX_REQS 32                  /* outstanding requests per comm */
#define SOCK_INLINE_BYTES (16u << 10)     /* at most this: payload rides on the control stream */
#define SOCK_MIN_PIECE ((size_t)64 << 10) /* smallest piece a data stream carries */
#define SOCK_PIECE_ALIGN 4096
#define SOCK_HELLO_SEC 5.0                /* a new connection must present its hello by then */
#define SOCK_HELPER_SPIN_SEC 50e-6    /* a helper with nothing to do yields this long before sleeping */
#define SOCK_MAGIC 0x4b434f53u            /* "SOCK" */
#define SOCK_VERSION 1

/*
 * The piece of a `size`-byte message (number `seq` on its comm) that data
 * stream `stream` of `nstreams` carries: [*off, *off + *len), *len = 0 when
 * none. Inline messages have no pieces. Consecutive messages start on
 * consecutive streams, so small-but-not-inline messages spread out too.
 */
void net_socket_share(size_t size, int nstreams, uint64_t seq, int stream, size_t* off, size_t* len);

/*
 * Per-message header on the control stream. A sender that closes its comm
 * sends one last header with SOCK_FLAG_BYE, so that its receiver can tell a
 * peer that is done (later receives just never complete, as with a peer that
 * sends nothing more) from one that died (end of stream without goodbye:
 * an error).
 */
#define SOCK_FLAG_BYE 0x1
struct sock_header {
  uint32_t magic;
  uint32_t flags; /* SOCK_FLAG_* */
  uint64_t size;
};

struct sock_comm;

struct sock_req {
  struct sock_comm* comm;
  uint64_t seq;
  char* data;
  size_t size;              /* sender: message bytes; receiver: room posted */
  size_t nbytes;            /* message bytes (receiver: known once its header arrived) */
  int used;
  int ctrl_done;            /* header (and inline payload) moved */
  atomic_int streams_left;  /* pieces not yet moved by the helpers */
};

struct sock_task {
  struct sock_req* req;
  char* ptr;
  size_t len;
};

struct sock_stream {
  int fd;
  struct sock_task tasks[SOCK_MAX_REQS];
  atomic_uint_fast64_t pushed; /* tasks queued (caller) */
  atomic_uint_fast64_t popped; /* tasks finished (helper) */
  size_t done;                 /* helper: bytes of the current task moved */
};

struct sock_helper {
  struct sock_comm* comm;
  int index;
  int efd;            /* eventfd the caller writes to wake the helper */
  atomic_int sleeping;
  double idle_since;  /* when it last found nothing to move (0: busy) */
  pthread_t thread;
  int started;
};

struct sock_comm {
  int is_send;
  struct net_connect_try connect_try; /* connecting: the stream being opened */
  int ctrl_fd;
  int nstreams, nthreads;
  char peer[80];                /* the remote address, for messages */
  struct sock_stream streams[SOCK_MAX_STREAMS];
  struct sock_helper helpers[SOCK_MAX_THREADS];
  struct sock_req reqs[SOCK_MAX_REQS];
  uint64_t posted;              /* requests posted so far */
  uint64_t ctrl_seq;            /* request whose header/inline payload is on the control stream */
  uint64_t freed;               /* requests test() found done (below ctrl_seq, any order) */
  size_t ctrl_moved;            /* its bytes moved so far (header, then payload) */
  struct sock_header ctrl_hdr;  /* its header */
  atomic_int closing;
  atomic_int failed;            /* set once; err_* then hold the first error */
  pthread_mutex_t err_lock;
  ncclResult_t err_code;
  int peer_done;                /* receiver: the sender said goodbye; no more messages come */
  char err_text[320];
  int err_reported;
};

/*
 * The first bytes of every stream of a connection, from the sender: the
 * listener reads them before it trusts the stream (net_socket.c).
 */
struct __attribute__((packed)) sock_hello {
  uint32_t magic;
  uint16_t version;
  uint16_t index; /* 0: control stream; 1..nstreams: data stream index-1 */
  uint8_t key[BRAID_NET_KEY_BYTES];
  uint64_t conn_id; /* random, never 0 */
  uint32_t nstreams;
  uint32_t pad;
};

/*
 * The listener's side of the handshake, in pieces that its fuzz harness
 * (tests/unit/fuzz_net_socket.c) drives without a listening socket. accept()
 * is: take new connections into pending slots, then one handshake step.
 */
struct sock_listen;
/* A listener for `key` with no socket yet (accept() then only reads what pending_add gave it). */
ncclResult_t net_socket_listen_alloc(const uint8_t* key, struct sock_listen** out);
/* Closes every fd it holds and frees it. */
void net_socket_listen_free(struct sock_listen* l);
/* Hands a new connection's fd to the listener; -1 (and the fd closed) when no slot is free. */
int net_socket_pending_add(struct sock_listen* l, int fd, const union braid_sockaddr* remote,
                           double now);
/*
 * Reads what arrived of the pending connections' hellos: a stream with a
 * wrong key, garbage, or nothing by its deadline is closed (and logged); one
 * that completes its connection's set of streams turns them into a receive
 * comm, *recv_comm (NULL: none complete yet).
 */
ncclResult_t net_socket_handshake_step(struct sock_listen* l, double now, void** recv_comm);

/* Starts the helper threads of a comm whose fds are set; on failure the comm is safe to free. */
ncclResult_t net_socket_comm_start(struct sock_comm* c);
/* Stops helpers, closes fds, frees. */
void net_socket_comm_free(struct sock_comm* c);
/* The same without the goodbye (an abort): the peer sees the connection end, an error. */
void net_socket_comm_abandon(struct sock_comm* c);
/* Records the comm's first error (any thread). */
void net_socket_comm_fail(struct sock_comm* c, ncclResult_t code, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));

ncclResult_t net_socket_isend(void* send_comm, void* data, size_t size, void* mhandle, void** request);
ncclResult_t net_socket_irecv(void* recv_comm, void* data, size_t size, void* mhandle, void** request);
ncclResult_t net_socket_test(void* request, int* done, size_t* size);
/* The control stream's fd, and whether requests are under way past it (see braid_net_ops). */
int net_socket_recv_fd(void* recv_comm);
int net_socket_recv_busy(void* recv_comm);

/* Streams and helper threads a new connection gets (BRAID_SOCKET_NTHREADS x BRAID_NSOCKS_PERTHREAD). */
void net_socket_stream_counts(int* nstreams, int* nthreads);

#endif
