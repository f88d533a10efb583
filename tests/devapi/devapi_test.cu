/*
 * NCCL 2.28's device API (nccl_device.h) from a program compiled against
 * NCCL's own headers: symmetric windows read through the LSA team with LSA
 * barriers, the LL all-to-all, the pointer and team helpers, and the host
 * API's edge cases. The same binary runs on Braid's libnccl.so.2 (its
 * RUNPATH) and on NVIDIA's (LD_LIBRARY_PATH), so NCCL's inline device code
 * is what reads the structures the library fills.
 *
 *   devapi_test [--isolated] [--nranks N] [--iters N] [--timeout S]
 *
 * N processes (default: one per GPU, at least 2) are forked before any CUDA
 * call; rank 0 makes the unique ids and hands them over in shared memory.
 * --isolated gives each process its own GPU alone (CUDA_VISIBLE_DEVICES).
 * Every result is compared exactly with values the host computes from a seed
 * drawn per run; outputs are poisoned first. One line per case; exit 0 when
 * every case passed on every rank, 77 when skipped, 1 otherwise.
 *
 * Built with -DDEVAPI_BRAID_HEADERS against Braid's include/ instead, the
 * same cases check Braid's own nccl_device.h: its inline code reading the
 * structures the library fills.
 *
 * Checks of Braid's own answers (requirements it refuses, a registration
 * that mixes allocation kinds) run only on Braid: found by its
 * braidGetVersionString symbol, or forced with DEVAPI_LIBRARY=braid|nccl.
 */
#include <stddef.h>
#include <stdint.h>

#include <nccl.h>
#include <nccl_device.h>

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <type_traits>
#include <vector>

#if defined(BRAID_VERSION_CODE) && !defined(DEVAPI_BRAID_HEADERS)
#error "devapi_test is compiled against NCCL's nccl.h, or against Braid's include/ with -DDEVAPI_BRAID_HEADERS"
#endif
#if defined(DEVAPI_BRAID_HEADERS) && !defined(BRAID_VERSION_CODE)
#error "DEVAPI_BRAID_HEADERS: nccl.h came from NCCL, not from Braid's include/"
#endif
#if NCCL_VERSION_CODE != 22809
#error "devapi_test needs NCCL 2.28.9's headers (NCCL_VERSION_CODE 22809)"
#endif

#define SKIP_CODE 77
#define MAX_RANKS 16
#define NCASES 4
#define NBLOCKS 8     /* CTAs of the window kernel, one LSA barrier each */
#define A2A_BLOCKS 2  /* CTAs of the LL all-to-all kernel */
#define A2A_K 4       /* values each rank sends each peer per epoch */
#define A2A_EPOCHS 5  /* epochs per launch */
#define A2A_LAUNCHES 3

static const char* const case_names[NCASES] = {"a windows", "b lla2a", "c pointers", "d host_api"};

enum { ST_NOT_RUN = 0, ST_PASS, ST_FAIL };

struct rank_result {
  int status[NCASES];
  double ms[NCASES];
  char msg[NCASES][320];
};

/* Shared by the parent and the ranks (MAP_SHARED, made before the fork). */
struct shared_state {
  int ngpus, probe_done, version;
  int nranks, iters, is_braid;
  uint64_t seed;
  int id_ready[3];
  ncclUniqueId id[3]; /* the main communicator, then two for case d */
  int bar_count, bar_gen;
  rank_result res[MAX_RANKS];
};

static shared_state* g_sh;
static int g_rank = -1;
static volatile int g_case = -1;
static int g_case_alarm = 120;

/* ---- values: a hash of the run's seed and the coordinates of a value ---- */

__host__ __device__ static inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
__host__ __device__ static inline uint64_t hash5(uint64_t seed, uint64_t a, uint64_t b, uint64_t c,
                                                 uint64_t d) {
  return mix64(seed ^ mix64(a ^ mix64(b ^ mix64(c ^ mix64(d)))));
}

/* Element values of case a: sums of up to 16 of them are exact in either type, in any order. */
static inline void make_elt(uint64_t h, int32_t* v) { *v = (int32_t)(h & 0xfffff); }
static inline void make_elt(uint64_t h, float* v) { *v = (float)((int)(h & 0x7ff) - 1024) * 0.25f; }

struct pair16 {
  uint64_t a, b;
};
/* Values of case b: the top bit is clear, so no value equals the all-ones poison. */
__host__ __device__ static inline void make_a2a(uint64_t h, uint64_t* v) { *v = h >> 1; }
__host__ __device__ static inline void make_a2a(uint64_t h, pair16* v) {
  v->a = h >> 1;
  v->b = mix64(h) >> 1;
}
static inline bool same(uint64_t x, uint64_t y) { return x == y; }
static inline bool same(pair16 x, pair16 y) { return x.a == y.a && x.b == y.b; }

/* ---- reporting ---- */

static void case_fail(int line, const char* fmt, ...) {
  char buf[320];
  va_list ap;
  va_start(ap, fmt);
  int n = snprintf(buf, sizeof buf, "line %d: ", line);
  vsnprintf(buf + n, sizeof buf - n, fmt, ap);
  va_end(ap);
  fprintf(stderr, "rank %d, case %s: %s\n", g_rank, g_case >= 0 ? case_names[g_case] : "setup", buf);
  if (g_case >= 0 && g_sh->res[g_rank].msg[g_case][0] == 0)
    memcpy(g_sh->res[g_rank].msg[g_case], buf, sizeof buf);
}

