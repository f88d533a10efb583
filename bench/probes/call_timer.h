// call_timer.h: CALL_TIMER, the probes' loop timing a call on the host and to the stream's end.
//
// CALL_TIMER(stream, n, host_us, all_us, statements...) runs the statements n times (i_ counts
// from 0), the stream drained before; host_us gets the loop's time per call on the host, all_us
// the time per call up to the stream's end.
#ifndef BRAID_PROBES_CALL_TIMER_H
#define BRAID_PROBES_CALL_TIMER_H

#include <cuda.h>
#include <time.h>

#include "cuda_check.h"

/* A one-dimensional launch of `grid` blocks of `block` threads on `s` with n attributes. */
static inline CUlaunchConfig cost_launch_config(unsigned grid, unsigned block, CUstream s,
                                                CUlaunchAttribute* attrs, unsigned n) {
  CUlaunchConfig c = {};
  c.gridDimX = grid;
  c.gridDimY = c.gridDimZ = 1;
  c.blockDimX = block;
  c.blockDimY = c.blockDimZ = 1;
  c.hStream = s;
  c.attrs = attrs;
  c.numAttrs = n;
  return c;
}

static inline double call_timer_now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}

#define CALL_TIMER(stream, n, host_us, all_us, ...)  \
  do {                                               \
    CHECK(cudaStreamSynchronize(stream));            \
    double t0_ = call_timer_now_us();                \
    for (int i_ = 0; i_ < (n); i_++) {               \
      __VA_ARGS__;                                   \
    }                                                \
    double t1_ = call_timer_now_us();                \
    CHECK(cudaStreamSynchronize(stream));            \
    double t2_ = call_timer_now_us();                \
    (host_us) = (t1_ - t0_) / (n);                   \
    (all_us) = (t2_ - t0_) / (n);                    \
  } while (0)

#endif
