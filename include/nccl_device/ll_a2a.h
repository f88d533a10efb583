/*
 * Braid's device API, part 5: the LL ("low latency") all-to-all among the members of a team
 * within the LSA team.
 *
 * A sender stores data straight into the receiver's slots with a flag beside every 4 bytes, so
 * the receiver needs no separate signal: a slot is ready when its flags equal the current epoch.
 * A slot is one 16-byte line carrying 8 bytes of data, stored with a single 16-byte store:
 *
 *   { data word 0, epoch, data word 1, epoch }
 *
 * A value of T spans ceil(sizeof(T) / 8) lines, the i-th `pitch` lines after the first (pitch
 * being the session's maxElts), so a session of maxElts elements of T needs
 * ncclLLA2ACalcSlots(maxElts, sizeof(T)) slots.
 *
 * Memory in the resource window, per block b, 16-byte lines, zero at creation (nBlocks *
 * (1 + 2 * nSlots) lines, as ncclLLA2ACreateRequirement allocates):
 *
 *   line b * (1 + 2 * nSlots)          word 0: the block's next epoch minus 2, saved by a
 *                                      session's end for the next one
 *   the next nSlots lines              the slots of even epochs
 *   the nSlots lines after those       the slots of odd epochs
 *
 * Layout and values are those of NCCL 2.28.9's headers, so kernels built against either header
 * can use one buffer in turn. Epochs start at 2 (zeroed memory reads as epoch 0, never current)
 * and step by one, from 2^32 - 1 back to 2. Consecutive epochs use different halves: endEpoch's
 * contract (each member sent to every other and received from every other) keeps any peer
 * within one epoch of this member, so a fast peer writes the other half while this member still
 * reads. Before the epochs wrap, the last two epochs' halves are cleared, so that stale flags
 * from the previous cycle can never match.
 *
 * Multimem: Braid offers none; bcast stores to each member in turn.
 */
#ifndef BRAID_NCCL_DEVICE_LL_A2A_H
#define BRAID_NCCL_DEVICE_LL_A2A_H

#include "core.h"
#include "ptr.h"

/* Slots for maxElts elements of maxEltSize bytes each (8 bytes a slot). */
NCCL_EXTERN_C __host__ int ncclLLA2ACalcSlots(int maxElts, int maxEltSize);

NCCL_EXTERN_C __host__ ncclResult_t ncclLLA2ACreateRequirement(
    int nBlocks, int nSlots, ncclLLA2AHandle_t* outHandle, ncclDevResourceRequirements_t* outReq);

#if defined(__CUDACC__)
#include <utility>

/* The lines one value of T spans (8 bytes of it a line). */
template <typename T>
NCCL_HOST_DEVICE_INLINE constexpr int braid_ll_lines() {
  return (int)((sizeof(T) + 7) / 8);
}

template <typename Coop>
struct ncclLLA2ASession {
  /* A session of block `block`'s buffers among the members of `team`, for at most maxElts
   * elements per epoch. Every thread of coop constructs it. */
  NCCL_DEVICE_INLINE ncclLLA2ASession(Coop coop, ncclDevComm const& comm, ncclTeam team,
                                      ncclLLA2AHandle handle, uint32_t block, int maxElts,
                                      bool multimem = false, ncclMultimemHandle mmHandle = {})
      : coop_(coop), comm_(comm), team_(team), handle_(handle), block_(block), pitch_(maxElts) {
    (void)multimem; /* no multicast: bcast stores to each member */
    (void)mmHandle;
    epoch_ = header()->x + 2;
  }

  ncclLLA2ASession(ncclLLA2ASession const&) = delete;

  /* Saves the epoch for the block's next ncclLLA2ASession. */
  NCCL_DEVICE_INLINE ~ncclLLA2ASession() {
    if (coop_.thread_rank() == 0) header()->x = epoch_ - 2;
    coop_.sync();
  }

  /* Stores data into slot `slot` of team member `peer`. Any thread may send. */
  template <typename T>
  NCCL_DEVICE_INLINE void send(int peer, int slot, T data) {
    uint4* slots = slots_of(
        (uint4*)ncclGetResourceBufferPeerPointer(comm_, handle_.bufHandle, team_, peer));
    store(slots + slot, data);
  }

  /* Stores data into slot `slot` of every member, this one included. */
  template <typename T>
  NCCL_DEVICE_INLINE void bcast(int slot, T data) {
    int peer = team_.rank; /* starting with itself, each member's stores spread over the peers */
    for (int k = 0; k < team_.nRanks; k++) {
      send(peer, slot, data);
      peer = peer + 1 == team_.nRanks ? 0 : peer + 1;
    }
  }

  /* Waits for slot `slot` of this member to hold this epoch's value, and returns it. */
  template <typename T>
  NCCL_DEVICE_INLINE T recv(int slot) {
    T value[1];
    recvUnrolled<1, 1>(slot, 1, 0, value);
    return value[0];
  }

