/*
 * The bootstrap against strangers, lost peers and misconfigured joins, with
 * several processes on loopback (or in two network namespaces):
 *
 *   strangers  4 ranks initialize (init, allgather, barrier) while another
 *              process opens 1,000 connections to the root's and the ranks'
 *              listeners, half left idle, half sending garbage (random bytes,
 *              a wrong magic, a well-formed hello with a wrong secret, half a
 *              hello); every rank succeeds, and the log has a few lines, not
 *              one per connection
 *   peergone   after init a rank is killed while the others wait for it: each
 *              fails with ncclRemoteError naming it, whether it had a
 *              connection from it (closed), to it (ended), or none (its
 *              listener refuses)
 *   slowpeer   a peer that is stopped, or that reads nothing while 32 MB wait
 *              for it, for longer than BRAID_SOCKET_KEEPALIVE_SEC, is not
 *              taken for a lost one
 *   keepalive  ranks in two network namespaces whose link is cut after init:
 *              both waits fail within seconds, naming the silent peer
 *   nranks     a JOIN that says another number of ranks than the first is
 *              refused with both numbers, and the others complete without it
 *   commsecret with BRAID_COMM_ID, a process without the job's
 *              BRAID_COMM_SECRET cannot take a rank; the secret is never printed
 *   idle_root  an id used after BRAID_BOOTSTRAP_TIMEOUT still works; an unused
 *              one's root lasts until bootstrap_roots_stop, or the process exit
 *
 *   bootstrap_guard_test strangers | peergone | slowpeer | keepalive | nranks | commsecret | idle_root
 */
#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "boot_util.h"
#include "bootstrap/bootstrap.h"
#include "bootstrap/bootstrap_internal.h"
#include "base/debug.h"
#include "base/error.h"
#include "base/param.h"
#include "base/socket.h"
#include "base/utils.h"
#include "mp_runner.h"
#include "test.h"

static void child_reset(const char* timeout) {
  test_failures = 0;
  test_checks = 0;
  boot_loopback(timeout);
}

static int child_result(void) { return test_failures ? 1 : 0; }

/* ----------------------------------------------------------- strangers */

#define STRANGER_RANKS 4
#define STRANGER_CONNS 1000
#define STRANGER_MAX_LISTENERS 8
#define STRANGER_PER_LISTENER (STRANGER_CONNS / (STRANGER_RANKS + 1))

struct stranger_shared {
  struct boot_id_slot slot;
  int pids[STRANGER_RANKS];
  int started;  /* ranks inside bootstrap_init (rank 3 waits for the flood first) */
  int flooding; /* the stranger has filled the listeners it found */
  int worked;   /* ranks through init, allgather, barrier and send/recv */
  int all_open; /* the stranger has made all its connections */
  int finished; /* ranks through a second round, under every connection */
  int opened, idle, garbage, listeners;
  double init_s[STRANGER_RANKS], work_s[STRANGER_RANKS], again_s[STRANGER_RANKS];
  int log_lines[STRANGER_RANKS], reject_lines[STRANGER_RANKS];
  char log_path[STRANGER_RANKS][128];
};

/* The TCP ports process `pid` listens on: its socket inodes, matched in /proc/net/tcp. */
static int listen_ports(int pid, int* ports, int max) {
  static unsigned long inodes[4096];
  char path[64], link[64], line[512];
  int ni = 0, n = 0;
  snprintf(path, sizeof path, "/proc/%d/fd", pid);
  DIR* d = opendir(path);
  if (d == NULL) return 0;
  for (struct dirent* e = readdir(d); e != NULL && ni < 4096; e = readdir(d)) {
    char fdpath[400];
    unsigned long ino;
    snprintf(fdpath, sizeof fdpath, "%s/%s", path, e->d_name);
    ssize_t len = readlink(fdpath, link, sizeof link - 1);
    if (len <= 0) continue;
    link[len] = '\0';
    if (sscanf(link, "socket:[%lu]", &ino) == 1) inodes[ni++] = ino;
  }
  closedir(d);
  FILE* f = fopen("/proc/net/tcp", "r");
  if (f == NULL) return 0;
  while (fgets(line, sizeof line, f) && n < max) {
    unsigned port, st;
    unsigned long ino;
    if (sscanf(line, " %*d: %*x:%x %*x:%*x %x %*x:%*x %*x:%*x %*x %*u %*u %lu", &port, &st, &ino) != 3 ||
        st != 0x0A)
      continue;
    for (int i = 0; i < ni; i++)
      if (inodes[i] == ino) ports[n++] = (int)port;
  }
  fclose(f);
  return n;
}

