/*
 * libFuzzer harness for the socket backend's handshake reader (BRAID_FUZZ=ON,
 * clang only): what a listener reads from new connections before it trusts
 * them, each stream's sock_hello (magic, version, key, connection id, stream
 * index and count), through the very code accept() runs
 * (net_socket_handshake_step, through net_socket.h). The input is cut into up
 * to four streams; its first byte says how many, and whether their hellos get
 * the right magic, version and key, so that the fuzzer reaches the grouping
 * of streams into connections as well as the checks. A connection whose
 * streams all came becomes a receive comm, which is closed again. Any crash,
 * leak or sanitizer report is a bug; a dropped stream is the expected answer.
 *
 *   CC=clang cmake -B build-fuzz -DBRAID_FUZZ=ON
 *   cmake --build build-fuzz --target fuzz_net_socket
 *   build-fuzz/tests/unit/fuzz_net_socket -max_len=4096 -max_total_time=600
 */
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "transport/net_socket.h"

int LLVMFuzzerInitialize(int* argc, char*** argv);
int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

#define FUZZ_STREAMS 4
#define FUZZ_TURNS 8 /* handshake steps per input: every stream's bytes are there at once */

static uint8_t fuzz_key[BRAID_NET_KEY_BYTES];

int LLVMFuzzerInitialize(int* argc, char*** argv) {
  (void)argc;
  (void)argv;
  setenv("BRAID_DEBUG", "NONE", 1); /* every dropped stream would WARN */
  /* One helper thread and one data stream per comm: a complete connection is two streams. */
  setenv("BRAID_SOCKET_NTHREADS", "1", 1);
  setenv("BRAID_NSOCKS_PERTHREAD", "1", 1);
  memset(fuzz_key, 0x5a, sizeof fuzz_key);
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

/* One stream's bytes: its hello (patched to pass the first checks when asked), then the rest. */
static int fuzz_stream(struct sock_listen* l, const uint8_t* data, size_t size, int patch) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0) return -1;
  if (patch && size >= sizeof(struct sock_hello)) {
    struct sock_hello h;
    memcpy(&h, data, sizeof h);
    h.magic = SOCK_MAGIC;
    h.version = SOCK_VERSION;
    memcpy(h.key, fuzz_key, sizeof h.key);
    fuzz_feed(sv[1], &h, sizeof h);
    data += sizeof h;
    size -= sizeof h;
  }
  fuzz_feed(sv[1], data, size);
  close(sv[1]);
  union braid_sockaddr remote;
  memset(&remote, 0, sizeof remote);
  remote.sa.sa_family = AF_INET;
  return net_socket_pending_add(l, sv[0], &remote, 0.0);
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  struct sock_listen* l = NULL;
  if (size < 1 || net_socket_listen_alloc(fuzz_key, &l) != ncclSuccess) return 0;
  int nstreams = 1 + (data[0] & (FUZZ_STREAMS - 1));
  int patch = data[0] & FUZZ_STREAMS;
  data++;
  size--;
  /* Stream i takes one hello's worth of bytes; the last one takes the rest. */
  for (int i = 0; i < nstreams; i++) {
    size_t len = size < sizeof(struct sock_hello) ? size : sizeof(struct sock_hello);
    if (i == nstreams - 1) len = size;
    fuzz_stream(l, data, len, patch);
    data += len;
    size -= len;
  }
  /* Steps at time 0 read the hellos; one past every deadline drops what is still waiting. */
  for (int turn = 0; turn <= FUZZ_TURNS; turn++) {
    void* comm = NULL;
    double now = turn < FUZZ_TURNS ? 0.0 : 1e9;
    if (net_socket_handshake_step(l, now, &comm) != ncclSuccess) break;
    if (comm) net_socket_comm_free(comm);
  }
  net_socket_listen_free(l);
  return 0;
}
