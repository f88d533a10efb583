/*
 * Braid's device API, part 1: the structures a device communicator is made of, the host calls
 * that create it, and the team arithmetic.
 *
 * A kernel receives an ncclDevComm by value and reads its fields directly, so every structure
 * here has NCCL 2.28.9's layout, field for field (tests/unit/dev_api_header_test.cpp compares
 * each with the library's own view of it, src/abi/dev_api.h). The host calls are in
 * libnccl.so.2; everything else is inline and compiled into the caller's kernels.
 *
 * A team is an arithmetic progression of world ranks: nRanks members, this rank being member
 * `rank`, consecutive members `stride` world ranks apart. The world team is every rank; the LSA
 * team is the ranks whose memory this GPU loads and stores directly; the rail team holds one rank
 * per LSA team, those at this rank's position in theirs.
 *
 * The header compiles as C, as host C++ and as CUDA. Device code is guarded by __CUDACC__.
 */
#ifndef BRAID_NCCL_DEVICE_CORE_H
#define BRAID_NCCL_DEVICE_CORE_H

#include <stddef.h>
#include <stdint.h>
#if !defined(__cplusplus)
#include <stdbool.h>
#endif

#include "nccl.h"

#if !defined(NCCL_VERSION_CODE) || NCCL_VERSION_CODE != 22809
#error "Braid's nccl_device.h goes with Braid's nccl.h (NCCL_VERSION_CODE 22809): another nccl.h was found first on the include path"
#endif

/* NCCL's qualifier macros, with the same names: user code written for NCCL uses them too. */
#if defined(__CUDACC__)
#define NCCL_DEVICE_INLINE __device__ __forceinline__
#define NCCL_HOST_DEVICE_INLINE __host__ __device__ __forceinline__
#elif defined(__cplusplus)
#ifndef __host__
#define __host__
#endif
#define NCCL_DEVICE_INLINE
#define NCCL_HOST_DEVICE_INLINE inline __attribute__((always_inline))
#else
#ifndef __host__
#define __host__
#endif
#define NCCL_DEVICE_INLINE
/* C has no inline linkage merging: each translation unit keeps its own copy. */
#define NCCL_HOST_DEVICE_INLINE static inline __attribute__((always_inline))
#endif

#if defined(__cplusplus)
#define NCCL_EXTERN_C extern "C"
#else
#define NCCL_EXTERN_C
#endif

#if defined(__CUDACC__)
#include <cuda/atomic>
#endif

/* Contexts a window keeps for GPU-initiated networking (not offered by Braid: kept for layout). */
#define NCCL_GIN_MAX_CONTEXTS 4

typedef void* ncclGinWindow_t;
typedef uint32_t ncclGinSignal_t;
typedef uint32_t ncclGinCounter_t;

/* A place in the device communicator's resource window, in units of 128 bytes. */
typedef uint32_t ncclDevResourceHandle;
typedef ncclDevResourceHandle ncclDevResourceHandle_t;

typedef struct ncclDevComm ncclDevComm_t;
typedef struct ncclTeam ncclTeam_t;
typedef struct ncclMultimemHandle ncclMultimemHandle_t;
typedef struct ncclLsaBarrierHandle ncclLsaBarrierHandle_t;
typedef struct ncclGinBarrierHandle ncclGinBarrierHandle_t;
typedef struct ncclLLA2AHandle ncclLLA2AHandle_t;
typedef struct ncclDevCommRequirements ncclDevCommRequirements_t;
typedef struct ncclDevResourceRequirements ncclDevResourceRequirements_t;
typedef struct ncclTeamRequirements ncclTeamRequirements_t;

struct ncclTeam {
  int nRanks, rank, stride;
};

/*
 * One registered window as the device sees it (ncclWindow_t, declared in nccl.h, points at one
 * in device memory). Every LSA member's buffer is mapped here at one stride: member i's first
 * byte is lsaFlatBase + i * stride4G * 4 GiB.
 */
struct ncclWindow_vidmem {
  void* winHost;     /* the library's own record */
  char* lsaFlatBase; /* LSA member 0's first byte */
  int lsaRank;
  int worldRank;
  uint32_t stride4G;
  uint32_t mcOffset4K; /* multicast: Braid offers none, always 0 */
  uint32_t ginOffset4K;
  ncclGinWindow_t ginWins[NCCL_GIN_MAX_CONTEXTS];
};

/* A multicast mapping: Braid offers none (the library refuses multimem requirements). */
struct ncclMultimemHandle {
  void* mcBasePtr;
};

