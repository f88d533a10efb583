/*
 * The kernel half of the copy-engine exchange of two ranks (runtime/ce.c): the
 * peer's copy engine writes its data, chunk by chunk, into this rank's
 * scratch slots and raises the slot's `arrived` word; this kernel takes each
 * chunk as it lands (reduces it with this rank's own data, or copies it) into
 * the output, then hands the slot back by raising the peer's `freed` word.
 *
 * Every block takes its share of every chunk and waits for the chunk itself;
 * the last block through a chunk (a counter per slot) frees the slot. A slot
 * is reused only after the peer has seen it freed, so the counter is back at
 * zero by then.
 *
 * With registered buffers (runtime/register.c) the peer's copies land in the
 * output itself: the kernel first tells the peer it may copy (its `ready`
 * word), then reduces each chunk in place with its own data, or only waits
 * for it; the slot's `freed` word is still raised, so the chunk numbers of
 * both kinds of exchange go on alike.
 *
 * Reductions go in rank order, combine(pre(rank 0's), pre(rank 1's)), on
 * both ranks: the same bits whatever the operator. The peer's value arrives
 * as its raw input, so `pre` (PreMulSum's scalar) applies to both values here.
 */
#ifndef BRAID_DEVICE_CE_H
#define BRAID_DEVICE_CE_H

#include "abi/ce_args.h"
#include "device/reduce_copy.h"

