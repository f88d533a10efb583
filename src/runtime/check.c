/*
 * BRAID_CHECK=1: before a group's collectives launch, each rank of each
 * communicator sends every other rank the list of collectives it is about
 * to run (operation, type, operator, count, root, in issue order), then
 * compares the lists it receives with its own. A difference fails the group
 * with ncclInvalidUsage on every rank, naming the collective and the first
 * rank that differs, instead of launching kernels that would hang or mix
 * data. Send/recv operations are not compared (peers legitimately differ),
 * and a group without collectives exchanges nothing: send/recv between two
 * ranks of a larger communicator must not wait for the others.
 *
 * Every wait of the exchange has one deadline, BRAID_TIMEOUT seconds after
 * the check began (the time the watchdog gives a launch that makes no
 * progress, which is what the ranks would otherwise wait in; with
 * BRAID_TIMEOUT=0, BRAID_BOOTSTRAP_TIMEOUT, the bootstrap's bound on ranks
 * that do not arrive). A rank that skips the collective, calls it on another
 * communicator, or is blocked elsewhere does not send its list: at the
 * deadline every rank that waits for it fails the group naming the ranks
 * missing, its own call (operation, type, operator, count, root and the
 * sequence number the watchdog's verdicts use) and what the ranks that did
 * arrive called, and fails the communicator (ncclCommGetAsyncError): lists
 * still on their way would be read as the next group's. The waits are the
 * bootstrap's, which end on the comm's abort flag (ncclCommAbort, or the
 * comm failed asynchronously: a hang verdict or a dead peer raise it) and
 * when a peer's bootstrap is gone; the check then fails with that reason at
 * once. The sends are bounded by the same deadline: the first message to a
 * peer waits for it to take the connection, which it does only inside a
 * bootstrap call, so on a communicator's first check a missing rank can keep
 * this rank's list from the ranks after it, which then name this rank too.
 *
 * Two phases across the group's communicators (send to all, then receive
 * from all), so one thread driving several GPUs never waits on itself. The
 * check makes a group end wait for every rank of its communicators: a debug
 * mode, off by default.
 */
#include "runtime/check.h"

#include <stdlib.h>
#include <string.h>

#include "bootstrap/bootstrap.h"
#include "runtime/comm.h"
#include "base/debug.h"
#include "runtime/group.h"
#include "base/param.h"
#include "runtime/redop.h"
#include "runtime/watchdog.h"
#include "base/utils.h"

#define CHECK_TAG 0x20000000     /* beside the transport's 0x4... tags */
#define CHECK_MAX_OPS (1u << 20) /* a bound on what a peer's count can make us allocate */

/* One collective as the ranks exchange it. `seq` is reported, never compared. */
struct check_sig {
  int32_t coll, dtype, devop, root;
  uint64_t count;
  uint64_t seq; /* the watchdog's number for it on its rank (0: no watchdog) */
};

/* The exchange of one communicator of the group. */
struct check_comm {
  struct ncclComm* comm;
  struct check_sig* mine;
  uint32_t n;
  ncclResult_t res;           /* mismatch (ncclInvalidUsage), or why the exchange stopped */
  char text[BRAID_ERROR_MAX]; /* res's message */
  int stopped;                /* an abort, the comm's failure or a lost peer ended it (res says) */
  uint8_t* missing;           /* [nranks]: no list from it by the deadline, or ours not taken */
  uint8_t* same;              /* [nranks]: its list is ours */
  int nmissing;
};

int check_enabled(void) { return braid_param_int(BRAID_P_CHECK) != 0; }

/*
 * The deadline's length, and where it comes from (for the message). BRAID_TIMEOUT bounds what
 * the ranks would wait in without the check (a launch without progress); at 0 the watchdog waits
 * forever, but a check must not turn a skipped call into a silent hang: the bootstrap's bound on
 * a rank that does not arrive then applies.
 */
