/*
 * Unit tests of src/base/socket.c: interface-spec matching, address text in
 * and out (IPv4, IPv6, [v6]:port, malformed input), and the connection
 * helpers on loopback (whole transfers, time limits, abort, peer closing,
 * no SIGPIPE, close-on-exec and TCP_NODELAY), and the options that make a
 * lost host fail a connection (socket_keepalive, socket_keepalive_relax).
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "base/param.h"
#include "base/socket.h"
#include "base/utils.h"
#include "test.h"

static void test_ifname_match(void) {
  /* prefixes */
  TEST_CHECK(socket_ifname_match("eth", "eth0"), "prefix");
  TEST_CHECK(socket_ifname_match("eth,ib", "ib1"), "second prefix");
  TEST_CHECK(!socket_ifname_match("eth,ib", "lo"), "no prefix matches");
  TEST_CHECK(!socket_ifname_match("eth0", "eth"), "prefix longer than the name");
  /* exclusion */
  TEST_CHECK(!socket_ifname_match("^docker,lo", "docker0"), "excluded prefix");
  TEST_CHECK(!socket_ifname_match("^docker,lo", "lo"), "excluded second prefix");
  TEST_CHECK(socket_ifname_match("^docker,lo", "eth0"), "not excluded");
  /* exact */
  TEST_CHECK(socket_ifname_match("=eth0,eth1", "eth1"), "exact second");
  TEST_CHECK(!socket_ifname_match("=eth0", "eth01"), "exact does not match a longer name");
  TEST_CHECK(!socket_ifname_match("=eth0", "eth"), "exact does not match a shorter name");
  /* exact exclusion */
  TEST_CHECK(!socket_ifname_match("^=eth0", "eth0"), "exact exclusion");
  TEST_CHECK(socket_ifname_match("^=eth0", "eth01"), "exact exclusion keeps longer names");
  TEST_CHECK(socket_ifname_match("^=eth0,lo", "ib0"), "exact exclusion keeps others");
  /* empty specs select everything */
  TEST_CHECK(socket_ifname_match(NULL, "eth0"), "NULL spec");
  TEST_CHECK(socket_ifname_match("", "eth0"), "empty spec");
  TEST_CHECK(socket_ifname_match("^", "lo"), "bare ^");
  TEST_CHECK(socket_ifname_match("=", "lo"), "bare =");
  TEST_CHECK(socket_ifname_match(",,", "lo"), "only commas");
  TEST_CHECK(socket_ifname_match("eth,,ib", "ib0"), "empty token skipped");
  TEST_CHECK(!socket_ifname_match("eth,,ib", "lo"), "empty token does not match everything");
}

/* Parses `text`, checks family and port, prints it back and expects `back` (NULL: text itself). */
static void check_round_trip(const char* text, int family, int port, const char* back) {
  union braid_sockaddr a;
  char out[128];
  ncclResult_t res = socket_addr_parse(text, &a);
  TEST_CHECK(res == ncclSuccess, "parse \"%s\" returned %d", text, (int)res);
  if (res != ncclSuccess) return;
  TEST_CHECK(a.sa.sa_family == family, "\"%s\": family %d, expected %d", text, a.sa.sa_family, family);
  int got_port = family == AF_INET ? ntohs(a.sin.sin_port) : ntohs(a.sin6.sin6_port);
  TEST_CHECK(got_port == port, "\"%s\": port %d, expected %d", text, got_port, port);
  TEST_CHECK(socket_addr_len(&a) == (family == AF_INET ? sizeof a.sin : sizeof a.sin6),
             "\"%s\": length %u", text, (unsigned)socket_addr_len(&a));
  socket_addr_str(&a, out, sizeof out);
  TEST_CHECK(strcmp(out, back ? back : text) == 0, "\"%s\" printed as \"%s\"", text, out);
  /* And the printed form parses to the same address. */
  union braid_sockaddr again;
  TEST_CHECK(socket_addr_parse(out, &again) == ncclSuccess &&
             memcmp(&again, &a, socket_addr_len(&a)) == 0, "\"%s\" does not round-trip", out);
}

