/*
 * How the bootstrap's listeners admit connections: a rank's listener
 * (bootstrap_conn.c) and the root's (bootstrap_root.c) take, read, limit and
 * drop connections the same way, here; each owner only decides what a hello
 * it has read means, and what comes after it.
 *
 * Strangers cannot lock real peers out: a listener holds at most
 * BOOTSTRAP_MAX_PENDING connections that have not yet presented a valid
 * hello, and when one more arrives the oldest of them is dropped. A rank
 * presents its hello the moment it connects, so it is the newest, and the
 * listener reads a new connection as soon as it takes it. A connection gets
 * BOOTSTRAP_HELLO_SEC for its hello. Rejections are logged as one WARN per
 * burst (BOOTSTRAP_REJECT_WARN_S), the rest counted.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bootstrap/bootstrap_internal.h"
#include "base/debug.h"
#include "base/socket.h"
#include "base/utils.h"

/* Longest name a listener gives itself in its log lines. */
#define LISTENER_NAME 160

void bootstrap_listener_init(struct bootstrap_listener* l, const struct bootstrap_listener_ops* ops,
                             void* owner) {
  memset(l, 0, sizeof *l);
  l->ops = ops;
  l->owner = owner;
}

/* Notes one rejection: a WARN for the first of a burst, a count for the others. */
static void bootstrap_listener_note(struct bootstrap_listener* l, const union braid_sockaddr* remote,
                                    const char* why) {
  char addr[BOOTSTRAP_TEXT], who[LISTENER_NAME];
  const double now = braid_time_sec();
  socket_addr_str(remote, addr, sizeof addr);
  l->ops->name(l->owner, who, sizeof who);
  if (l->warned > 0 && now - l->warned < BOOTSTRAP_REJECT_WARN_S) {
    l->quiet++;
    TRACE(BRAID_LOG_BOOTSTRAP, "%s rejected connection from %s: %s", who, addr, why);
    return;
  }
  if (l->quiet > 0)
    WARN("%s rejected connection from %s: %s (and %u more since the last such warning)", who, addr,
         why, l->quiet);
  else
    WARN("%s rejected connection from %s: %s (more within %.0f s are counted, not listed)", who,
         addr, why, BOOTSTRAP_REJECT_WARN_S);
  l->warned = now > 0 ? now : 1e-9;
  l->quiet = 0;
}

void bootstrap_listener_reject(struct bootstrap_listener* l, struct bootstrap_incoming* c,
                               const char* why) {
  bootstrap_listener_note(l, &c->remote, why);
  l->ops->close(l->owner, c);
}

void bootstrap_reply_now(int fd, ncclResult_t status, const char* text) {
  struct {
    struct bootstrap_reply head;
    char text[BOOTSTRAP_MAX_REPLY_TEXT];
  } out;
  const size_t len = text ? BRAID_MIN(strlen(text), (size_t)BOOTSTRAP_MAX_REPLY_TEXT) : 0;
  size_t moved = 0;
  memset(&out.head, 0, sizeof out.head);
  out.head.magic = BOOTSTRAP_WIRE_MAGIC;
  out.head.status = (int32_t)status;
  out.head.text_len = (uint32_t)len;
  if (len) memcpy(out.text, text, len);
  /* A refused sender's unread bytes would turn the close that follows into a reset. */
  for (int i = 0; status != ncclSuccess && i < 16; i++) {
    char sink[512];
    if (socket_recv_some(fd, sink, sizeof sink, &moved) != ncclSuccess || moved == 0) break;
  }
  socket_send_some(fd, &out, sizeof out.head + len, &moved);
}

void bootstrap_listener_refuse(struct bootstrap_listener* l, struct bootstrap_incoming* c,
                               ncclResult_t status, const char* text, const char* why) {
  if (bootstrap_hello_is_ours(&c->hello)) bootstrap_reply_now(c->fd, status, text);
  bootstrap_listener_reject(l, c, why);
}

struct bootstrap_incoming* bootstrap_listener_add(struct bootstrap_listener* l, int fd,
                                                  const union braid_sockaddr* remote) {
  if (l->n == l->cap) {
    int cap = l->cap ? 2 * l->cap : 16;
    struct bootstrap_incoming** grown = realloc(l->conns, (size_t)cap * sizeof *grown);
    if (grown == NULL) return NULL;
    l->conns = grown;
    l->cap = cap;
  }
  struct bootstrap_incoming* c = calloc(1, l->ops->conn_size);
  if (c == NULL) return NULL;
  c->fd = fd;
  c->rank = -1;
  c->remote = *remote;
  c->since = braid_time_sec();
  c->hello_deadline = c->since + BOOTSTRAP_HELLO_SEC;
  l->conns[l->n++] = c;
  return c;
}

