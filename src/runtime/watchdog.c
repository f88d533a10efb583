/*
 * The op ledger and the hang verdict (watchdog.h says what and why).
 *
 * The ledger is filled by the thread that enqueues (watchdog_issue,
 * watchdog_launch_seq) and read by the watchdog's threads, under the
 * ledger's lock. Completion costs the launch nothing on the host: each
 * block of a launch writes the launch's last sequence number to its word of
 * the device comm's `ledger_done` (kernel.h). Two threads per communicator:
 * the server answers other ranks' ledger requests at once (so ranks that are
 * all giving verdicts do not wait on each other); the monitor, every
 * WD_PERIOD_S while launches are pending, copies `ledger_done` out and moves
 * `completed` up to the launches it shows complete, reports on SIGUSR1, and
 * on BRAID_TIMEOUT without progress, or a local peer process gone, fails the
 * communicator with the verdict.
 *
 * Every rank also pings the next rank's watchdog every WD_PING_S, whatever the
 * communicator is doing: a listener that refuses (the process is gone, on any
 * host, or its sockets were shut) fails the communicator unless that rank said
 * bye first (its destroy or abort does). A rank that fails its communicator
 * because a rank is gone (the pid check, a refused ping) tells every other rank
 * in its verdict's requests, and they fail with it: a rank that dies while the
 * others' launches all complete (over NVLink, with no socket in the data path)
 * still fails the communicator everywhere. A hang verdict tells nobody: each
 * waiting rank gives its own, naming where it waits.
 */
#include "runtime/watchdog.h"
#include "runtime/watchdog_server.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "abi/coll.h"
#include "bootstrap/bootstrap.h"
#include "runtime/comm.h"
#include "base/debug.h"
#include "runtime/dev_state.h"
#include "runtime/group.h"
#include "base/param.h"
#include "runtime/redop.h"
#include "base/socket.h"
#include "base/utils.h"
#include "runtime/channels.h"

#define WD_LAUNCHES 64
#define WD_PERIOD_S 0.05
#define WD_PEER_CHECK_S 0.5   /* local peers' pids are looked at this often */
#define WD_PING_S 1.0         /* the next rank's listener is pinged this often */
#define WD_PING_TIMEOUT_S 0.5 /* a ping or a bye that is not through by then is dropped */
/* A refused ping waits this long for a bye already sent (the server reads it every WD_PERIOD_S). */
#define WD_BYE_GRACE_S 0.25
#define WD_CAPTURES 1024       /* captured launches described (the oldest make room) */
#define WD_GRAPH_PERIOD_S 0.25 /* graph replay words read this often, once a graph exists */

/* A captured launch: what it holds, for a verdict on a replay stuck in it. */
struct wd_capture {
  uint32_t id; /* 0: free */
  uint32_t nops;
  struct braid_ledger_op first; /* its first operation */
};

struct wd_launch {
  uint64_t first, last; /* the operations it covers */
  double t;             /* when it was launched */
  int grid;             /* blocks of the launch that reports `last` */
};

struct braid_watchdog {
  struct ncclComm* comm;
  pthread_mutex_t lock;
  uint64_t issued, launched, completed;
  struct braid_ledger_op ops[BRAID_LEDGER_OPS]; /* by seq % BRAID_LEDGER_OPS */
  struct wd_launch launches[WD_LAUNCHES];       /* ring of launches not known complete */
  int head, count;
  double progress_t; /* when `completed` last moved, or a launch went pending on an idle comm */
  int listen_fd;
  union braid_sockaddr* addrs; /* [nranks] the watchdogs' listeners */
  uint8_t secret[WD_SECRET_BYTES];
  cudaStream_t stream; /* reads the ledger's words and the connections' counters */
  cudaEvent_t words_copied; /* recorded behind each copy of the ledger's words */
  int copying;              /* a copy is on its way (thread only) */
  pthread_t thread, server;
  int started, server_started;
  uint32_t stop;               /* atomic; also the abort flag of the thread's socket waits */
  int failed;                  /* the verdict was given (the thread; or watchdog_silence) */
  unsigned long usr1_seen;
  double timeout_s;
  double warn_s;            /* BRAID_HANG_WARN */
  double warned_progress_t; /* the stall last warned about (its progress_t), or -1 */
  double peers_checked;
  double pinged;     /* when the next rank was last pinged */
  int next_left;     /* atomic: the next rank said bye (the server thread sets it) */
  int told_failed;   /* atomic: 1 + the rank whose failing request came first; 0: none */
  int told_gone;     /* the rank that request named gone (written before told_failed) */
  /* Graph replays (under `lock`: captures, capture_next, graphs; the rest the thread's). */
  struct wd_capture captures[WD_CAPTURES];
  uint32_t capture_next;
  int graphs;               /* a launch was captured: the replay words are watched */
  cudaEvent_t graph_copied; /* recorded behind each copy of the replay words */
  int graph_copying;
  int graph_armed; /* graph_progress_t was started (the first poll with graphs) */
  double graph_polled, graph_progress_t;
  uint64_t graph_ended; /* the sum of the blocks' clocks at their last ends, at the last read */
  uint32_t graph_live;  /* a capture id some block was in at the last read (0: none) */
  int graph_block;      /* that block */
};

