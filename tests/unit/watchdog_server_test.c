/*
 * The watchdog's wire (watchdog_server.h) without a GPU, both ends of it.
 *
 * The server on a thread of its own, as a communicator runs it: a loopback
 * listener, a thread that issues operations under the ledger's lock while the
 * server reads it for its answers, several ranks querying at once, a stranger
 * with the wrong secret, a connection that never sends anything, and a stop
 * that ends the thread. Notices: a ping gets no reply and no notice, a bye and
 * a failing query reach the notice callback with the sender's rank, a bye
 * without the secret does not; a ping to the closed port says refused.
 *
 * The queries of a verdict (wd_query_all): 16 ranks asked at once, 4 real
 * servers and 12 ranks that give no summary, each in its own way (a listener
 * that never answers, a closed port, a full backlog that drops the connect,
 * garbage, a reply without the job's secret, another job's server, a reset):
 * the 4 summaries come back, each other rank has its reason, the whole takes
 * one query timeout, and no file descriptor is left open.
 *
 * Built for ThreadSanitizer too (tools/sanitize-tests.sh), where it is the
 * only host test in which the server's thread runs.
 */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/socket.h"
#include "base/utils.h"
#include "runtime/watchdog_server.h"
#include "test.h"

#define CLIENTS 4
#define QUERIES 25

static uint8_t secret[WD_SECRET_BYTES];
static union braid_sockaddr addr;
static int listen_fd = -1;
static uint32_t stop_flag;   /* atomic: ends the server and the issuing thread */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t issued;      /* under `lock`, as the ledger's count is */

static void summary(void* arg, struct braid_ledger_summary* out) {
  memset(out, 0, sizeof *out);
  out->magic = BRAID_LEDGER_MAGIC;
  out->rank = *(const int*)arg;
  pthread_mutex_lock(&lock);
  out->issued = issued;
  pthread_mutex_unlock(&lock);
  snprintf(out->host, sizeof out->host, "loopback");
}

/* The server's loop as the watchdog runs it. */
static void* server_main(void* arg) {
  struct wd_server* sv = arg;
  while (!__atomic_load_n(&stop_flag, __ATOMIC_ACQUIRE)) {
    struct pollfd pfd[1 + WD_SERVER_CONNS];
    int n = wd_server_pollfds(sv, pfd);
    if (poll(pfd, (nfds_t)n, 50) < 0) continue;
    wd_server_serve(sv, pfd, braid_time_sec());
  }
  return NULL;
}

/* The enqueuing thread: operations issued under the ledger's lock all the while. */
static void* issue_main(void* arg) {
  (void)arg;
  while (!__atomic_load_n(&stop_flag, __ATOMIC_ACQUIRE)) {
    pthread_mutex_lock(&lock);
    issued++;
    pthread_mutex_unlock(&lock);
    usleep(100);
  }
  return NULL;
}

/* What the notice callback saw last (atomics: the server's thread writes them). */
static uint32_t notice_flags, notices;
static int notice_rank = -1, notice_gone = -1;

static void on_notice(void* arg, uint32_t flags, int rank, int gone) {
  (void)arg;
  __atomic_store_n(&notice_rank, rank, __ATOMIC_RELAXED);
  __atomic_store_n(&notice_gone, gone, __ATOMIC_RELAXED);
  __atomic_store_n(&notice_flags, flags, __ATOMIC_RELAXED);
  __atomic_add_fetch(&notices, 1, __ATOMIC_RELEASE);
}

/* Waits up to 1 s for the notice count to reach `n`; whether it did. */
static int notices_reach(uint32_t n) {
  for (double t0 = braid_time_sec(); braid_time_sec() - t0 < 1.0; usleep(1000))
    if (__atomic_load_n(&notices, __ATOMIC_ACQUIRE) >= n) return 1;
  return 0;
}

