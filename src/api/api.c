/*
 * The collective and point-to-point API: check every argument and say
 * precisely what is wrong, then hand the operation to the group (a call
 * outside ncclGroupStart/End is a group of one). AlltoAll, Gather and
 * Scatter are groups of sends and receives.
 */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include <cuda.h>
#include <cuda_runtime.h>

#include "runtime/comm.h"
#include "base/debug.h"
#include "runtime/enqueue.h"
#include "runtime/group.h"
#include "runtime/p2p_work.h"
#include "runtime/redop.h"
#include "base/utils.h"

#define NCCL_API __attribute__((visibility("default")))
#define NCCL_ALIAS(ret, name, params) NCCL_API ret p##name params __attribute__((alias(#name)));

/* What one API call asks for, before it becomes a braid_op. */
struct api_call {
  const char* api;
  braid_coll_t coll;
  const void* sendbuff;
  void* recvbuff;
  size_t count;
  ncclDataType_t dtype;
  ncclRedOp_t op;
  int root; /* Broadcast, Reduce, Gather, Scatter; peer for Send/Recv */
  ncclComm_t comm;
  cudaStream_t stream;
  int is_send;      /* Send/Recv: which buffer is used */
  void* stage_copy; /* AlltoAll in place: the copy the sends read, freed after launch */
};

/*
 * How much device memory a buffer has behind it. The driver knows each
 * cudaMalloc allocation's extent; a buffer that ends past it would make the
 * kernels read or write someone else's memory (or fault), so the call is
 * refused instead. Memory mapped with cuMemMap (PyTorch's expandable
 * segments) and stream-ordered pool memory are mapped piecewise, back to
 * back, so a short range there proves nothing and is accepted. The driver
 * functions come from the runtime's entry-point query; without them the
 * check is skipped.
 */
typedef CUresult (*api_range_fn)(CUdeviceptr* base, size_t* size, CUdeviceptr ptr);
typedef CUresult (*api_attr_fn)(void* data, CUpointer_attribute attr, CUdeviceptr ptr);
typedef CUresult (*api_retain_fn)(CUmemGenericAllocationHandle* handle, void* addr);
typedef CUresult (*api_release_fn)(CUmemGenericAllocationHandle handle);

static struct {
  pthread_once_t once;
  api_range_fn range;
  api_attr_fn attr;
  api_retain_fn retain;
  api_release_fn release;
} api_drv = {.once = PTHREAD_ONCE_INIT};

static void api_drv_load(void) {
  api_drv.range = (api_range_fn)braid_driver_fn("cuMemGetAddressRange");
  api_drv.attr = (api_attr_fn)braid_driver_fn("cuPointerGetAttribute");
  api_drv.retain = (api_retain_fn)braid_driver_fn("cuMemRetainAllocationHandle");
  api_drv.release = (api_release_fn)braid_driver_fn("cuMemRelease");
}

/* Whether device memory at ptr may continue past its driver range: cuMemMap or pool memory. */
static int api_mapped_piecewise(CUdeviceptr ptr) {
  void* pool = NULL;
  CUmemGenericAllocationHandle handle;
  if (api_drv.attr == NULL || api_drv.retain == NULL || api_drv.release == NULL) return 1;
  if (api_drv.attr(&pool, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, ptr) == CUDA_SUCCESS && pool != NULL)
    return 1;
  if (api_drv.retain(&handle, (void*)(uintptr_t)ptr) == CUDA_SUCCESS) {
    (void)api_drv.release(handle);
    return 1;
  }
  return 0;
}

/*
 * Allocations this thread's calls passed recently, so that a buffer used
 * again costs one driver query instead of two (cudaPointerGetAttributes and
 * the range query take ~150 and ~90 ns each on an H100, per buffer, per
 * call). The cache only ever accepts: a buffer it does not cover is checked
 * afresh, so a refusal always comes from the driver. An entry is trusted only
 * while the address still belongs to the same allocation (its buffer id, which
 * the driver never gives twice in a process): after a cudaFree the same
 * addresses may come back as memory of another GPU (seen on two H100s: a
 * buffer of the other GPU accepted from the cache).
 */
