/*
 * What every NCCL plugin interface shares (NCCL 2.28's nccl_common.h and the result codes of
 * nccl.h) as a plugin built against NCCL's headers sees it: the test plugins' own copy, nothing
 * of Braid's included. The logger's subsystem flags are NCCL's.
 */
#ifndef BRAID_TESTS_PLUGINS_NCCL_COMMON_H
#define BRAID_TESTS_PLUGINS_NCCL_COMMON_H

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7
} ncclResult_t;

typedef enum {
  NCCL_LOG_NONE = 0,
  NCCL_LOG_VERSION = 1,
  NCCL_LOG_WARN = 2,
  NCCL_LOG_INFO = 3,
  NCCL_LOG_ABORT = 4,
  NCCL_LOG_TRACE = 5
} ncclDebugLogLevel;

#define NCCL_INIT 0x1
#define NCCL_NET 0x10
#define NCCL_TUNING 0x40

typedef void (*ncclDebugLogger_t)(ncclDebugLogLevel level, unsigned long flags, const char* file,
                                  int line, const char* fmt, ...);

#endif