static void test_addr_text(void) {
  check_round_trip("10.0.0.1:5000", AF_INET, 5000, NULL);
  check_round_trip("127.0.0.1:0", AF_INET, 0, NULL);
  check_round_trip("255.255.255.255:65535", AF_INET, 65535, NULL);
  check_round_trip("[::1]:5000", AF_INET6, 5000, NULL);
  check_round_trip("[2001:db8::1]:65535", AF_INET6, 65535, NULL);
  check_round_trip("[2001:DB8:0:0::1]:80", AF_INET6, 80, "[2001:db8::1]:80");
  check_round_trip("[fe80::1%lo]:41234", AF_INET6, 41234, NULL);
  union braid_sockaddr a;
  TEST_EXPECT_RES(socket_addr_parse("localhost:1234", &a), ncclSuccess);
  TEST_CHECK(a.sa.sa_family == AF_INET || a.sa.sa_family == AF_INET6, "localhost family %d", a.sa.sa_family);
  TEST_CHECK(ntohs(a.sin.sin_port) == 1234, "localhost port"); /* same offset in sin and sin6 */
  memset(&a, 0, sizeof a);
  char out[64];
  TEST_CHECK(strcmp(socket_addr_str(&a, out, sizeof out), "(no address)") == 0, "empty address: %s", out);
  TEST_CHECK(socket_addr_len(&a) == 0, "empty address length");
}

static void test_addr_malformed(void) {
  static const char* const bad[] = {
    "", "10.0.0.1", "10.0.0.1:", ":5000", "10.0.0.1:65536", "10.0.0.1:-1", "10.0.0.1:50a",
    "10.0.0.1:123456", "10.0.0.1: 80", "[::1]", "[::1]:", "[::1:5000", "[::1]5000", "::1:5000",
    "[]:5000", "[10.0.0.1x]:5", "[not-an-ip]:80", "[fe80::1%nosuchif0]:80"};
  union braid_sockaddr a;
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ncclResult_t res = socket_addr_parse(bad[i], &a);
    TEST_CHECK(res == ncclInvalidArgument, "\"%s\" was accepted (result %d)", bad[i], (int)res);
  }
  TEST_EXPECT_RES(socket_addr_parse(NULL, &a), ncclInvalidArgument);
  /* Text from a variable: the message names it. */
  TEST_EXPECT_RES(socket_addr_parse_named("nohost", "BRAID_COMM_ID", &a), ncclInvalidArgument);
  TEST_CHECK(strstr(braid_err_last(), "BRAID_COMM_ID=\"nohost\"") != NULL, "message: %s", braid_err_last());
}

/* A listener on 127.0.0.1 and one connection to it: fds[0] our end, fds[1] the accepted end. */
static int loopback_pair(int* listen_fd, int fds[2]) {
  union braid_sockaddr addr;
  if (socket_addr_parse("127.0.0.1:0", &addr) != ncclSuccess) return -1;
  if (socket_listen(&addr, listen_fd) != ncclSuccess) return -1;
  if (ntohs(addr.sin.sin_port) == 0) return -1;
  if (socket_connect(&addr, 2.0, NULL, &fds[0]) != ncclSuccess) return -1;
  union braid_sockaddr peer;
  if (socket_accept(*listen_fd, 2.0, NULL, &fds[1], &peer) != ncclSuccess) return -1;
  return peer.sa.sa_family == AF_INET ? 0 : -1;
}

struct big_transfer {
  int fd;
  unsigned char* buf;
  size_t size;
  ncclResult_t res;
};

static void* big_receiver(void* arg) {
  struct big_transfer* t = arg;
  t->res = socket_recv_all(t->fd, t->buf, t->size, 10.0, NULL);
  return NULL;
}

