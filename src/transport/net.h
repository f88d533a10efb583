/*
 * Net backends: how bytes leave the host. A backend is one ops table
 * (size first, append-only, every slot filled) in one file or folder:
 * net_socket.c (TCP, always built), net_ib.c (rdma-core verbs, dlopen),
 * net_ofi.c (libfabric, dlopen), net_plugin.c (an NCCL net plugin, dlopen).
 * The proxy thread (transport/proxy.c) is the only caller of the data-path slots;
 * the net transport (net.c) sets connections up;
 * tests/mp/net_conformance_test.c runs one suite over every backend.
 *
 * The model is NCCL's net plugin model, minus tags:
 *   - a receiver listens on a device and hands the opaque `handle` to the
 *     sender out of band (the bootstrap); the sender connects to it; the
 *     receiver accepts. Every connection presents the job's key
 *     (BRAID_NET_KEY_BYTES, the bootstrap secret); the listener closes and
 *     logs (WARN, with the remote address) any connection without it.
 *   - connect and accept never block for long: they return with the comm
 *     NULL when the other side is not there yet; call again.
 *   - isend/irecv post one message each and return a request, or NULL when
 *     the comm has max_requests outstanding already (call again later).
 *     Messages of one comm are matched in order: the n-th isend fills the
 *     n-th irecv. A receive may be larger than the message; smaller is an
 *     error (truncation).
 *   - test completes a request (done = 1 frees it; size: bytes moved). Any
 *     order of testing is allowed. A peer that died or closed turns into an
 *     error from test (ncclRemoteError) within seconds, never a hang.
 *   - memory is registered before use (a no-op for sockets); GPU memory only
 *     where props.ptr_support says so.
 *
 * Threading: one comm is driven by one thread at a time (the proxy); init
 * and listen/connect of different comms may run on different threads.
 */
#ifndef BRAID_TRANSPORT_NET_H
#define BRAID_TRANSPORT_NET_H

#include <stddef.h>
#include <stdint.h>

#include "base/socket.h"
#include "nccl.h"

/*
 * Listen handles: opaque bytes that travel between ranks, in buffers aligned to 8 (a backend
 * may lay a struct over them). They hold what a sender needs to reach the listener and nothing
 * of the sender's own: a connect's progress lives in its state (see connect).
 */
#define BRAID_NET_HANDLE_BYTES 128
#define BRAID_NET_KEY_BYTES 16
#define BRAID_NET_MAX_DEVS 32

/* What memory a backend can send from / receive into (props.ptr_support). */
#define BRAID_NET_PTR_HOST 0x1
#define BRAID_NET_PTR_CUDA 0x2   /* GPUDirect RDMA on CUDA pointers (IB: nvidia-peermem; OFI: FI_HMEM) */
#define BRAID_NET_PTR_DMABUF 0x4 /* GPUDirect RDMA through dma-buf (reg_mr_dmabuf) */

struct braid_net_props {
  char name[64];        /* "eth0", "mlx5_0:1", "lo (tcp;ofi_rxm)" */
  char pci_path[256];   /* sysfs path of the PCI device; "" when virtual */
  int speed_mbps;
  int latency_us;       /* a rough figure for the tuning model */
  int port;             /* IB port; 0 elsewhere */
  unsigned ptr_support; /* BRAID_NET_PTR_* */
  int max_requests;     /* outstanding isend/irecv per comm */
  size_t max_bytes;     /* largest message */
};

