/*
 * Host helpers: identity hashes, clocks, checked allocation, bus ids,
 * random bytes.
 */
#include "base/utils.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime.h>

#include "base/error.h"
#include "base/param.h"

uint64_t braid_hash(const void* data, size_t size) {
  const unsigned char* p = data;
  uint64_t h = 0xcbf29ce484222325ULL;
  for (size_t i = 0; i < size; i++) {
    h ^= p[i];
    h *= 0x100000001b3ULL;
  }
  return h;
}

uint64_t braid_host_hash(void) {
  const char* override = braid_param_str(BRAID_P_HOSTID);
  char id[512];
  if (override && override[0]) {
    snprintf(id, sizeof id, "%s", override);
  } else {
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    char boot[64] = "";
    FILE* f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
      if (fgets(boot, sizeof boot, f) == NULL) boot[0] = '\0';
      fclose(f);
    }
    boot[strcspn(boot, "\n")] = '\0';
    snprintf(id, sizeof id, "%s|%s", host, boot);
  }
  return braid_hash(id, strlen(id));
}

/*
 * Host and pid alone do not name a process: containers sharing the host's network and boot id
 * have their own pid namespaces, where the same pids recur (and pid 1 everywhere). A random
 * number drawn once per process (again in a forked child) tells them apart.
 */
uint64_t braid_pid_hash(void) {
  static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
  static pid_t drawn_by;
  static uint64_t nonce;
  pid_t pid = getpid();
  pthread_mutex_lock(&lock);
  if (drawn_by != pid) {
    if (getrandom(&nonce, sizeof nonce, 0) != (ssize_t)sizeof nonce)
      nonce = braid_time_ns() ^ ((uint64_t)pid << 32) ^ (uint64_t)(uintptr_t)&pid;
    drawn_by = pid;
  }
  uint64_t parts[3] = {braid_host_hash(), (uint64_t)pid, nonce};
  pthread_mutex_unlock(&lock);
  return braid_hash(parts, sizeof parts);
}

double braid_time_sec(void) { return (double)braid_time_ns() * 1e-9; }

uint64_t braid_time_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

ncclResult_t braid_calloc(void** out, size_t nmemb, size_t size, const char* what) {
  *out = NULL;
  if (nmemb == 0 || size == 0) {
    nmemb = 1;
    size = 1;
  }
  void* p = calloc(nmemb, size);
  if (p == NULL)
    return braid_err(ncclSystemError, "out of host memory allocating %zu bytes for %s",
                     nmemb * size, what);
  *out = p;
  return ncclSuccess;
}

int64_t braid_busid_to_int(const char* busid) {
  unsigned dom = 0, bus = 0, dev = 0, fn = 0;
  if (sscanf(busid, "%x:%x:%x.%x", &dom, &bus, &dev, &fn) != 4) {
    dom = 0;
    if (sscanf(busid, "%x:%x.%x", &bus, &dev, &fn) != 3) return -1;
  }
  return ((int64_t)dom << 20) | ((int64_t)bus << 12) | ((int64_t)dev << 4) | fn;
}

void braid_busid_to_str(int64_t id, char* out, size_t size) {
  snprintf(out, size, "%04x:%02x:%02x.%x", (unsigned)(id >> 20), (unsigned)((id >> 12) & 0xff),
           (unsigned)((id >> 4) & 0xff), (unsigned)(id & 0xf));
}

ncclResult_t braid_random_bytes(void* buf, size_t size) {
  unsigned char* p = buf;
  size_t done = 0;
  while (done < size) {
    ssize_t n = getrandom(p + done, size - done, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return braid_err(ncclSystemError, "getrandom failed: %s", strerror(errno));
    }
    done += (size_t)n;
  }
  return ncclSuccess;
}

int braid_spec_match(const char* spec, braid_token_match_fn token_match, const void* arg) {
  if (spec == NULL) return 1;
  int exclude = 0, exact = 0;
  if (*spec == '^') {
    exclude = 1;
    spec++;
  }
  if (*spec == '=') {
    exact = 1;
    spec++;
  }
  int tokens = 0, hit = 0;
  for (const char* p = spec; *p != '\0';) {
    size_t len = strcspn(p, ",");
    if (len > 0) {
      tokens++;
      if (token_match(p, len, exact, arg)) hit = 1;
    }
    p += len;
    if (*p == ',') p++;
  }
  if (tokens == 0) return 1; /* "", "^", "=": no constraint */
  return exclude ? !hit : hit;
}

void* braid_driver_fn(const char* name) {
  void* fn = NULL;
  enum cudaDriverEntryPointQueryResult found;
  if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found) !=
          cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    (void)cudaGetLastError();
    return NULL;
  }
  return fn;
}

ncclResult_t braid_cuda_zero(void* ptr, size_t bytes) {
  ncclResult_t res = ncclSuccess;
  cudaStream_t s = NULL;
  BRAID_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  BRAID_CUDA_TRY(cudaMemsetAsync(ptr, 0, bytes, s));
  BRAID_CUDA_TRY(cudaStreamSynchronize(s));
fail:
  if (s != NULL) {
    cudaError_t err = cudaStreamDestroy(s);
    if (err != cudaSuccess && res == ncclSuccess)
      res = braid_err(ncclUnhandledCudaError, "cudaStreamDestroy: %s", cudaGetErrorString(err));
  }
  return res;
}

/* Fields of /proc/<pid>/stat: after the command name (in parentheses, which may hold spaces),
 * field 3 is the state and field 22 the start time in clock ticks since boot. */
static int proc_stat_read(int pid, char* state, uint64_t* start) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE* f = fopen(path, "re");
  if (f == NULL) return -1;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  char* p = strrchr(buf, ')');
  if (p == NULL || p[1] != ' ') return -1;
  p += 2;
  *state = *p;
  unsigned long long v = 0;
  /* Skip fields 3..21 (19 fields), then read field 22. */
  for (int field = 3; field < 22; field++) {
    p = strchr(p, ' ');
    if (p == NULL) return -1;
    p++;
  }
  if (sscanf(p, "%llu", &v) != 1) return -1;
  *start = v;
  return 0;
}

/* Whether /proc is this pid namespace's: /proc/self/stat names this process by its own pid. */
static int proc_is_ours(void) {
  int pid = -1;
  FILE* f = fopen("/proc/self/stat", "re");
  if (f == NULL) return 0;
  int ok = fscanf(f, "%d", &pid) == 1;
  fclose(f);
  return ok && pid == (int)getpid();
}

uint64_t braid_process_start(int pid) {
  if (!proc_is_ours()) return 0;
  char state;
  uint64_t start = 0;
  return proc_stat_read(pid, &state, &start) == 0 ? start : 0;
}

int braid_process_gone(int pid, uint64_t start) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return 1;
  if (!proc_is_ours()) return 0; /* /proc of another pid namespace: its pids are not ours */
  char state;
  uint64_t now_start = 0;
  if (proc_stat_read(pid, &state, &now_start) != 0) return 0; /* no /proc: only kill says */
  if (state == 'Z' || state == 'X') return 1;                 /* exited, not reaped yet */
  return start != 0 && now_start != start;                    /* the pid went to another process */
}

int braid_process_stopped(int pid) {
  char state;
  uint64_t start = 0;
  return proc_is_ours() && proc_stat_read(pid, &state, &start) == 0 && (state == 'T' || state == 't');
}
