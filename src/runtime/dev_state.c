/*
 * Device state of a communicator: allocation, uploads, and waiting for the
 * kernels. Uploads go through the comm's own non-blocking stream so they
 * never wait for (or order against) the user's legacy default stream.
 */
#include "runtime/dev_state.h"

#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "abi/kernel_table.h"
#include "runtime/comm.h"
#include "base/debug.h"
#include "base/param.h"
#include "runtime/share.h"
#include "base/utils.h"
#include "runtime/topo_comm.h"
#include "runtime/channels.h"

static const void* const* const* const dev_tables[BRAID_KERNEL_FAMILIES] = {
    [BRAID_KERNELS_RING] = braid_kernel_table,
    [BRAID_KERNELS_TREE] = braid_tree_kernel_table,
    [BRAID_KERNELS_LL128] = braid_ll128_kernel_table};

typedef CUresult (*dev_launch_fn)(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                  unsigned by, unsigned bz, unsigned shmem, CUstream stream,
                                  void** params, void** extra);
typedef CUresult (*dev_launch_ex_fn)(const CUlaunchConfig* config, CUfunction f, void** params,
                                     void** extra);
typedef CUresult (*dev_error_name_fn)(CUresult err, const char** name);
typedef CUresult (*dev_event_record_fn)(CUevent event, CUstream stream);
typedef CUresult (*dev_stream_id_fn)(CUstream stream, unsigned long long* id);
typedef CUresult (*dev_stream_capturing_fn)(CUstream stream, CUstreamCaptureStatus* status);

/* The driver's launch calls, reached through the runtime (Braid does not link libcuda). */
static struct {
  pthread_once_t once;
  dev_launch_fn launch;
  dev_launch_ex_fn launch_ex; /* with attributes (CUDA 12.0 on): NULL where absent */
  dev_error_name_fn error_name;
  dev_event_record_fn event_record; /* NULL where absent: the runtime's then */
  dev_stream_id_fn stream_id;
  dev_stream_capturing_fn stream_capturing;
} dev_drv = {.once = PTHREAD_ONCE_INIT};

static void dev_drv_load(void) {
  dev_drv.launch = (dev_launch_fn)braid_driver_fn("cuLaunchKernel");
  dev_drv.launch_ex = (dev_launch_ex_fn)braid_driver_fn("cuLaunchKernelEx");
  dev_drv.error_name = (dev_error_name_fn)braid_driver_fn("cuGetErrorName");
  dev_drv.event_record = (dev_event_record_fn)braid_driver_fn("cuEventRecord");
  dev_drv.stream_id = (dev_stream_id_fn)braid_driver_fn("cuStreamGetId");
  dev_drv.stream_capturing = (dev_stream_capturing_fn)braid_driver_fn("cuStreamIsCapturing");
}

/* A driver call's result as Braid's (its name from the driver where it can say). */
static ncclResult_t dev_drv_result(const char* what, CUresult err) {
  const char* name = NULL;
  if (err == CUDA_SUCCESS) return ncclSuccess;
  if (dev_drv.error_name == NULL || dev_drv.error_name(err, &name) != CUDA_SUCCESS) name = NULL;
  return braid_err(ncclUnhandledCudaError, "%s failed: %s (CUresult %d)", what,
                   name ? name : "unknown error", (int)err);
}

/* The runtime's, where the driver lacks the entry point. */
static ncclResult_t dev_rt_result(const char* what, cudaError_t err) {
  if (err == cudaSuccess) return ncclSuccess;
  (void)cudaGetLastError();
  return braid_err(ncclUnhandledCudaError, "%s failed: %s", what, cudaGetErrorString(err));
}

/*
 * The order of a comm's launches (enqueue.c) asks for the stream's id and records an event
 * around every eager launch: straight to the driver, which the runtime's wrappers add to. The
 * caller has made the comm's device current (the driver works in the current context).
 */
