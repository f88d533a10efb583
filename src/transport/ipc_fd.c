/*
 * The descriptor service (see ipc.h): one thread per process, on an abstract Unix socket, that
 * hands each exported cuMem descriptor to a process of the same user presenting its token;
 * the exports it serves; and the fetch, a peer's side of it, with pidfd_getfd where the
 * socket cannot be reached.
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
#include <strings.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/un.h>
#include <unistd.h>

#include "base/debug.h"
#include "base/error.h"
#include "base/param.h"
#include "base/utils.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434 /* Linux 5.3, the same number on every architecture */
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438 /* Linux 5.6 */
#endif

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

static uint64_t ipc_net_ns(void);
static void ipc_self(uint64_t* start, uint64_t* net_ns);
/* The self-check's verdict on passing descriptors over this process's socket (ipc_fd_socket_works):
 * 0 not asked yet, 1 they pass, -1 they do not (peers then take them with pidfd_getfd). Read
 * and written with atomics; a forked child asks again. */
static int socket_verdict;
static pid_t socket_verdict_pid;
static int ipc_socket_refused(void) {
  return __atomic_load_n(&socket_verdict_pid, __ATOMIC_ACQUIRE) == getpid() &&
         __atomic_load_n(&socket_verdict, __ATOMIC_RELAXED) < 0;
}

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
  /* No service to ask where this process takes and gives descriptors by pidfd_getfd only. */
  desc->u.cumem.service = ipc_fd_passing() == IPC_PASS_PIDFD || ipc_socket_refused() ? 0 : svc.id;
  pthread_mutex_unlock(&svc.lock);
  memcpy(desc->u.cumem.token, e->token, sizeof e->token);
  desc->u.cumem.pid = (int32_t)getpid();
  desc->u.cumem.fd = fd;
  ipc_self(&desc->u.cumem.start, &desc->u.cumem.net_ns);
  struct stat st;
  if (fstat(fd, &st) == 0) {
    desc->u.cumem.file_dev = (uint64_t)st.st_dev;
    desc->u.cumem.file_ino = (uint64_t)st.st_ino;
  }
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
 * This process's identity as offers carry it: its start time and network namespace (inode), 0
 * when unknown. Read once a process (again in a forked child): a communicator offers dozens of
 * buffers, and each read is a file in /proc.
 */
static struct {
  pthread_mutex_t lock;
  pid_t pid;
  uint64_t start, net_ns;
} self_id = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void ipc_self(uint64_t* start, uint64_t* net_ns) {
  pthread_mutex_lock(&self_id.lock);
  if (self_id.pid != getpid()) {
    struct stat st;
    self_id.pid = getpid();
    self_id.start = braid_process_start(self_id.pid);
    self_id.net_ns = stat("/proc/self/ns/net", &st) == 0 ? (uint64_t)st.st_ino : 0;
  }
  if (start) *start = self_id.start;
  if (net_ns) *net_ns = self_id.net_ns;
  pthread_mutex_unlock(&self_id.lock);
}

static uint64_t ipc_net_ns(void) {
  uint64_t ns;
  ipc_self(NULL, &ns);
  return ns;
}

/*
 * Asks the owner's descriptor service for the export's descriptor. Waits at
 * most ipc_fetch_timeout() for the service (it answers at once when its
 * process runs), less when the abort flag rises or the owner's process is
 * found gone.
 */
static ncclResult_t ipc_fd_fetch_socket(const struct ipc_desc* desc, int my_rank,
                                        volatile uint32_t* abort_flag, int* out_fd) {
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
                   "the process is gone, or in another network namespace while "
                   "BRAID_IPC_FD_PASSING=socket forbids pidfd_getfd: set "
                   "NCCL_CUMEM_ENABLE=0 (legacy CUDA IPC, needs every GPU visible) or "
                   "NCCL_P2P_DISABLE=1 (through host memory, slower)",
                   my_rank, desc->owner_rank, abort_flag && *abort_flag ? "aborted" : strerror(err));
}

/*
 * Whether descriptors pass over this process's own service: a pipe offered and fetched back. A
 * seccomp profile that forbids sendmsg or recvmsg, or a security module that forbids passing
 * descriptors, fails here rather than at a peer's first mapping. Once a process (again in a
 * forked child, whose service is its own).
 */