/* Past BOOTSTRAP_MAX_PENDING connections without a hello, the oldest one makes room. */
static void bootstrap_listener_make_room(struct bootstrap_listener* l) {
  char why[160];
  struct bootstrap_incoming* oldest = NULL;
  int pending = 0;
  for (int i = 0; i < l->n; i++) {
    struct bootstrap_incoming* c = l->conns[i];
    if (c->fd < 0 || c->rank >= 0) continue;
    pending++;
    if (oldest == NULL || c->since < oldest->since) oldest = c;
  }
  if (pending <= BOOTSTRAP_MAX_PENDING) return;
  snprintf(why, sizeof why,
           "dropped after %.2f s without a hello (%zu of %zu bytes) to make room: %d connections "
           "were waiting to present one", braid_time_sec() - oldest->since, oldest->got,
           sizeof oldest->hello, pending);
  bootstrap_listener_reject(l, oldest, why);
}

int bootstrap_listener_accept(struct bootstrap_listener* l, int listen_fd) {
  for (int taken = 0; taken < BOOTSTRAP_ACCEPT_BATCH; taken++) {
    int fd = -1;
    union braid_sockaddr remote;
    if (socket_accept_some(listen_fd, &fd, &remote) != ncclSuccess) return -1;
    if (fd < 0) return 0;
    socket_keepalive(fd, socket_keepalive_sec());
    struct bootstrap_incoming* c = bootstrap_listener_add(l, fd, &remote);
    if (c == NULL) {
      bootstrap_listener_note(l, &remote, "out of memory");
      close(fd);
      continue;
    }
    const int done = l->ops->read(l->owner, c);
    bootstrap_listener_make_room(l);
    if (done) return 0;
  }
  return 0;
}

void bootstrap_listener_poll_fill(const struct bootstrap_listener* l, struct pollfd* pfds) {
  for (int i = 0; i < l->n; i++) pfds[i] = (struct pollfd){.fd = l->conns[i]->fd, .events = POLLIN};
}

int bootstrap_listener_poll_read(struct bootstrap_listener* l, const struct pollfd* pfds, int n) {
  /* Reads close connections but neither move nor remove them, so index i still names pfds[i]. */
  for (int i = 0; i < n; i++)
    if (pfds[i].revents && l->conns[i]->fd >= 0 && l->ops->read(l->owner, l->conns[i])) return 1;
  return 0;
}

int bootstrap_listener_hello_read(struct bootstrap_listener* l, struct bootstrap_incoming* c) {
  char why[128];
  size_t got = 0;
  if (socket_recv_some(c->fd, (char*)&c->hello + c->got, sizeof c->hello - c->got, &got) !=
      ncclSuccess) {
    snprintf(why, sizeof why, "it closed after %zu of the %zu bytes of a hello", c->got,
             sizeof c->hello);
    bootstrap_listener_reject(l, c, why);
    return -1;
  }
  c->got += got;
  const char* bad = bootstrap_hello_prefix_check(&c->hello, c->got);
  if (bad != NULL) {
    bootstrap_listener_reject(l, c, bad);
    return -1;
  }
  return c->got == sizeof c->hello;
}

void bootstrap_listener_sweep(struct bootstrap_listener* l) {
  char why[96];
  const double now = braid_time_sec();
  int kept = 0;
  for (int i = 0; i < l->n; i++) {
    struct bootstrap_incoming* c = l->conns[i];
    if (c->fd >= 0 && c->rank < 0 && now >= c->hello_deadline) {
      snprintf(why, sizeof why, "no hello within %.0f s (%zu of %zu bytes)", BOOTSTRAP_HELLO_SEC,
               c->got, sizeof c->hello);
      bootstrap_listener_reject(l, c, why);
    }
    if (c->fd >= 0)
      l->conns[kept++] = c;
    else
      free(c);
  }
  l->n = kept;
}

void bootstrap_listener_close(struct bootstrap_listener* l, const char* why) {
  for (int i = 0; i < l->n; i++) {
    struct bootstrap_incoming* c = l->conns[i];
    if (c->fd >= 0 && c->rank < 0 && why != NULL)
      bootstrap_listener_reject(l, c, why);
    else if (c->fd >= 0)
      l->ops->close(l->owner, c);
    free(c);
  }
  free(l->conns);
  l->conns = NULL;
  l->n = l->cap = 0;
  if (why != NULL && l->quiet > 0) {
    char who[LISTENER_NAME];
    INFO(BRAID_LOG_BOOTSTRAP, "%s rejected %u more connections after its last warning",
         l->ops->name(l->owner, who, sizeof who), l->quiet);
  }
  l->quiet = 0;
}