static double check_timeout(const char** source) {
  const int64_t t = braid_param_int(BRAID_P_TIMEOUT);
  if (t > 0) {
    *source = "BRAID_TIMEOUT";
    return (double)t;
  }
  const int64_t b = braid_param_int(BRAID_P_BOOTSTRAP_TIMEOUT);
  *source = "BRAID_BOOTSTRAP_TIMEOUT, as BRAID_TIMEOUT is 0";
  return b < 1 ? 1.0 : (double)b;
}

static const char* check_devop_name(int devop) {
  static const char* names[] = {"sum", "prod", "max", "min", "premulsum/avg", "avg"};
  return devop >= 0 && devop < BRAID_DEVOP_COUNT ? names[devop] : "?";
}

static int check_has_root(int coll) {
  return coll == BRAID_COLL_BROADCAST || coll == BRAID_COLL_REDUCE;
}

static int check_reduces(int coll) {
  return coll == BRAID_COLL_ALLREDUCE || coll == BRAID_COLL_REDUCESCATTER ||
         coll == BRAID_COLL_REDUCE;
}

static int check_sig_equal(const struct check_sig* a, const struct check_sig* b) {
  return a->coll == b->coll && a->dtype == b->dtype && a->devop == b->devop && a->root == b->root &&
         a->count == b->count;
}

/* "AllReduce float sum count=1024 #12", "Broadcast int8 count=7 root=1" (no watchdog). */
static void check_describe(const struct check_sig* s, char* out, size_t len) {
  int n = snprintf(out, len, "%s %s", braid_coll_name(s->coll),
                   redop_type_name((ncclDataType_t)s->dtype));
  if (n > 0 && (size_t)n < len && check_reduces(s->coll))
    n += snprintf(out + n, len - (size_t)n, " %s", check_devop_name(s->devop));
  if (n > 0 && (size_t)n < len)
    n += snprintf(out + n, len - (size_t)n, " count=%llu", (unsigned long long)s->count);
  if (n > 0 && (size_t)n < len && check_has_root(s->coll))
    n += snprintf(out + n, len - (size_t)n, " root=%d", s->root);
  if (n > 0 && (size_t)n < len && s->seq)
    snprintf(out + n, len - (size_t)n, " #%llu", (unsigned long long)s->seq);
}

/* A list's first collective described, and how many follow ("... and 2 more"). */
static void check_describe_list(const struct check_sig* s, uint32_t n, char* out, size_t len) {
  if (n == 0) {
    snprintf(out, len, "no collective");
    return;
  }
  check_describe(&s[0], out, len);
  size_t used = strlen(out);
  if (n > 1 && used < len) snprintf(out + used, len - used, " and %u more", n - 1);
}

/* The ranks flagged in `set`, as "1, 3-5" (the end elided past the buffer). */
static void check_rank_list(const uint8_t* set, int nranks, char* out, size_t len) {
  size_t used = 0;
  out[0] = '\0';
  for (int r = 0; r < nranks && used < len; r++) {
    if (!set[r]) continue;
    int last = r;
    while (last + 1 < nranks && set[last + 1]) last++;
    int n = last == r ? snprintf(out + used, len - used, "%s%d", used ? ", " : "", r)
                      : snprintf(out + used, len - used, "%s%d-%d", used ? ", " : "", r, last);
    if (n < 0 || (size_t)n >= len - used) {
      if (len > 4) snprintf(out + len - 4, 4, "...");
      return;
    }
    used += (size_t)n;
    r = last;
  }
}