namespace braid {

/* Op with `pre` applied to the first value too: reduce_copy applies it to the second only. */
template <typename T, typename Op>
struct op_pre_both {
  static constexpr bool has_pre = Op::has_pre, has_post = Op::has_post;
  Op op;
  __device__ explicit op_pre_both(const Op& o) : op(o) {}
  __device__ __forceinline__ T combine(T a, T b) const {
    return op.combine(has_pre ? op.pre(a) : a, b);
  }
  __device__ __forceinline__ T pre(T x) const { return op.pre(x); }
  __device__ __forceinline__ T post(T x) const { return op.post(x); }
};

/*
 * Spins between two reads of the abort flag, as the ring's waits
 * (prims_common.h). The flag lives in host memory: read on every spin by the
 * waiting threads, it flooded the GPU's link to the host, which also carries
 * the command fetches of launches and copies, and every chunk took hundreds
 * of microseconds whatever its size (docs/tuning.md, Copy-engine waits).
 */
#define BRAID_CE_ABORT_CHECK_SPINS 1024

__device__ __forceinline__ uint32_t ce_load_acquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

/* Whether word `p` has reached `want` (sequence numbers wrap; compare the difference). */
__device__ __forceinline__ bool ce_reached(const uint32_t* p, uint32_t want) {
  return (int32_t)(ce_load_acquire(p) - want) >= 0;
}

template <typename T, typename Op>
__global__ void __launch_bounds__(BRAID_CE_THREADS)
    braid_ce_kernel(const __grid_constant__ struct braid_ce_args a) {
  __shared__ volatile int stop;
  uint64_t scalar = a.scalar;
  if (a.scalar_device) {
    T v = *(const T*)(uintptr_t)a.scalar;
    scalar = 0;
    memcpy(&scalar, &v, sizeof(T));
  }
  const op_pre_both<T, Op> op(Op(scalar, 2));
  const uint64_t nchunks = (a.count + a.chunk_elems - 1) / a.chunk_elems;
  /* Each block's share of a chunk: whole 16-byte packs, so aligned buffers stay aligned. */
  const uint64_t pack = 16 / sizeof(T);
  /* Landing: this rank's buffer is free for the peer's copies once this kernel runs. */
  if (a.landed && a.peer_ready && blockIdx.x == 0 && threadIdx.x == 0)
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(a.peer_ready), "r"(a.ready_value)
                 : "memory");
  for (uint64_t k = 0; k < nchunks; k++) {
    const uint32_t g = a.seq0 + (uint32_t)k, slot = g % a.nslots;
    const uint64_t off = k * a.chunk_elems;
    const uint64_t len = a.count - off < a.chunk_elems ? a.count - off : a.chunk_elems;
    uint64_t per = (len + gridDim.x - 1) / gridDim.x;
    per = (per + pack - 1) / pack * pack;
    const uint64_t lo = per * blockIdx.x < len ? per * blockIdx.x : len;
    const uint64_t hi = lo + per < len ? lo + per : len;
    if (a.mode == BRAID_CE_COPY && a.own_out) /* this rank's own part, while the peer's travels */
      reduce_copy<4, T, op_copy<T>, 1, 1, false, false>(threadIdx.x, blockDim.x, op_copy<T>(),
                                                          (const T*)a.own + off + lo, nullptr,
                                                          (T*)a.own_out + off + lo, nullptr,
                                                          (int64_t)(hi - lo));
    if (threadIdx.x == 0) {
      stop = 0;
      int spins = 0;
      const uint32_t s = a.sent0 + (uint32_t)k;
      while (!ce_reached(&a.flags->arrived[slot], g + 1) ||
             (a.wait_sent == BRAID_CE_SENT_CHUNK && !ce_reached(&a.flags->sent[s & 1], s + 1))) {
        if (++spins == BRAID_CE_ABORT_CHECK_SPINS) {
          spins = 0;
          if (*a.comm->abort_flag) {
            stop = 1;
            break;
          }
        }
      }
    }
    __syncthreads();
    if (stop) return;
    T* out = (T*)a.out + off + lo;
    /* Landed: the peer's chunk is already in `out` (COPY: in its place; REDUCE: in place). */
    const T* peer = a.landed ? out : (const T*)(a.slots + (size_t)slot * a.slot_bytes) + lo;
    if (a.mode == BRAID_CE_COPY && a.landed) {
    } else if (a.mode == BRAID_CE_COPY) {
      reduce_copy<4, T, op_copy<T>, 1, 1, false, false>(threadIdx.x, blockDim.x, op_copy<T>(), peer,
                                                          nullptr, out, nullptr, (int64_t)(hi - lo));
    } else {
      const T* own = (const T*)a.own + off + lo;
      reduce_copy<4, T, op_pre_both<T, Op>, 2, 1, Op::has_pre, Op::has_post>(
          threadIdx.x, blockDim.x, op, a.mine_first ? own : peer, a.mine_first ? peer : own, out,
          nullptr, (int64_t)(hi - lo));
    }
    __syncthreads(); /* the block's loads of the slot have all returned */
    if (threadIdx.x == 0) {
      __threadfence();
      if (atomicAdd(&a.flags->done[slot], 1u) == gridDim.x - 1) {
        atomicExch(&a.flags->done[slot], 0u);
        __threadfence_system();
        asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(&a.peer_freed[slot]), "r"(g + 1)
                     : "memory");
      }
    }
  }
  if (a.ledger_seq == 0 || threadIdx.x != 0) return;
  /* One block waits for this rank's sends: the launch is done when all its blocks report. */
  if (blockIdx.x == 0)
    for (int i = 0, spins = 0; i < 2; i++)
      while ((a.sent_wait & (1 << i)) && !ce_reached(&a.flags->sent[i], a.sent_last[i]))
        if (++spins == BRAID_CE_ABORT_CHECK_SPINS) {
          spins = 0;
          if (*a.comm->abort_flag) return;
        }
  *(volatile uint64_t*)&a.comm->ledger_done[blockIdx.x] = a.ledger_seq;
}

/*
 * A copy stream's step (one thread; ce_args.h): the copy before has
 * completed when this runs (stream order), so its chunk is published with
 * a release; then it polls until the next copy's slot is free, or the
 * communicator aborts. Kernels, not the driver's stream memory operations
 * (runtime/ce.c says why).
 */
template <typename T>
__global__ void braid_ce_step_kernel(const __grid_constant__ struct braid_ce_step s) {
  if (s.arrived || s.sent) {
    __threadfence_system();
    if (s.arrived)
      asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(s.arrived), "r"(s.value) : "memory");
    if (s.sent)
      asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(s.sent), "r"(s.value) : "memory");
  }
  if (s.freed)
    for (int spins = 0; !ce_reached(s.freed, s.want);)
      if (++spins == BRAID_CE_ABORT_CHECK_SPINS) {
        spins = 0;
        if (*s.abort_flag) break;
      }
}

/*
 * The fan's kernel (runtime/ce_fan.c), on the user's stream of an all-gather of 3+ ranks into
 * registered buffers: it tells every peer that this rank's output may be written (the stream
 * has reached the operation), copies this rank's own part into place while the copy engines
 * move the rest, then waits in one block until every peer's part has landed and this rank's
 * copies are out. T is unused: one instance serves every type.
 */
