/*
 * Unit tests of how the bootstrap's listeners admit connections
 * (src/bootstrap/bootstrap_listen.c), on a loopback listener served by an
 * owner of the test's own, which takes a hello carrying its secret and
 * refuses any other, as a rank's listener and the root do:
 *
 * - at most BOOTSTRAP_MAX_PENDING connections wait for their hello; one more
 *   and the oldest of them is dropped, while taken ones never count;
 * - a rank whose hello is already there when it is taken wins over a backlog
 *   of strangers that came before it;
 * - garbage and an older wire version are dropped at their first bytes, a
 *   hello cut short when its sender closes, a split hello is put together;
 * - a refused hello in Braid's format is answered with the reason, garbage is
 *   not answered;
 * - the hello deadline drops only connections still without a hello;
 * - rejections are one WARN per burst, the rest counted, the count said at
 *   INFO when the listener closes;
 * - an owner that says it is done stops the accepts and the reads;
 * - closing the listener closes every connection and leaves no fd behind.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/debug.h"
#include "base/param.h"
#include "base/socket.h"
#include "base/utils.h"
#include "bootstrap/bootstrap_internal.h"
#include "test.h"

#define TEST_REFUSAL "test listener: refused"

/* The owner: accepts a hello with its secret (rank: the hello's), refuses the others. */
struct test_owner {
  struct bootstrap_listener l;
  int listen_fd;
  union braid_sockaddr addr;
  uint8_t secret[BOOTSTRAP_SECRET_BYTES];
  int done_on_accept; /* read says "done" once a hello was accepted */
  int done;
  int reads, accepted, refused, closed;
  int bad_closes; /* close called on a connection already closed */
};

/* The owner's record of a connection, larger than the listener's, as a rank's listener has. */
struct test_conn {
  struct bootstrap_incoming base;
  char owner_state[40];
};

static int test_owner_read(void* owner, struct bootstrap_incoming* c) {
  struct test_owner* o = owner;
  o->reads++;
  if (c->rank < 0 && bootstrap_listener_hello_read(&o->l, c) > 0) {
    const char* why = bootstrap_hello_check(&c->hello, o->secret);
    if (why == NULL) {
      bootstrap_reply_now(c->fd, ncclSuccess, NULL);
      c->rank = c->hello.rank;
      o->accepted++;
      if (o->done_on_accept) o->done = 1;
    } else {
      o->refused++;
      bootstrap_listener_refuse(&o->l, c, ncclInvalidArgument, TEST_REFUSAL, why);
    }
  }
  return o->done;
}

static void test_owner_close(void* owner, struct bootstrap_incoming* c) {
  struct test_owner* o = owner;
  if (c->fd < 0) o->bad_closes++;
  socket_close(&c->fd);
  o->closed++;
}

static const char* test_owner_name(const void* owner, char* buf, size_t size) {
  (void)owner;
  snprintf(buf, size, "test listener");
  return buf;
}

static const struct bootstrap_listener_ops test_ops = {
    .conn_size = sizeof(struct test_conn),
    .read = test_owner_read,
    .close = test_owner_close,
    .name = test_owner_name,
};

static void test_owner_open(struct test_owner* o) {
  memset(o, 0, sizeof *o);
  memset(o->secret, 0x3c, sizeof o->secret);
  o->addr.sin.sin_family = AF_INET;
  o->addr.sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  o->listen_fd = -1;
  TEST_EXPECT_RES(socket_listen(&o->addr, &o->listen_fd), ncclSuccess);
  bootstrap_listener_init(&o->l, &test_ops, o);
}

static void test_owner_shut(struct test_owner* o, const char* why) {
  bootstrap_listener_close(&o->l, why);
  socket_close(&o->listen_fd);
  TEST_CHECK(o->l.n == 0 && o->l.conns == NULL, "closed listener still holds %d connections", o->l.n);
  TEST_CHECK(o->bad_closes == 0, "close called %d times on closed connections", o->bad_closes);
}

