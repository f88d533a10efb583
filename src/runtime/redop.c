/*
 * Reduction operators. Built-in operators map straight to device operators,
 * except ncclAvg: on floating types it is a PreMulSum by 1/nranks (in the
 * type's own precision, as NCCL does), on integers a sum followed by a
 * division by nranks. Created PreMulSum operators live in a per-communicator
 * table; their handle is ncclNumOps + index.
 */
#include "runtime/redop.h"

#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "runtime/comm.h"
#include "base/debug.h"
#include "base/fpconv.h"
#include "base/utils.h"

#define REDOP_MAX 1024
#define NCCL_API __attribute__((visibility("default")))

struct braid_redop {
  int in_use;
  ncclDataType_t dtype;
  ncclScalarResidence_t residence;
  uint64_t scalar; /* value bits (host immediate) or device pointer */
};

struct braid_redop_table {
  struct braid_redop ops[REDOP_MAX];
};

static const struct {
  const char* name;
  size_t size;
  int floating;
} type_info[ncclNumTypes] = {
  [ncclInt8] = {"int8", 1, 0},         [ncclUint8] = {"uint8", 1, 0},
  [ncclInt32] = {"int32", 4, 0},       [ncclUint32] = {"uint32", 4, 0},
  [ncclInt64] = {"int64", 8, 0},       [ncclUint64] = {"uint64", 8, 0},
  [ncclFloat16] = {"half", 2, 1},      [ncclFloat32] = {"float", 4, 1},
  [ncclFloat64] = {"double", 8, 1},    [ncclBfloat16] = {"bfloat16", 2, 1},
  [ncclFloat8e4m3] = {"fp8e4m3", 1, 1}, [ncclFloat8e5m2] = {"fp8e5m2", 1, 1},
};

size_t redop_type_size(ncclDataType_t dtype) {
  return (int)dtype >= 0 && dtype < ncclNumTypes ? type_info[dtype].size : 0;
}

const char* redop_type_name(ncclDataType_t dtype) {
  return (int)dtype >= 0 && dtype < ncclNumTypes ? type_info[dtype].name : "invalid";
}

const char* redop_op_name(ncclRedOp_t op) {
  static const char* names[] = {"sum", "prod", "max", "min", "avg"};
  return (int)op >= 0 && op < ncclNumOps ? names[op] : "premulsum";
}

/* The scalar `value` converted to `dtype`, as bits in the low bytes of a uint64. */
static uint64_t redop_scalar_bits(double value, ncclDataType_t dtype) {
  uint64_t bits = 0;
  float f = (float)value;
  switch (dtype) {
    case ncclFloat16: bits = fpconv_half_from_float(f); break;
    case ncclBfloat16: bits = fpconv_bf16_from_float(f); break;
    case ncclFloat8e4m3: bits = fpconv_e4m3_from_float(f); break;
    case ncclFloat8e5m2: bits = fpconv_e5m2_from_float(f); break;
    case ncclFloat32: memcpy(&bits, &f, 4); break;
    case ncclFloat64: memcpy(&bits, &value, 8); break;
    default: bits = (uint64_t)(int64_t)value; break;
  }
  return bits;
}

ncclResult_t redop_resolve(struct ncclComm* comm, ncclRedOp_t op, ncclDataType_t dtype,
                           braid_devop_t* devop, uint64_t* scalar, uint8_t* flags,
                           const char* api) {
  *scalar = 0;
  *flags = 0;
  switch (op) {
    case ncclSum: *devop = BRAID_DEVOP_SUM; return ncclSuccess;
    case ncclProd: *devop = BRAID_DEVOP_PROD; return ncclSuccess;
    case ncclMax: *devop = BRAID_DEVOP_MAX; return ncclSuccess;
    case ncclMin: *devop = BRAID_DEVOP_MIN; return ncclSuccess;
    case ncclAvg:
      if (type_info[dtype].floating) {
        *devop = BRAID_DEVOP_PREMULSUM;
        *scalar = redop_scalar_bits(1.0 / comm->nranks, dtype);
      } else {
        *devop = BRAID_DEVOP_SUMPOSTDIV;
      }
      return ncclSuccess;
    default: break;
  }
  int index = (int)op - (int)ncclNumOps;
  struct braid_redop_table* t = comm->redops;
  if (index < 0 || index >= REDOP_MAX || t == NULL || !t->ops[index].in_use)
    return braid_err(ncclInvalidArgument,
                     "%s: op = %d is neither a built-in reduction operator nor one created on "
                     "rank %d's communicator (or it was destroyed)",
                     api, (int)op, comm->rank);
  const struct braid_redop* r = &t->ops[index];
  if (r->dtype != dtype)
    return braid_err(ncclInvalidArgument,
                     "%s: reduction operator op = %d was created for datatype %s but is used "
                     "with %s",
                     api, (int)op, redop_type_name(r->dtype), redop_type_name(dtype));
  *devop = BRAID_DEVOP_PREMULSUM;
  *scalar = r->scalar;
  *flags = r->residence == ncclScalarDevice ? BRAID_WORK_SCALAR_DEVICE : 0;
  return ncclSuccess;
}