/* One query as a rank sends it; the summary, or magic 0 when no reply with the secret came. */
static struct braid_ledger_summary query_flags(const uint8_t* key, uint32_t flags, int from,
                                               int gone) {
  struct wd_reply rep;
  struct wd_request req = {.magic = BRAID_LEDGER_MAGIC, .flags = flags, .rank = from, .gone = gone};
  int fd = -1, err = 0;
  memset(&rep, 0, sizeof rep);
  memcpy(req.secret, key, sizeof req.secret);
  if (socket_connect_quiet(&addr, WD_QUERY_TIMEOUT_S, NULL, &fd, &err) != ncclSuccess || fd < 0 ||
      socket_send_all(fd, &req, sizeof req, WD_QUERY_TIMEOUT_S, NULL) != ncclSuccess ||
      socket_recv_all(fd, &rep, sizeof rep, WD_QUERY_TIMEOUT_S, NULL) != ncclSuccess ||
      rep.magic != WD_REPLY_MAGIC || memcmp(rep.secret, key, sizeof rep.secret) != 0)
    memset(&rep, 0, sizeof rep);
  socket_close(&fd);
  return rep.summary;
}

static struct braid_ledger_summary query(const uint8_t* key) {
  return query_flags(key, 0, 0, -1);
}

static int client_failures[CLIENTS];

static void* client_main(void* arg) {
  int c = (int)(intptr_t)arg;
  uint64_t seen = 0;
  for (int q = 0; q < QUERIES; q++) {
    double t = braid_time_sec();
    struct braid_ledger_summary s = query(secret);
    /* An idle connection holds a slot meanwhile: nobody waits for its deadline. */
    if (s.magic != BRAID_LEDGER_MAGIC || s.rank != 3 || s.issued < seen ||
        braid_time_sec() - t > 1.0)
      client_failures[c]++;
    seen = s.issued;
  }
  return NULL;
}