/* This rank's collectives in the pending group of `comm` (NULL and 0 when none). */
static ncclResult_t check_collect(struct ncclComm* comm, struct check_sig** out, uint32_t* n) {
  ncclResult_t res = ncclSuccess;
  const struct braid_group_comm* g = comm->group;
  /* The ledger numbers every operation of the group, send/recv included, in this order. */
  const uint64_t issued = watchdog_issued(comm);
  *out = NULL;
  *n = 0;
  for (int i = 0; i < g->nops; i++) *n += g->ops[i].coll != BRAID_COLL_SENDRECV;
  if (*n == 0) return ncclSuccess;
  BRAID_TRY(BRAID_CALLOC(out, *n, "the check's operation list"));
  uint32_t k = 0;
  for (int i = 0; i < g->nops; i++) {
    const struct braid_op* op = &g->ops[i];
    if (op->coll == BRAID_COLL_SENDRECV) continue;
    struct check_sig* s = &(*out)[k++];
    s->coll = op->coll;
    s->dtype = op->dtype;
    s->devop = check_reduces(op->coll) ? op->devop : 0;
    s->root = check_has_root(op->coll) ? op->root : -1;
    s->count = op->count;
    s->seq = issued ? issued + (uint64_t)i + 1 : 0;
  }
fail:
  return res;
}

/*
 * A bootstrap wait of the exchange with `peer` failed before the deadline: the comm was aborted
 * or failed asynchronously (its abort flag ends bootstrap waits), or the peer's bootstrap is
 * gone. The error says which, and what this rank was checking.
 */
static ncclResult_t check_stopped(struct check_comm* cc, int peer, ncclResult_t res) {
  struct ncclComm* comm = cc->comm;
  char mine[200], why[BRAID_ERROR_MAX];
  check_describe_list(cc->mine, cc->n, mine, sizeof mine);
  const ncclResult_t async = __atomic_load_n(&comm->async_error, __ATOMIC_ACQUIRE);
  cc->stopped = 1;
  if (async != ncclSuccess && async != ncclInProgress) {
    pthread_mutex_lock(&comm->lock);
    snprintf(why, sizeof why, "%s",
             comm->fail_error[0] ? comm->fail_error : "no message was recorded");
    pthread_mutex_unlock(&comm->lock);
    return braid_err(async,
                     "BRAID_CHECK: rank %d stopped waiting for rank %d at %s on communicator "
                     "0x%llx: the communicator failed: %s",
                     comm->rank, peer, mine, (unsigned long long)comm->comm_hash, why);
  }
  /* The bootstrap names a lost peer; an abort it does not put into words. */
  snprintf(why, sizeof why, "%s", braid_err_last());
  if ((comm->abort_flag && __atomic_load_n(comm->abort_flag, __ATOMIC_ACQUIRE)) || why[0] == '\0')
    return braid_err(res,
                     "BRAID_CHECK: rank %d stopped waiting for rank %d at %s on communicator "
                     "0x%llx: the communicator was aborted",
                     comm->rank, peer, mine, (unsigned long long)comm->comm_hash);
  return braid_err(res,
                   "BRAID_CHECK: rank %d stopped waiting for rank %d at %s on communicator "
                   "0x%llx: %s",
                   comm->rank, peer, mine, (unsigned long long)comm->comm_hash, why);
}

/* Keeps the first error of the exchange (the thread's last error) as its verdict. */
static void check_keep(struct check_comm* cc, ncclResult_t res) {
  if (cc->res != ncclSuccess) return;
  cc->res = res;
  snprintf(cc->text, sizeof cc->text, "%s", braid_err_last());
}

/* Sends this rank's list to every other rank; a peer that does not take it by then is missing. */
static void check_send_all(struct check_comm* cc, double deadline) {
  struct ncclComm* comm = cc->comm;
  for (int peer = 0; peer < comm->nranks && !cc->stopped; peer++) {
    int late = 0;
    if (peer == comm->rank) continue;
    braid_err_clear();
    ncclResult_t r = bootstrap_send_until(comm->bootstrap, peer, CHECK_TAG, &cc->n, sizeof cc->n,
                                          deadline, &late);
    if (r == ncclSuccess)
      r = bootstrap_send_until(comm->bootstrap, peer, CHECK_TAG, cc->mine, cc->n * sizeof *cc->mine,
                               deadline, &late);
    if (r == ncclSuccess) continue;
    if (late) {
      cc->missing[peer] = 1; /* not inside any bootstrap call until the deadline */
      continue;
    }
    check_keep(cc, check_stopped(cc, peer, r));
  }
}

/* Receives every other rank's list until the deadline and compares; the first difference is kept.
 */