void redop_table_free(struct ncclComm* comm) {
  free(comm->redops);
  comm->redops = NULL;
}

NCCL_API ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm) {
  ncclResult_t res = ncclSuccess;
  braid_err_clear();
  BRAID_TRY(comm_check(comm, "ncclRedOpCreatePreMulSum"));
  BRAID_CHECK(op != NULL, ncclInvalidArgument, "ncclRedOpCreatePreMulSum: op is NULL");
  BRAID_CHECK(scalar != NULL, ncclInvalidArgument, "ncclRedOpCreatePreMulSum: scalar is NULL");
  BRAID_CHECK((int)datatype >= 0 && datatype < ncclNumTypes, ncclInvalidArgument,
              "ncclRedOpCreatePreMulSum: datatype %d is not an ncclDataType_t (0..%d)",
              (int)datatype, ncclNumTypes - 1);
  BRAID_CHECK(residence == ncclScalarDevice || residence == ncclScalarHostImmediate,
              ncclInvalidArgument,
              "ncclRedOpCreatePreMulSum: residence %d is neither ncclScalarDevice (%d) nor "
              "ncclScalarHostImmediate (%d)",
              (int)residence, (int)ncclScalarDevice, (int)ncclScalarHostImmediate);
  if (comm->redops == NULL) BRAID_TRY(BRAID_CALLOC(&comm->redops, 1, "reduction operators"));
  int index = 0;
  while (index < REDOP_MAX && comm->redops->ops[index].in_use) index++;
  BRAID_CHECK(index < REDOP_MAX, ncclInvalidUsage,
              "ncclRedOpCreatePreMulSum: comm (rank %d) already has %d operators, the most it "
              "holds; destroy some with ncclRedOpDestroy",
              comm->rank, REDOP_MAX);
  struct braid_redop* r = &comm->redops->ops[index];
  r->dtype = datatype;
  r->residence = residence;
  if (residence == ncclScalarHostImmediate)
    memcpy(&r->scalar, scalar, redop_type_size(datatype));
  else
    r->scalar = (uint64_t)(uintptr_t)scalar;
  r->in_use = 1;
  *op = (ncclRedOp_t)(ncclNumOps + index);
  return ncclSuccess;
fail:
  comm_error_record(comm, res);
  return res;
}

NCCL_API ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  ncclResult_t res = ncclSuccess;
  braid_err_clear();
  BRAID_TRY(comm_check(comm, "ncclRedOpDestroy"));
  int index = (int)op - (int)ncclNumOps;
  BRAID_CHECK((int)op >= 0, ncclInvalidArgument,
              "ncclRedOpDestroy: op = %d is not a reduction operator", (int)op);
  BRAID_CHECK(index >= 0, ncclInvalidArgument,
              "ncclRedOpDestroy: op = %d (%s) is a built-in operator and cannot be destroyed",
              (int)op, redop_op_name(op));
  BRAID_CHECK(index < REDOP_MAX && comm->redops && comm->redops->ops[index].in_use,
              ncclInvalidArgument,
              "ncclRedOpDestroy: op = %d is not an operator created on rank %d's communicator "
              "(or it was destroyed already)",
              (int)op, comm->rank);
  comm->redops->ops[index].in_use = 0;
  return ncclSuccess;
fail:
  comm_error_record(comm, res);
  return res;
}
NCCL_API ncclResult_t pncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                                ncclScalarResidence_t residence, ncclComm_t comm)
    __attribute__((alias("ncclRedOpCreatePreMulSum")));
NCCL_API ncclResult_t pncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm)
    __attribute__((alias("ncclRedOpDestroy")));
