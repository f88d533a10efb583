/*
 * SHM transport: the receiver's FIFO lives in host shared memory (a file in
 * /dev/shm), mapped into both processes and registered with CUDA so both
 * GPUs reach it over PCIe. Used between GPUs of one host that cannot reach
 * each other directly, or when BRAID_P2P_DISABLE=1.
 *
 * The receiver creates and sizes the file (posix_fallocate, so a /dev/shm
 * that is too small fails now, with the size needed, instead of with SIGBUS
 * later); the sender opens it by name and removes the name at once
 * (shm_file_open_unlink). Nothing in the connection exchange tells the
 * receiver when the sender has it (both ends connect at the same time), so
 * the sender's open, the first moment both ends hold the file, is where the
 * name can go soonest; from then on a crash of either process leaves nothing
 * in /dev/shm, and teardown only unmaps. The name lives from the receiver's
 * setup to the sender's connect: when the receiver frees a connection whose
 * sender never came (a failed init) it removes the name itself, and a file
 * whose maker died in that window is removed by the next process of the
 * same pid namespace that sets up an SHM connection (shm_file_sweep: the
 * name holds the maker's pid and start time).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cuda_runtime.h>

#include "base/debug.h"
#include "base/error.h"
#include "base/param.h"
#include "base/utils.h"
#include "transport/shm_file.h"
#include "transport/transport.h"

struct shm_info {
  char name[SHM_FILE_NAME_MAX];
  size_t bytes;
};
_Static_assert(sizeof(struct shm_info) <= BRAID_CONN_INFO_BYTES, "shm info must fit");

struct shm_state {
  char name[SHM_FILE_NAME_MAX];
  void* host;       /* the mapping */
  size_t bytes;
  int registered;   /* cudaHostRegister done */
  int owner;        /* receiver: removes the name if the sender never opened the file */
};

static ncclResult_t shm_can_connect(const struct braid_transport_comm* comm, const struct braid_peer_info* me,
                                    const struct braid_peer_info* peer, int* ok) {
  *ok = !braid_param_int(BRAID_P_SHM_DISABLE) && me->host_hash == peer->host_hash &&
        me->shm_dev == peer->shm_dev;
  return ncclSuccess;
}

/*
 * Maps `bytes` of the named file and registers it with CUDA; `create`: the receiver makes it,
 * else the sender opens it and removes its name.
 */
static ncclResult_t shm_map(struct shm_state* st, int create) {
  ncclResult_t res = ncclSuccess;
  int fd = -1;
  if (create) {
    BRAID_TRY(shm_file_create(st->name, st->bytes, &fd));
    st->owner = 1;
  } else {
    BRAID_TRY(shm_file_open_unlink(st->name, st->bytes, &fd));
  }
  st->host = mmap(NULL, st->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (st->host == MAP_FAILED) {
    st->host = NULL;
    res = braid_err(ncclSystemError, "mmap of %zu bytes of %s failed: %s", st->bytes, st->name,
                    strerror(errno));
    goto fail;
  }
  close(fd);
  fd = -1;
  BRAID_CUDA_TRY(cudaHostRegister(st->host, st->bytes,
                                  cudaHostRegisterMapped | cudaHostRegisterPortable));
  st->registered = 1;
  return ncclSuccess;
fail:
  if (fd >= 0) close(fd);
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

/* Once a process: what dead processes of this pid namespace left in /dev/shm goes. */
static pthread_once_t shm_sweep_once = PTHREAD_ONCE_INIT;
static void shm_sweep(void) {
  struct stat ns;
  if (stat("/proc/self/ns/pid", &ns) == 0) (void)shm_file_sweep("/dev/shm", (uint64_t)ns.st_ino);
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
  const struct braid_peer_info* me = &comm->peers[comm->rank];
  pthread_once(&shm_sweep_once, shm_sweep);
  BRAID_TRY(shm_file_name(st->name, sizeof st->name, me->pid_ns, (int)getpid(), me->start_time,
                          comm->rank, conn->peer, conn->channel, nonce));
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
  /* Named still only when the sender never opened it; gone is the normal case. */
  if (st->owner && shm_unlink(st->name) != 0 && errno != ENOENT)
    WARN("shm_unlink(%s) failed: %s", st->name, strerror(errno));
  if (conn->kept != NULL) {
    /* Kernels may still run: unregistering would wait for them, unmapping pull the FIFO from
       under them. The mapping stays to the process's end. */
    if (st->host) *conn->kept += st->bytes;
  } else {
    if (st->registered && cudaHostUnregister(st->host) != cudaSuccess)
      WARN("cudaHostUnregister of %s failed: %s", st->name, cudaGetErrorString(cudaGetLastError()));
    if (st->host) munmap(st->host, st->bytes);
  }
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