#define API_RANGE_CACHE 8
struct api_range {
  uintptr_t base, end;
  unsigned long long buffer_id;
  int device;
};
static __thread struct api_range api_ranges[API_RANGE_CACHE];
static __thread unsigned api_ranges_next;

/* The driver's id of the allocation holding ptr; 0 when it cannot say. */
static unsigned long long api_buffer_id(uintptr_t ptr) {
  unsigned long long id = 0;
  if (api_drv.attr == NULL ||
      api_drv.attr(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, (CUdeviceptr)ptr) != CUDA_SUCCESS)
    return 0;
  return id;
}

static int api_range_covers(const void* ptr, size_t bytes, int device) {
  uintptr_t p = (uintptr_t)ptr;
  for (int i = 0; i < API_RANGE_CACHE; i++) {
    const struct api_range* r = &api_ranges[i];
    if (r->device == device && r->end != 0 && p >= r->base && p <= r->end && bytes <= r->end - p)
      return api_buffer_id(p) == r->buffer_id;
  }
  return 0;
}

static void api_range_keep(uintptr_t base, size_t size, int device) {
  unsigned long long id = api_buffer_id(base);
  if (id == 0) return;
  api_ranges[api_ranges_next++ % API_RANGE_CACHE] =
      (struct api_range){base, base + size, id, device};
}

/* Device memory of this GPU at ptr: refuses a buffer that ends past its allocation. */
static ncclResult_t api_check_extent(const struct api_call* c, const void* ptr, const char* name,
                                     size_t bytes) {
  CUdeviceptr base = 0, p = (CUdeviceptr)(uintptr_t)ptr;
  size_t size = 0;
  pthread_once(&api_drv.once, api_drv_load);
  if (api_drv.range == NULL || api_drv.range(&base, &size, p) != CUDA_SUCCESS) return ncclSuccess;
  size_t have = (size_t)(base + size - p);
  if (have >= bytes) {
    api_range_keep((uintptr_t)base, size, c->comm->cuda_dev);
    return ncclSuccess;
  }
  if (api_mapped_piecewise(p)) return ncclSuccess;
  return braid_err(ncclInvalidArgument,
                   "%s: %s %p has %zu bytes of its cudaMalloc allocation behind it (the allocation "
                   "is %zu bytes at %p), but %zu bytes are to be %s: count or buffer is wrong",
                   c->api, name, ptr, have, size, (void*)(uintptr_t)base, bytes,
                   strcmp(name, "recvbuff") == 0 ? "written" : "read");
}

/* A buffer the GPU of `comm` must be able to use: device memory of that GPU, managed or pinned
 * host. */
static ncclResult_t api_check_pointer(const struct api_call* c, const void* ptr, const char* name,
                                      size_t bytes) {
  if (bytes == 0) return ncclSuccess;
  if (ptr == NULL)
    return braid_err(ncclInvalidArgument, "%s: %s is NULL but %zu bytes are to be %s", c->api, name,
                     bytes, strcmp(name, "recvbuff") == 0 ? "received" : "sent");
  if (api_range_covers(ptr, bytes, c->comm->cuda_dev)) return ncclSuccess;
  struct cudaPointerAttributes attr;
  cudaError_t err = cudaPointerGetAttributes(&attr, ptr);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return braid_err(ncclInvalidArgument, "%s: %s %p is not memory CUDA knows (%s)", c->api, name,
                     ptr, cudaGetErrorString(err));
  }
  switch (attr.type) {
    case cudaMemoryTypeDevice:
      if (attr.device != c->comm->cuda_dev)
        return braid_err(ncclInvalidArgument,
                         "%s: %s %p is memory of CUDA device %d, but rank %d's communicator uses "
                         "device %d",
                         c->api, name, ptr, attr.device, c->comm->rank, c->comm->cuda_dev);
      return api_check_extent(c, ptr, name, bytes);
    case cudaMemoryTypeManaged:
    case cudaMemoryTypeHost:
      return ncclSuccess;
    default:
      return braid_err(ncclInvalidArgument,
                       "%s: %s %p is host memory not registered with CUDA; the GPU cannot reach "
                       "it (allocate with cudaMalloc, or register with cudaHostRegister)",
                       c->api, name, ptr);
  }
}

