/*
 * Braid's device API, part 3: addresses in windows.
 *
 * Every LSA member's buffer of a window is mapped into this GPU's address space, member i's at
 * lsaFlatBase + i * stride4G * 4 GiB, so a peer's address is a sum and no table lookup. The
 * resource window of a device communicator is a window like the others; a resource handle is
 * an offset into it in units of 128 bytes.
 *
 * ncclSymPtr<T> names the same offset in every member's buffer of one window: arithmetic moves
 * the offset in units of T, and localPtr/lsaPtr/peerPtr turn it into an address.
 *
 * Multimem (NVLink multicast) addresses are not offered by Braid: the functions that would
 * return one fail to compile, saying so.
 */
#ifndef BRAID_NCCL_DEVICE_PTR_H
#define BRAID_NCCL_DEVICE_PTR_H

#include "core.h"
#include "coop.h"

#if defined(__cplusplus)
/* False, but only once a template is instantiated: static_assert(braid_devapi_refused<T>::value)
 * fails where a refused function is used, not where it is declared. */
template <typename... T>
struct braid_devapi_refused {
  static constexpr bool value = false;
};
#define BRAID_DEVAPI_NO_MULTIMEM                                                               \
  "Braid offers no multimem (NVLink multicast): ncclDevCommCreate refuses multimem "           \
  "requirements, so there is no multicast address to compute"
#endif

#if defined(__CUDACC__)

/* Member `member` of the LSA team's copy of (base of member 0) + offset. */
NCCL_DEVICE_INLINE void* braid_lsa_address(char* flat_base, uint32_t stride4G, int member,
                                           size_t offset) {
  /* Adds member * stride4G to the high 32-bit word, modulo 2^64 as the hardware adds. */
  uint64_t high = (uint64_t)(uint32_t)(member * (int)stride4G) << 32;
  return (void*)((uintptr_t)flat_base + high + offset);
}

NCCL_DEVICE_INLINE void* ncclGetLsaPointer(ncclWindow_t w, size_t offset, int peer) {
  return braid_lsa_address(w->lsaFlatBase, w->stride4G, peer, offset);
}

NCCL_DEVICE_INLINE void* ncclGetLocalPointer(ncclWindow_t w, size_t offset) {
  return braid_lsa_address(w->lsaFlatBase, w->stride4G, w->lsaRank, offset);
}

/* peer is a world rank in the LSA team of this rank. */
NCCL_DEVICE_INLINE void* ncclGetPeerPointer(ncclWindow_t w, size_t offset, int peer) {
  int member = w->lsaRank + (peer - w->worldRank);
  return braid_lsa_address(w->lsaFlatBase, w->stride4G, member, offset);
}

/* peer is a rank of `team`, a team whose members are all in this rank's LSA team. */
NCCL_DEVICE_INLINE void* ncclGetPeerPointer(ncclWindow_t w, size_t offset, ncclTeam team,
                                            int peer) {
  int member = w->lsaRank + (peer - team.rank) * team.stride;
  return braid_lsa_address(w->lsaFlatBase, w->stride4G, member, offset);
}

template <typename W = ncclWindow_t>
NCCL_DEVICE_INLINE void* ncclGetMultimemPointer(W, size_t, ncclMultimemHandle) {
  static_assert(braid_devapi_refused<W>::value, BRAID_DEVAPI_NO_MULTIMEM);
  return nullptr;
}
template <typename W = ncclWindow_t>
NCCL_DEVICE_INLINE void* ncclGetLsaMultimemPointer(W, size_t, ncclDevComm const&) {
  static_assert(braid_devapi_refused<W>::value, BRAID_DEVAPI_NO_MULTIMEM);
  return nullptr;
}

/* The resource window, read from the copy the kernel's argument carries (no load from memory). */
NCCL_DEVICE_INLINE void* ncclGetResourceBufferLsaPointer(ncclDevComm const& comm,
                                                         ncclDevResourceHandle h, int peer) {
  struct ncclWindow_vidmem const& rw = comm.resourceWindow_inlined;
  return braid_lsa_address(rw.lsaFlatBase, rw.stride4G, peer, ncclGetResourceBufferOffset(h));
}

