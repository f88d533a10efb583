/*
 * Communicators made from a communicator: ncclCommSplit (by colour and
 * key), ncclCommShrink (without some ranks, which may be dead), and
 * ncclCommRevoke, which stops a communicator so it can be shrunk.
 *
 * A split first learns every rank's (colour, key) through the parent's
 * bootstrap; a shrink needs no exchange, since every survivor passes the
 * same exclusion list. The members then build their own bootstrap through
 * the parent's connections (bootstrap_split, which never contacts a rank
 * outside the new group) and run the usual init on it. The whole job runs
 * now, at ncclGroupEnd, or on its own thread for a nonblocking config, as
 * init does (group_job_dispatch).
 *
 * With splitShare/shrinkShare the child borrows the parent's P2P/SHM
 * connections where both ends find one, and shares its aborts and its
 * order of kernels (share.h).
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bootstrap/bootstrap.h"
#include "runtime/comm.h"
#include "runtime/config.h"
#include "base/debug.h"
#include "runtime/group.h"
#include "base/utils.h"

#define NCCL_API __attribute__((visibility("default")))
#define NCCL_ALIAS(ret, name, params) NCCL_API ret p##name params __attribute__((alias(#name)));

struct split_args {
  struct ncclComm* parent;
  uint32_t ticket;  /* this job's turn among the parent's split jobs */
  int color, key;   /* split */
  int shrink;       /* 1: the members are the parent's ranks not in exclude[] */
  int nexclude;
  int exclude[];    /* shrink: sorted */
};

struct split_vote {
  int32_t color, key;
};

/* This rank's colour mates in new-rank order: by key, then by parent rank. */
static ncclResult_t split_members_by_color(const struct split_args* a, int* members, int* n) {
  ncclResult_t res = ncclSuccess;
  struct ncclComm* parent = a->parent;
  struct split_vote* votes = NULL;
  BRAID_TRY(BRAID_CALLOC(&votes, parent->nranks, "the split's colour table"));
  votes[parent->rank].color = a->color;
  votes[parent->rank].key = a->key;
  BRAID_TRY(bootstrap_allgather(parent->bootstrap, votes, sizeof *votes));
  *n = 0;
  if (a->color == NCCL_SPLIT_NOCOLOR) goto fail; /* took part; belongs nowhere */
  for (int r = 0; r < parent->nranks; r++) {
    if (votes[r].color != a->color) continue;
    int i = (*n)++;
    /* Insertion by (key, rank): parent ranks arrive in increasing order, so ties stay put. */
    while (i > 0 && votes[members[i - 1]].key > votes[r].key) {
      members[i] = members[i - 1];
      i--;
    }
    members[i] = r;
  }
fail:
  free(votes);
  return res;
}

static int split_excluded(const struct split_args* a, int rank) {
  for (int i = 0; i < a->nexclude; i++)
    if (a->exclude[i] == rank) return 1;
  return 0;
}

/* The parent's split jobs take turns in call order, the same order on every rank. */
static ncclResult_t split_wait_turn(const struct split_args* a) {
  struct ncclComm* parent = a->parent;
  while (__atomic_load_n(&parent->split_turn, __ATOMIC_ACQUIRE) != a->ticket) {
    if (parent->abort_flag && __atomic_load_n(parent->abort_flag, __ATOMIC_RELAXED))
      return braid_err(ncclRemoteError, "rank %d: the parent communicator aborted while a split "
                       "waited for an earlier one", parent->rank);
    usleep(100);
  }
  return ncclSuccess;
}

/* This job is over (done, failed or cancelled): the next split may go, teardown may too. */
static void split_job_done(const struct split_args* a) {
  __atomic_fetch_add(&a->parent->split_turn, 1, __ATOMIC_RELEASE);
  __atomic_fetch_sub(&a->parent->children_pending, 1, __ATOMIC_RELEASE);
}

