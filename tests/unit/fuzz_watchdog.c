/*
 * libFuzzer harness for the watchdog's server (BRAID_FUZZ=ON, clang only):
 * what it reads from the connections to its listener, a request with the
 * job's secret, before it answers with the secret and this rank's ledger
 * summary, through the very code its thread runs (wd_server_pollfds,
 * wd_server_serve, through watchdog_server.h), on a listener of its own with
 * a fake clock.
 *
 * The first input byte says how many connections (1 to 8) carry the input,
 * whether each one's first bytes get the right magic, the right secret or
 * both (so that the fuzzer reaches the answer and each refusal), whether 32
 * idle connections come first (so that the new ones crowd them out), and
 * whether the clients half-close after writing. Then, per
 * connection, a length byte and that many bytes, written in two pieces on
 * either side of a round of the server. Past the deadline every connection
 * must be closed; a client must get the reply, whole, exactly when its
 * first bytes were a request with the magic and the secret that is not a
 * ping or a bye (those get nothing), and the server's notices must be one per
 * such request with the failing or bye flag; anything else (a crash, a leak,
 * a sanitizer report, an answer to a stranger) is a bug.
 *
 *   CC=clang cmake -B build-fuzz -DBRAID_FUZZ=ON
 *   cmake --build build-fuzz --target fuzz_watchdog
 *   build-fuzz/tests/unit/fuzz_watchdog -max_len=2048 -max_total_time=600
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "runtime/watchdog_server.h"

int LLVMFuzzerInitialize(int* argc, char*** argv);
int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

#define FUZZ_CONNS 8
#define FUZZ_IDLE WD_SERVER_CONNS /* idle connections that the fuzzed ones crowd out */

static uint8_t fuzz_secret[WD_SECRET_BYTES];
static struct sockaddr_un fuzz_addr;
static socklen_t fuzz_addr_len;
static int fuzz_listen_fd = -1;
static volatile uint32_t fuzz_stop;

/* The summary the server answers with: a pattern the clients check. */
static void fuzz_summary(void* arg, struct braid_ledger_summary* out) {
  (void)arg;
  memset(out, 0xa5, sizeof *out);
  out->magic = BRAID_LEDGER_MAGIC;
}

int LLVMFuzzerInitialize(int* argc, char*** argv) {
  (void)argc;
  (void)argv;
  setenv("BRAID_DEBUG", "NONE", 1); /* every refused connection would WARN */
  memset(fuzz_secret, 0x5a, sizeof fuzz_secret);
  /* A listener in the abstract namespace: no file, and closed connections leave no TIME_WAIT. */
  memset(&fuzz_addr, 0, sizeof fuzz_addr);
  fuzz_addr.sun_family = AF_UNIX;
  int n = snprintf(fuzz_addr.sun_path + 1, sizeof fuzz_addr.sun_path - 1, "braid-fuzz-wd-%d",
                   (int)getpid());
  fuzz_addr_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
  fuzz_listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fuzz_listen_fd < 0 || bind(fuzz_listen_fd, (struct sockaddr*)&fuzz_addr, fuzz_addr_len) != 0 ||
      listen(fuzz_listen_fd, 256) != 0) {
    perror("fuzz_watchdog: listener");
    abort();
  }
  return 0;
}

