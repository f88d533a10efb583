/*
 * Buffer registration (ncclCommRegister); memory windows are window.h's.
 *
 * A registration records a device buffer with its communicator and hands
 * back a handle that ncclCommDeregister checks. No algorithm reads user
 * buffers in place yet, so a registered buffer moves through the same
 * FIFOs as any other; NCCL does the same where its zero-copy paths do not
 * apply.
 */
#ifndef BRAID_CORE_REGISTER_H
#define BRAID_CORE_REGISTER_H

struct ncclComm;

/* Frees every registration left on `comm` (at destroy; NCCL releases them there too). */
void register_free_all(struct ncclComm* comm);

#endif
