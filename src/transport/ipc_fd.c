/*
 * The descriptor service (see ipc.h): one thread per process, on an abstract Unix socket, that
 * hands each exported cuMem descriptor to a process of the same user presenting its token;
 * the exports it serves; and the fetch, a peer's side of it.
 */
#include "transport/ipc.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>
#include <unistd.h>

#include "base/debug.h"
#include "base/error.h"
#include "base/param.h"
#include "base/utils.h"

#define IPC_MAGIC 0x3144464449415242ull /* "BRAIDFD1" */
#define IPC_REQ_TIMEOUT_MS 1000         /* how long the service waits for one request */

struct ipc_request {
  uint64_t magic;
  uint8_t token[16];
};

struct ipc_reply {
  uint64_t magic;
  int32_t status; /* 0: the descriptor is attached; 1: no such export */
  int32_t pad;
};

struct ipc_export {
  struct ipc_export* next;
  uint8_t token[16];
  int fd;
};

static struct {
  pthread_mutex_t lock;
  int refs;
  pid_t pid; /* the process that started the service (a forked child starts its own) */
  int listen_fd;
  int wake[2];
  pthread_t thread;
  int running;
  uint64_t id;
  struct ipc_export* exports;
  int nexports;
  char why[160]; /* why there is no service, when there is none */
} svc = {.lock = PTHREAD_MUTEX_INITIALIZER, .listen_fd = -1, .wake = {-1, -1}};

static void ipc_sock_name(uint64_t id, struct sockaddr_un* addr, socklen_t* len) {
  memset(addr, 0, sizeof *addr);
  addr->sun_family = AF_UNIX;
  /* Abstract namespace: sun_path[0] is NUL, nothing appears in the file system. */
  int n = snprintf(addr->sun_path + 1, sizeof addr->sun_path - 1, "braid-ipc-%016llx",
                   (unsigned long long)id);
  *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

/* Sends the export's descriptor (or a refusal) to one connected client. */
static void ipc_serve_one(int fd) {
  struct timeval tv = {.tv_sec = IPC_REQ_TIMEOUT_MS / 1000, .tv_usec = 0};
  struct ipc_request req;
  struct ucred cred;
  socklen_t clen = sizeof cred;
  (void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  (void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  /* Only processes of this user: the peers of a job are. */
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0 || cred.uid != getuid()) return;
  size_t got = 0;
  while (got < sizeof req) {
    ssize_t n = recv(fd, (char*)&req + got, sizeof req - got, 0);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      return;
    }
    got += (size_t)n;
  }
  if (req.magic != IPC_MAGIC) return;
  struct ipc_reply rep = {.magic = IPC_MAGIC, .status = 1};
  char cbuf[CMSG_SPACE(sizeof(int))];
  struct iovec iov = {.iov_base = &rep, .iov_len = sizeof rep};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
  pthread_mutex_lock(&svc.lock);
  struct ipc_export* e = svc.exports;
  while (e && memcmp(e->token, req.token, sizeof e->token) != 0) e = e->next;
  if (e) {
    rep.status = 0;
    memset(cbuf, 0, sizeof cbuf);
    msg.msg_control = cbuf;
    msg.msg_controllen = sizeof cbuf;
    struct cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &e->fd, sizeof(int));
  }
  /* Under the lock: the descriptor must not be closed while it is being sent. */
  while (sendmsg(fd, &msg, MSG_NOSIGNAL) < 0 && errno == EINTR) {
  }
  pthread_mutex_unlock(&svc.lock);
}

static void* ipc_service_main(void* arg) {
  const int* fds = arg; /* [listen, wake]: the service's own, fixed while it runs */
  const int listen_fd = fds[0], wake_fd = fds[1];
  free(arg);
  for (;;) {
    struct pollfd p[2] = {{.fd = listen_fd, .events = POLLIN}, {.fd = wake_fd, .events = POLLIN}};
    int n = poll(p, 2, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      WARN("the cuMem descriptor service stops: poll failed: %s", strerror(errno));
      return NULL;
    }
    if (p[1].revents) return NULL;
    if (p[0].revents & POLLIN) {
      int c = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
      if (c < 0) continue;
      ipc_serve_one(c);
      close(c);
    }
  }
}

