// peer-copy: how fast two processes move data into each other's GPU, by copy engine and by SM.
//
// Two ranks, forked from this process, each allocate a cuMem buffer, pass its POSIX descriptor
// to the other over a socket pair, and map the peer's buffer on their own GPU (as Braid's
// transports do). Then both ranks run each pattern at the same time (both directions loaded),
// best of 5, and rank 0 prints GB/s per direction: copies pushed into the peer (1, 2, 4
// streams; 2 with different priorities), pulled from it, one of each, SM kernels writing or
// reading, and copies beside a kernel that moves part of the bytes.
//   peer-copy [isolated|visible] [MB]
// isolated: each rank sees only its own GPU (CUDA_VISIBLE_DEVICES set per rank from the
// parent's first two GPUs), as schedulers hand GPUs out; visible: both see both.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cuda_check.h"

static int g_rank;
static int g_sock;

__global__ void copy_kernel(uint4* dst, const uint4* src, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    dst[i] = src[i];
}

// Each thread moves U consecutive 16-byte words per pass: all loads first, then all stores.
template <int U>
__global__ void copy_unrolled(uint4* dst, const uint4* src, size_t n) {
  size_t stride = (size_t)gridDim.x * blockDim.x * U;
  for (size_t base = (blockIdx.x * (size_t)blockDim.x) * U + threadIdx.x; base < n; base += stride) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; u++)
      if (base + u * blockDim.x < n) v[u] = src[base + u * blockDim.x];
#pragma unroll
    for (int u = 0; u < U; u++)
      if (base + u * blockDim.x < n) dst[base + u * blockDim.x] = v[u];
  }
}

// The Hopper bulk-copy (TMA) engine: one thread a block loads a chunk into shared memory and
// stores it to the destination, two chunks in flight.
__global__ void copy_bulk(char* dst, const char* src, size_t bytes, unsigned chunk) {
  extern __shared__ __align__(128) char smem[];
  __shared__ __align__(8) uint64_t bar[2];
  if (threadIdx.x != 0) return;
  unsigned sbar[2], sbuf[2], phase[2] = {0, 0};
  for (int b = 0; b < 2; b++) {
    sbar[b] = (unsigned)__cvta_generic_to_shared(&bar[b]);
    sbuf[b] = (unsigned)__cvta_generic_to_shared(smem + b * chunk);
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(sbar[b]));
  }
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  size_t nchunks = bytes / chunk;
  int k = 0;
  for (size_t c = blockIdx.x; c < nchunks; c += gridDim.x, k++) {
    int b = k & 1;
    asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(sbar[b]), "r"(chunk)
                 : "memory");
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
            sbuf[b]),
        "l"(src + c * chunk), "r"(chunk), "r"(sbar[b])
        : "memory");
    asm volatile(
        "{\n.reg .pred p;\nW%=:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra W%=;\n}" ::"r"(
            sbar[b]),
        "r"(phase[b])
        : "memory");
    phase[b] ^= 1;
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst + c * chunk),
                 "r"(sbuf[b]), "r"(chunk)
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
  }
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

/* A one-byte message with room for one descriptor (SCM_RIGHTS). */
struct fd_msg {
  char byte;
  struct iovec iov;
  char ctl[CMSG_SPACE(sizeof(int))];
  struct msghdr m;
};

static void fd_msg_init(struct fd_msg* f) {
  memset(f, 0, sizeof *f);
  f->iov.iov_base = &f->byte;
  f->iov.iov_len = 1;
  f->m.msg_iov = &f->iov;
  f->m.msg_iovlen = 1;
  f->m.msg_control = f->ctl;
  f->m.msg_controllen = sizeof f->ctl;
}

static void send_fd(int sock, int fd) {
  struct fd_msg f;
  fd_msg_init(&f);
  struct cmsghdr* c = CMSG_FIRSTHDR(&f.m);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(c), &fd, sizeof fd);
  if (sendmsg(sock, &f.m, 0) != 1) {
    perror("sendmsg");
    exit(1);
  }
}