int ipc_fd_socket_works(char* why, size_t why_size) {
  static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
  static char reason[200];
  pthread_mutex_lock(&lock);
  if (__atomic_load_n(&socket_verdict_pid, __ATOMIC_ACQUIRE) != getpid()) {
    int p[2] = {-1, -1}, got = -1, ok = 0;
    struct ipc_desc d;
    struct ipc_export* e = NULL;
    struct stat a, b;
    char before[BRAID_ERROR_MAX];
    snprintf(before, sizeof before, "%s", braid_err_last());
    memset(&d, 0, sizeof d);
    braid_err_probing(1); /* a failure is reported below, once, by the caller */
    if (pipe2(p, O_CLOEXEC) != 0) {
      snprintf(reason, sizeof reason, "pipe2 failed: %s", strerror(errno));
    } else if (ipc_fd_offer(p[0], &d, &e) != ncclSuccess) {
      snprintf(reason, sizeof reason, "%s", braid_err_last());
    } else {
      pthread_mutex_lock(&svc.lock);
      d.u.cumem.service = svc.id; /* whatever BRAID_IPC_FD_PASSING says: the socket is tried */
      pthread_mutex_unlock(&svc.lock);
      if (ipc_fd_fetch_socket(&d, 0, NULL, &got) != ncclSuccess)
        snprintf(reason, sizeof reason, "%s", braid_err_last());
      else if (fstat(got, &a) != 0 || fstat(p[0], &b) != 0 || a.st_ino != b.st_ino)
        snprintf(reason, sizeof reason, "its service handed over another descriptor");
      else
        ok = 1;
      ipc_fd_withdraw(e);
    }
    braid_err_probing(0);
    braid_err_restore(before);
    for (int i = 0; i < 2; i++)
      if (p[i] >= 0) close(p[i]);
    if (got >= 0) close(got);
    __atomic_store_n(&socket_verdict, ok ? 1 : -1, __ATOMIC_RELAXED);
    __atomic_store_n(&socket_verdict_pid, getpid(), __ATOMIC_RELEASE);
  }
  const int r = __atomic_load_n(&socket_verdict, __ATOMIC_RELAXED) > 0;
  if (!r) snprintf(why, why_size, "%s", reason);
  pthread_mutex_unlock(&lock);
  return r;
}

/* ---- pidfd_getfd: the descriptor taken from the owner's process, with the kernel's leave. ---- */

int ipc_fd_passing(void) {
  const char* v = braid_param_str(BRAID_P_IPC_FD_PASSING);
  if (v == NULL || v[0] == '\0' || strcasecmp(v, "auto") == 0) return IPC_PASS_AUTO;
  if (strcasecmp(v, "socket") == 0) return IPC_PASS_SOCKET;
  if (strcasecmp(v, "pidfd") == 0) return IPC_PASS_PIDFD;
  static int warned;
  if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
    WARN("BRAID_IPC_FD_PASSING=%s is not auto, socket or pidfd; using auto", v);
  return IPC_PASS_AUTO;
}

/* Whether this process holds CAP_SYS_PTRACE (which passes kernel.yama.ptrace_scope 1 and 2). */
static int ipc_may_trace_any(void) {
  FILE* f = fopen("/proc/self/status", "r");
  char line[256];
  unsigned long long caps = 0;
  int found = 0;
  if (f == NULL) return 0;
  while (!found && fgets(line, sizeof line, f))
    found = sscanf(line, "CapEff: %llx", &caps) == 1;
  fclose(f);
  return found && (caps >> 19 & 1); /* CAP_SYS_PTRACE */
}

static struct {
  pthread_once_t once;
  int ok;
  char why[160];
} pidfd_state = {.once = PTHREAD_ONCE_INIT};

static void ipc_pidfd_probe(void) {
  /* The calls themselves, on this process: a kernel before 5.6 or a seccomp filter says no. */
  int pfd = (int)syscall(SYS_pidfd_open, getpid(), 0);
  if (pfd < 0) {
    snprintf(pidfd_state.why, sizeof pidfd_state.why, "pidfd_open failed: %s", strerror(errno));
    return;
  }
  int dup = (int)syscall(SYS_pidfd_getfd, pfd, pfd, 0);
  const int err = errno;
  close(pfd);
  if (dup < 0) {
    snprintf(pidfd_state.why, sizeof pidfd_state.why, "pidfd_getfd failed: %s", strerror(err));
    return;
  }
  close(dup);
  /* A peer of the same user may take descriptors only from a dumpable process, and under Yama
   * (ptrace_scope 1 and up) only with CAP_SYS_PTRACE, as ranks are not each other's ancestors. */
  if (prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) != 1) {
    snprintf(pidfd_state.why, sizeof pidfd_state.why, "the process is not dumpable");
    return;
  }
  FILE* f = fopen("/proc/sys/kernel/yama/ptrace_scope", "r");
  int scope = 0;
  if (f != NULL) {
    if (fscanf(f, "%d", &scope) != 1) scope = 0;
    fclose(f);
  }
  if (scope >= 3 || (scope > 0 && !ipc_may_trace_any())) {
    snprintf(pidfd_state.why, sizeof pidfd_state.why, "kernel.yama.ptrace_scope is %d%s", scope,
             scope >= 3 ? " (no process may attach)" : " and the process lacks CAP_SYS_PTRACE");
    return;
  }
  pidfd_state.ok = 1;
}

int ipc_pidfd_usable(char* why, size_t why_size) {
  if (ipc_fd_passing() == IPC_PASS_SOCKET) {
    snprintf(why, why_size, "BRAID_IPC_FD_PASSING=socket");
    return 0;
  }
  pthread_once(&pidfd_state.once, ipc_pidfd_probe);
  if (!pidfd_state.ok) snprintf(why, why_size, "%s", pidfd_state.why);
  return pidfd_state.ok;
}

