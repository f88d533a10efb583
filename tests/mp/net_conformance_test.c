/*
 * One conformance suite over every net backend (net.h), in two processes:
 * child 0 listens and receives, child 1 connects and sends. A backend that
 * cannot run here (no libfabric, no InfiniBand device) is skipped with the
 * reason.
 *
 *   connect    two connections to one listener, accepted, one message each; once the
 *              sender closed its end, a receive neither completes nor fails
 *   sizes      0, 1, 7, 4096, 1 MiB + 3, 64 MiB into larger receives: sizes and bytes checked
 *   many       max_requests outstanding both ways, then one more is refused
 *   order      requests tested in reverse / shuffled order all complete, data intact
 *   peerclose  a sender that dies mid-message, a receiver that dies under a
 *              large send: the survivor's test() fails within seconds
 *   secret     a wrong key (and, for sockets, garbage) never yields a connection;
 *              the right key then does
 *   bandwidth  1 GiB in 512 KiB messages, 8 outstanding (the proxy's pattern),
 *              and in 64 MiB messages; prints GB/s
 *   netns      sizes across two network namespaces joined by a veth pair
 *              (needs root and `ip`)
 *   handlestate  a handle with garbage where a connect once kept its state: connected or
 *              refused, never a crash; with garbage for the address: an error
 *   stranger   OFI: goodbyes and probes from a stranger's endpoint change nothing; the
 *              peer's death is still noticed
 *   away       the receiver's thread is away for 7 s (starved, descheduled) while a
 *              receive waits on a live, idle peer: no error when it comes back, and the
 *              message sent afterwards arrives
 *
 * Every buffer is registered with the connection's backend before use (net_util_mh), as IB
 * needs.
 *
 *   net_conformance_test <backend>_<case>     (backend: socket, ofi, ib, plugin)
 */
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <sys/wait.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "boot_util.h"
#include "base/socket.h"
#include "base/utils.h"
#include "base/error.h"
#include "mp_runner.h"
#include "net_util.h"
#include "test.h"
#include "transport/net_ofi.h"

#define WAIT_SEC 20.0
#define MIB ((size_t)1 << 20)

static char backend[16];

/* Flags in net_shared.flags. */
enum { F_LISTENING = 0, F_STEP = 1, F_DONE = 2, F_POSTED = 4 };

static int child_open(const struct braid_net_ops** ops, int* ndev) {
  test_failures = 0;
  test_checks = 0;
  return net_util_open(backend, ops, ndev);
}

/* Child 0's part of every case's start: listen, publish handle `slot`. */
static int listen_publish(struct net_shared* sh, const struct braid_net_ops* ops, int slot,
                          void** lcomm) {
  TEST_EXPECT_RES(ops->listen(0, sh->key, sh->handle[slot], lcomm), ncclSuccess);
  if (*lcomm == NULL) return -1;
  boot_add_flag(&sh->flags[F_LISTENING], 1);
  return 0;
}

/* Child 1's part: wait for handle `slot`, connect with `key`. */
static void* connect_to(struct net_shared* sh, const struct braid_net_ops* ops, int slot,
                        const uint8_t* key) {
  void* s = NULL;
  if (boot_wait_flag(&sh->flags[F_LISTENING], slot + 1, WAIT_SEC) != 0) return NULL;
  TEST_EXPECT_RES(net_util_connect(ops, 0, key, sh->handle[slot], &s, WAIT_SEC), ncclSuccess);
  return s;
}

static int child_verdict(void) { return test_failures ? 1 : 0; }

/* ---------------------------------------------------------------- connect */

/* After the sender closed its end normally, a receive neither completes nor fails. */
static void check_goodbye(const struct braid_net_ops* ops, void* comm) {
  uint64_t word = 0;
  void* req = NULL;
  TEST_EXPECT_RES(net_util_post(ops, comm, 0, &word, sizeof word, &req, WAIT_SEC), ncclSuccess);
  TEST_EXPECT_RES(net_util_wait(ops, req, NULL, 1.5), NET_UTIL_TIMEOUT_RES);
}

static int connect_child(const struct mp_child* c) {
  struct net_shared* sh = c->arg;
  const struct braid_net_ops* ops;
  int ndev, rc = child_open(&ops, &ndev);
  if (rc) return rc;
  uint64_t word = 0;
  if (c->index == 0) {
    void *l = NULL, *r[2] = {NULL, NULL};
    if (listen_publish(sh, ops, 0, &l) != 0) return 1;
    for (int i = 0; i < 2; i++) {
      TEST_EXPECT_RES(net_util_accept(ops, l, &r[i], WAIT_SEC), ncclSuccess);
      if (r[i] == NULL) return 1;
    }
    for (int i = 0; i < 2; i++) {
      void* req = NULL;
      size_t size = 0;
      TEST_EXPECT_RES(net_util_post(ops, r[i], 0, &word, sizeof word, &req, WAIT_SEC), ncclSuccess);
      TEST_EXPECT_RES(net_util_wait(ops, req, &size, WAIT_SEC), ncclSuccess);
      /* Connection order is not message order: each carries its own number. */
      TEST_CHECK(size == 8 && word >= 1000 && word <= 1001, "message %d: %zu bytes, %llu", i, size,
                 (unsigned long long)word);
    }
    boot_set_flag(&sh->flags[F_DONE], 1);
    boot_wait_flag(&sh->flags[F_STEP], 1, WAIT_SEC); /* the sender closed both */
    check_goodbye(ops, r[0]);
    for (int i = 0; i < 2; i++) net_util_close(ops, r[i], 0);
    ops->close_listen(l);
  } else {
    void* s[2];
    for (int i = 0; i < 2; i++) {
      s[i] = connect_to(sh, ops, 0, sh->key);
      if (s[i] == NULL) return 1;
    }
    for (int i = 0; i < 2; i++) {
      void* req = NULL;
      uint64_t w = 1000 + (uint64_t)i;
      TEST_EXPECT_RES(net_util_post(ops, s[i], 1, &w, sizeof w, &req, WAIT_SEC), ncclSuccess);
      TEST_EXPECT_RES(net_util_wait(ops, req, NULL, WAIT_SEC), ncclSuccess);
    }
    boot_wait_flag(&sh->flags[F_DONE], 1, WAIT_SEC); /* keep the sends' data until it landed */
    for (int i = 0; i < 2; i++) net_util_close(ops, s[i], 1);
    boot_set_flag(&sh->flags[F_STEP], 1);
    boot_wait_flag(&sh->flags[F_DONE + 1], 1, 5.0); /* stay alive while the goodbye is checked */
  }
  if (c->index == 0) boot_set_flag(&sh->flags[F_DONE + 1], 1);
  return child_verdict();
}

/* ------------------------------------------------------------------ sizes */

static const size_t test_sizes[] = {0, 1, 7, 4096, MIB + 3, 64 * MIB};