static int api_is_reduction(braid_coll_t coll) {
  return coll == BRAID_COLL_ALLREDUCE || coll == BRAID_COLL_REDUCESCATTER ||
         coll == BRAID_COLL_REDUCE;
}

/* Bytes this rank reads from sendbuff and writes to recvbuff; fails on overflow. */
static ncclResult_t api_sizes(const struct api_call* c, size_t* send_bytes, size_t* recv_bytes) {
  size_t esize = redop_type_size(c->dtype);
  size_t n = (size_t)c->comm->nranks;
  int me = c->comm->rank;
  if (c->count > SIZE_MAX / esize / n)
    return braid_err(ncclInvalidArgument, "%s: count %zu of %s overflows the address space", c->api,
                     c->count, redop_type_name(c->dtype));
  size_t bytes = c->count * esize;
  *send_bytes = *recv_bytes = bytes;
  switch (c->coll) {
    case BRAID_COLL_ALLGATHER:
      *recv_bytes = bytes * n;
      break;
    case BRAID_COLL_REDUCESCATTER:
      *send_bytes = bytes * n;
      break;
    case BRAID_COLL_BROADCAST:
      *send_bytes = me == c->root ? bytes : 0;
      break;
    case BRAID_COLL_REDUCE:
      *recv_bytes = me == c->root ? bytes : 0;
      break;
    case BRAID_COLL_SENDRECV:
      if (c->is_send)
        *recv_bytes = 0;
      else
        *send_bytes = 0;
      break;
    default:
      break;
  }
  return ncclSuccess;
}

static ncclResult_t api_check(const struct api_call* c, struct braid_op* op) {
  ncclResult_t res = ncclSuccess;
  size_t send_bytes = 0, recv_bytes = 0;
  BRAID_TRY(comm_check_usable(c->comm, c->api));
  BRAID_CHECK((int)c->dtype >= 0 && c->dtype < ncclNumTypes, ncclInvalidArgument,
              "%s: datatype %d is not an ncclDataType_t (0..%d)", c->api, (int)c->dtype,
              ncclNumTypes - 1);
  memset(op, 0, sizeof *op);
  if (api_is_reduction(c->coll)) {
    BRAID_CHECK((int)c->op >= 0, ncclInvalidArgument, "%s: reduction operator %d is invalid",
                c->api, (int)c->op);
    BRAID_TRY(redop_resolve(c->comm, c->op, c->dtype, &op->devop, &op->scalar, &op->work_flags,
                            c->api));
    op->same_scalar = c->op == ncclAvg;
  }
  if (c->coll == BRAID_COLL_BROADCAST || c->coll == BRAID_COLL_REDUCE ||
      c->coll == BRAID_COLL_SENDRECV)
    BRAID_CHECK(c->root >= 0 && c->root < c->comm->nranks, ncclInvalidArgument,
                "%s: %s %d is out of range [0, %d)", c->api,
                c->coll == BRAID_COLL_SENDRECV ? "peer" : "root", c->root, c->comm->nranks);
  BRAID_TRY(api_sizes(c, &send_bytes, &recv_bytes));
  BRAID_TRY(api_check_pointer(c, c->sendbuff, "sendbuff", send_bytes));
  BRAID_TRY(api_check_pointer(c, c->recvbuff, "recvbuff", recv_bytes));
  op->coll = c->coll;
  op->root = c->root;
  op->dtype = c->dtype;
  op->sendbuff = c->sendbuff;
  op->recvbuff = c->recvbuff;
  op->count = c->count;
  op->stream = c->stream;
  if (c->coll == BRAID_COLL_BROADCAST && c->comm->rank != c->root) op->sendbuff = c->recvbuff;
  return ncclSuccess;
fail:
  return res;
}

/* Ends the implicit group of a call made outside any group. */
static ncclResult_t api_submit(struct ncclComm* comm, const struct braid_op* ops, int nops) {
  ncclResult_t res = group_start();
  for (int i = 0; i < nops && res == ncclSuccess; i++) res = group_op_add(comm, &ops[i]);
  ncclResult_t end = group_end();
  return res != ncclSuccess ? res : end;
}

