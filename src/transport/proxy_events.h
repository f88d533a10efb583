/*
 * What the network proxy reports to a profiler: an ops table the runtime
 * fills (runtime/profiler.c) and hands the transports through struct
 * braid_transport_comm, so that the proxy emits events without knowing of
 * communicators or plugins. A connection whose `events` is NULL (no
 * profiler, the default) costs one branch per progress call.
 *
 * The proxy knows steps, not collectives, so its operations are runs of
 * steps on one connection:
 *   send end     an operation opens at the first isend after the
 *                connection was idle and closes when every step the kernel
 *                filled has been sent and acknowledged; a step lasts from
 *                its isend to its completion.
 *   receive end  an operation opens when a receive completes while none is
 *                open and closes when the kernel has read every step
 *                delivered to it (its head caught up) and no receive has
 *                completed since; a step lasts from its arrival to its
 *                release to the kernel (through the flush, if any).
 * Every slot is called from the proxy thread, except that proxy_conn_remove
 * closes what is still open from the removing thread, once the proxy thread
 * has let go of the connection.
 */
#ifndef BRAID_TRANSPORT_PROXY_EVENTS_H
#define BRAID_TRANSPORT_PROXY_EVENTS_H

#include <stddef.h>

/* The state a step reaches (the profiler names it in NCCL's terms). */
typedef enum {
  BRAID_PROXY_STEP_SEND_WAIT = 0,  /* isent, waiting for the network */
  BRAID_PROXY_STEP_RECV_FLUSH = 1, /* arrived, its flush to GPU memory under way */
  BRAID_PROXY_STEP_RECV_GPU = 2    /* released: the kernel may read it */
} braid_proxy_step_state_t;

struct braid_proxy_events {
  /*
   * Opens an operation on the connection of `ctx` with `peer` on `channel`; `nsteps` are the
   * steps known to be in it when it opens, `chunk_bytes` a slot's size. Returns its handle,
   * or NULL when it is not recorded (then no step of it is either).
   */
  void* (*op_start)(void* ctx, int is_send, int peer, int channel, int nsteps, int chunk_bytes);
  /* Closes an operation op_start returned. */
  void (*op_stop)(void* ctx, void* op);
  /* Starts step `step` (counted from 0 for the connection's life) of `op`; NULL: not recorded. */
  void* (*step_start)(void* ctx, void* op, int step);
  /* The step reached `state`; `bytes` are those it carries. */
  void (*step_state)(void* ctx, void* step, braid_proxy_step_state_t state, size_t bytes);
  /* Ends a step step_start returned. */
  void (*step_stop)(void* ctx, void* step);
};

#endif