static int sizes_child(const struct mp_child* c) {
  struct net_shared* sh = c->arg;
  const struct braid_net_ops* ops;
  int ndev, rc = child_open(&ops, &ndev);
  if (rc) return rc;
  char* buf = malloc(64 * MIB + 64);
  if (buf == NULL) return 1;
  void *l = NULL, *comm = NULL;
  if (c->index == 0) {
    if (listen_publish(sh, ops, 0, &l) != 0) return 1;
    TEST_EXPECT_RES(net_util_accept(ops, l, &comm, WAIT_SEC), ncclSuccess);
  } else {
    comm = connect_to(sh, ops, 0, sh->key);
  }
  for (size_t i = 0; comm && i < BRAID_ARRAY_LEN(test_sizes); i++) {
    size_t n = test_sizes[i], got = 0;
    void* req = NULL;
    if (c->index == 1) net_util_fill(buf, n, 7 + i);
    else memset(buf, 0xee, n + 64);
    /* Receives are larger than the message: the size must come back exact. */
    TEST_EXPECT_RES(net_util_post(ops, comm, c->index, buf, c->index ? n : n + 64, &req, WAIT_SEC),
                    ncclSuccess);
    TEST_EXPECT_RES(net_util_wait(ops, req, &got, WAIT_SEC), ncclSuccess);
    if (c->index == 0) {
      TEST_CHECK(got == n, "%zu bytes received for a %zu-byte message", got, n);
      TEST_CHECK(net_util_check(buf, n, 7 + i) == 0, "%zu-byte message corrupted", n);
      TEST_CHECK((unsigned char)buf[n] == 0xee, "wrote past a %zu-byte message", n);
    }
  }
  boot_add_flag(&sh->flags[F_DONE], 1);
  boot_wait_flag(&sh->flags[F_DONE], 2, WAIT_SEC);
  if (comm) net_util_close(ops, comm, c->index);
  if (l) ops->close_listen(l);
  free(buf);
  return comm ? child_verdict() : 1;
}

/* ------------------------------------------------------------ many, order */

/* Message i of the many/order cases: a size that varies, up to 200 KB. */
static size_t msg_size(int i) { return (size_t)((i * 40503) % 200000) + (i % 3 == 0 ? 0 : 5); }

/*
 * Posts n requests (all must be accepted, each once the backend is ready for it: an IB send waits
 * for the receiver's clear-to-send), waits for them in `order`, checks the data.
 */
static void exchange(const struct braid_net_ops* ops, void* comm, int is_send, int n, const int* order,
                     char* buf, size_t stride) {
  void* req[64];
  net_util_mh(ops, comm, buf, stride * (size_t)n);
  for (int i = 0; i < n; i++) {
    if (is_send) net_util_fill(buf + i * stride, msg_size(i), 100 + (uint64_t)i);
    req[i] = NULL;
    ncclResult_t res = net_util_post(ops, comm, is_send, buf + i * stride,
                                     is_send ? msg_size(i) : stride, &req[i], WAIT_SEC);
    TEST_CHECK(res == ncclSuccess && req[i] != NULL, "request %d of %d not taken (%d)", i, n, (int)res);
  }
  for (int k = 0; k < n; k++) {
    int i = order[k];
    size_t got = 0;
    if (req[i] == NULL) continue;
    TEST_EXPECT_RES(net_util_wait(ops, req[i], &got, WAIT_SEC), ncclSuccess);
    if (!is_send) {
      TEST_CHECK(got == msg_size(i), "message %d: %zu bytes, expected %zu", i, got, msg_size(i));
      TEST_CHECK(net_util_check(buf + i * stride, msg_size(i), 100 + (uint64_t)i) == 0,
                 "message %d corrupted", i);
    }
  }
}

static int many_or_order_child(const struct mp_child* c, int shuffle) {
  struct net_shared* sh = c->arg;
  const struct braid_net_ops* ops;
  struct braid_net_props props;
  int ndev, rc = child_open(&ops, &ndev);
  if (rc) return rc;
  TEST_EXPECT_RES(ops->get_properties(0, &props), ncclSuccess);
  int n = shuffle ? 16 : BRAID_MIN(props.max_requests, 64);
  TEST_CHECK(props.max_requests >= 8, "max_requests %d is below the proxy's 8 steps", props.max_requests);
  size_t stride = 200 * 1024;
  char* buf = malloc(stride * 64);
  int order[64];
  for (int i = 0; i < n; i++) order[i] = shuffle ? n - 1 - i : i; /* reverse when shuffling */
  if (shuffle && c->index == 1) {
    srand(42);
    for (int i = n - 1; i > 0; i--) {
      int j = rand() % (i + 1), t = order[i];
      order[i] = order[j];
      order[j] = t;
    }
  }
  void *l = NULL, *comm = NULL;
  if (c->index == 0) {
    if (listen_publish(sh, ops, 0, &l) != 0) return 1;
    TEST_EXPECT_RES(net_util_accept(ops, l, &comm, WAIT_SEC), ncclSuccess);
  } else {
    comm = connect_to(sh, ops, 0, sh->key);
  }
  if (comm && buf) {
    exchange(ops, comm, c->index, n, order, buf, stride);
    if (!shuffle) { /* full: one more is refused, then taken once the others are done */
      void* reqs[64] = {NULL};
      void* mh = net_util_mh(ops, comm, buf, 8);
      int taken = 0;
      for (int i = 0; i < n + 1; i++) {
        void** r = &reqs[BRAID_MIN(i, 63)];
        ncclResult_t res = i < n ? net_util_post(ops, comm, c->index, buf, 8, r, WAIT_SEC)
                         : c->index ? ops->isend(comm, buf, 8, mh, r) : ops->irecv(comm, buf, 8, mh, r);
        TEST_CHECK(res == ncclSuccess, "posting request %d failed", i);
        taken += *r != NULL;
        if (i < n) TEST_CHECK(*r != NULL, "request %d of max_requests %d refused", i, n);
      }
      TEST_CHECK(taken == n, "%d requests taken with max_requests %d", taken, n);
      for (int i = 0; i < n; i++)
        if (reqs[i]) TEST_EXPECT_RES(net_util_wait(ops, reqs[i], NULL, WAIT_SEC), ncclSuccess);
    }
  }
  boot_add_flag(&sh->flags[F_DONE], 1);
  boot_wait_flag(&sh->flags[F_DONE], 2, WAIT_SEC);
  if (comm) net_util_close(ops, comm, c->index);
  if (l) ops->close_listen(l);
  free(buf);
  return comm ? child_verdict() : 1;
}

static int many_child(const struct mp_child* c) { return many_or_order_child(c, 0); }
static int order_child(const struct mp_child* c) { return many_or_order_child(c, 1); }

/* -------------------------------------------------------------- peerclose */

/* Waits for req, expecting an error within `sec`; returns 0 when one came. */
static int expect_error(const struct braid_net_ops* ops, void* req, double sec, const char* what) {
  double start = boot_now();
  ncclResult_t res = net_util_wait(ops, req, NULL, sec);
  TEST_CHECK(res != ncclSuccess && res != NET_UTIL_TIMEOUT_RES,
             "%s: test() returned %d after %.1f s, expected an error", what, (int)res, boot_now() - start);
  if (res != ncclSuccess && res != NET_UTIL_TIMEOUT_RES)
    fprintf(stderr, "%s: error %d after %.2f s (expected)\n", what, (int)res, boot_now() - start);
  return res != ncclSuccess && res != NET_UTIL_TIMEOUT_RES ? 0 : -1;
}

/*
 * The victim of a peerclose scenario runs in a grandchild that kills itself
 * (no close, no cleanup: like a crash); its child reports that as a pass.
 */