  /* Receives eltCount values (MinEltCount <= eltCount <= MaxEltCount) from slots eltStart,
   * eltStart + eltStride, ... into vals, reading all of them before waiting on any. */
  template <int MinEltCount, int MaxEltCount, typename T>
  NCCL_DEVICE_INLINE void recvUnrolled(int eltStart, int eltCount, int eltStride,
                                       T (&vals)[MaxEltCount]) {
    constexpr int lines = braid_ll_lines<T>();
    uint4* first = slots_of((uint4*)ncclGetResourceBufferLocalPointer(comm_, handle_.bufHandle)) +
                   eltStart;
    uint4 got[MaxEltCount][lines];
    bool ready;
    do {
      ready = true;
#pragma unroll
      for (int e = 0; e < MaxEltCount; e++) {
        if (e >= MinEltCount && e >= eltCount) break;
#pragma unroll
        for (int l = 0; l < lines; l++) got[e][l] = load(first + e * eltStride + l * pitch_);
      }
#pragma unroll
      for (int e = 0; e < MaxEltCount; e++) {
        if (e >= MinEltCount && e >= eltCount) break;
#pragma unroll
        for (int l = 0; l < lines; l++) ready &= got[e][l].y == epoch_ && got[e][l].w == epoch_;
      }
    } while (!ready);
#pragma unroll
    for (int e = 0; e < MaxEltCount; e++) {
      if (e >= MinEltCount && e >= eltCount) break;
      vals[e] = decode<T>(got[e]);
    }
  }

  /* Receives eltCount values of Elt from slots eltStart, eltStart + eltStride, ..., Unroll at a
   * time, and folds them: red(...red(eltToAcc(v0), eltToAcc(v1))..., eltToAcc(vlast)).
   * With eltCount 0 it returns a value-initialized accumulator. */
  template <int Unroll, typename Elt, typename EltToAcc, typename Reduce>
  NCCL_DEVICE_INLINE auto recvReduce(int eltStart, int eltCount, int eltStride, EltToAcc eltToAcc,
                                     Reduce red) -> decltype(eltToAcc(std::declval<Elt>())) {
    using Acc = decltype(eltToAcc(std::declval<Elt>()));
    Acc acc{};
    int done = 0;
    for (; done < eltCount; done += Unroll) {
      Elt got[Unroll];
      int n = eltCount - done < Unroll ? eltCount - done : Unroll;
      if (n == Unroll)
        recvUnrolled<Unroll, Unroll>(eltStart + done * eltStride, Unroll, eltStride, got);
      else
        recvUnrolled<1, Unroll>(eltStart + done * eltStride, n, eltStride, got);
#pragma unroll
      for (int e = 0; e < Unroll; e++) {
        if (e >= n) break;
        acc = done + e == 0 ? eltToAcc(got[e]) : red(acc, eltToAcc(got[e]));
      }
    }
    return acc;
  }

  /* Ends this epoch: the whole group calls it once every member has sent to every other and
   * received from every other in this epoch. */
  NCCL_DEVICE_INLINE void endEpoch(Coop) {
    coop_.sync(); /* no thread of the group still reads this epoch's slots */
    if (epoch_ >= 0xfffffffeu) {
      /* The last two epochs of a cycle: clear their halves before epochs start again at 2. */
      uint4* slots = slots_of((uint4*)ncclGetResourceBufferLocalPointer(comm_, handle_.bufHandle));
      for (int i = coop_.thread_rank(); i < (int)handle_.nSlots; i += coop_.size())
        slots[i] = make_uint4(0, 0, 0, 0);
      __threadfence_system(); /* cleared before any peer can learn of the next epoch */
      coop_.sync();
    }
    epoch_ = epoch_ == 0xffffffffu ? 2 : epoch_ + 1;
  }

 private:
  Coop coop_;
  ncclDevComm const& comm_;
  ncclTeam team_;
  ncclLLA2AHandle handle_;
  uint32_t block_;
  int pitch_;      /* lines between the pieces of one value */
  uint32_t epoch_; /* the flag this epoch's slots carry */

  /* This block's first line in a member's buffer (base: the buffer's first line). */
  NCCL_DEVICE_INLINE uint4* block_of(uint4* base) const {
    return base + (size_t)block_ * (1 + 2 * (size_t)handle_.nSlots);
  }
  NCCL_DEVICE_INLINE uint4* header() const {
    return block_of((uint4*)ncclGetResourceBufferLocalPointer(comm_, handle_.bufHandle));
  }
  /* This epoch's half of the block's slots. */
  NCCL_DEVICE_INLINE uint4* slots_of(uint4* base) const {
    return block_of(base) + 1 + (epoch_ & 1) * handle_.nSlots;
  }

  template <typename T>
  NCCL_DEVICE_INLINE void store(uint4* line, T data) const {
    union {
      uint32_t word[braid_ll_lines<T>() * 2]; /* first: `= {}` zeroes all of it */
      T value;
    } u = {};
    u.value = data; /* a T of less than 8 bytes a line sends zeros in the rest */
#pragma unroll
    for (int l = 0; l < braid_ll_lines<T>(); l++)
      asm volatile("st.volatile.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(line + l * pitch_),
                   "r"(u.word[2 * l]), "r"(epoch_), "r"(u.word[2 * l + 1]), "r"(epoch_)
                   : "memory");
  }

  NCCL_DEVICE_INLINE static uint4 load(uint4 const* line) {
    uint4 v;
    asm volatile("ld.volatile.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(line)
                 : "memory");
    return v;
  }

  template <typename T>
  NCCL_DEVICE_INLINE static T decode(uint4 const (&lines)[braid_ll_lines<T>()]) {
    union {
      T value;
      uint32_t word[braid_ll_lines<T>() * 2];
    } u;
#pragma unroll
    for (int l = 0; l < braid_ll_lines<T>(); l++) {
      u.word[2 * l] = lines[l].x;
      u.word[2 * l + 1] = lines[l].z;
    }
    return u.value;
  }
};

#endif /* __CUDACC__ */

#endif
