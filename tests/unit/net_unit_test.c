/*
 * Unit tests of the net pieces that need no peer: the backend ops tables
 * (size first, every slot filled), the backend choice (BRAID_NET, default,
 * a named backend that cannot run), how the socket backend cuts messages
 * into pieces, and the IB backend's device-independent logic (BRAID_IB_HCA,
 * GID choice for RoCE, the memlock advice) plus what it says without a device.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/error.h"
#include "base/param.h"
#include "base/utils.h"
#include "test.h"
#include "transport/net.h"
#include "transport/net_ib.h"
#include "transport/net_socket.h"

static void test_ops_tables(void) {
  TEST_CHECK(net_backend_count() == 4, "%d backends", net_backend_count());
  for (int i = 0; i < net_backend_count(); i++) {
    const struct braid_net_ops* ops = net_backend_at(i);
    TEST_CHECK(ops->size == sizeof *ops, "%s: size %zu", ops->name, ops->size);
    /* Every slot after size and name is a function pointer: none may be NULL up to the optional
     * pair. */
    const void* const* slot = (const void* const*)((const char*)ops + offsetof(struct braid_net_ops, init));
    size_t nslots =
        (offsetof(struct braid_net_ops, recv_fd) - offsetof(struct braid_net_ops, init)) /
        sizeof(void*);
    for (size_t s = 0; s < nslots; s++) TEST_CHECK(slot[s] != NULL, "%s: slot %zu is empty", ops->name, s);
    TEST_CHECK((ops->recv_fd == NULL) == (ops->recv_busy == NULL),
               "%s: recv_fd and recv_busy come together", ops->name);
    TEST_CHECK(net_backend_find(ops->name) == ops, "find %s", ops->name);
  }
  TEST_CHECK(braid_net_socket.recv_fd != NULL,
             "the socket backend's receive ends are polled by fd");
  TEST_CHECK(net_backend_find("socket") == &braid_net_socket, "names are case-insensitive");
  TEST_CHECK(net_backend_find("tcp") == NULL, "unknown name");
}

/* The pieces of one message cover it exactly once, in pieces of at least SOCK_MIN_PIECE. */
static void check_share(size_t size, int nstreams, uint64_t seq) {
  size_t covered = 0, pieces = 0;
  char* seen = calloc(size ? size : 1, 1);
  for (int s = 0; s < nstreams; s++) {
    size_t off = 0, len = 0;
    net_socket_share(size, nstreams, seq, s, &off, &len);
    if (len == 0) continue;
    pieces++;
    TEST_CHECK(off + len <= size, "size %zu stream %d: [%zu,+%zu) out of range", size, s, off, len);
    if (off + len > size) continue;
    TEST_CHECK(len >= SOCK_MIN_PIECE || off + len == size, "size %zu: a %zu-byte piece", size, len);
    for (size_t i = off; i < off + len; i++) seen[i]++;
    covered += len;
  }
  if (size <= SOCK_INLINE_BYTES) {
    TEST_CHECK(pieces == 0, "an inline message of %zu bytes has pieces", size);
  } else {
    TEST_CHECK(covered == size, "size %zu nstreams %d seq %llu: %zu bytes covered", size, nstreams,
               (unsigned long long)seq, covered);
    size_t twice = 0;
    for (size_t i = 0; i < size; i++) twice += seen[i] != 1;
    TEST_CHECK(twice == 0, "size %zu: %zu bytes not covered exactly once", size, twice);
    TEST_CHECK(pieces <= (size_t)nstreams, "more pieces than streams");
  }
  free(seen);
}

static void test_socket_share(void) {
  static const size_t sizes[] = {0, 1, SOCK_INLINE_BYTES, SOCK_INLINE_BYTES + 1, 65536, 65537,
                                 200000, 524288, 1 << 20, (1 << 20) + 3, 7777777};
  for (size_t i = 0; i < BRAID_ARRAY_LEN(sizes); i++)
    for (int n = 1; n <= 16; n *= 2)
      for (uint64_t seq = 0; seq < 5; seq++) check_share(sizes[i], n, seq);
  /* A 512 KiB slot over 4 streams: four 128 KiB pieces, one per stream. */
  size_t off, len;
  net_socket_share(524288, 4, 0, 2, &off, &len);
  TEST_CHECK(off == 2 * 131072 && len == 131072, "slot piece: %zu +%zu", off, len);
  /* Consecutive messages start on consecutive streams. */
  net_socket_share(65536, 4, 1, 1, &off, &len);
  TEST_CHECK(off == 0 && len == 65536, "message 1 starts on stream 1");
}