static volatile sig_atomic_t wd_usr1_count;
static pthread_once_t wd_signal_once = PTHREAD_ONCE_INIT;

static void wd_on_usr1(int sig) {
  (void)sig;
  wd_usr1_count++;
  braid_report_request(); /* the proxies list their connections' steps */
}

/* SIGUSR1 asks every communicator for its verdict, unless the program handles it itself. */
static void wd_signal_install(void) {
  struct sigaction old, sa;
  if (sigaction(SIGUSR1, NULL, &old) != 0 || old.sa_handler != SIG_DFL) return;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = wd_on_usr1;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGUSR1, &sa, NULL);
}

/* ---- the ledger ---------------------------------------------------------------------------- */

void watchdog_issue(struct ncclComm* comm, const struct braid_op* op) {
  struct braid_watchdog* wd = comm->watchdog;
  if (wd == NULL) return;
  pthread_mutex_lock(&wd->lock);
  uint64_t seq = ++wd->issued;
  struct braid_ledger_op* l = &wd->ops[seq % BRAID_LEDGER_OPS];
  l->seq = seq;
  l->coll = op->coll;
  l->dtype = op->dtype;
  l->root = op->coll == BRAID_COLL_SENDRECV ? op->is_send : op->root;
  l->peer = op->coll == BRAID_COLL_SENDRECV ? op->peer : -1;
  l->count = op->count;
  pthread_mutex_unlock(&wd->lock);
}

uint64_t watchdog_issued(struct ncclComm* comm) {
  struct braid_watchdog* wd = comm->watchdog;
  if (wd == NULL) return 0;
  pthread_mutex_lock(&wd->lock);
  const uint64_t issued = wd->issued;
  pthread_mutex_unlock(&wd->lock);
  return issued;
}

uint64_t watchdog_launch_seq(struct ncclComm* comm, int captured, int grid) {
  struct braid_watchdog* wd = comm->watchdog;
  uint64_t seq = 0;
  if (wd == NULL) return 0;
  pthread_mutex_lock(&wd->lock);
  if (captured || wd->issued == wd->launched || wd->timeout_s <= 0) {
    /*
     * A graph's operations complete when it is replayed, which the ledger does
     * not follow. BRAID_TIMEOUT=0: no completion tracking at all (SIGUSR1 then
     * reports the operations issued, none as pending).
     */
    wd->launched = wd->issued;
    pthread_mutex_unlock(&wd->lock);
    return 0;
  }
  struct wd_launch* l;
  if (wd->count == WD_LAUNCHES) {
    l = &wd->launches[(wd->head + wd->count - 1) % WD_LAUNCHES]; /* full: the newest grows */
  } else {
    l = &wd->launches[(wd->head + wd->count) % WD_LAUNCHES];
    if (wd->count == 0) wd->progress_t = braid_time_sec();
    l->first = wd->launched + 1;
    l->t = braid_time_sec();
    wd->count++;
  }
  seq = l->last = wd->launched = wd->issued;
  l->grid = grid; /* a grown entry: its newest launch ends after the others */
  pthread_mutex_unlock(&wd->lock);
  return seq;
}

uint32_t watchdog_capture_register(struct ncclComm* comm) {
  struct braid_watchdog* wd = comm->watchdog;
  if (wd == NULL || wd->timeout_s <= 0) return 0; /* BRAID_TIMEOUT=0: nothing is followed */
  pthread_mutex_lock(&wd->lock);
  uint32_t id = ++wd->capture_next;
  if (id == 0) id = ++wd->capture_next; /* 0 means "not captured" to the kernels */
  struct wd_capture* c = &wd->captures[id % WD_CAPTURES];
  c->id = id;
  c->nops = (uint32_t)(wd->issued - wd->launched);
  c->first = wd->ops[(wd->launched + 1) % BRAID_LEDGER_OPS];
  wd->graphs = 1;
  pthread_mutex_unlock(&wd->lock);
  return id;
}

void watchdog_silence(struct ncclComm* comm) {
  struct braid_watchdog* wd = comm->watchdog;
  if (wd != NULL) __atomic_store_n(&wd->failed, 1, __ATOMIC_RELEASE);
}

void watchdog_forget_pending(struct ncclComm* comm) {
  struct braid_watchdog* wd = comm->watchdog;
  if (wd == NULL) return;
  pthread_mutex_lock(&wd->lock);
  wd->launched = wd->issued;
  wd->count = 0;
  pthread_mutex_unlock(&wd->lock);
}

void watchdog_nothing_launched(struct ncclComm* comm) {
  struct braid_watchdog* wd = comm->watchdog;
  if (wd == NULL) return;
  pthread_mutex_lock(&wd->lock);
  wd->launched = wd->issued; /* empty operations: complete as issued */
  pthread_mutex_unlock(&wd->lock);
}

/*
 * Whether launch `l` is complete: its blocks all reported its number, or a
 * later one (a later launch starts only once this one has ended).
 */
static int wd_launch_done(const struct wd_launch* l, const uint64_t* done) {
  for (int b = 0; b < l->grid; b++)
    if (done[b] < l->last) return 0;
  return 1;
}

