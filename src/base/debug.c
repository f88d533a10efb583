/*
 * The logger: level and subsystems from the parameter table, one line per
 * message with host, pid, thread, rank, device and subsystem, written with a
 * single fwrite so that lines of concurrent threads never interleave.
 */
#include "base/debug.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/param.h"

int braid_log_level = -1;
uint32_t braid_log_mask = 0;

static FILE* log_file;
static char log_host[64];
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static __thread int log_rank = -1;
static __thread int log_dev = -1;

static const struct {
  const char* name;
  uint32_t bit;
} subsys_names[] = {
  {"INIT", BRAID_LOG_INIT},   {"COLL", BRAID_LOG_COLL},     {"P2P", BRAID_LOG_P2P},
  {"SHM", BRAID_LOG_SHM},     {"NET", BRAID_LOG_NET},       {"GRAPH", BRAID_LOG_GRAPH},
  {"TUNING", BRAID_LOG_TUNING}, {"ENV", BRAID_LOG_ENV},     {"ALLOC", BRAID_LOG_ALLOC},
  {"CALL", BRAID_LOG_CALL},   {"PROXY", BRAID_LOG_PROXY},   {"BOOTSTRAP", BRAID_LOG_BOOTSTRAP},
  {"REG", BRAID_LOG_REG},     {"ALL", BRAID_LOG_ALL},
};

static const char* log_subsys_name(uint32_t subsys) {
  for (size_t i = 0; i < sizeof subsys_names / sizeof subsys_names[0]; i++)
    if (subsys_names[i].bit == subsys) return subsys_names[i].name;
  return "MISC";
}

static int log_parse_level(const char* text) {
  if (text == NULL) return BRAID_LOG_WARN;
  if (strcasecmp(text, "NONE") == 0) return BRAID_LOG_NONE;
  if (strcasecmp(text, "VERSION") == 0) return BRAID_LOG_VERSION;
  if (strcasecmp(text, "WARN") == 0) return BRAID_LOG_WARN;
  if (strcasecmp(text, "INFO") == 0) return BRAID_LOG_INFO;
  if (strcasecmp(text, "TRACE") == 0) return BRAID_LOG_TRACE;
  if (strcasecmp(text, "ABORT") == 0) return BRAID_LOG_WARN; /* NCCL level, treated as WARN */
  return -1;
}

static uint32_t log_parse_mask(const char* text) {
  if (text == NULL) return BRAID_LOG_INIT | BRAID_LOG_BOOTSTRAP | BRAID_LOG_ENV;
  int invert = text[0] == '^';
  if (invert) text++;
  uint32_t mask = 0;
  char copy[256];
  snprintf(copy, sizeof copy, "%s", text);
  char* save = NULL;
  for (char* tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    for (size_t i = 0; i < sizeof subsys_names / sizeof subsys_names[0]; i++)
      if (strcasecmp(tok, subsys_names[i].name) == 0) mask |= subsys_names[i].bit;
  }
  return invert ? ~mask : mask;
}

/* Expands %h and %p in the BRAID_DEBUG_FILE pattern. */
static void log_expand_path(const char* pattern, char* out, size_t size) {
  size_t n = 0;
  for (const char* p = pattern; *p && n + 1 < size; p++) {
    if (p[0] == '%' && (p[1] == 'h' || p[1] == 'p')) {
      int w = p[1] == 'h' ? snprintf(out + n, size - n, "%s", log_host)
                          : snprintf(out + n, size - n, "%d", (int)getpid());
      if (w > 0) n += (size_t)w < size - n ? (size_t)w : size - n - 1;
      p++;
    } else {
      out[n++] = *p;
    }
  }
  out[n] = '\0';
}

static void log_report_malformed(const char* name, const char* text, const char* def) {
  WARN("ignoring %s=\"%s\": not an integer; using the default %s", name, text, def);
}

