/*
 * Stand-ins for the NCCL calls of perf/coll_*.c, so perf_unit_test links the
 * real ops tables (their formulas and layouts) without any libnccl. The test
 * never calls the run slots; if something did, it would get an error back.
 */
#include "nccl.h"

ncclResult_t ncclAllReduce(const void* s, void* r, size_t n, ncclDataType_t t, ncclRedOp_t o,
                           ncclComm_t c, cudaStream_t st) { return ncclInternalError; }
ncclResult_t ncclAllGather(const void* s, void* r, size_t n, ncclDataType_t t, ncclComm_t c,
                           cudaStream_t st) { return ncclInternalError; }
ncclResult_t ncclReduceScatter(const void* s, void* r, size_t n, ncclDataType_t t, ncclRedOp_t o,
                               ncclComm_t c, cudaStream_t st) { return ncclInternalError; }
ncclResult_t ncclBroadcast(const void* s, void* r, size_t n, ncclDataType_t t, int root,
                           ncclComm_t c, cudaStream_t st) { return ncclInternalError; }
ncclResult_t ncclReduce(const void* s, void* r, size_t n, ncclDataType_t t, ncclRedOp_t o, int root,
                        ncclComm_t c, cudaStream_t st) { return ncclInternalError; }
ncclResult_t ncclAlltoAll(const void* s, void* r, size_t n, ncclDataType_t t, ncclComm_t c,
                          cudaStream_t st) { return ncclInternalError; }
ncclResult_t ncclGather(const void* s, void* r, size_t n, ncclDataType_t t, int root, ncclComm_t c,
                        cudaStream_t st) { return ncclInternalError; }
ncclResult_t ncclScatter(const void* s, void* r, size_t n, ncclDataType_t t, int root, ncclComm_t c,
                         cudaStream_t st) { return ncclInternalError; }
ncclResult_t ncclSend(const void* s, size_t n, ncclDataType_t t, int peer, ncclComm_t c,
                      cudaStream_t st) { return ncclInternalError; }
ncclResult_t ncclRecv(void* r, size_t n, ncclDataType_t t, int peer, ncclComm_t c,
                      cudaStream_t st) { return ncclInternalError; }
ncclResult_t ncclGroupStart(void) { return ncclInternalError; }
ncclResult_t ncclGroupEnd(void) { return ncclInternalError; }
