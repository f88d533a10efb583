/*
 * Transports: how one end of a connection (channel c, peer p, send or
 * receive) gets the memory the kernels use. A transport is an ops table; the
 * network transport of a later layer plugs in with the same table.
 *
 * Connecting is two-sided and the same for every transport:
 *   1. each end runs its setup (send_setup / recv_setup), which allocates
 *      what it owns and writes a braid_conn_info for the other end;
 *   2. the ends swap their infos through the bootstrap;
 *   3. each end runs its connect (send_connect / recv_connect) with the
 *      peer's info and fills the braid_dev_conn the kernels read.
 * Ownership rule (see dev_comm.h): the FIFO's memory belongs to the
 * receiver; the sender only maps it. So p2p and shm do their allocation in
 * recv_setup and their mapping in send_connect.
 *
 * The runtime's channels module (runtime/channels.c) owns every connector
 * and runs the exchange; a transport owns what it hangs on
 * `connector->state` and releases it in its free slot. A transport sees the
 * communicator only through struct braid_transport_comm, which the runtime
 * fills once the peers and the topology are known.
 */
#ifndef BRAID_TRANSPORT_TRANSPORT_H
#define BRAID_TRANSPORT_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "abi/dev_comm.h"
#include "base/param.h"
#include "nccl.h"

struct bootstrap;
struct braid_topo;
struct braid_proxy_events;

#define BRAID_MAX_VISIBLE_GPUS 16

/* What each rank tells every other at init (exchanged by bootstrap_allgather). */
struct braid_peer_info {
  int rank;
  int cuda_dev;
  int64_t bus_id;        /* PCI domain:bus:device.function of the GPU in the topology */
  int64_t dev_bus_id;    /* ... of the device itself (differs only under BRAID_TOPO_BUSID) */
  uint64_t host_hash;    /* same host <=> same value (BRAID_HOSTID overrides) */
  uint64_t pid_hash;     /* same process <=> same value (braid_pid_hash: pid namespaces too) */
  int pid;
  uint64_t start_time;   /* when the process started (braid_process_start), 0: unknown */
  int cuda_arch;         /* major*100 + minor*10, e.g. 900 */
  uint64_t shm_dev;      /* st_dev of /dev/shm: equal means shared memory is shared */
  uint64_t pid_ns;       /* inode of /proc/self/ns/pid: equal means pids compare */
  uint8_t gpu_uuid[16];
  char hostname[64];
  /* Sharing device memory with other processes of the host (transport/ipc.h). */
  uint64_t ipc_service;  /* id of this process's descriptor service; 0: none */
  int ipc_cumem;         /* 1: cuMem allocations can be exported and imported here */
  int ipc_pidfd;         /* 1: descriptors can be taken with pidfd_getfd (ipc_pidfd_usable) */
  int ipc_fabric;        /* 0: no fabric handles; 1: they work here; 2: and BRAID_IPC_FABRIC=1 */
  uint32_t uid;
  uint64_t net_ns;       /* inode of /proc/self/ns/net: equal means Unix sockets meet */
  int nvisible;          /* GPUs this process sees (bus ids of the first BRAID_MAX_VISIBLE_GPUS) */
  int64_t visible_bus[BRAID_MAX_VISIBLE_GPUS];
  int64_t agreed[BRAID_PARAMS_AGREED]; /* braid_params_agreed's values on this rank */
};

/*
 * What a transport sees of the communicator it connects, filled by the runtime
 * (comm.c) before the first connection and unchanged afterwards. Everything
 * it points to lives as long as the communicator.
 */
struct braid_transport_comm {
  int rank;
  int nranks;
  int cuda_dev;
  const struct braid_peer_info* peers; /* [nranks] */
  struct bootstrap* bootstrap;         /* the job's secret keys the network connections */
  const struct braid_topo* topo;       /* the NICs near this GPU, and the paths to them */
  volatile uint32_t* abort_flag;       /* raised when the communicator stops */
  /*
   * Fails the communicator from another thread (a proxy found its connection broken): its
   * async error becomes `res`, the calling thread's last error the reason, and its kernels
   * stop waiting. Called with `owner`.
   */
  void (*fail)(void* owner, ncclResult_t res);
  void* owner;
  /* The comm's profiler sink for the network proxy's events, or NULL (proxy_events.h). */
  const struct braid_proxy_events* proxy_events;
  void* proxy_events_ctx;
};

/* What one end tells the other, opaque to everyone but the transport. */
#define BRAID_CONN_INFO_BYTES 256
struct braid_conn_info {
  char data[BRAID_CONN_INFO_BYTES];
};