static void check_compare_all(struct check_comm* cc, double deadline) {
  struct ncclComm* comm = cc->comm;
  struct check_sig* theirs = NULL;
  char a[200], b[200];
  for (int peer = 0; peer < comm->nranks && !cc->stopped; peer++) {
    uint32_t m = 0;
    int late = 0;
    if (peer == comm->rank) continue;
    braid_err_clear();
    ncclResult_t r =
        bootstrap_recv_until(comm->bootstrap, peer, CHECK_TAG, &m, sizeof m, deadline, &late);
    free(theirs);
    theirs = NULL;
    if (r == ncclSuccess && m > CHECK_MAX_OPS) {
      check_keep(cc, braid_err(ncclInternalError, "BRAID_CHECK: rank %d announced %u collectives",
                               peer, m));
      cc->stopped = 1;
      break;
    }
    if (r == ncclSuccess && m) {
      theirs = calloc(m, sizeof *theirs);
      if (theirs == NULL) {
        check_keep(cc, braid_err(ncclSystemError,
                                 "BRAID_CHECK: out of host memory for rank %d's "
                                 "list",
                                 peer));
        cc->stopped = 1;
        break;
      }
      r = bootstrap_recv_until(comm->bootstrap, peer, CHECK_TAG, theirs, m * sizeof *theirs,
                               deadline, &late);
    }
    if (r != ncclSuccess) {
      if (late)
        cc->missing[peer] = 1;
      else
        check_keep(cc, check_stopped(cc, peer, r));
      continue;
    }
    if (cc->missing[peer]) continue; /* our list never reached it: it cannot complete the group */
    int differs = m != cc->n;
    for (uint32_t i = 0; i < cc->n && i < m && !differs; i++) {
      if (check_sig_equal(&cc->mine[i], &theirs[i])) continue;
      differs = 1;
      if (cc->res != ncclSuccess) break;
      check_describe(&cc->mine[i], a, sizeof a);
      check_describe(&theirs[i], b, sizeof b);
      check_keep(cc, braid_err(ncclInvalidUsage,
                               "BRAID_CHECK: collective %u of this group on communicator 0x%llx is "
                               "%s on rank %d but %s on rank %d",
                               i + 1, (unsigned long long)comm->comm_hash, a, comm->rank, b, peer));
    }
    if (differs && cc->res == ncclSuccess)
      check_keep(cc, braid_err(ncclInvalidUsage,
                               "BRAID_CHECK: rank %d issues %u collective(s) in this group on "
                               "communicator 0x%llx but rank %d issues %u",
                               comm->rank, cc->n, (unsigned long long)comm->comm_hash, peer, m));
    cc->same[peer] = !differs;
  }
  free(theirs);
}

/*
 * The verdict of one communicator after the exchange. Ranks missing at the deadline fail it with
 * ncclRemoteError, as the hang verdict does for the same rank without the check: this rank's
 * call was right, and from here a rank that skipped the call cannot be told from one blocked
 * or dead elsewhere, so the fault is the remote rank's. A difference among the ranks that did
 * arrive is a usage error (ncclInvalidUsage) whatever else happened, and names the ranks
 * missing too. Either way, with ranks missing, lists may still be on their way that a later
 * check would take for its own, so the communicator is failed, on every rank that waited.
 */
