/*
 * Logging. BRAID_DEBUG (alias NCCL_DEBUG) sets the level: NONE, VERSION,
 * WARN (default), INFO, TRACE. BRAID_DEBUG_SUBSYS picks subsystems for INFO
 * and TRACE (comma list, ^ to exclude, ALL). BRAID_DEBUG_FILE redirects the
 * log to a file; %h becomes the host name and %p the pid.
 *
 * Every line carries host, pid, rank and subsystem:
 *   node1:4242:4250 [rank 1 dev 1] BRAID INFO INIT comm 0x... ready
 * The level is checked before any formatting, and TRACE compiles out of
 * release builds.
 */
#ifndef BRAID_CORE_DEBUG_H
#define BRAID_CORE_DEBUG_H

#include <stdint.h>

typedef enum {
  BRAID_LOG_NONE = 0,
  BRAID_LOG_VERSION = 1,
  BRAID_LOG_WARN = 2,
  BRAID_LOG_INFO = 3,
  BRAID_LOG_TRACE = 4
} braid_log_level_t;

/* Subsystems, a bit each. */
#define BRAID_LOG_INIT      0x0001u
#define BRAID_LOG_COLL      0x0002u
#define BRAID_LOG_P2P       0x0004u
#define BRAID_LOG_SHM       0x0008u
#define BRAID_LOG_NET       0x0010u
#define BRAID_LOG_GRAPH     0x0020u
#define BRAID_LOG_TUNING    0x0040u
#define BRAID_LOG_ENV       0x0080u
#define BRAID_LOG_ALLOC     0x0100u
#define BRAID_LOG_CALL      0x0200u
#define BRAID_LOG_PROXY     0x0400u
#define BRAID_LOG_BOOTSTRAP 0x0800u
#define BRAID_LOG_REG       0x1000u
#define BRAID_LOG_ALL       0xffffffffu

/* Current level and subsystem mask; level is -1 until the first log call reads the params. */
extern int braid_log_level;
extern uint32_t braid_log_mask;

void braid_log_init(void);
/* Re-read BRAID_DEBUG* (ncclResetDebugInit). */
void braid_log_reset(void);
/* Rank and device shown on this thread's lines (-1 = none). */
void braid_log_context_set(int rank, int dev);
void braid_log_context_get(int* rank, int* dev);
/* The host name, as logs and error messages print it. */
const char* braid_log_hostname(void);
/*
 * Diagnostic reports asked of the process (a SIGUSR1 to Braid's handler, a hang warning):
 * threads that keep state of their own (the network proxies) print it when the count grows.
 * braid_report_request is async-signal-safe.
 */
void braid_report_request(void);
unsigned long braid_report_gen(void);

void braid_log_emit(braid_log_level_t level, uint32_t subsys, const char* file, int line,
                    const char* fmt, ...) __attribute__((format(printf, 5, 6)));

static inline int braid_log_enabled(braid_log_level_t level, uint32_t subsys) {
  if (braid_log_level < 0) braid_log_init();
  return (int)level <= braid_log_level &&
         (level <= BRAID_LOG_WARN || (braid_log_mask & subsys) != 0);
}

#define WARN(...)                                                               \
  do {                                                                          \
    if (braid_log_enabled(BRAID_LOG_WARN, BRAID_LOG_ALL))                       \
      braid_log_emit(BRAID_LOG_WARN, BRAID_LOG_ALL, __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)

#define INFO(subsys, ...)                                                       \
  do {                                                                          \
    if (braid_log_enabled(BRAID_LOG_INFO, (subsys)))                            \
      braid_log_emit(BRAID_LOG_INFO, (subsys), __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)

#ifdef BRAID_TRACE_ENABLED
#define TRACE(subsys, ...)                                                      \
  do {                                                                          \
    if (braid_log_enabled(BRAID_LOG_TRACE, (subsys)))                           \
      braid_log_emit(BRAID_LOG_TRACE, (subsys), __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)
#else
#define TRACE(subsys, ...) do { } while (0)
#endif

#endif
