/*
 * Helpers of the net backend tests (net_conformance_test, proxy_fifo_test):
 * opening a backend by name in a child (or saying why it cannot run here),
 * connect/accept/wait loops with time limits, and data patterns.
 *
 * Like boot_util, they report through return values, never TEST_CHECK.
 */
#ifndef BRAID_TESTS_MP_NET_UTIL_H
#define BRAID_TESTS_MP_NET_UTIL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "nccl.h"
#include "transport/net.h"

#define NET_UTIL_TIMEOUT_RES ((ncclResult_t)-1) /* a wait ran past its time limit */

/* What the children of one test share (mp_shared_alloc). */
struct net_shared {
  int flags[8];
  uint8_t key[BRAID_NET_KEY_BYTES];
  uint8_t handle[4][BRAID_NET_HANDLE_BYTES] __attribute__((aligned(8)));
  double result[4];
  char ns[2][32];   /* netns: the namespaces */
  char addr[2][32]; /* netns: their addresses */
  char ifname[2][16];
};

/* A proxy FIFO's counters in host memory, where a kernel's would be (proxy_fifo_test,
 * proxy_latency). */
#define NET_UTIL_FIFO_STEPS 8
struct net_fifo_mem {
  _Atomic uint64_t tail;
  char pad0[120];
  _Atomic uint64_t head;
  char pad1[120];
  _Atomic uint32_t sizes[NET_UTIL_FIFO_STEPS];
};

/*
 * Opens backend `name` ("socket", "ofi", "ib", "plugin") in this process: OFI is
 * pointed at the "tcp;ofi_rxm" provider unless BRAID_OFI_PROVIDER says
 * otherwise. Returns 0, or TEST_SKIP_CODE after printing why it cannot run.
 */
int net_util_open(const char* name, const struct braid_net_ops** ops, int* ndev);

/* Loops on connect/accept until a comm comes, an error, or the time limit. */
ncclResult_t net_util_connect(const struct braid_net_ops* ops, int dev, const uint8_t* key,
                              const void* handle, void** comm, double timeout_sec);
/* The same; *longest_call: the longest single connect call (one must never block for long). */
ncclResult_t net_util_connect_timed(const struct braid_net_ops* ops, int dev, const uint8_t* key,
                                    const void* handle, void** comm, double timeout_sec,
                                    double* longest_call);
ncclResult_t net_util_accept(const struct braid_net_ops* ops, void* listen_comm, void** comm,
                             double timeout_sec);
/* Posts until the backend takes the request (it may say "later"). */
ncclResult_t net_util_post(const struct braid_net_ops* ops, void* comm, int is_send, void* data,
                           size_t size, void** req, double timeout_sec);
/* Tests until done; *size (may be NULL) gets the bytes moved. */
ncclResult_t net_util_wait(const struct braid_net_ops* ops, void* req, size_t* size,
                           double timeout_sec);

/*
 * The registration (reg_mr) of [data, data+size) with `comm`, made on first use and kept until
 * net_util_close: IB needs every buffer registered, the other backends take the same calls.
 * NULL when registering failed (the reason is on stderr) or the backend needs none.
 */
void* net_util_mh(const struct braid_net_ops* ops, void* comm, void* data, size_t size);
/* Drops `comm`'s registrations, then closes it (close_send, or close_recv). */
void net_util_close(const struct braid_net_ops* ops, void* comm, int is_send);

/* Bytes that depend on (seed, offset): fill, and count mismatches. */
void net_util_fill(void* buf, size_t size, uint64_t seed);
size_t net_util_check(const void* buf, size_t size, uint64_t seed);

/* Creates two network namespaces joined by a veth pair into sh (ns, addr, ifname); 0 when ready. */
int net_util_netns_setup(struct net_shared* sh);
void net_util_netns_cleanup(struct net_shared* sh);
/* Moves the calling process into namespace `side` and selects its veth; 0 on success. */
int net_util_netns_enter(const struct net_shared* sh, int side);

#endif
