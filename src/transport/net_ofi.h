/*
 * What the OFI backend (net_ofi.c) shows beyond its ops table: the fabric
 * address of a comm, for tests that play a stranger who learnt it.
 */
#ifndef BRAID_TRANSPORT_NET_OFI_H
#define BRAID_TRANSPORT_NET_OFI_H

#include <stddef.h>

/*
 * Copies the endpoint name of an OFI send or receive comm (the address its
 * peer sends to) into `name`; returns its length, 0 when it does not fit in
 * `size` bytes or the backend was not built.
 */
size_t net_ofi_comm_name(void* comm, void* name, size_t size);

#endif