#define CHECK(cond, ...)                \
  do {                                  \
    if (!(cond)) {                      \
      case_fail(__LINE__, __VA_ARGS__); \
      return false;                     \
    }                                   \
  } while (0)
#define NCCL_OK(comm, call)                                                            \
  do {                                                                                 \
    ncclResult_t r_ = (call);                                                          \
    CHECK(r_ == ncclSuccess, "%s: %s (%s)", #call, ncclGetErrorString(r_),             \
          (comm) ? ncclGetLastError(comm) : "");                                       \
  } while (0)
#define CUDA_OK(call)                                                                  \
  do {                                                                                 \
    cudaError_t e_ = (call);                                                           \
    CHECK(e_ == cudaSuccess, "%s: %s", #call, cudaGetErrorString(e_));                 \
  } while (0)

static void on_alarm(int) {
  static const char msg[] = "timed out (alarm)";
  int c = g_case;
  if (c >= 0) memcpy(g_sh->res[g_rank].msg[c], msg, sizeof msg);
  static const char line[] = "devapi_test: a rank timed out\n";
  ssize_t ignored = write(2, line, sizeof line - 1);
  (void)ignored;
  _exit(2);
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* All ranks meet (shared memory; 120 s at most). */
static bool host_barrier(void) {
  int gen = __atomic_load_n(&g_sh->bar_gen, __ATOMIC_ACQUIRE);
  if (__atomic_add_fetch(&g_sh->bar_count, 1, __ATOMIC_ACQ_REL) == g_sh->nranks) {
    __atomic_store_n(&g_sh->bar_count, 0, __ATOMIC_RELAXED);
    __atomic_add_fetch(&g_sh->bar_gen, 1, __ATOMIC_RELEASE);
    return true;
  }
  double end = now_ms() + 120e3;
  while (now_ms() < end) {
    if (__atomic_load_n(&g_sh->bar_gen, __ATOMIC_ACQUIRE) != gen) return true;
    usleep(50);
  }
  return false;
}

/* Unique id k: rank 0 makes it, the others wait for it. */
static bool get_id(int k, ncclUniqueId* id) {
  if (g_rank == 0) {
    NCCL_OK((ncclComm_t)NULL, ncclGetUniqueId(&g_sh->id[k]));
    __atomic_store_n(&g_sh->id_ready[k], 1, __ATOMIC_RELEASE);
  }
  double end = now_ms() + 120e3;
  while (!__atomic_load_n(&g_sh->id_ready[k], __ATOMIC_ACQUIRE)) {
    CHECK(now_ms() < end, "unique id %d never came", k);
    usleep(100);
  }
  *id = g_sh->id[k];
  return true;
}

/* ---- case a: an all-reduce over the LSA team through a symmetric window ---- */

template <typename T>
__global__ void lsa_allreduce_kernel(ncclDevComm dc, ncclWindow_t win, T* out, size_t count) {
  ncclCoopCta cta;
  ncclLsaBarrierSession<ncclCoopCta> bar(cta, dc, ncclTeamTagLsa(), blockIdx.x);
  bar.sync(cta, cuda::memory_order_acq_rel); /* every rank's new values are in place */
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count;
       i += (size_t)gridDim.x * blockDim.x) {
    T acc = 0;
    for (int p = 0; p < dc.lsaSize; p++) acc += ((T const*)ncclGetLsaPointer(win, 0, p))[i];
    out[i] = acc;
  }
  bar.sync(cta, cuda::memory_order_acq_rel); /* no rank overwrites a value still being read */
}

struct world_info {
  ncclComm_t comm;
  int rank, nranks;
  ncclTeam_t lsa;
  int lsa_world[MAX_RANKS]; /* world rank of each LSA rank */
  cudaStream_t stream;
};

template <typename T>
static bool allreduce_size(world_info& w, ncclDevComm& dc, size_t bytes, int* mismatches) {
  size_t count = bytes / sizeof(T);
  void* buf = NULL;
  T* out = NULL;
  ncclWindow_t win = NULL;
  NCCL_OK(w.comm, ncclMemAlloc(&buf, bytes));
  NCCL_OK(w.comm, ncclCommWindowRegister(w.comm, buf, bytes, &win, NCCL_WIN_COLL_SYMMETRIC));
  CHECK(win != NULL, "ncclCommWindowRegister gave no window");
  CUDA_OK(cudaMalloc(&out, bytes));
  std::vector<T> mine(count), expect(count), got(count);
  const bool is_float = std::is_same<T, float>::value;
  uint64_t tag = bytes * 2 + is_float;
  for (int it = 0; it < g_sh->iters; it++) {
    /* One hash per (iteration, rank), one mix per element: the host keeps up with the GPUs. */
    uint64_t h = hash5(g_sh->seed, tag, it, w.rank, 0);
    for (size_t i = 0; i < count; i++) make_elt(mix64(h + i), &mine[i]);
    for (size_t i = 0; i < count; i++) expect[i] = 0;
    for (int p = 0; p < w.lsa.nRanks; p++) {
      h = hash5(g_sh->seed, tag, it, w.lsa_world[p], 0);
      for (size_t i = 0; i < count; i++) {
        T v;
        make_elt(mix64(h + i), &v);
        expect[i] += v;
      }
    }
    CUDA_OK(cudaMemcpyAsync(buf, mine.data(), bytes, cudaMemcpyHostToDevice, w.stream));
    CUDA_OK(cudaMemsetAsync(out, 0xff, bytes, w.stream));
    lsa_allreduce_kernel<T><<<NBLOCKS, 256, 0, w.stream>>>(dc, win, out, count);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaMemcpyAsync(got.data(), out, bytes, cudaMemcpyDeviceToHost, w.stream));
    CUDA_OK(cudaStreamSynchronize(w.stream));
    for (size_t i = 0; i < count; i++) {
      if (memcmp(&got[i], &expect[i], sizeof(T)) == 0) continue;
      if ((*mismatches)++ == 0)
        case_fail(__LINE__, "%zu bytes of %s, iteration %d, element %zu: got %g, expected %g",
                  bytes, is_float ? "float" : "int32", it, i,
                  (double)got[i], (double)expect[i]);
    }
  }
  NCCL_OK(w.comm, ncclCommWindowDeregister(w.comm, win));
  NCCL_OK(w.comm, ncclMemFree(buf));
  CUDA_OK(cudaFree(out));
  return true;
}

