/*
 * libFuzzer harness for the bootstrap's message parser (BRAID_FUZZ=ON, clang
 * only): the bytes a listener receives from one connection (a hello, then
 * header/payload pairs) go through the very reader a rank runs
 * (bootstrap_in_read, through bootstrap_internal.h). The first input byte chooses whether a valid hello (the job's
 * secret) comes first, so the fuzzer reaches the headers and payloads as well
 * as the hello check. Any crash, leak or sanitizer report is a bug; a
 * rejected connection is the expected answer.
 *
 *   CC=clang cmake -B build-fuzz -DBRAID_FUZZ=ON
 *   cmake --build build-fuzz --target fuzz_bootstrap
 *   build-fuzz/tests/unit/fuzz_bootstrap -max_len=65536 -max_total_time=600
 */
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bootstrap/bootstrap_internal.h"

int LLVMFuzzerInitialize(int* argc, char*** argv);
int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

#define FUZZ_RANKS 4
static struct bootstrap* fuzz_b;

int LLVMFuzzerInitialize(int* argc, char*** argv) {
  (void)argc;
  (void)argv;
  setenv("BRAID_DEBUG", "NONE", 1); /* every rejected input would WARN */
  fuzz_b = calloc(1, sizeof *fuzz_b);
  fuzz_b->rank = 0;
  fuzz_b->nranks = FUZZ_RANKS;
  memset(fuzz_b->secret, 0x5a, sizeof fuzz_b->secret);
  fuzz_b->listen_fd = -1;
  fuzz_b->deadline = -1.0;
  bootstrap_conn_init(fuzz_b);
  fuzz_b->peers = calloc(FUZZ_RANKS, sizeof *fuzz_b->peers);
  for (int r = 0; r < FUZZ_RANKS; r++) fuzz_b->peers[r].out_fd = -1;
  pthread_mutex_init(&fuzz_b->lock, NULL);
  return 0;
}

/* Writes what fits into the socket pair (the reader then sees a closed stream). */
static void fuzz_feed(int fd, const void* data, size_t size) {
  const char* p = data;
  while (size > 0) {
    ssize_t n = write(fd, p, size);
    if (n <= 0) return;
    p += n;
    size -= (size_t)n;
  }
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  struct bootstrap* b = fuzz_b;
  int sv[2];
  if (size < 1 || socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0)
    return 0;
  int sndbuf = 1 << 20;
  setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
  if (data[0] & 1) {
    struct bootstrap_hello h;
    memset(&h, 0, sizeof h);
    bootstrap_hello_fill(NULL, BOOTSTRAP_HELLO_PEER, b->secret, &h);
    h.rank = 1 + (data[0] >> 1) % (FUZZ_RANKS - 1);
    h.nranks = FUZZ_RANKS;
    fuzz_feed(sv[1], &h, sizeof h);
  }
  fuzz_feed(sv[1], data + 1, size - 1);
  close(sv[1]);
  union braid_sockaddr remote;
  memset(&remote, 0, sizeof remote);
  remote.sa.sa_family = AF_INET;
  struct bootstrap_incoming* added = bootstrap_listener_add(&b->listener, sv[0], &remote);
  if (added == NULL) {
    close(sv[0]);
    return 0;
  }
  struct bootstrap_in* c = bootstrap_in_of(added);
  for (int turn = 0; turn < 4096 && c->base.fd >= 0; turn++) bootstrap_in_read(b, c);
  if (c->base.fd >= 0) bootstrap_in_close(c);
  /* Back to a fresh listener for the next input (connections and queued messages go). */
  bootstrap_conn_release(b);
  for (int r = 0; r < FUZZ_RANKS; r++) b->peers[r].closed = 0;
  return 0;
}