static ncclResult_t api_fail(const struct api_call* c, ncclResult_t res) {
  if (group_depth() > 0) group_fail(res);
  comm_error_record(c->comm, res);
  return res;
}

static ncclResult_t api_enqueue(const struct api_call* c) {
  struct braid_op op, ops[2];
  braid_err_clear();
  ncclResult_t res = api_check(c, &op);
  /* As NCCL: a collective of no elements is checked, then does nothing (no launch). */
  if (res == ncclSuccess && op.count == 0) return ncclSuccess;
  if (res == ncclSuccess) res = api_submit(c->comm, ops, enqueue_expand(c->comm, &op, ops));
  return res == ncclSuccess ? ncclSuccess : api_fail(c, res);
}

NCCL_API ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                    ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                    cudaStream_t stream) {
  struct api_call c = {.api = "ncclAllReduce",
                       .coll = BRAID_COLL_ALLREDUCE,
                       .sendbuff = sendbuff,
                       .recvbuff = recvbuff,
                       .count = count,
                       .dtype = datatype,
                       .op = op,
                       .root = 0,
                       .comm = comm,
                       .stream = stream};
  return api_enqueue(&c);
}
NCCL_ALIAS(ncclResult_t, ncclAllReduce,
           (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
            ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream))

NCCL_API ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                        ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                        cudaStream_t stream) {
  struct api_call c = {.api = "ncclReduceScatter",
                       .coll = BRAID_COLL_REDUCESCATTER,
                       .sendbuff = sendbuff,
                       .recvbuff = recvbuff,
                       .count = recvcount,
                       .dtype = datatype,
                       .op = op,
                       .root = 0,
                       .comm = comm,
                       .stream = stream};
  return api_enqueue(&c);
}
NCCL_ALIAS(ncclResult_t, ncclReduceScatter,
           (const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
            ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream))

NCCL_API ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                    ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  struct api_call c = {.api = "ncclAllGather",
                       .coll = BRAID_COLL_ALLGATHER,
                       .sendbuff = sendbuff,
                       .recvbuff = recvbuff,
                       .count = sendcount,
                       .dtype = datatype,
                       .op = ncclSum,
                       .root = 0,
                       .comm = comm,
                       .stream = stream};
  return api_enqueue(&c);
}
NCCL_ALIAS(ncclResult_t, ncclAllGather,
           (const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
            ncclComm_t comm, cudaStream_t stream))

NCCL_API ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                                    ncclDataType_t datatype, int root, ncclComm_t comm,
                                    cudaStream_t stream) {
  struct api_call c = {.api = "ncclBroadcast",
                       .coll = BRAID_COLL_BROADCAST,
                       .sendbuff = sendbuff,
                       .recvbuff = recvbuff,
                       .count = count,
                       .dtype = datatype,
                       .op = ncclSum,
                       .root = root,
                       .comm = comm,
                       .stream = stream};
  return api_enqueue(&c);
}
NCCL_ALIAS(ncclResult_t, ncclBroadcast,
           (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
            ncclComm_t comm, cudaStream_t stream))

NCCL_API ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root,
                                ncclComm_t comm, cudaStream_t stream) {
  struct api_call c = {.api = "ncclBcast",
                       .coll = BRAID_COLL_BROADCAST,
                       .sendbuff = buff,
                       .recvbuff = buff,
                       .count = count,
                       .dtype = datatype,
                       .op = ncclSum,
                       .root = root,
                       .comm = comm,
                       .stream = stream};
  return api_enqueue(&c);
}
NCCL_ALIAS(ncclResult_t, ncclBcast,
           (void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
            cudaStream_t stream))

NCCL_API ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count,
                                 ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                                 cudaStream_t stream) {
  struct api_call c = {.api = "ncclReduce",
                       .coll = BRAID_COLL_REDUCE,
                       .sendbuff = sendbuff,
                       .recvbuff = recvbuff,
                       .count = count,
                       .dtype = datatype,
                       .op = op,
                       .root = root,
                       .comm = comm,
                       .stream = stream};
  return api_enqueue(&c);
}
NCCL_ALIAS(ncclResult_t, ncclReduce,
           (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
            ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream))

