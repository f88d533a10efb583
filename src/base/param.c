/*
 * The one table of Braid's parameters. Every environment variable the
 * library reads is a row here: its name (read as BRAID_<name>), the NCCL name
 * accepted as an alias so existing job scripts keep working, its type, its
 * default and one line of help. `braid-info --env` prints this table.
 *
 * BRAID_<name> wins over the alias when both are set. Values are parsed once,
 * on first use; a malformed integer falls back to the default and is reported
 * by the logger as soon as it starts (param loading itself must not log: the
 * logger reads its own level from this table).
 */
#include "base/param.h"

#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct param_row {
  const char* name;  /* without the BRAID_ prefix */
  const char* alias; /* full NCCL name, or NULL */
  braid_param_type_t type;
  const char* def;   /* default as text; NULL for "unset" */
  const char* help;
};

#define ROW(id, alias, type, def, help) [BRAID_P_##id] = {#id, alias, BRAID_PARAM_##type, def, help}

static const struct param_row rows[BRAID_P_COUNT] = {
  ROW(DEBUG, "NCCL_DEBUG", STRING, "WARN",
      "Log level: NONE, VERSION, WARN, INFO or TRACE (TRACE only in debug builds)."),
  ROW(DEBUG_SUBSYS, "NCCL_DEBUG_SUBSYS", STRING, "INIT,BOOTSTRAP,ENV",
      "Subsystems logged at INFO/TRACE: comma list of INIT, COLL, P2P, SHM, NET, GRAPH, TUNING, "
      "ENV, ALLOC, CALL, PROXY, BOOTSTRAP, REG or ALL; a leading ^ excludes the list."),
  ROW(DEBUG_FILE, "NCCL_DEBUG_FILE", STRING, NULL,
      "Write the log to this file instead of stdout; %h is replaced by the host name, %p by the pid."),
  ROW(SOCKET_IFNAME, "NCCL_SOCKET_IFNAME", STRING, NULL,
      "Network interfaces for bootstrap and sockets: prefixes (eth,ib), ^ to exclude, = for exact "
      "names. Default: any interface but loopback and docker/virtual bridges, loopback if nothing else."),
  ROW(SOCKET_FAMILY, "NCCL_SOCKET_FAMILY", STRING, NULL,
      "Restrict interface addresses to AF_INET or AF_INET6."),
  ROW(SOCKET_KEEPALIVE_SEC, NULL, INT, "20",
      "Seconds after which a bootstrap connection whose peer host stopped answering (host down, "
      "network cut) fails, so that waits on that peer end with an error naming it: TCP keepalive "
      "probes after half of it idle, and a limit on unacknowledged data (TCP_USER_TIMEOUT). A live "
      "peer's kernel answers even when its process is busy or stopped. 0: off (wait as long as TCP "
      "does, many minutes)."),
  ROW(COMM_ID, "NCCL_COMM_ID", STRING, NULL,
      "host:port of a rendezvous the launcher provides; rank 0 listens there and no unique id "
      "needs to be broadcast by the application."),
  ROW(COMM_SECRET, NULL, STRING, NULL,
      "With BRAID_COMM_ID/NCCL_COMM_ID: a secret text that every rank of the job sets to the same "
      "value (say, a random string the launcher makes), mixed into the key a process must present "
      "to join. Unset, the key derives from host:port alone, which anyone who can reach the port can "
      "compute. Never printed."),
  ROW(BOOTSTRAP_TIMEOUT, NULL, INT, "120",
      "Seconds a rank waits for the others at bootstrap before failing with the list of missing ranks."),
  ROW(HOSTID, "NCCL_HOSTID", STRING, NULL,
      "Override the host identity, so processes of one machine can pose as separate hosts."),
  ROW(TIMEOUT, NULL, INT, "600",
      "Seconds without progress before a hang verdict is printed and the communicator fails (0 = off)."),
  ROW(HANG_WARN, NULL, INT, "60",
      "Seconds without progress before the hang verdict is printed as a warning, with the network "
      "proxies' step reports, once per stall; the communicator keeps waiting (0 = off)."),
  ROW(CHECK, NULL, INT, "0",
      "1: verify across ranks that each collective's op, type, count and root agree."),
  ROW(ALGO, "NCCL_ALGO", STRING, NULL,
      "Force the algorithm (Ring, Tree, Direct; per collective as allreduce:tree); a list "
      "after ^ only removes from the model's choice; default: chosen by the tuning model."),
  ROW(PROTO, "NCCL_PROTO", STRING, NULL,
      "Force the protocol (Simple, LL, LL128); a list after ^ only removes from the model's "
      "choice (LL128 stays off unless named); default: chosen by the tuning model."),
  ROW(TUNER_PLUGIN, "NCCL_TUNER_PLUGIN", STRING, NULL,
      "NCCL tuner plugin: a name (libnccl-tuner-<name>.so), a library file or path, or none. "
      "Unset: libnccl-tuner.so where the loader finds it, else a tuner in the loaded net plugin's "
      "library. It may edit the tuning model's cost "
      "table per collective (ncclTunerPlugin_v5 to _v2); BRAID_ALGO/BRAID_PROTO still win."),
  ROW(PROFILER_PLUGIN, "NCCL_PROFILER_PLUGIN", STRING, NULL,
      "NCCL profiler plugin: a name (libnccl-profiler-<name>.so), a library file or path, or "
      "none. Unset: libnccl-profiler.so where the loader finds it, else a profiler in the loaded "
      "net plugin's library. It gets group, collective, point-to-point and network proxy events "
      "(ncclProfiler_v5 to _v1); its failures never fail a call."),
  ROW(PROFILE_EVENT_MASK, "NCCL_PROFILE_EVENT_MASK", INT, "0",
      "The event mask a profiler plugin's init starts from (bits of ncclProfileGroup, "
      "ncclProfileColl, ...); the plugin may change it, and NCCL's example plugin sets it from "
      "this same variable. Braid emits only the events whose bit is set after init."),
  ROW(P2P_DISABLE, "NCCL_P2P_DISABLE", INT, "0",
      "1: never use GPU peer-to-peer (NVLink/PCIe) between GPUs; fall back to shared memory."),
  ROW(P2P_READ, "NCCL_P2P_READ_ENABLE", INT, "-1",
      "Accepted so job scripts keep working; changes nothing: Braid's P2P transport always has "
      "the sender write into the receiver's buffer (push)."),
  ROW(P2P_LEVEL, "NCCL_P2P_LEVEL", STRING, NULL,
      "Farthest path between two GPUs of a host over which they talk peer to peer: LOC, NVL, NVB, "
      "PIX, PXB, PHB or SYS (or 0-4: LOC, PIX, PXB, PHB, SYS). Default: NVLink always, PCIe up to "
      "PXB (switches below one host bridge). Farther pairs go through host memory."),
  ROW(CUMEM_ENABLE, "NCCL_CUMEM_ENABLE", INT, "1",
      "1: GPU buffers shared between processes (P2P FIFOs, copy-engine scratch) and ncclMemAlloc "
      "come from cuMem, exported as file descriptors passed over a Unix socket, so P2P works when "
      "each process sees only its own GPU. 0: cudaMalloc and legacy CUDA IPC (needs every GPU "
      "visible in every process)."),
  ROW(IPC_FD_PASSING, NULL, STRING, "auto",
      "How a process gets the file descriptor of a peer process's cuMem memory: auto (from the "
      "peer's descriptor service over a Unix socket; where that socket cannot be reached, as from "
      "another network namespace, with pidfd_getfd when the kernel allows it), socket (the service "
      "only) or pidfd (pidfd_getfd only). Pairs that can use neither go through fabric handles, "
      "legacy CUDA IPC or host memory."),
  ROW(IPC_FABRIC, NULL, INT, "0",
      "cuMem fabric handles (where the driver offers them: an IMEX channel), which need no "
      "descriptor passing. 0: only for pairs of processes that cannot pass descriptors (different "
      "users or namespaces); 1: for every pair of processes where both ends can; -1: never."),
  ROW(SHM_DISABLE, "NCCL_SHM_DISABLE", INT, "0",
      "1: never use host shared memory between GPUs of one host."),
  ROW(NET, "NCCL_NET", STRING, NULL,
      "Network backend between hosts: Socket, IB, OFI, or the loaded net plugin (its network's "
      "name, or Plugin); default: the net plugin when one loads, else IB when a port is usable, "
      "else Socket."),
  ROW(NET_PLUGIN, "NCCL_NET_PLUGIN", STRING, NULL,
      "NCCL net plugin to load (ncclNetPlugin_v11 to _v6): a name (libnccl-net-<name>.so), a "
      "library file or path, a comma list tried in order, or none. Unset: libnccl-net.so where "
      "the loader finds it. A plugin that loads is the default network; one that cannot be used "
      "is reported (WARN), and the list's next entry, else Braid's own backends, used."),
  ROW(IB_HCA, "NCCL_IB_HCA", STRING, NULL,
      "InfiniBand/RoCE devices to use: prefixes, ^ to exclude, = for exact, :port to pick a port."),
  ROW(IB_GID_INDEX, "NCCL_IB_GID_INDEX", INT, "-1",
      "RoCE GID index to use; -1: choose (RoCEv2 with an IPv4 address first, then RoCEv2, then any)."),
  ROW(IB_VERBS_LIB, NULL, STRING, NULL,
      "For testing only: the verbs library the IB backend loads instead of libibverbs.so.1, such "
      "as the test provider the tests build (tests/ibfake), which moves data between processes "
      "over Unix sockets. Unset (always, outside tests): libibverbs.so.1."),
  ROW(IB_DISABLE, "NCCL_IB_DISABLE", INT, "0",
      "1: never use the IB backend (InfiniBand/RoCE verbs); the default network is then the next "
      "one (Socket), and the log says why."),
  ROW(IB_TIMEOUT, "NCCL_IB_TIMEOUT", INT, "20",
      "IB queue pairs' local ACK timeout: 4.096 us x 2^value a try (20: 4.3 s), 1 to 31; a peer "
      "silent for retry count + 1 tries fails the transfer."),
  ROW(IB_RETRY_CNT, "NCCL_IB_RETRY_CNT", INT, "7",
      "IB queue pairs' transport retry count: resends after a timeout before a transfer fails (0 to 7)."),
  ROW(IB_TC, "NCCL_IB_TC", INT, "0",
      "IB: traffic class in the GRH of every queue pair (RoCE: the DSCP and ECN bits the switches "
      "classify by, 0 to 255). The sender's value is used on both ends of a connection."),
  ROW(IB_SL, "NCCL_IB_SL", INT, "0",
      "IB: service level of every queue pair's address vector (InfiniBand: picks the virtual lane; "
      "0 to 15). The sender's value is used on both ends of a connection."),
  ROW(IB_QPS_PER_CONNECTION, "NCCL_IB_QPS_PER_CONNECTION", INT, "1",
      "IB: queue pairs per connection (1 to 16); each message is split in equal pieces, one per "
      "queue pair. Both ends must use the same value: a mismatch fails the connection."),
  ROW(IB_ADAPTIVE_ROUTING, "NCCL_IB_ADAPTIVE_ROUTING", INT, "-2",
      "IB: 1: messages above BRAID_IB_AR_THRESHOLD go as an RDMA write followed by a separate "
      "zero-byte write with immediate (safe when the fabric reorders packets); 0: one write with "
      "immediate; -2: 1 on InfiniBand ports, 0 on RoCE."),
  ROW(IB_AR_THRESHOLD, "NCCL_IB_AR_THRESHOLD", INT, "8192",
      "IB with adaptive routing on: messages larger than this many bytes use the separate write "
      "with immediate."),
  ROW(IB_PCI_RELAXED_ORDERING, "NCCL_IB_PCI_RELAXED_ORDERING", INT, "2",
      "IB: register data buffers with IBV_ACCESS_RELAXED_ORDERING (PCIe relaxed ordering for the "
      "NIC's writes). 2: when the verbs library has ibv_reg_mr_iova2 (rdma-core 1.8 API); 1: the "
      "same, with a warning when it has not; 0: never."),
  ROW(CROSS_NIC, "NCCL_CROSS_NIC", INT, "2",
      "Multi-host rings: 0: ring k uses the same NIC (rail) on every host, NIC k mod the host's "
      "NIC count, and a ring that cannot is not built; 1 or 2: that NIC first, another where it "
      "cannot carry the ring (1 and 2 differ in NCCL's search, not in Braid's)."),
  ROW(NET_GDR_LEVEL, "NCCL_NET_GDR_LEVEL", STRING, "PIX",
      "Farthest GPU-NIC path where GPUDirect RDMA is used: LOC, PIX (same PCIe switch), PXB, PHB "
      "(same CPU) or SYS; farther pairs stage through host memory."),
  ROW(SOCKET_NTHREADS, "NCCL_SOCKET_NTHREADS", INT, "2",
      "Socket backend: helper threads per connection (1-16); each owns BRAID_NSOCKS_PERTHREAD streams."),
  ROW(NSOCKS_PERTHREAD, "NCCL_NSOCKS_PERTHREAD", INT, "2",
      "Socket backend: TCP streams per helper thread; large messages are split across all streams."),
  ROW(NET_PAIR_MAX, NULL, INT, "-1",
      "All-reduce of two ranks across the network: largest size in bytes sent as a one-hop exchange "
      "(each rank sends all, reduces the peer's); larger ones take the ring. -1 (default): every "
      "size; 0: always the ring."),
  ROW(P2P_PAIR_MIN, NULL, INT, "0",
      "All-reduce and all-gather of two ranks within a host (NVLink, PCIe or shared memory) "
      "with Simple: smallest size in bytes (as nccl-tests counts it) that runs as the one-hop "
      "exchange, its send and receive halves on their own threads, instead of the ring; 0 "
      "(default): every size that runs Simple (on 2x H100 within 3% of the ring at 8-32 MB, "
      "4-19% faster elsewhere); -1: never. The same on every rank."),
  ROW(P2P_PAIR_MAX, NULL, INT, "-1",
      "The largest size in bytes of BRAID_P2P_PAIR_MIN's exchange; -1 (default): no bound; 0: "
      "never."),
  ROW(SYM_MAX_BYTES, NULL, INT, "131072",
      "All-reduce and reduce-scatter whose input lies in a symmetric window "
      "(ncclCommWindowRegister with NCCL_WIN_COLL_SYMMETRIC) while every rank is in one LSA "
      "team: largest input in bytes (as nccl-tests counts it) reduced through the windows, "
      "each rank pushing its input into every peer's as LL lines (no FIFO, no connection); "
      "0: never. Default 131072 (2 and 4 H200s: with it, faster than NCCL's symmetric "
      "kernels at every size to 1 MB, and than Braid's ordinary paths to 128 KB; "
      "docs/tuning.md). The same on every rank."),
  ROW(SYM_PULL, NULL, INT, "0",
      "1: symmetric-window operations up to BRAID_SYM_MAX_BYTES that the LL variant cannot "
      "hold (more than 4 KB an output block, or than 32 blocks or the comm's channels) read "
      "every rank's window between meetings instead; 0 (default): they take Braid's ordinary "
      "paths, which measured faster (docs/tuning.md). The same on every rank."),
  ROW(ONESHOT_MAX_BYTES, NULL, INT, "262144",
      "All-reduce and reduce-scatter of buffers in no window, on communicators of 3 or more "
      "ranks that are one LSA team (one host, P2P between every pair, cuMem): largest input "
      "in bytes run one-shot, each rank pushing its input into every peer's sync window as LL "
      "lines (the symmetric LL variant; the window is made at init, 2 MB a rank at 4 ranks; "
      "an all-reduce also needs its output to fit the variant's blocks, 128 KiB). 0: never. "
      "The same on every rank."),
  ROW(LL128_PAIR_MAX, NULL, INT, "2097152",
      "All-reduce of two ranks with LL128: largest size in bytes sent as the one-hop exchange "
      "(on one shared H200 faster than the ring from 32 KB to 512 KB, even at 2 MB, slower "
      "from 8 MB); the same on every rank."),
  ROW(P2P_LL_MAX, NULL, INT, "524288",
      "Send/receive to another rank over P2P (NVLink, PCIe): largest message in bytes that may "
      "go with LL (the tuning model chooses up to it; BRAID_PROTO=LL forces it), spread over "
      "channels as BRAID_P2P_CHANNEL_BYTES says; larger ones go with Simple. Other transports: "
      "16 KiB. Every rank must use the same."),
  ROW(P2P_CHANNEL_BYTES, NULL, INT, "0",
      "Send/receive to another rank: one more channel (a block's half on each side) per this "
      "many bytes of a message, up to the channels the rings have; at least 1024. 0 (default): "
      "2048 over P2P (NVLink, PCIe; on 2x H100 send/recv at 32-128 KB 2-2.5 us faster than "
      "with 16384), 16384 over other transports. Every rank must use the same."),
  ROW(P2P_PEER_SPLIT, NULL, INT, "1",
      "Send/receive on three or more ranks: 1 (default) gives each ring distance (the peer "
      "rank + d a rank sends to, rank - d it receives from) its own share of the channels for "
      "messages that fit it (up to 64 KiB a channel), so an all-to-all's exchanges run side "
      "by side rather than one after another on the same blocks; larger messages keep every "
      "channel. 0: every message starts at channel 0. Every rank must use the same."),
  ROW(P2P_SELF_CHANNEL_BYTES, NULL, INT, "65536",
      "A rank's send to itself (all-to-all's own block, a self send/receive): one more block "
      "copying it per this many bytes, up to 16 blocks, beside the blocks that talk to peers; at "
      "least 4096 (on 2x H100 a two-rank all-to-all at 512 KB-2 MB ~1-1.4 us faster than with "
      "524288)."),
  ROW(CE_MIN_BYTES, NULL, INT, "0",
      "Two ranks joined by P2P: smallest all-reduce, reduce-scatter, all-gather or broadcast "
      "(in bytes, as nccl-tests counts its size), or send/receive (the larger message of a "
      "pair), whose data moves through the copy engines (copies into the peer's scratch) "
      "instead of the kernels; not under stream capture. 0 (default): by collective as "
      "measured (tune_table.c: all-reduce and reduce-scatter from 512 MB, all-gather and "
      "send/receive from 1 GB, broadcast never); -1: never. The same on every rank."),
  ROW(CE_SLOT_BYTES, NULL, INT, "67108864",
      "Copy-engine exchange: bytes per scratch slot (the largest chunk), 1 MB to 1 GB; the same "
      "on every rank."),
  ROW(CE_NSLOTS, NULL, INT, "4",
      "Copy-engine exchange: scratch slots per rank (chunks in flight), 2 to 16, rounded down "
      "to a power of two; the same on every rank."),
  ROW(CE_NBLOCKS, NULL, INT, "32",
      "Copy-engine exchange: blocks of the kernel that takes each arriving chunk (reduces or "
      "places it), 1 to the largest grid."),
  ROW(CE_TRACE, NULL, INT, "0",
      "Measurement only: 1 = time each copy-engine copy with events and, after each exchange "
      "(waiting for it: slower), log (INFO COLL) the copies' span and rate, their gaps, and the "
      "kernel's end."),
  ROW(CE_REG_MIN_BYTES, NULL, INT, "-1",
      "Two ranks joined by P2P whose buffers both ranks registered (ncclCommRegister, cuMem "
      "memory as ncclMemAlloc makes): smallest all-reduce, reduce-scatter, all-gather or "
      "send/receive (bytes as for BRAID_CE_MIN_BYTES) that the copy engines move straight into "
      "the peer's registered buffer, no scratch and no second copy; not under stream capture, "
      "not where the output overlaps the input. -1 (default): never, registered buffers go the "
      "usual way (measured no faster on 2x H200: docs/tuning.md, BRAID_CE_REG_MIN_BYTES). The "
      "same on every rank."),
  ROW(CE_FAN_MIN_BYTES, NULL, INT, "134217728",
      "Three to eight ranks that map each other's memory (one host, NVLink or PCIe P2P) and "
      "registered both buffers of an all-gather (ncclCommRegister, cuMem memory as ncclMemAlloc "
      "makes): smallest all-gather (its whole output, as nccl-tests counts it) whose parts the "
      "copy engines write straight into every peer's output, one peer after another; not under "
      "stream capture (docs/tuning.md, BRAID_CE_FAN_MIN_BYTES). -1: never. The same on every "
      "rank."),
  ROW(LOCAL_REGISTER, "NCCL_LOCAL_REGISTER", INT, "1",
      "1: buffers registered with ncclCommRegister are used in place where Braid can "
      "(BRAID_CE_REG_MIN_BYTES); 0: registrations are kept but every operation copies through "
      "the FIFOs. The same on every rank."),
  ROW(CE_FAIL_CONNECT, NULL, INT, "-1",
      "Testing: the rank (of a two-rank communicator) whose copy-engine setup fails after its "
      "peer's has begun, so that both leave the exchange off and run the kernels; -1: none."),
  ROW(OFI_PROVIDER, NULL, STRING, NULL,
      "OFI backend: libfabric provider, e.g. \"tcp;ofi_rxm\" or efa; default: libfabric's first "
      "reliable-datagram provider with tagged messages (libfabric's own FI_PROVIDER also filters)."),
  ROW(OFI_HMEM, NULL, INT, "1",
      "OFI backend: 1: where the provider offers FI_HMEM and registering GPU memory works at "
      "init, take CUDA device memory directly (GPUDirect RDMA, where BRAID_NET_GDR_LEVEL allows "
      "it); 0: never ask, and stage every message through host memory."),
  ROW(TOPO_FILE, "NCCL_TOPO_FILE", STRING, NULL,
      "Read the node topology from this XML file (NCCL's format) instead of detecting it."),
  ROW(TOPO_DUMP_FILE, "NCCL_TOPO_DUMP_FILE", STRING, NULL,
      "Write the detected node topology to this XML file."),
  ROW(TOPO_BUSID, NULL, STRING, NULL,
      "Testing: the PCI bus id this rank's GPU takes in the topology (one of BRAID_TOPO_FILE's "
      "GPUs), so ranks sharing one GPU pose as GPUs of their own; the device used is unchanged."),
  ROW(GRAPH_DUMP_FILE, "NCCL_GRAPH_DUMP_FILE", STRING, NULL,
      "Write the chosen rings and trees to this XML file."),
  ROW(MIN_NCHANNELS, "NCCL_MIN_NCHANNELS", INT, "0", "Lower bound on channels (CTAs) per collective; 0 = automatic."),
  ROW(MAX_NCHANNELS, "NCCL_MAX_NCHANNELS", INT, "0", "Upper bound on channels (CTAs) per collective; 0 = automatic."),
  ROW(NTHREADS, "NCCL_NTHREADS", INT, "0",
      "Threads per CTA, rounded up to a multiple of 64 and held to 64-512; 0 = automatic (512)."),
  ROW(SMALL_NTHREADS, NULL, INT, "64",
      "Threads per CTA of a launch whose every work is an LL ring collective of at most that "
      "many 8-byte lines a channel: fewer warps to start and to hold at each barrier. Rounded "
      "up to a multiple of 64; 0, or at least the CTA's threads: every launch takes the full "
      "CTA."),
  ROW(BUFFSIZE, "NCCL_BUFFSIZE", INT, "0",
      "Bytes of receive buffer per ring connection for collectives (split into 8 steps, a "
      "step being the ring's chunk); 0 = automatic: 8 MiB on comms of 3 or more ranks whose "
      "rings run over NVLink, 4 MiB otherwise."),
  ROW(P2P_BUFFSIZE, NULL, INT, "1048576",
      "Bytes of receive buffer per connection for send/recv (split into 8 steps)."),
  ROW(LL128_BUFFSIZE, "NCCL_LL128_BUFFSIZE", INT, "524288",
      "Bytes of LL128 lines per P2P connection (split into 8 steps of whole 128-byte lines, "
      "4 KiB to 4 MiB a step); every rank must use the same."),
  ROW(CHUNKSIZE, NULL, INT, "0", "Bytes per pipeline chunk of ring collectives; 0 = automatic."),
  ROW(SIMPLE_POST_WARP, NULL, INT, "2",
      "Simple protocol: 1 = on every connection a warp of each group only posts the steps (its "
      "release waits for the step's stores to land) while the others move the next step's "
      "data; 2 (default) = so on send/receive connections over P2P only (5-8% faster from "
      "32 MB, 5-10% slower at 2-8 MB); 0 = the group's first thread posts and every thread "
      "waits for it. A rank's own choice: its peers may differ."),
  ROW(NVLS_ENABLE, "NCCL_NVLS_ENABLE", INT, "0",
      "NVLink SHARP (multicast). Braid never uses it; accepted so job scripts keep working."),
  ROW(DETERMINISTIC, NULL, INT, "0",
      "1: bitwise-identical reductions for a given input whatever protocol, channel count or "
      "chunk size (3+ ranks: all-reduce runs as reduce + broadcast, on one ring)."),
  ROW(LAUNCH_MODE, "NCCL_LAUNCH_MODE", STRING, "PARALLEL",
      "Accepted so job scripts keep working; changes nothing: each communicator of a group "
      "launches on its own stream (NCCL's PARALLEL); BRAID_LAUNCH_THREADS says from which "
      "thread."),
  ROW(LAUNCH_THREADS, NULL, INT, "1",
      "1 (default; any value but 0): a group whose communicators are on several GPUs of this "
      "process (one thread driving them, as nccl-tests' -g or torch.nn.DataParallel) hands "
      "each GPU's launch but the first to a helper thread of that GPU, all at once, where one "
      "after another they cost a launch each (docs/tuning.md). Not for groups capturing a "
      "graph, on a default stream, with two communicators on one GPU, of more than 16 "
      "communicators, or with fewer CPUs allowed than communicators plus one. A helper spins "
      "0.2 ms after each launch, then sleeps. 0: every launch on the calling thread."),
  ROW(GRAPH_MIXING_SUPPORT, "NCCL_GRAPH_MIXING_SUPPORT", INT, "1",
      "1: a communicator's CUDA-graph replays are ordered with its eager calls and with its "
      "other graphs' replays, in the order the host launched them (an event wait before a "
      "capture's first kernel, a record after its last; such graphs cannot be device-launched "
      "or sit in a conditional or loop body); 0: only within a graph, and the caller keeps "
      "them apart."),
  ROW(MEM_SYNC_DOMAIN, "NCCL_MEM_SYNC_DOMAIN", INT, "1",
      "Hopper and later: the memory synchronization domain of Braid's kernels, 1 (default, as "
      "NCCL) = remote, so their system-scope fences wait only for their own stores, not for "
      "the traffic of the application's kernels beside them (nor these for Braid's); 0 = the "
      "default domain, that of every other kernel."),
  /* The communicator config's overrides (NCCL's envConfigOverride): set, they win over the
     ncclConfig_t field of every init and split; -1 (unset) leaves the field alone. */
  ROW(COMM_BLOCKING, "NCCL_COMM_BLOCKING", INT, "-1",
      "0 or 1: every communicator's ncclConfig_t.blocking, whatever the caller set."),
  ROW(CGA_CLUSTER_SIZE, "NCCL_CGA_CLUSTER_SIZE", INT, "-1",
      "0 to 8 (larger: 8): every communicator's ncclConfig_t.cgaClusterSize, the blocks of a "
      "kernel grouped in clusters spread over the GPU (Hopper on; unset: 4, as NCCL; 0 or 1: "
      "none)."),
  ROW(MIN_CTAS, "NCCL_MIN_CTAS", INT, "-1",
      "Above 0: every communicator's ncclConfig_t.minCTAs (capped at 64 and at maxCTAs)."),
  ROW(MAX_CTAS, "NCCL_MAX_CTAS", INT, "-1",
      "Above 0: every communicator's ncclConfig_t.maxCTAs (capped at 64)."),
  ROW(COMM_SPLIT_SHARE_RESOURCES, "NCCL_COMM_SPLIT_SHARE_RESOURCES", INT, "-1",
      "0 or 1: every communicator's ncclConfig_t.splitShare (1: a split child borrows the "
      "parent's P2P/SHM connections)."),
  ROW(COMM_SHRINK_SHARE_RESOURCES, "NCCL_COMM_SHRINK_SHARE_RESOURCES", INT, "-1",
      "0 or 1: every communicator's ncclConfig_t.shrinkShare (1: a shrunk child borrows the "
      "parent's P2P/SHM connections)."),
  ROW(CTA_POLICY, "NCCL_CTA_POLICY", INT, "-1",
      "0 to 2: every communicator's ncclConfig_t.CTAPolicy."),
  ROW(NVLS_NCHANNELS, "NCCL_NVLS_NCHANNELS", INT, "-1",
      "Above 0: every communicator's ncclConfig_t.nvlsCTAs (Braid never uses NVLS)."),
  ROW(NCHANNELS_PER_NET_PEER, "NCCL_NCHANNELS_PER_NET_PEER", INT, "-1",
      "1 to 64: every communicator's ncclConfig_t.nChannelsPerNetPeer."),
  ROW(NVLINK_UTIL_CENTRIC_SCHED_ENABLE, "NCCL_NVLINK_UTIL_CENTRIC_SCHED_ENABLE", INT, "-1",
      "0 or 1: every communicator's ncclConfig_t.nvlinkCentricSched."),
};