static int recv_fd(int sock) {
  struct fd_msg f;
  fd_msg_init(&f);
  if (recvmsg(sock, &f.m, 0) != 1) {
    perror("recvmsg");
    exit(1);
  }
  struct cmsghdr* c = CMSG_FIRSTHDR(&f.m);
  if (c == NULL || c->cmsg_type != SCM_RIGHTS) {
    fprintf(stderr, "rank %d: no descriptor received\n", g_rank);
    exit(1);
  }
  int fd;
  memcpy(&fd, CMSG_DATA(c), sizeof fd);
  return fd;
}

static void barrier(void) {
  char b = 1;
  if (write(g_sock, &b, 1) != 1 || read(g_sock, &b, 1) != 1) {
    perror("barrier");
    exit(1);
  }
}

enum { MAXS = 4 };
struct op {
  int kind;  // 0: none, 1: copy engine, 2: SM kernel, 3: unrolled x4, 4: bulk copy
  int push;  // 1: local -> peer, 0: peer -> local
  double frac;
  int blocks;
  int threads;  // SM kernels: threads a block (0: 512); bulk copy: chunk bytes
};

static char *g_local_src, *g_local_dst, *g_peer, *g_own;
static size_t g_bytes;
static cudaStream_t g_st[MAXS];

// Runs ops on streams 0..n-1 at once, both ranks together; returns the best GB/s of 5 runs.
static double run(int n, const struct op* ops) {
  cudaEvent_t t0, t1, done[MAXS];
  CHECK(cudaEventCreate(&t0));
  CHECK(cudaEventCreate(&t1));
  for (int i = 0; i < n; i++) CHECK(cudaEventCreateWithFlags(&done[i], cudaEventDisableTiming));
  double best = 0;
  for (int it = 0; it < 5; it++) {
    barrier();
    CHECK(cudaEventRecord(t0, g_st[0]));
    for (int i = 1; i < n; i++) CHECK(cudaStreamWaitEvent(g_st[i], t0, 0));
    size_t off = 0;
    for (int i = 0; i < n; i++) {
      size_t b = (size_t)(g_bytes * ops[i].frac) & ~(size_t)65535;
      if (i == n - 1) b = g_bytes - off;
      // push: my source -> the peer's inbox (its first half); pull: the peer's outbox (its
      // second half) -> my destination.
      char* dst = ops[i].push ? g_peer + off : g_local_dst + off;
      char* src = ops[i].push ? g_local_src + off : g_peer + g_bytes + off;
      if (ops[i].kind == 1)
        CHECK_CU(cuMemcpyDtoDAsync((CUdeviceptr)dst, (CUdeviceptr)src, b, g_st[i]));
      else if (ops[i].kind == 2)
        copy_kernel<<<ops[i].blocks, ops[i].threads ? ops[i].threads : 512, 0, g_st[i]>>>(
            (uint4*)dst, (const uint4*)src, b / 16);
      else if (ops[i].kind == 3)
        copy_unrolled<4><<<ops[i].blocks, ops[i].threads ? ops[i].threads : 512, 0, g_st[i]>>>(
            (uint4*)dst, (const uint4*)src, b / 16);
      else
        copy_bulk<<<ops[i].blocks, 32, 2 * ops[i].threads, g_st[i]>>>(dst, src, b, ops[i].threads);
      CHECK(cudaGetLastError());
      off += b;
    }
    for (int i = 1; i < n; i++) {
      CHECK(cudaEventRecord(done[i], g_st[i]));
      CHECK(cudaStreamWaitEvent(g_st[0], done[i], 0));
    }
    CHECK(cudaEventRecord(t1, g_st[0]));
    CHECK(cudaEventSynchronize(t1));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, t0, t1));
    double gbs = g_bytes / (ms * 1e-3) / 1e9;
    if (gbs > best) best = gbs;
  }
  barrier();
  return best;
}

static void report(const char* name, int n, const struct op* ops) {
  double gbs = run(n, ops);
  double peer;
  // rank 1 sends its figure to rank 0, which prints both.
  if (g_rank == 1) {
    if (write(g_sock, &gbs, sizeof gbs) != sizeof gbs) exit(1);
  } else {
    if (read(g_sock, &peer, sizeof peer) != sizeof peer) exit(1);
    printf("%-34s %7.1f %7.1f GB/s\n", name, gbs, peer);
    fflush(stdout);
  }
}

