/*
 * The proxy: one progress thread per GPU per process that moves network
 * steps between the kernels' FIFOs and a net backend. It knows nothing of
 * collectives; it follows the FIFO counters (collectives/device/dev_comm.h):
 *
 *   sending end    the kernel fills slot s (step % nsteps) and releases
 *                  `tail`; the proxy sees tail > posted, isends the slot,
 *                  and when the send completes releases `head` = steps
 *                  done, so the kernel may refill the slot.
 *   receiving end  the proxy keeps an irecv posted on every free slot (the
 *                  kernel's `head` says which are free); when one completes
 *                  it releases `tail`, and the kernel reads the slot.
 *
 * Steps are numbered from 0 for the life of the connection, across kernels,
 * so counters are all either side needs. The FIFO is plain memory here: the
 * net transport puts it in pinned, device-mapped host memory (or GPU memory
 * for GPUDirect RDMA); tests put it in ordinary memory and stand in for the
 * kernel. Counters are read with acquire and written with release, pairing
 * with the kernels' ld.acquire.sys / st.release.sys.
 *
 * Ownership: proxy_conn_add hands the proxy the connection (and the
 * receiver's listen comm); the proxy thread connects it (connect/accept are
 * resumable, so one slow peer never stalls the others), registers the slots
 * and drives it. proxy_conn_remove takes it back: on return the thread no
 * longer touches it and its net objects are closed. The FIFO memory stays
 * the caller's throughout.
 *
 * Errors (a peer that died, a connect that timed out) stop that connection
 * and are reported once through its on_error callback, from the proxy
 * thread; the net transport turns that into the communicator's async error
 * and its abort flag, so kernels waiting on the connection return.
 */
#ifndef BRAID_CORE_PROXY_H
#define BRAID_CORE_PROXY_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "nccl.h"
#include "transport/net.h"
#include "transport/proxy_events.h"

#define BRAID_PROXY_MAX_STEPS 16

struct braid_proxy;
struct braid_proxy_conn;

struct braid_proxy_fifo {
  char* buff;                /* nsteps slots of slot_bytes (GPU memory when buff_is_cuda) */
  _Atomic uint64_t* tail;    /* steps filled: sender kernel (send end) / proxy (receive end) */
  _Atomic uint64_t* head;    /* steps drained: proxy (send end) / receiver kernel (receive end) */
  _Atomic uint32_t* sizes;   /* optional [nsteps]: bytes in each slot; NULL: whole slots */
  size_t slot_bytes;
  int nsteps;                /* at most BRAID_PROXY_MAX_STEPS, at most the backend's max_requests */
};

struct braid_proxy_conn_desc {
  int is_send;
  const struct braid_net_ops* net;
  int dev;                                /* the backend's device */
  uint8_t key[BRAID_NET_KEY_BYTES];       /* presented / required on the wire */
  /* Send end: the receiver's listen handle, as it came (the backend checks it). */
  uint8_t handle[BRAID_NET_HANDLE_BYTES] __attribute__((aligned(8)));
  void* listen_comm;                      /* receive end: its listener (the proxy owns it now) */
  struct braid_proxy_fifo fifo;
  int buff_is_cuda;                       /* slots in GPU memory (GPUDirect RDMA) */
  int dmabuf_fd;                          /* >= 0: register the slots through this dma-buf */
  uint64_t dmabuf_offset;
  double connect_timeout;                 /* seconds to get connected */
  char peer[96];                          /* "rank 3 (node2) channel 1", for messages */
  /* Called once, from the proxy thread, when the connection fails. */
  void (*on_error)(void* arg, ncclResult_t res);
  void* error_arg;
  /* The comm's abort flag: raised when the connection goes, it closes without a goodbye. */
  volatile uint32_t* abort_flag;
  /* A profiler's sink for this connection's operations and steps, or NULL (proxy_events.h). */
  const struct braid_proxy_events* events;
  void* events_ctx;
  int peer_rank, channel; /* as the events name them */
};

/*
 * The proxy of `cuda_dev` in this process, started on first use (its thread
 * pinned near the GPU at PCI `bus_id`, -1: not pinned), with a reference.
 */
ncclResult_t proxy_acquire(int cuda_dev, int64_t bus_id, struct braid_proxy** out);
/* Drops a reference; the last one stops the thread (every connection must be removed). */
void proxy_release(struct braid_proxy* proxy);

/* Hands a connection to the proxy thread; it starts connecting at once. */
ncclResult_t proxy_conn_add(struct braid_proxy* proxy, const struct braid_proxy_conn_desc* desc,
                            struct braid_proxy_conn** out);
/* Takes it back (waits for the thread to let go), closes its net objects and frees it. */
void proxy_conn_remove(struct braid_proxy* proxy, struct braid_proxy_conn* conn);

/* 0: connecting, 1: connected, -1: failed (*error: why). Any thread. */
int proxy_conn_state(const struct braid_proxy_conn* conn, ncclResult_t* error);
/* Steps completed so far (sent and acknowledged / received and released). Any thread. */
uint64_t proxy_conn_steps(const struct braid_proxy_conn* conn);

#endif
