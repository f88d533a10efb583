/*
 * SHM transport: the receiver's FIFO lives in host shared memory (a file in
 * /dev/shm), mapped into both processes and registered with CUDA so both
 * GPUs reach it over PCIe. Used between GPUs of one host that cannot reach
 * each other directly, or when BRAID_P2P_DISABLE=1.
 *
 * The receiver creates and sizes the file (posix_fallocate, so a /dev/shm
 * that is too small fails now, with the size needed, instead of with SIGBUS
 * later); the sender maps it by name. The receiver unlinks the file when it
 * frees the connection; the mapping stays valid for the sender until it
 * unmaps, so teardown order does not matter.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cuda_runtime.h>

#include "base/debug.h"
#include "base/error.h"
#include "base/param.h"
#include "base/utils.h"
#include "transport/transport.h"

struct shm_info {
  char name[64];
  size_t bytes;
};
_Static_assert(sizeof(struct shm_info) <= BRAID_CONN_INFO_BYTES, "shm info must fit");

struct shm_state {
  char name[64];
  void* host;       /* the mapping */
  size_t bytes;
  int registered;   /* cudaHostRegister done */
  int owner;        /* receiver: unlinks the file */
};

static ncclResult_t shm_can_connect(const struct braid_transport_comm* comm, const struct braid_peer_info* me,
                                    const struct braid_peer_info* peer, int* ok) {
  *ok = !braid_param_int(BRAID_P_SHM_DISABLE) && me->host_hash == peer->host_hash &&
        me->shm_dev == peer->shm_dev;
  return ncclSuccess;
}

static ncclResult_t shm_space_error(const char* name, size_t bytes, int err) {
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

/* Maps `bytes` of the named file and registers it with CUDA; `create` makes and sizes it. */
static ncclResult_t shm_map(struct shm_state* st, int create) {
  ncclResult_t res = ncclSuccess;
  int fd = shm_open(st->name, create ? O_RDWR | O_CREAT | O_EXCL : O_RDWR, 0600);
  if (fd < 0) {
    res = braid_err(ncclSystemError, "shm_open(%s) failed: %s", st->name, strerror(errno));
    goto fail;
  }
  if (create) {
    st->owner = 1;
    int err = posix_fallocate(fd, 0, (off_t)st->bytes);
    if (err != 0) {
      res = shm_space_error(st->name, st->bytes, err);
      goto fail_fd;
    }
  }
  st->host = mmap(NULL, st->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (st->host == MAP_FAILED) {
    st->host = NULL;
    res = braid_err(ncclSystemError, "mmap of %zu bytes of %s failed: %s", st->bytes, st->name,
                    strerror(errno));
    goto fail_fd;
  }
  close(fd);
  BRAID_CUDA_TRY(cudaHostRegister(st->host, st->bytes,
                                  cudaHostRegisterMapped | cudaHostRegisterPortable));
  st->registered = 1;
  return ncclSuccess;
fail_fd:
  close(fd);
fail:
  return res;
}

static ncclResult_t shm_fill_dev(struct braid_connector* conn) {
  ncclResult_t res = ncclSuccess;
  struct shm_state* st = conn->state;
  char* dev = NULL;
  BRAID_CUDA_TRY(cudaHostGetDevicePointer((void**)&dev, st->host, 0));
  transport_fifo_fill_dev(conn, dev, 0); /* no LL128: host memory over PCIe */
  return ncclSuccess;
fail:
  return res;
}

static ncclResult_t shm_send_setup(const struct braid_transport_comm* comm, struct braid_connector* conn,
                                   struct braid_conn_info* info) {
  return BRAID_CALLOC((struct shm_state**)&conn->state, 1, "shm connection");
}

static ncclResult_t shm_recv_setup(const struct braid_transport_comm* comm, struct braid_connector* conn,
                                   struct braid_conn_info* info) {
  ncclResult_t res = ncclSuccess;
  struct shm_info* si = (struct shm_info*)info->data;
  struct shm_state* st;
  uint32_t nonce;
  BRAID_TRY(BRAID_CALLOC((struct shm_state**)&conn->state, 1, "shm connection"));
  st = conn->state;
  BRAID_TRY(braid_random_bytes(&nonce, sizeof nonce));
  snprintf(st->name, sizeof st->name, "/braid-%d-r%d-p%d-c%d-%08x", (int)getpid(), comm->rank,
           conn->peer, conn->channel, nonce);
  st->bytes = transport_fifo_bytes(conn, 0); /* posix_fallocate zeroes it */
  BRAID_TRY(shm_map(st, 1));
  memcpy(si->name, st->name, sizeof si->name);
  si->bytes = st->bytes;
  return ncclSuccess;
fail:
  return res;
}

static ncclResult_t shm_send_connect(const struct braid_transport_comm* comm, struct braid_connector* conn,
                                     const struct braid_conn_info* peer_info) {
  ncclResult_t res = ncclSuccess;
  const struct shm_info* si = (const struct shm_info*)peer_info->data;
  struct shm_state* st = conn->state;
  BRAID_CHECK(memchr(si->name, '\0', sizeof si->name) != NULL, ncclInternalError,
              "malformed shm connection info from rank %d", conn->peer);
  memcpy(st->name, si->name, sizeof st->name);
  st->bytes = si->bytes;
  BRAID_CHECK(st->bytes == transport_fifo_bytes(conn, 0), ncclInternalError,
              "shm FIFO size mismatch with rank %d", conn->peer);
  BRAID_TRY(shm_map(st, 0));
  BRAID_TRY(shm_fill_dev(conn));
  return ncclSuccess;
fail:
  return res;
}

static ncclResult_t shm_recv_connect(const struct braid_transport_comm* comm, struct braid_connector* conn,
                                     const struct braid_conn_info* peer_info) {
  return shm_fill_dev(conn);
}

static ncclResult_t shm_free(struct braid_connector* conn) {
  struct shm_state* st = conn->state;
  if (st == NULL) return ncclSuccess;
  if (st->registered && cudaHostUnregister(st->host) != cudaSuccess)
    WARN("cudaHostUnregister of %s failed: %s", st->name, cudaGetErrorString(cudaGetLastError()));
  if (st->host) munmap(st->host, st->bytes);
  if (st->owner && shm_unlink(st->name) != 0 && errno != ENOENT)
    WARN("shm_unlink(%s) failed: %s", st->name, strerror(errno));
  free(st);
  conn->state = NULL;
  return ncclSuccess;
}

const struct braid_transport_ops braid_transport_shm = {
  .size = sizeof(struct braid_transport_ops),
  .name = "SHM",
  .can_connect = shm_can_connect,
  .send_setup = shm_send_setup,
  .recv_setup = shm_recv_setup,
  .send_connect = shm_send_connect,
  .recv_connect = shm_recv_connect,
  .free = shm_free,
};