static ncclResult_t split_job_run(struct braid_init_job* job) {
  ncclResult_t res = ncclSuccess;
  struct split_args* a = job->arg;
  struct ncclComm* parent = a->parent;
  int* members = NULL;
  int n = 0, me = -1;
  braid_log_context_set(parent->rank, parent->cuda_dev);
  BRAID_TRY(split_wait_turn(a));
  BRAID_TRY(BRAID_CALLOC(&members, parent->nranks, "the split's member list"));
  if (a->shrink) {
    for (int r = 0; r < parent->nranks; r++)
      if (!split_excluded(a, r)) members[n++] = r;
  } else {
    BRAID_TRY(split_members_by_color(a, members, &n));
  }
  if (job->comm == NULL) goto fail; /* NCCL_SPLIT_NOCOLOR: nothing more to do */
  for (int i = 0; i < n; i++)
    if (members[i] == parent->rank) me = i;
  BRAID_CHECK(me >= 0, ncclInternalError, "rank %d is not among the %d members of its own split",
              parent->rank, n);
  INFO(BRAID_LOG_INIT, "comm %p rank %d nranks %d: %s -> new rank %d of %d", (void*)parent,
       parent->rank, parent->nranks, a->shrink ? "shrink" : "split", me, n);
  res = comm_init_split(job->comm, parent, members, n, me, a->shrink);
  free(members);
  split_job_done(a);
  return res;
fail:
  if (res != ncclSuccess && job->comm) comm_init_failed(job->comm, res);
  free(members);
  split_job_done(a);
  return res;
}

/* The job will not run (no thread for it): the parent stops waiting for it. */
static void split_job_cancel(struct braid_init_job* job) { split_job_done(job->arg); }

/* A parent that can be split: initialized, not failed (a revoked one is fine). */
static ncclResult_t split_check_parent(struct ncclComm* parent, const char* api) {
  ncclResult_t res = comm_check(parent, api);
  if (res != ncclSuccess || parent->state == BRAID_COMM_REVOKED) return res;
  return comm_check_ready(parent, api);
}

/*
 * Allocates the child (unless `member` is 0), then runs the job. `args` is
 * owned from here on.
 */
static ncclResult_t split_start(struct ncclComm* parent, struct split_args* args, int member,
                                const ncclConfig_t* config, ncclComm_t* newcomm, const char* api) {
  ncclResult_t res = ncclSuccess;
  struct braid_config cfg;
  struct ncclComm* child = NULL;
  struct braid_init_job* job = NULL;
  BRAID_TRY(config_resolve_from_api(&parent->config, config, &cfg, api));
  if (member) BRAID_TRY(comm_alloc(&child, -1, 0, parent->cuda_dev, &cfg));
  BRAID_TRY(BRAID_CALLOC(&job, 1, "split job"));
  job->comm = child;
  job->run = split_job_run;
  job->cancel = split_job_cancel;
  args->ticket = __atomic_fetch_add(&parent->split_next, 1, __ATOMIC_ACQ_REL);
  job->arg = args;
  args = NULL;
  *newcomm = child;
  __atomic_fetch_add(&parent->children_pending, 1, __ATOMIC_ACQ_REL);
  res = group_job_dispatch(job, cfg.blocking, api); /* owns job and args now */
  if (res != ncclSuccess && res != ncclInProgress && child) {
    comm_free(child);
    *newcomm = NULL;
  }
  return res;
fail:
  free(args);
  if (child) comm_free(child);
  if (group_depth() > 0) group_fail(res); /* the group's end fails too, and runs nothing */
  return res;
}

NCCL_API ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                    ncclConfig_t* config) {
  ncclResult_t res = ncclSuccess;
  struct split_args* args = NULL;
  braid_err_clear();
  BRAID_CHECK(newcomm != NULL, ncclInvalidArgument, "ncclCommSplit: newcomm is NULL");
  *newcomm = NULL;
  BRAID_TRY(split_check_parent(comm, "ncclCommSplit"));
  BRAID_CHECK(color >= 0 || color == NCCL_SPLIT_NOCOLOR, ncclInvalidArgument,
              "ncclCommSplit: color = %d; it must be >= 0 or NCCL_SPLIT_NOCOLOR (%d)", color,
              NCCL_SPLIT_NOCOLOR);
  BRAID_TRY(BRAID_CALLOC(&args, 1, "split arguments"));
  args->parent = comm;
  args->color = color;
  args->key = key;
  return split_start(comm, args, color != NCCL_SPLIT_NOCOLOR, config, newcomm, "ncclCommSplit");
fail:
  comm_error_record(comm, res);
  if (group_depth() > 0) group_fail(res);
  return res;
}
NCCL_ALIAS(ncclResult_t, ncclCommSplit, (ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
           ncclConfig_t* config))

