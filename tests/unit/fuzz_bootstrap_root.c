/*
 * libFuzzer harness for the bootstrap root's JOIN handling (BRAID_FUZZ=ON,
 * clang only): up to four connections, each fed its own part of the input,
 * are handed to a root without a thread or listener (bootstrap_root_create,
 * through bootstrap_internal.h) and served exactly as the root's thread serves
 * them: hello checks, the first JOIN fixing nranks, conflicts, refusals,
 * replies, the end of the rendezvous. The first input byte chooses how many
 * connections there are and which of them start with a hello carrying the
 * job's secret, whose rank, nranks, kind, listener and ids (how many, which
 * one is this root's) the fuzzer then picks, so that it gets past the secret.
 * Any crash, leak or sanitizer report is a bug; a rejected connection or a
 * failed rendezvous is an expected answer.
 *
 *   CC=clang cmake -B build-fuzz -DBRAID_FUZZ=ON
 *   cmake --build build-fuzz --target fuzz_bootstrap_root
 *   build-fuzz/tests/unit/fuzz_bootstrap_root -max_len=4096 -max_total_time=600
 */
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bootstrap/bootstrap_internal.h"

int LLVMFuzzerInitialize(int* argc, char*** argv);
int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

#define FUZZ_CONNS 4
/* Serving rounds per input: enough for every connection to be read to its end. */
#define FUZZ_ROUNDS 16

static uint8_t fuzz_secret[BOOTSTRAP_SECRET_BYTES];

int LLVMFuzzerInitialize(int* argc, char*** argv) {
  (void)argc;
  (void)argv;
  setenv("BRAID_DEBUG", "NONE", 1); /* every rejected input would WARN */
  memset(fuzz_secret, 0x5a, sizeof fuzz_secret);
  return 0;
}

/* Writes what fits into the socket pair (the root then sees the stream end). */
static void fuzz_feed(int fd, const void* data, size_t size) {
  const char* p = data;
  while (size > 0) {
    ssize_t n = write(fd, p, size);
    if (n <= 0) return;
    p += n;
    size -= (size_t)n;
  }
}

/*
 * A JOIN (or, by the fuzzer's choice, another kind) with the job's secret; its fields come
 * from the first bytes of `part`, which are consumed.
 */
static void fuzz_hello(int fd, const uint8_t** part, size_t* left) {
  uint8_t f[7] = {0};
  size_t n = *left < sizeof f ? *left : sizeof f;
  memcpy(f, *part, n);
  *part += n;
  *left -= n;
  struct bootstrap_hello h;
  bootstrap_hello_fill(NULL, BOOTSTRAP_HELLO_JOIN, fuzz_secret, &h);
  h.kind = (uint8_t)(f[0] % 4 == 3   ? BOOTSTRAP_HELLO_DISMISS
                     : f[0] % 4 == 2 ? f[0]
                                     : BOOTSTRAP_HELLO_JOIN);
  h.rank = (int8_t)f[1];
  /* Mostly small jobs, where JOINs meet; now and then one near or past BOOTSTRAP_MAX_RANKS. */
  h.nranks = f[2] & 0x80 ? (int32_t)((uint32_t)(f[2] & 0x7f) << 16 | (uint32_t)f[3] << 8) : f[2] % 6;
  h.listen.family = f[4] & 1 ? 4 : f[4];
  h.listen.port = f[5];
  h.listen.addr[0] = 127;
  h.listen.addr[3] = 1;
  /* One to three ids, this root's being any of them, and now and then another list. */
  h.nids = 1 + f[6] % 3;
  h.iroot = (f[6] >> 2) % 3;
  h.ids_digest = f[6] >> 4 & 1;
  fuzz_feed(fd, &h, sizeof h);
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  struct bootstrap_root* root = NULL;
  int keep[FUZZ_CONNS];
  int nkeep = 0;
  if (size < 1 || bootstrap_root_create(fuzz_secret, 30.0, &root) != ncclSuccess) return 0;
  const int nconns = 1 + (data[0] & 3);
  const size_t share = (size - 1) / (size_t)nconns;
  for (int i = 0; i < nconns; i++) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0) break;
    const uint8_t* part = data + 1 + (size_t)i * share;
    size_t left = share;
    if (data[0] & (4u << i)) fuzz_hello(sv[1], &part, &left);
    fuzz_feed(sv[1], part, left);
    /* Connection 0 stays open when the input says so: a joined rank that waits for its answer. */
    if (i == 0 && (data[0] & 0x80))
      keep[nkeep++] = sv[1];
    else
      close(sv[1]);
    union braid_sockaddr remote;
    memset(&remote, 0, sizeof remote);
    remote.sa.sa_family = AF_INET;
    if (bootstrap_root_add(root, sv[0], &remote) != 0) close(sv[0]);
  }
  for (int round = 0; round < FUZZ_ROUNDS; round++)
    if (bootstrap_root_serve(root, 0)) break;
  bootstrap_root_destroy(root);
  for (int i = 0; i < nkeep; i++) close(keep[i]);
  return 0;
}