/* Backend device names as the topology writes its NICs (topo_nic.c): port 1 bare, others ":p". */
static void test_topo_name(void) {
  static const struct {
    const char* in;
    int ib;
    const char* out;
  } cases[] = {{"mlx5_0:1", 1, "mlx5_0"},   {"mlx5_0:2", 1, "mlx5_0:2"},
               {"mlx5_10:1", 1, "mlx5_10"}, {"mlx5_0:10", 1, "mlx5_0:10"},
               {"eth0", 0, "eth0"},         {"ens5 (tcp;ofi_rxm)", 0, "ens5"},
               {"eth0:2", 0, "eth0"},       {"", 0, ""}};
  char out[64];
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    net_topo_name(cases[i].in, cases[i].ib, out, sizeof out);
    TEST_CHECK(strcmp(out, cases[i].out) == 0, "\"%s\" (ib %d) -> \"%s\", expected \"%s\"",
               cases[i].in, cases[i].ib, out, cases[i].out);
  }
  net_topo_name("mlx5_0:2", 1, out, 4);
  TEST_CHECK(strcmp(out, "mlx") == 0, "truncated to the buffer: \"%s\"", out);
}

static void test_hca_match(void) {
  TEST_CHECK(ib_hca_match(NULL, "mlx5_0", 1), "no spec");
  TEST_CHECK(ib_hca_match("", "mlx5_0", 1), "empty spec");
  TEST_CHECK(ib_hca_match("mlx5", "mlx5_3", 1), "prefix");
  TEST_CHECK(ib_hca_match("mlx5_0:1,mlx5_1", "mlx5_0", 1), "port given");
  TEST_CHECK(!ib_hca_match("mlx5_0:1,mlx5_1", "mlx5_0", 2), "other port");
  TEST_CHECK(ib_hca_match("mlx5_0:1,mlx5_1", "mlx5_1", 2), "second token, any port");
  TEST_CHECK(!ib_hca_match("^mlx5_3", "mlx5_3", 1), "excluded");
  TEST_CHECK(ib_hca_match("^mlx5_3", "mlx5_1", 1), "not excluded");
  TEST_CHECK(!ib_hca_match("=mlx5_1", "mlx5_10", 1), "exact");
  TEST_CHECK(ib_hca_match("=mlx5_1", "mlx5_1", 1), "exact hit");
  TEST_CHECK(!ib_hca_match("^=mlx5_1:2", "mlx5_1", 2), "exact exclusion with port");
  TEST_CHECK(ib_hca_match("^=mlx5_1:2", "mlx5_1", 1), "exact exclusion keeps the other port");
}

static struct ib_gid_cand gid(int index, enum ib_gid_type type, const char* kind) {
  struct ib_gid_cand c = {.index = index, .type = type};
  if (strcmp(kind, "v4") == 0) {
    c.raw[10] = c.raw[11] = 0xff;
    c.raw[12] = 10, c.raw[15] = (uint8_t)index;
  } else if (strcmp(kind, "ll") == 0) {
    c.raw[0] = 0xfe, c.raw[1] = 0x80, c.raw[15] = (uint8_t)index;
  } else if (strcmp(kind, "v6") == 0) {
    c.raw[0] = 0xfd, c.raw[15] = (uint8_t)index;
  }
  return c;
}

static void test_gid_choose(void) {
  char why[256];
  struct ib_gid_cand roce[] = {gid(0, IB_GID_ROCE_V1, "ll"), gid(1, IB_GID_ROCE_V2, "ll"),
                               gid(2, IB_GID_ROCE_V1, "v4"), gid(3, IB_GID_ROCE_V2, "v4"),
                               gid(4, IB_GID_ROCE_V2, "v6")};
  TEST_CHECK(ib_gid_choose(roce, 5, -1, why, sizeof why) == 3, "RoCE v2 with IPv4 first");
  TEST_CHECK(ib_gid_choose(roce, 3, -1, why, sizeof why) == 2, "then RoCE v1 global");
  TEST_CHECK(ib_gid_choose(roce, 2, -1, why, sizeof why) == 1, "link-local only: RoCE v2 first");
  struct ib_gid_cand v6[] = {gid(0, IB_GID_ROCE_V2, "ll"), gid(1, IB_GID_ROCE_V2, "v6")};
  TEST_CHECK(ib_gid_choose(v6, 2, -1, why, sizeof why) == 1, "RoCE v2 global IPv6");
  TEST_CHECK(ib_gid_choose(roce, 5, 2, why, sizeof why) == 2, "forced index");
  why[0] = '\0';
  TEST_CHECK(ib_gid_choose(roce, 5, 9, why, sizeof why) == -1, "forced index out of the table");
  TEST_CHECK(strstr(why, "BRAID_IB_GID_INDEX=9") != NULL, "the reason names the variable: %s", why);
  struct ib_gid_cand zero[] = {gid(0, IB_GID_ROCE_V2, "zero"), gid(1, IB_GID_ROCE_V1, "zero")};
  why[0] = '\0';
  TEST_CHECK(ib_gid_choose(zero, 2, -1, why, sizeof why) == -1, "no usable GID");
  TEST_CHECK(strstr(why, "IP address") != NULL, "the reason suggests an address: %s", why);
  TEST_CHECK(ib_gid_choose(zero, 2, 1, why, sizeof why) == -1, "a forced zero GID is refused");
  char text[64];
  ib_gid_str(roce[3].raw, text, sizeof text);
  TEST_CHECK(strcmp(text, "10.0.0.3") == 0, "an IPv4-mapped GID prints as IPv4: %s", text);
}