struct param_value {
  int64_t ival;
  char* sval;
  braid_param_source_t source;
  int malformed; /* the environment held an unparsable integer */
};

static struct param_value values[BRAID_P_COUNT];
static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;

/* Parses "123", "0x10", "-1", "4M", "2G", "64K". Returns 0 on success. */
static int param_parse_int(const char* text, int64_t* out) {
  char* end = NULL;
  errno = 0;
  long long v = strtoll(text, &end, 0);
  if (errno != 0 || end == text) return -1;
  while (isspace((unsigned char)*end)) end++;
  int64_t mult = 1;
  switch (toupper((unsigned char)*end)) {
    case 'K': mult = 1LL << 10; end++; break;
    case 'M': mult = 1LL << 20; end++; break;
    case 'G': mult = 1LL << 30; end++; break;
    default: break;
  }
  if (*end != '\0') return -1;
  *out = (int64_t)v * mult;
  return 0;
}

static void param_load_one(int id) {
  const struct param_row* row = &rows[id];
  struct param_value* val = &values[id];
  char braid_name[96];
  snprintf(braid_name, sizeof braid_name, "BRAID_%s", row->name);
  const char* text = getenv(braid_name);
  val->source = BRAID_PARAM_FROM_BRAID_ENV;
  if (text == NULL && row->alias != NULL) {
    text = getenv(row->alias);
    val->source = BRAID_PARAM_FROM_NCCL_ENV;
  }
  if (text == NULL) {
    text = row->def;
    val->source = BRAID_PARAM_FROM_DEFAULT;
  }
  free(val->sval);
  val->sval = text ? strdup(text) : NULL;
  val->malformed = 0;
  val->ival = 0;
  if (row->type == BRAID_PARAM_INT) {
    if (text && param_parse_int(text, &val->ival) != 0) {
      val->malformed = 1;
      val->source = BRAID_PARAM_FROM_DEFAULT;
      if (row->def) param_parse_int(row->def, &val->ival);
    }
  }
}