/* ---- point to point ---------------------------------------------------------------------- */

static ncclResult_t api_p2p(const char* api, int is_send, const void* sendbuff, void* recvbuff,
                            size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                            cudaStream_t stream) {
  struct api_call c = {.api = api,
                       .coll = BRAID_COLL_SENDRECV,
                       .sendbuff = is_send ? sendbuff : NULL,
                       .recvbuff = is_send ? NULL : recvbuff,
                       .count = count,
                       .dtype = datatype,
                       .op = ncclSum,
                       .root = peer,
                       .comm = comm,
                       .stream = stream,
                       .is_send = is_send};
  struct braid_op op;
  braid_err_clear();
  ncclResult_t res = api_check(&c, &op);
  if (res == ncclSuccess) {
    op.is_send = is_send;
    op.peer = peer;
    res = api_submit(comm, &op, 1);
  }
  return res == ncclSuccess ? ncclSuccess : api_fail(&c, res);
}

NCCL_API ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype,
                               int peer, ncclComm_t comm, cudaStream_t stream) {
  return api_p2p("ncclSend", 1, sendbuff, NULL, count, datatype, peer, comm, stream);
}
NCCL_ALIAS(ncclResult_t, ncclSend,
           (const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
            cudaStream_t stream))

NCCL_API ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                               ncclComm_t comm, cudaStream_t stream) {
  return api_p2p("ncclRecv", 0, NULL, recvbuff, count, datatype, peer, comm, stream);
}
NCCL_ALIAS(ncclResult_t, ncclRecv,
           (void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
            cudaStream_t stream))

/* Which ranks a rank exchanges with in AlltoAll, Gather and Scatter. */
typedef enum { PEERS_NONE = 0, PEERS_ROOT = 1, PEERS_ALL = 2 } api_peers_t;

static int api_peers_count(api_peers_t p, int n) { return p == PEERS_ALL ? n : (p == PEERS_ROOT); }

/* Adds the sends (is_send) or receives of one side of a p2p collective to the open group. */
static ncclResult_t api_p2p_side(const struct api_call* c, api_peers_t peers, int is_send,
                                 size_t bytes, int uniform, int skip_self) {
  ncclResult_t res = ncclSuccess;
  struct braid_op op;
  memset(&op, 0, sizeof op);
  op.coll = BRAID_COLL_SENDRECV;
  op.uniform = uniform;
  op.dtype = c->dtype;
  op.count = c->count;
  op.stream = c->stream;
  op.is_send = is_send;
  /* The first send carries the staging copy, so enqueue frees it once after the launch. */
  if (is_send) op.scratch = c->stage_copy;
  for (int r = 0; r < c->comm->nranks && res == ncclSuccess; r++) {
    if (peers == PEERS_NONE || (peers == PEERS_ROOT && r != c->root)) continue;
    if (skip_self && r == c->comm->rank) continue;
    size_t offset = peers == PEERS_ALL ? (size_t)r * bytes : 0;
    op.peer = r;
    if (is_send)
      op.sendbuff = (const char*)c->sendbuff + offset;
    else
      op.recvbuff = (char*)c->recvbuff + offset;
    res = group_op_add(c->comm, &op);
    if (res != ncclSuccess && op.scratch) { /* no op took the staging copy: it goes now */
      int dev = -1;
      (void)cudaGetDevice(&dev);
      if (cudaSetDevice(c->comm->cuda_dev) != cudaSuccess ||
          cudaFreeAsync(op.scratch, c->stream) != cudaSuccess)
        (void)cudaGetLastError();
      if (dev >= 0) (void)cudaSetDevice(dev);
    }
    op.scratch = NULL;
  }
  return res;
}

/*
 * In-place all-to-all: block j of the buffer is sent to rank j while rank
 * j's data arrives into the same block. Where the send to j and the receive
 * from j run in one work, the kernel orders them (sendrecv.h) and nothing is
 * needed here (api_alltoall_kernel_orders). Otherwise (odd counts of ranks;
 * two ranks whose group is unbalanced before the call) the sends read from a
 * copy taken first, in stream order. The copy is a stream-ordered
 * allocation released right behind the kernel (enqueue frees `scratch` after
 * the launch). A rank's own block is where it belongs already: it is not
 * copied (where that takes no second copy, or the block is large:
 * API_STAGE_SPLIT_MIN), and in place its self send/receive is left out
 * (api_p2p_collective).
 */
