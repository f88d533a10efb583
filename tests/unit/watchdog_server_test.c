/*
 * The watchdog's server on a thread of its own, as a communicator runs it
 * (watchdog_server.h), without a GPU: a loopback listener, a thread that
 * issues operations under the ledger's lock while the server reads it for
 * its answers, several ranks querying at once, a stranger with the wrong
 * secret, a connection that never sends anything, and a stop that ends the
 * thread. Built for ThreadSanitizer too (tools/sanitize-tests.sh), where it
 * is the only host test in which the server's thread runs.
 */
#include <pthread.h>
#include <string.h>
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

/* One query as wd_query sends it; the summary, or magic 0 when none came back. */
static struct braid_ledger_summary query(const uint8_t* key) {
  struct braid_ledger_summary s;
  struct wd_request req = {.magic = BRAID_LEDGER_MAGIC};
  int fd = -1, err = 0;
  memset(&s, 0, sizeof s);
  memcpy(req.secret, key, sizeof req.secret);
  if (socket_connect_quiet(&addr, WD_QUERY_TIMEOUT_S, NULL, &fd, &err) != ncclSuccess || fd < 0 ||
      socket_send_all(fd, &req, sizeof req, WD_QUERY_TIMEOUT_S, NULL) != ncclSuccess ||
      socket_recv_all(fd, &s, sizeof s, WD_QUERY_TIMEOUT_S, NULL) != ncclSuccess)
    memset(&s, 0, sizeof s);
  socket_close(&fd);
  return s;
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

int main(void) {
  static int rank = 3;
  memset(secret, 0x42, sizeof secret);
  memset(&addr, 0, sizeof addr);
  addr.sin.sin_family = AF_INET;
  addr.sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  TEST_EXPECT_RES(socket_listen(&addr, &listen_fd), ncclSuccess);
  struct wd_server* sv = wd_server_new(listen_fd, secret, summary, &rank, &stop_flag);
  TEST_CHECK(sv != NULL, "server allocated");
  if (sv == NULL) return test_summary();
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
  return test_summary();
}
