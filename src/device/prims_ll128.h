/*
 * The LL128 protocol (dev_comm.h): 128-byte lines of 15 data words and a
 * flag word, each line written by 8 threads of a warp with one 16-byte
 * store apiece. A receiver polls the flag, as with LL, but 120 of every 128
 * bytes carry data instead of 8 of 16, so LL128 keeps most of Simple's
 * bandwidth at close to LL's latency. It relies on NVLink delivering a
 * warp's 128-byte store whole; the host uses it only there.
 *
 * Thread layout: lane l of a warp owns the 16-byte piece j = l % 8 of line
 * l / 8 of each group of 4 lines the warp takes, i.e. data words 2j and
 * 2j + 1 of the line (the flag thread, j = 7, has word 14 and the flag). A
 * thread carries its words from the line it receives to the line it sends
 * at the same place, so a recv-reduce-send step needs no shuffle.
 *
 * Polling is per warp: every thread loads its pieces of BRAID_LL128_UNROLL
 * groups of lines; while any flag thread saw a stale flag, the warp loads
 * them all again (__any_sync), so a line is only used once its flag, read
 * in the same load as its data, is the step's. Loops over lines therefore
 * stay warp-uniform, and a group's thread count must be a multiple of 32.
 *
 * User buffers need no alignment: words are read and written as LL's are
 * (ll_user_load/ll_user_store).
 */
#ifndef BRAID_DEVICE_PRIMS_LL128_H
#define BRAID_DEVICE_PRIMS_LL128_H

#include "device/prims_ll.h"

namespace braid {

#define BRAID_LL128_UNROLL 4 /* groups of 4 lines a warp has in flight */

__device__ __forceinline__ void ll128_piece_store(char* p, uint64_t a, uint64_t b) {
  asm volatile("st.volatile.global.v2.u64 [%0], {%1,%2};" ::"l"(p), "l"(a), "l"(b) : "memory");
}

__device__ __forceinline__ void ll128_piece_load(const char* p, uint64_t* a, uint64_t* b) {
  asm volatile("ld.volatile.global.v2.u64 {%0,%1}, [%2];" : "=l"(*a), "=l"(*b) : "l"(p) : "memory");
}

template <typename T, typename Op>
struct prims_ll128 : prims_base<T, Op>, prims_named<prims_ll128<T, Op>, T, Op> {
  BRAID_PRIMS_BASE(T, Op);

  __device__ char* ll128_slot(const conn_end& c) const {
    return slot_at(c.ll128_buff, c.ll128_slot_bytes, c.step);
  }

  /*
   * The warp's pieces of lines first + 4u + lane / 8 (u < BRAID_LL128_UNROLL)
   * of `slot`, once every flag among them is `flag`. False when the
   * communicator aborted.
   */
  __device__ __forceinline__ bool recv_pieces(const char* slot, int first, int nlines,
                                              uint64_t flag, int lane,
                                              volatile uint32_t* abort,
                                              uint64_t (&a)[BRAID_LL128_UNROLL],
                                              uint64_t (&b)[BRAID_LL128_UNROLL]) {
    const bool flag_thread = lane % 8 == 7;
    int spins = 0;
    for (;;) {
      bool stale = false;
#pragma unroll
      for (int u = 0; u < BRAID_LL128_UNROLL; u++) {
        const int line = first + 4 * u + lane / 8;
        if (line < nlines) {
          ll128_piece_load(slot + line * BRAID_LL128_LINE_BYTES + 16 * (lane % 8), &a[u], &b[u]);
          stale |= flag_thread && b[u] != flag;
        }
      }
      if (!__any_sync(0xffffffffu, stale)) return true;
      if (++spins == BRAID_ABORT_CHECK_SPINS) {
        spins = 0;
        if (*abort) return false;
      }
    }
  }