static bool case_windows(world_info& w) {
  static const size_t sizes[] = {4, 12, 4096 + 4, 65536, (1 << 20) + 4096, (3 << 20) + 20};
  ncclDevCommRequirements reqs;
  memset(&reqs, 0, sizeof reqs);
  reqs.lsaBarrierCount = NBLOCKS;
  ncclDevComm dc;
  memset(&dc, 0, sizeof dc);
  NCCL_OK(w.comm, ncclDevCommCreate(w.comm, &reqs, &dc));
  CHECK(dc.lsaSize == w.lsa.nRanks && dc.lsaRank == w.lsa.rank,
        "ncclDevComm's LSA team %d of %d, the host's %d of %d", dc.lsaRank, dc.lsaSize,
        w.lsa.rank, w.lsa.nRanks);
  CHECK(dc.lsaBarrier.nBarriers == NBLOCKS, "lsaBarrier.nBarriers %d, asked for %d",
        dc.lsaBarrier.nBarriers, NBLOCKS);
  int mismatches = 0;
  for (size_t bytes : sizes) {
    if (!allreduce_size<float>(w, dc, bytes, &mismatches)) return false;
    if (!allreduce_size<int32_t>(w, dc, bytes, &mismatches)) return false;
  }
  NCCL_OK(w.comm, ncclDevCommDestroy(w.comm, &dc));
  CHECK(mismatches == 0, "%d wrong elements", mismatches);
  return true;
}

/* ---- case b: the LL all-to-all ---- */

template <typename T>
__global__ void lla2a_kernel(ncclDevComm dc, ncclLLA2AHandle h, ncclLsaBarrierHandle userBar,
                             uint64_t seed, uint64_t tag, T* out) {
  ncclCoopCta cta;
  ncclTeam team = ncclTeamLsa(dc);
  int n = team.nRanks, me = team.rank, b = blockIdx.x, t = threadIdx.x;
  {
    /* A barrier from the caller's own resource requirement, next to the LL buffers. */
    ncclLsaBarrierSession<ncclCoopCta> bar(cta, dc, team, userBar, blockIdx.x);
    bar.sync(cta, cuda::memory_order_acq_rel);
  }
  ncclLLA2ASession<ncclCoopCta> a2a(cta, dc, team, h, b, n * A2A_K);
  for (int e = 0; e < A2A_EPOCHS; e++) {
    if (t < n * A2A_K) {
      int peer = t / A2A_K, k = t % A2A_K;
      T v;
      make_a2a(hash5(seed, tag, e * 64 + b, me * 64 + peer, k), &v);
      a2a.send(peer, me * A2A_K + k, v); /* the peer's slot for (me, k) */
    }
    if (t < n * A2A_K) out[((size_t)e * gridDim.x + b) * n * A2A_K + t] = a2a.template recv<T>(t);
    a2a.endEpoch(cta);
  }
}

template <typename T>
static bool lla2a_run(world_info& w, ncclDevComm& dc, ncclLLA2AHandle h, ncclLsaBarrierHandle ub,
                      int launch, int* mismatches) {
  int n = w.lsa.nRanks, me = w.lsa.rank;
  size_t count = (size_t)A2A_EPOCHS * A2A_BLOCKS * n * A2A_K;
  T* out = NULL;
  CUDA_OK(cudaMalloc(&out, count * sizeof(T)));
  CUDA_OK(cudaMemsetAsync(out, 0xff, count * sizeof(T), w.stream));
  uint64_t tag = launch * 2 + (sizeof(T) == 16);
  lla2a_kernel<T><<<A2A_BLOCKS, 128, 0, w.stream>>>(dc, h, ub, g_sh->seed, tag, out);
  CUDA_OK(cudaGetLastError());
  std::vector<T> got(count);
  CUDA_OK(cudaMemcpyAsync(got.data(), out, count * sizeof(T), cudaMemcpyDeviceToHost, w.stream));
  CUDA_OK(cudaStreamSynchronize(w.stream));
  CUDA_OK(cudaFree(out));
  for (int e = 0; e < A2A_EPOCHS; e++) {
    for (int b = 0; b < A2A_BLOCKS; b++) {
      for (int src = 0; src < n; src++) {
        for (int k = 0; k < A2A_K; k++) {
          T v;
          make_a2a(hash5(g_sh->seed, tag, e * 64 + b, src * 64 + me, k), &v);
          size_t i = ((size_t)e * A2A_BLOCKS + b) * n * A2A_K + src * A2A_K + k;
          if (same(got[i], v)) continue;
          if ((*mismatches)++ == 0)
            case_fail(__LINE__, "%zu-byte values, launch %d, epoch %d, block %d, from LSA rank "
                      "%d, value %d: wrong", sizeof(T), launch, e, b, src, k);
        }
      }
    }
  }
  return true;
}