#define API_STAGE_SPLIT_MIN ((size_t)4 << 20)

/*
 * Whether an in-place all-to-all needs no staging copy: its send to and receive from each
 * peer then run in one work that orders them. So in the pairwise rounds of an even count of
 * four or more (enqueue.c); on two ranks in the one round, which pairs the i-th send to the
 * peer with the i-th receive, unless the group already holds more sends to the peer than
 * receives from it, or fewer (this call's two would not be the same i-th). Two ranks' copy-
 * engine exchange orders a pair in place itself (ce.c).
 */
static int api_alltoall_kernel_orders(const struct ncclComm* comm) {
  if (p2p_alltoall_pairwise(comm->nranks)) return 1;
  if (comm->nranks != 2) return 0;
  int balance = 0;
  const struct braid_group_comm* g = comm->group;
  for (int i = 0; g && i < g->nops; i++) {
    const struct braid_op* op = &g->ops[i];
    if (op->coll == BRAID_COLL_SENDRECV && op->peer != comm->rank) balance += op->is_send ? 1 : -1;
  }
  return balance == 0;
}

static ncclResult_t api_p2p_stage_in_place(const struct api_call* c, api_peers_t sends,
                                           api_peers_t recvs, size_t bytes,
                                           struct api_call* staged) {
  ncclResult_t res = ncclSuccess;
  size_t total = bytes * (size_t)c->comm->nranks;
  void* copy = NULL;
  int saved_dev = -1;
  staged->stage_copy = NULL;
  if (sends != PEERS_ALL || recvs != PEERS_ALL || c->comm->nranks == 1 || bytes == 0 ||
      c->sendbuff != c->recvbuff || api_alltoall_kernel_orders(c->comm))
    return ncclSuccess;
  /* The caller's current device may be another GPU (one thread driving several). */
  BRAID_CUDA_TRY(cudaGetDevice(&saved_dev));
  BRAID_CUDA_TRY(cudaSetDevice(c->comm->cuda_dev));
  BRAID_CUDA_TRY(cudaMallocAsync(&copy, total, c->stream));
  const size_t below = bytes * (size_t)c->comm->rank, above = total - below - bytes;
  if (below > 0 && above > 0 && bytes < API_STAGE_SPLIT_MIN) { /* one copy, own block too */
    BRAID_CUDA_TRY(cudaMemcpyAsync(copy, c->sendbuff, total, cudaMemcpyDeviceToDevice, c->stream));
  } else {
    if (below > 0)
      BRAID_CUDA_TRY(
          cudaMemcpyAsync(copy, c->sendbuff, below, cudaMemcpyDeviceToDevice, c->stream));
    if (above > 0)
      BRAID_CUDA_TRY(cudaMemcpyAsync((char*)copy + below + bytes,
                                     (const char*)c->sendbuff + below + bytes, above,
                                     cudaMemcpyDeviceToDevice, c->stream));
  }
  staged->sendbuff = copy;
  staged->stage_copy = copy;
  BRAID_CUDA_TRY(cudaSetDevice(saved_dev));
  return ncclSuccess;
fail:
  if (copy) cudaFreeAsync(copy, c->stream);
  if (saved_dev >= 0) cudaSetDevice(saved_dev);
  return res;
}

