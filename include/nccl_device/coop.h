/*
 * Braid's device API, part 2: cooperative groups, the sets of threads that call a session's
 * methods together. Each offers the subset of CUDA's cooperative groups the sessions use:
 * thread_rank(), size(), num_threads() (the same as size()) and sync().
 *
 *   ncclCoopTile<N>   N consecutive lanes of one warp, N a power of two up to 32, aligned to N;
 *                     ncclCoopThread is one thread, ncclCoopWarp the whole warp;
 *   ncclCoopLanes     any lanes of one warp, by mask;
 *   ncclCoopWarpSpan  consecutive warps of a block, with an id of 0..14 the caller chooses so
 *                     that spans working at once never share one (it picks hardware barrier
 *                     1 + id; barrier 0 is __syncthreads'); the id also picks its broadcast slot;
 *   ncclCoopCta       the whole block.
 */
#ifndef BRAID_NCCL_DEVICE_COOP_H
#define BRAID_NCCL_DEVICE_COOP_H

#include "core.h"

#if defined(__CUDACC__)

/* This thread's lane, and the mask of the lanes below it. */
NCCL_DEVICE_INLINE int braid_coop_lane() {
  int lane;
  asm("mov.u32 %0, %%laneid;" : "=r"(lane));
  return lane;
}

NCCL_DEVICE_INLINE uint32_t braid_coop_lanes_below() {
  uint32_t mask;
  asm("mov.u32 %0, %%lanemask_lt;" : "=r"(mask));
  return mask;
}

template <int nThreadsPow2>
struct ncclCoopTile {
  static_assert(nThreadsPow2 >= 1 && nThreadsPow2 <= 32 &&
                    (nThreadsPow2 & (nThreadsPow2 - 1)) == 0,
                "ncclCoopTile<N>: N must be a power of two from 1 to 32");

  NCCL_DEVICE_INLINE int thread_rank() const { return braid_coop_lane() & (nThreadsPow2 - 1); }
  NCCL_DEVICE_INLINE constexpr int size() const { return nThreadsPow2; }
  NCCL_DEVICE_INLINE constexpr int num_threads() const { return nThreadsPow2; }

  /* The lanes of this tile: N bits starting at the tile's first lane. */
  NCCL_DEVICE_INLINE uint32_t laneMask() const {
    uint32_t bits = nThreadsPow2 == 32 ? 0xffffffffu : (1u << nThreadsPow2) - 1;
    return bits << (braid_coop_lane() & ~(nThreadsPow2 - 1));
  }
  NCCL_DEVICE_INLINE void sync() {
    if (nThreadsPow2 > 1) __syncwarp(laneMask());
  }
};

typedef ncclCoopTile<1> ncclCoopThread;
typedef ncclCoopTile<32> ncclCoopWarp;

struct ncclCoopLanes {
  uint32_t lmask;

  NCCL_DEVICE_INLINE constexpr ncclCoopLanes(uint32_t lmask = 0xffffffffu) : lmask(lmask) {}

  NCCL_DEVICE_INLINE int thread_rank() const { return __popc(lmask & braid_coop_lanes_below()); }
  NCCL_DEVICE_INLINE int size() const { return __popc(lmask); }
  NCCL_DEVICE_INLINE int num_threads() const { return __popc(lmask); }
  NCCL_DEVICE_INLINE void sync() { __syncwarp(lmask); }
};

struct ncclCoopWarpSpan {
  uint32_t warp0 : 8, nWarps : 8, id : 8;

  NCCL_DEVICE_INLINE constexpr ncclCoopWarpSpan(int warp0, int nWarps, int id)
      : warp0(warp0), nWarps(nWarps), id(id) {}

  NCCL_DEVICE_INLINE int thread_rank() const { return (int)threadIdx.x - 32 * (int)warp0; }
  NCCL_DEVICE_INLINE int size() const { return 32 * nWarps; }
  NCCL_DEVICE_INLINE int num_threads() const { return 32 * nWarps; }
  NCCL_DEVICE_INLINE void sync() {
    asm volatile("bar.sync %0, %1;" ::"r"(1 + id), "r"(32 * nWarps) : "memory");
  }
};

struct ncclCoopCta {
  NCCL_DEVICE_INLINE int thread_rank() const { return threadIdx.x; }
  NCCL_DEVICE_INLINE int size() const { return blockDim.x; }
  NCCL_DEVICE_INLINE int num_threads() const { return blockDim.x; }
  NCCL_DEVICE_INLINE void sync() { __syncthreads(); }
};

/* The lanes of this warp that take part in the group (the whole warp for groups wider than one). */
template <int N>
NCCL_DEVICE_INLINE uint32_t ncclCoopGetLaneMask(ncclCoopTile<N> coop) {
  return coop.laneMask();
}
NCCL_DEVICE_INLINE uint32_t ncclCoopGetLaneMask(ncclCoopLanes coop) { return coop.lmask; }
NCCL_DEVICE_INLINE uint32_t ncclCoopGetLaneMask(ncclCoopWarpSpan) { return 0xffffffffu; }
NCCL_DEVICE_INLINE uint32_t ncclCoopGetLaneMask(ncclCoopCta) { return 0xffffffffu; }