ncclResult_t dev_state_record(cudaEvent_t event, cudaStream_t stream) {
  pthread_once(&dev_drv.once, dev_drv_load);
  if (dev_drv.event_record == NULL)
    return dev_rt_result("cudaEventRecord", cudaEventRecord(event, stream));
  return dev_drv_result("cuEventRecord", dev_drv.event_record((CUevent)event, (CUstream)stream));
}

ncclResult_t dev_state_stream_id(cudaStream_t stream, unsigned long long* id) {
  pthread_once(&dev_drv.once, dev_drv_load);
  if (dev_drv.stream_id == NULL) return dev_rt_result("cudaStreamGetId", cudaStreamGetId(stream, id));
  return dev_drv_result("cuStreamGetId", dev_drv.stream_id((CUstream)stream, id));
}

_Static_assert((int)CU_STREAM_CAPTURE_STATUS_NONE == (int)cudaStreamCaptureStatusNone &&
                   (int)CU_STREAM_CAPTURE_STATUS_ACTIVE == (int)cudaStreamCaptureStatusActive &&
                   (int)CU_STREAM_CAPTURE_STATUS_INVALIDATED ==
                       (int)cudaStreamCaptureStatusInvalidated,
               "the driver's capture states are the runtime's");

ncclResult_t dev_state_stream_capturing(cudaStream_t stream, enum cudaStreamCaptureStatus* status) {
  pthread_once(&dev_drv.once, dev_drv_load);
  if (dev_drv.stream_capturing == NULL)
    return dev_rt_result("cudaStreamIsCapturing", cudaStreamIsCapturing(stream, status));
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  ncclResult_t res =
      dev_drv_result("cuStreamIsCapturing", dev_drv.stream_capturing((CUstream)stream, &st));
  *status = (enum cudaStreamCaptureStatus)st;
  return res;
}

int dev_state_stream_eager(cudaStream_t stream) {
  pthread_once(&dev_drv.once, dev_drv_load);
  if (dev_drv.stream_capturing == NULL) {
    enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &st) == cudaSuccess) return st == cudaStreamCaptureStatusNone;
    (void)cudaGetLastError();
    return 0;
  }
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  return dev_drv.stream_capturing((CUstream)stream, &st) == CUDA_SUCCESS &&
         st == CU_STREAM_CAPTURE_STATUS_NONE;
}

/*
 * Loads every kernel of this comm's device now, and keeps each one's driver
 * handle. With CUDA's lazy loading a kernel's module is loaded at its first
 * launch, which can wait for other work on the device; if that work is a
 * kernel spinning on a peer that is itself waiting for this launch, the job
 * deadlocks. Loading up front removes the wait.
 */
/*
 * The library holds no kernel image this GPU can run (built for other architectures): say
 * which GPU, which architectures the library has, and how to add the GPU's.
 */
static ncclResult_t dev_kernels_no_image(int cuda_dev, cudaError_t err) {
  (void)cudaGetLastError();
  struct cudaDeviceProp prop;
  memset(&prop, 0, sizeof prop);
  snprintf(prop.name, sizeof prop.name, "?");
  (void)cudaGetDeviceProperties(&prop, cuda_dev);
  const char* name = prop.name;
  const int major = prop.major, minor = prop.minor;
  return braid_err(ncclInvalidUsage,
                   "GPU %d (%s, compute capability %d.%d, sm_%d%d) cannot run Braid's kernels "
                   "(%s): this library was built for CUDA architectures %s; rebuild with "
                   "-DCMAKE_CUDA_ARCHITECTURES=%d%d (or =native on this machine), or add %d%d "
                   "to the list",
                   cuda_dev, name, major, minor, major, minor, cudaGetErrorName(err),
                   BRAID_CUDA_ARCHS, major, minor, major, minor);
}