NCCL_DEVICE_INLINE void* ncclGetResourceBufferLocalPointer(ncclDevComm const& comm,
                                                           ncclDevResourceHandle h) {
  return ncclGetResourceBufferLsaPointer(comm, h, comm.lsaRank);
}

NCCL_DEVICE_INLINE void* ncclGetResourceBufferPeerPointer(ncclDevComm const& comm,
                                                          ncclDevResourceHandle h, ncclTeam team,
                                                          int peer) {
  return ncclGetResourceBufferLsaPointer(comm, h, comm.lsaRank + (peer - team.rank) * team.stride);
}

template <typename H = ncclDevResourceHandle>
NCCL_DEVICE_INLINE void* ncclGetResourceBufferMultimemPointer(ncclDevComm const&, H,
                                                              ncclMultimemHandle) {
  static_assert(braid_devapi_refused<H>::value, BRAID_DEVAPI_NO_MULTIMEM);
  return nullptr;
}
template <typename H = ncclDevResourceHandle>
NCCL_DEVICE_INLINE void* ncclGetResourceBufferLsaMultimemPointer(ncclDevComm const&, H) {
  static_assert(braid_devapi_refused<H>::value, BRAID_DEVAPI_NO_MULTIMEM);
  return nullptr;
}

/*
 * The window that holds ptr (an address in this rank's own buffer of it), or NULL if no window
 * does. The lanes of the group that share this warp search the table together, one entry
 * each, and all get the first match. Every thread of `coop` must call it with the same ptr.
 */
template <typename Coop>
NCCL_DEVICE_INLINE ncclWindow_t ncclFindWindow(Coop coop, ncclDevComm const& comm,
                                               void const* ptr) {
  auto lanes = ncclCoopCoalesced(coop);
  uint32_t mask = ncclCoopGetLaneMask(lanes);
  uintptr_t p = (uintptr_t)ptr;
  for (ncclDevCommWindowTable const* t = comm.windowTable; t != nullptr; t = t->next) {
    for (int base = 0; base < 32; base += lanes.size()) {
      int i = base + lanes.thread_rank();
      bool hit = false;
      if (i < 32) {
        ncclDevCommWindowTable::Entry const& e = t->entries[i];
        hit = e.base != 0 && e.window != nullptr && p - e.base < e.size;
      }
      uint32_t hits = __ballot_sync(mask, hit);
      if (hits != 0) {
        /* The lowest lane that hit; its rank in the group tells which entry it read. */
        int lane = __ffs(hits) - 1;
        int first = base + __popc(mask & ((1u << lane) - 1));
        return t->entries[first].window;
      }
    }
  }
  return nullptr;
}

#endif /* __CUDACC__ */

#if defined(__cplusplus)
template <typename T>
struct ncclSymPtr {
  using ElementType = T;
  ncclWindow_t window;
  size_t offset; /* in bytes, from the start of each member's buffer */

  NCCL_HOST_DEVICE_INLINE constexpr ncclSymPtr(ncclWindow_t window = nullptr, size_t offset = 0)
      : window(window), offset(offset) {}

  template <typename U>
  NCCL_HOST_DEVICE_INLINE operator ncclSymPtr<U>() const {
    return ncclSymPtr<U>(window, offset);
  }