static void test_server(void) {
  static int rank = 3;
  memset(&addr, 0, sizeof addr);
  addr.sin.sin_family = AF_INET;
  addr.sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  TEST_EXPECT_RES(socket_listen(&addr, &listen_fd), ncclSuccess);
  struct wd_server* sv = wd_server_new(listen_fd, secret, summary, &rank, &stop_flag);
  TEST_CHECK(sv != NULL, "server allocated");
  if (sv == NULL) return;
  wd_server_on_notice(sv, on_notice);
  pthread_t server, issuer, clients[CLIENTS];
  TEST_CHECK(pthread_create(&server, NULL, server_main, sv) == 0, "server thread");
  TEST_CHECK(pthread_create(&issuer, NULL, issue_main, NULL) == 0, "issuing thread");

  /* A connection that sends nothing, held open while the ranks query. */
  int idle = -1, err = 0;
  TEST_EXPECT_RES(socket_connect_quiet(&addr, 2.0, NULL, &idle, &err), ncclSuccess);
  for (int c = 0; c < CLIENTS; c++)
    TEST_CHECK(pthread_create(&clients[c], NULL, client_main, (void*)(intptr_t)c) == 0,
               "client thread %d", c);
  uint8_t wrong[WD_SECRET_BYTES];
  memset(wrong, 0x43, sizeof wrong);
  struct braid_ledger_summary stranger = query(wrong);
  TEST_CHECK(stranger.magic == 0, "a request with the wrong secret got an answer");
  for (int c = 0; c < CLIENTS; c++) {
    pthread_join(clients[c], NULL);
    TEST_CHECK(client_failures[c] == 0, "client %d: %d of %d queries failed or took over 1 s", c,
               client_failures[c], QUERIES);
  }
  TEST_CHECK(__atomic_load_n(&notices, __ATOMIC_ACQUIRE) == 0, "plain queries made notices");

  /* Notices: a ping makes none; a bye and a failing query do, with the sender's rank. */
  int nerr = 0;
  TEST_CHECK(wd_notice_send(&addr, 7, secret, WD_REQ_PING, 1.0, NULL, &nerr) == 1, "ping sent");
  TEST_CHECK(wd_notice_send(&addr, 5, secret, WD_REQ_BYE, 1.0, NULL, &nerr) == 1, "bye sent");
  TEST_CHECK(notices_reach(1) && __atomic_load_n(&notice_rank, __ATOMIC_RELAXED) == 5 &&
                 __atomic_load_n(&notice_flags, __ATOMIC_RELAXED) == WD_REQ_BYE,
             "the bye's notice: %u notices, rank %d, flags %u", notices, notice_rank,
             notice_flags);
  TEST_CHECK(wd_notice_send(&addr, 6, wrong, WD_REQ_BYE, 1.0, NULL, &nerr) == 1,
             "stranger's bye sent");
  struct braid_ledger_summary failing = query_flags(secret, WD_REQ_FAILING, 9, 4);
  TEST_CHECK(failing.magic == BRAID_LEDGER_MAGIC && failing.rank == 3,
             "a failing rank's query is answered");
  TEST_CHECK(notices_reach(2) && __atomic_load_n(&notice_rank, __ATOMIC_RELAXED) == 9 &&
                 __atomic_load_n(&notice_flags, __ATOMIC_RELAXED) == WD_REQ_FAILING &&
                 __atomic_load_n(&notice_gone, __ATOMIC_RELAXED) == 4,
             "the failing query's notice: %u notices, rank %d, flags %u, gone %d", notices,
             notice_rank, notice_flags, notice_gone);
  TEST_CHECK(__atomic_load_n(&notices, __ATOMIC_ACQUIRE) == 2,
             "%u notices: the ping or the stranger's bye made one", notices);

  /* The idle connection is dropped at its deadline, with nothing sent. */
  char b;
  double t0 = braid_time_sec();
  ncclResult_t r = socket_recv_all(idle, &b, 1, WD_QUERY_TIMEOUT_S + 2.0, NULL);
  TEST_CHECK(r != ncclSuccess && braid_time_sec() - t0 < WD_QUERY_TIMEOUT_S + 1.5,
             "the idle connection was not closed at its deadline (result %d)", (int)r);
  socket_close(&idle);

  double t1 = braid_time_sec();
  __atomic_store_n(&stop_flag, 1, __ATOMIC_RELEASE);
  pthread_join(server, NULL);
  pthread_join(issuer, NULL);
  TEST_CHECK(braid_time_sec() - t1 < 1.0, "the server took %.2f s to stop", braid_time_sec() - t1);
  wd_server_free(sv);
  socket_close(&listen_fd);
  /* Nothing listens there now: a ping says refused, at once. */
  double t2 = braid_time_sec();
  nerr = 0;
  TEST_CHECK(wd_notice_send(&addr, 7, secret, WD_REQ_PING, 1.0, NULL, &nerr) == -1 &&
                 nerr == ECONNREFUSED && braid_time_sec() - t2 < 0.5,
             "a ping to a closed port: errno %d after %.2f s", nerr, braid_time_sec() - t2);
}

/* ---- the queries of a verdict --------------------------------------------------------------- */

#define QA_RANKS 17       /* rank 0 asks the 16 others */
#define QA_GOOD 4         /* ranks 1..4: real servers */
#define QA_SERVERS 5      /* those, and another job's (rank 15) */
#define QA_TIMEOUT_S 1.0
#define QA_FAKES 3        /* threads that answer wrongly: garbage, a forged reply, a reset */

enum qa_fake { QA_GARBAGE, QA_FORGER, QA_RESET };

static uint32_t qa_stop; /* atomic: ends the servers' and the fakes' threads */

/* File descriptors this process has open. */
static int fd_count(void) {
  DIR* d = opendir("/proc/self/fd");
  int n = 0;
  if (d == NULL) return -1;
  for (struct dirent* e; (e = readdir(d)) != NULL;)
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n - 1; /* the directory's own */
}