static bool case_lla2a(world_info& w) {
  int n = w.lsa.nRanks;
  int nslots = ncclLLA2ACalcSlots(n * A2A_K, (int)sizeof(pair16));
  CHECK(nslots == n * A2A_K * 2, "ncclLLA2ACalcSlots(%d, 16) = %d", n * A2A_K, nslots);
  ncclLLA2AHandle h;
  ncclLsaBarrierHandle ub;
  ncclDevResourceRequirements a2a_req, bar_req;
  memset(&h, 0xee, sizeof h);
  memset(&ub, 0xee, sizeof ub);
  NCCL_OK(w.comm, ncclLLA2ACreateRequirement(A2A_BLOCKS, nslots, &h, &a2a_req));
  NCCL_OK(w.comm, ncclLsaBarrierCreateRequirement(w.lsa, A2A_BLOCKS, &ub, &bar_req));
  /* What NCCL's inline code will index: the sizes it needs must be asked for. */
  CHECK(h.nSlots == (uint32_t)nslots && a2a_req.outBufferHandle == &h.bufHandle &&
            a2a_req.bufferSize >= (size_t)A2A_BLOCKS * (1 + 2 * nslots) * 16,
        "LL requirement: nSlots %u, size %zu", h.nSlots, a2a_req.bufferSize);
  CHECK(ub.nBarriers == A2A_BLOCKS && bar_req.outBufferHandle == &ub.bufHandle &&
            bar_req.bufferSize >= (size_t)(3 + n) * A2A_BLOCKS * 4,
        "barrier requirement: nBarriers %d, size %zu", ub.nBarriers, bar_req.bufferSize);
  a2a_req.next = &bar_req;
  bar_req.next = NULL;
  ncclDevCommRequirements reqs;
  memset(&reqs, 0, sizeof reqs);
  reqs.resourceRequirementsList = &a2a_req;
  ncclDevComm dc;
  NCCL_OK(w.comm, ncclDevCommCreate(w.comm, &reqs, &dc));
  size_t a_off = ncclGetResourceBufferOffset(h.bufHandle);
  size_t b_off = ncclGetResourceBufferOffset(ub.bufHandle);
  CHECK(a_off + a2a_req.bufferSize <= b_off || b_off + bar_req.bufferSize <= a_off,
        "the two resource buffers overlap: [%zu, +%zu) and [%zu, +%zu)", a_off,
        a2a_req.bufferSize, b_off, bar_req.bufferSize);
  int mismatches = 0;
  for (int launch = 0; launch < A2A_LAUNCHES; launch++) {
    if (!lla2a_run<uint64_t>(w, dc, h, ub, launch, &mismatches)) return false;
    if (!lla2a_run<pair16>(w, dc, h, ub, launch, &mismatches)) return false;
  }
  NCCL_OK(w.comm, ncclDevCommDestroy(w.comm, &dc));
  CHECK(mismatches == 0, "%d wrong values", mismatches);
  return true;
}

/* ---- case c: pointers, teams and the window table on the device ---- */

struct ptr_report {
  int rank, nranks, lsa_rank, lsa_size;
  ncclTeam lsa, world, rail;
  int lsa_to_world[MAX_RANKS];
  uintptr_t local, lsa_ptr[MAX_RANKS], peer_ptr[MAX_RANKS], peer_team_ptr[MAX_RANKS];
  uint64_t marker[MAX_RANKS];
  ncclWindow_t found[3][3];
};
struct three_windows {
  ncclWindow_t win[3];
  char* base[3];
  size_t size[3];
};

#define MARKER_OFFSET (4096 + 8)

__global__ void ptr_kernel(ncclDevComm dc, three_windows tw, ptr_report* r) {
  ncclWindow_t win = tw.win[0];
  if (threadIdx.x == 0) {
    r->rank = dc.rank;
    r->nranks = dc.nRanks;
    r->lsa_rank = dc.lsaRank;
    r->lsa_size = dc.lsaSize;
    r->lsa = ncclTeamLsa(dc);
    r->world = ncclTeamWorld(dc);
    r->rail = ncclTeamRail(dc);
    r->local = (uintptr_t)ncclGetLocalPointer(win, MARKER_OFFSET);
    for (int i = 0; i < dc.lsaSize && i < MAX_RANKS; i++) {
      int world = ncclTeamRankToWorld(dc, r->lsa, i);
      r->lsa_to_world[i] = world;
      r->lsa_ptr[i] = (uintptr_t)ncclGetLsaPointer(win, MARKER_OFFSET, i);
      r->peer_ptr[i] = (uintptr_t)ncclGetPeerPointer(win, MARKER_OFFSET, world);
      r->peer_team_ptr[i] = (uintptr_t)ncclGetPeerPointer(win, MARKER_OFFSET, r->lsa, i);
      r->marker[i] = *(volatile uint64_t*)r->lsa_ptr[i];
    }
  }
  /* A warp looks each window up by its first byte, a middle byte and its last byte. */
  for (int k = 0; k < 3; k++) {
    size_t where[3] = {0, tw.size[k] / 2 + 1, tw.size[k] - 1};
    for (int j = 0; j < 3; j++) {
      ncclWindow_t f = ncclFindWindow(ncclCoopCta(), dc, tw.base[k] + where[j]);
      if (threadIdx.x == 0) r->found[k][j] = f;
    }
  }
}