static int run_victim(const struct mp_child* c, int (*body)(const struct mp_child*)) {
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) _exit(body(c));
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid) return 1;
  if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) return 0;
  fprintf(stderr, "the victim did not reach its end (status 0x%x)\n", status);
  return WIFEXITED(status) && WEXITSTATUS(status) == TEST_SKIP_CODE ? TEST_SKIP_CODE : 1;
}

/*
 * Scenario 1, victim: sends 64 MiB, lets some of it flow, dies. It dies after
 * 1 ms: over loopback with helper threads the whole message can leave within
 * tens of milliseconds, and then there is no mid-message death to see.
 */
static int sender_dies_body(const struct mp_child* c) {
  struct net_shared* sh = c->arg;
  const struct braid_net_ops* ops;
  int ndev, rc = child_open(&ops, &ndev);
  if (rc) return rc;
  char* buf = malloc(64 * MIB);
  void *comm = connect_to(sh, ops, 0, sh->key), *req = NULL;
  if (comm == NULL || buf == NULL) return 1;
  boot_wait_flag(&sh->flags[F_POSTED], 1, WAIT_SEC);
  if (net_util_post(ops, comm, 1, buf, 64 * MIB, &req, WAIT_SEC) != ncclSuccess) return 1;
  double end = boot_now() + 0.001;
  int done = 0;
  while (boot_now() < end && !done) ops->test(req, &done, NULL);
  if (done) fprintf(stderr, "victim: 64 MiB left within 1 ms; the receiver will see no death\n");
  boot_set_flag(&sh->flags[F_STEP], 1);
  raise(SIGKILL);
  return 1;
}

static int peerclose_sender_dies(const struct mp_child* c) {
  struct net_shared* sh = c->arg;
  if (c->index == 1) return run_victim(c, sender_dies_body);
  const struct braid_net_ops* ops;
  int ndev, rc = child_open(&ops, &ndev);
  if (rc) return rc;
  char* buf = malloc(64 * MIB);
  void *l = NULL, *comm = NULL, *req = NULL;
  if (listen_publish(sh, ops, 0, &l) != 0 || buf == NULL) return 1;
  TEST_EXPECT_RES(net_util_accept(ops, l, &comm, WAIT_SEC), ncclSuccess);
  if (comm == NULL) return 1;
  /*
   * Posted before the sender starts (F_POSTED), but not tested until it is
   * gone: its data piles up in flight. Posted after, the message is an
   * unexpected rendezvous from a dead peer, and libfabric 1.17's ofi_rxm
   * (Debian 12) crashes in fi_trecv matching it (SIGSEGV inside the library,
   * about 1 run in 6 under load); that is libfabric's bug, not the case this
   * test is about.
   */
  TEST_EXPECT_RES(net_util_post(ops, comm, 0, buf, 64 * MIB, &req, WAIT_SEC), ncclSuccess);
  boot_set_flag(&sh->flags[F_POSTED], 1);
  boot_wait_flag(&sh->flags[F_STEP], 1, WAIT_SEC);
  if (req) expect_error(ops, req, 10.0, "receiver, sender died mid-message");
  net_util_close(ops, comm, 0);
  ops->close_listen(l);
  free(buf);
  return child_verdict();
}

/* Scenario 2, victim: the receiver accepts, posts nothing, and dies under two large sends. */
static int receiver_dies_body(const struct mp_child* c) {
  struct net_shared* sh = c->arg;
  const struct braid_net_ops* ops;
  int ndev, rc = child_open(&ops, &ndev);
  if (rc) return rc;
  void *l = NULL, *comm = NULL;
  if (listen_publish(sh, ops, 0, &l) != 0) return 1;
  if (net_util_accept(ops, l, &comm, WAIT_SEC) != ncclSuccess || comm == NULL) return 1;
  boot_wait_flag(&sh->flags[F_STEP], 1, WAIT_SEC); /* the sends are posted */
  mp_sleep(0.05);
  raise(SIGKILL);
  return 1;
}

static int peerclose_receiver_dies(const struct mp_child* c) {
  struct net_shared* sh = c->arg;
  if (c->index == 0) return run_victim(c, receiver_dies_body);
  const struct braid_net_ops* ops;
  int ndev, rc = child_open(&ops, &ndev);
  if (rc) return rc;
  char* buf = malloc(64 * MIB);
  void *comm = connect_to(sh, ops, 0, sh->key), *req = NULL, *req2 = NULL;
  if (comm == NULL || buf == NULL) return 1;
  /* An IB send waits for its receive, which the victim never posts: then the post must fail. */
  ncclResult_t r1 = net_util_post(ops, comm, 1, buf, 64 * MIB, &req, 2.0);
  ncclResult_t r2 = r1 == ncclSuccess ? net_util_post(ops, comm, 1, buf, 64 * MIB, &req2, 2.0) : r1;
  TEST_CHECK((r1 == ncclSuccess || r1 == NET_UTIL_TIMEOUT_RES) &&
             (r2 == ncclSuccess || r2 == NET_UTIL_TIMEOUT_RES), "posting two sends: %d, %d", (int)r1,
             (int)r2);
  boot_set_flag(&sh->flags[F_STEP], 1);
  if (req2) {
    expect_error(ops, req2, 15.0, "sender, receiver died");
  } else {
    double start = boot_now();
    ncclResult_t res = net_util_post(ops, comm, 1, buf, 64 * MIB, &req2, 15.0);
    TEST_CHECK(res != ncclSuccess && res != NET_UTIL_TIMEOUT_RES,
               "a send waiting for its receive: %d after %.1f s, expected an error", (int)res,
               boot_now() - start);
    fprintf(stderr, "sender waiting for its receive, receiver died: error %d after %.2f s (expected)\n",
            (int)res, boot_now() - start);
  }
  net_util_close(ops, comm, 1);
  free(buf);
  return child_verdict();
}

/* ----------------------------------------------------------------- secret */

/* The socket backend's handle starts with magic, version and the listener's address. */
struct sock_handle_head {
  uint32_t magic, version;
  union braid_sockaddr addr;
};

#ifdef BRAID_TEST_HAVE_LIBFABRIC
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_tagged.h>

/* The OFI backend's handle and handshake tag (net_ofi.c). */
struct ofi_handle_head {
  uint32_t magic;
  uint16_t version, namelen;
  char name[80];
};
#define TEST_OFI_TAG_CONNECT ((1ull << 62) | 1)

/* A raw libfabric endpoint of our own, aimed at one address (a stranger to the backend). */
struct ofi_raw {
  struct fi_info *hints, *list;
  struct fid_fabric* fabric;
  struct fid_domain* domain;
  struct fid_ep* ep;
  struct fid_av* av;
  struct fid_cq* cq;
  struct fid_mr* mr;
  fi_addr_t peer;
  char* buf; /* registered: what is sent goes through it */
  size_t buf_size;
};

static void ofi_raw_close(struct ofi_raw* r) {
  if (r->mr) fi_close(&r->mr->fid);
  if (r->ep) fi_close(&r->ep->fid);
  if (r->av) fi_close(&r->av->fid);
  if (r->cq) fi_close(&r->cq->fid);
  if (r->domain) fi_close(&r->domain->fid);
  if (r->fabric) fi_close(&r->fabric->fid);
  if (r->list) fi_freeinfo(r->list);
  if (r->hints) fi_freeinfo(r->hints);
  free(r->buf);
  memset(r, 0, sizeof *r);
}