/* AlltoAll, Gather and Scatter: one group of sends and receives. */
static ncclResult_t api_p2p_collective(const struct api_call* c, api_peers_t sends,
                                       api_peers_t recvs) {
  ncclResult_t res = ncclSuccess;
  struct api_call staged = *c;
  size_t bytes;
  int n;
  braid_err_clear();
  BRAID_TRY(comm_check_usable(c->comm, c->api));
  n = c->comm->nranks;
  BRAID_CHECK((int)c->dtype >= 0 && c->dtype < ncclNumTypes, ncclInvalidArgument,
              "%s: datatype %d is not an ncclDataType_t", c->api, (int)c->dtype);
  BRAID_CHECK((sends != PEERS_ROOT && recvs != PEERS_ROOT) || (c->root >= 0 && c->root < n),
              ncclInvalidArgument, "%s: root %d is out of range [0, %d)", c->api, c->root, n);
  BRAID_CHECK(c->count <= SIZE_MAX / redop_type_size(c->dtype) / (size_t)n, ncclInvalidArgument,
              "%s: count %zu overflows the address space", c->api, c->count);
  bytes = c->count * redop_type_size(c->dtype);
  BRAID_TRY(api_check_pointer(c, c->sendbuff, "sendbuff", bytes * api_peers_count(sends, n)));
  BRAID_TRY(api_check_pointer(c, c->recvbuff, "recvbuff", bytes * api_peers_count(recvs, n)));
  /* Every rank passes the same count: with none, no rank sends or waits for anything. */
  if (bytes == 0) return ncclSuccess;
  BRAID_TRY(group_start());
  res = api_p2p_stage_in_place(c, sends, recvs, bytes, &staged);
  /* AlltoAll: every rank sends every rank the same bytes (p2p_work.c places them so). */
  const int uniform = sends == PEERS_ALL && recvs == PEERS_ALL;
  /* In place: a rank's own block stays where it is, with no self send/receive. */
  const int skip_self = uniform && c->sendbuff == c->recvbuff;
  if (res == ncclSuccess) res = api_p2p_side(&staged, sends, 1, bytes, uniform, skip_self);
  if (res == ncclSuccess) res = api_p2p_side(c, recvs, 0, bytes, uniform, skip_self);
  if (res != ncclSuccess) group_fail(res);
  ncclResult_t end = group_end();
  if (res == ncclSuccess) res = end;
  if (res != ncclSuccess) goto fail;
  return ncclSuccess;
fail:
  return api_fail(c, res);
}

/* Whether the caller is `root` of a valid communicator (a bad comm is reported later). */
static int api_is_root(ncclComm_t comm, int root) {
  return comm_is_live(comm) && comm->rank == root;
}

NCCL_API ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                                   ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  struct api_call c = {.api = "ncclAlltoAll",
                       .coll = BRAID_COLL_SENDRECV,
                       .sendbuff = sendbuff,
                       .recvbuff = recvbuff,
                       .count = count,
                       .dtype = datatype,
                       .op = ncclSum,
                       .root = 0,
                       .comm = comm,
                       .stream = stream};
  return api_p2p_collective(&c, PEERS_ALL, PEERS_ALL);
}
NCCL_ALIAS(ncclResult_t, ncclAlltoAll,
           (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
            ncclComm_t comm, cudaStream_t stream))

NCCL_API ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t count,
                                 ncclDataType_t datatype, int root, ncclComm_t comm,
                                 cudaStream_t stream) {
  struct api_call c = {.api = "ncclGather",
                       .coll = BRAID_COLL_SENDRECV,
                       .sendbuff = sendbuff,
                       .recvbuff = recvbuff,
                       .count = count,
                       .dtype = datatype,
                       .op = ncclSum,
                       .root = root,
                       .comm = comm,
                       .stream = stream};
  return api_p2p_collective(&c, PEERS_ROOT, api_is_root(comm, root) ? PEERS_ALL : PEERS_NONE);
}
NCCL_ALIAS(ncclResult_t, ncclGather,
           (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
            ncclComm_t comm, cudaStream_t stream))

NCCL_API ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t count,
                                  ncclDataType_t datatype, int root, ncclComm_t comm,
                                  cudaStream_t stream) {
  struct api_call c = {.api = "ncclScatter",
                       .coll = BRAID_COLL_SENDRECV,
                       .sendbuff = sendbuff,
                       .recvbuff = recvbuff,
                       .count = count,
                       .dtype = datatype,
                       .op = ncclSum,
                       .root = root,
                       .comm = comm,
                       .stream = stream};
  return api_p2p_collective(&c, api_is_root(comm, root) ? PEERS_ALL : PEERS_NONE, PEERS_ROOT);
}
NCCL_ALIAS(ncclResult_t, ncclScatter,
           (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
            ncclComm_t comm, cudaStream_t stream))