static void test_transfer(void) {
  int lfd = -1, fds[2] = {-1, -1};
  TEST_CHECK(loopback_pair(&lfd, fds) == 0, "loopback connection");
  if (fds[1] < 0) return;
  for (int i = 0; i < 2; i++) {
    int flags = fcntl(fds[i], F_GETFD), one = 0;
    socklen_t len = sizeof one;
    TEST_CHECK(flags >= 0 && (flags & FD_CLOEXEC), "fd %d is not close-on-exec", i);
    TEST_CHECK(getsockopt(fds[i], IPPROTO_TCP, TCP_NODELAY, &one, &len) == 0 && one,
               "no TCP_NODELAY on %d", i);
  }
  int lflags = fcntl(lfd, F_GETFD);
  TEST_CHECK(lflags >= 0 && (lflags & FD_CLOEXEC), "listener is not close-on-exec");
  /* 8 MiB does not fit in socket buffers: both sides must cope with partial transfers. */
  size_t size = 8u << 20;
  unsigned char* src = malloc(size);
  struct big_transfer t = {.fd = fds[1], .buf = calloc(1, size), .size = size};
  for (size_t i = 0; i < size; i++) src[i] = (unsigned char)(i * 131 + (i >> 12));
  pthread_t th;
  pthread_create(&th, NULL, big_receiver, &t);
  TEST_EXPECT_RES(socket_send_all(fds[0], src, size, 10.0, NULL), ncclSuccess);
  pthread_join(th, NULL);
  TEST_EXPECT_RES(t.res, ncclSuccess);
  TEST_CHECK(memcmp(src, t.buf, size) == 0, "8 MiB arrived changed");
  free(src);
  free(t.buf);

  /* Nothing arrives: the time limit holds. */
  char byte;
  double t0 = braid_time_sec();
  TEST_EXPECT_RES(socket_recv_all(fds[1], &byte, 1, 0.3, NULL), ncclSystemError);
  double dt = braid_time_sec() - t0;
  TEST_CHECK(dt >= 0.25 && dt < 2.0, "recv timeout took %.2f s", dt);
  /* An abort ends an endless wait. */
  volatile uint32_t abort_flag = 1;
  t0 = braid_time_sec();
  TEST_EXPECT_RES(socket_recv_all(fds[1], &byte, 1, -1.0, &abort_flag), ncclRemoteError);
  int never = -1;
  TEST_EXPECT_RES(socket_accept(lfd, -1.0, &abort_flag, &never, NULL), ncclRemoteError);
  TEST_CHECK(never == -1, "accept set an fd on abort");
  TEST_CHECK(braid_time_sec() - t0 < 1.0, "abort took %.2f s", braid_time_sec() - t0);

  /* The peer closes: recv says so; send gets an error instead of SIGPIPE killing us. */
  int closing = fds[0];
  fds[0] = -1;
  socket_close(&closing);
  TEST_CHECK(closing == -1, "socket_close resets the fd");
  TEST_EXPECT_RES(socket_recv_all(fds[1], &byte, 1, 2.0, NULL), ncclRemoteError);
  ncclResult_t res = ncclSuccess;
  char chunk[65536] = {0};
  for (int i = 0; i < 100 && res == ncclSuccess; i++)
    res = socket_send_all(fds[1], chunk, sizeof chunk, 2.0, NULL);
  TEST_CHECK(res == ncclRemoteError || res == ncclSystemError, "send to a closed peer returned %d", (int)res);
  socket_close(&fds[1]);
  socket_close(&lfd);
}

static void test_connect_refused(void) {
  /* A port nobody listens on: take one, then close it. */
  union braid_sockaddr addr;
  int lfd = -1, fd = -1;
  TEST_EXPECT_RES(socket_addr_parse("127.0.0.1:0", &addr), ncclSuccess);
  TEST_EXPECT_RES(socket_listen(&addr, &lfd), ncclSuccess);
  socket_close(&lfd);
  double t0 = braid_time_sec();
  TEST_EXPECT_RES(socket_connect(&addr, 0.3, NULL, &fd), ncclSystemError);
  double dt = braid_time_sec() - t0;
  TEST_CHECK(dt >= 0.25 && dt < 2.0, "refused connect retried for %.2f s, expected ~0.3", dt);
  TEST_CHECK(fd == -1, "fd set after a failed connect");
  int err = 0;
  TEST_EXPECT_RES(socket_connect_quiet(&addr, 0.0, NULL, &fd, &err), ncclSystemError);
  TEST_CHECK(err == ECONNREFUSED, "quiet connect errno %d", err);
  /* Listening on an address that is not ours fails with a message. */
  union braid_sockaddr foreign;
  TEST_EXPECT_RES(socket_addr_parse("192.0.2.254:0", &foreign), ncclSuccess);
  TEST_EXPECT_RES(socket_listen(&foreign, &lfd), ncclSystemError);
  TEST_CHECK(lfd == -1, "listen fd set after failure");
}