/* Completes the launches the copied words show done (monitor thread). */
static void wd_complete_launches(struct braid_watchdog* wd, const uint64_t* done) {
  pthread_mutex_lock(&wd->lock);
  while (wd->count > 0 && wd_launch_done(&wd->launches[wd->head], done)) {
    wd->completed = wd->launches[wd->head].last;
    wd->progress_t = braid_time_sec();
    wd->head = (wd->head + 1) % WD_LAUNCHES;
    wd->count--;
  }
  pthread_mutex_unlock(&wd->lock);
}

/*
 * Moves `completed` up to what the kernels reported (monitor thread). The
 * words are copied out on the watchdog's own stream, beside the kernels,
 * only while launches are pending (an idle comm costs nothing), into pinned
 * memory, and read a round later: the thread never waits on the GPU, so the
 * timeout and the other checks go on whatever the device does. A launch
 * registered after the copy started is judged on it and found pending: the
 * words only grow.
 */
static void wd_poll_launches(struct braid_watchdog* wd) {
  struct ncclComm* comm = wd->comm;
  if (wd->copying) {
    cudaError_t err = cudaEventQuery(wd->words_copied);
    if (err == cudaErrorNotReady) return;
    wd->copying = 0;
    if (err != cudaSuccess) {
      (void)cudaGetLastError(); /* a broken context: the timeout gives the verdict */
      return;
    }
    wd_complete_launches(wd, comm->ledger_words);
  }
  pthread_mutex_lock(&wd->lock);
  int pending = wd->count > 0;
  pthread_mutex_unlock(&wd->lock);
  if (!pending) return;
  if (cudaMemcpyAsync(comm->ledger_words, comm->dev->comm->ledger_done,
                      BRAID_MAX_GRID * sizeof(uint64_t), cudaMemcpyDeviceToHost,
                      wd->stream) != cudaSuccess ||
      cudaEventRecord(wd->words_copied, wd->stream) != cudaSuccess) {
    (void)cudaGetLastError();
    return;
  }
  wd->copying = 1;
}

/*
 * The busiest ring channel (most steps received; channels a small operation
 * does not use stay behind), read from the connections' counters.
 */
static void wd_channel_progress(struct braid_watchdog* wd, struct braid_ledger_summary* s) {
  const struct braid_channels* ch = wd->comm->channels;
  s->chan = -1;
  if (ch == NULL || wd->stream == NULL) return;
  for (int c = 0; c < ch->nchannels; c++) {
    uint64_t recv = 0, sent = 0;
    const uint64_t* tail = ch->ring_recv[c].dev.tail;
    const uint64_t* head = ch->ring_send[c].dev.head;
    if (tail == NULL || head == NULL) continue;
    if (cudaMemcpyAsync(&recv, tail, sizeof recv, cudaMemcpyDefault, wd->stream) != cudaSuccess ||
        cudaMemcpyAsync(&sent, head, sizeof sent, cudaMemcpyDefault, wd->stream) != cudaSuccess ||
        cudaStreamSynchronize(wd->stream) != cudaSuccess) {
      (void)cudaGetLastError();
      s->chan = -1;
      return;
    }
    if (s->chan < 0 || recv > s->chan_recv) {
      s->chan = c;
      s->chan_recv = recv;
      s->chan_sent = sent;
    }
  }
}

static void wd_summary(struct braid_watchdog* wd, struct braid_ledger_summary* s) {
  struct ncclComm* comm = wd->comm;
  memset(s, 0, sizeof *s);
  s->magic = BRAID_LEDGER_MAGIC;
  s->rank = comm->rank;
  s->pid = (int32_t)getpid();
  snprintf(s->host, sizeof s->host, "%s", braid_log_hostname());
  pthread_mutex_lock(&wd->lock);
  s->issued = wd->issued;
  s->completed = wd->completed;
  if (wd->issued > 0) s->last = wd->ops[wd->issued % BRAID_LEDGER_OPS];
  int pending = wd->count > 0;
  if (pending) {
    const struct wd_launch* l = &wd->launches[wd->head];
    uint64_t seq = BRAID_MAX(l->first, wd->completed + 1);
    if (wd->issued - seq < BRAID_LEDGER_OPS) s->stuck = wd->ops[seq % BRAID_LEDGER_OPS];
    s->stuck.seq = seq;
    s->waiting_s = braid_time_sec() - wd->progress_t;
  }
  pthread_mutex_unlock(&wd->lock);
  s->chan = -1;
  if (pending) wd_channel_progress(wd, s);
}

/* ---- the verdict --------------------------------------------------------------------------- */

void watchdog_op_describe(const struct braid_ledger_op* op, char* out, size_t len) {
  const char* type = redop_type_name((ncclDataType_t)op->dtype);
  unsigned long long seq = (unsigned long long)op->seq, count = (unsigned long long)op->count;
  if (op->coll == BRAID_COLL_SENDRECV)
    snprintf(out, len, "%s #%llu (%s count=%llu %s rank %d)", op->root ? "Send" : "Recv", seq,
             type, count, op->root ? "to" : "from", op->peer);
  else if (op->coll == BRAID_COLL_BROADCAST || op->coll == BRAID_COLL_REDUCE)
    snprintf(out, len, "%s #%llu (%s count=%llu root=%d)", braid_coll_name(op->coll), seq, type,
             count, op->root);
  else
    snprintf(out, len, "%s #%llu (%s count=%llu)", braid_coll_name(op->coll), seq, type, count);
}