/* nBarriers LSA barriers in the resource window (their memory: lsa_barrier.h). */
struct ncclLsaBarrierHandle {
  ncclDevResourceHandle_t bufHandle;
  int nBarriers;
};

/* Barriers through GPU-initiated networking: not offered by Braid, kept for ncclDevComm's layout. */
struct ncclGinBarrierHandle {
  ncclGinSignal_t signal0;
  ncclDevResourceHandle_t bufHandle;
};

/* The LL all-to-all's buffer in the resource window (its memory: ll_a2a.h). */
struct ncclLLA2AHandle {
  ncclDevResourceHandle_t bufHandle;
  uint32_t nSlots;
};

#if defined(__cplusplus)
/* The registered windows, 32 a block, blocks chained; an entry with base 0 is free. */
struct ncclDevCommWindowTable {
  struct Entry {
    uintptr_t base, size; /* the user's buffer on this rank */
    ncclWindow_t window;
  } entries[32];
  struct ncclDevCommWindowTable* next;
};
#else
struct ncclDevCommWindowTable;
#endif

/* What ncclDevCommCreate gives; the caller passes it to its kernels by value. */
struct ncclDevComm {
  int rank, nRanks;
  uint32_t nRanks_rcp32; /* UINT32_MAX / nRanks, plus one for a power of two */
  int lsaRank, lsaSize;
  uint32_t lsaSize_rcp32;
  struct ncclDevCommWindowTable* windowTable;
  ncclWindow_t resourceWindow;                     /* in device memory */
  struct ncclWindow_vidmem resourceWindow_inlined; /* the same, carried in the kernel's argument */
  ncclMultimemHandle_t lsaMultimem;
  ncclLsaBarrierHandle_t lsaBarrier;
  ncclGinBarrierHandle_t railGinBarrier;
  /* GPU-initiated networking: zero on Braid. */
  uint8_t ginContextCount;
  uint8_t ginTypes[4];
  void* ginHandles[4];
  uint32_t ginSignalBase;
  int ginSignalCount;
  uint32_t ginCounterBase;
  int ginCounterCount;
  uint64_t* ginSignalShadows;
};

/* What the caller asks of ncclDevCommCreate. Braid refuses every GIN and multimem request. */
struct ncclDevCommRequirements {
  ncclDevResourceRequirements_t* resourceRequirementsList;
  ncclTeamRequirements_t* teamRequirementsList;
  bool lsaMultimem;
  int barrierCount;
  int lsaBarrierCount;
  int railGinBarrierCount;
  int lsaLLA2ABlockCount, lsaLLA2ASlotCount;
  bool ginForceEnable;
  int ginContextCount;
  int ginSignalCount;
  int ginCounterCount;
};

/* A piece of the resource window, linked into a list; the handle is written through
 * outBufferHandle when the device communicator is created. */
struct ncclDevResourceRequirements {
  ncclDevResourceRequirements_t* next;
  size_t bufferSize, bufferAlign;
  ncclDevResourceHandle_t* outBufferHandle;
  int ginSignalCount;
  int ginCounterCount;
  ncclGinSignal_t* outGinSignalStart;
  ncclGinCounter_t* outGinCounterStart;
};

struct ncclTeamRequirements {
  ncclTeamRequirements_t* next;
  ncclTeam_t team;
  bool multimem;
  ncclMultimemHandle_t* outMultimemHandle;
};

#if defined(__cplusplus)
/* Tags that name the built-in teams in session constructors. */
struct ncclTeamTagWorld {};
struct ncclTeamTagLsa {};
struct ncclTeamTagRail {};
template <typename T>
struct ncclSymPtr;
#endif

/* ---- host calls, in libnccl.so.2 ---- */

NCCL_EXTERN_C __host__ ncclResult_t ncclDevCommCreate(ncclComm_t comm,
                                                      ncclDevCommRequirements_t const* reqs,
                                                      ncclDevComm_t* outDevComm);
NCCL_EXTERN_C __host__ ncclResult_t ncclDevCommDestroy(ncclComm_t comm,
                                                       ncclDevComm_t const* devComm);
NCCL_EXTERN_C __host__ ncclTeam_t ncclTeamWorld(ncclComm_t comm);
NCCL_EXTERN_C __host__ ncclTeam_t ncclTeamLsa(ncclComm_t comm);
NCCL_EXTERN_C __host__ ncclTeam_t ncclTeamRail(ncclComm_t comm);
NCCL_EXTERN_C __host__ int ncclTeamRankToWorld(ncclComm_t comm, ncclTeam_t team, int rank);
NCCL_EXTERN_C __host__ int ncclTeamRankToLsa(ncclComm_t comm, ncclTeam_t team, int rank);

