// floor-nccl: the least time a library with one kernel launch per all-reduce can take.
//
// A libnccl.so.2 that the perf benchmarks load in place of Braid's or NCCL's, whose
// ncclAllReduce does nothing but launch one minimal kernel on the caller's stream: each thread
// stores two floats with their call's flag into the peer's memory (16-byte LL lines), waits for
// the peer's line and adds. No argument check, no event, no state but a call counter. What the
// benchmark measures with it at 8 B is what any library with one launch per call can at best
// take on that machine, measured the same way.
//
// Not part of Braid: built as bench/probes/floor/libnccl.so.2 in the build tree and loaded
// instead of the real library:
//   LD_LIBRARY_PATH=build/bench/probes/floor mpirun -np 2 build/perf/all_reduce_perf -b 8 -e 8 -g 1
// Two processes of one GPU each, float32 sum; anything else is refused with ncclInvalidUsage. A
// call of more than FLOOR_CHUNK_BYTES launches once per chunk (so that a whole range of sizes
// runs; only the small sizes mean anything). The ranks meet through two files in /dev/shm named
// by the unique id. A peer that dies leaves the kernel spinning: run it under `timeout`.
#include <cuda_runtime.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nccl.h"

#define FLOOR_CHUNK_BYTES (256 << 10) /* one launch each: larger calls take several */
#define FLOOR_LINES (FLOOR_CHUNK_BYTES / 8) /* two floats a line */
#define FLOOR_THREADS 256
#define FLOOR_WAIT_S 120

struct ncclComm {
  int rank;
  uint4* mine;   /* two slots of FLOOR_LINES lines, written by the peer */
  uint4* peer;   /* the peer's, opened through IPC */
  uint32_t seq;  /* calls so far; a line's flag is its call's number (from 1) */
};

static __thread char floor_last[256];

static ncclResult_t floor_fail(ncclResult_t res, const char* fmt, const char* what) {
  snprintf(floor_last, sizeof floor_last, fmt, what);
  fprintf(stderr, "floor-nccl: %s\n", floor_last);
  return res;
}

static ncclResult_t floor_cuda(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return ncclSuccess;
  char msg[200];
  snprintf(msg, sizeof msg, "%s: %s", what, cudaGetErrorString(err));
  return floor_fail(ncclUnhandledCudaError, "%s", msg);
}

__global__ void floor_all_reduce(const float* send, float* recv, size_t count, uint4* mine,
                                 uint4* peer, uint32_t seq) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (2 * i >= count) return;
  const int two = 2 * i + 1 < count;
  float a0 = send[2 * i], a1 = two ? send[2 * i + 1] : 0.0f;
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(peer + i),
               "r"(__float_as_uint(a0)), "r"(seq), "r"(__float_as_uint(a1)), "r"(seq)
               : "memory");
  uint32_t d0, f0, d1, f1;
  do {
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(d0), "=r"(f0), "=r"(d1), "=r"(f1)
                 : "l"(mine + i)
                 : "memory");
  } while (f0 != seq || f1 != seq);
  recv[2 * i] = a0 + __uint_as_float(d0);
  if (two) recv[2 * i + 1] = a1 + __uint_as_float(d1);
}

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
  if (version == NULL) return floor_fail(ncclInvalidArgument, "%s", "ncclGetVersion: NULL");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage (the floor library does little)";
    default: return "floor library error";
  }
}

const char* ncclGetLastError(ncclComm_t comm) {
  (void)comm;
  return floor_last;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  memset(id, 0, sizeof *id);
  snprintf(id->internal, sizeof id->internal, "/dev/shm/braid-floor-%d-%lld-%ld", (int)getpid(),
           (long long)ts.tv_sec, ts.tv_nsec);
  return ncclSuccess;
}

/* Writes this rank's IPC handle where the peer looks, through a rename so it is read whole. */
static ncclResult_t floor_publish(const char* base, int rank, const cudaIpcMemHandle_t* h) {
  char path[200], tmp[210];
  snprintf(path, sizeof path, "%s.%d", base, rank);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE* f = fopen(tmp, "wb");
  if (f == NULL) return floor_fail(ncclSystemError, "cannot create %s", tmp);
  size_t n = fwrite(h, sizeof *h, 1, f);
  if (fclose(f) != 0 || n != 1) return floor_fail(ncclSystemError, "cannot write %s", tmp);
  if (rename(tmp, path) != 0) return floor_fail(ncclSystemError, "cannot rename to %s", path);
  return ncclSuccess;
}