static ncclResult_t dev_kernels_load(struct braid_dev_state* d, int cuda_dev) {
  ncclResult_t res = ncclSuccess;
  BRAID_CHECK(braid_kernel_table[ncclUint8] != NULL, ncclInvalidUsage,
              "this Braid was built without its kernels (cmake -DBRAID_KERNELS=OFF, a host-only "
              "build for sanitizer runs of the host tests); rebuild with BRAID_KERNELS=ON");
  for (int f = 0; f < BRAID_KERNEL_FAMILIES; f++) {
    for (int t = 0; t < ncclNumTypes; t++) {
      for (int op = 0; op < BRAID_DEVOP_COUNT; op++) {
        struct cudaFuncAttributes attr;
        if (dev_tables[f][t][op] == NULL) continue; /* never launched (kernel.h: floating types) */
        cudaError_t err = cudaFuncGetAttributes(&attr, dev_tables[f][t][op]);
        if (err == cudaErrorNoKernelImageForDevice || err == cudaErrorInvalidDeviceFunction ||
            err == cudaErrorUnsupportedPtxVersion || err == cudaErrorInvalidPtx)
          return dev_kernels_no_image(cuda_dev, err);
        BRAID_CUDA_TRY(err);
        BRAID_CUDA_TRY(cudaGetFuncBySymbol(&d->kernels[f][t][op], dev_tables[f][t][op]));
      }
    }
    if (braid_copy_kernel_table[f] != NULL)
      BRAID_CUDA_TRY(cudaGetFuncBySymbol(&d->copy_kernels[f], braid_copy_kernel_table[f]));
  }
  pthread_once(&dev_drv.once, dev_drv_load);
  return ncclSuccess;
fail:
  return res;
}

/*
 * The launch attributes NCCL gives its kernels on Hopper and later, from the comm's config and
 * the environment (dev_launch_setup): blocks in clusters of cgaClusterSize spread over the SMs,
 * the remote memory synchronization domain, NVLink-centric scheduling. Returns how many.
 */
static unsigned dev_launch_attrs(const struct braid_dev_state* d, int grid,
                                 const struct braid_kernel_args* args, CUlaunchAttribute attrs[4]) {
  unsigned n = 0;
  if (dev_drv.launch_ex == NULL) return 0;
  int rs_only = args->nwork > 0;
  for (int i = 0; i < args->nwork && rs_only; i++)
    rs_only = args->work[i].coll == BRAID_COLL_REDUCESCATTER;
  unsigned cluster = rs_only && d->cluster_rs > 1 && grid % d->cluster_rs == 0 ? d->cluster_rs
                                                                              : d->cluster;
  if (cluster > 1 && grid % cluster == 0) {
    attrs[n].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attrs[n].value.clusterDim.x = cluster;
    attrs[n].value.clusterDim.y = 1;
    attrs[n++].value.clusterDim.z = 1;
    attrs[n].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE;
    attrs[n++].value.clusterSchedulingPolicyPreference = CU_CLUSTER_SCHEDULING_POLICY_SPREAD;
  }
  if (d->sync_domain_remote) {
    attrs[n].id = CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN;
    attrs[n++].value.memSyncDomain = CU_LAUNCH_MEM_SYNC_DOMAIN_REMOTE;
  }
#if CUDA_VERSION >= 13000
  if (d->nvlink_centric) {
    attrs[n].id = CU_LAUNCH_ATTRIBUTE_NVLINK_UTIL_CENTRIC_SCHEDULING;
    attrs[n++].value.nvlinkUtilCentricScheduling = 1;
  }
#endif
  return n;
}

#define BRAID_DEFAULT_CGA_CLUSTER 4    /* blocks per cluster when the config leaves it unset */
#define BRAID_DEFAULT_CGA_CLUSTER_RS 8 /* the same for launches of reduce-scatters alone */

