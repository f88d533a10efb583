/*
 * Families of communicators that share connections (share.h): who is in
 * one, what a child may borrow from its parent, and what stays behind when
 * a member leaves before the others.
 */
#include "runtime/share.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/comm.h"
#include "base/debug.h"
#include "base/error.h"
#include "base/utils.h"
#include "runtime/channels.h"

/* What a member that left keeps for the others: anything a connection of theirs may use. */
struct share_grave {
  struct braid_channels* ch; /* its connectors (the ones it owns are freed with it) */
  int nranks;
  void* dev[3]; /* device: braid_dev_comm, send/recv connection arrays (steps) */
  struct share_grave* next;
};

static ncclResult_t share_add_member(struct braid_share* sh, struct ncclComm* comm) {
  if (sh->nmembers == sh->cap) {
    int cap = sh->cap ? 2 * sh->cap : 4;
    struct ncclComm** m = realloc(sh->members, (size_t)cap * sizeof *m);
    if (m == NULL) return braid_err(ncclSystemError, "out of memory for the family's members");
    sh->members = m;
    sh->cap = cap;
  }
  sh->members[sh->nmembers++] = comm;
  return ncclSuccess;
}

ncclResult_t share_create(struct ncclComm* comm) {
  ncclResult_t res = ncclSuccess;
  struct braid_share* sh = NULL;
  BRAID_TRY(BRAID_CALLOC(&sh, 1, "communicator family"));
  pthread_mutex_init(&sh->lock, NULL);
  pthread_mutex_init(&sh->members_lock, NULL);
  BRAID_TRY(share_add_member(sh, comm));
  BRAID_CUDA_TRY(cudaEventCreateWithFlags(&sh->order.last_launch, cudaEventDisableTiming));
  __atomic_store_n(&comm->share, sh, __ATOMIC_RELEASE); /* share_break reads it from any thread */
  return ncclSuccess;
fail:
  if (sh) {
    free(sh->members);
    pthread_mutex_destroy(&sh->lock);
    pthread_mutex_destroy(&sh->members_lock);
    free(sh);
  }
  return res;
}