static void ipc_service_close_fds(void) {
  if (svc.listen_fd >= 0) close(svc.listen_fd);
  for (int i = 0; i < 2; i++)
    if (svc.wake[i] >= 0) close(svc.wake[i]);
  svc.listen_fd = -1;
  svc.wake[0] = svc.wake[1] = -1;
}

/* Starts the service; on failure leaves svc.id 0 and svc.why set. Called with the lock held. */
static void ipc_service_start(void) {
  struct sockaddr_un addr;
  socklen_t len;
  svc.id = 0;
  svc.why[0] = '\0';
  svc.pid = getpid();
  if (braid_random_bytes(&svc.id, sizeof svc.id) != ncclSuccess || svc.id == 0) {
    snprintf(svc.why, sizeof svc.why, "no random bytes for its socket name");
    svc.id = 0;
    return;
  }
  svc.listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ipc_sock_name(svc.id, &addr, &len);
  if (svc.listen_fd < 0 || bind(svc.listen_fd, (struct sockaddr*)&addr, len) != 0 ||
      listen(svc.listen_fd, 128) != 0 || pipe2(svc.wake, O_CLOEXEC) != 0) {
    snprintf(svc.why, sizeof svc.why, "its Unix socket could not be set up: %s", strerror(errno));
    ipc_service_close_fds();
    svc.id = 0;
    return;
  }
  int* fds = malloc(2 * sizeof(int));
  int err = ENOMEM;
  if (fds) {
    fds[0] = svc.listen_fd;
    fds[1] = svc.wake[0];
    err = pthread_create(&svc.thread, NULL, ipc_service_main, fds);
    if (err != 0) free(fds);
  }
  if (err != 0) {
    snprintf(svc.why, sizeof svc.why, "its thread could not start: %s", strerror(err));
    ipc_service_close_fds();
    svc.id = 0;
    return;
  }
  svc.running = 1;
}

/*
 * Stops the service. Called with the lock held; drops it while joining the
 * thread (which takes the lock to serve a request) and takes it again. A
 * communicator starting meanwhile starts a service of its own.
 */
static void ipc_service_stop(void) {
  pthread_t thread = svc.thread;
  int running = svc.running;
  int listen_fd = svc.listen_fd, wake0 = svc.wake[0], wake1 = svc.wake[1];
  svc.running = 0;
  svc.listen_fd = svc.wake[0] = svc.wake[1] = -1;
  svc.id = 0;
  pthread_mutex_unlock(&svc.lock);
  if (running) {
    char b = 1;
    while (write(wake1, &b, 1) < 0 && errno == EINTR) {
    }
    pthread_join(thread, NULL);
  }
  if (listen_fd >= 0) close(listen_fd);
  if (wake0 >= 0) close(wake0);
  if (wake1 >= 0) close(wake1);
  pthread_mutex_lock(&svc.lock);
}

/* Again in a forked child, whose parent's thread and sockets are not its own. */
uint64_t ipc_service_hold(char* why, size_t why_size) {
  pthread_mutex_lock(&svc.lock);
  if (svc.refs > 0 && svc.pid != getpid()) {
    /* A forked child: the parent's thread is not here and its sockets are the parent's. */
    ipc_service_close_fds();
    svc.running = 0;
    svc.refs = 0;
    svc.exports = NULL;
    svc.nexports = 0;
  }
  if (svc.refs++ == 0) ipc_service_start();
  const uint64_t id = svc.id;
  if (id == 0) snprintf(why, why_size, "%s", svc.why);
  pthread_mutex_unlock(&svc.lock);
  return id;
}

void ipc_release(void) {
  pthread_mutex_lock(&svc.lock);
  /* Exports still listed (memory not freed yet) stay listed: their owners close them. */
  if (svc.refs > 0 && svc.pid == getpid() && --svc.refs == 0) ipc_service_stop();
  pthread_mutex_unlock(&svc.lock);
}

int ipc_exports_live(void) {
  pthread_mutex_lock(&svc.lock);
  int n = svc.nexports;
  pthread_mutex_unlock(&svc.lock);
  return n;
}