static void rank_main(int rank, int sock, int isolated, size_t mb, const char* devs[2]) {
  g_rank = rank;
  g_sock = sock;
  if (isolated) setenv("CUDA_VISIBLE_DEVICES", devs[rank], 1);
  CHECK_CU(cuInit(0));
  CUdevice dev;
  CHECK_CU(cuDeviceGet(&dev, isolated ? 0 : rank));
  CHECK(cudaSetDevice(isolated ? 0 : rank));
  CHECK(cudaFree(0));
  g_bytes = mb << 20;
  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof prop);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t gran;
  CHECK_CU(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  size_t size = (2 * g_bytes + gran - 1) / gran * gran;
  CUmemGenericAllocationHandle h, ph;
  CHECK_CU(cuMemCreate(&h, size, &prop, 0));
  CUmemAccessDesc acc;
  memset(&acc, 0, sizeof acc);
  acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  acc.location.id = dev;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CUdeviceptr own, peer;
  CHECK_CU(cuMemAddressReserve(&own, size, gran, 0, 0));
  CHECK_CU(cuMemMap(own, size, 0, h, 0));
  CHECK_CU(cuMemSetAccess(own, size, &acc, 1));
  int fd;
  CHECK_CU(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  int peer_fd;
  if (rank == 0) {
    send_fd(sock, fd);
    peer_fd = recv_fd(sock);
  } else {
    peer_fd = recv_fd(sock);
    send_fd(sock, fd);
  }
  CHECK_CU(cuMemImportFromShareableHandle(&ph, (void*)(uintptr_t)peer_fd,
                                    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  CHECK_CU(cuMemAddressReserve(&peer, size, gran, 0, 0));
  CHECK_CU(cuMemMap(peer, size, 0, ph, 0));
  CHECK_CU(cuMemSetAccess(peer, size, &acc, 1));
  g_own = (char*)own;
  g_peer = (char*)peer;
  CHECK(cudaMalloc(&g_local_src, g_bytes));
  CHECK(cudaMalloc(&g_local_dst, g_bytes));
  CHECK(cudaMemset(g_local_src, rank + 1, g_bytes));
  CHECK(cudaMemset(g_own, 0, 2 * g_bytes));
  int lo, hi;
  CHECK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
  for (int i = 0; i < MAXS; i++)
    CHECK(cudaStreamCreateWithPriority(&g_st[i], cudaStreamNonBlocking, i == 1 ? hi : lo));
  CHECK(cudaDeviceSynchronize());
  int sms;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, isolated ? 0 : rank));
  if (rank == 0)
    printf("%s, %zu MB each way, rank 0 / rank 1 (best of 5)\n",
           isolated ? "isolated" : "all visible", mb);

  struct op ce_push = {1, 1, 1.0, 0, 0}, ce_pull = {1, 0, 1.0, 0, 0};
  struct op o[MAXS];
  report("CE push, 1 stream", 1, &ce_push);
  for (int i = 0; i < 2; i++) o[i] = (struct op){1, 1, 0.5, 0, 0};
  report("CE push, 2 streams (2nd high prio)", 2, o);
  for (int i = 0; i < 4; i++) o[i] = (struct op){1, 1, 0.25, 0, 0};
  report("CE push, 4 streams", 4, o);
  report("CE pull, 1 stream", 1, &ce_pull);
  for (int i = 0; i < 2; i++) o[i] = (struct op){1, 0, 0.5, 0, 0};
  report("CE pull, 2 streams", 2, o);
  o[0] = (struct op){1, 1, 0.5, 0, 0};
  o[1] = (struct op){1, 0, 0.5, 0, 0};
  report("CE push + CE pull", 2, o);
  struct op smw = {2, 1, 1.0, sms, 0}, smr = {2, 0, 1.0, sms, 0};
  report("SM write, all SMs", 1, &smw);
  report("SM read, all SMs", 1, &smr);
  smw.blocks = 32;
  report("SM write, 32 blocks", 1, &smw);
  if (getenv("PEER_COPY_MIX")) {
    const double fr[] = {0.5, 0.7, 0.8};
    for (int f = 0; f < 3; f++) {
      char name[64];
      o[0] = (struct op){1, 1, fr[f], 0, 0};
      o[1] = (struct op){2, 1, 1 - fr[f], 64, 0};
      snprintf(name, sizeof name, "CE push %.0f%% + SM write 64 bl", fr[f] * 100);
      report(name, 2, o);
    }
  }
  const int bl[] = {1, 2, 4};
  const int th[] = {256, 512, 1024};
  for (int b = 0; b < 3; b++)
    for (int t = 0; t < 3; t++) {
      if (bl[b] * th[t] > 2048) continue;
      char name[64];
      struct op w = {2, 1, 1.0, bl[b] * sms, th[t]};
      snprintf(name, sizeof name, "SM write %dx%d a SM", bl[b], th[t]);
      report(name, 1, &w);
      w.kind = 3;
      snprintf(name, sizeof name, "SM write x4 unrolled %dx%d a SM", bl[b], th[t]);
      report(name, 1, &w);
    }
  cudaFuncSetAttribute(copy_bulk, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 << 10);
  const unsigned ch[] = {8192, 16384, 32768, 65536};
  const int per[] = {1, 2, 4, 8};
  for (int c = 0; c < 4; c++)
    for (int p = 0; p < 4; p++) {
      if (2 * ch[c] * per[p] > (200u << 10)) continue;
      char name[64];
      struct op w = {4, 1, 1.0, per[p] * sms, (int)ch[c]};
      snprintf(name, sizeof name, "bulk write %u KB x%d a SM", ch[c] >> 10, per[p]);
      report(name, 1, &w);
    }
  // The bulk copy's bytes land: the inbox zeroed, written by the peer, then sampled.
  CHECK(cudaMemset(g_own, 0, g_bytes));
  CHECK(cudaDeviceSynchronize());
  struct op bw = {4, 1, 1.0, 2 * sms, 16384};
  run(1, &bw);
  CHECK(cudaDeviceSynchronize());
  barrier();
  for (size_t at = 0; at < g_bytes; at += g_bytes / 64 + 4096) {
    unsigned char v;
    CHECK(cudaMemcpy(&v, g_own + at, 1, cudaMemcpyDeviceToHost));
    if (v != 2 - rank) {
      fprintf(stderr, "rank %d: byte %zu of the inbox is %d, not %d\n", rank, at, v, 2 - rank);
      exit(1);
    }
  }
  struct op br = {4, 0, 1.0, 4 * sms, 16384};
  report("bulk read 16 KB x4 a SM", 1, &br);
  o[0] = (struct op){1, 1, 0.7, 0, 0};
  o[1] = (struct op){4, 1, 0.3, 2 * sms, 16384};
  report("CE push 70% + bulk write 16 KB x2", 2, o);
}

int main(int argc, char** argv) {
  int isolated = argc < 2 || strcmp(argv[1], "visible") != 0;
  size_t mb = argc > 2 ? strtoul(argv[2], NULL, 10) : 512;
  // The parent's first two GPUs, as the ranks' CUDA_VISIBLE_DEVICES.
  static char list[256];
  const char* env = getenv("CUDA_VISIBLE_DEVICES");
  snprintf(list, sizeof list, "%s", env ? env : "0,1");
  const char* devs[2] = {list, "1"};
  char* comma = strchr(list, ',');
  if (comma) {
    *comma = 0;
    devs[1] = comma + 1;
    char* c2 = strchr(comma + 1, ',');
    if (c2) *c2 = 0;
  }
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
    perror("socketpair");
    return 1;
  }
  pid_t pids[2];
  for (int r = 0; r < 2; r++) {
    pids[r] = fork();
    if (pids[r] == 0) {
      close(sv[1 - r]);
      rank_main(r, sv[r], isolated, mb, devs);
      _exit(0);
    }
  }
  close(sv[0]);
  close(sv[1]);
  int rc = 0;
  for (int r = 0; r < 2; r++) {
    int st;
    waitpid(pids[r], &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) rc = 1;
  }
  return rc;
}
