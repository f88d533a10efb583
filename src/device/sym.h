/*
 * Symmetric all-reduce and reduce-scatter, in two variants. Small outputs take the LL variant
 * (sym_allreduce_ll below: each rank pushes its input into every peer's sync memory as LL
 * lines, no meeting); larger ones, where BRAID_SYM_PULL asks for it, the pull variant
 * described here.
 *
 * The pull variant: when the input lies in a symmetric memory window
 * (ncclCommWindowRegister with NCCL_WIN_COLL_SYMMETRIC) and every rank is in
 * one LSA team, each rank reads every rank's input straight from the
 * window's mapping of it (NVLink loads, no FIFO, no proxy), reduces in rank
 * order 0, 1, ..., n-1 (every rank adds each element in the same order from
 * the same bits: identical results everywhere) and writes its own output: all
 * of it (all-reduce), or its own part (reduce-scatter: part r of every
 * rank's input is rank r's output).
 *
 * Barriers between the ranks' blocks of the same index, through the comm's
 * symmetric sync window (runtime/window.c): block b of rank r stores the
 * barrier's epoch into each peer's inbox [b][r] and waits until its own
 * inboxes [b][p] have reached it. The epoch of each block lives in the
 * rank's own sync memory, so launches (and graph replays) continue it.
 *   - before the reads: every rank has reached the operation, so whatever
 *     its stream wrote into the input before is there;
 *   - after each round's reads, before its writes: no rank writes its output
 *     (its input too, in place all-reduce) while another still reads that part, and no
 *     rank's next operation overwrites an input that is still being read.
 * A round holds a block's results in shared memory (BRAID_SYM_ROUND_BYTES); larger
 * inputs take several rounds, one barrier each.
 *
 * The work's fields, as the host encodes them (runtime/enqueue.c):
 *   sendbuff     the input's address in the window's flat mapping as rank 0's
 *                (rank p's is that + p * stride)
 *   chunk_bytes  that window's stride in units of 4 GiB
 *   recvbuff     this rank's output (its own memory)
 *   recv_count   rank 0's sync memory in the sync window's flat mapping
 *   peer_send    the sync window's stride in units of 4 GiB
 *   root         this rank (its place in the LSA team, which is the comm)
 */
#ifndef BRAID_DEVICE_SYM_H
#define BRAID_DEVICE_SYM_H

#include "abi/dev_comm.h"
#include "device/prims_ll.h"
#include "device/reduce_ops.h"

