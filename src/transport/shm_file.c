/*
 * The SHM transport's files (shm_file.h): naming, making, opening and sweeping, kept apart
 * from the CUDA registration so that all of it runs in the host tests.
 */
#include "transport/shm_file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "base/debug.h"
#include "base/error.h"
#include "base/utils.h"

ncclResult_t shm_file_name(char* out, size_t size, uint64_t pid_ns, int pid, uint64_t start,
                           int rank, int peer, int channel, uint32_t nonce) {
  int n = snprintf(out, size, "/" SHM_FILE_PREFIX "%" PRIx64 "-%d-%" PRIx64 "-r%d-p%d-c%d-%08x",
                   pid_ns, pid, start, rank, peer, channel, nonce);
  if (n < 0 || (size_t)n >= size)
    return braid_err(ncclInternalError, "shared-memory file name of %d bytes does not fit %zu", n,
                     size);
  return ncclSuccess;
}

int shm_file_parse(const char* name, uint64_t* pid_ns, int* pid, uint64_t* start) {
  const size_t plen = strlen(SHM_FILE_PREFIX);
  if (strncmp(name, SHM_FILE_PREFIX, plen) != 0) return 0;
  const char* p = name + plen;
  char* end = NULL;
  errno = 0;
  unsigned long long ns = strtoull(p, &end, 16);
  if (end == p || *end != '-' || errno) return 0;
  p = end + 1;
  long id = strtol(p, &end, 10);
  if (end == p || *end != '-' || errno || id <= 0 || id > INT32_MAX) return 0;
  p = end + 1;
  unsigned long long st = strtoull(p, &end, 16);
  if (end == p || *end != '-' || errno) return 0;
  if (strncmp(end, "-r", 2) != 0) return 0; /* the rest is the connection's, not checked */
  *pid_ns = ns;
  *pid = (int)id;
  *start = st;
  return 1;
}

/* The error for a /dev/shm too small: what it has and how to enlarge it or need less. */
static ncclResult_t shm_file_space_error(const char* name, size_t bytes, int err) {
  struct statvfs vfs;
  unsigned long long free_bytes = 0, total = 0;
  if (statvfs("/dev/shm", &vfs) == 0) {
    free_bytes = (unsigned long long)vfs.f_bavail * vfs.f_frsize;
    total = (unsigned long long)vfs.f_blocks * vfs.f_frsize;
  }
  return braid_err(ncclSystemError,
                   "cannot allocate %zu bytes of shared memory for %s: %s. /dev/shm has %llu of "
                   "%llu bytes free; each shared-memory connection needs %zu. Enlarge it (docker "
                   "run --shm-size=1g, or mount -o remount,size=1G /dev/shm), lower "
                   "BRAID_BUFFSIZE, or use fewer channels (BRAID_MAX_NCHANNELS)",
                   bytes, name, strerror(err), free_bytes, total, bytes);
}

ncclResult_t shm_file_create(const char* name, size_t bytes, int* fd) {
  *fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
  if (*fd < 0) return braid_err(ncclSystemError, "shm_open(%s) failed: %s", name, strerror(errno));
  int err = posix_fallocate(*fd, 0, (off_t)bytes);
  if (err != 0) {
    ncclResult_t res = shm_file_space_error(name, bytes, err);
    close(*fd);
    *fd = -1;
    (void)shm_unlink(name);
    return res;
  }
  return ncclSuccess;
}

ncclResult_t shm_file_open_unlink(const char* name, size_t bytes, int* fd) {
  struct stat st;
  *fd = shm_open(name, O_RDWR, 0600);
  if (*fd < 0) return braid_err(ncclSystemError, "shm_open(%s) failed: %s", name, strerror(errno));
  /* Both ends hold it now (the creator its own descriptor or mapping): the name can go. */
  if (shm_unlink(name) != 0 && errno != ENOENT)
    WARN("shm_unlink(%s) failed: %s", name, strerror(errno));
  if (fstat(*fd, &st) != 0 || (size_t)st.st_size != bytes) {
    ncclResult_t res = braid_err(ncclSystemError, "%s has %lld bytes, the peer announced %zu", name,
                                 (long long)st.st_size, bytes);
    close(*fd);
    *fd = -1;
    return res;
  }
  return ncclSuccess;
}

int shm_file_sweep(const char* dir, uint64_t pid_ns) {
  int removed = 0;
  if (pid_ns == 0) return 0; /* pids of an unknown namespace compare with nothing */
  DIR* d = opendir(dir);
  if (d == NULL) return 0;
  struct dirent* e;
  while ((e = readdir(d)) != NULL) {
    uint64_t ns = 0, start = 0;
    int pid = 0;
    if (!shm_file_parse(e->d_name, &ns, &pid, &start) || ns != pid_ns || start == 0) continue;
    if (pid == (int)getpid() || !braid_process_gone(pid, start)) continue;
    if (unlinkat(dirfd(d), e->d_name, 0) == 0) {
      removed++;
      INFO(BRAID_LOG_INIT, "removed %s/%s, left by process %d, which is gone", dir, e->d_name, pid);
    }
  }
  closedir(d);
  return removed;
}