static bool same_team(ncclTeam a, ncclTeam b) {
  return a.nRanks == b.nRanks && a.rank == b.rank && a.stride == b.stride;
}

static bool case_pointers(world_info& w) {
  static const size_t sizes[3] = {(1 << 20) + 4096, 2 << 20, 64 << 10};
  three_windows tw;
  for (int k = 0; k < 3; k++) {
    tw.size[k] = sizes[k];
    NCCL_OK(w.comm, ncclMemAlloc((void**)&tw.base[k], sizes[k]));
    NCCL_OK(w.comm, ncclCommWindowRegister(w.comm, tw.base[k], sizes[k], &tw.win[k],
                                           NCCL_WIN_COLL_SYMMETRIC));
  }
  uint64_t marker = hash5(g_sh->seed, 'c', w.rank, 0, 0);
  CUDA_OK(cudaMemcpy(tw.base[0] + MARKER_OFFSET, &marker, 8, cudaMemcpyHostToDevice));
  CUDA_OK(cudaDeviceSynchronize());
  CHECK(host_barrier(), "host barrier timed out");
  ncclDevCommRequirements reqs;
  memset(&reqs, 0, sizeof reqs);
  ncclDevComm dc;
  NCCL_OK(w.comm, ncclDevCommCreate(w.comm, &reqs, &dc));
  ptr_report* r = NULL;
  CUDA_OK(cudaMallocHost((void**)&r, sizeof *r));
  memset(r, 0xa5, sizeof *r);
  ptr_kernel<<<1, 32, 0, w.stream>>>(dc, tw, r);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaStreamSynchronize(w.stream));
  CHECK(host_barrier(), "host barrier timed out");

  ncclTeam_t hw = ncclTeamWorld(w.comm), hl = ncclTeamLsa(w.comm), hr = ncclTeamRail(w.comm);
  CHECK(r->rank == w.rank && r->nranks == w.nranks, "device rank %d of %d, host %d of %d",
        r->rank, r->nranks, w.rank, w.nranks);
  CHECK(hw.nRanks == w.nranks && hw.rank == w.rank && hw.stride == 1,
        "host ncclTeamWorld {%d, %d, %d}", hw.nRanks, hw.rank, hw.stride);
  CHECK(same_team(r->world, hw), "device ncclTeamWorld {%d, %d, %d}", r->world.nRanks,
        r->world.rank, r->world.stride);
  CHECK(same_team(r->lsa, hl), "device ncclTeamLsa {%d, %d, %d}, host {%d, %d, %d}",
        r->lsa.nRanks, r->lsa.rank, r->lsa.stride, hl.nRanks, hl.rank, hl.stride);
  CHECK(same_team(r->rail, hr), "device ncclTeamRail {%d, %d, %d}, host {%d, %d, %d}",
        r->rail.nRanks, r->rail.rank, r->rail.stride, hr.nRanks, hr.rank, hr.stride);
  CHECK(r->lsa_rank == hl.rank && r->lsa_size == hl.nRanks, "lsaRank/lsaSize %d/%d",
        r->lsa_rank, r->lsa_size);
  for (int i = 0; i < hl.nRanks; i++) {
    int world = ncclTeamRankToWorld(w.comm, hl, i);
    CHECK(r->lsa_to_world[i] == world, "LSA rank %d: world %d on the device, %d on the host", i,
          r->lsa_to_world[i], world);
    CHECK(ncclTeamRankToLsa(w.comm, hw, world) == i, "ncclTeamRankToLsa(world %d) = %d, not %d",
          world, ncclTeamRankToLsa(w.comm, hw, world), i);
    CHECK(r->peer_ptr[i] == r->lsa_ptr[i] && r->peer_team_ptr[i] == r->lsa_ptr[i],
          "LSA rank %d: ncclGetPeerPointer %#lx / %#lx, ncclGetLsaPointer %#lx", i,
          (unsigned long)r->peer_ptr[i], (unsigned long)r->peer_team_ptr[i],
          (unsigned long)r->lsa_ptr[i]);
    uint64_t want = hash5(g_sh->seed, 'c', world, 0, 0);
    CHECK(r->marker[i] == want, "LSA rank %d's buffer read %#llx, it wrote %#llx", i,
          (unsigned long long)r->marker[i], (unsigned long long)want);
  }
  CHECK(r->local == r->lsa_ptr[hl.rank], "ncclGetLocalPointer %#lx, own LSA pointer %#lx",
        (unsigned long)r->local, (unsigned long)r->lsa_ptr[hl.rank]);
  for (int k = 0; k < 3; k++)
    for (int j = 0; j < 3; j++)
      CHECK(r->found[k][j] == tw.win[k], "ncclFindWindow(window %d, probe %d) = %p, not %p", k,
            j, (void*)r->found[k][j], (void*)tw.win[k]);
  CUDA_OK(cudaFreeHost(r));
  NCCL_OK(w.comm, ncclDevCommDestroy(w.comm, &dc));
  for (int k = 0; k < 3; k++) {
    NCCL_OK(w.comm, ncclCommWindowDeregister(w.comm, tw.win[k]));
    NCCL_OK(w.comm, ncclMemFree(tw.base[k]));
  }
  return true;
}