static ncclResult_t shrink_check_list(const struct ncclComm* comm, const int* list, int count) {
  ncclResult_t res = ncclSuccess;
  BRAID_CHECK(count >= 0 && count < comm->nranks, ncclInvalidArgument,
              "ncclCommShrink: excludeRanksCount = %d; it must be in [0, %d) for %d ranks", count,
              comm->nranks, comm->nranks);
  BRAID_CHECK(count == 0 || list != NULL, ncclInvalidArgument,
              "ncclCommShrink: excludeRanksList is NULL with excludeRanksCount = %d", count);
  for (int i = 0; i < count; i++) {
    BRAID_CHECK(list[i] >= 0 && list[i] < comm->nranks, ncclInvalidArgument,
                "ncclCommShrink: excludeRanksList[%d] = %d is not a rank (0..%d)", i, list[i],
                comm->nranks - 1);
    BRAID_CHECK(list[i] != comm->rank, ncclInvalidArgument,
                "ncclCommShrink: rank %d is in its own exclusion list; excluded ranks do not call "
                "ncclCommShrink",
                comm->rank);
    for (int j = 0; j < i; j++)
      BRAID_CHECK(list[j] != list[i], ncclInvalidArgument,
                  "ncclCommShrink: rank %d is listed twice (entries %d and %d)", list[i], j, i);
  }
fail:
  return res;
}

NCCL_API ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                                     ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags) {
  ncclResult_t res = ncclSuccess;
  struct split_args* args = NULL;
  braid_err_clear();
  BRAID_CHECK(newcomm != NULL, ncclInvalidArgument, "ncclCommShrink: newcomm is NULL");
  *newcomm = NULL;
  BRAID_TRY(split_check_parent(comm, "ncclCommShrink"));
  BRAID_CHECK(shrinkFlags == NCCL_SHRINK_DEFAULT || shrinkFlags == NCCL_SHRINK_ABORT,
              ncclInvalidArgument,
              "ncclCommShrink: shrinkFlags = 0x%x; it must be NCCL_SHRINK_DEFAULT or "
              "NCCL_SHRINK_ABORT",
              (unsigned)shrinkFlags);
  BRAID_TRY(shrink_check_list(comm, excludeRanksList, excludeRanksCount));
  if (shrinkFlags == NCCL_SHRINK_ABORT && comm->state != BRAID_COMM_REVOKED) {
    /* Kernels may wait on an excluded (dead) rank: stop them; the parent runs nothing more. */
    BRAID_TRY(comm_quiesce(comm));
    comm->state = BRAID_COMM_REVOKED;
  }
  BRAID_TRY(braid_calloc((void**)&args, 1, sizeof *args + (size_t)excludeRanksCount * sizeof(int),
                         "shrink arguments"));
  args->parent = comm;
  args->shrink = 1;
  args->nexclude = excludeRanksCount;
  if (excludeRanksCount > 0)
    memcpy(args->exclude, excludeRanksList, (size_t)excludeRanksCount * sizeof(int));
  return split_start(comm, args, 1, config, newcomm, "ncclCommShrink");
fail:
  comm_error_record(comm, res);
  if (group_depth() > 0) group_fail(res);
  return res;
}
NCCL_ALIAS(ncclResult_t, ncclCommShrink, (ncclComm_t comm, int* excludeRanksList,
           int excludeRanksCount, ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags))

NCCL_API ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  ncclResult_t res = ncclSuccess;
  braid_err_clear();
  BRAID_TRY(comm_check_ready(comm, "ncclCommRevoke"));
  BRAID_CHECK(revokeFlags == 0, ncclInvalidArgument,
              "ncclCommRevoke: revokeFlags = 0x%x; it must be NCCL_REVOKE_DEFAULT (0)",
              (unsigned)revokeFlags);
  BRAID_CHECK(comm->group == NULL, ncclInvalidUsage,
              "ncclCommRevoke: rank %d's communicator has operations pending in an open group",
              comm->rank);
  BRAID_TRY(comm_quiesce(comm));
  comm->state = BRAID_COMM_REVOKED;
  INFO(BRAID_LOG_INIT, "comm %p rank %d nranks %d - Revoke COMPLETE", (void*)comm, comm->rank,
       comm->nranks);
  return ncclSuccess;
fail:
  comm_error_record(comm, res);
  return res;
}
NCCL_ALIAS(ncclResult_t, ncclCommRevoke, (ncclComm_t comm, int revokeFlags))