static void param_load_all(void) {
  pthread_mutex_lock(&load_lock);
  for (int i = 0; i < BRAID_P_COUNT; i++) param_load_one(i);
  pthread_mutex_unlock(&load_lock);
}

static void param_ensure_loaded(void) { pthread_once(&load_once, param_load_all); }

const braid_param_id_t braid_params_agreed[BRAID_PARAMS_AGREED] = {
    BRAID_P_P2P_PAIR_MIN,  BRAID_P_P2P_PAIR_MAX,      BRAID_P_LL128_PAIR_MAX,
    BRAID_P_P2P_LL_MAX,    BRAID_P_P2P_CHANNEL_BYTES, BRAID_P_CE_MIN_BYTES,
    BRAID_P_CE_SLOT_BYTES, BRAID_P_CE_NSLOTS,         BRAID_P_LL128_BUFFSIZE,
    BRAID_P_P2P_PEER_SPLIT, BRAID_P_SYM_MAX_BYTES,     BRAID_P_SYM_PULL,
    BRAID_P_ONESHOT_MAX_BYTES, BRAID_P_CE_REG_MIN_BYTES, BRAID_P_LOCAL_REGISTER,
    BRAID_P_CE_FAN_MIN_BYTES};

int64_t braid_param_int(braid_param_id_t id) {
  param_ensure_loaded();
  return values[id].ival;
}