/* A stranger's connection number k to 127.0.0.1:port: idle (even k) or one of four garbages. */
static int stranger_open(int port, int k, const struct bootstrap_id_layout* id, int to_root,
                         struct stranger_shared* sh) {
  union braid_sockaddr to;
  memset(&to, 0, sizeof to);
  to.sin.sin_family = AF_INET;
  to.sin.sin_port = htons((uint16_t)port);
  to.sin.sin_addr.s_addr = htonl(0x7f000001);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (connect(fd, &to.sa, sizeof to.sin) != 0) {
    close(fd);
    return -1;
  }
  sh->opened++;
  if (k % 2 == 0) {
    sh->idle++;
    return fd;
  }
  sh->garbage++;
  unsigned char junk[300];
  struct bootstrap_hello h;
  size_t len = 0;
  braid_random_bytes(junk, sizeof junk);
  switch ((k / 2) % 4) {
    case 0: /* random bytes */
      len = 1 + junk[0] % (sizeof junk - 1);
      break;
    case 1: /* a hello's size, wrong magic */
      memset(junk, 0x41, sizeof h);
      len = sizeof h;
      break;
    case 2: /* well formed, wrong secret */
    case 3: /* half of a well-formed hello, then silence */
      boot_hello_wrong_secret(&h, id, to_root ? BOOTSTRAP_HELLO_JOIN : BOOTSTRAP_HELLO_PEER,
                              STRANGER_RANKS, k, 0x81, "stranger");
      memcpy(junk, &h, sizeof h);
      len = (k / 2) % 4 == 2 ? sizeof h : sizeof h / 2;
      break;
  }
  if (send(fd, junk, len, MSG_NOSIGNAL) < 0) { /* the victim may have closed it already */
  }
  return fd;
}

static int stranger_child(struct stranger_shared* sh) {
  static int fds[STRANGER_CONNS];
  int nfds = 0, ports[STRANGER_MAX_LISTENERS], nports = 0, opened_to[STRANGER_MAX_LISTENERS] = {0};
  struct rlimit rl;
  struct bootstrap_id_layout id;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  TEST_CHECK(boot_wait_flag(&sh->slot.state, 1, 20.0) == 0, "no id");
  TEST_CHECK(boot_wait_flag(&sh->started, STRANGER_RANKS - 1, 20.0) == 0, "ranks 0-2 did not start");
  memcpy(&id, &sh->slot.id, sizeof id);
  const int root_port = ntohs(id.root.port);
  const double end = boot_now() + 25.0;
  while (boot_now() < end && nfds < STRANGER_CONNS) {
    /* Listeners of the ranks (and the root, in rank 0's process) as they appear. */
    for (int r = 0; r < STRANGER_RANKS; r++) {
      int found[STRANGER_MAX_LISTENERS];
      int pid = __atomic_load_n(&sh->pids[r], __ATOMIC_ACQUIRE);
      int nf = pid > 0 ? listen_ports(pid, found, STRANGER_MAX_LISTENERS) : 0;
      for (int i = 0; i < nf; i++) {
        int known = 0;
        for (int j = 0; j < nports; j++) known |= ports[j] == found[i];
        if (!known && nports < STRANGER_MAX_LISTENERS) ports[nports++] = found[i];
      }
    }
    /* Fill each to its share, a burst at a time so the newest listeners are reached early. */
    int busy = 0;
    for (int j = 0; j < nports; j++) {
      for (int b = 0; b < 25 && opened_to[j] < STRANGER_PER_LISTENER && nfds < STRANGER_CONNS; b++) {
        int fd = stranger_open(ports[j], opened_to[j], &id, ports[j] == root_port, sh);
        opened_to[j]++;
        if (fd >= 0) fds[nfds++] = fd;
        busy = 1;
      }
    }
    /* Rank 3 joins once the root and three ranks' listeners hold a flood. */
    if (!sh->flooding && nports >= STRANGER_RANKS && !busy) boot_set_flag(&sh->flooding, 1);
    if (nports == STRANGER_RANKS + 1 && !busy) break; /* every listener had its share */
    if (!busy) mp_sleep(0.005);
  }
  if (!sh->flooding) boot_set_flag(&sh->flooding, 1);
  sh->listeners = nports;
  boot_set_flag(&sh->all_open, 1);
  /* Hold every connection until the ranks are through. */
  TEST_CHECK(boot_wait_flag(&sh->finished, STRANGER_RANKS, 40.0) == 0, "the ranks never finished");
  for (int i = 0; i < nfds; i++) close(fds[i]);
  return child_result();
}

