/*
 * The order of a communicator's launches (launch_order.h says how it goes).
 */
#include "runtime/launch_order.h"

#include <stdint.h>
#include <string.h>

#include <cuda_runtime.h>

#include "base/error.h"
#include "base/param.h"
#include "runtime/comm.h"
#include "runtime/dev_state.h"

/* This comm's state of capture `cap_id` (capture ids start at 1), or NULL. */
static struct braid_capture* enq_capture_find(struct braid_launch_order* ord,
                                              unsigned long long cap_id) {
  if (cap_id == 0) return NULL;
  for (int i = 0; i < BRAID_CAPTURES; i++)
    if (ord->captures[i].cap_id == cap_id) return &ord->captures[i];
  return NULL;
}

ncclResult_t enq_order_wait(struct ncclComm* comm, cudaStream_t stream, int capturing,
                            struct enq_order* o) {
  ncclResult_t res = ncclSuccess;
  struct braid_launch_order* ord = comm->dev->order;
  enum cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  o->capturing = capturing;
  o->cap_id = 0;
  o->cap = NULL;
  if (!capturing) {
    BRAID_TRY(dev_state_stream_id(stream, &o->stream_id));
    if (ord->graphs_ordered || (ord->launched && ord->last_stream_id != o->stream_id))
      BRAID_CUDA_TRY(cudaStreamWaitEvent(stream, ord->last_launch, 0));
    return ncclSuccess;
  }
  /* cudaStreamGetId is refused while capturing; a capture's streams live as long as it. */
  o->stream_id = (unsigned long long)(uintptr_t)stream;
  BRAID_CUDA_TRY(cudaStreamGetCaptureInfo(stream, &status, &o->cap_id, NULL, NULL, NULL, NULL));
  o->cap = enq_capture_find(ord, o->cap_id);
  if (o->cap != NULL && o->cap->last != NULL && o->cap->stream != stream)
    BRAID_CUDA_TRY(cudaStreamUpdateCaptureDependencies(stream, &o->cap->last, NULL, 1,
                                                       cudaStreamAddCaptureDependencies));
  /* Once per capture: what follows in it is ordered after its first kernel. */
  if (o->cap == NULL && braid_param_int(BRAID_P_GRAPH_MIXING_SUPPORT) != 0)
    BRAID_CUDA_TRY(cudaStreamWaitEvent(stream, ord->last_launch, cudaEventWaitExternal));
  return ncclSuccess;
fail:
  return res;
}

/*
 * After a captured kernel: it becomes its capture's last (a new capture takes the slot of the
 * one least recently begun). Graph mixing: the replay records last_launch once, after the
 * capture's last kernel of this comm. The capture's one record node hangs off that kernel,
 * outside the capture's chain (the next kernel does not wait for it), its edge moved to each
 * new kernel (graph edges may change while capturing; nodes may not go).
 */
static ncclResult_t enq_order_capture(struct ncclComm* comm, cudaStream_t stream,
                                      const struct enq_order* o) {
  ncclResult_t res = ncclSuccess;
  struct braid_launch_order* ord = comm->dev->order;
  enum cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cudaGraph_t graph = NULL;
  const cudaGraphNode_t* deps = NULL;
  size_t ndeps = 0;
  BRAID_CUDA_TRY(cudaStreamGetCaptureInfo(stream, &status, NULL, &graph, &deps, NULL, &ndeps));
  /* One node: the kernel just captured (a launch leaves its stream depending on it alone). */
  cudaGraphNode_t kernel = ndeps == 1 ? deps[0] : NULL;
  struct braid_capture* c = o->cap;
  if (c == NULL) {
    c = &ord->captures[ord->captures_next++ % BRAID_CAPTURES];
    memset(c, 0, sizeof *c);
    c->cap_id = o->cap_id;
  }
  if (braid_param_int(BRAID_P_GRAPH_MIXING_SUPPORT) != 0) {
    if (c->record == NULL) {
      BRAID_CUDA_TRY(cudaGraphAddEventRecordNode(&c->record, graph, deps, ndeps, ord->last_launch));
    } else {
      for (size_t i = 0; i < ndeps; i++)
        BRAID_CUDA_TRY(cudaGraphAddDependencies(graph, &deps[i], &c->record, NULL, 1));
      /*
       * This kernel depends on the one before (enq_order_wait): that edge says nothing. A graph
       * with memory nodes (in-place all-to-all's stream-ordered staging) refuses to lose an
       * edge (cudaErrorNotSupported): there it stays, redundant.
       */
      if (c->last != NULL && kernel != NULL) {
        cudaError_t e = cudaGraphRemoveDependencies(graph, &c->last, &c->record, NULL, 1);
        if (e == cudaErrorNotSupported)
          (void)cudaGetLastError();
        else
          BRAID_CUDA_TRY(e);
      }
    }
    ord->graphs_ordered = 1;
  }
  c->last = kernel;
  c->stream = stream;
  return ncclSuccess;
fail:
  return res;
}

ncclResult_t enq_order_record(struct ncclComm* comm, cudaStream_t stream,
                              const struct enq_order* o) {
  ncclResult_t res = ncclSuccess;
  struct braid_launch_order* ord = comm->dev->order;
  if (o->capturing) return enq_order_capture(comm, stream, o);
  BRAID_TRY(dev_state_record(ord->last_launch, stream));
  ord->last_stream_id = o->stream_id;
  ord->launched = 1;
  ord->records++;
  return ncclSuccess;
fail:
  return res;
}
