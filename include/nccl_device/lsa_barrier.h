/*
 * Braid's device API, part 4: barriers among the members of a team within the LSA team.
 *
 * ncclLsaBarrierCreateRequirement asks for nBarriers barriers; each block (or other group)
 * uses its own by index. Their memory in the resource window, 32-bit words, zero at creation:
 *
 *   [0, n)                  unused here (the multicast variant's saved epochs)
 *   [n, 2n)                 barrier i's epoch, saved by a session's end for the next one
 *   [2n, 3n)                unused here (the multicast variant's counters)
 *   [3n + i*size + j, ...)  barrier i's inbox for member j: the epoch member j last reached
 *
 * with n = nBarriers and size the team's size; ncclLsaBarrierCreateRequirement allocates
 * n * (3 + size) words. This is the layout NCCL 2.28.9's headers use, and the values stored are
 * the same, so a kernel built against either header can share a barrier with one built against
 * the other (a device communicator's lsaBarrier, typically).
 *
 * A barrier round: arrive writes epoch + 1 into this member's inbox in every other member's
 * memory (a release store); wait reads this member's own inboxes until every other member's
 * value has reached epoch + 1 (acquire loads), then counts the epoch. Epochs compare modulo
 * 2^32, so they may wrap. A session reads the saved epoch when it begins and saves it when it
 * ends: from zeroed memory the first round's epoch is 1 everywhere.
 *
 * Multimem: Braid offers none; a session asked for it synchronizes through the unicast inboxes
 * above, which give the same barrier.
 */
#ifndef BRAID_NCCL_DEVICE_LSA_BARRIER_H
#define BRAID_NCCL_DEVICE_LSA_BARRIER_H

#include "core.h"
#include "ptr.h"

NCCL_EXTERN_C __host__ ncclResult_t ncclLsaBarrierCreateRequirement(
    ncclTeam_t team, int nBarriers, ncclLsaBarrierHandle_t* outHandle,
    ncclDevResourceRequirements_t* outReq);

#if defined(__CUDACC__)

/* The release half of a memory order, and its acquire half. */
NCCL_DEVICE_INLINE cuda::memory_order braid_release_part(cuda::memory_order order) {
  return order == cuda::memory_order_release || order == cuda::memory_order_acq_rel ||
                 order == cuda::memory_order_seq_cst
             ? cuda::memory_order_release
             : cuda::memory_order_relaxed;
}
NCCL_DEVICE_INLINE cuda::memory_order braid_acquire_part(cuda::memory_order order) {
  return order == cuda::memory_order_acquire || order == cuda::memory_order_consume ||
                 order == cuda::memory_order_acq_rel || order == cuda::memory_order_seq_cst
             ? cuda::memory_order_acquire
             : cuda::memory_order_relaxed;
}

template <typename Coop>
struct ncclLsaBarrierSession {
  /* A session of barrier `index` among the members of `team`. Every thread of coop constructs
   * it; the whole group then calls arrive/wait/sync together. */
  NCCL_DEVICE_INLINE ncclLsaBarrierSession(Coop coop, ncclDevComm const& comm, ncclTeam team,
                                           ncclLsaBarrierHandle handle, uint32_t index,
                                           bool multimem = false,
                                           ncclMultimemHandle mmHandle = {})
      : coop_(coop), comm_(comm), team_(team), handle_(handle), index_(index) {
    (void)multimem; /* no multicast: the unicast inboxes give the same barrier */
    (void)mmHandle;
    epoch_ = *saved_epoch();
  }

  /* Barrier `index` of the device communicator's own LSA barriers, over the LSA team. */
  NCCL_DEVICE_INLINE ncclLsaBarrierSession(Coop coop, ncclDevComm const& comm, ncclTeamTagLsa,
                                           uint32_t index, bool multimem = false)
      : ncclLsaBarrierSession(coop, comm, ncclTeamLsa(comm), comm.lsaBarrier, index, multimem) {}

  ncclLsaBarrierSession(ncclLsaBarrierSession const&) = delete;

  /* Saves the epoch for the barrier's next ncclLsaBarrierSession. */
  NCCL_DEVICE_INLINE ~ncclLsaBarrierSession() {
    if (coop_.thread_rank() == 0) *saved_epoch() = epoch_;
    coop_.sync();
  }

  /* Tells every other member that this one reached the barrier. What the group wrote before
   * is visible to a member that waits with an acquiring order, if `order` releases. */
  NCCL_DEVICE_INLINE void arrive(Coop, cuda::memory_order order) {
    coop_.sync(); /* every thread of the group has done its part before anyone announces it */
    cuda::memory_order release = braid_release_part(order);
    for (int k = coop_.thread_rank(); k < team_.nRanks - 1; k += coop_.size()) {
      int peer = other_member(k);
      cuda::atomic_ref<uint32_t, cuda::thread_scope_system> inbox(*inbox_at(peer, team_.rank));
      inbox.store(epoch_ + 1, release);
    }
  }

  /* Waits until every other member arrived at this round. */
  NCCL_DEVICE_INLINE void wait(Coop, cuda::memory_order order) {
    cuda::memory_order acquire = braid_acquire_part(order);
    uint32_t target = epoch_ + 1;
    for (int k = coop_.thread_rank(); k < team_.nRanks - 1; k += coop_.size()) {
      cuda::atomic_ref<uint32_t, cuda::thread_scope_system> inbox(
          *inbox_at(team_.rank, other_member(k)));
      while ((int32_t)(inbox.load(acquire) - target) < 0) {
      }
    }
    epoch_ = target;
    coop_.sync(); /* what one thread acquired, the whole group may now read */
  }

  NCCL_DEVICE_INLINE void sync(Coop coop, cuda::memory_order order) {
    arrive(coop, order);
    wait(coop, order);
  }

 private:
  Coop coop_;
  ncclDevComm const& comm_;
  ncclTeam team_;
  ncclLsaBarrierHandle handle_;
  uint32_t index_;
  uint32_t epoch_; /* rounds completed, modulo 2^32 */

  /* The k-th member other than this one, k in [0, nRanks - 1). */
  NCCL_DEVICE_INLINE int other_member(int k) const { return k < team_.rank ? k : k + 1; }

  NCCL_DEVICE_INLINE uint32_t* saved_epoch() const {
    uint32_t* words = (uint32_t*)ncclGetResourceBufferLocalPointer(comm_, handle_.bufHandle);
    return words + handle_.nBarriers + index_;
  }

  /* In member `owner`'s memory: the inbox where member `from` posts its epoch. */
  NCCL_DEVICE_INLINE uint32_t* inbox_at(int owner, int from) const {
    uint32_t* words =
        (uint32_t*)ncclGetResourceBufferPeerPointer(comm_, handle_.bufHandle, team_, owner);
    return words + 3 * handle_.nBarriers + index_ * team_.nRanks + from;
  }
};

#endif /* __CUDACC__ */

#endif