static int fuzz_connect(void) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (connect(fd, (struct sockaddr*)&fuzz_addr, fuzz_addr_len) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

/* Writes what fits (a request is small; the rest may stay behind, unread). */
static void fuzz_feed(int fd, const void* data, size_t size) {
  const char* p = data;
  while (size > 0) {
    ssize_t n = send(fd, p, size, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n <= 0) return;
    p += n;
    size -= (size_t)n;
  }
}

/* One round of the server's loop at time `now` (nothing waits: the bytes are already there). */
static void fuzz_round(struct wd_server* sv, double now) {
  struct pollfd pfd[1 + WD_SERVER_CONNS];
  int n = wd_server_pollfds(sv, pfd);
  if (poll(pfd, (nfds_t)n, 0) < 0) abort();
  wd_server_serve(sv, pfd, now);
}

/* Everything the server sent on `fd` until it closed; -1 when it never closed. */
static ssize_t fuzz_drain(int fd, uint8_t* buf, size_t cap) {
  size_t got = 0;
  for (;;) {
    char scratch[256];
    ssize_t n = recv(fd, got < cap ? (void*)(buf + got) : (void*)scratch,
                     got < cap ? cap - got : sizeof scratch, MSG_DONTWAIT);
    if (n > 0) {
      got += (size_t)n;
      continue;
    }
    if (n == 0 || errno == ECONNRESET) return (ssize_t)got;
    if (errno == EINTR) continue;
    return -1;
  }
}

static int fuzz_notices; /* the server's notices in this input (its thread is this one) */

static void fuzz_notice(void* arg, uint32_t flags, int rank, int gone) {
  (void)arg;
  (void)flags;
  (void)rank;
  (void)gone;
  fuzz_notices++;
}

struct fuzz_client {
  int fd;
  uint8_t bytes[sizeof(struct wd_request) + 255]; /* what it writes */
  size_t len;
};

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int nconns = 1 + (data[0] & (FUZZ_CONNS - 1));
  const int patch_magic = data[0] & 0x08, patch_secret = data[0] & 0x10;
  const int crowd = data[0] & 0x20, half_close = data[0] & 0x40;
  data++;
  size--;
  struct wd_server* sv = wd_server_new(fuzz_listen_fd, fuzz_secret, fuzz_summary, NULL, &fuzz_stop);
  if (sv == NULL) return 0;
  wd_server_on_notice(sv, fuzz_notice);
  fuzz_notices = 0;
  int noticed = 0; /* the valid requests that carry a notice */
  int idle[FUZZ_IDLE];
  int nidle = 0;
  if (crowd) {
    for (int i = 0; i < FUZZ_IDLE; i++)
      if ((idle[nidle] = fuzz_connect()) >= 0) nidle++;
    fuzz_round(sv, 0.0); /* accepted with the earliest deadlines */
  }
  struct fuzz_client cl[FUZZ_CONNS];
  for (int i = 0; i < nconns; i++) {
    struct fuzz_client* c = &cl[i];
    size_t len = 0;
    if (size > 0) {
      len = data[0];
      data++;
      size--;
    }
    if (len > size) len = size;
    memcpy(c->bytes, data, len);
    c->len = len;
    data += len;
    size -= len;
    /* Patched: the first bytes become a whole request, its magic or secret made right. */
    struct wd_request* head = (struct wd_request*)c->bytes;
    if ((patch_magic || patch_secret) && c->len < sizeof *head) {
      memset(c->bytes + c->len, 0, sizeof *head - c->len);
      c->len = sizeof *head;
    }
    if (patch_magic) head->magic = BRAID_LEDGER_MAGIC;
    if (patch_secret) memcpy(head->secret, fuzz_secret, sizeof head->secret);
    c->fd = fuzz_connect();
  }
  /* The first piece of each connection's bytes, then a round that accepts them. */
  for (int i = 0; i < nconns; i++)
    if (cl[i].fd >= 0) fuzz_feed(cl[i].fd, cl[i].bytes, cl[i].len / 2);
  fuzz_round(sv, 0.5);
  fuzz_round(sv, 0.6); /* reads the first pieces */
  for (int i = 0; i < nconns; i++) {
    if (cl[i].fd < 0) continue;
    fuzz_feed(cl[i].fd, cl[i].bytes + cl[i].len / 2, cl[i].len - cl[i].len / 2);
    if (half_close) shutdown(cl[i].fd, SHUT_WR);
  }
  for (int r = 0; r < 3; r++) fuzz_round(sv, 0.7 + 0.1 * r); /* within every deadline */
  fuzz_round(sv, 1e9);                                       /* past every deadline */
  /*
   * What each client got: the whole reply exactly when it sent a request with the secret that
   * is not a ping or a bye (those get nothing); a notice for each valid failing request or bye.
   */
  for (int i = 0; i < nconns; i++) {
    struct fuzz_client* c = &cl[i];
    if (c->fd < 0) continue;
    struct wd_reply want = {.magic = WD_REPLY_MAGIC}, got;
    memcpy(want.secret, fuzz_secret, sizeof want.secret);
    fuzz_summary(NULL, &want.summary);
    ssize_t n = fuzz_drain(c->fd, (uint8_t*)&got, sizeof got);
    const struct wd_request* head = (const struct wd_request*)c->bytes;
    const int valid = c->len >= sizeof *head && head->magic == BRAID_LEDGER_MAGIC &&
                      memcmp(head->secret, fuzz_secret, sizeof fuzz_secret) == 0;
    const int asked = valid && !(head->flags & (WD_REQ_PING | WD_REQ_BYE));
    noticed += valid && (head->flags & (WD_REQ_FAILING | WD_REQ_BYE)) != 0;
    if (n < 0) {
      fprintf(stderr, "fuzz_watchdog: connection %d left open past its deadline\n", i);
      abort();
    }
    if (asked ? n != (ssize_t)sizeof got || memcmp(&got, &want, sizeof got) != 0 : n != 0) {
      fprintf(stderr, "fuzz_watchdog: connection %d (%s) got %zd bytes of the reply\n", i,
              asked ? "a valid request" : "no valid request", n);
      abort();
    }
    close(c->fd);
  }
  for (int i = 0; i < nidle; i++) {
    uint8_t b;
    if (fuzz_drain(idle[i], &b, 1) != 0) { /* refused: closed, nothing sent */
      fprintf(stderr, "fuzz_watchdog: idle connection %d not closed without an answer\n", i);
      abort();
    }
    close(idle[i]);
  }
  if (fuzz_notices != noticed) {
    fprintf(stderr, "fuzz_watchdog: %d notices for %d valid requests that carry one\n",
            fuzz_notices, noticed);
    abort();
  }
  wd_server_free(sv);
  return 0;
}