/* Whether the group is known at compile time to be a single thread. */
template <int N>
NCCL_DEVICE_INLINE constexpr bool ncclCoopIsThread(ncclCoopTile<N>) {
  return N == 1;
}
NCCL_DEVICE_INLINE constexpr bool ncclCoopIsThread(ncclCoopLanes) { return false; }
NCCL_DEVICE_INLINE constexpr bool ncclCoopIsThread(ncclCoopWarpSpan) { return false; }
NCCL_DEVICE_INLINE constexpr bool ncclCoopIsThread(ncclCoopCta) { return false; }

/* Whether the group never spans more than one warp. */
template <int N>
NCCL_DEVICE_INLINE constexpr bool ncclCoopWithinWarp(ncclCoopTile<N>) {
  return true;
}
NCCL_DEVICE_INLINE constexpr bool ncclCoopWithinWarp(ncclCoopLanes) { return true; }
NCCL_DEVICE_INLINE constexpr bool ncclCoopWithinWarp(ncclCoopWarpSpan) { return false; }
NCCL_DEVICE_INLINE constexpr bool ncclCoopWithinWarp(ncclCoopCta) { return false; }

/* The lanes of this warp running this instruction now. */
NCCL_DEVICE_INLINE ncclCoopLanes ncclCoopCoalesced() { return ncclCoopLanes(__activemask()); }

/* The lanes of this warp that a collective call on `coop` may use together: the group itself
 * when it lies within one warp, else the whole warp (every lane of a wider group takes part). */
template <typename Coop>
NCCL_DEVICE_INLINE ncclCoopWarp ncclCoopCoalesced(Coop) {
  return ncclCoopWarp();
}
NCCL_DEVICE_INLINE ncclCoopLanes ncclCoopCoalesced(ncclCoopLanes coop) { return coop; }
template <int N>
NCCL_DEVICE_INLINE ncclCoopTile<N> ncclCoopCoalesced(ncclCoopTile<N> coop) {
  return coop;
}

/*
 * ncclCoopBcast(coop, value, root[, entrySync]): every thread of the group gets the value of
 * the thread whose thread_rank() is root. Within a warp it moves through shuffles; across
 * warps through a slot of shared memory, which entrySync = true first protects from a
 * broadcast still being read (pass false only when the group synchronized since the last one).
 */
template <typename T>
union braid_coop_words {
  T value;
  uint32_t word[(sizeof(T) + 3) / 4];
};

template <int N, typename T>
NCCL_DEVICE_INLINE T ncclCoopBcast(ncclCoopTile<N> coop, T value, int root, bool entrySync = true) {
  (void)entrySync;
  braid_coop_words<T> w;
  w.value = value;
#pragma unroll
  for (int i = 0; i < (int)(sizeof(w.word) / 4); i++)
    w.word[i] = __shfl_sync(coop.laneMask(), w.word[i], root, N);
  return w.value;
}

template <typename T>
NCCL_DEVICE_INLINE T ncclCoopBcast(ncclCoopLanes coop, T value, int root, bool entrySync = true) {
  (void)entrySync;
  int root_lane = __fns(coop.lmask, 0, root + 1); /* the (root+1)th set bit */
  braid_coop_words<T> w;
  w.value = value;
#pragma unroll
  for (int i = 0; i < (int)(sizeof(w.word) / 4); i++)
    w.word[i] = __shfl_sync(coop.lmask, w.word[i], root_lane);
  return w.value;
}

/* One 16-byte slot per warp-span id, one for the whole block. */
NCCL_DEVICE_INLINE ulonglong2* braid_coop_span_slots() {
  __shared__ ulonglong2 slots[15];
  return slots;
}
NCCL_DEVICE_INLINE ulonglong2* braid_coop_cta_slot() {
  __shared__ ulonglong2 slot;
  return &slot;
}

template <typename Coop, typename T>
NCCL_DEVICE_INLINE T braid_coop_bcast_shared(Coop coop, ulonglong2* slot, T value, int root,
                                             bool entrySync) {
  static_assert(sizeof(T) <= sizeof(ulonglong2), "ncclCoopBcast across warps: at most 16 bytes");
  if (entrySync) coop.sync();
  if (coop.thread_rank() == root) *(T*)slot = value;
  coop.sync();
  return *(T const*)slot;
}

template <typename T>
NCCL_DEVICE_INLINE T ncclCoopBcast(ncclCoopWarpSpan coop, T value, int root, bool entrySync = true) {
  return braid_coop_bcast_shared(coop, braid_coop_span_slots() + coop.id, value, root, entrySync);
}

template <typename T>
NCCL_DEVICE_INLINE T ncclCoopBcast(ncclCoopCta coop, T value, int root, bool entrySync = true) {
  return braid_coop_bcast_shared(coop, braid_coop_cta_slot(), value, root, entrySync);
}

#endif /* __CUDACC__ */

#endif
