/*
 * BRAID_CHECK=1: before a group's collectives launch, each rank of each
 * communicator sends every other rank the list of collectives it is about
 * to run (operation, type, operator, count, root, in issue order), then
 * compares the lists it receives with its own. A difference fails the group
 * with ncclInvalidUsage on every rank, naming the collective and the first
 * rank that differs, instead of launching kernels that would hang or mix
 * data. Send/recv operations are not compared (peers legitimately differ),
 * and a group without collectives exchanges nothing: send/recv between two
 * ranks of a larger communicator must not wait for the others. (So a rank
 * that skips a collective altogether is not caught here; the watchdog's hang
 * verdict names it.)
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
#include "base/utils.h"

#define CHECK_TAG 0x20000000 /* beside the transport's 0x4... tags */

struct check_sig {
  int32_t coll, dtype, devop, root;
  uint64_t count;
};

int check_enabled(void) { return braid_param_int(BRAID_P_CHECK) != 0; }

static const char* check_devop_name(int devop) {
  static const char* names[] = {"sum", "prod", "max", "min", "premulsum/avg", "avg"};
  return devop >= 0 && devop < BRAID_DEVOP_COUNT ? names[devop] : "?";
}

static int check_has_root(int coll) { return coll == BRAID_COLL_BROADCAST || coll == BRAID_COLL_REDUCE; }

static int check_reduces(int coll) {
  return coll == BRAID_COLL_ALLREDUCE || coll == BRAID_COLL_REDUCESCATTER || coll == BRAID_COLL_REDUCE;
}

/* "AllReduce float sum count=1024", "Broadcast int8 count=7 root=1". */
static void check_describe(const struct check_sig* s, char* out, size_t len) {
  int n = snprintf(out, len, "%s %s", braid_coll_name(s->coll), redop_type_name((ncclDataType_t)s->dtype));
  if (n > 0 && (size_t)n < len && check_reduces(s->coll))
    n += snprintf(out + n, len - (size_t)n, " %s", check_devop_name(s->devop));
  if (n > 0 && (size_t)n < len)
    n += snprintf(out + n, len - (size_t)n, " count=%llu", (unsigned long long)s->count);
  if (n > 0 && (size_t)n < len && check_has_root(s->coll))
    snprintf(out + n, len - (size_t)n, " root=%d", s->root);
}

/* This rank's collectives in the pending group of `comm` (NULL and 0 when none). */
static ncclResult_t check_collect(const struct ncclComm* comm, struct check_sig** out, uint32_t* n) {
  ncclResult_t res = ncclSuccess;
  const struct braid_group_comm* g = comm->group;
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
  }
fail:
  return res;
}

static ncclResult_t check_send_all(struct ncclComm* comm, const struct check_sig* sigs, uint32_t n) {
  ncclResult_t res = ncclSuccess;
  for (int peer = 0; peer < comm->nranks; peer++) {
    if (peer == comm->rank) continue;
    BRAID_TRY(bootstrap_send(comm->bootstrap, peer, CHECK_TAG, &n, sizeof n));
    if (n) BRAID_TRY(bootstrap_send(comm->bootstrap, peer, CHECK_TAG, sigs, n * sizeof *sigs));
  }
fail:
  return res;
}

/* Receives every other rank's list and compares; the first difference is the error. */
static ncclResult_t check_compare_all(struct ncclComm* comm, const struct check_sig* mine, uint32_t n) {
  ncclResult_t res = ncclSuccess, verdict = ncclSuccess;
  struct check_sig* theirs = NULL;
  char a[160], b[160];
  for (int peer = 0; peer < comm->nranks; peer++) {
    uint32_t m = 0;
    if (peer == comm->rank) continue;
    BRAID_TRY(bootstrap_recv(comm->bootstrap, peer, CHECK_TAG, &m, sizeof m));
    free(theirs);
    theirs = NULL;
    BRAID_CHECK(m <= (1u << 20), ncclInternalError, "BRAID_CHECK: rank %d announced %u collectives",
                peer, m);
    if (m) {
      BRAID_TRY(BRAID_CALLOC(&theirs, m, "the check's peer list"));
      BRAID_TRY(bootstrap_recv(comm->bootstrap, peer, CHECK_TAG, theirs, m * sizeof *theirs));
    }
    if (verdict != ncclSuccess) continue; /* keep draining: the peers sent to us regardless */
    for (uint32_t i = 0; i < n && i < m; i++) {
      if (memcmp(&mine[i], &theirs[i], sizeof mine[i]) == 0) continue;
      check_describe(&mine[i], a, sizeof a);
      check_describe(&theirs[i], b, sizeof b);
      verdict = braid_err(ncclInvalidUsage,
                          "BRAID_CHECK: collective %u of this group on communicator 0x%llx is %s "
                          "on rank %d but %s on rank %d",
                          i + 1, (unsigned long long)comm->comm_hash, a, comm->rank, b, peer);
      break;
    }
    if (verdict == ncclSuccess && m != n)
      verdict = braid_err(ncclInvalidUsage,
                          "BRAID_CHECK: rank %d issues %u collective(s) in this group on "
                          "communicator 0x%llx but rank %d issues %u",
                          comm->rank, n, (unsigned long long)comm->comm_hash, peer, m);
  }
  res = verdict;
fail:
  free(theirs);
  return res;
}

ncclResult_t check_group(struct ncclComm* comms) {
  ncclResult_t res = ncclSuccess;
  int count = 0;
  for (struct ncclComm* c = comms; c; c = c->group->next) count++;
  struct check_sig** sigs = calloc((size_t)count, sizeof *sigs);
  uint32_t* n = calloc((size_t)count, sizeof *n);
  if (sigs == NULL || n == NULL) {
    res = braid_err(ncclSystemError, "out of host memory for BRAID_CHECK");
    goto fail;
  }
  int i = 0;
  for (struct ncclComm* c = comms; c; c = c->group->next, i++) {
    BRAID_TRY(check_collect(c, &sigs[i], &n[i]));
    if (n[i]) BRAID_TRY(check_send_all(c, sigs[i], n[i]));
  }
  i = 0;
  for (struct ncclComm* c = comms; c; c = c->group->next, i++) {
    if (n[i] == 0) continue;
    ncclResult_t r = check_compare_all(c, sigs[i], n[i]);
    if (r != ncclSuccess) {
      comm_error_record(c, r);
      if (res == ncclSuccess) res = r;
    }
  }
fail:
  for (int k = 0; sigs && k < count; k++) free(sigs[k]);
  free(sigs);
  free(n);
  return res;
}