/* Which launch attributes this comm's kernels get (dev_launch_attrs), said at INFO. */
static ncclResult_t dev_launch_setup(struct ncclComm* comm) {
  ncclResult_t res = ncclSuccess;
  struct braid_dev_state* d = comm->dev;
  int major = 0, driver = 0;
  BRAID_CUDA_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, comm->cuda_dev));
  BRAID_CUDA_TRY(cudaDriverGetVersion(&driver));
  if (major < 9 || dev_drv.launch_ex == NULL) return ncclSuccess; /* none before Hopper */
  /* Unset, as NCCL on Hopper: 4. On 2x H100 NV18 all-reduce at 1 GiB 5-7% faster, broadcast
     6-16%, send/recv 17-20%; NCCL without its clusters 11-30% slower (docs/tuning.md,
     BRAID_CGA_CLUSTER_SIZE). */
  int cga = comm->config.cga_cluster_size < 0 ? BRAID_DEFAULT_CGA_CLUSTER : comm->config.cga_cluster_size;
  d->cluster = cga > 1 ? (unsigned)cga : 0;
  /* Reduce-scatter alone, unset: 8 (2x H100 NV18: its ring 11-17% faster at 64-512 MB than
     with 4, 4-13% at 1-2 GB, level below; all-reduce and all-gather slower with 8 from 256 MB;
     docs/tuning.md, BRAID_CGA_CLUSTER_SIZE). A size that is set holds for every launch. */
  d->cluster_rs = comm->config.cga_cluster_size < 0 ? BRAID_DEFAULT_CGA_CLUSTER_RS : d->cluster;
  d->sync_domain_remote = braid_param_int(BRAID_P_MEM_SYNC_DOMAIN) == 1;
  d->nvlink_centric = CUDA_VERSION >= 13000 && driver >= 13000 && comm->config.nvlink_centric_sched == 1;
  INFO(BRAID_LOG_INIT, "kernels launched with clusters of %u blocks (cgaClusterSize; %u for "
       "reduce-scatters alone), the %s memory sync domain (BRAID_MEM_SYNC_DOMAIN), NVLink-centric "
       "scheduling %s (nvlinkCentricSched)",
       d->cluster > 1 ? d->cluster : 1, d->cluster_rs > 1 ? d->cluster_rs : 1,
       d->sync_domain_remote ? "remote" : "default",
       d->nvlink_centric ? "on" : "off");
  return ncclSuccess;
fail:
  return res;
}

/* One launch of `fn` on `grid` blocks, with the driver's attribute call when there are any. */
static CUresult dev_launch_with(CUfunction fn, int grid, int nthreads, cudaStream_t stream,
                                void** extra, CUlaunchAttribute* attrs, unsigned nattrs) {
  if (nattrs == 0)
    return dev_drv.launch(fn, (unsigned)grid, 1, 1, (unsigned)nthreads, 1, 1, 0, (CUstream)stream,
                          NULL, extra);
  CUlaunchConfig cfg = {.gridDimX = (unsigned)grid, .gridDimY = 1, .gridDimZ = 1,
                        .blockDimX = (unsigned)nthreads, .blockDimY = 1, .blockDimZ = 1,
                        .sharedMemBytes = 0, .hStream = (CUstream)stream, .attrs = attrs,
                        .numAttrs = nattrs};
  return dev_drv.launch_ex(&cfg, fn, NULL, extra);
}