struct braid_net_ops {
  size_t size;      /* sizeof(struct braid_net_ops): tables only grow by appending */
  const char* name; /* "Socket", "IB", "OFI", "Plugin" (BRAID_NET matches it, case-insensitive) */
  /*
   * Loads what the backend needs and counts its devices. Idempotent and
   * thread-safe. A backend that cannot run here returns ncclSuccess with
   * *ndev = 0 and says why in `why` ("libibverbs.so.1 not found", "not
   * built: no rdma/fabric.h at build time", "no device"); it logs nothing
   * itself, so probing is quiet.
   */
  ncclResult_t (*init)(int* ndev, char* why, size_t why_size);
  /* Fills *props for device `dev` (0 <= dev < ndev). */
  ncclResult_t (*get_properties)(int dev, struct braid_net_props* props);
  /*
   * Listens on `dev` for connections presenting `key`; writes what a sender
   * needs into `handle` (BRAID_NET_HANDLE_BYTES). The listen comm is the
   * caller's until close_listen.
   */
  ncclResult_t (*listen)(int dev, const uint8_t* key, void* handle, void** listen_comm);
  /*
   * Connects to a listener's `handle`, presenting `key`, without blocking
   * for long (a fraction of a second at most). The handle is bytes that came
   * from a peer: the backend checks every field of it (magic, version,
   * lengths, address family) before use, and takes nothing in it for a
   * pointer, an index or a count it has not checked; a malformed handle
   * fails the connect with a message that says so, never a crash.
   *
   * An unfinished connect keeps its progress in *state, which the caller
   * owns and keeps in its own memory, never in a handle: NULL before the
   * first call. *send_comm stays NULL while the connection is not
   * established yet: call again with the same handle and state, or give up
   * with connect_abandon(*state). Once a call returns a comm or fails,
   * *state is NULL again (the backend released it). Fails when the listener
   * refuses for good (the message names its address).
   */
  ncclResult_t (*connect)(int dev, const uint8_t* key, const void* handle, void** state,
                          void** send_comm);
  /* Releases an unfinished connect's state; harmless with NULL. */
  void (*connect_abandon)(void* state);
  /*
   * The next connection made to the listener with the right key, or NULL
   * (call again). Connections with a wrong key are dropped and logged here.
   */
  ncclResult_t (*accept)(void* listen_comm, void** recv_comm);
  /* Registers `data` (host memory, or GPU memory when `is_cuda`) for use on `comm`. */
  ncclResult_t (*reg_mr)(void* comm, void* data, size_t size, int is_cuda, void** mhandle);
  /* The same for GPU memory exported as a dma-buf; ncclInternalError where unsupported. */
  ncclResult_t (*reg_mr_dmabuf)(void* comm, void* data, size_t size, uint64_t offset, int fd,
                                void** mhandle);
  /* Releases a registration; the memory must not be in use by a request. */
  ncclResult_t (*dereg_mr)(void* comm, void* mhandle);
  /* Posts one message; *request NULL: too many outstanding, call again. `data` stays ours until done. */
  ncclResult_t (*isend)(void* send_comm, void* data, size_t size, void* mhandle, void** request);
  /* Posts one receive of at most `size` bytes; *request NULL: call again. */
  ncclResult_t (*irecv)(void* recv_comm, void* data, size_t size, void* mhandle, void** request);
  /*
   * Makes received GPU data visible to the GPU (GPUDirect RDMA); *request
   * NULL when nothing needs flushing (host memory, or the backend orders
   * writes itself) or the flush was done before returning. Test it like a
   * receive.
   */
  ncclResult_t (*iflush)(void* recv_comm, void* data, size_t size, void* mhandle, void** request);
  /* *done = 1 when the request finished (it is freed then); *size (may be NULL): bytes moved. */
  ncclResult_t (*test)(void* request, int* done, size_t* size);
  /* Close a comm; outstanding requests are abandoned. Never fail on a peer already gone. */
  ncclResult_t (*close_send)(void* send_comm);
  ncclResult_t (*close_recv)(void* recv_comm);
  ncclResult_t (*close_listen)(void* listen_comm);
  /*
   * Optional, both or neither (NULL: the proxy tests every receive comm on
   * every pass). recv_fd: a descriptor that polls readable when bytes (or
   * the end of the connection) arrive for `recv_comm`, -1 when there is
   * none. recv_busy: nonzero while some request could complete without
   * such bytes (data moved by the backend's own threads, a request whose
   * bytes all came but that was not tested yet, an error). While the fd is
   * quiet and the comm is not busy, test() on any of its requests can only
   * say "not done", so the proxy skips it: a pass over many idle receive
   * connections costs one epoll_wait, not one recv() each. Called from the
   * thread that posts and tests the comm's requests; recv_busy must not
   * make a system call.
   */
  int (*recv_fd)(void* recv_comm);
  int (*recv_busy)(void* recv_comm);
  /*
   * Optional: closes a send or receive comm without the goodbye a clean
   * close sends (an abort), so that the peer's pending receives fail at once
   * instead of waiting for data that will not come. NULL: close_send/recv.
   */
  ncclResult_t (*close_abort)(void* comm);
  /*
   * Optional: a turn for a connected comm with no request under way, which
   * the proxy gives every NET_IDLE_TURN_S at most. For a backend whose
   * provider moves nothing without the caller's progress (OFI's manual
   * progress), an idle comm must still take its peer's liveness probes and
   * goodbye, or a peer waiting longer than the probe window for it to send
   * would read it as dead. NULL: nothing to do.
   */
  ncclResult_t (*idle)(void* comm);
};