/* A loopback listener with `backlog` on a port of its own; its address into *a. */
static int qa_listen(union braid_sockaddr* a, int backlog) {
  memset(a, 0, sizeof *a);
  a->sin.sin_family = AF_INET;
  a->sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int fd = -1;
  if (socket_listen(a, &fd) != ncclSuccess) return -1;
  if (listen(fd, backlog) != 0) socket_close(&fd);
  return fd;
}

/* A port bound but not listening: a connect to it is refused, and nobody else takes it. */
static int qa_closed_port(union braid_sockaddr* a) {
  memset(a, 0, sizeof *a);
  a->sin.sin_family = AF_INET;
  a->sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a->sin;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || bind(fd, &a->sa, len) != 0 || getsockname(fd, &a->sa, &len) != 0)
    socket_close(&fd);
  return fd;
}

struct qa_server {
  int rank;
  int listen_fd;
  struct wd_server* sv;
};

static void qa_summary(void* arg, struct braid_ledger_summary* out) {
  const struct qa_server* q = arg;
  memset(out, 0, sizeof *out);
  out->magic = BRAID_LEDGER_MAGIC;
  out->rank = q->rank;
  out->issued = 100 + (uint64_t)q->rank;
  snprintf(out->host, sizeof out->host, "loopback");
}

/* The real servers, on one thread: one poll() over all of them. */
static void* qa_servers_main(void* arg) {
  struct qa_server* qs = arg;
  while (!__atomic_load_n(&qa_stop, __ATOMIC_ACQUIRE)) {
    struct pollfd pfd[QA_SERVERS * (1 + WD_SERVER_CONNS)];
    int at[QA_SERVERS + 1] = {0};
    for (int i = 0; i < QA_SERVERS; i++)
      at[i + 1] = at[i] + wd_server_pollfds(qs[i].sv, pfd + at[i]);
    if (poll(pfd, (nfds_t)at[QA_SERVERS], 20) < 0) continue;
    for (int i = 0; i < QA_SERVERS; i++) wd_server_serve(qs[i].sv, pfd + at[i], braid_time_sec());
  }
  return NULL;
}

struct qa_fake_server {
  enum qa_fake kind;
  int listen_fd;
};

/* Answers what it accepts wrongly, as `kind` says; holds the connections until the end. */
static void* qa_fake_main(void* arg) {
  struct qa_fake_server* f = arg;
  int held[8], nheld = 0;
  while (!__atomic_load_n(&qa_stop, __ATOMIC_ACQUIRE)) {
    struct pollfd p = {.fd = f->listen_fd, .events = POLLIN};
    if (poll(&p, 1, 20) <= 0) continue;
    int fd = -1;
    if (socket_accept_some(f->listen_fd, &fd, NULL) != ncclSuccess || fd < 0) continue;
    if (f->kind == QA_RESET) {
      struct linger lg = {.l_onoff = 1, .l_linger = 0};
      setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
      socket_close(&fd);
      continue;
    }
    if (f->kind == QA_GARBAGE) {
      char junk[sizeof(struct wd_reply)];
      memset(junk, 0x5a, sizeof junk);
      (void)socket_send_all(fd, junk, sizeof junk, 1.0, NULL);
    } else { /* a well-formed reply, for the rank asked, but with another secret */
      struct wd_request req;
      struct wd_reply rep = {.magic = WD_REPLY_MAGIC};
      memset(rep.secret, 0x77, sizeof rep.secret);
      rep.summary.magic = BRAID_LEDGER_MAGIC;
      rep.summary.rank = 13;
      if (socket_recv_all(fd, &req, sizeof req, 1.0, NULL) == ncclSuccess)
        (void)socket_send_all(fd, &rep, sizeof rep, 1.0, NULL);
    }
    if (nheld < 8)
      held[nheld++] = fd;
    else
      socket_close(&fd);
  }
  for (int i = 0; i < nheld; i++) socket_close(&held[i]);
  return NULL;
}