/* Opens the endpoint and inserts `name` (an endpoint name of the backend's); 0 when ready. */
static int ofi_raw_open(struct ofi_raw* r, const void* name) {
  struct fi_info* info = NULL;
  struct fi_av_attr av_attr = {.type = FI_AV_TABLE};
  struct fi_cq_attr cq_attr = {.format = FI_CQ_FORMAT_TAGGED};
  const char* prov = getenv("BRAID_OFI_PROVIDER");
  memset(r, 0, sizeof *r);
  r->peer = FI_ADDR_UNSPEC;
  r->buf_size = 64 << 10;
  r->buf = malloc(r->buf_size);
  r->hints = fi_allocinfo();
  if (r->hints == NULL || r->buf == NULL) return -1;
  memset(r->buf, 'x', r->buf_size);
  r->hints->caps = FI_TAGGED | FI_MSG;
  r->hints->mode = FI_CONTEXT;
  r->hints->ep_attr->type = FI_EP_RDM;
  r->hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
  r->hints->fabric_attr->prov_name = strdup(prov ? prov : "tcp;ofi_rxm");
  /* net_ofi_fabric.c's OFI_API */
  int rc = fi_getinfo(FI_VERSION(1, 10), NULL, NULL, 0, r->hints, &r->list);
  for (struct fi_info* i = r->list; rc == 0 && i; i = i->next)
    if (i->addr_format == FI_SOCKADDR_IN && info == NULL) info = i; /* the backend's format */
  if (info == NULL) { /* the backend's addresses are IPv4 wherever the provider offers it */
    fprintf(stderr, "note: no IPv4 libfabric endpoint to send from (%s)\n", fi_strerror(-rc));
    return -1;
  }
  rc = fi_fabric(info->fabric_attr, &r->fabric, NULL);
  if (rc == 0) rc = fi_domain(r->fabric, info, &r->domain, NULL);
  if (rc == 0) rc = fi_endpoint(r->domain, info, &r->ep, NULL);
  if (rc == 0) rc = fi_av_open(r->domain, &av_attr, &r->av, NULL);
  if (rc == 0) rc = fi_cq_open(r->domain, &cq_attr, &r->cq, NULL);
  if (rc == 0) rc = fi_ep_bind(r->ep, &r->av->fid, 0);
  if (rc == 0) rc = fi_ep_bind(r->ep, &r->cq->fid, FI_TRANSMIT | FI_RECV);
  if (rc == 0) rc = fi_enable(r->ep);
  if (rc == 0) rc = fi_mr_reg(r->domain, r->buf, r->buf_size, FI_SEND, 0, 0, 0, &r->mr, NULL);
  if (rc == 0) rc = fi_av_insert(r->av, name, 1, &r->peer, 0, NULL) == 1 ? 0 : -FI_EINVAL;
  TEST_CHECK(rc == 0, "setting up a raw libfabric endpoint: %s", fi_strerror(-rc));
  return rc == 0 ? 0 : -1;
}

/*
 * Sends `size` bytes (`data`, or the buffer's 'x's when NULL) with `tag`; waits up to `sec`
 * for the send's completion. 1: it completed (or the provider refused it: either way it
 * left), 0: posted but not complete yet, -1: it could not be posted.
 */
static int ofi_raw_send(struct ofi_raw* r, const void* data, size_t size, uint64_t tag,
                        double sec) {
  /* FI_CONTEXT: the provider uses each send's context until it completes; the callers post
     far fewer than this many sends. */
  static struct fi_context ctx[256];
  static unsigned next;
  if (size > r->buf_size) return -1;
  if (data) memcpy(r->buf, data, size);
  double end = boot_now() + sec;
  int rc;
  struct fi_cq_tagged_entry e;
  struct fi_cq_err_entry err;
  do {
    rc = (int)fi_tsend(r->ep, r->buf, size, fi_mr_desc(r->mr), r->peer, tag, &ctx[next % 256]);
    if (rc == -FI_EAGAIN && fi_cq_read(r->cq, &e, 1) == -FI_EAVAIL) fi_cq_readerr(r->cq, &err, 0);
  } while (rc == -FI_EAGAIN && boot_now() < end);
  if (rc != 0) return -1;
  next++;
  while (boot_now() < end) {
    ssize_t n = fi_cq_read(r->cq, &e, 1);
    if (n == -FI_EAVAIL) {
      memset(&err, 0, sizeof err);
      fi_cq_readerr(r->cq, &err, 0);
    }
    if (n == 1 || (n < 0 && n != -FI_EAGAIN)) return 1;
  }
  return 0;
}

/*
 * A raw libfabric endpoint sends the listener a connection request far larger than the
 * handshake message (its receive is posted for anyone): the listener must drop it and go on.
 */
static void ofi_stray_oversize(struct net_shared* sh) {
  struct ofi_handle_head h;
  struct ofi_raw r;
  memcpy(&h, sh->handle[0], sizeof h);
  if (ofi_raw_open(&r, h.name) == 0) {
    int sent = ofi_raw_send(&r, NULL, r.buf_size, TEST_OFI_TAG_CONNECT, 5.0);
    TEST_CHECK(sent >= 0, "posting the stray failed");
    mp_sleep(0.2);
  }
  ofi_raw_close(&r);
}
#endif

/* Child 1's strays: a wrong key; for sockets a raw connection sending garbage, for OFI a raw
   endpoint sending an oversized request. */
static void secret_strays(struct net_shared* sh, const struct braid_net_ops* ops) {
  uint8_t bad[BRAID_NET_KEY_BYTES];
  uint8_t handle[BRAID_NET_HANDLE_BYTES] __attribute__((aligned(8)));
  memcpy(bad, sh->key, sizeof bad);
  bad[3] ^= 0x40;
  memcpy(handle, sh->handle[0], sizeof handle);
  void* s = NULL;
  ncclResult_t res = net_util_connect(ops, 0, bad, handle, &s, 1.5);
  /* IB's connect hears the listener refuse (ncclRemoteError); the others may not. */
  TEST_CHECK(res == ncclSuccess || res == NET_UTIL_TIMEOUT_RES || res == ncclRemoteError,
             "connecting with a wrong key: %d", (int)res);
  if (s) net_util_close(ops, s, 1);
  if (strcmp(backend, "socket") == 0) {
    struct sock_handle_head head;
    int fd = -1;
    memcpy(&head, sh->handle[0], sizeof head);
    if (socket_connect(&head.addr, 5.0, NULL, &fd) == ncclSuccess) {
      char junk[200];
      memset(junk, 'x', sizeof junk);
      socket_send_all(fd, junk, sizeof junk, 5.0, NULL);
      mp_sleep(0.2);
      socket_close(&fd);
    }
  }
#ifdef BRAID_TEST_HAVE_LIBFABRIC
  if (strcmp(backend, "ofi") == 0) ofi_stray_oversize(sh);
#endif
}

