/*
 * Helpers shared by the bootstrap mp tests: handing the unique id from rank 0
 * to the other children, environment changes that take effect, counting fds
 * and threads for leak checks, an all-gather checked byte by byte, running a
 * case over fresh shared memory, reading a child's log, forging a hello, and
 * two network namespaces joined by a veth pair.
 *
 * They report through return values (never TEST_CHECK, whose counters are
 * per translation unit), so each test file keeps its own verdict.
 */
#ifndef BRAID_TESTS_MP_BOOT_UTIL_H
#define BRAID_TESTS_MP_BOOT_UTIL_H

#include <stddef.h>

#include <stdint.h>

#include "bootstrap/bootstrap.h"
#include "mp_runner.h"
#include "nccl.h"

struct bootstrap_hello;
struct bootstrap_id_layout;

/* The id, in shared memory: rank 0 makes it, the others wait for it. */
struct boot_id_slot {
  int state; /* 0: not yet; 1: ready; -1: rank 0 could not make one */
  ncclUniqueId id;
};

/* Sets (value != NULL) or unsets an environment variable and re-reads Braid's parameters. */
void boot_env(const char* name, const char* value);
/* The bootstrap over loopback (BRAID_SOCKET_IFNAME=lo), its init giving up after `timeout` s. */
void boot_loopback(const char* timeout);
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

/*
 * Runs `fn` in `nprocs` children (mp_run) whose c->arg is `size` bytes of zeroed shared memory,
 * freed afterwards; returns their verdict.
 */
int boot_run(const char* name, int nprocs, double timeout_sec, size_t size, mp_child_fn fn);

/* Sends this process's log to `path`, created empty; `level` (NULL: unchanged) sets BRAID_DEBUG. */
void boot_log_to(const char* path, const char* level);
/* A whole (small) file, in a static buffer; "" when missing. */
const char* boot_slurp(const char* path);
/* How many lines of `text` contain `needle`. */
int boot_count_lines(const char* text, const char* needle);

/*
 * A hello of `kind` right in every way for the job of `id` but its secret (byte `at` flipped
 * by `flip`): rank 1 of `nranks`, this process's pid, the root's address as its listener, and
 * `host` as its host name.
 */
void boot_hello_wrong_secret(struct bootstrap_hello* h, const struct bootstrap_id_layout* id,
                             int kind, int nranks, int at, uint8_t flip, const char* host);

/* Two network namespaces ("hosts") joined by one veth pair, in shared memory for the children. */
struct boot_netns {
  char ns[2][32];   /* the namespaces */
  char dev[2][24];  /* each one's end of the veth pair */
  char addr[2][32]; /* each one's address on it (a /24) */
};
/* Why this process cannot make namespaces (not root, no `ip` command), or NULL. */
const char* boot_netns_unavailable(void);
/*
 * Makes namespaces <ns_prefix>A<id> and <ns_prefix>B<id> with veth ends <dev_prefix>a<id> and
 * <dev_prefix>b<id>, addresses 10.<subnet>.<n>.1 and .2, every link up; they are removed at
 * exit or by boot_netns_remove. 0 when ready.
 */
int boot_netns_setup(struct boot_netns* n, const char* ns_prefix, const char* dev_prefix,
                     int subnet);
void boot_netns_remove(void);
/* Moves the calling process into namespace `side` (0 or 1); 0 on success. */
int boot_netns_enter(const struct boot_netns* n, int side);

#endif