/* ---- teams, on the host and on the device ---- */

#if defined(__cplusplus)
NCCL_HOST_DEVICE_INLINE ncclTeam ncclTeamWorld(ncclDevComm const& comm) {
  ncclTeam t = {comm.nRanks, comm.rank, 1};
  return t;
}

NCCL_HOST_DEVICE_INLINE ncclTeam ncclTeamLsa(ncclDevComm const& comm) {
  ncclTeam t = {comm.lsaSize, comm.lsaRank, 1};
  return t;
}

/* One rank per LSA team: the LSA teams are runs of lsaSize consecutive world ranks. */
NCCL_HOST_DEVICE_INLINE ncclTeam ncclTeamRail(ncclDevComm const& comm) {
  int size = comm.lsaSize > 0 ? comm.lsaSize : 1;
  ncclTeam t = {comm.nRanks / size, comm.rank / size, size};
  return t;
}

/* World and LSA ranks follow from this rank's own: teams are progressions through it. */
NCCL_HOST_DEVICE_INLINE int ncclTeamRankToWorld(ncclDevComm const& comm, ncclTeam team, int rank) {
  return comm.rank + (rank - team.rank) * team.stride;
}

NCCL_HOST_DEVICE_INLINE int ncclTeamRankToLsa(ncclDevComm const& comm, ncclTeam team, int rank) {
  return comm.lsaRank + (rank - team.rank) * team.stride;
}
#endif

/* Whether member bRank of team b belongs to team a (both teams hold this rank). */
NCCL_EXTERN_C NCCL_HOST_DEVICE_INLINE bool ncclTeamRankIsMember(ncclTeam_t a, ncclTeam_t b,
                                                                int bRank) {
  int world_delta = (bRank - b.rank) * b.stride; /* from this rank, in world ranks */
  if (world_delta % a.stride != 0) return false;
  int a_rank = a.rank + world_delta / a.stride;
  return 0 <= a_rank && a_rank < a.nRanks;
}

/* Member bRank of team b as a member of team a (meaningful when ncclTeamRankIsMember). */
NCCL_EXTERN_C NCCL_HOST_DEVICE_INLINE int ncclTeamRankToTeam(ncclTeam_t a, ncclTeam_t b, int bRank) {
  return a.rank + (bRank - b.rank) * b.stride / a.stride;
}

/* The team of innerSize consecutive members of parent that holds this rank. */
NCCL_EXTERN_C NCCL_HOST_DEVICE_INLINE ncclTeam_t ncclTeamInnerFactor(ncclTeam_t parent,
                                                                     int innerSize) {
  ncclTeam_t t;
  t.nRanks = innerSize;
  t.rank = parent.rank % innerSize;
  t.stride = parent.stride;
  return t;
}

/* The team of the members of parent at this rank's place in each run of innerSize. */
NCCL_EXTERN_C NCCL_HOST_DEVICE_INLINE ncclTeam_t ncclTeamOuterFactor(ncclTeam_t parent,
                                                                     int innerSize) {
  ncclTeam_t t;
  t.nRanks = parent.nRanks / innerSize;
  t.rank = parent.rank / innerSize;
  t.stride = parent.stride * innerSize;
  return t;
}

/*
 * The index'th member of parent that is not in subset (subset within parent, both holding this
 * rank), as a rank of parent, counting in increasing parent rank. In parent's ranks the subset
 * is `first, first + step, ...` (nRanks of them); the others lie below first, in the gaps of
 * step - 1 between members, and above the last member.
 */
NCCL_EXTERN_C NCCL_HOST_DEVICE_INLINE int ncclTeamRankInDifference(ncclTeam_t parent,
                                                                   ncclTeam_t subset, int index) {
  int step = subset.stride / parent.stride;
  int first = parent.rank - subset.rank * step; /* subset member 0, in parent's ranks */
  if (step < 0) {                               /* then member nRanks - 1 is the lowest */
    step = -step;
    first -= (subset.nRanks - 1) * step;
  }
  if (index < first) return index;
  int k = index - first;                       /* among those above first */
  int in_gaps = (subset.nRanks - 1) * (step - 1); /* how many lie between members */
  if (k < in_gaps) return first + 1 + (k / (step - 1)) * step + k % (step - 1);
  return first + (subset.nRanks - 1) * step + 1 + (k - in_gaps);
}

/* Where a resource handle's bytes start in the resource window. */
NCCL_EXTERN_C NCCL_HOST_DEVICE_INLINE size_t ncclGetResourceBufferOffset(ncclDevResourceHandle_t h) {
  return (size_t)h * 128;
}

#endif