static int secret_child(const struct mp_child* c) {
  struct net_shared* sh = c->arg;
  const struct braid_net_ops* ops;
  int ndev, rc = child_open(&ops, &ndev);
  if (rc) return rc;
  uint64_t word = 0;
  void *l = NULL, *comm = NULL, *req = NULL;
  if (c->index == 1) {
    if (boot_wait_flag(&sh->flags[F_LISTENING], 1, WAIT_SEC) != 0) return 1;
    secret_strays(sh, ops);
    boot_set_flag(&sh->flags[F_STEP], 1);
    boot_wait_flag(&sh->flags[F_STEP], 2, WAIT_SEC);
    comm = connect_to(sh, ops, 0, sh->key);
    word = 4242;
    if (comm) TEST_EXPECT_RES(net_util_post(ops, comm, 1, &word, 8, &req, WAIT_SEC), ncclSuccess);
    if (req) TEST_EXPECT_RES(net_util_wait(ops, req, NULL, WAIT_SEC), ncclSuccess);
    boot_wait_flag(&sh->flags[F_DONE], 1, WAIT_SEC);
    if (comm) net_util_close(ops, comm, 1);
    return comm ? child_verdict() : 1;
  }
  if (listen_publish(sh, ops, 0, &l) != 0) return 1;
  /* Until the strays are done and a while after, nothing may be accepted. */
  double quiet_until = -1;
  while (quiet_until < 0 || boot_now() < quiet_until) {
    if (quiet_until < 0 && __atomic_load_n(&sh->flags[F_STEP], __ATOMIC_ACQUIRE) >= 1)
      quiet_until = boot_now() + 1.0;
    TEST_EXPECT_RES(ops->accept(l, &comm), ncclSuccess);
    TEST_CHECK(comm == NULL, "a connection without the right key was accepted");
    if (comm) return 1;
    mp_sleep(0.001);
  }
  boot_set_flag(&sh->flags[F_STEP], 2);
  TEST_EXPECT_RES(net_util_accept(ops, l, &comm, WAIT_SEC), ncclSuccess);
  if (comm) TEST_EXPECT_RES(net_util_post(ops, comm, 0, &word, 8, &req, WAIT_SEC), ncclSuccess);
  if (req) TEST_EXPECT_RES(net_util_wait(ops, req, NULL, WAIT_SEC), ncclSuccess);
  TEST_CHECK(word == 4242, "the good connection carried %llu", (unsigned long long)word);
  boot_set_flag(&sh->flags[F_DONE], 1);
  if (comm) net_util_close(ops, comm, 0);
  ops->close_listen(l);
  return child_verdict();
}

/* -------------------------------------------------------------- bandwidth */

/* Moves `total` bytes in messages of `msg` bytes with `depth` outstanding; returns GB/s. */
static double stream_bytes(const struct braid_net_ops* ops, void* comm, int is_send, char* buf,
                           size_t msg, int depth, size_t total) {
  size_t nmsg = total / msg, posted = 0, done = 0;
  void* req[16] = {NULL};
  void* mh = net_util_mh(ops, comm, buf, msg * (size_t)depth);
  double start = boot_now();
  while (done < nmsg) {
    while (posted < nmsg && posted - done < (size_t)depth) {
      void** r = &req[posted % (size_t)depth];
      char* at = buf + (posted % (size_t)depth) * msg;
      ncclResult_t res = is_send ? ops->isend(comm, at, msg, mh, r) : ops->irecv(comm, at, msg, mh, r);
      if (res != ncclSuccess) return -1;
      if (*r == NULL) break;
      posted++;
    }
    int ok = 0;
    if (posted > done && ops->test(req[done % (size_t)depth], &ok, NULL) != ncclSuccess) return -1;
    if (ok) done++;
    else sched_yield(); /* like the proxy: leave the cores to the helpers while waiting */
    if (boot_now() - start > 25.0) return -1;
  }
  return (double)(nmsg * msg) / (boot_now() - start) / 1e9;
}

static int bandwidth_child(const struct mp_child* c) {
  struct net_shared* sh = c->arg;
  const struct braid_net_ops* ops;
  int ndev, rc = child_open(&ops, &ndev);
  if (rc) return rc;
  const size_t total = (size_t)1 << 30;
  char* buf = malloc(64 * MIB);
  void *l = NULL, *comm = NULL;
  if (buf == NULL) return 1;
  net_util_fill(buf, 64 * MIB, 5);
  if (c->index == 0) {
    if (listen_publish(sh, ops, 0, &l) != 0) return 1;
    TEST_EXPECT_RES(net_util_accept(ops, l, &comm, WAIT_SEC), ncclSuccess);
  } else {
    comm = connect_to(sh, ops, 0, sh->key);
  }
  if (comm == NULL) return 1;
  double slots = stream_bytes(ops, comm, c->index, buf, 512 * 1024, 8, total);
  double large = stream_bytes(ops, comm, c->index, buf, 64 * MIB, 1, total);
  TEST_CHECK(slots > 0 && large > 0, "a transfer failed or took longer than 25 s");
  if (c->index == 0) {
    TEST_CHECK(net_util_check(buf, 64 * MIB, 5) == 0, "the last 64 MiB message is corrupted");
    printf("net %s: 1 GiB in 512 KiB messages, 8 outstanding: %.2f GB/s; in 64 MiB messages: "
           "%.2f GB/s\n", backend, slots, large);
    fflush(stdout);
  }
  boot_add_flag(&sh->flags[F_DONE], 1);
  boot_wait_flag(&sh->flags[F_DONE], 2, WAIT_SEC);
  net_util_close(ops, comm, c->index);
  if (l) ops->close_listen(l);
  free(buf);
  return child_verdict();
}

/* ------------------------------------------------------------------ netns */

/* Both children in their own namespace, then the sizes case over the veth pair. */
static int netns_child(const struct mp_child* c) {
  struct net_shared* sh = c->arg;
  if (net_util_netns_enter(sh, c->index) != 0) {
    fprintf(stderr, "cannot enter namespace %s\n", sh->ns[c->index]);
    return 1;
  }
  return sizes_child(c);
}

/* ------------------------------------------------------------------- main */

static int run_case(mp_child_fn fn, const char* name, int netns) {
  struct net_shared* sh = mp_shared_alloc(sizeof *sh);
  braid_random_bytes(sh->key, sizeof sh->key);
  if (netns) {
    if (geteuid() != 0) TEST_SKIP("network namespaces need root");
    if (system("ip -V >/dev/null 2>&1") != 0) TEST_SKIP("no `ip` command");
    if (net_util_netns_setup(sh) != 0) {
      net_util_netns_cleanup(sh);
      TEST_SKIP("cannot create network namespaces with a veth pair here");
    }
  }
  struct mp_opts opts = {.name = name, .nprocs = 2, .timeout_sec = 40, .arg = sh};
  int rc = mp_run(&opts, fn);
  if (netns) net_util_netns_cleanup(sh);
  mp_shared_free(sh, sizeof *sh);
  return rc;
}

/* ---------------------------------------------------------------- refused */

/*
 * The receiver listens, hands its handle over and closes the listener before the sender
 * connects (its process gave up, say): the connect must fail within NET_REFUSED_GRACE_S and a
 * bit, naming the refusal, not after the whole connect timeout.
 */