/* What each rank's query must end with. */
static const enum wd_query_why qa_expected[QA_RANKS] = {
    WD_QUERY_SELF,         WD_QUERY_ANSWERED,     WD_QUERY_ANSWERED,      WD_QUERY_ANSWERED,
    WD_QUERY_ANSWERED,     WD_QUERY_NO_ANSWER,    WD_QUERY_NO_ANSWER,     WD_QUERY_REFUSED,
    WD_QUERY_REFUSED,      WD_QUERY_NO_CONNECTION, WD_QUERY_NO_CONNECTION, WD_QUERY_GARBAGE,
    WD_QUERY_GARBAGE,      WD_QUERY_WRONG_SECRET, WD_QUERY_WRONG_SECRET,  WD_QUERY_CLOSED,
    WD_QUERY_CLOSED};

static void qa_check(const struct braid_ledger_summary* out, const struct wd_query_status* st) {
  for (int r = 1; r < QA_RANKS; r++) {
    char why[128];
    wd_query_describe(&st[r], QA_TIMEOUT_S, why, sizeof why);
    printf("rank %2d: %s\n", r, why);
    TEST_CHECK(st[r].why == qa_expected[r], "rank %d: %s (reason %d, expected %d)", r, why,
               (int)st[r].why, (int)qa_expected[r]);
    if (qa_expected[r] == WD_QUERY_ANSWERED)
      TEST_CHECK(out[r].magic == BRAID_LEDGER_MAGIC && out[r].rank == r &&
                     out[r].issued == 100 + (uint64_t)r,
                 "rank %d: its summary did not come back whole", r);
    else
      TEST_CHECK(out[r].magic == 0, "rank %d: a summary was taken from a wrong answer", r);
  }
  TEST_CHECK(st[15].err == 0, "another job's server closes without a reset (errno %d)", st[15].err);
  TEST_CHECK(st[16].err == ECONNRESET || st[16].err == EPIPE, "rank 16 reset: errno %d",
             st[16].err);
}