static int wd_same_op(const struct braid_ledger_op* a, const struct braid_ledger_op* b) {
  return a->coll == b->coll && a->dtype == b->dtype && a->count == b->count &&
         a->root == b->root && (a->coll != BRAID_COLL_SENDRECV || a->peer == b->peer);
}

/* What this rank waits for, after "rank R waits in <op> for ". */
static void wd_blame(const struct braid_ledger_summary* all, int nranks, int me, char* out,
                     size_t len) {
  const struct braid_ledger_summary* m = &all[me];
  uint64_t k = m->stuck.seq;
  char theirs[160];
  /* 1. A rank that never got there: the usual cause. */
  for (int r = 0; r < nranks; r++) {
    const struct braid_ledger_summary* p = &all[r];
    if (r == me || p->magic != BRAID_LEDGER_MAGIC || p->issued >= k) continue;
    if (p->issued == 0) {
      snprintf(out, len, "rank %d, which has issued no operation on this communicator (pid %d on %s)",
               r, p->pid, p->host);
    } else {
      watchdog_op_describe(&p->last, theirs, sizeof theirs);
      snprintf(out, len, "rank %d, whose last op is %s%s (pid %d on %s)", r, theirs,
               p->completed >= p->issued ? ", complete" : "", p->pid, p->host);
    }
    return;
  }
  /* 2. A rank that does not answer: dead, or its host unreachable. */
  for (int r = 0; r < nranks; r++) {
    if (r == me || all[r].magic == BRAID_LEDGER_MAGIC) continue;
    snprintf(out, len, "rank %d, which does not answer (dead, or its host unreachable)", r);
    return;
  }
  /* 3. A rank whose operation #k is a different one. */
  for (int r = 0; r < nranks; r++) {
    const struct braid_ledger_summary* p = &all[r];
    if (r == me || p->stuck.seq != k || wd_same_op(&p->stuck, &m->stuck)) continue;
    watchdog_op_describe(&p->stuck, theirs, sizeof theirs);
    snprintf(out, len, "rank %d, whose op is %s: the ranks disagree (BRAID_CHECK=1 refuses the "
             "first difference at launch)", r, theirs);
    return;
  }
  /* 4. Everyone is in it: name the least advanced of the others. */
  int slow = -1;
  for (int r = 0; r < nranks; r++) {
    const struct braid_ledger_summary* p = &all[r];
    if (r == me || p->completed >= k || p->chan < 0) continue;
    if (slow < 0 || p->chan_recv < all[slow].chan_recv) slow = r;
  }
  if (slow >= 0)
    snprintf(out, len, "rank %d, the least advanced of the ranks in it (channel %d, step %llu)",
             slow, all[slow].chan, (unsigned long long)all[slow].chan_recv);
  else
    snprintf(out, len, "no rank in particular: the others have completed it or report no "
             "channel progress");
}

void watchdog_verdict(const struct braid_ledger_summary* all, int nranks, int me, char* out,
                      size_t len) {
  const struct braid_ledger_summary* m = &all[me];
  char mine[160], where[64] = "", blame[320];
  if (m->stuck.seq == 0) {
    snprintf(out, len, "rank %d waits for nothing: %llu operations issued, all complete", me,
             (unsigned long long)m->issued);
    return;
  }
  watchdog_op_describe(&m->stuck, mine, sizeof mine);
  if (m->chan >= 0)
    snprintf(where, sizeof where, " (channel %d, step %llu)", m->chan,
             (unsigned long long)m->chan_recv);
  wd_blame(all, nranks, me, blame, sizeof blame);
  snprintf(out, len, "rank %d waits in %s%s for %s; no progress for %.0f s", me, mine, where,
           blame, m->waiting_s);
}

/* A verdict: a WARN only (SIGUSR1), or the comm's failure, its last error, and its kernels stopped.
 */
static void wd_deliver(struct braid_watchdog* wd, int fail, const char* text, const char* why) {
  struct ncclComm* comm = wd->comm;
  if (!fail) {
    WARN("%s (comm 0x%llx, %s)", text, (unsigned long long)comm->comm_hash, why);
    return;
  }
  braid_err(ncclRemoteError, "%s (comm 0x%llx, %s)", text, (unsigned long long)comm->comm_hash,
            why); /* logs it as a WARN, and it becomes this comm's last error below */
  comm_fail_async(comm, ncclRemoteError);
  comm_stop(comm, "stopped by a hang verdict");
  wd->failed = 1;
}

/*
 * Graph replays (the thread), once a launch was captured: every WD_GRAPH_PERIOD_S the kernels'
 * replay words are copied out beside them (as the ledger's) and read a round later. A block
 * that ended one is progress; a block still in a captured launch while none ends for
 * BRAID_TIMEOUT is a replay stuck in it. Replays are not numbered, so unlike the ledger's
 * verdict this one cannot compare ranks: it names the launch's operations.
 */