  /*
   * One pipeline step (prims_named). A step holds at most one slot's data
   * (BRAID_LL128_SLOT_DATA bytes), so line and word indices fit in 32 bits;
   * keeping them there keeps the unrolled loops within the registers the
   * kernels have. A receiving step combines op(received, mine), or with
   * MINE_FIRST op(mine, received): the pair exchange (ring.h) uses that on
   * the lower rank, so both ranks compute op(rank 0's, rank 1's), the same bits.
   *
   * Out of line: each instantiation is compiled once per kernel instead of at
   * every call site in the algorithms, which cuts the LL128 kernels' compile
   * time by 3.5x (docs/tuning.md, Steps out of line). The members the loop
   * needs are copied to locals first, so that no store through `dst` or the
   * slot makes the compiler read them again from the primitives' object.
   */
  template <bool RECV, bool SEND, bool SRC, bool DST, bool PRE, bool POST, bool MINE_FIRST = false>
  __device__ __noinline__ bool step(const T* src, T* dst, int64_t nelem) {
    if (SEND && !begin_send()) return false;
    const Op op = this->op;
    const int tid = this->tid, nthreads = this->nthreads;
    volatile uint32_t* const abort = abort_flag;
    const int nbytes = (int)(nelem * (int64_t)sizeof(T));
    const int nlines = ((nbytes + 7) / 8 + BRAID_LL128_LINE_WORDS - 1) / BRAID_LL128_LINE_WORDS;
    const char* rslot = RECV ? ll128_slot(recv) : nullptr;
    char* sslot = SEND ? ll128_slot(send) : nullptr;
    const uint64_t rflag = RECV ? BRAID_LL128_FLAG(recv.step) : 0;
    const uint64_t sflag = SEND ? BRAID_LL128_FLAG(send.step) : 0;
    const int lane = tid % 32, j = lane % 8;
    const bool flag_thread = j == 7;
    const int per_warp = 4 * BRAID_LL128_UNROLL;
    const int stride = (nthreads / 32) * per_warp;
    bool ok = true;
    for (int first = (tid / 32) * per_warp; first < nlines; first += stride) {
      /* The user's words first: their loads overlap the wait for the peer's lines. */
      uint64_t sx[BRAID_LL128_UNROLL] = {}, sy[BRAID_LL128_UNROLL] = {};
#pragma unroll
      for (int u = 0; u < BRAID_LL128_UNROLL; u++) {
        const int line = first + 4 * u + lane / 8;
        const int w = line * BRAID_LL128_LINE_WORDS + 2 * j; /* the thread's first data word */
        if (SRC && line < nlines) {
          sx[u] = ll_user_load(src, w, nbytes);
          if (!flag_thread) sy[u] = ll_user_load(src, w + 1, nbytes);
        }
      }
      uint64_t a[BRAID_LL128_UNROLL] = {}, b[BRAID_LL128_UNROLL] = {};
      if (RECV && !recv_pieces(rslot, first, nlines, rflag, lane, abort, a, b)) {
        ok = false;
        break;
      }
#pragma unroll
      for (int u = 0; u < BRAID_LL128_UNROLL; u++) {
        const int line = first + 4 * u + lane / 8;
        const bool valid = line < nlines; /* the same for the 8 threads of a line */
        const int w = line * BRAID_LL128_LINE_WORDS + 2 * j;
        uint64_t x = a[u], y = b[u];
        if (SRC) {
          x = pack8_pre<T, Op, PRE>(op, sx[u]);
          y = pack8_pre<T, Op, PRE>(op, sy[u]);
          if (RECV) {
            x = MINE_FIRST ? pack8_combine<T, Op>(op, x, a[u]) : pack8_combine<T, Op>(op, a[u], x);
            y = MINE_FIRST ? pack8_combine<T, Op>(op, y, b[u]) : pack8_combine<T, Op>(op, b[u], y);
          }
        }
        x = pack8_post<T, Op, POST>(op, x);
        y = pack8_post<T, Op, POST>(op, y);
        if (DST && valid) {
          ll_user_store(dst, w, nbytes, x);
          if (!flag_thread) ll_user_store(dst, w + 1, nbytes, y);
        }
        if (SEND) {
          /* The line's 8 pieces in one warp-wide store: reconverge first. */
          __syncwarp();
          if (valid)
            ll128_piece_store(sslot + line * BRAID_LL128_LINE_BYTES + 16 * j, x,
                              flag_thread ? sflag : y);
        }
      }
    }
    if (RECV && !end_recv(ok)) return false;
    if (SEND) send.step++;
    if (RECV) recv.step++;
    return true;
  }
};

}  // namespace braid

#endif