/* Reads the peer's handle (waiting for its file) and removes the file. */
static ncclResult_t floor_lookup(const char* base, int rank, cudaIpcMemHandle_t* h) {
  char path[200];
  snprintf(path, sizeof path, "%s.%d", base, rank);
  for (int ms = 0; ms < FLOOR_WAIT_S * 1000; ms++) {
    FILE* f = fopen(path, "rb");
    if (f != NULL) {
      size_t n = fread(h, sizeof *h, 1, f);
      fclose(f);
      unlink(path);
      if (n != 1) return floor_fail(ncclSystemError, "short read of %s", path);
      return ncclSuccess;
    }
    if (errno != ENOENT) return floor_fail(ncclSystemError, "cannot open %s", path);
    usleep(1000);
  }
  return floor_fail(ncclSystemError, "no peer wrote %s in time", path);
}

ncclResult_t ncclCommInitRank(ncclComm_t* out, int nranks, ncclUniqueId id, int rank) {
  ncclResult_t res;
  if (out == NULL || nranks != 2 || rank < 0 || rank > 1)
    return floor_fail(ncclInvalidUsage, "%s", "ncclCommInitRank: two ranks only");
  if (strncmp(id.internal, "/dev/shm/braid-floor-", 21) != 0)
    return floor_fail(ncclInvalidArgument, "%s", "ncclCommInitRank: not a floor library's id");
  struct ncclComm* c = (struct ncclComm*)calloc(1, sizeof *c);
  if (c == NULL) return floor_fail(ncclSystemError, "%s", "out of memory");
  c->rank = rank;
  cudaIpcMemHandle_t mine, peer;
  size_t bytes = 2 * FLOOR_LINES * sizeof(uint4);
  if ((res = floor_cuda(cudaMalloc(&c->mine, bytes), "cudaMalloc")) ||
      (res = floor_cuda(cudaMemset(c->mine, 0, bytes), "cudaMemset")) ||
      (res = floor_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize")) ||
      (res = floor_cuda(cudaIpcGetMemHandle(&mine, c->mine), "cudaIpcGetMemHandle")) ||
      (res = floor_publish(id.internal, rank, &mine)) ||
      (res = floor_lookup(id.internal, 1 - rank, &peer)) ||
      (res = floor_cuda(cudaIpcOpenMemHandle((void**)&c->peer, peer,
                                             cudaIpcMemLazyEnablePeerAccess),
                        "cudaIpcOpenMemHandle"))) {
    if (c->mine) (void)cudaFree(c->mine);
    free(c);
    return res;
  }
  *out = c;
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  if (datatype != ncclFloat32 || op != ncclSum)
    return floor_fail(ncclInvalidUsage, "%s", "ncclAllReduce: float32 sum only");
  const size_t chunk = FLOOR_CHUNK_BYTES / sizeof(float);
  for (size_t done = 0; done < count; done += chunk) {
    size_t n = count - done < chunk ? count - done : chunk;
    uint32_t seq = ++comm->seq;
    size_t slot = (seq & 1) * (size_t)FLOOR_LINES, lines = (n + 1) / 2;
    unsigned grid = (unsigned)((lines + FLOOR_THREADS - 1) / FLOOR_THREADS);
    floor_all_reduce<<<grid, FLOOR_THREADS, 0, stream>>>((const float*)sendbuff + done,
                                                         (float*)recvbuff + done, n,
                                                         comm->mine + slot, comm->peer + slot,
                                                         seq);
    ncclResult_t res = floor_cuda(cudaGetLastError(), "kernel launch");
    if (res != ncclSuccess) return res;
  }
  return ncclSuccess;
}

ncclResult_t ncclGroupStart(void) { return ncclSuccess; }
ncclResult_t ncclGroupEnd(void) { return ncclSuccess; }

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async) {
  (void)comm;
  *async = ncclSuccess;
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == NULL) return ncclSuccess;
  (void)cudaIpcCloseMemHandle(comm->peer);
  (void)cudaFree(comm->mine);
  free(comm);
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) { return ncclCommDestroy(comm); }

ncclResult_t ncclMemAlloc(void** ptr, size_t size) {
  return floor_cuda(cudaMalloc(ptr, size), "cudaMalloc");
}

ncclResult_t ncclMemFree(void* ptr) { return floor_cuda(cudaFree(ptr), "cudaFree"); }

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                           ncclConfig_t* config) {
  (void)comm, (void)color, (void)key, (void)newcomm, (void)config;
  return floor_fail(ncclInvalidUsage, "%s", "ncclCommSplit: not in the floor library");
}

ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm) {
  (void)op, (void)scalar, (void)datatype, (void)residence, (void)comm;
  return floor_fail(ncclInvalidUsage, "%s", "ncclRedOpCreatePreMulSum: not in the floor library");
}

ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  (void)op, (void)comm;
  return floor_fail(ncclInvalidUsage, "%s", "ncclRedOpDestroy: not in the floor library");
}

} /* extern "C" */