static ncclResult_t check_finish(struct check_comm* cc, double timeout, const char* source) {
  struct ncclComm* comm = cc->comm;
  char missing[160], same[160], mine[200], text[BRAID_ERROR_MAX];
  if (cc->stopped) {
    /* A lost peer fails the comm; an abort or an earlier failure already did what it does. */
    const ncclResult_t async = __atomic_load_n(&comm->async_error, __ATOMIC_ACQUIRE);
    const int aborted = comm->abort_flag && __atomic_load_n(comm->abort_flag, __ATOMIC_ACQUIRE);
    braid_err_restore(cc->text);
    if (!aborted && (async == ncclSuccess || async == ncclInProgress)) {
      comm_fail_async(comm, cc->res);
      comm_stop(comm, "failed by a lost peer during BRAID_CHECK");
    }
    comm_error_record(comm, cc->res);
    return cc->res;
  }
  cc->nmissing = 0;
  for (int r = 0; r < comm->nranks; r++) cc->nmissing += cc->missing[r];
  if (cc->nmissing == 0) {
    braid_err_restore(cc->text);
    comm_error_record(comm, cc->res);
    return cc->res;
  }
  check_rank_list(cc->missing, comm->nranks, missing, sizeof missing);
  if (cc->res != ncclSuccess) {
    snprintf(text, sizeof text, "%s; rank(s) %s did not arrive within %.0f s (%s)", cc->text,
             missing, timeout, source);
    cc->res = braid_err(cc->res, "%s", text);
  } else {
    int nsame = 0;
    for (int r = 0; r < comm->nranks; r++) nsame += cc->same[r];
    check_rank_list(cc->same, comm->nranks, same, sizeof same);
    check_describe_list(cc->mine, cc->n, mine, sizeof mine);
    cc->res =
        braid_err(ncclRemoteError,
                  "BRAID_CHECK: rank %d of %d waited %.0f s (%s) on communicator 0x%llx for "
                  "rank(s) %s, which did not reach this group's collectives (the call skipped "
                  "or made on another communicator, or the rank blocked or dead elsewhere); "
                  "rank %d calls %s; %s%s%s",
                  comm->rank, comm->nranks, timeout, source, (unsigned long long)comm->comm_hash,
                  missing, comm->rank, mine, nsame ? "rank(s) " : "no other rank arrived",
                  nsame ? same : "", nsame ? " arrived with the same call(s)" : "");
  }
  comm_fail_async(comm, cc->res);
  comm_error_record(comm, cc->res);
  comm_stop(comm, "failed by BRAID_CHECK: ranks did not arrive");
  return cc->res;
}

ncclResult_t check_group(struct ncclComm* comms) {
  ncclResult_t res = ncclSuccess;
  const char* source = NULL;
  const double timeout = check_timeout(&source);
  const double deadline = braid_time_sec() + timeout;
  char first[BRAID_ERROR_MAX] = "";
  int count = 0;
  for (struct ncclComm* c = comms; c; c = c->group->next) count++;
  struct check_comm* cc = calloc((size_t)count, sizeof *cc);
  if (cc == NULL) {
    res = braid_err(ncclSystemError, "out of host memory for BRAID_CHECK");
    goto fail;
  }
  int i = 0;
  for (struct ncclComm* c = comms; c; c = c->group->next, i++) {
    cc[i].comm = c;
    BRAID_TRY(check_collect(c, &cc[i].mine, &cc[i].n));
    if (cc[i].n == 0) continue;
    cc[i].missing = calloc((size_t)c->nranks, 1);
    cc[i].same = calloc((size_t)c->nranks, 1);
    if (cc[i].missing == NULL || cc[i].same == NULL) {
      res = braid_err(ncclSystemError, "out of host memory for BRAID_CHECK");
      goto fail;
    }
  }
  /* Two phases across the communicators: one thread driving several never waits on itself. */
  for (i = 0; i < count; i++)
    if (cc[i].n) check_send_all(&cc[i], deadline);
  for (i = 0; i < count; i++)
    if (cc[i].n && !cc[i].stopped) check_compare_all(&cc[i], deadline);
  for (i = 0; i < count; i++) {
    if (cc[i].n == 0) continue;
    ncclResult_t r = check_finish(&cc[i], timeout, source);
    if (r != ncclSuccess && res == ncclSuccess) {
      res = r;
      snprintf(first, sizeof first, "%s", braid_err_last());
    }
  }
  if (res != ncclSuccess) braid_err_restore(first); /* the group's message, as it is its result */
fail:
  for (i = 0; cc && i < count; i++) {
    free(cc[i].mine);
    free(cc[i].missing);
    free(cc[i].same);
  }
  free(cc);
  return res;
}