const char* braid_param_str(braid_param_id_t id) {
  param_ensure_loaded();
  return values[id].sval;
}

braid_param_source_t braid_param_source(braid_param_id_t id) {
  param_ensure_loaded();
  return values[id].source;
}

void braid_param_reload(void) {
  param_ensure_loaded();
  param_load_all();
}

/* Reports each malformed value once through `report`; the logger calls this after it starts. */
void braid_param_report_malformed(void (*report)(const char* name, const char* text, const char* def)) {
  param_ensure_loaded();
  pthread_mutex_lock(&load_lock);
  for (int i = 0; i < BRAID_P_COUNT; i++) {
    if (!values[i].malformed) continue;
    values[i].malformed = 0;
    char name[96];
    snprintf(name, sizeof name, "BRAID_%s", rows[i].name);
    const char* text = getenv(name);
    if (text == NULL && rows[i].alias) {
      snprintf(name, sizeof name, "%s", rows[i].alias);
      text = getenv(name);
    }
    report(name, text ? text : "", rows[i].def ? rows[i].def : "(none)");
  }
  pthread_mutex_unlock(&load_lock);
}

int braid_param_count(void) { return BRAID_P_COUNT; }

static int param_index_ok(int index) { return index >= 0 && index < BRAID_P_COUNT; }