/* Takes the descriptor the owner offered straight from its process. */
static ncclResult_t ipc_fd_take(const struct ipc_desc* desc, int my_rank, int* out_fd) {
  const int pid = desc->u.cumem.pid, fd = desc->u.cumem.fd;
  const unsigned owner = desc->owner_rank;
  if (pid <= 0 || fd < 0 || desc->u.cumem.start == 0)
    return braid_err(ncclInternalError, "rank %d: rank %u offered no descriptor to take with "
                     "pidfd_getfd (pid %d, descriptor %d%s)", my_rank, owner, pid, fd,
                     desc->u.cumem.start == 0 ? ", its start time unknown" : "");
  int pfd = (int)syscall(SYS_pidfd_open, pid, 0);
  if (pfd < 0) {
    const int err = errno;
    return braid_err(err == ESRCH ? ncclRemoteError : ncclSystemError,
                     "rank %d cannot open rank %u's process (pid %d) to take its memory "
                     "descriptor: pidfd_open: %s%s", my_rank, owner, pid, strerror(err),
                     err == ESRCH ? " (the process is gone)" : "");
  }
  /* The pid may name another process by now: the one opened must have started when the owner's
   * did. From here the pidfd holds that process, whatever happens to the number. */
  if (braid_process_start(pid) != desc->u.cumem.start) {
    close(pfd);
    return braid_err(ncclRemoteError, "rank %d: rank %u's process (pid %d) is gone: the pid now "
                     "names another process", my_rank, owner, pid);
  }
  int got = (int)syscall(SYS_pidfd_getfd, pfd, fd, 0); /* close-on-exec, as the call makes it */
  const int err = errno;
  close(pfd);
  if (got < 0) {
    const int gone = err == ESRCH || braid_process_gone(pid, desc->u.cumem.start);
    return braid_err(gone ? ncclRemoteError : ncclSystemError,
                     "rank %d cannot take rank %u's memory descriptor (pid %d, descriptor %d) with "
                     "pidfd_getfd: %s%s", my_rank, owner, pid, fd, strerror(err),
                     gone ? " (the process is gone)"
                     : err == EPERM ? ". This process may not trace that one "
                                      "(kernel.yama.ptrace_scope, different groups, or a "
                                      "security module): set NCCL_P2P_DISABLE=1 (through host "
                                      "memory, slower)"
                                    : "");
  }
  /* The number must still name the file offered. Every cuMem export is the driver's control
   * file to fstat, so this catches a number reused by any other file, not by another export;
   * owners keep their exports open until their communicator is destroyed. */
  struct stat st;
  if (desc->u.cumem.file_ino != 0 &&
      (fstat(got, &st) != 0 || (uint64_t)st.st_dev != desc->u.cumem.file_dev ||
       (uint64_t)st.st_ino != desc->u.cumem.file_ino)) {
    close(got);
    return braid_err(ncclRemoteError, "rank %d: rank %u's descriptor %d no longer names the memory "
                     "it offered (freed already?)", my_rank, owner, fd);
  }
  *out_fd = got;
  return ncclSuccess;
}

/*
 * The owner's service where its socket can be reached (the same network namespace, and
 * descriptors pass over sockets in both processes); else, or with BRAID_IPC_FD_PASSING=pidfd,
 * the descriptor taken from its process: the same rule as ipc_choose's. A service that does not
 * answer in the owner's own namespace means the owner is gone: no pidfd_getfd then.
 */
ncclResult_t ipc_fd_fetch(const struct ipc_desc* desc, int my_rank, volatile uint32_t* abort_flag,
                          int* out_fd) {
  const int mode = ipc_fd_passing();
  const uint64_t ns = ipc_net_ns();
  const int same_ns = desc->u.cumem.net_ns == ns;
  if (desc->u.cumem.service != 0 && mode != IPC_PASS_PIDFD && !ipc_socket_refused() &&
      (same_ns || mode == IPC_PASS_SOCKET))
    return ipc_fd_fetch_socket(desc, my_rank, abort_flag, out_fd);
  static int logged; /* once a process: a communicator maps dozens of buffers */
  if (!__atomic_exchange_n(&logged, 1, __ATOMIC_RELAXED))
    INFO(BRAID_LOG_INIT | BRAID_LOG_P2P,
         "rank %d takes rank %u's memory descriptor with pidfd_getfd (%s)", my_rank,
         desc->owner_rank,
         !same_ns                        ? "the owner is in another network namespace"
         : mode == IPC_PASS_PIDFD        ? "BRAID_IPC_FD_PASSING=pidfd"
         : desc->u.cumem.service == 0    ? "the owner offers no service: BRAID_IPC_FD_PASSING="
                                           "pidfd there, or its socket failed the self-check"
                                         : "this process's socket failed the self-check");
  return ipc_fd_take(desc, my_rank, out_fd);
}