ncclResult_t dev_state_launch(struct ncclComm* comm, int family, int dtype, int devop, int grid,
                              int small, struct braid_kernel_args* args, cudaStream_t stream) {
  struct braid_dev_state* d = comm->dev;
  const void* kernel =
      dtype == DEV_COPY_KERNEL ? braid_copy_kernel_table[family] : dev_tables[family][dtype][devop];
  if (kernel == NULL) /* kernel.h: floating types have no SumPostDiv, trees no copy kernel */
    return braid_err(ncclInternalError, "no kernel of family %d for type %d, operator %d",
                     family, dtype, devop);
  args->borrows = d->borrows; /* as of now: every connection the works use is uploaded */
  args->borrows_per = d->borrows_per_channel;
  /* A borrowing block takes one borrowed pair a thread (kernel.h: borrows_in). */
  const int borrows_fit =
      d->borrows == NULL || d->borrows_per_channel <= (uint32_t)d->small_nthreads;
  const int nthreads = small && d->small_nthreads > 0 && borrows_fit ? d->small_nthreads
                                                                     : d->nthreads;
  if (dev_drv.launch == NULL) { /* no driver entry point: the runtime copies the whole struct */
    void* params[] = {args};
    dim3 g = {(unsigned)grid, 1, 1}, b = {(unsigned)nthreads, 1, 1};
    cudaError_t err = cudaLaunchKernel(kernel, g, b, params, 0, stream);
    if (err == cudaSuccess) return ncclSuccess;
    (void)cudaGetLastError();
    return braid_err(ncclUnhandledCudaError, "kernel launch on %d blocks failed: %s", grid,
                     cudaGetErrorString(err));
  }
  /* The kernel reads works [0, nwork) only; the rest of its parameter space stays undefined. */
  size_t bytes =
      offsetof(struct braid_kernel_args, work) + (size_t)args->nwork * sizeof args->work[0];
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, args, CU_LAUNCH_PARAM_BUFFER_SIZE, &bytes,
                   CU_LAUNCH_PARAM_END};
  CUfunction fn =
      dtype == DEV_COPY_KERNEL ? d->copy_kernels[family] : d->kernels[family][dtype][devop];
  CUlaunchAttribute attrs[4];
  unsigned nattrs = dev_launch_attrs(d, grid, args, attrs);
  CUresult err = dev_launch_with(fn, grid, nthreads, stream, extra, attrs, nattrs);
  if ((err == CUDA_ERROR_INVALID_CLUSTER_SIZE || err == CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES) &&
      nattrs >= 2 && attrs[0].id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION) {
    /* Clusters are placement only (a peer may launch without them): where this device cannot
       place them (MPS or MIG limits, another kernel's resources), launch without, from now on. */
    WARN("kernel launch with clusters of %u blocks failed (CUresult %d); this communicator "
         "launches without clusters from now on (set NCCL_CGA_CLUSTER_SIZE=0 to skip the try)",
         attrs[0].value.clusterDim.x, (int)err);
    d->cluster = 0;
    d->cluster_rs = 0;
    err = dev_launch_with(fn, grid, nthreads, stream, extra, attrs + 2, nattrs - 2);
  }
  if (err == CUDA_SUCCESS) return ncclSuccess;
  char what[48];
  snprintf(what, sizeof what, "kernel launch on %d blocks", grid);
  return dev_drv_result(what, err);
}

static int dev_nthreads(void) {
  int64_t n = braid_param_int(BRAID_P_NTHREADS);
  if (n <= 0) return BRAID_MAX_NTHREADS;
  n = BRAID_ALIGN_UP(n, 64);
  if (n < 64) n = 64;
  if (n > BRAID_MAX_NTHREADS) n = BRAID_MAX_NTHREADS;
  return (int)n;
}

/* BRAID_SMALL_NTHREADS as a launch takes it: 0 (off) or 64 up to the full block, by 64. */
static int dev_small_nthreads(int nthreads) {
  int64_t n = braid_param_int(BRAID_P_SMALL_NTHREADS);
  if (n <= 0 || n >= nthreads) return 0; /* before the rounding: no overflow */
  n = BRAID_ALIGN_UP(n, 64);
  return n >= nthreads ? 0 : (int)n;
}

static ncclResult_t dev_upload(struct ncclComm* comm, void* dst, const void* src, size_t bytes) {
  ncclResult_t res = ncclSuccess;
  struct braid_dev_state* d = comm->dev;
  BRAID_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, d->stream));
  BRAID_CUDA_TRY(cudaStreamSynchronize(d->stream));
  return ncclSuccess;
fail:
  return res;
}