static int stranger_rank(const struct mp_child* c, struct stranger_shared* sh) {
  struct bootstrap* b = NULL;
  const int me = c->index;
  boot_log_to(sh->log_path[me], NULL);
  __atomic_store_n(&sh->pids[me], (int)getpid(), __ATOMIC_RELEASE);
  if (boot_id_share(&sh->slot, me, 20.0) != 0) return 1;
  if (me == STRANGER_RANKS - 1)
    TEST_CHECK(boot_wait_flag(&sh->flooding, 1, 20.0) == 0, "the stranger never flooded");
  else
    boot_add_flag(&sh->started, 1);
  double t0 = boot_now();
  TEST_EXPECT_RES(bootstrap_init(&sh->slot.id, 1, me, STRANGER_RANKS, NULL, &b), ncclSuccess);
  sh->init_s[me] = boot_now() - t0;
  if (b != NULL) {
    double t1 = boot_now();
    TEST_CHECK(boot_allgather_check(b, 4000, 7) == 0, "allgather under the flood");
    TEST_EXPECT_RES(bootstrap_barrier(b), ncclSuccess);
    TEST_CHECK(boot_ring_tags_check(b, 2) == 0, "send/recv under the flood");
    sh->work_s[me] = boot_now() - t1;
  }
  boot_add_flag(&sh->worked, 1);
  /* Once every stranger connection is made (rank 3's listener is found last): a second round. */
  TEST_CHECK(boot_wait_flag(&sh->all_open, 1, 30.0) == 0, "the stranger never finished connecting");
  if (b != NULL) {
    double t2 = boot_now();
    TEST_EXPECT_RES(bootstrap_barrier(b), ncclSuccess);
    TEST_CHECK(boot_allgather_check(b, 100, 8) == 0, "allgather after all connections");
    TEST_EXPECT_RES(bootstrap_barrier(b), ncclSuccess);
    sh->again_s[me] = boot_now() - t2;
  }
  boot_add_flag(&sh->finished, 1);
  /* Rank 0 hosts the root: it stays until every rank is through. */
  boot_wait_flag(&sh->finished, STRANGER_RANKS, 30.0);
  if (b) TEST_EXPECT_RES(bootstrap_close(b), ncclSuccess);
  const char* text = boot_slurp(sh->log_path[me]);
  sh->log_lines[me] = boot_count_lines(text, " WARN ");
  sh->reject_lines[me] = boot_count_lines(text, "rejected connection from");
  return child_result();
}

static int strangers_child(const struct mp_child* c) {
  struct stranger_shared* sh = c->arg;
  child_reset("30");
  return c->index == STRANGER_RANKS ? stranger_child(sh) : stranger_rank(c, sh);
}

static int case_strangers(void) {
  struct stranger_shared* sh = mp_shared_alloc(sizeof *sh);
  for (int r = 0; r < STRANGER_RANKS; r++)
    snprintf(sh->log_path[r], sizeof sh->log_path[r], "/tmp/braid_strangers.%d.%d.log",
             (int)getpid(), r);
  struct mp_opts opts = {.name = "strangers", .nprocs = STRANGER_RANKS + 1, .timeout_sec = 60, .arg = sh};
  int rc = mp_run(&opts, strangers_child);
  fprintf(stderr, "stranger: %d connections (%d idle, %d garbage) to %d listeners\n", sh->opened,
          sh->idle, sh->garbage, sh->listeners);
  for (int r = 0; r < STRANGER_RANKS; r++) {
    fprintf(stderr, "rank %d: bootstrap_init %.3f s, then allgather+barrier+send/recv %.3f s, "
            "second round %.3f s; %d WARN lines (%d about rejected connections)\n", r,
            sh->init_s[r], sh->work_s[r], sh->again_s[r], sh->log_lines[r], sh->reject_lines[r]);
    /* Rank 0 has two listeners (its own and the root's): one WARN per burst each. */
    TEST_CHECK(sh->log_lines[r] <= 6, "rank %d logged %d WARN lines", r, sh->log_lines[r]);
    unlink(sh->log_path[r]);
  }
  TEST_CHECK(sh->opened >= STRANGER_CONNS * 9 / 10, "only %d stranger connections were made",
             sh->opened);
  TEST_CHECK(sh->listeners >= STRANGER_RANKS, "the stranger found %d listeners", sh->listeners);
  mp_shared_free(sh, sizeof *sh);
  return rc;
}