  /* Moves by d elements of T; negative steps wrap modulo 2^64 as pointer arithmetic does. */
  template <typename Int>
  NCCL_HOST_DEVICE_INLINE ncclSymPtr<T>& braid_step(Int d, bool forward) {
    size_t bytes = (size_t)d * sizeof(T);
    offset = forward ? offset + bytes : offset - bytes;
    return *this;
  }
  NCCL_HOST_DEVICE_INLINE ncclSymPtr<T>& operator+=(int d) { return braid_step(d, true); }
  NCCL_HOST_DEVICE_INLINE ncclSymPtr<T>& operator+=(unsigned int d) { return braid_step(d, true); }
  NCCL_HOST_DEVICE_INLINE ncclSymPtr<T>& operator+=(long d) { return braid_step(d, true); }
  NCCL_HOST_DEVICE_INLINE ncclSymPtr<T>& operator+=(unsigned long d) { return braid_step(d, true); }
  NCCL_HOST_DEVICE_INLINE ncclSymPtr<T>& operator+=(long long d) { return braid_step(d, true); }
  NCCL_HOST_DEVICE_INLINE ncclSymPtr<T>& operator+=(unsigned long long d) {
    return braid_step(d, true);
  }
  NCCL_HOST_DEVICE_INLINE ncclSymPtr<T>& operator-=(int d) { return braid_step(d, false); }
  NCCL_HOST_DEVICE_INLINE ncclSymPtr<T>& operator-=(unsigned int d) { return braid_step(d, false); }
  NCCL_HOST_DEVICE_INLINE ncclSymPtr<T>& operator-=(long d) { return braid_step(d, false); }
  NCCL_HOST_DEVICE_INLINE ncclSymPtr<T>& operator-=(unsigned long d) { return braid_step(d, false); }
  NCCL_HOST_DEVICE_INLINE ncclSymPtr<T>& operator-=(long long d) { return braid_step(d, false); }
  NCCL_HOST_DEVICE_INLINE ncclSymPtr<T>& operator-=(unsigned long long d) {
    return braid_step(d, false);
  }

#if defined(__CUDACC__)
  NCCL_DEVICE_INLINE T* localPtr() const { return (T*)ncclGetLocalPointer(window, offset); }
  NCCL_DEVICE_INLINE T* lsaPtr(int peer) const {
    return (T*)ncclGetLsaPointer(window, offset, peer);
  }
  NCCL_DEVICE_INLINE T* peerPtr(int peer) const {
    return (T*)ncclGetPeerPointer(window, offset, peer);
  }
  NCCL_DEVICE_INLINE T* peerPtr(ncclTeam team, int peer) const {
    return (T*)ncclGetPeerPointer(window, offset, team, peer);
  }
  template <typename M = ncclMultimemHandle>
  NCCL_DEVICE_INLINE T* multimemPtr(M) const {
    static_assert(braid_devapi_refused<M>::value, BRAID_DEVAPI_NO_MULTIMEM);
    return nullptr;
  }
  template <typename C = ncclDevComm>
  NCCL_DEVICE_INLINE T* lsaMultimemPtr(C const&) const {
    static_assert(braid_devapi_refused<C>::value, BRAID_DEVAPI_NO_MULTIMEM);
    return nullptr;
  }
#endif
};

template <typename T, typename Int>
NCCL_HOST_DEVICE_INLINE ncclSymPtr<T> operator+(ncclSymPtr<T> p, Int d) {
  return p += d;
}
template <typename T, typename Int>
NCCL_HOST_DEVICE_INLINE ncclSymPtr<T> operator-(ncclSymPtr<T> p, Int d) {
  return p -= d;
}
/* Elements of T between two pointers into the same window. */
template <typename T>
NCCL_HOST_DEVICE_INLINE ptrdiff_t operator-(ncclSymPtr<T> a, ncclSymPtr<T> b) {
  return (ptrdiff_t)(a.offset - b.offset) / (ptrdiff_t)sizeof(T);
}
template <typename T>
NCCL_HOST_DEVICE_INLINE bool operator==(ncclSymPtr<T> a, ncclSymPtr<T> b) {
  return a.window == b.window && a.offset == b.offset;
}
template <typename T>
NCCL_HOST_DEVICE_INLINE bool operator!=(ncclSymPtr<T> a, ncclSymPtr<T> b) {
  return !(a == b);
}

#if defined(__CUDACC__)
/* The resource buffer of handle h as a symmetric pointer into the resource window. */
NCCL_DEVICE_INLINE ncclSymPtr<char> ncclGetResourceBuffer(ncclDevComm const& comm,
                                                          ncclDevResourceHandle h) {
  return ncclSymPtr<char>(comm.resourceWindow, ncclGetResourceBufferOffset(h));
}
#endif
#endif /* __cplusplus */

#endif