static void dev_fill_channels(struct ncclComm* comm) {
  struct braid_dev_state* d = comm->dev;
  struct braid_channels* ch = comm->channels;
  const struct braid_trees* trees = topo_trees(comm->topo);
  int n = comm->nranks;
  for (int c = 0; c < BRAID_MAX_CHANNELS; c++) {
    struct braid_dev_channel* dc = &d->host.channels[c];
    dc->p2p_send = d->p2p_send + (size_t)c * n;
    dc->p2p_recv = d->p2p_recv + (size_t)c * n;
    struct braid_tree_node none = {.up = -1, .down = {-1, -1, -1}};
    const struct braid_tree_node* node =
        trees && c < trees->nchannels && n > 1 ? &trees->nodes[(size_t)c * n + comm->rank] : &none;
    dc->tree_up = node->up;
    for (int i = 0; i < 3; i++) dc->tree_down[i] = node->down[i];
    if (c >= ch->nchannels) continue;
    dc->ring_ranks = d->ring_ranks + (size_t)c * n;
    dc->ring_index = 0;
    dc->ring_next = ch->ring_ranks_host[c * n + (n > 1 ? 1 : 0)];
    dc->ring_prev = ch->ring_ranks_host[c * n + n - 1];
    dc->ring_send = ch->ring_send[c].dev;
    dc->ring_recv = ch->ring_recv[c].dev;
  }
}

ncclResult_t dev_state_create(struct ncclComm* comm) {
  ncclResult_t res = ncclSuccess;
  struct braid_dev_state* d = NULL;
  int n = comm->nranks;
  size_t nconn = (size_t)BRAID_MAX_CHANNELS * n;
  BRAID_TRY(BRAID_CALLOC(&d, 1, "device state"));
  comm->dev = d;
  d->nthreads = dev_nthreads();
  d->small_nthreads = dev_small_nthreads(d->nthreads);
  BRAID_TRY(dev_kernels_load(d, comm->cuda_dev));
  BRAID_TRY(dev_launch_setup(comm));
  BRAID_CUDA_TRY(cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking));
  if (comm->share == NULL) BRAID_TRY(share_create(comm));
  d->order = &comm->share->order;
  BRAID_CUDA_TRY(cudaMalloc((void**)&d->comm, sizeof *d->comm));
  BRAID_CUDA_TRY(cudaMalloc((void**)&d->p2p_send, nconn * sizeof *d->p2p_send));
  BRAID_CUDA_TRY(cudaMalloc((void**)&d->p2p_recv, nconn * sizeof *d->p2p_recv));
  BRAID_CUDA_TRY(cudaMalloc((void**)&d->ring_ranks, (size_t)comm->channels->nchannels * n * sizeof(int)));
  d->dev_bytes = sizeof *d->comm + 2 * nconn * sizeof *d->p2p_send +
                 (size_t)comm->channels->nchannels * n * sizeof(int);
  BRAID_CUDA_TRY(cudaMemsetAsync(d->p2p_send, 0, nconn * sizeof *d->p2p_send, d->stream));
  BRAID_CUDA_TRY(cudaMemsetAsync(d->p2p_recv, 0, nconn * sizeof *d->p2p_recv, d->stream));
  BRAID_TRY(dev_upload(comm, d->ring_ranks, comm->channels->ring_ranks_host,
                       (size_t)comm->channels->nchannels * n * sizeof(int)));
  d->host.rank = comm->rank;
  d->host.nranks = n;
  d->host.nchannels = comm->channels->nchannels;
  BRAID_CUDA_TRY(cudaHostGetDevicePointer((void**)&d->host.abort_flag, (void*)comm->abort_flag, 0));
  dev_fill_channels(comm);
  BRAID_TRY(dev_upload(comm, d->comm, &d->host, sizeof d->host));
  /* The kernels have the ring connections: a child may borrow them (share.h). */
  for (int c = 0; c < comm->channels->nchannels; c++) {
    struct braid_connector* ends[2] = {&comm->channels->ring_send[c],
                                       &comm->channels->ring_recv[c]};
    for (int e = 0; e < 2; e++) {
      if (ends[e]->borrowed)
        BRAID_TRY(
            dev_state_borrowed(comm, c, ends[e]->peer, ends[e]->is_send, 1, ends[e]->step_home));
      if (ends[e]->transport != &braid_transport_net)
        __atomic_store_n(&ends[e]->lendable, 1, __ATOMIC_RELEASE);
    }
  }
  return ncclSuccess;
fail:
  return res;
}

