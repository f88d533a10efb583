/*
 * Error messages for ncclGetLastError. braid_err() is called once per error,
 * where it is first understood; it logs at WARN and keeps the text both for
 * the calling thread and for the process (errors found on helper threads,
 * such as the bootstrap listener, are read from another thread).
 */
#include "base/error.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>

#include "base/debug.h"

static __thread char thread_error[BRAID_ERROR_MAX];
static char process_error[BRAID_ERROR_MAX];
static pthread_mutex_t process_lock = PTHREAD_MUTEX_INITIALIZER;
static __thread int probing;

void braid_err_probing(int on) { probing = on; }

ncclResult_t braid_err(ncclResult_t code, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(thread_error, sizeof thread_error, fmt, ap);
  va_end(ap);
  if (probing) return code; /* the caller reads it and says what it means */
  pthread_mutex_lock(&process_lock);
  memcpy(process_error, thread_error, sizeof process_error);
  pthread_mutex_unlock(&process_lock);
  WARN("%s", thread_error);
  return code;
}

const char* braid_err_last(void) {
  if (thread_error[0] != '\0') return thread_error;
  static __thread char copy[BRAID_ERROR_MAX];
  pthread_mutex_lock(&process_lock);
  memcpy(copy, process_error, sizeof copy);
  pthread_mutex_unlock(&process_lock);
  return copy;
}

void braid_err_clear(void) { thread_error[0] = '\0'; }

void braid_err_restore(const char* text) {
  snprintf(thread_error, sizeof thread_error, "%s", text);
  pthread_mutex_lock(&process_lock);
  memcpy(process_error, thread_error, sizeof process_error);
  pthread_mutex_unlock(&process_lock);
}

const char* braid_result_str(ncclResult_t res) {
  switch (res) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the Braid developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}