static void log_setup_locked(void) {
  if (log_host[0] == '\0') {
    if (gethostname(log_host, sizeof log_host) != 0) snprintf(log_host, sizeof log_host, "unknown");
    log_host[sizeof log_host - 1] = '\0';
    char* dot = strchr(log_host, '.');
    if (dot) *dot = '\0';
  }
  const char* level_text = braid_param_str(BRAID_P_DEBUG);
  int level = log_parse_level(level_text);
  int bad_level = level < 0;
  if (bad_level) level = BRAID_LOG_WARN;
  braid_log_mask = log_parse_mask(braid_param_str(BRAID_P_DEBUG_SUBSYS));
  if (log_file && log_file != stdout) fclose(log_file);
  log_file = stdout;
  const char* path = braid_param_str(BRAID_P_DEBUG_FILE);
  if (path && path[0]) {
    char expanded[4096];
    log_expand_path(path, expanded, sizeof expanded);
    FILE* f = fopen(expanded, "w");
    if (f) {
      setvbuf(f, NULL, _IOLBF, 0);
      log_file = f;
    } else {
      fprintf(stderr, "%s:%d Braid WARN cannot open BRAID_DEBUG_FILE %s; logging to stdout\n",
              log_host, (int)getpid(), expanded);
    }
  }
  __atomic_store_n(&braid_log_level, level, __ATOMIC_RELEASE);
  if (bad_level) WARN("unknown BRAID_DEBUG level \"%s\"; using WARN", level_text);
}

void braid_log_init(void) {
  pthread_mutex_lock(&log_lock);
  int first = __atomic_load_n(&braid_log_level, __ATOMIC_ACQUIRE) < 0;
  if (first) log_setup_locked();
  pthread_mutex_unlock(&log_lock);
  if (first) braid_param_report_malformed(log_report_malformed);
}

void braid_log_reset(void) {
  braid_param_reload();
  pthread_mutex_lock(&log_lock);
  log_setup_locked();
  pthread_mutex_unlock(&log_lock);
}

void braid_log_context_set(int rank, int dev) {
  log_rank = rank;
  log_dev = dev;
}

void braid_log_context_get(int* rank, int* dev) {
  if (rank) *rank = log_rank;
  if (dev) *dev = log_dev;
}

const char* braid_log_hostname(void) {
  if (braid_log_level < 0) braid_log_init();
  return log_host;
}

void braid_log_emit(braid_log_level_t level, uint32_t subsys, const char* file, int line,
                    const char* fmt, ...) {
  if (braid_log_level < 0) braid_log_init();
  static const char* level_names[] = {"NONE", "VERSION", "WARN", "INFO", "TRACE"};
  char buf[2048];
  int n = snprintf(buf, sizeof buf, "%s:%d:%d [rank %d dev %d] BRAID %s %s ", log_host,
                   (int)getpid(), (int)syscall(SYS_gettid), log_rank, log_dev, level_names[level],
                   level == BRAID_LOG_WARN ? "" : log_subsys_name(subsys));
  if (n < 0) return;
  if (level == BRAID_LOG_TRACE && (size_t)n < sizeof buf) {
    const char* base = strrchr(file, '/');
    int m = snprintf(buf + n, sizeof buf - n, "%s:%d ", base ? base + 1 : file, line);
    if (m > 0) n += m;
  }
  if ((size_t)n < sizeof buf) {
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(buf + n, sizeof buf - n, fmt, ap);
    va_end(ap);
    if (m > 0) n += m;
  }
  if ((size_t)n >= sizeof buf - 1) n = (int)sizeof buf - 2;
  buf[n++] = '\n';
  pthread_mutex_lock(&log_lock);
  fwrite(buf, 1, (size_t)n, log_file ? log_file : stdout);
  fflush(log_file ? log_file : stdout);
  pthread_mutex_unlock(&log_lock);
}

static unsigned long report_requests; /* atomic */

void braid_report_request(void) { __atomic_add_fetch(&report_requests, 1, __ATOMIC_RELAXED); }

unsigned long braid_report_gen(void) { return __atomic_load_n(&report_requests, __ATOMIC_RELAXED); }