/* ------------------------------------------------------------ peergone */

#define GONE_RANKS 4
#define GONE_VICTIM 2

struct gone_shared {
  struct boot_id_slot slot;
  int pids[GONE_RANKS];
  int ready;
  double took[GONE_RANKS];
};

/*
 * After init only the ring's connections exist (r -> r+1). Rank 2 dies; rank 3 has its
 * connection (closed), rank 1 has one to it (ended), rank 0 has none either way (it connects
 * to watch, and is refused).
 */
static int gone_child(const struct mp_child* c) {
  struct gone_shared* sh = c->arg;
  struct bootstrap* b = NULL;
  child_reset("20");
  boot_env("BRAID_SOCKET_KEEPALIVE_SEC", "3");
  sh->pids[c->index] = getpid();
  if (boot_id_share(&sh->slot, c->index, 20.0) != 0) return 1;
  TEST_EXPECT_RES(bootstrap_init(&sh->slot.id, 1, c->index, GONE_RANKS, NULL, &b), ncclSuccess);
  if (b == NULL) return 1;
  bootstrap_init_done(b);
  boot_add_flag(&sh->ready, 1);
  boot_wait_flag(&sh->ready, GONE_RANKS, 20.0);
  if (c->index == GONE_VICTIM) {
    mp_sleep(0.2);
    raise(SIGKILL);
  }
  int v = 0;
  double t0 = boot_now();
  braid_err_clear();
  TEST_EXPECT_RES(bootstrap_recv(b, GONE_VICTIM, 5, &v, sizeof v), ncclRemoteError);
  sh->took[c->index] = boot_now() - t0;
  char who[64];
  snprintf(who, sizeof who, "rank %d (pid %d on ", GONE_VICTIM, sh->pids[GONE_VICTIM]);
  TEST_CHECK(strstr(braid_err_last(), who) != NULL, "rank %d: \"%s\" does not name \"%s\"", c->index,
             braid_err_last(), who);
  TEST_CHECK(sh->took[c->index] < 8.0, "rank %d noticed after %.1f s", c->index, sh->took[c->index]);
  fprintf(stderr, "rank %d after %.2f s: %s\n", c->index, sh->took[c->index], braid_err_last());
  /* Sending to it fails too, saying why. */
  TEST_EXPECT_RES(bootstrap_send(b, GONE_VICTIM, 6, &v, sizeof v), ncclRemoteError);
  TEST_EXPECT_RES(bootstrap_close(b), ncclSuccess);
  return child_result();
}

static int case_peergone(void) {
  struct gone_shared* sh = mp_shared_alloc(sizeof *sh);
  struct mp_opts opts = {.name = "peergone", .nprocs = GONE_RANKS, .timeout_sec = 30, .arg = sh,
                         .sigkill_ok = 1u << GONE_VICTIM};
  int rc = mp_run(&opts, gone_child);
  mp_shared_free(sh, sizeof *sh);
  return rc;
}

/* ------------------------------------------------------------ slowpeer */

#define SLOW_BYTES (32u << 20)
#define SLOW_PAUSE_S 6.0

struct slow_shared {
  struct boot_id_slot slot;
  int pids[2];
  int stopped; /* rank 1 is about to stop itself */
};

static void* slow_resume_main(void* arg) {
  struct slow_shared* sh = arg;
  boot_wait_flag(&sh->stopped, 1, 20.0);
  mp_sleep(SLOW_PAUSE_S);
  kill(sh->pids[1], SIGCONT);
  return NULL;
}

/*
 * With BRAID_SOCKET_KEEPALIVE_SEC=2: rank 1 stops (SIGSTOP) for 6 s while rank 0 waits for
 * its message, then reads nothing for 6 s while rank 0 sends it 32 MB. Both must go through.
 */
