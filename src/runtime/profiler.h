/*
 * NCCL profiler plugins (NCCL_PROFILER_PLUGIN): the library, one instance
 * per communicator, and the events Braid gives it. The library belongs to
 * the process (loaded with the first communicator that finds one, closed
 * with the last); each communicator's instance is the plugin's init,
 * context and finalize. The event mask is the process's, as in NCCL: every
 * init gets the same int, NCCL_PROFILE_EVENT_MASK before the first.
 *
 * Events (each only when its bit is in the mask after init):
 *   group       one per communicator per launch (ncclGroupEnd, or a call
 *               outside a group): started before its operations are
 *               planned, stopped once they are all on the stream
 *   collective  one per collective call, its parent the group: name,
 *               sequence number (per collective, per communicator), count,
 *               type, root, the algorithm, protocol and channels chosen
 *   p2p         one per send or receive, its parent the group
 *   proxy op,   from the network proxy (transport/proxy_events.h), without
 *   proxy step  a parent: the proxy knows steps, not collectives
 * Collective and p2p events stop when the launch is enqueued, not when the
 * GPU finishes (NCCL's do likewise; the plugin keeps its own counts). API
 * events (GroupApi, CollApi, P2pApi, KernelLaunch), proxy control events
 * and kernel-channel events are not emitted.
 *
 * Failures of the plugin (a missing library, no known version, a failed
 * init, an event it refuses) are logged and never fail a call.
 */
#ifndef BRAID_RUNTIME_PROFILER_H
#define BRAID_RUNTIME_PROFILER_H

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"
#include "transport/proxy_events.h"

struct braid_profiler;

struct braid_profiler_args {
  uint64_t comm_hash;
  const char* comm_name; /* the config's commName, or NULL */
  int nnodes, nranks, rank;
  const char* net_lib;   /* the loaded net plugin's library, searched when no profiler is found */
};

/* One collective or send/receive, as the launch knows it. */
struct braid_profiler_task {
  int coll;               /* braid_coll_t (BRAID_COLL_SENDRECV: a send or receive) */
  int is_send;            /* send/receive: 1 send, 0 receive */
  const void* sendbuff;
  void* recvbuff;
  size_t count;
  int root;               /* collectives; -1 where none */
  int peer;               /* send/receive */
  ncclDataType_t dtype;
  int algo, proto;        /* braid_algo_t / braid_proto_t chosen, -1: none (nothing to move) */
  int nchannels, nwarps;
};

/*
 * The communicator's instance, or NULL: no profiler (the default, or any failure, which is
 * logged here). Never fails.
 */
struct braid_profiler* profiler_open(const struct braid_profiler_args* args);
/* Finalizes the instance (NULL: nothing) and lets go of the library with the last one. */
void profiler_close(struct braid_profiler* p);
/* Whether any of the event bits `types` (PROF_EV_*) is on. */
int profiler_wants(const struct braid_profiler* p, int types);

/* A group event; its handle, or NULL (not recorded). */
void* profiler_group_start(struct braid_profiler* p);
/* A collective or send/receive event under `group` (may be NULL); its handle, or NULL. */
void* profiler_task_start(struct braid_profiler* p, void* group,
                          const struct braid_profiler_task* t);
/* Stops an event a start above returned (NULL: nothing). */
void profiler_event_stop(struct braid_profiler* p, void* handle);

/* The network proxy's sink; its ctx is the struct braid_profiler*. */
extern const struct braid_proxy_events profiler_proxy_events;

/* The library's label ("'name' (v5) from path"), or NULL when none is loaded; for tests. */
const char* profiler_loaded(void);

#endif