static int refused_child(const struct mp_child* c) {
  struct net_shared* sh = c->arg;
  const struct braid_net_ops* ops;
  int ndev, rc = child_open(&ops, &ndev);
  if (rc) return rc;
  /* libfabric's connect goes through the provider's messages, not a TCP connect to refuse. */
  if (strcmp(backend, "ofi") == 0) TEST_SKIP("OFI: a closed listener is not seen as a refusal");
  if (c->index == 0) {
    void* l = NULL;
    if (listen_publish(sh, ops, 0, &l) != 0) return 1;
    ops->close_listen(l);
    boot_set_flag(&sh->flags[F_STEP], 1);
    return child_verdict();
  }
  if (boot_wait_flag(&sh->flags[F_STEP], 1, WAIT_SEC) != 0) return 1;
  void* s = NULL;
  double start = boot_now(), longest = 0;
  ncclResult_t res = net_util_connect_timed(ops, 0, sh->key, sh->handle[0], &s,
                                            3 * NET_REFUSED_GRACE_S, &longest);
  double took = boot_now() - start;
  TEST_CHECK(res == ncclRemoteError && s == NULL && took < NET_REFUSED_GRACE_S + 2.0,
             "connect to a closed listener: %d after %.1f s (%s)", (int)res, took,
             braid_err_last());
  /* The proxy thread calls connect between the other connections' transfers. */
  /* The old connect blocked 0.1 s a call while refused; a loaded host may delay one a little. */
  TEST_CHECK(longest < 0.095, "one connect call blocked for %.3f s", longest);
  fprintf(stderr, "refused: error %d after %.2f s, longest connect call %.4f s: %s\n", (int)res,
          took, longest, braid_err_last());
  return child_verdict();
}

/* ---------------------------------------------------------------- abandon */

/*
 * The sender closes with close_abort (its comm was aborted) while the receiver waits for a
 * message: no goodbye, so the receive fails at once instead of waiting on a clean close.
 */
static int abandon_child(const struct mp_child* c) {
  struct net_shared* sh = c->arg;
  const struct braid_net_ops* ops;
  int ndev, rc = child_open(&ops, &ndev);
  if (rc) return rc;
  if (ops->size <= offsetof(struct braid_net_ops, close_abort) || ops->close_abort == NULL)
    TEST_SKIP("the backend has no close_abort");
  if (c->index == 0) {
    void *l = NULL, *comm = NULL, *req = NULL;
    uint64_t word = 0;
    if (listen_publish(sh, ops, 0, &l) != 0) return 1;
    TEST_EXPECT_RES(net_util_accept(ops, l, &comm, WAIT_SEC), ncclSuccess);
    if (comm == NULL) return 1;
    TEST_EXPECT_RES(net_util_post(ops, comm, 0, &word, sizeof word, &req, WAIT_SEC), ncclSuccess);
    boot_set_flag(&sh->flags[F_POSTED], 1);
    if (req) expect_error(ops, req, 10.0, "receiver, sender aborted"); /* as a death */
    net_util_close(ops, comm, 0);
    ops->close_listen(l);
    return child_verdict();
  }
  void* s = connect_to(sh, ops, 0, sh->key);
  if (s == NULL) return 1;
  boot_wait_flag(&sh->flags[F_POSTED], 1, WAIT_SEC);
  ops->close_abort(s);
  return child_verdict();
}

/* ------------------------------------------------------------ handlestate */

/* Bytes of a handle that the listener fills: magic, version, then the address (name). */
static size_t handle_fields_bytes(void) {
  if (strcmp(backend, "ofi") == 0) return 4 + 2 + 2 + 80; /* magic, version, namelen, name */
  if (strcmp(backend, "plugin") == 0) return 36; /* tests/plugins/net_tcp_plugin.c's handle */
  return sizeof(struct sock_handle_head);                  /* socket, ib: magic, version, addr */
}

/*
 * A handle is bytes from a peer: a connecting side must take nothing in it for its own state.
 * With 0x41 in every byte after the listener's fields (where a connect's progress was once kept,
 * as a pointer) a connect must succeed or fail cleanly; with 0x41 in the fields after magic and
 * version (the address) it must fail with an error. Then a normal connect works. The listener
 * receives one message on each connection made.
 */
static int handlestate_child(const struct mp_child* c) {
  struct net_shared* sh = c->arg;
  const struct braid_net_ops* ops;
  int ndev, rc = child_open(&ops, &ndev);
  if (rc) return rc;
  void* comms[2] = {NULL, NULL};
  int n = 0;
  if (c->index == 0) {
    void* l = NULL;
    int want = -1;
    if (listen_publish(sh, ops, 0, &l) != 0) return 1;
    double end = boot_now() + WAIT_SEC;
    while (boot_now() < end && (want < 0 || n < want)) {
      void* comm = NULL;
      if (want < 0 && __atomic_load_n(&sh->flags[F_POSTED], __ATOMIC_ACQUIRE) > 0)
        want = sh->flags[F_POSTED] - 1; /* the connections the sender made */
      ncclResult_t res = ops->accept(l, &comm);
      TEST_CHECK(res == ncclSuccess, "accept failed: %d (%s)", (int)res, braid_err_last());
      if (res != ncclSuccess) break;
      if (comm && n < 2) {
        comms[n++] = comm;
      } else if (comm) {
        TEST_CHECK(0, "more connections than were made");
        net_util_close(ops, comm, 0);
      } else {
        mp_sleep(0.001);
      }
    }
    TEST_CHECK(want >= 1 && n == want, "%d connections accepted, the sender made %d", n, want);
    uint64_t seen = 0;
    for (int i = 0; i < n; i++) {
      uint64_t word = 0;
      void* req = NULL;
      TEST_EXPECT_RES(net_util_post(ops, comms[i], 0, &word, sizeof word, &req, WAIT_SEC),
                      ncclSuccess);
      if (req) TEST_EXPECT_RES(net_util_wait(ops, req, NULL, WAIT_SEC), ncclSuccess);
      TEST_CHECK(word >= 1000 && word < 1002, "connection %d carried %llu", i,
                 (unsigned long long)word);
      seen |= 1ull << (word & 63);
    }
    TEST_CHECK(n < 2 || seen == ((1ull << (1000 & 63)) | (1ull << (1001 & 63))),
               "the two connections carried the same message");
    boot_set_flag(&sh->flags[F_DONE], 1);
    for (int i = 0; i < n; i++) net_util_close(ops, comms[i], 0);
    ops->close_listen(l);
    return child_verdict();
  }
  uint8_t handle[BRAID_NET_HANDLE_BYTES] __attribute__((aligned(8)));
  void* s = NULL;
  if (boot_wait_flag(&sh->flags[F_LISTENING], 1, WAIT_SEC) != 0) return 1;
  /* Garbage for the address: an error, at once. */
  memcpy(handle, sh->handle[0], sizeof handle);
  memset(handle + 8, 0x41, sizeof handle - 8);
  ncclResult_t res = net_util_connect(ops, 0, sh->key, handle, &s, 5.0);
  TEST_CHECK(res != ncclSuccess && res != NET_UTIL_TIMEOUT_RES && s == NULL,
             "a handle with 0x41 for its address: %d, comm %p", (int)res, s);
  fprintf(stderr, "handle with garbage for its address: error %d: %s\n", (int)res,
          braid_err_last());
  if (s) net_util_close(ops, s, 1);
  /* Garbage after the listener's fields: connected, or refused cleanly. */
  s = NULL;
  memcpy(handle, sh->handle[0], sizeof handle);
  memset(handle + handle_fields_bytes(), 0x41, sizeof handle - handle_fields_bytes());
  res = net_util_connect(ops, 0, sh->key, handle, &s, WAIT_SEC);
  TEST_CHECK(res != NET_UTIL_TIMEOUT_RES, "a handle with 0x41 after its fields: no answer");
  fprintf(stderr, "handle with garbage after its fields: %s (%d)\n", s ? "connected" : "refused",
          (int)res);
  if (s) comms[n++] = s;
  /* The handle as it came. */
  s = connect_to(sh, ops, 0, sh->key);
  if (s) comms[n++] = s;
  boot_set_flag(&sh->flags[F_POSTED], n + 1); /* before the sends: IB's wait for the receives */
  for (int i = 0; i < n; i++) {
    uint64_t word = 1000 + (uint64_t)i;
    void* req = NULL;
    TEST_EXPECT_RES(net_util_post(ops, comms[i], 1, &word, sizeof word, &req, WAIT_SEC),
                    ncclSuccess);
    if (req) TEST_EXPECT_RES(net_util_wait(ops, req, NULL, WAIT_SEC), ncclSuccess);
  }
  boot_wait_flag(&sh->flags[F_DONE], 1, WAIT_SEC); /* keep the sends' data until it landed */
  for (int i = 0; i < n; i++) net_util_close(ops, comms[i], 1);
  return s ? child_verdict() : 1;
}