static int slow_child(const struct mp_child* c) {
  struct slow_shared* sh = c->arg;
  struct bootstrap* b = NULL;
  child_reset("20");
  boot_env("BRAID_SOCKET_KEEPALIVE_SEC", "2");
  sh->pids[c->index] = getpid();
  if (boot_id_share(&sh->slot, c->index, 20.0) != 0) return 1;
  TEST_EXPECT_RES(bootstrap_init(&sh->slot.id, 1, c->index, 2, NULL, &b), ncclSuccess);
  if (b == NULL) return 1;
  unsigned char* big = malloc(SLOW_BYTES);
  for (size_t i = 0; i < SLOW_BYTES; i++) big[i] = (unsigned char)(i * 7 + 3);
  int v = 0;
  if (c->index == 0) {
    pthread_t th;
    pthread_create(&th, NULL, slow_resume_main, sh);
    double t0 = boot_now();
    TEST_EXPECT_RES(bootstrap_recv(b, 1, 1, &v, sizeof v), ncclSuccess);
    TEST_CHECK(v == 41 && boot_now() - t0 >= SLOW_PAUSE_S - 1, "got %d after %.1f s", v,
               boot_now() - t0);
    pthread_join(th, NULL);
    t0 = boot_now();
    TEST_EXPECT_RES(bootstrap_send(b, 1, 2, big, SLOW_BYTES), ncclSuccess);
    fprintf(stderr, "rank 0: 32 MB to a peer that read nothing for %.0f s: sent in %.1f s\n",
            SLOW_PAUSE_S, boot_now() - t0);
  } else {
    boot_set_flag(&sh->stopped, 1);
    raise(SIGSTOP);
    v = 41;
    TEST_EXPECT_RES(bootstrap_send(b, 0, 1, &v, sizeof v), ncclSuccess);
    mp_sleep(SLOW_PAUSE_S); /* outside any bootstrap call: nothing is read */
    memset(big, 0, SLOW_BYTES);
    TEST_EXPECT_RES(bootstrap_recv(b, 0, 2, big, SLOW_BYTES), ncclSuccess);
    size_t bad = 0;
    for (size_t i = 0; i < SLOW_BYTES; i++) bad += big[i] != (unsigned char)(i * 7 + 3);
    TEST_CHECK(bad == 0, "%zu bytes wrong", bad);
  }
  free(big);
  TEST_EXPECT_RES(bootstrap_barrier(b), ncclSuccess);
  TEST_EXPECT_RES(bootstrap_close(b), ncclSuccess);
  return child_result();
}

static int case_slowpeer(void) {
  return boot_run("slowpeer", 2, 45, sizeof(struct slow_shared), slow_child);
}

/* ----------------------------------------------------------- keepalive */

struct alive_shared {
  struct boot_id_slot slot;
  struct boot_netns net; /* two "hosts": braidKA<id> and braidKB<id>, devices bk* */
  int ready;
  double took[2];
};

/* Ranks 0 and 1 on two "hosts"; child 2 cuts the link once both wait for each other. */
static int alive_child(const struct mp_child* c) {
  struct alive_shared* sh = c->arg;
  char cmd[256];
  if (c->index == 2) {
    child_reset("20");
    TEST_CHECK(boot_wait_flag(&sh->ready, 2, 20.0) == 0, "the ranks never got ready");
    mp_sleep(0.5); /* both are inside bootstrap_recv */
    snprintf(cmd, sizeof cmd, "ip -n %s link set %s down", sh->net.ns[1], sh->net.dev[1]);
    TEST_CHECK(system(cmd) == 0, "%s failed", cmd);
    return child_result();
  }
  test_failures = 0;
  TEST_CHECK(boot_netns_enter(&sh->net, c->index) == 0, "cannot enter %s", sh->net.ns[c->index]);
  child_reset("20");
  boot_env("BRAID_SOCKET_IFNAME", "bk");
  boot_env("BRAID_SOCKET_KEEPALIVE_SEC", "2");
  if (test_failures || boot_id_share(&sh->slot, c->index, 20.0) != 0) return 1;
  struct bootstrap* b = NULL;
  TEST_EXPECT_RES(bootstrap_init(&sh->slot.id, 1, c->index, 2, NULL, &b), ncclSuccess);
  if (b == NULL) return 1;
  bootstrap_init_done(b);
  TEST_EXPECT_RES(bootstrap_barrier(b), ncclSuccess);
  boot_add_flag(&sh->ready, 1);
  const int peer = 1 - c->index;
  int v = 0;
  double t0 = boot_now();
  braid_err_clear();
  TEST_EXPECT_RES(bootstrap_recv(b, peer, 3, &v, sizeof v), ncclRemoteError);
  sh->took[c->index] = boot_now() - t0;
  char who[32];
  snprintf(who, sizeof who, "rank %d (pid ", peer);
  TEST_CHECK(strstr(braid_err_last(), who) && strstr(braid_err_last(), braid_log_hostname()),
             "rank %d: \"%s\" names neither %s nor the host", c->index, braid_err_last(), who);
  TEST_CHECK(sh->took[c->index] < 12.0, "rank %d noticed after %.1f s", c->index,
             sh->took[c->index]);
  fprintf(stderr, "rank %d after %.2f s: %s\n", c->index, sh->took[c->index], braid_err_last());
  bootstrap_close(b);
  return child_result();
}

