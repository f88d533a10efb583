/*
 * Helpers shared by the bootstrap mp tests: handing the unique id from rank 0
 * to the other children, environment changes that take effect, counting fds
 * and threads for leak checks, and an all-gather checked byte by byte.
 *
 * They report through return values (never TEST_CHECK, whose counters are
 * per translation unit), so each test file keeps its own verdict.
 */
#ifndef BRAID_TESTS_MP_BOOT_UTIL_H
#define BRAID_TESTS_MP_BOOT_UTIL_H

#include <stddef.h>

#include "bootstrap/bootstrap.h"
#include "nccl.h"

/* The id, in shared memory: rank 0 makes it, the others wait for it. */
struct boot_id_slot {
  int state; /* 0: not yet; 1: ready; -1: rank 0 could not make one */
  ncclUniqueId id;
};

/* Sets (value != NULL) or unsets an environment variable and re-reads Braid's parameters. */
void boot_env(const char* name, const char* value);
/* Child `index` 0 calls bootstrap_get_unique_id and publishes; others wait. 0 on success. */
int boot_id_share(struct boot_id_slot* slot, int index, double timeout_sec);
/* Waits until *flag >= value (shared memory); 0 when it happened within the time. */
int boot_wait_flag(int* flag, int value, double timeout_sec);
void boot_set_flag(int* flag, int value);
int boot_add_flag(int* flag, int delta);

int boot_fd_count(void);
/* Threads Braid started ("braid-*"), not counting the test's or a sanitizer's own. */
int boot_thread_count(void);
/* Waits until this process has `fds` open fds (-1: any) and `threads` Braid threads; 0 if so. */
int boot_settle(int fds, int threads, double timeout_sec);

/* A TCP port on `host` (e.g. "127.0.0.1" or "::1") that was free a moment ago, or -1. */
int boot_free_port(const char* host);
double boot_now(void);

/*
 * All-gathers blocks of `size` bytes whose content depends on (rank, salt)
 * and checks every byte of every block. Returns the number of bad blocks, or
 * -1 when the call itself failed.
 */
int boot_allgather_check(struct bootstrap* b, size_t size, int salt);
/*
 * Ring send/recv: three tags to the next rank, received from the previous
 * rank out of order (3, 1, 2). Returns the number of bad messages, or -1.
 */
int boot_ring_tags_check(struct bootstrap* b, int salt);

#endif