/* ------------------------------------------------------------------- away */

#define AWAY_SEC 7.0 /* longer than any liveness deadline of a backend (OFI: 1 + 5 s) */

/* Tests `req` for `sec` seconds: 0 while it neither completes nor fails. */
static int test_quietly(const struct braid_net_ops* ops, void* req, double sec, const char* when) {
  double end = boot_now() + sec;
  while (boot_now() < end) {
    int done = 0;
    ncclResult_t res = ops->test(req, &done, NULL);
    TEST_CHECK(res == ncclSuccess, "%s: a receive from a live peer failed: %s", when,
               braid_err_last());
    TEST_CHECK(!done, "%s: a receive completed with nothing sent", when);
    if (res != ncclSuccess || done) return -1;
    mp_sleep(0.001);
  }
  return 0;
}

static int away_child(const struct mp_child* c) {
  struct net_shared* sh = c->arg;
  const struct braid_net_ops* ops;
  int ndev, rc = child_open(&ops, &ndev);
  if (rc) return rc;
  uint64_t word = 0;
  if (c->index == 0) {
    void *l = NULL, *comm = NULL, *req = NULL;
    if (listen_publish(sh, ops, 0, &l) != 0) return 1;
    TEST_EXPECT_RES(net_util_accept(ops, l, &comm, WAIT_SEC), ncclSuccess);
    if (comm == NULL) return 1;
    TEST_EXPECT_RES(net_util_post(ops, comm, 0, &word, sizeof word, &req, WAIT_SEC), ncclSuccess);
    /* Long enough for a liveness probe to go out; then away; then back, testing as before. */
    if (req && test_quietly(ops, req, 1.5, "before") == 0) {
      mp_sleep(AWAY_SEC);
      if (test_quietly(ops, req, 2.0, "back after 7 s away") == 0) {
        boot_set_flag(&sh->flags[F_STEP], 1);
        TEST_EXPECT_RES(net_util_wait(ops, req, NULL, WAIT_SEC), ncclSuccess);
        TEST_CHECK(word == 42, "the message after the absence: %llu", (unsigned long long)word);
      }
    }
    boot_set_flag(&sh->flags[F_DONE], 1);
    net_util_close(ops, comm, 0);
    ops->close_listen(l);
  } else {
    void *s = connect_to(sh, ops, 0, sh->key), *req = NULL;
    uint64_t w = 42;
    if (s == NULL) return 1;
    /* Idle as a proxy keeps an idle connection: its turns, so it takes the peer's probes. */
    const int has_idle = ops->size > offsetof(struct braid_net_ops, idle) && ops->idle != NULL;
    double end = boot_now() + 1.5 + AWAY_SEC + 2.0 + WAIT_SEC;
    while (__atomic_load_n(&sh->flags[F_STEP], __ATOMIC_ACQUIRE) < 1 &&
           __atomic_load_n(&sh->flags[F_DONE], __ATOMIC_ACQUIRE) < 1 && boot_now() < end) {
      if (has_idle) TEST_EXPECT_RES(ops->idle(s), ncclSuccess);
      mp_sleep(0.01);
    }
    if (__atomic_load_n(&sh->flags[F_STEP], __ATOMIC_ACQUIRE) >= 1) {
      TEST_EXPECT_RES(net_util_post(ops, s, 1, &w, sizeof w, &req, WAIT_SEC), ncclSuccess);
      if (req) TEST_EXPECT_RES(net_util_wait(ops, req, NULL, WAIT_SEC), ncclSuccess);
    }
    boot_wait_flag(&sh->flags[F_DONE], 1, WAIT_SEC); /* keep the send's data until it landed */
    net_util_close(ops, s, 1);
  }
  return child_verdict();
}

/* --------------------------------------------------------------- stranger */

#ifdef BRAID_TEST_HAVE_LIBFABRIC
/* The OFI backend's liveness tags and message (net_ofi.c). */
#define TEST_OFI_TAG_PROBE ((1ull << 62) | 3)
#define TEST_OFI_TAG_BYE ((1ull << 62) | 4)
struct ofi_live_msg_copy {
  uint32_t magic;
  uint16_t version, kind;
  uint8_t key[BRAID_NET_KEY_BYTES];
  uint64_t token, seq;
};
/* Where child 0 publishes its connection's endpoint name (in handle[1]). */
struct stranger_target {
  uint16_t len;
  char name[80];
};

/*
 * The sender of the stranger case, in a grandchild: connects, keeps its end progressing while
 * the stranger works, sends one message, and dies once the receiver waits for a second one.
 */
static int stranger_victim(const struct mp_child* c) {
  struct net_shared* sh = c->arg;
  const struct braid_net_ops* ops;
  int ndev, rc = child_open(&ops, &ndev);
  if (rc) return rc;
  void *s = connect_to(sh, ops, 0, sh->key), *req = NULL;
  uint64_t word = 77;
  if (s == NULL) return 1;
  for (int step = 0; step < 2; step++) {
    int* flag = step == 0 ? &sh->flags[F_STEP] : &sh->flags[F_POSTED];
    double end = boot_now() + WAIT_SEC;
    while (__atomic_load_n(flag, __ATOMIC_ACQUIRE) < (step == 0 ? 2 : 1) && boot_now() < end) {
      ops->idle(s); /* the receiver probes a peer that stays silent */
      mp_sleep(0.001);
    }
    if (step == 0) {
      TEST_EXPECT_RES(net_util_post(ops, s, 1, &word, sizeof word, &req, WAIT_SEC), ncclSuccess);
      if (req) TEST_EXPECT_RES(net_util_wait(ops, req, NULL, WAIT_SEC), ncclSuccess);
    }
  }
  if (test_failures) return 1;
  raise(SIGKILL);
  return 1;
}