/* One end of a connection, host side. */
struct braid_connector {
  const struct braid_transport_ops* transport; /* NULL until set up */
  void* state;                                 /* the transport's, freed by its free slot */
  struct braid_dev_conn dev;                   /* what the kernels get (filled by connect) */
  int peer;
  int channel;
  int is_send;
  size_t buff_bytes;                           /* FIFO size requested (all BRAID_STEPS slots) */
  /* Connecting (transport.c): 0 to do, 1 info sent, 2 answer read, 3 connected. */
  int phase;
  int setup_tag;                       /* the bootstrap tag of the info this end sent */
  const struct braid_connector* offer; /* phases 1-2: the parent's end it offered to borrow */
  struct conn_msg* answer;             /* phase 2: the peer's message */
  int borrowed;                        /* `dev` is a parent's connection (runtime/share.h):
                                          nothing here to free */
  uint64_t* step_home;                 /* borrowed: where its step lives, the first lender's
                                          step word (device memory; dev_comm.h) */
  int lendable;                        /* (atomic) the kernels have it: a child may borrow */
  /*
   * Set by a teardown whose kernels did not exit: the free slot then keeps (leaks) every byte
   * the kernels may still touch, calls nothing that waits for the device, adds the bytes kept
   * here, and still stops its threads and closes its descriptors.
   */
  size_t* kept;
};

struct braid_transport_ops {
  size_t size;      /* sizeof(struct braid_transport_ops): tables only grow by appending */
  const char* name; /* "P2P", "SHM", "NET" */
  /* Sets *ok when this transport can connect `me` and `peer` (both ends must agree). */
  ncclResult_t (*can_connect)(const struct braid_transport_comm* comm, const struct braid_peer_info* me,
                              const struct braid_peer_info* peer, int* ok);
  /* Sender side: prepare; write what the receiver needs into *info. */
  ncclResult_t (*send_setup)(const struct braid_transport_comm* comm, struct braid_connector* conn,
                             struct braid_conn_info* info);
  /* Receiver side: allocate the FIFO; write what the sender needs to map it into *info. */
  ncclResult_t (*recv_setup)(const struct braid_transport_comm* comm, struct braid_connector* conn,
                             struct braid_conn_info* info);
  /* Sender side: map the receiver's FIFO from its info; fill conn->dev. */
  ncclResult_t (*send_connect)(const struct braid_transport_comm* comm, struct braid_connector* conn,
                               const struct braid_conn_info* peer_info);
  /* Receiver side: finish with the sender's info; fill conn->dev. */
  ncclResult_t (*recv_connect)(const struct braid_transport_comm* comm, struct braid_connector* conn,
                               const struct braid_conn_info* peer_info);
  /* Releases conn->state and everything the end allocated or mapped; safe after a failed setup. */
  ncclResult_t (*free)(struct braid_connector* conn);
};

/*
 * The FIFO layout of the transports whose receiver owns plain memory (p2p,
 * shm): the tail and head counters on their own 128-byte lines, the Simple
 * slots, the LL slots, then (p2p only: `ll128`) the LL128 slots. All of it
 * must start zeroed (flags of 0 never match a step's flag). LL128 lines must
 * not straddle 128-byte boundaries: the allocation is 256-byte aligned and
 * every offset before them is a multiple of 128 (buff_bytes is rounded to
 * BRAID_STEPS * 128 bytes).
 */
#define BRAID_FIFO_TAIL_OFFSET 0
#define BRAID_FIFO_HEAD_OFFSET 128
#define BRAID_FIFO_BUFF_OFFSET 256
/* Bytes of one LL128 slot (BRAID_LL128_BUFFSIZE / BRAID_STEPS, whole lines, 4 KiB to 4 MiB). */
size_t transport_ll128_slot_bytes(void);
static inline size_t transport_fifo_bytes(const struct braid_connector* conn, int ll128) {
  return BRAID_FIFO_BUFF_OFFSET + conn->buff_bytes + BRAID_LL_BYTES +
         (ll128 ? BRAID_STEPS * transport_ll128_slot_bytes() : 0);
}
/* Fills conn->dev for a FIFO of the layout above at `base` (an address the kernels can use). */
void transport_fifo_fill_dev(struct braid_connector* conn, char* base, int ll128);

extern const struct braid_transport_ops braid_transport_p2p;
extern const struct braid_transport_ops braid_transport_shm;
extern const struct braid_transport_ops braid_transport_net; /* between hosts (net.c) */

/* The transport that connects this rank and `peer`, in order of preference (P2P, SHM, NET). */
ncclResult_t transport_select(const struct braid_transport_comm* comm, int peer,
                              const struct braid_transport_ops** out);
/*
 * Whether ranks a and b are close enough for P2P (same host, NCCL_P2P_LEVEL, P2P not
 * disabled), from what every rank knows alike (the peers' info, the topology): the same
 * answer on every rank, for any pair. Whether they can share memory is ipc_choose's part.
 */
int p2p_pair_close(const struct braid_transport_comm* comm, int a, int b);
/* FIFO bytes (all BRAID_STEPS slots) for a parameter's size: at least 4 KiB a slot, whole lines. */
size_t transport_buff_bytes(braid_param_id_t id);
/* Bytes per slot of every send/recv connection (BRAID_P2P_BUFFSIZE / BRAID_STEPS). */
uint32_t transport_p2p_slot_bytes(void);

#endif