/* ---- case d: the host API's edges ---- */

/* Reads every LSA peer's first 8 bytes of the window. */
__global__ void read_markers_kernel(ncclWindow_t win, int n, uint64_t* out) {
  if (threadIdx.x < n) out[threadIdx.x] = *(volatile uint64_t*)ncclGetLsaPointer(win, 0, threadIdx.x);
}

static bool reregister(world_info& w) {
  size_t bytes = (1 << 20) + 4096;
  void* buf = NULL;
  ncclWindow_t win = NULL;
  NCCL_OK(w.comm, ncclMemAlloc(&buf, bytes));
  NCCL_OK(w.comm, ncclCommWindowRegister(w.comm, buf, bytes, &win, NCCL_WIN_COLL_SYMMETRIC));
  NCCL_OK(w.comm, ncclCommWindowDeregister(w.comm, win));
  win = NULL;
  NCCL_OK(w.comm, ncclCommWindowRegister(w.comm, buf, bytes, &win, NCCL_WIN_COLL_SYMMETRIC));
  uint64_t marker = hash5(g_sh->seed, 'd', w.rank, 1, 0);
  CUDA_OK(cudaMemcpy(buf, &marker, 8, cudaMemcpyHostToDevice));
  CUDA_OK(cudaDeviceSynchronize());
  CHECK(host_barrier(), "host barrier timed out");
  uint64_t* got = NULL;
  CUDA_OK(cudaMallocHost((void**)&got, MAX_RANKS * 8));
  memset(got, 0xff, MAX_RANKS * 8);
  read_markers_kernel<<<1, 32, 0, w.stream>>>(win, w.lsa.nRanks, got);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaStreamSynchronize(w.stream));
  CHECK(host_barrier(), "host barrier timed out");
  for (int i = 0; i < w.lsa.nRanks; i++) {
    uint64_t want = hash5(g_sh->seed, 'd', w.lsa_world[i], 1, 0);
    CHECK(got[i] == want, "re-registered window: LSA rank %d read %#llx, wrote %#llx", i,
          (unsigned long long)got[i], (unsigned long long)want);
  }
  CUDA_OK(cudaFreeHost(got));
  NCCL_OK(w.comm, ncclCommWindowDeregister(w.comm, win));
  NCCL_OK(w.comm, ncclMemFree(buf));
  return true;
}

static bool devcomm_twice(world_info& w) {
  for (int i = 0; i < 2; i++) {
    ncclDevCommRequirements reqs;
    memset(&reqs, 0, sizeof reqs);
    reqs.lsaBarrierCount = 4 + i;
    ncclDevComm dc;
    NCCL_OK(w.comm, ncclDevCommCreate(w.comm, &reqs, &dc));
    NCCL_OK(w.comm, ncclDevCommDestroy(w.comm, &dc));
  }
  return true;
}

/*
 * Requirements Braid does not offer (GIN, multimem) are refused, on every rank. Rail barriers
 * are GIN's only across hosts: here every rank is in the LSA team, so each rank's rail is itself
 * and they are granted (PyTorch asks for them on any machine).
 */
static bool refused_requirements(world_info& w) {
  {
    ncclDevCommRequirements reqs;
    memset(&reqs, 0, sizeof reqs);
    reqs.railGinBarrierCount = 1;
    ncclDevComm dc;
    NCCL_OK(w.comm, ncclDevCommCreate(w.comm, &reqs, &dc));
    NCCL_OK(w.comm, ncclDevCommDestroy(w.comm, &dc));
  }
  for (int which = 0; which < 2; which++) {
    ncclDevCommRequirements reqs;
    memset(&reqs, 0, sizeof reqs);
    if (which == 0) reqs.ginSignalCount = 1;
    if (which == 1) reqs.lsaMultimem = true;
    ncclDevComm dc;
    ncclResult_t r = ncclDevCommCreate(w.comm, &reqs, &dc);
    CHECK(r == ncclInvalidUsage, "requirement %s: %s, expected ncclInvalidUsage",
          which == 0 ? "ginSignalCount" : "lsaMultimem", ncclGetErrorString(r));
  }
  return true;
}

/* A second communicator destroyed with a window still registered. */
static bool destroy_with_window(world_info& w) {
  ncclUniqueId id;
  if (!get_id(1, &id)) return false;
  ncclComm_t c = NULL;
  NCCL_OK(c, ncclCommInitRank(&c, w.nranks, id, w.rank));
  void* buf = NULL;
  ncclWindow_t win = NULL;
  NCCL_OK(c, ncclMemAlloc(&buf, 1 << 20));
  NCCL_OK(c, ncclCommWindowRegister(c, buf, 1 << 20, &win, NCCL_WIN_COLL_SYMMETRIC));
  NCCL_OK((ncclComm_t)NULL, ncclCommDestroy(c));
  NCCL_OK((ncclComm_t)NULL, ncclMemFree(buf));
  return true;
}