/* Takes what waits on the listener (after waiting up to 2 s for something to come). */
static void test_take(struct test_owner* o) {
  struct pollfd p = {.fd = o->listen_fd, .events = POLLIN};
  poll(&p, 1, 2000);
  TEST_CHECK(bootstrap_listener_accept(&o->l, o->listen_fd) == 0, "accept failed: %s",
             strerror(errno));
}

/* Takes until nothing waits any more. */
static void test_take_all(struct test_owner* o) {
  for (;;) {
    struct pollfd p = {.fd = o->listen_fd, .events = POLLIN};
    if (poll(&p, 1, 200) <= 0) return;
    TEST_CHECK(bootstrap_listener_accept(&o->l, o->listen_fd) == 0, "accept failed: %s",
               strerror(errno));
  }
}

/* One poll round over the held connections, as an owner's progress does; returns poll_read's. */
static int test_serve(struct test_owner* o, int wait_ms) {
  struct pollfd pfds[256];
  const int n = o->l.n;
  if (n > (int)(sizeof pfds / sizeof pfds[0])) return -1;
  bootstrap_listener_poll_fill(&o->l, pfds);
  if (poll(pfds, (nfds_t)n, wait_ms) <= 0) return 0;
  return bootstrap_listener_poll_read(&o->l, pfds, n);
}

static int test_connect(const struct test_owner* o) {
  int fd = -1;
  TEST_EXPECT_RES(socket_connect(&o->addr, 5.0, NULL, &fd), ncclSuccess);
  return fd;
}

static void test_send(int fd, const void* data, size_t size) {
  TEST_CHECK(send(fd, data, size, MSG_NOSIGNAL) == (ssize_t)size, "send of %zu bytes: %s", size,
             strerror(errno));
}

/* A hello of rank `rank` with `secret`. */
static void test_hello(struct bootstrap_hello* h, const uint8_t* secret, int rank) {
  bootstrap_hello_fill(NULL, BOOTSTRAP_HELLO_PEER, secret, h);
  h->rank = rank;
  h->nranks = 1024;
}

/* Whether the listener closed this client's connection within `sec` (bytes before that are read). */
static int test_closed_by_listener(int fd, double sec) {
  const double end = braid_time_sec() + sec;
  char sink[512];
  for (;;) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    const double left = end - braid_time_sec();
    if (poll(&p, 1, left > 0 ? (int)(left * 1000) + 1 : 0) <= 0) return 0;
    ssize_t n = recv(fd, sink, sizeof sink, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return 1;
  }
}

/* Whether the listener closed this client's connection without sending it a byte. */
static int test_closed_unanswered(int fd, double sec) {
  struct pollfd p = {.fd = fd, .events = POLLIN};
  char byte;
  if (poll(&p, 1, (int)(sec * 1000)) <= 0) return 0;
  ssize_t n = recv(fd, &byte, 1, MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno == ECONNRESET);
}

/* Whether the connection is still open and quiet from the client's side. */
static int test_still_open(int fd) {
  struct pollfd p = {.fd = fd, .events = POLLIN};
  return poll(&p, 1, 0) == 0;
}

/* Held connections still without an accepted hello. */
static int test_pending(const struct test_owner* o) {
  int n = 0;
  for (int i = 0; i < o->l.n; i++) n += o->l.conns[i]->fd >= 0 && o->l.conns[i]->rank < 0;
  return n;
}

/* The answer to a hello: its status, and its text in `text`. -1: none came. */
static int test_reply(int fd, char* text, size_t size) {
  struct bootstrap_reply head;
  text[0] = '\0';
  if (socket_recv_all(fd, &head, sizeof head, 2.0, NULL) != ncclSuccess) return -1;
  TEST_CHECK(head.magic == BOOTSTRAP_WIRE_MAGIC, "reply magic 0x%08x", head.magic);
  size_t len = BRAID_MIN((size_t)head.text_len, size - 1);
  if (len > 0 && socket_recv_all(fd, text, len, 2.0, NULL) != ncclSuccess) return -1;
  text[len] = '\0';
  return head.status;
}

