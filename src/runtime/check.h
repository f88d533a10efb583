/*
 * BRAID_CHECK=1: the ranks of a communicator compare the collectives of each
 * group before launching them (check.c).
 */
#ifndef BRAID_CORE_CHECK_H
#define BRAID_CORE_CHECK_H

#include "nccl.h"

struct ncclComm;

/* Whether BRAID_CHECK asks for the comparison. */
int check_enabled(void);
/*
 * Compares the pending collectives of every communicator in `comms` (the
 * group's list) with every other rank's; ncclInvalidUsage naming the first
 * difference, on every rank that sees one. Collective: waits for the other
 * ranks to reach their group end, until BRAID_TIMEOUT (BRAID_BOOTSTRAP_TIMEOUT
 * when it is 0); ranks missing then fail the comm with ncclRemoteError naming
 * them. An abort or the comm's asynchronous failure ends the wait at once.
 */
ncclResult_t check_group(struct ncclComm* comms);

#endif