/* One rank registers a cudaMalloc'd buffer: every rank's registration fails within 30 s, and
 * the error names that rank. */
static bool mixed_allocation(world_info& w) {
  ncclUniqueId id;
  if (!get_id(2, &id)) return false;
  ncclComm_t c = NULL;
  NCCL_OK(c, ncclCommInitRank(&c, w.nranks, id, w.rank));
  int bad = w.nranks - 1;
  void* buf = NULL;
  if (w.rank == bad) {
    CUDA_OK(cudaMalloc(&buf, 1 << 20));
  } else {
    NCCL_OK(c, ncclMemAlloc(&buf, 1 << 20));
  }
  ncclWindow_t win = NULL;
  alarm(30);
  ncclResult_t r = ncclCommWindowRegister(c, buf, 1 << 20, &win, NCCL_WIN_COLL_SYMMETRIC);
  alarm(g_case_alarm);
  const char* err = ncclGetLastError(c);
  char want[32];
  snprintf(want, sizeof want, "rank %d", bad);
  CHECK(r != ncclSuccess, "registration succeeded although rank %d's buffer is cudaMalloc'd",
        bad);
  CHECK(err != NULL && strstr(err, want) != NULL, "last error \"%s\" does not name %s",
        err ? err : "(null)", want);
  if (w.rank == bad) {
    CUDA_OK(cudaFree(buf));
  } else {
    NCCL_OK(c, ncclMemFree(buf));
  }
  NCCL_OK((ncclComm_t)NULL, ncclCommDestroy(c));
  return true;
}

static bool case_host_api(world_info& w) {
  if (!reregister(w) || !devcomm_twice(w)) return false;
  if (g_sh->is_braid && !refused_requirements(w)) return false;
  if (!destroy_with_window(w)) return false;
  if (g_sh->is_braid && !mixed_allocation(w)) return false;
  return true;
}

/* ---- one rank ---- */

typedef bool (*case_fn)(world_info&);

static void run_case(int idx, case_fn fn, world_info& w) {
  rank_result* res = &g_sh->res[g_rank];
  g_case = idx;
  alarm(g_case_alarm);
  double t0 = now_ms();
  bool ok = fn(w);
  alarm(0);
  res->ms[idx] = now_ms() - t0;
  res->status[idx] = ok ? ST_PASS : ST_FAIL;
  g_case = -1;
  if (!ok) _exit(1); /* the other ranks may be waiting in a call this rank will not make */
}

static int rank_main(int rank, int isolated) {
  g_rank = rank;
  signal(SIGALRM, on_alarm);
  world_info w;
  memset(&w, 0, sizeof w);
  w.rank = rank;
  w.nranks = g_sh->nranks;
  if (!isolated && cudaSetDevice(rank) != cudaSuccess) return 1;
  if (cudaStreamCreateWithFlags(&w.stream, cudaStreamNonBlocking) != cudaSuccess) return 1;
  ncclUniqueId id;
  g_case = 0; /* a setup failure is reported on the first case */
  alarm(g_case_alarm);
  if (!get_id(0, &id)) return 1;
  ncclResult_t r = ncclCommInitRank(&w.comm, w.nranks, id, rank);
  if (r != ncclSuccess) {
    case_fail(__LINE__, "ncclCommInitRank: %s", ncclGetErrorString(r));
    return 1;
  }
  w.lsa = ncclTeamLsa(w.comm);
  if (w.lsa.nRanks < 2 || w.lsa.nRanks > MAX_RANKS) {
    case_fail(__LINE__, "LSA team of %d ranks: the GPUs do not reach each other's memory",
              w.lsa.nRanks);
    return 1;
  }
  for (int i = 0; i < w.lsa.nRanks; i++) w.lsa_world[i] = ncclTeamRankToWorld(w.comm, w.lsa, i);
  alarm(0);
  g_case = -1;
  run_case(0, case_windows, w);
  run_case(1, case_lla2a, w);
  run_case(2, case_pointers, w);
  run_case(3, case_host_api, w);
  r = ncclCommDestroy(w.comm);
  if (r != ncclSuccess) {
    fprintf(stderr, "rank %d: ncclCommDestroy: %s\n", rank, ncclGetErrorString(r));
    return 1;
  }
  return 0;
}

/* ---- the parent: no CUDA call here, only forks ---- */

static int probe_gpus(void) {
  pid_t pid = fork();
  if (pid == 0) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    g_sh->ngpus = n;
    ncclGetVersion(&g_sh->version); /* the library's first call may initialise CUDA */
    __atomic_store_n(&g_sh->probe_done, 1, __ATOMIC_RELEASE);
    _exit(0);
  }
  int st;
  waitpid(pid, &st, 0);
  return __atomic_load_n(&g_sh->probe_done, __ATOMIC_ACQUIRE) ? g_sh->ngpus : 0;
}

/* The GPU rank r sees alone: the r-th entry of CUDA_VISIBLE_DEVICES if set, else r. */
static void isolate(int r) {
  char gpu[64];
  snprintf(gpu, sizeof gpu, "%d", r);
  const char* vis = getenv("CUDA_VISIBLE_DEVICES");
  if (vis && *vis) {
    const char* p = vis;
    for (int i = 0; i < r && p; i++) {
      p = strchr(p, ',');
      if (p) p++;
    }
    if (p) {
      size_t len = strcspn(p, ",");
      if (len >= sizeof gpu) len = sizeof gpu - 1;
      memcpy(gpu, p, len);
      gpu[len] = 0;
    }
  }
  setenv("CUDA_VISIBLE_DEVICES", gpu, 1);
}