static void test_query_all(void) {
  const int fds_before = fd_count();
  union braid_sockaddr addrs[QA_RANKS];
  uint8_t other_secret[WD_SECRET_BYTES];
  memset(other_secret, 0x24, sizeof other_secret);
  memset(addrs, 0, sizeof addrs);
  struct qa_server qs[QA_SERVERS];
  for (int i = 0; i < QA_SERVERS; i++) {
    qs[i].rank = i < QA_GOOD ? 1 + i : 15;
    qs[i].listen_fd = qa_listen(&addrs[qs[i].rank], 16);
    TEST_CHECK(qs[i].listen_fd >= 0, "listener for rank %d", qs[i].rank);
    qs[i].sv = wd_server_new(qs[i].listen_fd, i < QA_GOOD ? secret : other_secret, qa_summary,
                             &qs[i], &qa_stop);
    TEST_CHECK(qs[i].sv != NULL, "server of rank %d", qs[i].rank);
    if (qs[i].listen_fd < 0 || qs[i].sv == NULL) return;
  }
  /* Ranks 5, 6: a listener that never reads; 7, 8: a closed port. */
  int silent = qa_listen(&addrs[5], 16);
  addrs[6] = addrs[5];
  int closed = qa_closed_port(&addrs[7]);
  addrs[8] = addrs[7];
  /* Ranks 9, 10: a backlog of one, filled: the kernel drops the SYNs that come after. */
  int full = qa_listen(&addrs[9], 0), filler = -1, err = 0;
  addrs[10] = addrs[9];
  TEST_EXPECT_RES(socket_connect_quiet(&addrs[9], 1.0, NULL, &filler, &err), ncclSuccess);
  /* Ranks 11, 12: garbage; 13, 14: a forged reply; 16: a reset. */
  struct qa_fake_server fakes[QA_FAKES] = {{QA_GARBAGE, -1}, {QA_FORGER, -1}, {QA_RESET, -1}};
  fakes[0].listen_fd = qa_listen(&addrs[11], 16);
  addrs[12] = addrs[11];
  fakes[1].listen_fd = qa_listen(&addrs[13], 16);
  addrs[14] = addrs[13];
  fakes[2].listen_fd = qa_listen(&addrs[16], 16);
  TEST_CHECK(silent >= 0 && closed >= 0 && full >= 0 && filler >= 0 && fakes[0].listen_fd >= 0 &&
                 fakes[1].listen_fd >= 0 && fakes[2].listen_fd >= 0,
             "the unreachable ranks' sockets");
  pthread_t servers, fake_threads[QA_FAKES];
  TEST_CHECK(pthread_create(&servers, NULL, qa_servers_main, qs) == 0, "servers' thread");
  for (int i = 0; i < QA_FAKES; i++)
    TEST_CHECK(pthread_create(&fake_threads[i], NULL, qa_fake_main, &fakes[i]) == 0, "fake %d", i);

  struct braid_ledger_summary out[QA_RANKS];
  struct wd_query_status st[QA_RANKS];
  memset(out, 0xee, sizeof out);
  memset(&out[0], 0, sizeof out[0]);
  out[0].rank = 42; /* the asking rank's own: left as it is */
  double t0 = braid_time_sec();
  TEST_EXPECT_RES(wd_query_all(addrs, QA_RANKS, 0, secret, 0, QA_TIMEOUT_S, NULL, out, st),
                  ncclSuccess);
  double took = braid_time_sec() - t0;
  printf("16 ranks asked, 12 of them unreachable: %.2f s (one query's timeout: %.1f s)\n", took,
         QA_TIMEOUT_S);
  /* Asked one after another, the unreachable ranks take over 6 timeouts here (6.2 s at 1 s);
   * together, one, with room for a loaded machine under a sanitizer. */
  TEST_CHECK(took < 5.0 * QA_TIMEOUT_S, "the queries took %.2f s, over 5 x %.1f s", took,
             QA_TIMEOUT_S);
  TEST_CHECK(out[0].rank == 42 && st[0].why == WD_QUERY_SELF, "the asking rank was touched");
  qa_check(out, st);

  /* A stop that is already set: every query ends at once, none is left open. */
  uint32_t stopped = 1;
  t0 = braid_time_sec();
  TEST_EXPECT_RES(wd_query_all(addrs, QA_RANKS, 0, secret, 0, QA_TIMEOUT_S, &stopped, out, st),
                  ncclSuccess);
  TEST_CHECK(braid_time_sec() - t0 < 0.5 * QA_TIMEOUT_S, "a stopped query took %.2f s",
             braid_time_sec() - t0);
  for (int r = 1; r < QA_RANKS; r++)
    TEST_CHECK(out[r].magic == 0 && st[r].why == WD_QUERY_STOPPED,
               "rank %d after a stop: reason %d", r, (int)st[r].why);

  __atomic_store_n(&qa_stop, 1, __ATOMIC_RELEASE);
  pthread_join(servers, NULL);
  for (int i = 0; i < QA_FAKES; i++) pthread_join(fake_threads[i], NULL);
  for (int i = 0; i < QA_SERVERS; i++) {
    wd_server_free(qs[i].sv);
    socket_close(&qs[i].listen_fd);
  }
  for (int i = 0; i < QA_FAKES; i++) socket_close(&fakes[i].listen_fd);
  socket_close(&silent);
  socket_close(&closed);
  socket_close(&filler);
  socket_close(&full);
  const int fds_after = fd_count();
  TEST_CHECK(fds_before >= 0 && fds_after == fds_before,
             "file descriptors open: %d before the queries, %d after", fds_before, fds_after);
}

int main(void) {
  memset(secret, 0x42, sizeof secret);
  test_query_all();
  test_server();
  return test_summary();
}