static void wd_graph_text(struct braid_watchdog* wd, double idle_s, char* out, size_t len) {
  char op[160];
  uint32_t nops = 0;
  snprintf(op, sizeof op, "operations no more described (over %d captures since)", WD_CAPTURES);
  pthread_mutex_lock(&wd->lock);
  const struct wd_capture* c = &wd->captures[wd->graph_live % WD_CAPTURES];
  if (c->id == wd->graph_live) {
    watchdog_op_describe(&c->first, op, sizeof op);
    nops = c->nops;
  }
  pthread_mutex_unlock(&wd->lock);
  char more[48] = "";
  if (nops > 1) snprintf(more, sizeof more, " and %u more operations", nops - 1);
  snprintf(out, len,
           "rank %d waits in a CUDA graph replay, in the launch captured with %s%s (capture "
           "#%u of this communicator, block %d); no progress for %.0f s. Graph replays are not in "
           "the ledger, so the ranks are not compared: does every rank replay the same graphs "
           "in the same order?",
           wd->comm->rank, op, more, wd->graph_live, wd->graph_block, idle_s);
}

static void wd_poll_graphs(struct braid_watchdog* wd) {
  struct ncclComm* comm = wd->comm;
  const double now = braid_time_sec();
  if (wd->graph_copying) {
    cudaError_t err = cudaEventQuery(wd->graph_copied);
    if (err == cudaErrorNotReady) return;
    wd->graph_copying = 0;
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      return;
    }
    const struct braid_graph_words* g = (const struct braid_graph_words*)comm->graph_words;
    uint64_t ended = 0;
    const uint32_t was_live = wd->graph_live;
    wd->graph_live = 0;
    for (int b = 0; b < BRAID_MAX_GRID; b++) {
      ended += BRAID_GRAPH_ENDED(g->word[b]);
      if (wd->graph_live == 0 && BRAID_GRAPH_LIVE(g->word[b]) != 0) {
        wd->graph_live = BRAID_GRAPH_LIVE(g->word[b]);
        wd->graph_block = b;
      }
    }
    /* Progress: a block ended a launch, or none is in one, or another launch began. */
    if (ended != wd->graph_ended || wd->graph_live == 0 || wd->graph_live != was_live)
      wd->graph_progress_t = now;
    wd->graph_ended = ended;
    double idle = now - wd->graph_progress_t;
    if (wd->graph_live != 0 && !wd->failed && wd->timeout_s > 0 && idle > wd->timeout_s &&
        comm->state != BRAID_COMM_REVOKED) {
      char text[768], why[64];
      wd_graph_text(wd, idle, text, sizeof text);
      snprintf(why, sizeof why, "no progress for BRAID_TIMEOUT=%.0f s", wd->timeout_s);
      wd_deliver(wd, 1, text, why);
    }
  }
  if (now - wd->graph_polled < WD_GRAPH_PERIOD_S) return;
  pthread_mutex_lock(&wd->lock);
  int graphs = wd->graphs;
  pthread_mutex_unlock(&wd->lock);
  if (!graphs) return;
  if (!wd->graph_armed) { /* the clock starts with the first read, not at 0 */
    wd->graph_armed = 1;
    wd->graph_progress_t = now;
  }
  wd->graph_polled = now;
  if (cudaMemcpyAsync(comm->graph_words, &comm->dev->comm->graph, sizeof(struct braid_graph_words),
                      cudaMemcpyDeviceToHost, wd->stream) != cudaSuccess ||
      cudaEventRecord(wd->graph_copied, wd->stream) != cudaSuccess) {
    (void)cudaGetLastError();
    return;
  }
  wd->graph_copying = 1;
}

#define WD_SILENT_LISTED 8 /* ranks named in the line about those that gave no summary */

/* One WARN naming the ranks that gave no summary and why (the first few), before the verdict. */
static void wd_report_silent(const struct wd_query_status* st, int nranks) {
  char line[1024], reason[96];
  int silent = 0, at = 0;
  line[0] = '\0';
  for (int r = 0; r < nranks; r++) {
    if (st[r].why == WD_QUERY_ANSWERED || st[r].why == WD_QUERY_SELF) continue;
    if (silent++ >= WD_SILENT_LISTED || at >= (int)sizeof line) continue;
    wd_query_describe(&st[r], WD_QUERY_TIMEOUT_S, reason, sizeof reason);
    at += snprintf(line + at, sizeof line - (size_t)at, "%srank %d: %s", at ? "; " : "", r, reason);
  }
  if (silent == 0) return;
  WARN("watchdog: %d of %d ranks gave no summary for the verdict (%s%s)", silent, nranks - 1,
       line, silent > WD_SILENT_LISTED ? "; ..." : "");
}

/*
 * Gathers every rank's summary and prints the verdict; on `fail`, the comm fails with it, and
 * where the failure is rank `gone` being gone (>= 0), the requests tell every other rank. The
 * other ranks are asked all at once (wd_query_all), so this takes WD_QUERY_TIMEOUT_S at most,
 * however many of them do not answer.
 */