static int case_keepalive(void) {
  const char* unavailable = boot_netns_unavailable();
  if (unavailable) TEST_SKIP("%s", unavailable);
  struct alive_shared* sh = mp_shared_alloc(sizeof *sh);
  if (boot_netns_setup(&sh->net, "braidK", "bk", 214) != 0)
    TEST_SKIP("cannot create network namespaces with a veth pair here");
  struct mp_opts opts = {.name = "keepalive", .nprocs = 3, .timeout_sec = 40, .arg = sh};
  int rc = mp_run(&opts, alive_child);
  boot_netns_remove();
  mp_shared_free(sh, sizeof *sh);
  return rc;
}

/* -------------------------------------------------------------- nranks */

struct nranks_shared {
  struct boot_id_slot slot;
  int started;  /* ranks 0 and 1 are joining */
  int answered; /* the wrong JOIN has its answer */
  int pids[4];
};

/*
 * Children 0 and 1 join as ranks 0 and 1 of 3; child 2 then joins as rank 2 of 4 and must be
 * refused at once, with both numbers; child 3 joins as rank 2 of 3 and the job completes.
 */
static int nranks_child(const struct mp_child* c) {
  struct nranks_shared* sh = c->arg;
  struct bootstrap* b = NULL;
  child_reset("15");
  sh->pids[c->index] = getpid();
  if (boot_id_share(&sh->slot, c->index, 20.0) != 0) return 1;
  if (c->index == 2) {
    TEST_CHECK(boot_wait_flag(&sh->started, 2, 20.0) == 0, "ranks 0 and 1 never started");
    mp_sleep(1.0); /* they are in by now */
    double t0 = boot_now();
    braid_err_clear();
    TEST_EXPECT_RES(bootstrap_init(&sh->slot.id, 1, 2, 4, NULL, &b), ncclInvalidArgument);
    const char* msg = braid_err_last();
    TEST_CHECK(b == NULL && boot_now() - t0 < 3.0, "refusal took %.1f s", boot_now() - t0);
    TEST_CHECK(strstr(msg, "passed nranks 4") && strstr(msg, "for 3 ranks"),
               "message \"%s\" does not name both numbers", msg);
    fprintf(stderr, "child 2: %s\n", msg);
    boot_set_flag(&sh->answered, 1);
    return child_result();
  }
  int rank = c->index == 3 ? 2 : c->index;
  if (c->index == 3)
    TEST_CHECK(boot_wait_flag(&sh->answered, 1, 20.0) == 0, "the wrong join was never answered");
  else
    boot_add_flag(&sh->started, 1);
  TEST_EXPECT_RES(bootstrap_init(&sh->slot.id, 1, rank, 3, NULL, &b), ncclSuccess);
  if (b == NULL) return 1;
  TEST_CHECK(boot_allgather_check(b, 64, 5) == 0, "allgather of the three");
  TEST_EXPECT_RES(bootstrap_barrier(b), ncclSuccess);
  TEST_EXPECT_RES(bootstrap_close(b), ncclSuccess);
  return child_result();
}

static int case_nranks(void) {
  return boot_run("nranks", 4, 30, sizeof(struct nranks_shared), nranks_child);
}

/* ---------------------------------------------------------- commsecret */

#define SECRET_TEXT "correct horse battery staple 7f3a"

struct secret_shared {
  char comm_id[64];
  int started, answered;
  char log_path[128];
};

/*
 * BRAID_COMM_ID with BRAID_COMM_SECRET: children 0 and 1 join as ranks 0 and 1 of 3; child 2,
 * which has BRAID_COMM_ID but not the secret, tries rank 2 and must be refused at once (and says
 * at INFO why the secret matters); child 3, the real rank 2, then completes the job.
 */
