/*
 * Small host helpers shared by every layer: identity hashes, clocks,
 * allocation that reports what failed, and PCI bus id conversion.
 */
#ifndef BRAID_CORE_UTILS_H
#define BRAID_CORE_UTILS_H

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

#define BRAID_MIN(a, b) ((a) < (b) ? (a) : (b))
#define BRAID_MAX(a, b) ((a) > (b) ? (a) : (b))
#define BRAID_DIV_UP(x, y) (((x) + (y) - 1) / (y))
#define BRAID_ALIGN_UP(x, a) (BRAID_DIV_UP((x), (a)) * (a))
#define BRAID_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* 64-bit FNV-1a of a byte string. */
uint64_t braid_hash(const void* data, size_t size);
/* Identity of this host: BRAID_HOSTID if set, else hostname + boot id. */
uint64_t braid_host_hash(void);
/* Identity of this process on this host. */
uint64_t braid_pid_hash(void);
/*
 * When process `pid` of this pid namespace started (clock ticks since boot, /proc/<pid>/stat),
 * 0 when unknown; and whether it is gone: no such process, one that exited but was not reaped
 * yet (a zombie), or, given its `start` (0: not checked), a later process that took its pid.
 */
uint64_t braid_process_start(int pid);
int braid_process_gone(int pid, uint64_t start);
/* Whether process `pid` of this pid namespace is stopped (SIGSTOP, or traced); 0 when unknown. */
int braid_process_stopped(int pid);

/* Monotonic clock in seconds / nanoseconds. */
double braid_time_sec(void);
uint64_t braid_time_ns(void);

/* calloc that logs the size and the purpose on failure. */
ncclResult_t braid_calloc(void** out, size_t nmemb, size_t size, const char* what);
#define BRAID_CALLOC(ptr, n, what) braid_calloc((void**)(ptr), (n), sizeof(**(ptr)), (what))

/* "0000:1b:00.0" <-> 0x1b000 (domain:bus:device.function as one number). */
int64_t braid_busid_to_int(const char* busid);
void braid_busid_to_str(int64_t id, char* out, size_t size);

/*
 * A name-list spec as NCCL's *_IFNAME / *_HCA variables take it: comma-separated
 * tokens, matched as prefixes; a leading '^' excludes what matches, a '=' (after
 * any '^') asks for exact names. `token_match` says whether one token (tok, len)
 * matches; an empty spec, or one with no tokens, matches everything.
 */
typedef int (*braid_token_match_fn)(const char* tok, size_t len, int exact, const void* arg);
int braid_spec_match(const char* spec, braid_token_match_fn token_match, const void* arg);

/* Fills `buf` with cryptographically random bytes (getrandom). */
ncclResult_t braid_random_bytes(void* buf, size_t size);

/*
 * A CUDA driver function by name (its CUDA 12.0 ABI), reached through the
 * runtime, as Braid does not link libcuda; NULL when the driver lacks it.
 */
void* braid_driver_fn(const char* name);

/*
 * Zeroes device memory of the current device and returns once it is zero. Not cudaMemset: that
 * runs on the legacy stream, unordered with the non-blocking streams of kernels (ours, or a peer
 * process's writing through an IPC mapping), and returns before the memory is zero.
 */
ncclResult_t braid_cuda_zero(void* ptr, size_t bytes);

/* Whether n bytes at a and b are equal, in a time that does not depend on where they differ. */
static inline int braid_equal_ct(const void* a, const void* b, size_t n) {
  const unsigned char *x = (const unsigned char*)a, *y = (const unsigned char*)b;
  unsigned char diff = 0;
  for (size_t i = 0; i < n; i++) diff |= (unsigned char)(x[i] ^ y[i]);
  return diff == 0;
}

/* Whether byte ranges [a, a + na) and [b, b + nb) share a byte (empty ranges share none). */
static inline int braid_ranges_overlap(const void* a, size_t na, const void* b, size_t nb) {
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  return na > 0 && nb > 0 && x < y + nb && y < x + na;
}

#endif