static void wd_verdict_run(struct braid_watchdog* wd, int fail, int gone, const char* why) {
  struct ncclComm* comm = wd->comm;
  struct braid_ledger_summary* all = calloc((size_t)comm->nranks, sizeof *all);
  struct wd_query_status* st = calloc((size_t)comm->nranks, sizeof *st);
  char text[768];
  if (all == NULL || st == NULL) goto out;
  wd_summary(wd, &all[comm->rank]);
  /* The stop flag: a destroy does not wait out a dead peer's timeout. */
  if (wd_query_all(wd->addrs, comm->nranks, comm->rank, wd->secret, fail ? gone : -1,
                   WD_QUERY_TIMEOUT_S, &wd->stop, all, st) != ncclSuccess)
    goto out;
  wd_report_silent(st, comm->nranks);
  watchdog_verdict(all, comm->nranks, comm->rank, text, sizeof text);
  wd_deliver(wd, fail, text, why);
out:
  free(st);
  free(all);
}

/*
 * The early warning (BRAID_HANG_WARN): the verdict, nothing failed. Asking every other rank is
 * what the verdict costs; in a large job many ranks wait at once for a slow one, legitimately,
 * so past WD_WARN_ASK_MAX ranks the warning says only where this rank waits.
 */
#define WD_WARN_ASK_MAX 64

static void wd_warn_run(struct braid_watchdog* wd, const char* why) {
  struct ncclComm* comm = wd->comm;
  if (comm->nranks <= WD_WARN_ASK_MAX) {
    wd_verdict_run(wd, 0, -1, why);
    return;
  }
  struct braid_ledger_summary me;
  char op[160], where[64] = "", text[320];
  wd_summary(wd, &me);
  if (me.stuck.seq == 0) return; /* completed meanwhile */
  watchdog_op_describe(&me.stuck, op, sizeof op);
  if (me.chan >= 0)
    snprintf(where, sizeof where, " (channel %d, step %llu)", me.chan,
             (unsigned long long)me.chan_recv);
  snprintf(text, sizeof text, "rank %d waits in %s%s; no progress for %.0f s (send SIGUSR1 for "
           "the ranks it waits for)", comm->rank, op, where, me.waiting_s);
  wd_deliver(wd, 0, text, why);
}

/* ---- the thread ---------------------------------------------------------------------------- */

/* The server thread answers with wd_summary; watchdog_server.c reads the connections. */
static void wd_summary_cb(void* arg, struct braid_ledger_summary* out) { wd_summary(arg, out); }

/* The server's notices (on its thread): a peer fails, or the next rank leaves on purpose. */
static void wd_notice_cb(void* arg, uint32_t flags, int rank, int gone) {
  struct braid_watchdog* wd = arg;
  const int nranks = wd->comm->nranks;
  if (rank < 0 || rank >= nranks || rank == wd->comm->rank) return;
  if ((flags & WD_REQ_BYE) && rank == (wd->comm->rank + 1) % nranks)
    __atomic_store_n(&wd->next_left, 1, __ATOMIC_RELEASE);
  /* Only the server's thread writes these: told_gone is read once told_failed is seen. */
  if ((flags & WD_REQ_FAILING) && gone >= 0 && gone < nranks &&
      __atomic_load_n(&wd->told_failed, __ATOMIC_ACQUIRE) == 0) {
    wd->told_gone = gone;
    __atomic_store_n(&wd->told_failed, rank + 1, __ATOMIC_RELEASE);
  }
}

static void* wd_server_main(void* arg) {
  struct braid_watchdog* wd = arg;
  char name[16];
  snprintf(name, sizeof name, "braid-wds%d", wd->comm->rank);
  pthread_setname_np(pthread_self(), name);
  braid_log_context_set(wd->comm->rank, wd->comm->cuda_dev);
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed; /* see wd_main */
  if (cudaThreadExchangeStreamCaptureMode(&mode) != cudaSuccess ||
      cudaSetDevice(wd->comm->cuda_dev) != cudaSuccess)
    (void)cudaGetLastError();
  struct wd_server* sv = wd_server_new(wd->listen_fd, wd->secret, wd_summary_cb, wd, &wd->stop);
  if (sv == NULL) {
    WARN("watchdog: out of memory for its server; other ranks' verdicts will miss this rank");
    return NULL;
  }
  wd_server_on_notice(sv, wd_notice_cb);
  while (!__atomic_load_n(&wd->stop, __ATOMIC_ACQUIRE)) {
    struct pollfd pfd[1 + WD_SERVER_CONNS];
    int n = wd_server_pollfds(sv, pfd);
    if (poll(pfd, (nfds_t)n, (int)(WD_PERIOD_S * 1000)) < 0 && errno != EINTR) {
      usleep((useconds_t)(WD_PERIOD_S * 1e6)); /* not expected; never spin on it */
      continue;
    }
    wd_server_serve(sv, pfd, braid_time_sec());
  }
  wd_server_free(sv);
  return NULL;
}