void ipc_fd_withdraw(struct ipc_export* e) {
  pthread_mutex_lock(&svc.lock);
  for (struct ipc_export** p = &svc.exports; *p; p = &(*p)->next) {
    if (*p == e) {
      *p = e->next;
      svc.nexports--;
      free(e);
      break;
    }
  }
  pthread_mutex_unlock(&svc.lock);
}

ncclResult_t ipc_fd_offer(int fd, struct ipc_desc* desc, struct ipc_export** out) {
  ncclResult_t res = ncclSuccess;
  struct ipc_export* e = NULL;
  BRAID_TRY(BRAID_CALLOC(&e, 1, "descriptor export"));
  BRAID_TRY(braid_random_bytes(e->token, sizeof e->token));
  e->fd = fd;
  pthread_mutex_lock(&svc.lock);
  if (svc.id == 0) {
    pthread_mutex_unlock(&svc.lock);
    BRAID_CHECK(0, ncclInternalError, "no descriptor service runs in this process (%s)",
                svc.why[0] ? svc.why : "no communicator holds it");
  }
  e->next = svc.exports;
  svc.exports = e;
  svc.nexports++;
  desc->u.cumem.service = svc.id;
  pthread_mutex_unlock(&svc.lock);
  memcpy(desc->u.cumem.token, e->token, sizeof e->token);
  *out = e;
  return ncclSuccess;
fail:
  free(e);
  return res;
}

/*
 * How long a fetch waits for the owner's descriptor service. The service answers at once while
 * its process runs, so only an owner that is stopped or hung makes a fetch wait: BRAID_TIMEOUT,
 * when set below it, bounds this wait as it bounds every other wait for a peer.
 */
#define IPC_FETCH_TIMEOUT_SEC 30.0
static double ipc_fetch_timeout(void) {
  const int64_t t = braid_param_int(BRAID_P_TIMEOUT);
  return t > 0 && (double)t < IPC_FETCH_TIMEOUT_SEC ? (double)t : IPC_FETCH_TIMEOUT_SEC;
}

/* The process behind a connected Unix socket (SO_PEERCRED), 0 when unknown. */
static int ipc_peer_pid(int s) {
  struct ucred cred;
  socklen_t len = sizeof cred;
  return getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 ? (int)cred.pid : 0;
}

/*
 * Whether the owner's process is gone. A process that dies closes its sockets a moment before
 * it turns into a zombie, so after an end of stream this looks again for up to `settle` s.
 */
static int ipc_owner_gone(int pid, uint64_t start, double settle) {
  const double until = braid_time_sec() + settle;
  for (;;) {
    if (braid_process_gone(pid, start)) return 1;
    if (braid_time_sec() >= until) return 0;
    usleep(5 * 1000);
  }
}

/* The owner's service took the request but gave no answer: what its process is doing. */
static ncclResult_t ipc_fetch_unanswered(int my_rank, unsigned owner, int pid, double waited,
                                         int gone) {
  if (gone)
    return braid_err(ncclRemoteError,
                     "rank %d: rank %u's process (pid %d) is gone: it exited while handing over "
                     "a memory handle",
                     my_rank, owner, pid);
  const char* what = pid > 0 && braid_process_stopped(pid) ? "is stopped (a signal or a debugger)"
                                                           : "does not answer (hung, or starved)";
  return braid_err(ncclRemoteError,
                   "rank %d: rank %u's process (pid %d) %s: its descriptor service took the "
                   "request for a memory handle and gave no answer in %.1f s",
                   my_rank, owner, pid, what, waited);
}

/*
 * Asks the owner's descriptor service for the export's descriptor. Waits at
 * most ipc_fetch_timeout() for the service (it answers at once when its
 * process runs), less when the abort flag rises or the owner's process is
 * found gone.
 */