static int test_fd_count(void) {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  if (d == NULL) return -1;
  for (struct dirent* e; (e = readdir(d)) != NULL;) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

/* ------------------------------------------------------------------ cases */

#define TEST_SILENT (BOOTSTRAP_MAX_PENDING + 6)

/* One more than BOOTSTRAP_MAX_PENDING silent connections: the oldest make room, in order. */
static void test_make_room(void) {
  struct test_owner o;
  int fds[TEST_SILENT + 2];
  test_owner_open(&o);
  for (int i = 0; i < TEST_SILENT; i++) {
    fds[i] = test_connect(&o);
    test_take(&o);
    TEST_CHECK(test_pending(&o) == BRAID_MIN(i + 1, BOOTSTRAP_MAX_PENDING),
               "%d pending after %d connections", test_pending(&o), i + 1);
  }
  const int dropped = TEST_SILENT - BOOTSTRAP_MAX_PENDING;
  TEST_CHECK(o.closed == dropped, "%d connections dropped, expected %d", o.closed, dropped);
  for (int i = 0; i < TEST_SILENT; i++) {
    if (i < dropped)
      TEST_CHECK(test_closed_by_listener(fds[i], 2.0), "connection %d (of the oldest) kept", i);
    else
      TEST_CHECK(test_still_open(fds[i]), "connection %d (of the newest) dropped", i);
  }
  /* A taken connection does not count: a rank joins without making room. */
  struct bootstrap_hello h;
  char text[BOOTSTRAP_MAX_REPLY_TEXT + 1];
  test_hello(&h, o.secret, 5);
  fds[TEST_SILENT] = test_connect(&o);
  test_send(fds[TEST_SILENT], &h, sizeof h);
  test_take(&o);
  TEST_CHECK(o.accepted == 1 && o.closed == dropped, "the rank's join: %d accepted, %d dropped",
             o.accepted, o.closed);
  TEST_CHECK(test_reply(fds[TEST_SILENT], text, sizeof text) == ncclSuccess, "the rank's answer");
  TEST_CHECK(test_still_open(fds[dropped]), "the oldest waiting connection made room for a rank");
  /* The next stranger does make room: the oldest still waiting goes. */
  fds[TEST_SILENT + 1] = test_connect(&o);
  test_take(&o);
  TEST_CHECK(test_pending(&o) == BOOTSTRAP_MAX_PENDING, "%d pending", test_pending(&o));
  TEST_CHECK(test_closed_by_listener(fds[dropped], 2.0), "connection %d kept", dropped);
  TEST_CHECK(test_still_open(fds[TEST_SILENT]), "the rank's connection was dropped");
  bootstrap_listener_sweep(&o.l);
  TEST_CHECK(o.l.n == BOOTSTRAP_MAX_PENDING + 1, "%d held after the sweep, expected %d", o.l.n,
             BOOTSTRAP_MAX_PENDING + 1);
  const int held = o.l.n, closed_before = o.closed;
  test_owner_shut(&o, "the test ends");
  TEST_CHECK(o.closed - closed_before == held, "closing the listener closed %d of %d",
             o.closed - closed_before, held);
  for (int i = dropped + 1; i < TEST_SILENT + 2; i++) {
    TEST_CHECK(test_closed_by_listener(fds[i], 2.0), "connection %d open after the close", i);
  }
  for (int i = 0; i < TEST_SILENT + 2; i++) close(fds[i]);
}

/* A backlog of strangers, then a rank: taking them in batches, the rank gets in. */
static void test_rank_after_strangers(void) {
  struct test_owner o;
  enum { STRANGERS = 3 * BOOTSTRAP_MAX_PENDING };
  int fds[STRANGERS + 1];
  struct bootstrap_hello h;
  char text[BOOTSTRAP_MAX_REPLY_TEXT + 1];
  test_owner_open(&o);
  for (int i = 0; i < STRANGERS; i++) fds[i] = test_connect(&o);
  test_hello(&h, o.secret, 7);
  fds[STRANGERS] = test_connect(&o);
  test_send(fds[STRANGERS], &h, sizeof h);
  test_take_all(&o);
  TEST_CHECK(o.accepted == 1, "the rank behind %d strangers: %d accepted", STRANGERS, o.accepted);
  TEST_CHECK(test_pending(&o) == BOOTSTRAP_MAX_PENDING, "%d pending", test_pending(&o));
  TEST_CHECK(o.closed == STRANGERS - BOOTSTRAP_MAX_PENDING, "%d strangers dropped", o.closed);
  TEST_CHECK(test_reply(fds[STRANGERS], text, sizeof text) == ncclSuccess, "the rank's answer");
  test_owner_shut(&o, "the test ends");
  for (int i = 0; i <= STRANGERS; i++) close(fds[i]);
}

/* What is not a hello goes at its first bytes; a hello in two parts is put together. */
static void test_first_bytes(void) {
  struct test_owner o;
  struct bootstrap_hello h;
  char text[BOOTSTRAP_MAX_REPLY_TEXT + 1];
  test_owner_open(&o);
  /* Four bytes of garbage: dropped at once, unanswered. */
  int garbage = test_connect(&o);
  test_send(garbage, "GET ", 4);
  test_take(&o);
  TEST_CHECK(o.closed == 1, "garbage: %d closed", o.closed);
  TEST_CHECK(test_closed_unanswered(garbage, 2.0), "garbage was answered, or kept");
  /* The magic and another version, the rest still to come: dropped as well. */
  test_hello(&h, o.secret, 1);
  h.version = BOOTSTRAP_WIRE_VERSION + 1;
  int old = test_connect(&o);
  test_send(old, &h, offsetof(struct bootstrap_hello, secret));
  test_take(&o);
  TEST_CHECK(o.closed == 2, "another version: %d closed", o.closed);
  TEST_CHECK(test_closed_by_listener(old, 2.0), "another version's connection kept");
  /* Half a hello, then the rest: accepted once it is whole. */
  test_hello(&h, o.secret, 2);
  int split = test_connect(&o);
  test_send(split, &h, sizeof h / 2);
  test_take(&o);
  TEST_CHECK(o.accepted == 0 && test_pending(&o) == 1, "half a hello: %d accepted, %d pending",
             o.accepted, test_pending(&o));
  test_send(split, (const char*)&h + sizeof h / 2, sizeof h - sizeof h / 2);
  for (int i = 0; i < 20 && o.accepted == 0; i++) test_serve(&o, 100);
  TEST_CHECK(o.accepted == 1, "the split hello was not put together");
  TEST_CHECK(test_reply(split, text, sizeof text) == ncclSuccess, "the split hello's answer");
  /* Half a hello, then the sender closes: dropped. */
  int cut = test_connect(&o);
  test_send(cut, &h, sizeof h / 2);
  test_take(&o);
  close(cut);
  for (int i = 0; i < 20 && o.closed == 2; i++) test_serve(&o, 100);
  TEST_CHECK(o.closed == 3, "a hello cut short: %d closed", o.closed);
  bootstrap_listener_sweep(&o.l);
  TEST_CHECK(o.l.n == 1, "%d held after the sweep, expected the accepted one", o.l.n);
  test_owner_shut(&o, "the test ends");
  close(garbage);
  close(old);
  close(split);
}

/* A refused hello in Braid's format hears why; the refusal closes the connection. */
static void test_refusal(void) {
  struct test_owner o;
  struct bootstrap_hello h;
  char text[BOOTSTRAP_MAX_REPLY_TEXT + 1];
  uint8_t wrong[BOOTSTRAP_SECRET_BYTES];
  test_owner_open(&o);
  memset(wrong, 0x3d, sizeof wrong);
  test_hello(&h, wrong, 3);
  int fd = test_connect(&o);
  test_send(fd, &h, sizeof h);
  test_take(&o);
  TEST_CHECK(o.refused == 1 && o.closed == 1, "wrong secret: %d refused, %d closed", o.refused,
             o.closed);
  const int status = test_reply(fd, text, sizeof text);
  TEST_CHECK(status == ncclInvalidArgument && strcmp(text, TEST_REFUSAL) == 0,
             "the refusal's answer: status %d, \"%s\"", status, text);
  TEST_CHECK(test_closed_by_listener(fd, 2.0), "the refused connection stayed open");
  test_owner_shut(&o, "the test ends");
  close(fd);
}

/* The hello deadline: set when a connection is taken, it drops only the ones still waiting. */
static void test_deadline(void) {
  struct test_owner o;
  struct bootstrap_hello h;
  int fds[3];
  test_owner_open(&o);
  const double before = braid_time_sec();
  fds[0] = test_connect(&o);
  test_take(&o);
  fds[1] = test_connect(&o);
  test_take(&o);
  test_hello(&h, o.secret, 4);
  fds[2] = test_connect(&o);
  test_send(fds[2], &h, sizeof h);
  test_take(&o);
  TEST_CHECK(o.l.n == 3 && o.accepted == 1, "%d held, %d accepted", o.l.n, o.accepted);
  for (int i = 0; i < o.l.n; i++) {
    const struct bootstrap_incoming* c = o.l.conns[i];
    TEST_CHECK(c->since >= before && c->since <= braid_time_sec(), "connection %d taken at %.3f",
               i, c->since - before);
    TEST_CHECK(c->hello_deadline == c->since + BOOTSTRAP_HELLO_SEC,
               "connection %d: hello deadline %.3f s after it was taken", i,
               c->hello_deadline - c->since);
  }
  bootstrap_listener_sweep(&o.l);
  TEST_CHECK(o.l.n == 3 && o.closed == 0, "a sweep before any deadline dropped %d", o.closed);
  /* The first silent one and the accepted one are past their deadline. */
  o.l.conns[0]->hello_deadline = braid_time_sec() - 0.001;
  o.l.conns[2]->hello_deadline = braid_time_sec() - 0.001;
  bootstrap_listener_sweep(&o.l);
  TEST_CHECK(o.l.n == 2 && o.closed == 1, "after the deadline: %d held, %d closed", o.l.n,
             o.closed);
  TEST_CHECK(test_closed_by_listener(fds[0], 2.0), "the silent connection past its deadline stayed");
  TEST_CHECK(test_still_open(fds[1]), "a silent connection within its deadline was dropped");
  char text[BOOTSTRAP_MAX_REPLY_TEXT + 1];
  TEST_CHECK(test_reply(fds[2], text, sizeof text) == ncclSuccess, "the accepted one's answer");
  TEST_CHECK(test_still_open(fds[2]), "the accepted connection was dropped at the hello deadline");
  test_owner_shut(&o, NULL);
  TEST_CHECK(o.closed == 3, "closing without a word closed %d of 3", o.closed);
  for (int i = 0; i < 3; i++) close(fds[i]);
}

/* An owner that is done stops the accepts (the rest wait in the backlog) and the reads. */
static void test_owner_done(void) {
  struct test_owner o;
  struct bootstrap_hello h;
  int fds[3];
  test_owner_open(&o);
  o.done_on_accept = 1;
  for (int i = 0; i < 3; i++) {
    test_hello(&h, o.secret, 10 + i);
    fds[i] = test_connect(&o);
    test_send(fds[i], &h, sizeof h);
  }
  test_take(&o);
  TEST_CHECK(o.l.n == 1 && o.accepted == 1, "an owner done after its first accept: %d taken",
             o.l.n);
  struct pollfd p = {.fd = o.listen_fd, .events = POLLIN};
  TEST_CHECK(poll(&p, 1, 0) == 1, "the other connections left the backlog");
  test_owner_shut(&o, "the test ends");
  for (int i = 0; i < 3; i++) close(fds[i]);
  /* Two connections with bytes waiting: a done owner's reads stop at the first. */
  test_owner_open(&o);
  for (int i = 0; i < 2; i++) {
    fds[i] = test_connect(&o);
    test_take(&o);
    test_send(fds[i], "x", 1);
  }
  o.done = 1;
  o.reads = 0;
  int stopped = 0;
  for (int i = 0; i < 20 && o.reads == 0; i++) stopped = test_serve(&o, 100);
  TEST_CHECK(stopped == 1 && o.reads == 1, "a done owner: poll_read gave %d after %d reads",
             stopped, o.reads);
  test_owner_shut(&o, "the test ends");
  for (int i = 0; i < 2; i++) close(fds[i]);
}

/* One WARN per burst of rejections; the count with the next WARN, or at INFO on the close. */
static void test_warn_burst(const char* log_path) {
  struct test_owner o;
  int fds[5];
  setenv("BRAID_DEBUG", "INFO", 1);
  setenv("BRAID_DEBUG_SUBSYS", "BOOTSTRAP", 1);
  setenv("BRAID_DEBUG_FILE", log_path, 1);
  braid_param_reload();
  braid_log_reset();
  test_owner_open(&o);
  for (int i = 0; i < 5; i++) {
    fds[i] = test_connect(&o);
    test_send(fds[i], "junk", 4);
    test_take(&o);
  }
  TEST_CHECK(o.closed == 5 && o.l.quiet == 4, "5 rejections: %d closed, %u counted quietly",
             o.closed, o.l.quiet);
  /* A burst later: the next rejection is a WARN again, with the count. */
  o.l.warned = braid_time_sec() - BOOTSTRAP_REJECT_WARN_S - 1.0;
  close(fds[0]);
  fds[0] = test_connect(&o);
  test_send(fds[0], "junk", 4);
  test_take(&o);
  TEST_CHECK(o.l.quiet == 0, "%u counted after the next WARN", o.l.quiet);
  for (int i = 1; i < 4; i++) {
    close(fds[i]);
    fds[i] = test_connect(&o);
    test_send(fds[i], "junk", 4);
    test_take(&o);
  }
  test_owner_shut(&o, "the test ends");
  setenv("BRAID_DEBUG", "WARN", 1);
  unsetenv("BRAID_DEBUG_FILE");
  braid_param_reload();
  braid_log_reset();
  char text[8192];
  FILE* f = fopen(log_path, "r");
  size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
  if (f) fclose(f);
  text[n] = '\0';
  int warns = 0;
  for (const char* p = strstr(text, "test listener rejected connection from"); p;
       p = strstr(p + 1, "test listener rejected connection from"))
    warns++;
  TEST_CHECK(warns == 2, "%d WARN lines for two bursts:\n%s", warns, text);
  TEST_CHECK(strstr(text, "(more within 10 s are counted, not listed)") != NULL,
             "the first WARN does not say that more are counted:\n%s", text);
  TEST_CHECK(strstr(text, "(and 4 more since the last such warning)") != NULL,
             "the second WARN does not carry the count:\n%s", text);
  TEST_CHECK(strstr(text, "test listener rejected 3 more connections after its last warning") !=
                 NULL, "no INFO line with the count at the close:\n%s", text);
  for (int i = 0; i < 5; i++) close(fds[i]);
  unlink(log_path);
}

int main(void) {
  char log_path[96];
  snprintf(log_path, sizeof log_path, "/tmp/braid_listen_test.%d.log", (int)getpid());
  const int fds = test_fd_count();
  test_make_room();
  test_rank_after_strangers();
  test_first_bytes();
  test_refusal();
  test_deadline();
  test_owner_done();
  test_warn_burst(log_path);
  TEST_CHECK(test_fd_count() == fds, "%d fds open at the end, %d at the start", test_fd_count(),
             fds);
  return test_summary();
}