ncclResult_t dev_state_upload_p2p(struct ncclComm* comm, int channel, int peer, int is_send,
                                  const struct braid_dev_conn* conn) {
  struct braid_dev_state* d = comm->dev;
  struct braid_dev_conn* dst = (is_send ? d->p2p_send : d->p2p_recv) + (size_t)channel * comm->nranks + peer;
  return dev_upload(comm, dst, conn, sizeof *conn);
}

/*
 * Room for each channel's borrowed ends: its two ring ends and a send and a receive end to
 * every other rank of this host (only P2P and SHM connections are lent, and they join ranks of
 * one host). Made once, at the first borrow, so that graphs captured after it keep its address.
 */
static ncclResult_t dev_borrows_create(struct ncclComm* comm) {
  ncclResult_t res = ncclSuccess;
  struct braid_dev_state* d = comm->dev;
  struct braid_borrows* b = NULL;
  const uint32_t per = 2 + 2 * (uint32_t)comm_host_peers(comm);
  /* The kernels copy one pair per thread (kernel.h: borrows_in); share_join keeps to that. */
  BRAID_CHECK(per <= (uint32_t)d->nthreads, ncclInternalError,
              "rank %d: %u borrowed ends per channel, more than the %d threads of a block",
              comm->rank, per, d->nthreads);
  const size_t bytes =
      sizeof(struct braid_borrows) + (size_t)BRAID_MAX_CHANNELS * per * sizeof(struct braid_borrow);
  struct braid_borrows head;
  memset(&head, 0, sizeof head);
  head.per_channel = per;
  BRAID_CUDA_TRY(cudaMalloc((void**)&b, bytes));
  BRAID_CUDA_TRY(cudaMemsetAsync(b, 0, bytes, d->stream)); /* dev_upload waits for it too */
  BRAID_TRY(dev_upload(comm, b, &head, sizeof head));
  d->borrows = b;
  d->dev_bytes += bytes;
  memset(d->borrows_count, 0, sizeof d->borrows_count);
  d->borrows_per_channel = per;
  return ncclSuccess;
fail:
  if (b) (void)cudaFree(b);
  return res;
}

ncclResult_t dev_state_borrowed(struct ncclComm* comm, int channel, int peer, int is_send, int ring,
                                uint64_t* home) {
  ncclResult_t res = ncclSuccess;
  struct braid_dev_state* d = comm->dev;
  if (d->borrows == NULL) BRAID_TRY(dev_borrows_create(comm));
  uint32_t n = d->borrows_count[channel];
  BRAID_CHECK(n < d->borrows_per_channel, ncclInternalError,
              "rank %d: channel %d borrows more connections than it has room for (%u; the one "
              "to rank %d lent over neither P2P nor SHM?)",
              comm->rank, channel, n, peer);
  struct braid_borrow pair;
  if (ring)
    pair.own = is_send ? &d->comm->channels[channel].ring_send.step
                       : &d->comm->channels[channel].ring_recv.step;
  else
    pair.own = &(is_send ? d->p2p_send : d->p2p_recv)[(size_t)channel * comm->nranks + peer].step;
  pair.home = home;
  /* The pair, then the count that takes it in: a running kernel sees all of it or none. */
  struct braid_borrow* at =
      BRAID_BORROW_PAIRS(d->borrows) + (size_t)channel * d->borrows_per_channel + n;
  BRAID_TRY(dev_upload(comm, at, &pair, sizeof pair));
  n++;
  BRAID_TRY(dev_upload(comm, &d->borrows->count[channel], &n, sizeof n));
  d->borrows_count[channel] = n;
  return ncclSuccess;
fail:
  return res;
}

int dev_state_idle(struct ncclComm* comm) {
  struct braid_dev_state* d = comm->dev;
  if (d == NULL || d->order == NULL || (!d->order->launched && !d->order->graphs_ordered)) return 1;
  cudaError_t err = cudaEventQuery(d->order->last_launch);
  if (err == cudaErrorNotReady) return 0;
  (void)cudaGetLastError();
  return 1;
}