/* Child 1 beside the victim: a raw endpoint that sends the receiver's connection strays. */
static void stranger_sends(struct net_shared* sh) {
  struct stranger_target t;
  struct ofi_raw r;
  struct ofi_live_msg_copy m;
  uint64_t legacy_bye = UINT64_MAX; /* a probe carrying this once meant "the peer closed" */
  if (boot_wait_flag(&sh->flags[F_STEP], 1, WAIT_SEC) != 0) return;
  memcpy(&t, sh->handle[1], sizeof t);
  if (ofi_raw_open(&r, t.name) != 0) {
    TEST_CHECK(0, "no raw endpoint to play the stranger with");
    ofi_raw_close(&r);
    return;
  }
  /* Well formed, with the job's key, but not this connection's token. */
  memset(&m, 0, sizeof m);
  m.magic = 0x2049464fu; /* "OFI " */
  m.version = 3;
  m.kind = 2; /* goodbye */
  memcpy(m.key, sh->key, sizeof m.key);
  m.token = 1;
  TEST_CHECK(ofi_raw_send(&r, &legacy_bye, sizeof legacy_bye, TEST_OFI_TAG_PROBE, 5.0) == 1,
             "the stranger's old-style goodbye did not leave");
  TEST_CHECK(ofi_raw_send(&r, &m, sizeof m, TEST_OFI_TAG_BYE, 5.0) == 1,
             "the stranger's goodbye did not leave");
  m.kind = 1; /* a probe */
  TEST_CHECK(ofi_raw_send(&r, &m, sizeof m, TEST_OFI_TAG_PROBE, 5.0) == 1,
             "the stranger's probe did not leave");
  /* Larger than any liveness message: once, a truncation that failed the connection. */
  TEST_CHECK(ofi_raw_send(&r, NULL, r.buf_size, TEST_OFI_TAG_PROBE, 2.0) >= 0,
             "the stranger's oversized probe could not be posted");
  mp_sleep(0.2);
  boot_set_flag(&sh->flags[F_STEP], 2);
  /* Probes all along (they once counted as the peer's sign of life), until the receiver is done. */
  double end = boot_now() + WAIT_SEC;
  while (__atomic_load_n(&sh->flags[F_DONE], __ATOMIC_ACQUIRE) < 1 && boot_now() < end) {
    ofi_raw_send(&r, &legacy_bye, sizeof legacy_bye, TEST_OFI_TAG_PROBE, 0.25);
    mp_sleep(0.05);
  }
  ofi_raw_close(&r);
}
#endif

/*
 * OFI: a stranger who learnt a connection's endpoint address sends it goodbyes and probes (old
 * and new style, with the job's key but not the connection's token, and one too large): the
 * connection must carry on as if nothing came, and still notice its peer's death.
 */
static int stranger_child(const struct mp_child* c) {
#ifndef BRAID_TEST_HAVE_LIBFABRIC
  (void)c;
  TEST_SKIP("built without libfabric's headers: no raw endpoint to play the stranger with");
#else
  struct net_shared* sh = c->arg;
  if (strcmp(backend, "ofi") != 0) TEST_SKIP("the stranger case is OFI's");
  if (c->index == 1) {
    fflush(stderr);
    pid_t pid = fork(); /* before this process touches libfabric */
    if (pid == 0) _exit(stranger_victim(c));
    const struct braid_net_ops* ops;
    int ndev, rc = child_open(&ops, &ndev), status = 0;
    if (pid < 0) return 1;
    if (rc == 0) stranger_sends(sh);
    if (waitpid(pid, &status, 0) != pid) return 1;
    if (WIFEXITED(status) && WEXITSTATUS(status) == TEST_SKIP_CODE) return TEST_SKIP_CODE;
    TEST_CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
               "the victim did not reach its end (status 0x%x)", status);
    return rc ? rc : child_verdict();
  }
  const struct braid_net_ops* ops;
  int ndev, rc = child_open(&ops, &ndev);
  if (rc) return rc;
  void *l = NULL, *comm = NULL, *req = NULL;
  uint64_t word = 0;
  struct stranger_target t;
  if (listen_publish(sh, ops, 0, &l) != 0) return 1;
  TEST_EXPECT_RES(net_util_accept(ops, l, &comm, WAIT_SEC), ncclSuccess);
  if (comm == NULL) return 1;
  memset(&t, 0, sizeof t);
  t.len = (uint16_t)net_ofi_comm_name(comm, t.name, sizeof t.name);
  TEST_CHECK(t.len > 0, "no endpoint name for the connection");
  memcpy(sh->handle[1], &t, sizeof t);
  boot_set_flag(&sh->flags[F_STEP], 1);
  /* The strays come while this receive waits: it must still get the sender's message. */
  TEST_EXPECT_RES(net_util_post(ops, comm, 0, &word, sizeof word, &req, WAIT_SEC), ncclSuccess);
  if (req) TEST_EXPECT_RES(net_util_wait(ops, req, NULL, WAIT_SEC), ncclSuccess);
  TEST_CHECK(word == 77, "the connection carried %llu", (unsigned long long)word);
  /* Then the sender dies: the stranger's goodbye and probes must not hide it. */
  req = NULL;
  TEST_EXPECT_RES(net_util_post(ops, comm, 0, &word, sizeof word, &req, WAIT_SEC), ncclSuccess);
  boot_set_flag(&sh->flags[F_POSTED], 1);
  if (req) expect_error(ops, req, 12.0, "receiver, sender died while a stranger sent goodbyes");
  boot_set_flag(&sh->flags[F_DONE], 1);
  net_util_close(ops, comm, 0);
  ops->close_listen(l);
  return child_verdict();
#endif
}

int main(int argc, char** argv) {
  static const struct {
    const char* name;
    mp_child_fn fn;
  } cases[] = {{"connect", connect_child},     {"sizes", sizes_child},
               {"many", many_child},           {"order", order_child},
               {"secret", secret_child},       {"bandwidth", bandwidth_child},
               {"peerclose", NULL},            {"netns", netns_child},
               {"refused", refused_child},     {"abandon", abandon_child},
               {"handlestate", handlestate_child}, {"stranger", stranger_child},
               {"away", away_child}};
  const char* arg = argc > 1 ? argv[1] : "";
  const char* sep = strchr(arg, '_');
  if (sep == NULL || (size_t)(sep - arg) >= sizeof backend) {
    fprintf(stderr, "usage: %s <socket|ofi|ib|plugin>_<connect|sizes|many|order|secret|bandwidth|peerclose|"
                    "netns|refused|abandon|handlestate|stranger|away>\n",
            argv[0]);
    return 2;
  }
  memcpy(backend, arg, (size_t)(sep - arg));
  for (size_t i = 0; i < BRAID_ARRAY_LEN(cases); i++) {
    if (strcmp(sep + 1, cases[i].name) != 0) continue;
    int rc;
    if (cases[i].fn == NULL) {
      rc = run_case(peerclose_sender_dies, "peerclose/sender dies", 0);
      if (rc != MP_FAILED)
        rc = mp_verdict_merge(rc, run_case(peerclose_receiver_dies, "peerclose/receiver dies", 0));
    } else {
      rc = run_case(cases[i].fn, arg, strcmp(cases[i].name, "netns") == 0);
    }
    return mp_verdict_exit(rc, test_failures);
  }
  fprintf(stderr, "%s: unknown case %s\n", argv[0], arg);
  return 2;
}