static int secret_child(const struct mp_child* c) {
  struct secret_shared* sh = c->arg;
  struct bootstrap* b = NULL;
  ncclUniqueId id;
  int found = 0;
  child_reset("15");
  boot_env("BRAID_COMM_ID", sh->comm_id);
  boot_env("BRAID_COMM_SECRET", c->index == 2 ? NULL : SECRET_TEXT);
  if (c->index == 2) boot_log_to(sh->log_path, "INFO");
  TEST_EXPECT_RES(bootstrap_id_from_env(&id, &found), ncclSuccess);
  TEST_CHECK(found, "BRAID_COMM_ID not seen");
  if (c->index == 2) {
    TEST_CHECK(boot_wait_flag(&sh->started, 2, 20.0) == 0, "ranks 0 and 1 never started");
    mp_sleep(1.0);
    double t0 = boot_now();
    braid_err_clear();
    ncclResult_t res = bootstrap_init(&id, 1, 2, 3, NULL, &b);
    TEST_CHECK(res != ncclSuccess && b == NULL, "a process without the secret joined");
    TEST_CHECK(boot_now() - t0 < 3.0, "refusal took %.1f s", boot_now() - t0);
    TEST_CHECK(strstr(braid_err_last(), "wrong secret") != NULL, "message: %s", braid_err_last());
    fprintf(stderr, "child 2: %s\n", braid_err_last());
    bootstrap_close(b);
    boot_set_flag(&sh->answered, 1);
    const char* log = boot_slurp(sh->log_path);
    TEST_CHECK(boot_count_lines(log, "without BRAID_COMM_SECRET") == 1,
               "the INFO line about BRAID_COMM_SECRET appears %d times",
               boot_count_lines(log, "without BRAID_COMM_SECRET"));
    return child_result();
  }
  if (c->index == 0) {
    /* braid-info --env prints the table: never the secret. */
    char* text = NULL;
    size_t len = 0;
    FILE* mem = open_memstream(&text, &len);
    braid_param_print_all(mem);
    fclose(mem);
    TEST_CHECK(strstr(text, "BRAID_COMM_SECRET=") && !strstr(text, SECRET_TEXT),
               "the parameter table shows the secret, or not the parameter");
    free(text);
  }
  int rank = c->index == 3 ? 2 : c->index;
  if (c->index == 3)
    TEST_CHECK(boot_wait_flag(&sh->answered, 1, 20.0) == 0, "child 2 was never answered");
  else
    boot_add_flag(&sh->started, 1);
  TEST_EXPECT_RES(bootstrap_init(&id, 1, rank, 3, NULL, &b), ncclSuccess);
  if (b == NULL) return 1;
  TEST_CHECK(boot_allgather_check(b, 64, 6) == 0, "allgather of the three");
  TEST_EXPECT_RES(bootstrap_close(b), ncclSuccess);
  return child_result();
}

static int case_commsecret(void) {
  struct secret_shared* sh = mp_shared_alloc(sizeof *sh);
  int port = boot_free_port("127.0.0.1");
  if (port < 0) TEST_SKIP("no free port on loopback");
  snprintf(sh->comm_id, sizeof sh->comm_id, "127.0.0.1:%d", port);
  snprintf(sh->log_path, sizeof sh->log_path, "/tmp/braid_commsecret.%d.log", (int)getpid());
  struct mp_opts opts = {.name = "commsecret", .nprocs = 4, .timeout_sec = 30, .arg = sh};
  int rc = mp_run(&opts, secret_child);
  /* The same BRAID_COMM_ID gives another id with the secret than without. */
  ncclUniqueId plain, keyed;
  int found = 0;
  boot_env("BRAID_COMM_ID", sh->comm_id);
  boot_env("BRAID_COMM_SECRET", NULL);
  TEST_EXPECT_RES(bootstrap_id_from_env(&plain, &found), ncclSuccess);
  boot_env("BRAID_COMM_SECRET", SECRET_TEXT);
  TEST_EXPECT_RES(bootstrap_id_from_env(&keyed, &found), ncclSuccess);
  boot_env("BRAID_COMM_ID", NULL);
  boot_env("BRAID_COMM_SECRET", NULL);
  TEST_CHECK(memcmp(&plain, &keyed, sizeof plain) != 0, "BRAID_COMM_SECRET does not change the id");
  unlink(sh->log_path);
  mp_shared_free(sh, sizeof *sh);
  return rc;
}