static void test_memlock_advice(void) {
  struct rlimit old, low;
  char text[512];
  getrlimit(RLIMIT_MEMLOCK, &old);
  low = old;
  low.rlim_cur = 64 << 10;
  if (old.rlim_max != RLIM_INFINITY && old.rlim_max < low.rlim_cur) low.rlim_cur = old.rlim_max;
  if (setrlimit(RLIMIT_MEMLOCK, &low) == 0) {
    ib_memlock_advice(1 << 20, 12 /* ENOMEM */, text, sizeof text);
    TEST_CHECK(strstr(text, "ulimit -l") && strstr(text, "1048576 bytes"), "advice: %s", text);
    setrlimit(RLIMIT_MEMLOCK, &old);
  }
}

/* A message split across queue pairs: pieces in order, aligned, covering it exactly once. */
static void test_ib_split(void) {
  static const size_t sizes[] = {0, 1, 127, 128, 129, 255, 256, 257, 1000, 4097, 65536, 1048589};
  for (int nqps = 1; nqps <= 16; nqps++) {
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
      size_t next = 0, off, len;
      int ok = 1;
      for (int q = 0; q < nqps; q++) {
        ib_split(sizes[i], nqps, q, &off, &len);
        ok &= off == next && (nqps == 1 || off % IB_PIECE_ALIGN == 0 || len == 0);
        next = off + len;
      }
      TEST_CHECK(ok && next == sizes[i], "%zu bytes over %d queue pairs: pieces end at %zu", sizes[i],
                 nqps, next);
    }
  }
  size_t off, len;
  ib_split(1000, 4, 1, &off, &len);
  TEST_CHECK(off == 256 && len == 256, "1000 bytes over 4: piece 1 is [%zu, +%zu)", off, len);
  ib_split(1000, 4, 3, &off, &len);
  TEST_CHECK(off == 768 && len == 232, "1000 bytes over 4: piece 3 is [%zu, +%zu)", off, len);
  ib_split(100, 4, 2, &off, &len);
  TEST_CHECK(off == 100 && len == 0, "100 bytes over 4: piece 2 is empty at the end (%zu, %zu)",
             off, len);
}

/* Runs `fn` in a child, with a clean parameter cache; returns its exit status. */
static int in_child(int (*fn)(void)) {
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) _exit(fn());
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 99;
}

static int select_default(void) {
  const struct braid_net_ops* ops = NULL;
  int ndev = 0, ib_ndev = 0;
  char why[256];
  braid_net_ib.init(&ib_ndev, why, sizeof why);
  if (net_backend_select(&ops, &ndev) != ncclSuccess) return 1;
  /* IB when it has a usable port, Socket otherwise. */
  return ops == (ib_ndev > 0 ? &braid_net_ib : &braid_net_socket) && ndev > 0 ? 0 : 2;
}

static int select_bogus(void) {
  const struct braid_net_ops* ops = NULL;
  int ndev = 0;
  setenv("BRAID_NET", "carrier-pigeon", 1);
  braid_param_reload();
  ncclResult_t res = net_backend_select(&ops, &ndev);
  return res == ncclInvalidUsage && strstr(braid_err_last(), "carrier-pigeon") ? 0 : 1;
}

/* Asking for IB where it cannot run fails with the reason (here: no device, or not built). */
static int select_ib_unusable(void) {
  const struct braid_net_ops* ops = NULL;
  int ndev = 0;
  char why[256];
  braid_net_ib.init(&ndev, why, sizeof why);
  if (ndev > 0) return 0; /* a machine with a device: nothing to check here */
  setenv("NCCL_NET", "IB", 1);
  braid_param_reload();
  ncclResult_t res = net_backend_select(&ops, &ndev);
  fprintf(stderr, "as expected: %s\n", braid_err_last());
  return res == ncclSystemError && strstr(braid_err_last(), "NCCL_NET=IB") ? 0 : 1;
}

static void test_selection(void) {
  int ndev = 0;
  char why[256] = "";
  TEST_CHECK(braid_net_ib.init(&ndev, why, sizeof why) == ncclSuccess, "IB init never fails");
  if (ndev == 0) {
    TEST_CHECK(why[0] != '\0', "IB without a device says why");
    fprintf(stderr, "IB backend here: %s\n", why);
  }
  TEST_CHECK(in_child(select_default) == 0, "default choice");
  TEST_CHECK(in_child(select_bogus) == 0, "BRAID_NET naming no backend");
  TEST_CHECK(in_child(select_ib_unusable) == 0, "NCCL_NET=IB without a usable device");
}

int main(void) {
  unsetenv("BRAID_NET");
  unsetenv("NCCL_NET");
  braid_param_reload();
  test_ops_tables();
  test_socket_share();
  test_hca_match();
  test_topo_name();
  test_gid_choose();
  test_memlock_advice();
  test_ib_split();
  test_selection();
  return test_summary();
}