static uint64_t draw_seed(void) {
  uint64_t s = 0;
  int fd = open("/dev/urandom", O_RDONLY);
  if (fd >= 0) {
    if (read(fd, &s, sizeof s) != (ssize_t)sizeof s) s = 0;
    close(fd);
  }
  return s ^ ((uint64_t)time(NULL) << 20) ^ (uint64_t)getpid();
}

static int report(int nranks, const int* exit_ok) {
  int all_pass = 1, passed = 0;
  for (int c = 0; c < NCASES; c++) {
    int pass = 1;
    double ms = 0;
    const char* why = "";
    for (int r = 0; r < nranks; r++) {
      rank_result* res = &g_sh->res[r];
      if (res->ms[c] > ms) ms = res->ms[c];
      if (res->status[c] != ST_PASS) {
        if (pass && res->msg[c][0]) why = res->msg[c];
        if (pass && !res->msg[c][0]) why = res->status[c] == ST_NOT_RUN ? "not run" : "failed";
        pass = 0;
      }
    }
    printf("devapi %-12s %s  %9.1f ms (slowest of %d ranks)%s%s\n", case_names[c],
           pass ? "PASS" : "FAIL", ms, nranks, pass ? "" : ": ", why);
    passed += pass;
    all_pass &= pass;
  }
  for (int r = 0; r < nranks; r++) {
    if (!exit_ok[r]) {
      printf("devapi rank %d did not exit cleanly\n", r);
      all_pass = 0;
    }
  }
  return all_pass && passed == NCASES ? 0 : 1;
}

int main(int argc, char** argv) {
  int isolated = 0, nranks = 0, iters = 50, timeout_s = 540;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--isolated")) isolated = 1;
    else if (!strcmp(argv[i], "--nranks") && i + 1 < argc) nranks = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--timeout") && i + 1 < argc) timeout_s = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: %s [--isolated] [--nranks N] [--iters N] [--timeout S]\n", argv[0]);
      return 2;
    }
  }
  g_sh = (shared_state*)mmap(NULL, sizeof(shared_state), PROT_READ | PROT_WRITE,
                             MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (g_sh == MAP_FAILED) return 1;
  memset(g_sh, 0, sizeof *g_sh);
  int ngpus = probe_gpus();
  if (ngpus < 2) {
    printf("SKIP: devapi_test needs 2 GPUs, found %d\n", ngpus);
    return SKIP_CODE;
  }
  if (nranks == 0) nranks = ngpus < MAX_RANKS ? ngpus : MAX_RANKS;
  if (nranks < 2 || nranks > ngpus || nranks > MAX_RANKS || iters < 1) {
    printf("SKIP: %d ranks asked for, %d GPUs here (one GPU per rank, 2 to %d ranks)\n", nranks,
           ngpus, MAX_RANKS);
    return SKIP_CODE;
  }
  const char* lib = getenv("DEVAPI_LIBRARY");
  int is_braid = dlsym(RTLD_DEFAULT, "braidGetVersionString") != NULL;
  if (lib && !strcmp(lib, "braid")) is_braid = 1;
  if (lib && !strcmp(lib, "nccl")) is_braid = 0;
  g_sh->nranks = nranks;
  g_sh->iters = iters;
  g_sh->is_braid = is_braid;
  g_sh->seed = draw_seed();
  printf("devapi: %d ranks, %s, library %s %d, seed %#llx, %d iterations%s\n", nranks,
         isolated ? "one GPU visible per process" : "all GPUs visible",
         is_braid ? "Braid" : "NCCL", g_sh->version, (unsigned long long)g_sh->seed, iters,
         is_braid ? "" : " (Braid-only checks of case d skipped)");
  fflush(stdout);

  pid_t pids[MAX_RANKS];
  for (int r = 0; r < nranks; r++) {
    pids[r] = fork();
    if (pids[r] == 0) {
      if (isolated) isolate(r);
      _exit(rank_main(r, isolated));
    }
  }
  int exit_ok[MAX_RANKS] = {0}, left = nranks;
  double end = now_ms() + timeout_s * 1e3, grace_end = 0;
  while (left > 0) {
    int st;
    pid_t p = waitpid(-1, &st, WNOHANG);
    if (p > 0) {
      for (int r = 0; r < nranks; r++) {
        if (pids[r] != p) continue;
        pids[r] = 0;
        left--;
        exit_ok[r] = WIFEXITED(st) && WEXITSTATUS(st) == 0;
        if (!exit_ok[r] && grace_end == 0) grace_end = now_ms() + 10e3;
      }
      continue;
    }
    if (now_ms() > end || (grace_end && now_ms() > grace_end)) {
      printf("devapi: %s; stopping the ranks left\n",
             now_ms() > end ? "timed out" : "a rank failed");
      for (int r = 0; r < nranks; r++)
        if (pids[r] > 0) kill(pids[r], SIGKILL);
      end = now_ms() + 1e9;
      grace_end = 0;
    }
    usleep(10000);
  }
  return report(nranks, exit_ok);
}