/* ----------------------------------------------------------- idle_root */

struct idle_shared {
  struct boot_id_slot slot;
};

/* BRAID_BOOTSTRAP_TIMEOUT=2: the id is used 4 s after it was made. */
static int idle_child(const struct mp_child* c) {
  struct idle_shared* sh = c->arg;
  struct bootstrap* b = NULL;
  child_reset("2");
  int fds = boot_fd_count(), threads = boot_thread_count();
  if (boot_id_share(&sh->slot, c->index, 20.0) != 0) return 1;
  mp_sleep(4.0);
  TEST_EXPECT_RES(bootstrap_init(&sh->slot.id, 1, c->index, 2, NULL, &b), ncclSuccess);
  if (b == NULL) return 1;
  TEST_CHECK(boot_allgather_check(b, 16, 1) == 0, "allgather");
  TEST_EXPECT_RES(bootstrap_close(b), ncclSuccess);
  /* The root served its rendezvous and is gone. */
  TEST_CHECK(boot_settle(fds, threads, 3.0) == 0, "fds or threads left behind");
  return child_result();
}

/* A child that makes an id and exits: it must exit at once, and its root's port close. */
static void idle_exit_check(void) {
  int pipefd[2];
  TEST_CHECK(pipe(pipefd) == 0, "pipe");
  pid_t pid = fork();
  if (pid == 0) {
    ncclUniqueId id;
    close(pipefd[0]);
    if (bootstrap_get_unique_id(&id) != ncclSuccess) _exit(2);
    if (write(pipefd[1], &id, sizeof id) != (ssize_t)sizeof id) _exit(3);
    exit(0); /* through the destructors, as a process that is done */
  }
  close(pipefd[1]);
  ncclUniqueId id;
  struct bootstrap_id_layout layout;
  union braid_sockaddr root;
  TEST_CHECK(read(pipefd[0], &id, sizeof id) == (ssize_t)sizeof id, "no id from the child");
  close(pipefd[0]);
  double t0 = boot_now();
  int status = -1;
  waitpid(pid, &status, 0);
  TEST_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0 && boot_now() - t0 < 3.0,
             "the child ended with status 0x%x after %.1f s", status, boot_now() - t0);
  memcpy(&layout, &id, sizeof layout);
  TEST_CHECK(bootstrap_wire_addr_unpack(&layout.root, &root) == 0, "no root in the id");
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  TEST_CHECK(fd >= 0 && connect(fd, &root.sa, sizeof root.sin) != 0 && errno == ECONNREFUSED,
             "the root of an exited process still takes connections");
  if (fd >= 0) close(fd);
}

static int case_idle_root(void) {
  int rc = boot_run("idle_root", 2, 30, sizeof(struct idle_shared), idle_child);
  /* An id nobody uses: its root stays past the timeout, until stopped. */
  boot_loopback("1");
  int fds = boot_fd_count(), threads = boot_thread_count();
  ncclUniqueId id;
  TEST_EXPECT_RES(bootstrap_get_unique_id(&id), ncclSuccess);
  mp_sleep(2.5);
  TEST_CHECK(boot_settle(fds + 1, threads + 1, 1.0) == 0, "an unused root gave up");
  double t0 = boot_now();
  bootstrap_roots_stop();
  TEST_CHECK(boot_settle(fds, threads, 1.0) == 0 && boot_now() - t0 < 1.0,
             "bootstrap_roots_stop left the root running (%.2f s)", boot_now() - t0);
  idle_exit_check();
  return rc;
}

int main(int argc, char** argv) {
  static const struct {
    const char* name;
    int (*run)(void);
  } cases[] = {{"strangers", case_strangers}, {"peergone", case_peergone},
               {"slowpeer", case_slowpeer},   {"keepalive", case_keepalive},
               {"nranks", case_nranks},       {"commsecret", case_commsecret},
               {"idle_root", case_idle_root}};
  for (size_t i = 0; argc > 1 && i < sizeof cases / sizeof cases[0]; i++) {
    if (strcmp(argv[1], cases[i].name) != 0) continue;
    int rc = cases[i].run();
    test_summary();
    return mp_verdict_exit(rc, test_failures);
  }
  fprintf(stderr, "usage: %s strangers|peergone|slowpeer|keepalive|nranks|commsecret|idle_root\n",
          argv[0]);
  return 2;
}