ncclResult_t share_join(struct ncclComm* child, struct ncclComm* parent, const int* members,
                        int nmembers, int shrink) {
  ncclResult_t res = ncclSuccess;
  const char* what = shrink ? "shrinkShare" : "splitShare";
  struct braid_lender* l = NULL;
  if ((shrink ? child->config.shrink_share : child->config.split_share) != 1) return ncclSuccess;
  struct braid_share* sh = parent->share;
  /* A revoked parent's connections stopped mid-operation (revoke, NCCL_SHRINK_ABORT). */
  if (sh == NULL || parent->dev == NULL || parent->state != BRAID_COMM_READY) {
    INFO(BRAID_LOG_INIT,
         "rank %d: %s asked, but the parent %s; the new communicator makes its "
         "own connections",
         parent->rank, what, parent->state == BRAID_COMM_REVOKED ? "was revoked" : "cannot lend");
    return ncclSuccess;
  }
  /* A borrowing kernel copies one borrowed end per thread (kernel.h: borrows_in). */
  const int same_host = comm_host_peers(parent);
  if (2 + 2 * same_host > parent->dev->nthreads) {
    INFO(BRAID_LOG_INIT,
         "rank %d: %s asked, but %d ranks on this host are more than a kernel block copies "
         "steps for (%d threads); the new communicator makes its own connections",
         parent->rank, what, same_host + 1, parent->dev->nthreads);
    return ncclSuccess;
  }
  BRAID_TRY(BRAID_CALLOC(&l, 1, "borrowed connections"));
  BRAID_TRY(BRAID_CALLOC(&l->parent_rank, nmembers, "borrowed connections"));
  memcpy(l->parent_rank, members, (size_t)nmembers * sizeof *members);
  l->ch = parent->channels;
  l->dev_comm = parent->dev->comm;
  l->dev_p2p_send = parent->dev->p2p_send;
  l->dev_p2p_recv = parent->dev->p2p_recv;
  l->nranks = parent->nranks;
  pthread_mutex_lock(&sh->members_lock);
  if (sh->broken) {
    pthread_mutex_unlock(&sh->members_lock);
    INFO(BRAID_LOG_INIT,
         "rank %d: %s asked, but a communicator of the parent's family was "
         "aborted; the new communicator makes its own connections",
         parent->rank, what);
    goto fail;
  }
  /*
   * An abort of the child under way: before this check, the join fails; after it, the abort
   * finds the child in the family or not (`share`, published last), and either way its init
   * fails on its own raised flag before it has launched anything.
   */
  if (__atomic_load_n(child->abort_flag, __ATOMIC_SEQ_CST)) {
    pthread_mutex_unlock(&sh->members_lock);
    res = braid_err(ncclRemoteError, "rank %d: the new communicator was aborted during its split",
                    parent->rank);
    goto fail;
  }
  res = share_add_member(sh, child);
  if (res == ncclSuccess) {
    child->lender = l;
    __atomic_store_n(&child->share, sh, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&sh->members_lock);
  if (res != ncclSuccess) goto fail;
  INFO(BRAID_LOG_INIT,
       "rank %d: %s: the new communicator (%d ranks) borrows the parent's P2P/SHM "
       "connections where both ends find one, and shares its aborts and kernel order",
       parent->rank, what, nmembers);
  return ncclSuccess;
fail:
  if (l) free(l->parent_rank);
  free(l);
  return res;
}

const struct braid_connector* share_lender_conn(const struct ncclComm* comm,
                                                const struct braid_connector* conn, int ring) {
  const struct braid_lender* l = comm->lender;
  if (l == NULL || __atomic_load_n(&comm->share->broken, __ATOMIC_RELAXED)) return NULL;
  const int c = conn->channel, lpeer = l->parent_rank[conn->peer];
  const struct braid_connector* lc;
  if (ring) {
    if (c >= l->ch->nchannels) return NULL;
    lc = conn->is_send ? &l->ch->ring_send[c] : &l->ch->ring_recv[c];
    if (lc->peer != lpeer) return NULL;
  } else {
    lc = (conn->is_send ? l->ch->p2p_send : l->ch->p2p_recv) + (size_t)c * l->nranks + lpeer;
  }
  /* Set once the parent's kernels have the connection (after its upload): the rest is final. */
  if (!__atomic_load_n(&lc->lendable, __ATOMIC_ACQUIRE)) return NULL;
  if (lc->transport != &braid_transport_p2p && lc->transport != &braid_transport_shm) return NULL;
  if (lc->buff_bytes != conn->buff_bytes) return NULL;
  return lc;
}

void share_borrow(const struct ncclComm* comm, struct braid_connector* conn,
                  const struct braid_connector* lc, int ring) {
  const struct braid_lender* l = comm->lender;
  const int c = conn->channel;
  uint64_t* home = lc->borrowed ? lc->step_home : NULL; /* a grandchild: the first lender's */
  if (home == NULL && ring)
    home = conn->is_send ? &l->dev_comm->channels[c].ring_send.step
                         : &l->dev_comm->channels[c].ring_recv.step;
  else if (home == NULL)
    home = &(conn->is_send ? l->dev_p2p_send
                           : l->dev_p2p_recv)[(size_t)c * l->nranks + l->parent_rank[conn->peer]]
                .step;
  conn->transport = lc->transport;
  conn->state = NULL;
  conn->dev = lc->dev;
  conn->dev.step = 0;
  conn->dev.seen_head = 0; /* a cache of the head: any value not above it will do */
  conn->step_home = home;
  conn->borrowed = 1;
}

void share_lock(struct ncclComm* comm) {
  if (comm->share) pthread_mutex_lock(&comm->share->lock);
}

void share_unlock(struct ncclComm* comm) {
  if (comm->share) pthread_mutex_unlock(&comm->share->lock);
}

void share_break(struct ncclComm* comm, const char* why) {
  struct braid_share* sh = __atomic_load_n(&comm->share, __ATOMIC_ACQUIRE);
  char msg[BRAID_ERROR_MAX];
  if (sh == NULL) return;
  pthread_mutex_lock(&sh->members_lock);
  if (sh->nmembers > 1 && !sh->broken) {
    snprintf(msg, sizeof msg,
             "rank %d's communicator %p, which shares connections and aborts with this one "
             "(splitShare), was %s: the shared connections stopped mid-operation",
             comm->rank, (void*)comm, why);
    for (int i = 0; i < sh->nmembers; i++) {
      struct ncclComm* m = sh->members[i];
      if (m == comm) continue;
      __atomic_store_n(m->abort_flag, 1, __ATOMIC_SEQ_CST); /* its kernels leave their waits */
      if (comm_fail_async_why(m, ncclRemoteError, msg)) WARN("rank %d: %s", m->rank, msg);
    }
  }
  __atomic_store_n(&sh->broken, 1, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&sh->members_lock);
}

static void share_grave_free(struct share_grave* g) {
  if (g->ch) channels_release(g->ch, g->nranks);
  for (int i = 0; i < 3; i++)
    if (g->dev[i] && cudaFree(g->dev[i]) != cudaSuccess)
      WARN("cudaFree of a departed communicator's device state failed: %s",
           cudaGetErrorString(cudaGetLastError()));
  free(g);
}

/*
 * Moves what the others may use out of `comm` into a grave: its P2P/SHM connectors (the rest
 * went before), and the device words of their steps.
 * Out of memory: the same pointers are dropped, a leak rather than a free under a borrower.
 */
static void share_bury(struct braid_share* sh, struct ncclComm* comm) {
  struct share_grave* g = calloc(1, sizeof *g);
  struct braid_dev_state* d = comm->dev;
  if (g == NULL)
    WARN(
        "rank %d: out of memory keeping a departed communicator's connections for the others "
        "of its family; they are never freed",
        comm->rank);
  if (g) {
    g->ch = comm->channels;
    g->nranks = comm->nranks;
  }
  comm->channels = NULL;
  if (d && g) {
    g->dev[0] = d->comm;
    g->dev[1] = d->p2p_send;
    g->dev[2] = d->p2p_recv;
  }
  if (d) {
    d->comm = NULL;
    d->p2p_send = d->p2p_recv = NULL;
  }
  if (g) {
    g->next = sh->graves;
    sh->graves = g;
  }
}

struct braid_share* share_leave(struct ncclComm* comm) {
  struct braid_share* sh = comm->share;
  if (comm->lender) free(comm->lender->parent_rank);
  free(comm->lender);
  comm->lender = NULL;
  if (sh == NULL) return NULL;
  /* Not under a lock: a network connection's free may wait seconds for its last sends. */
  if (comm->channels) channels_keep_lendable(comm->channels, comm->nranks);
  pthread_mutex_lock(&sh->members_lock);
  for (int i = 0; i < sh->nmembers; i++) {
    if (sh->members[i] != comm) continue;
    sh->members[i] = sh->members[--sh->nmembers];
    break;
  }
  int last = sh->nmembers == 0;
  if (!last) share_bury(sh, comm);
  pthread_mutex_unlock(&sh->members_lock);
  if (comm->dev) comm->dev->order = NULL;
  __atomic_store_n(&comm->share, NULL, __ATOMIC_RELEASE);
  return last ? sh : NULL;
}

void share_free(struct braid_share* sh) {
  if (sh == NULL) return;
  while (sh->graves) {
    struct share_grave* g = sh->graves;
    sh->graves = g->next;
    share_grave_free(g);
  }
  if (sh->order.last_launch) (void)cudaEventDestroy(sh->order.last_launch);
  (void)cudaGetLastError();
  free(sh->members);
  pthread_mutex_destroy(&sh->lock);
  pthread_mutex_destroy(&sh->members_lock);
  free(sh);
}
