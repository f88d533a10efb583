/*
 * One error type (ncclResult_t) and one way out. Internal functions return
 * ncclResult_t; a failure is logged once, where it is first understood, with
 * what the user needs to fix it, through braid_err(). The message is kept for
 * ncclGetLastError(): per thread, per process (for errors found on helper
 * threads) and, via comm_error_record(), per communicator.
 *
 * The TRY macros jump to the enclosing function's `fail:` label with `res`
 * set; they never return, so cleanup below `fail:` always runs.
 */
#ifndef BRAID_CORE_ERROR_H
#define BRAID_CORE_ERROR_H

#include <errno.h>
#include <string.h>

#include "nccl.h"

#define BRAID_ERROR_MAX 1024

/* Formats and logs (WARN) a message, keeps it for ncclGetLastError, and returns `code`. */
ncclResult_t braid_err(ncclResult_t code, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
/* The calling thread's last message, or the process's last one, or "". */
const char* braid_err_last(void);
/*
 * 1: this thread is trying something that may fail (a self-check): braid_err keeps the message
 * for braid_err_last on this thread only, without logging it or making it the process's last
 * error. 0: back to normal.
 */
void braid_err_probing(int on);
/* Makes `text` the calling thread's last message again, without logging it. */
void braid_err_restore(const char* text);
/* Forgets the calling thread's last message (done at the start of every API call). */
void braid_err_clear(void);
/* Human-readable name of a result code. */
const char* braid_result_str(ncclResult_t res);

/* Run `call` (returns ncclResult_t); on failure go to `fail` with res set. */
#define BRAID_TRY(call)                      \
  do {                                       \
    res = (call);                            \
    if (res != ncclSuccess) goto fail;       \
  } while (0)

/* Run a CUDA runtime call; on failure log what failed and go to `fail`. */
#define BRAID_CUDA_TRY(call)                                                          \
  do {                                                                                \
    cudaError_t cuda_err_ = (call);                                                   \
    if (cuda_err_ != cudaSuccess) {                                                   \
      res = braid_err(ncclUnhandledCudaError, "CUDA call %s failed: %s (%s) at %s:%d", \
                      #call, cudaGetErrorName(cuda_err_), cudaGetErrorString(cuda_err_), \
                      __FILE__, __LINE__);                                            \
      goto fail;                                                                      \
    }                                                                                 \
  } while (0)

/* Run a system call returning -1 on error; on failure log errno and go to `fail`. */
#define BRAID_SYS_TRY(call, what)                                                      \
  do {                                                                                 \
    if ((call) == -1) {                                                                \
      int sys_errno_ = errno;                                                          \
      res = braid_err(ncclSystemError, "%s failed: %s (errno %d) at %s:%d", (what),    \
                      strerror(sys_errno_), sys_errno_, __FILE__, __LINE__);           \
      goto fail;                                                                       \
    }                                                                                  \
  } while (0)

/* Fail with a message unless `cond` holds. */
#define BRAID_CHECK(cond, code, ...)              \
  do {                                            \
    if (!(cond)) {                                \
      res = braid_err((code), __VA_ARGS__);       \
      goto fail;                                  \
    }                                             \
  } while (0)

#endif