const char* braid_param_name(int index) {
  static __thread char name[96];
  if (!param_index_ok(index)) return NULL;
  snprintf(name, sizeof name, "BRAID_%s", rows[index].name);
  return name;
}

const char* braid_param_alias(int index) { return param_index_ok(index) ? rows[index].alias : NULL; }
const char* braid_param_help(int index) { return param_index_ok(index) ? rows[index].help : NULL; }
const char* braid_param_default(int index) { return param_index_ok(index) ? rows[index].def : NULL; }

const char* braid_param_var(braid_param_id_t id) {
  return braid_param_source(id) == BRAID_PARAM_FROM_NCCL_ENV ? rows[id].alias
                                                              : braid_param_name((int)id);
}
braid_param_type_t braid_param_type(int index) {
  return param_index_ok(index) ? rows[index].type : BRAID_PARAM_STRING;
}

static const char* param_source_text(int index) {
  switch (values[index].source) {
    case BRAID_PARAM_FROM_BRAID_ENV: return "environment (BRAID_)";
    case BRAID_PARAM_FROM_NCCL_ENV: return "environment (NCCL alias)";
    default: return "default";
  }
}

void braid_param_print_all(FILE* out) {
  param_ensure_loaded();
  for (int i = 0; i < BRAID_P_COUNT; i++) {
    const struct param_row* row = &rows[i];
    const char* value = values[i].sval ? values[i].sval : "(unset)";
    if (i == BRAID_P_COMM_SECRET && values[i].sval) value = "(set; not shown)"; /* a key */
    fprintf(out, "BRAID_%s=%s\n", row->name, value);
    fprintf(out, "    source: %s; type: %s; default: %s", param_source_text(i),
            row->type == BRAID_PARAM_INT ? "integer" : "string", row->def ? row->def : "(unset)");
    if (row->alias) fprintf(out, "; alias: %s", row->alias);
    fprintf(out, "\n    %s\n", row->help);
  }
}
