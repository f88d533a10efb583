/*
 * The op ledger and the hang verdict.
 *
 * Every communicator numbers its operations (#1, #2, ... in issue order,
 * the same on every rank when the program is right) and remembers the last
 * BRAID_LEDGER_OPS of them. Each block of a launch reports the last
 * operation the launch completes to its own word of device memory, which the
 * watchdog copies out while launches are pending, so the ledger knows which
 * operations are complete at no cost to the launch. A watchdog per
 * communicator:
 *   - answers the other ranks' ledger requests on a small TCP listener of its
 *     own (authenticated with the job's secret), so a rank that waits can ask
 *     a rank that does not;
 *   - when nothing completes for BRAID_TIMEOUT seconds while a launch is
 *     pending (default 600; 0 = never, and completions are not tracked), or
 *     when the process gets SIGUSR1
 *     (unless the program installed its own handler),
 *     asks every other rank for its ledger and prints one verdict line, e.g.
 *       rank 0 waits in AllReduce #12 (channel 1, step 40) for rank 1, whose
 *       last op is AllReduce #11
 *     On a timeout (not on SIGUSR1, which only reports) the communicator's
 *     async error becomes ncclRemoteError with that text in ncclGetLastError,
 *     and its abort flag is raised so the stuck kernels leave.
 *   - before that, after BRAID_HANG_WARN seconds (default 60, 0 = off), prints
 *     the verdict once per stall as a warning (past 64 ranks: only where this
 *     rank waits, without asking the others) and asks the network proxies for
 *     their step reports; nothing fails.
 *   - notices a peer process of the same host that is gone (its pid) and
 *     fails the communicator the same way within a second.
 */
#ifndef BRAID_CORE_WATCHDOG_H
#define BRAID_CORE_WATCHDOG_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include "nccl.h"

struct ncclComm;
struct braid_op;

#define BRAID_LEDGER_OPS 256
#define BRAID_LEDGER_MAGIC 0x4257444cu /* "BWDL": a summary that came back (0: no answer) */

/* One operation as the ledger keeps it (also its wire form). */
struct braid_ledger_op {
  uint64_t seq; /* 0: none */
  int32_t coll; /* braid_coll_t */
  int32_t dtype;
  int32_t root; /* rooted collectives; send/recv: 1 send, 0 receive */
  int32_t peer; /* send/recv: the other rank; else -1 */
  uint64_t count;
};

/* What a rank tells another about itself (wire form, fixed size). */
struct braid_ledger_summary {
  uint32_t magic;
  int32_t rank;
  int32_t pid;
  int32_t chan;         /* the busiest ring channel while an op is pending, or -1 */
  uint64_t issued;      /* operations issued */
  uint64_t completed;   /* all operations up to this one are complete */
  uint64_t chan_recv;   /* that channel: steps received from the previous rank */
  uint64_t chan_sent;   /* that channel: steps the next rank has drained */
  double waiting_s;     /* how long the oldest pending launch has waited (0: none pending) */
  struct braid_ledger_op stuck; /* the oldest operation not known complete (seq 0: none) */
  struct braid_ledger_op last;  /* the last one issued */
  char host[64];
};

/* Starts the ledger and the watchdog (collective: exchanges listener addresses). */
ncclResult_t watchdog_start(struct ncclComm* comm);
/* Stops the thread and frees the ledger; safe on a comm that never started one. */
void watchdog_stop(struct ncclComm* comm);
/* Numbers `op` (the next sequence number) and remembers it. */
void watchdog_issue(struct ncclComm* comm, const struct braid_op* op);
/* How many operations were numbered so far (the next one is this + 1); 0 without a watchdog. */
uint64_t watchdog_issued(struct ncclComm* comm);
/*
 * For the launch of `grid` blocks that completes the operations issued so
 * far: the sequence number its blocks report when done (kernel args'
 * ledger_seq), or 0 when it is captured into a graph (whose replays the
 * ledger does not follow).
 */
uint64_t watchdog_launch_seq(struct ncclComm* comm, int captured, int grid);
/*
 * A launch being captured into a graph, holding the operations issued since the last launch:
 * its id for the kernel arguments (graph_op), which the kernels write as they replay it, so a
 * replay that stops moving gets a verdict of its own. 0 without a watchdog.
 */
uint32_t watchdog_capture_register(struct ncclComm* comm);
/* No verdict from now on (a comm retired while another thread still uses it). */
void watchdog_silence(struct ncclComm* comm);
/* Launches that will never report (stopped by revoke or shrink-abort, or never started). */
void watchdog_forget_pending(struct ncclComm* comm);
/* The operations issued so far needed no launch (all empty). */
void watchdog_nothing_launched(struct ncclComm* comm);

/*
 * The verdict from every rank's summary (`all`, indexed by rank; a rank that
 * did not answer has magic 0): one line into `out`. Pure, for unit tests.
 */
void watchdog_verdict(const struct braid_ledger_summary* all, int nranks, int me, char* out,
                      size_t len);
/* "AllReduce float count=1024" (root/peer where they apply). */
void watchdog_op_describe(const struct braid_ledger_op* op, char* out, size_t len);

#endif
