/*
 * The device side of a communicator: the braid_dev_comm the kernels read
 * (channels, rings, connections), the send/recv connection arrays, the
 * internal stream used for uploads, and the event that orders this
 * communicator's kernels across the user's streams. Owned by comm->dev.
 */
#ifndef BRAID_CORE_DEV_STATE_H
#define BRAID_CORE_DEV_STATE_H

#include <cuda.h>
#include <cuda_runtime.h>

#include "abi/dev_comm.h"
#include "abi/kernel_table.h"
#include "nccl.h"

struct ncclComm;
struct launch_plan; /* enqueue.c */

#define BRAID_CAPTURES 32 /* captures of one comm tracked at once (its kernels' order in each) */

/*
 * The order of a family's kernels (runtime/share.c: a communicator, and the children it shares
 * its connections with): one event recorded after each kernel of any of them, which the next
 * launch waits for when it goes to another stream (and always once graphs are involved).
 */
struct braid_launch_order {
  cudaEvent_t last_launch;           /* recorded after each kernel of the family (and in
                                        graphs, as it replays: graph mixing) */
  unsigned long long last_stream_id; /* where the last kernel went (cudaStreamGetId: a handle
                                        may be reused by a new stream, an id is not) */
  int launched;                      /* a kernel was launched since the last wait */
  uint64_t records;                  /* eager records of last_launch so far: a wait clears
                                        `launched` only if none came after the one it saw */
  /* A captured kernel records last_launch in its graph (graph mixing): a replay may be the
     latest record, so eager launches always wait, and idle/drain always query. */
  int graphs_ordered;
  /*
   * Captures with a kernel of the family (in progress, or ended: capture ids are never reused):
   * the capture's last kernel node, which its next kernel depends on whatever stream it goes
   * to, and (graph mixing) its record node. The least recently begun slot goes to a new
   * capture: past BRAID_CAPTURES open at once, order is lost.
   */
  struct braid_capture {
    unsigned long long cap_id; /* 0: free */
    cudaStream_t stream;       /* where `last` was captured */
    cudaGraphNode_t last;      /* the last kernel node, or NULL (not known) */
    cudaGraphNode_t record;    /* graph mixing: the record node, hanging off `last` */
  } captures[BRAID_CAPTURES];
  unsigned captures_next;
};

struct braid_dev_state {
  struct braid_dev_comm host;      /* the host's copy of what was uploaded */
  struct braid_dev_comm* comm;     /* device copy */
  struct braid_dev_conn* p2p_send; /* device [BRAID_MAX_CHANNELS * nranks] */
  struct braid_dev_conn* p2p_recv;
  int* ring_ranks;     /* device [nchannels * nranks] */
  cudaStream_t stream; /* internal, non-blocking: uploads only */
  /* The kernels as the driver launches them (this comm's device), by family, type, operator. */
  CUfunction kernels[BRAID_KERNEL_FAMILIES][ncclNumTypes][BRAID_DEVOP_COUNT];
  CUfunction copy_kernels[BRAID_KERNEL_FAMILIES]; /* braid_copy_kernel_table's; NULL: none */
  struct braid_launch_order* order;  /* the family's (comm->share) */
  int nthreads;                      /* threads per block */
  int small_nthreads;                /* of a launch of small LL works alone (0: nthreads) */
  /* Launch attributes (Hopper on, dev_state.c): blocks per cluster (0: none), the remote
     memory sync domain, NVLink-centric scheduling. */
  unsigned cluster;
  unsigned cluster_rs; /* the same for launches of reduce-scatters alone */
  int sync_domain_remote;
  int nvlink_centric;
  /* splitShare: the borrowed connections' step words (dev_comm.h), device; NULL: none yet. */
  struct braid_borrows* borrows;
  uint32_t borrows_count[BRAID_MAX_CHANNELS]; /* the host's copy of its counts */
  uint32_t borrows_per_channel;
  struct launch_plan* plan; /* enqueue.c's, made at the first launch and reused */
  size_t dev_bytes; /* device memory allocated above (comm, p2p_send/recv, ring_ranks, borrows) */
  int stuck;        /* a drain timed out: kernels may run on, nothing of theirs may be freed */
};

/* Uploads rings and ring connections (after channels_rings_connect) and loads the kernels. */
ncclResult_t dev_state_create(struct ncclComm* comm);
/* cudaEventRecord and cudaStreamGetId through the driver (the launch order's per-call calls). */
ncclResult_t dev_state_record(cudaEvent_t event, cudaStream_t stream);
ncclResult_t dev_state_stream_id(cudaStream_t stream, unsigned long long* id);
/* cudaStreamIsCapturing, straight to the driver (the current context must be the comm's). */
ncclResult_t dev_state_stream_capturing(cudaStream_t stream, enum cudaStreamCaptureStatus* status);
/* 1 when `stream` is known not to be capturing; 0 when it is or the query fails (said nowhere). */
int dev_state_stream_eager(cudaStream_t stream);
/*
 * Launches family/dtype/devop's kernel, or with dtype DEV_COPY_KERNEL the
 * family's copy kernel (byte-moving works only), on `grid` blocks with the
 * works of `args`, passing only the bytes of the works in use (a launch costs
 * more the more argument bytes it copies). `small`: every work fits
 * small_nthreads threads (enqueue.c), which the blocks then have unless a
 * borrowing block needs more (one borrowed pair a thread).
 */
#define DEV_COPY_KERNEL (-1)
ncclResult_t dev_state_launch(struct ncclComm* comm, int family, int dtype, int devop, int grid,
                              int small, struct braid_kernel_args* args, cudaStream_t stream);
/* Uploads one newly connected send/recv connection. */
ncclResult_t dev_state_upload_p2p(struct ncclComm* comm, int channel, int peer, int is_send,
                                  const struct braid_dev_conn* conn);
/*
 * After the upload of a borrowed end (`home`: the lender's step word; `ring`: a ring end, else
 * send/recv): the comm's kernels take its step from there as they start and put it back as
 * they end (dev_comm.h: struct braid_borrows).
 */
ncclResult_t dev_state_borrowed(struct ncclComm* comm, int channel, int peer, int is_send, int ring,
                                uint64_t* home);
/*
 * Blocks until every kernel this comm's family launched has finished. If the abort flag goes
 * up meanwhile: waits (bounded, as dev_state_drain) for the kernels to leave, then
 * ncclRemoteError.
 */
ncclResult_t dev_state_wait_idle(struct ncclComm* comm);
/*
 * With the abort flag raised: waits up to `timeout_s` for the kernels to
 * notice it and exit, so their buffers can go. ncclInternalError (naming the
 * wait) if they have not exited by then; the state is then marked stuck
 * (dev_state_stuck) for good.
 */
ncclResult_t dev_state_drain(struct ncclComm* comm, double timeout_s);
/* Whether a drain of this comm timed out: its teardown must keep what the kernels touch. */
int dev_state_stuck(const struct ncclComm* comm);
/*
 * dev_state_free for a stuck state: frees the host side only, calls nothing that waits for the
 * device (the device memory and the upload stream are kept, never freed), and adds the device
 * bytes kept to *kept.
 */
void dev_state_keep(struct ncclComm* comm, size_t* kept);
/* Whether every kernel launched so far has finished (never blocks). */
int dev_state_idle(struct ncclComm* comm);
void dev_state_free(struct ncclComm* comm);

#endif