/* A rank of this host whose process is gone fails the communicator now. */
static void wd_check_local_peers(struct braid_watchdog* wd) {
  struct ncclComm* comm = wd->comm;
  const struct braid_peer_info* me = &comm->peers[comm->rank];
  for (int r = 0; r < comm->nranks; r++) {
    const struct braid_peer_info* p = &comm->peers[r];
    /* Only pids of this pid namespace mean anything here (containers may share a host hash). */
    if (r == comm->rank || p->host_hash != me->host_hash || p->pid == me->pid ||
        p->pid_ns == 0 || p->pid_ns != me->pid_ns)
      continue;
    /* A zombie counts as gone (its parent may never reap it), as does a pid taken over. */
    if (!braid_process_gone(p->pid, p->start_time)) continue;
    /*
     * The ledger lags the GPU by a round of copies: when this comm's last launch has in fact
     * finished, nothing waits on the peer (it may well have exited after its own last op).
     */
    if (wd->graph_live == 0 && comm->dev && comm->dev->order &&
        cudaEventQuery(comm->dev->order->last_launch) == cudaSuccess)
      return; /* (a replay in progress: without graph mixing the event does not cover it) */
    (void)cudaGetLastError();
    char why[96];
    snprintf(why, sizeof why, "rank %d's process (pid %d) is gone", r, p->pid);
    wd_verdict_run(wd, 1, r, why);
    return;
  }
}

/* Another rank found one gone and said so: this rank fails with it, naming both. */
static void wd_check_told(struct braid_watchdog* wd) {
  const int told = __atomic_load_n(&wd->told_failed, __ATOMIC_ACQUIRE);
  if (told == 0) return;
  const struct braid_peer_info* g = &wd->comm->peers[wd->told_gone];
  char text[320];
  snprintf(text, sizeof text, "rank %d (pid %d on %s) is gone, as rank %d found and told rank "
           "%d (rank %d's log says how)", wd->told_gone, g->pid, g->hostname, told - 1,
           wd->comm->rank, told - 1);
  wd_deliver(wd, 1, text, "a peer's failure");
}

/*
 * The next rank's listener: refused means nothing listens there any more (its process is gone,
 * or its sockets are), unless it said bye before closing it. No answer in time proves nothing
 * (a busy or distant host): keepalive and BRAID_TIMEOUT are for silent hosts.
 */
static void wd_ping_next(struct braid_watchdog* wd) {
  struct ncclComm* comm = wd->comm;
  const int next = (comm->rank + 1) % comm->nranks;
  if (__atomic_load_n(&wd->next_left, __ATOMIC_ACQUIRE)) return;
  int err = 0;
  if (wd_notice_send(&wd->addrs[next], comm->rank, wd->secret, WD_REQ_PING, WD_PING_TIMEOUT_S,
                     &wd->stop, &err) >= 0)
    return;
  struct timespec grace = {0, (long)(WD_BYE_GRACE_S * 1e9)};
  nanosleep(&grace, NULL);
  if (__atomic_load_n(&wd->next_left, __ATOMIC_ACQUIRE) ||
      __atomic_load_n(&wd->stop, __ATOMIC_ACQUIRE))
    return;
  const struct braid_peer_info* p = &comm->peers[next];
  char why[320];
  snprintf(why, sizeof why, "rank %d (pid %d on %s) stopped listening without a destroy or an "
           "abort (its watchdog's port: %s): its process is gone or its sockets were closed",
           next, p->pid, p->hostname, strerror(err));
  wd_verdict_run(wd, 1, next, why);
}

static void* wd_main(void* arg) {
  struct braid_watchdog* wd = arg;
  struct ncclComm* comm = wd->comm;
  char name[16];
  snprintf(name, sizeof name, "braid-wd%d", comm->rank);
  pthread_setname_np(pthread_self(), name);
  braid_log_context_set(comm->rank, comm->cuda_dev);
  /* Our event queries and copies must not break a user's stream capture in global mode. */
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  if (cudaThreadExchangeStreamCaptureMode(&mode) != cudaSuccess ||
      cudaSetDevice(comm->cuda_dev) != cudaSuccess)
    (void)cudaGetLastError();
  wd->usr1_seen = (unsigned long)wd_usr1_count;
  while (!__atomic_load_n(&wd->stop, __ATOMIC_ACQUIRE)) {
    wd_poll_launches(wd);
    wd_poll_graphs(wd);
    if ((unsigned long)wd_usr1_count != wd->usr1_seen) {
      wd->usr1_seen = (unsigned long)wd_usr1_count;
      wd_verdict_run(wd, 0, -1, "SIGUSR1");
      if (wd->graph_live != 0 && comm->state != BRAID_COMM_REVOKED) { /* as of the last read */
        char text[768];
        wd_graph_text(wd, braid_time_sec() - wd->graph_progress_t, text, sizeof text);
        wd_deliver(wd, 0, text, "SIGUSR1");
      }
    }
    double now = braid_time_sec();
    pthread_mutex_lock(&wd->lock);
    /* A revoked communicator runs nothing more: nothing of it can hang. */
    int pending = wd->count > 0 && comm->state != BRAID_COMM_REVOKED;
    double progress_t = wd->progress_t, idle = now - progress_t;
    pthread_mutex_unlock(&wd->lock);
    if (!wd->failed && pending && wd->timeout_s > 0 && idle > wd->timeout_s) {
      char why[64];
      snprintf(why, sizeof why, "no progress for BRAID_TIMEOUT=%.0f s", wd->timeout_s);
      wd_verdict_run(wd, 1, -1, why);
    } else if (!wd->failed && pending && wd->warn_s > 0 && idle > wd->warn_s &&
               (wd->timeout_s <= 0 || wd->warn_s < wd->timeout_s) &&
               progress_t != wd->warned_progress_t) {
      /* Once per stall, and nothing fails: the proxies list their steps too. */
      wd->warned_progress_t = progress_t;
      braid_report_request();
      char why[96];
      snprintf(why, sizeof why, "BRAID_HANG_WARN=%.0f s, still waiting until BRAID_TIMEOUT",
               wd->warn_s);
      wd_warn_run(wd, why);
    }
    /*
     * Peers of this host are watched whatever BRAID_TIMEOUT says and whether or not a launch is
     * followed: wd_check_local_peers fails the communicator only while its last launch (or a
     * replay) has not finished, the only time a dead peer can leave it waiting.
     */
    if (!wd->failed && comm->state != BRAID_COMM_REVOKED &&
        now - wd->peers_checked > WD_PEER_CHECK_S) {
      wd->peers_checked = now;
      wd_check_local_peers(wd);
    }
    if (!wd->failed && comm->state != BRAID_COMM_REVOKED) wd_check_told(wd);
    if (!wd->failed && comm->state != BRAID_COMM_REVOKED && comm->nranks > 1 &&
        now - wd->pinged > WD_PING_S) {
      wd->pinged = now;
      wd_ping_next(wd);
    }
    struct timespec nap = {0, (long)(WD_PERIOD_S * 1e9)};
    nanosleep(&nap, NULL);
  }
  return NULL;
}