/* The family's kernels up to the last record seen are done: a wait may forget them. */
static void dev_order_done(struct ncclComm* comm, uint64_t seen) {
  struct braid_launch_order* ord = comm->dev->order;
  share_lock(comm);
  if (ord->records == seen) ord->launched = 0;
  share_unlock(comm);
}

/* The family's launches recorded so far (a wait's starting point). */
static uint64_t dev_order_seen(struct ncclComm* comm) {
  share_lock(comm);
  uint64_t seen = comm->dev->order->records;
  share_unlock(comm);
  return seen;
}

/* How long kernels get to notice the abort flag (they poll it in every wait loop). */
#define DEV_DRAIN_TIMEOUT_S 10.0

ncclResult_t dev_state_wait_idle(struct ncclComm* comm) {
  ncclResult_t res = ncclSuccess;
  struct braid_dev_state* d = comm->dev;
  if (d == NULL || d->order == NULL || (!d->order->launched && !d->order->graphs_ordered))
    return ncclSuccess;
  uint64_t seen = dev_order_seen(comm);
  /* Poll rather than block, so an abort from another thread is noticed. */
  for (;;) {
    cudaError_t err = cudaEventQuery(d->order->last_launch);
    if (err == cudaSuccess) break;
    if (err != cudaErrorNotReady) BRAID_CUDA_TRY(err);
    if (*comm->abort_flag) {
      /* The kernels leave on the flag: their memory may go only once they have. */
      res = dev_state_drain(comm, DEV_DRAIN_TIMEOUT_S);
      return res == ncclSuccess ? ncclRemoteError : res;
    }
    usleep(20);
  }
  dev_order_done(comm, seen);
  return ncclSuccess;
fail:
  return res;
}

ncclResult_t dev_state_drain(struct ncclComm* comm, double timeout_s) {
  struct braid_dev_state* d = comm->dev;
  if (d == NULL || d->order == NULL || (!d->order->launched && !d->order->graphs_ordered))
    return ncclSuccess;
  uint64_t seen = dev_order_seen(comm);
  double start = braid_time_sec();
  for (;;) {
    cudaError_t err = cudaEventQuery(d->order->last_launch);
    if (err == cudaSuccess) break;
    if (err != cudaErrorNotReady)
      return braid_err(ncclUnhandledCudaError, "rank %d: a kernel failed while aborting: %s",
                       comm->rank, cudaGetErrorString(err));
    if (braid_time_sec() - start > timeout_s) {
      d->stuck = 1; /* whatever comes later: a kernel that missed the flag may still run */
      return braid_err(ncclInternalError,
                       "rank %d: the communicator's kernels did not exit within %.1f s of the "
                       "abort flag; their buffers are kept",
                       comm->rank, timeout_s);
    }
    usleep(20);
  }
  dev_order_done(comm, seen);
  return ncclSuccess;
}

int dev_state_stuck(const struct ncclComm* comm) { return comm->dev != NULL && comm->dev->stuck; }

void dev_state_keep(struct ncclComm* comm, size_t* kept) {
  struct braid_dev_state* d = comm->dev;
  if (d == NULL) return;
  /* cudaFree waits for the whole device, so for the kernels that never exit; and they read
     all of it. The stream may hold an upload behind them: destroying it is left out too. */
  *kept += d->dev_bytes;
  free(d->plan);
  free(d);
  comm->dev = NULL;
}

void dev_state_free(struct ncclComm* comm) {
  struct braid_dev_state* d = comm->dev;
  if (d == NULL) return;
  if (d->comm) cudaFree(d->comm);
  if (d->p2p_send) cudaFree(d->p2p_send);
  if (d->p2p_recv) cudaFree(d->p2p_recv);
  if (d->ring_ranks) cudaFree(d->ring_ranks);
  if (d->borrows) cudaFree(d->borrows);
  if (d->stream) cudaStreamDestroy(d->stream);
  (void)cudaGetLastError();
  free(d->plan);
  free(d);
  comm->dev = NULL;
}