namespace braid {

struct sym_args {
  const char* send0; /* rank 0's input */
  size_t stride;
  uint32_t* sync0;   /* rank 0's sync memory */
  size_t sync_stride;
  int me, n;
};

__device__ __forceinline__ sym_args sym_decode(const struct braid_work& w, int nranks) {
  sym_args a;
  a.send0 = (const char*)w.sendbuff;
  a.stride = (size_t)w.chunk_bytes << 32;
  a.sync0 = (uint32_t*)(uintptr_t)w.recv_count;
  a.sync_stride = (size_t)(uint32_t)w.peer_send << 32;
  a.me = w.root;
  a.n = nranks;
  return a;
}

/* Rank p's sync words: inboxes [block][rank], then one epoch per block. */
__device__ __forceinline__ uint32_t* sym_sync(const sym_args& a, int p) {
  return (uint32_t*)((char*)a.sync0 + (size_t)p * a.sync_stride);
}

__device__ __forceinline__ void sym_store_release(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ uint32_t sym_load_acquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

/*
 * Block `b` meets the same block of every other rank at `epoch`. Every thread of the block
 * calls it; false: the communicator was aborted (aborted[0] set).
 */
__device__ __forceinline__ bool sym_barrier(const sym_args& a, int b, uint32_t epoch,
                                            volatile uint32_t* abort_flag,
                                            volatile int* aborted) {
  __syncthreads(); /* the block's reads and writes so far come before the arrival */
  for (int p = threadIdx.x; p < a.n; p += blockDim.x) {
    if (p == a.me) continue;
    __threadfence_system();
    sym_store_release(sym_sync(a, p) + (size_t)b * a.n + a.me, epoch);
  }
  for (int p = threadIdx.x; p < a.n; p += blockDim.x) {
    if (p == a.me) continue;
    const uint32_t* inbox = sym_sync(a, a.me) + (size_t)b * a.n + p;
    for (uint32_t spins = 1; (int32_t)(sym_load_acquire(inbox) - epoch) < 0; spins++) {
      if ((spins & 1023) == 0 && (*abort_flag || aborted[0])) {
        aborted[0] = 1;
        break;
      }
    }
  }
  __syncthreads();
  return !aborted[0];
}

/* Element `byte` of every rank's input, reduced in rank order. */
template <typename T, typename Op>
__device__ __forceinline__ T sym_reduce_elem(const Op& op, const sym_args& a, size_t byte) {
  T acc = op.pre(*(const T*)(a.send0 + byte));
  for (int p = 1; p < a.n; p++)
    acc = op.combine(acc, op.pre(*(const T*)(a.send0 + (size_t)p * a.stride + byte)));
  return acc;
}

/* The 16-byte pack at `byte` of every rank's input, reduced in rank order. */
template <typename T, typename Op>
__device__ __forceinline__ uint4 sym_reduce_pack(const Op& op, const sym_args& a, size_t byte) {
  uint4 acc = pack_pre<T, Op>(op, __ldcg((const uint4*)(a.send0 + byte)));
  for (int p = 1; p < a.n; p++) {
    const uint4 v = __ldcg((const uint4*)(a.send0 + (size_t)p * a.stride + byte));
    acc = pack_combine<T, Op>(op, acc, pack_pre<T, Op>(op, v));
  }
  return acc;
}

/* A pack's lanes to an output that is not 16-byte aligned (each lane at its element's place). */
template <typename T>
__device__ __forceinline__ void sym_store_lanes(char* out, uint4 v) {
  pack<T> x;
  x.u = v;
#pragma unroll
  for (int i = 0; i < pack<T>::N; i++) ((T*)out)[i] = x.e[i];
}

/*
 * A round of a block holds its results in shared memory until the meeting that lets it
 * write them: BRAID_SYM_ROUND_BYTES of output per block and round (dev_comm.h), whatever the
 * block's size, so
 * that the rounds (and so the meetings) are the same on every rank whatever its
 * BRAID_NTHREADS. Only the input's alignment, the same on every rank (the same offset in a
 * symmetric window), decides between packs and elements.
 */

/*
 * The LL variant (work proto BRAID_PROTO_LL), for outputs of at most BRAID_SYM_LL_BYTES a
 * block: instead of reading its peers' inputs between two meetings, each rank pushes its own
 * input into every peer's sync memory as LL lines (8 bytes of data and the epoch twice in one
 * 16-byte store, as prims_ll.h), and reduces what arrives in its own. No meeting at all:
 *   - a line is there once both its flags read this operation's epoch (the slots start zeroed,
 *     epochs start at 1, and every line a slot ever held carries an older epoch);
 *   - no rank reads another's input or output, so neither may change as soon as this rank's
 *     block is done;
 *   - slots alternate by the epoch's parity: a rank writes a peer's slot of parity e & 1 for
 *     epoch e only after it passed epoch e - 1 or a later meeting of the same block, which the
 *     peer reached only after it read the slot's epoch e - 2 lines.
 * Block b moves bytes [b * BRAID_SYM_LL_BYTES, ...) of each output (reduce-scatter: of each
 * rank's part). Epochs are the blocks' own (shared with the pull variant's meetings), so any
 * number of threads will do.
 */
__device__ __forceinline__ char* sym_ll_slot(const sym_args& a, int owner, int b, uint32_t epoch,
                                             int from) {
  const size_t slot = ((size_t)b * 2 + (epoch & 1)) * a.n + from;
  return (char*)sym_sync(a, owner) + BRAID_SYM_LL_OFFSET(a.n) + slot * BRAID_SYM_LL_SLOT;
}

template <typename T, typename Op>
__device__ __noinline__ void sym_allreduce_ll(const Op& op, const struct braid_work& w,
                                              struct braid_dev_comm* comm, int ch,
                                              volatile int* aborted) {
  const sym_args a = sym_decode(w, comm->nranks);
  const size_t bytes = w.count * sizeof(T); /* this rank's output; a part of each input */
  const size_t first = (size_t)ch * BRAID_SYM_LL_BYTES;
  const int nbytes = first >= bytes                           ? 0
                     : bytes - first < BRAID_SYM_LL_BYTES ? (int)(bytes - first)
                                                              : BRAID_SYM_LL_BYTES;
  const int lines = (nbytes + 7) / 8;
  const bool scatter = w.coll == BRAID_COLL_REDUCESCATTER;
  /* This block's share of this rank's input (reduce-scatter: of its part 0), in its window. */
  const char* in = a.send0 + (size_t)a.me * a.stride + first;
  uint32_t* epoch_word = sym_sync(a, a.me) + (size_t)BRAID_MAX_GRID * a.n + ch;
  __shared__ uint32_t epoch_now;
  if (threadIdx.x == 0) epoch_now = *(volatile uint32_t*)epoch_word + 1;
  __syncthreads();
  const uint32_t epoch = epoch_now;
  /* Push: every line of this rank's share to every peer, the next rank first. */
  for (int i = threadIdx.x; i < lines; i += blockDim.x) {
    const uint64_t v = scatter ? 0 : ll_user_load(in, i, nbytes);
    for (int k = 1; k < a.n; k++) {
      const int p = a.me + k < a.n ? a.me + k : a.me + k - a.n;
      const uint64_t x = scatter ? ll_user_load(in + (size_t)p * bytes, i, nbytes) : v;
      ll_line_store(sym_ll_slot(a, p, ch, epoch, a.me), i, x, epoch);
    }
  }
  /* Reduce in rank order as lines arrive (this rank's own from its input). */
  const char* mine = in + (scatter ? (size_t)a.me * bytes : 0);
  char* out = (char*)w.recvbuff + first;
  bool ok = true;
  for (int i = threadIdx.x; i < lines && ok; i += blockDim.x) {
    uint64_t acc = 0;
    for (int p = 0; p < a.n && ok; p++) {
      uint64_t v;
      if (p == a.me)
        v = ll_user_load(mine, i, nbytes);
      else
        ok = ll_line_load(sym_ll_slot(a, a.me, ch, epoch, p), i, epoch, comm->abort_flag, &v);
      v = pack8_pre<T, Op, Op::has_pre>(op, v);
      acc = p == 0 ? v : pack8_combine<T, Op>(op, acc, v);
    }
    if (ok) ll_user_store(out, i, nbytes, pack8_post<T, Op, Op::has_post>(op, acc));
  }
  if (!ok) aborted[0] = 1;
  if (threadIdx.x == 0) *(volatile uint32_t*)epoch_word = epoch;
}

/*
 * Out of line, as the LL variant, so that the tree family's kernels do not carry its registers
 * (inlined with results held in registers, PreMulSum's tree kernel spilled 112 bytes). ptxas
 * -v, sm_90, float: the LL variant spills nothing; this one 48 bytes (sum) and 32 (PreMulSum),
 * the tree kernel 12 (sum).
 */
template <typename T, typename Op>
__device__ __noinline__ void sym_allreduce(const Op& op, const struct braid_work& w,
                                           struct braid_dev_comm* comm, int ch,
                                           volatile int* aborted) {
  __shared__ uint4 held[BRAID_SYM_ROUND_BYTES / 16];
  sym_args a = sym_decode(w, comm->nranks);
  const size_t bytes = w.count * sizeof(T);
  char* out = (char*)w.recvbuff;
  /* Reduce-scatter: this rank's part of every rank's input, after the parts of the ranks
   * before it. Its offset differs from rank to rank, so packs need every part's size whole. */
  const bool scatter = w.coll == BRAID_COLL_REDUCESCATTER;
  a.send0 += scatter ? (size_t)a.me * bytes : 0;
  const bool packed = ((uintptr_t)w.sendbuff & 15) == 0 && (!scatter || (bytes & 15) == 0);
  const bool out_packed = ((uintptr_t)out & 15) == 0;
  const size_t unit = packed ? 16 : sizeof(T);
  const size_t units = packed ? bytes / 16 : w.count;
  const size_t per_block = BRAID_SYM_ROUND_BYTES / unit; /* units a block holds in a round */
  const size_t per_round = (size_t)w.nchannels * per_block;
  const size_t rounds = units == 0 ? 1 : (units + per_round - 1) / per_round;
  uint32_t* epoch_word = sym_sync(a, a.me) + (size_t)BRAID_MAX_GRID * a.n + ch;
  __shared__ uint32_t epoch0;
  if (threadIdx.x == 0) epoch0 = *(volatile uint32_t*)epoch_word;
  __syncthreads();
  uint32_t epoch = epoch0;
  if (!sym_barrier(a, ch, ++epoch, comm->abort_flag, aborted)) return;
  /* The packs' tail (fewer than 16 bytes, so fewer elements than threads): read with the first
   * round, before its meeting (in place, a rank writes it after), written after that meeting. */
  const size_t tail = packed ? (bytes - units * 16) / sizeof(T) : 0;
  const bool has_tail = ch == 0 && threadIdx.x < tail;
  const size_t tail_byte = units * 16 + threadIdx.x * sizeof(T);
  T tail_value = T();
  if (has_tail) tail_value = sym_reduce_elem<T, Op>(op, a, tail_byte);
  T* held_elems = (T*)held;
  for (size_t r = 0; r < rounds; r++) {
    const size_t first = r * per_round + (size_t)ch * per_block;
    const size_t left = units > first ? units - first : 0;
    const size_t n = left < per_block ? left : per_block;
    for (size_t u = threadIdx.x; u < n; u += blockDim.x) {
      if (packed)
        held[u] = sym_reduce_pack<T, Op>(op, a, (first + u) * 16);
      else
        held_elems[u] = sym_reduce_elem<T, Op>(op, a, (first + u) * sizeof(T));
    }
    if (!sym_barrier(a, ch, ++epoch, comm->abort_flag, aborted)) return;
    for (size_t u = threadIdx.x; u < n; u += blockDim.x) {
      if (!packed)
        *(T*)(out + (first + u) * sizeof(T)) = op.post(held_elems[u]);
      else if (out_packed)
        *(uint4*)(out + (first + u) * 16) = pack_post<T, Op>(op, held[u]);
      else
        sym_store_lanes<T>(out + (first + u) * 16, pack_post<T, Op>(op, held[u]));
    }
    if (r == 0 && has_tail) *(T*)(out + tail_byte) = op.post(tail_value);
  }
  if (threadIdx.x == 0) *(volatile uint32_t*)epoch_word = epoch;
}

}  // namespace braid

#endif