/* ---- start and stop ------------------------------------------------------------------------ */

ncclResult_t watchdog_start(struct ncclComm* comm) {
  ncclResult_t res = ncclSuccess;
  struct braid_watchdog* wd = NULL;
  BRAID_TRY(BRAID_CALLOC(&wd, 1, "the watchdog"));
  wd->comm = comm;
  wd->listen_fd = -1;
  pthread_mutex_init(&wd->lock, NULL);
  wd->timeout_s = (double)braid_param_int(BRAID_P_TIMEOUT);
  wd->warn_s = (double)braid_param_int(BRAID_P_HANG_WARN);
  wd->warned_progress_t = -1;
  memcpy(wd->secret, bootstrap_secret(comm->bootstrap), sizeof wd->secret);
  BRAID_TRY(BRAID_CALLOC(&wd->addrs, comm->nranks, "the watchdog address table"));
  /* On the bootstrap's address (the interface the other ranks reach), any port. */
  wd->addrs[comm->rank] = *bootstrap_peer_addr(comm->bootstrap, comm->rank);
  if (wd->addrs[comm->rank].sa.sa_family == AF_INET6)
    wd->addrs[comm->rank].sin6.sin6_port = 0;
  else
    wd->addrs[comm->rank].sin.sin_port = 0;
  BRAID_TRY(socket_listen(&wd->addrs[comm->rank], &wd->listen_fd));
  BRAID_TRY(bootstrap_allgather(comm->bootstrap, wd->addrs, sizeof *wd->addrs));
  BRAID_CUDA_TRY(cudaStreamCreateWithFlags(&wd->stream, cudaStreamNonBlocking));
  BRAID_CUDA_TRY(cudaEventCreateWithFlags(&wd->words_copied, cudaEventDisableTiming));
  BRAID_CUDA_TRY(cudaEventCreateWithFlags(&wd->graph_copied, cudaEventDisableTiming));
  pthread_once(&wd_signal_once, wd_signal_install);
  int err = pthread_create(&wd->server, NULL, wd_server_main, wd);
  BRAID_CHECK(err == 0, ncclSystemError, "cannot start the watchdog's server thread: %s",
              strerror(err));
  wd->server_started = 1;
  err = pthread_create(&wd->thread, NULL, wd_main, wd);
  BRAID_CHECK(err == 0, ncclSystemError, "cannot start the watchdog thread: %s", strerror(err));
  wd->started = 1;
  comm->watchdog = wd;
  return ncclSuccess;
fail:
  comm->watchdog = wd; /* watchdog_stop frees what there is */
  watchdog_stop(comm);
  return res;
}

void watchdog_stop(struct ncclComm* comm) {
  struct braid_watchdog* wd = comm->watchdog;
  if (wd == NULL) return;
  /* Leaving on purpose: the rank that pings this one must not take the closed port for a death. */
  if (wd->started && comm->nranks > 1) {
    int err = 0;
    const int prev = (comm->rank + comm->nranks - 1) % comm->nranks;
    (void)wd_notice_send(&wd->addrs[prev], comm->rank, wd->secret, WD_REQ_BYE, WD_PING_TIMEOUT_S,
                         NULL, &err);
  }
  __atomic_store_n(&wd->stop, 1, __ATOMIC_RELEASE);
  if (wd->started) pthread_join(wd->thread, NULL);
  if (wd->server_started) pthread_join(wd->server, NULL);
  comm->watchdog = NULL;
  socket_close(&wd->listen_fd);
  if (wd->words_copied) cudaEventDestroy(wd->words_copied);
  if (wd->graph_copied) cudaEventDestroy(wd->graph_copied);
  if (wd->stream) cudaStreamDestroy(wd->stream);
  (void)cudaGetLastError();
  free(wd->addrs);
  pthread_mutex_destroy(&wd->lock);
  free(wd);
}