template <typename T>
__global__ void __launch_bounds__(BRAID_CE_THREADS)
    braid_ce_fan_kernel(const __grid_constant__ struct braid_ce_fan_args a) {
  if (blockIdx.x == 0 && threadIdx.x < (unsigned)a.nranks && a.peer_ready[threadIdx.x])
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(a.peer_ready[threadIdx.x]),
                 "r"(a.value)
                 : "memory");
  if (a.own != nullptr && a.own_bytes > 0) {
    uint64_t per = (a.own_bytes + gridDim.x - 1) / gridDim.x;
    per = (per + 15) / 16 * 16;
    const uint64_t lo = per * blockIdx.x < a.own_bytes ? per * blockIdx.x : a.own_bytes;
    const uint64_t hi = lo + per < a.own_bytes ? lo + per : a.own_bytes;
    reduce_copy<4, uint8_t, op_copy<uint8_t>, 1, 1, false, false>(
        threadIdx.x, blockDim.x, op_copy<uint8_t>(), (const uint8_t*)a.own + lo, nullptr,
        (uint8_t*)a.own_out + lo, nullptr, (int64_t)(hi - lo));
  }
  if (threadIdx.x != 0) return;
  if (blockIdx.x == 0) {
    int spins = 0;
    for (int p = 0; p <= a.nranks; p++) {
      /* Every peer's part (p < nranks, not this rank), then this rank's copies (p == nranks). */
      const uint32_t* w = p == a.nranks ? &a.flags->sent : &a.flags->arrived[p];
      if (p < a.nranks && a.peer_ready[p] == nullptr) continue;
      while (!ce_reached(w, a.value))
        if (++spins == BRAID_CE_ABORT_CHECK_SPINS) {
          spins = 0;
          if (*a.comm->abort_flag) return;
        }
    }
  }
  if (a.ledger_seq != 0) *(volatile uint64_t*)&a.comm->ledger_done[blockIdx.x] = a.ledger_seq;
}

/*
 * A step of the fan's copy stream (ce_args.h's braid_ce_fan_step): the copies before it have
 * completed (stream order); thread i publishes entry i, then waits for wait[i].
 */
template <typename T>
__global__ void braid_ce_fan_step_kernel(const __grid_constant__ struct braid_ce_fan_step s) {
  const unsigned i = threadIdx.x;
  if (i >= BRAID_CE_FAN_MAX) return;
  if (s.publish[i] || (i == 0 && s.sent)) {
    __threadfence_system();
    if (s.publish[i])
      asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(s.publish[i]), "r"(s.value)
                   : "memory");
    if (i == 0 && s.sent)
      asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(s.sent), "r"(s.value) : "memory");
  }
  if (s.wait[i])
    for (int spins = 0; !ce_reached(s.wait[i], s.value);)
      if (++spins == BRAID_CE_ABORT_CHECK_SPINS) {
        spins = 0;
        if (*s.abort_flag) break;
      }
}

}  // namespace braid

#define BRAID_CE_KERNEL_ROW(T)                                      \
  {(const void*)braid::braid_ce_kernel<T, braid::op_sum<T>>,        \
   (const void*)braid::braid_ce_kernel<T, braid::op_prod<T>>,       \
   (const void*)braid::braid_ce_kernel<T, braid::op_max<T>>,        \
   (const void*)braid::braid_ce_kernel<T, braid::op_min<T>>,        \
   (const void*)braid::braid_ce_kernel<T, braid::op_premulsum<T>>,  \
   (const void*)braid::braid_ce_kernel<T, braid::op_sumpostdiv<T>>}
#define BRAID_DEFINE_CE_KERNELS(NAME, T)                                                     \
  extern "C" const void* const braid_ce_kernels_##NAME[BRAID_DEVOP_COUNT] = BRAID_CE_KERNEL_ROW(T); \
  extern "C" const void* const braid_ce_step_kernel_##NAME = (const void*)braid::braid_ce_step_kernel<T>; \
  extern "C" const void* const braid_ce_fan_kernel_##NAME = (const void*)braid::braid_ce_fan_kernel<T>; \
  extern "C" const void* const braid_ce_fan_step_kernel_##NAME =                           \
      (const void*)braid::braid_ce_fan_step_kernel<T>;

#endif