static int sockopt(int fd, int level, int name) {
  unsigned int v = 0;
  socklen_t len = sizeof v;
  return getsockopt(fd, level, name, &v, &len) == 0 ? (int)v : -1;
}

static void test_keepalive(void) {
  int lfd = -1, fds[2] = {-1, -1};
  TEST_CHECK(loopback_pair(&lfd, fds) == 0, "loopback connection");
  if (fds[1] < 0) return;
  /* 0 leaves the socket as the system made it. */
  TEST_CHECK(socket_keepalive(fds[0], 0) == 0 && sockopt(fds[0], SOL_SOCKET, SO_KEEPALIVE) == 0,
             "socket_keepalive(0) turned keepalive on");
  TEST_CHECK(socket_keepalive(fds[0], 12) == 0, "socket_keepalive failed");
  TEST_CHECK(sockopt(fds[0], SOL_SOCKET, SO_KEEPALIVE) == 1, "no SO_KEEPALIVE");
  TEST_CHECK(sockopt(fds[0], IPPROTO_TCP, TCP_KEEPIDLE) == 6, "TCP_KEEPIDLE %d, expected 6",
             sockopt(fds[0], IPPROTO_TCP, TCP_KEEPIDLE));
  TEST_CHECK(sockopt(fds[0], IPPROTO_TCP, TCP_KEEPINTVL) == 2, "TCP_KEEPINTVL %d, expected 2",
             sockopt(fds[0], IPPROTO_TCP, TCP_KEEPINTVL));
  TEST_CHECK(sockopt(fds[0], IPPROTO_TCP, TCP_KEEPCNT) == 3, "TCP_KEEPCNT %d, expected 3",
             sockopt(fds[0], IPPROTO_TCP, TCP_KEEPCNT));
  TEST_CHECK(sockopt(fds[0], IPPROTO_TCP, TCP_USER_TIMEOUT) == 12000, "TCP_USER_TIMEOUT %d ms",
             sockopt(fds[0], IPPROTO_TCP, TCP_USER_TIMEOUT));
  /* Everything sent is acknowledged (the peer is alive): the limit may go, and come back. */
  char byte = 1;
  TEST_EXPECT_RES(socket_send_all(fds[0], &byte, 1, 2.0, NULL), ncclSuccess);
  TEST_EXPECT_RES(socket_recv_all(fds[1], &byte, 1, 2.0, NULL), ncclSuccess);
  TEST_CHECK(socket_keepalive_relax(fds[0]) == 1 &&
                 sockopt(fds[0], IPPROTO_TCP, TCP_USER_TIMEOUT) == 0,
             "the unacknowledged-data limit stayed on a peer that acknowledged everything");
  TEST_CHECK(socket_keepalive(fds[0], 12) == 0 &&
                 sockopt(fds[0], IPPROTO_TCP, TCP_USER_TIMEOUT) == 12000,
             "socket_keepalive did not restore the limit");
  /* The parameter: 20 s by default, 0 turns it off. */
  unsetenv("BRAID_SOCKET_KEEPALIVE_SEC");
  braid_param_reload();
  TEST_CHECK(socket_keepalive_sec() == 20, "default %d", socket_keepalive_sec());
  setenv("BRAID_SOCKET_KEEPALIVE_SEC", "0", 1);
  braid_param_reload();
  TEST_CHECK(socket_keepalive_sec() == 0, "BRAID_SOCKET_KEEPALIVE_SEC=0 gave %d", socket_keepalive_sec());
  unsetenv("BRAID_SOCKET_KEEPALIVE_SEC");
  braid_param_reload();
  socket_close(&fds[0]);
  socket_close(&fds[1]);
  socket_close(&lfd);
}

int main(void) {
  test_ifname_match();
  test_addr_text();
  test_addr_malformed();
  test_transfer();
  test_connect_refused();
  test_keepalive();
  return test_summary();
}
