/*
 * Reduction operators: mapping the user's ncclRedOp_t (built in, or created
 * with ncclRedOpCreatePreMulSum) to what the device runs, and the table of a
 * communicator's created operators.
 */
#ifndef BRAID_CORE_REDOP_H
#define BRAID_CORE_REDOP_H

#include <stdint.h>

#include "abi/dev_comm.h"
#include "nccl.h"

struct ncclComm;

/*
 * The device operator, scalar and work flags for `op` on `dtype`; errors name `api` (the public
 * function given the operator) and the operator.
 */
ncclResult_t redop_resolve(struct ncclComm* comm, ncclRedOp_t op, ncclDataType_t dtype,
                           braid_devop_t* devop, uint64_t* scalar, uint8_t* flags,
                           const char* api);
void redop_table_free(struct ncclComm* comm);
/* Bytes of one element of `dtype` (0 when invalid). */
size_t redop_type_size(ncclDataType_t dtype);
const char* redop_type_name(ncclDataType_t dtype);
const char* redop_op_name(ncclRedOp_t op);

#endif