ncclResult_t ipc_fd_fetch(const struct ipc_desc* desc, int my_rank, volatile uint32_t* abort_flag,
                          int* out_fd) {
  const double timeout_sec = ipc_fetch_timeout();
  double start = braid_time_sec();
  struct sockaddr_un addr;
  socklen_t len;
  int err = 0;
  ipc_sock_name(desc->u.cumem.service, &addr, &len);
  for (;;) {
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0)
      return braid_err(ncclSystemError, "rank %d: socket(AF_UNIX) failed: %s", my_rank, strerror(errno));
    struct timeval tv = {.tv_sec = 0, .tv_usec = 200 * 1000};
    (void)setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    (void)setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(s, (struct sockaddr*)&addr, len) == 0) {
      const int owner_pid = ipc_peer_pid(s);
      const uint64_t owner_start = owner_pid > 0 ? braid_process_start(owner_pid) : 0;
      struct ipc_request req = {.magic = IPC_MAGIC};
      memcpy(req.token, desc->u.cumem.token, sizeof req.token);
      if (send(s, &req, sizeof req, MSG_NOSIGNAL) == (ssize_t)sizeof req) {
        struct ipc_reply rep;
        char cbuf[CMSG_SPACE(sizeof(int))];
        struct iovec iov = {.iov_base = &rep, .iov_len = sizeof rep};
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
                             .msg_controllen = sizeof cbuf};
        for (;;) {
          ssize_t n = recvmsg(s, &msg, MSG_CMSG_CLOEXEC);
          const int rerr = n < 0 ? errno : 0;
          const int timed_out = rerr == EINTR || rerr == EAGAIN;
          const int gone =
              n <= 0 && owner_pid > 0 && ipc_owner_gone(owner_pid, owner_start, timed_out ? 0 : 0.2);
          if (timed_out && !gone && braid_time_sec() - start < timeout_sec &&
              !(abort_flag && *abort_flag))
            continue;
          int fd = -1;
          struct cmsghdr* c = n > 0 ? CMSG_FIRSTHDR(&msg) : NULL;
          if (c && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS &&
              c->cmsg_len == CMSG_LEN(sizeof(int)))
            memcpy(&fd, CMSG_DATA(c), sizeof fd);
          close(s);
          if (n == (ssize_t)sizeof rep && rep.magic == IPC_MAGIC && rep.status == 0 && fd >= 0) {
            *out_fd = fd;
            return ncclSuccess;
          }
          if (fd >= 0) close(fd);
          if (n == (ssize_t)sizeof rep && rep.magic == IPC_MAGIC)
            return braid_err(ncclInternalError,
                             "rank %d: rank %u's descriptor service does not know the buffer it "
                             "offered (freed already?)",
                             my_rank, desc->owner_rank);
          if (abort_flag && *abort_flag)
            return braid_err(ncclRemoteError,
                             "rank %d: aborted while waiting for rank %u's descriptor service",
                             my_rank, desc->owner_rank);
          if (gone || (timed_out && owner_pid > 0))
            return ipc_fetch_unanswered(my_rank, desc->owner_rank, owner_pid,
                                        braid_time_sec() - start, gone);
          return braid_err(ncclSystemError,
                           "rank %d: rank %u's descriptor service did not hand over a memory "
                           "handle (%s); a seccomp profile or security module may forbid passing "
                           "descriptors: set NCCL_CUMEM_ENABLE=0 (legacy CUDA IPC, needs every GPU "
                           "visible) or NCCL_P2P_DISABLE=1 (through host memory, slower)",
                           my_rank, desc->owner_rank,
                           n < 0 ? strerror(rerr) : n == 0 ? "connection closed" : "short reply");
        }
      }
    }
    err = errno;
    close(s);
    /* The service runs from before the owner's info went out until its communicators are gone:
     * no listener means the owner process is gone or unreachable. Only a full backlog waits. */
    if (err != EAGAIN && err != EINTR) break;
    if (braid_time_sec() - start >= timeout_sec || (abort_flag && *abort_flag)) break;
    usleep(10 * 1000);
  }
  return braid_err(ncclSystemError,
                   "rank %d cannot reach rank %u's descriptor service to map its GPU memory (%s): "
                   "the process is gone, or in another network namespace, where handles cannot "
                   "be passed: set "
                   "NCCL_CUMEM_ENABLE=0 (legacy CUDA IPC, needs every GPU visible) or "
                   "NCCL_P2P_DISABLE=1 (through host memory, slower)",
                   my_rank, desc->owner_rank, abort_flag && *abort_flag ? "aborted" : strerror(err));
}