#define NET_IDLE_TURN_S 0.1

extern const struct braid_net_ops braid_net_socket;
extern const struct braid_net_ops braid_net_ib;
extern const struct braid_net_ops braid_net_ofi;
/*
 * An NCCL net plugin's network (net_plugin.c); its init loads the plugin once
 * per process (BRAID_NET_PLUGIN) and logs what it found, as NCCL does.
 */
extern const struct braid_net_ops braid_net_plugin;
/* The loaded net plugin's network name (loading it on first use), or NULL when there is none. */
const char* net_plugin_network_name(void);
/* The loaded net plugin's library file (NCCL also looks there for a tuner), or NULL. */
const char* net_plugin_library_path(void);

/* Every backend this build knows, in order of preference for the default choice. */
int net_backend_count(void);
const struct braid_net_ops* net_backend_at(int index);
/* The backend called `name` (case-insensitive), or NULL. */
const struct braid_net_ops* net_backend_find(const char* name);

/*
 * The backend the process uses (chosen once, logged at INFO with why):
 * BRAID_NET / NCCL_NET when set (a backend's name, or the net plugin's
 * network name; failing, with the reason, if that backend cannot run here),
 * else the net plugin's network when one loads, else IB when it has a usable
 * port, else Socket. OFI is used only when asked for.
 */
ncclResult_t net_backend_select(const struct braid_net_ops** out, int* ndev);

/*
 * The topology's name for a backend device: the name up to its first space ("eth0 (tcp)"); for
 * IB (`ib`) without the ":1" of a port 1 ("mlx5_0:1" is "mlx5_0" there, "mlx5_0:2" stays),
 * for the others up to a colon (an interface alias "eth0:2" is "eth0").
 */
void net_topo_name(const char* props_name, int ib, char* out, size_t size);

/* A stub for an ops slot a backend does not implement: fails with ncclInternalError. */
ncclResult_t net_unsupported(const char* backend, const char* what);

/*
 * For a connect that failed with `err`: 1 when the peer's listener has refused connections
 * for NET_REFUSED_GRACE_S in a row (*since: when that began, 0 when not refusing). The
 * listener exists before its handle is sent, so a lasting refusal means it is gone (its
 * process exited or closed it): the connect should fail now, not after the whole timeout.
 */
#define NET_REFUSED_GRACE_S 5.0
int net_refused_too_long(double* since, int err);

/*
 * A backend's TCP connect to a peer's listener that never blocks the proxy thread (it serves
 * every other connection meanwhile): each call moves it on. A refused or failed attempt is
 * tried again after a pause (1 ms, doubling up to 100 ms); one unanswered for
 * NET_CONNECT_ATTEMPT_S starts over.
 */
#define NET_CONNECT_ATTEMPT_S 2.0
struct net_connect_try {
  int fd;               /* the attempt in progress, or -1 */
  double since;         /* when it began */
  double next_try;      /* no new attempt before this */
  double pause;         /* the next pause after a failed attempt */
  double refused_since; /* when the listener began refusing (0: it is not) */
};
void net_connect_try_init(struct net_connect_try* t);
/*
 * *fd: the connected socket (now the caller's), or -1 while not yet: call again. Fails when
 * the listener has refused for NET_REFUSED_GRACE_S, or on an error another try cannot mend;
 * `backend` and `peer` name them in the message.
 */
ncclResult_t net_connect_try_step(struct net_connect_try* t, const union braid_sockaddr* addr,
                                  const char* backend, const char* peer, int* fd);
/* Closes an attempt in progress. */
void net_connect_try_close(struct net_connect_try* t);

#endif
