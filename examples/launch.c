/*
 * Starting N ranks on one host and sharing the NCCL unique id, without MPI
 * (see launch.h for the calling order).
 *
 * Self-launch: the parent makes one pipe per non-zero rank, forks the ranks
 * and waits. It never touches CUDA or NCCL: a CUDA context does not survive
 * fork(), so every CUDA call happens in the children. Each child asks the
 * kernel to kill it if the parent dies (so a test timeout that kills the
 * parent ends the ranks too), and when one rank fails the parent stops the
 * others instead of leaving them blocked in a collective.
 */
#define _GNU_SOURCE
#include "launch.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

#define ID_WAIT_SECONDS 120

static int env_int(const char* name, int fallback) {
  const char* v = getenv(name);
  return v && *v ? atoi(v) : fallback;
}

const char* example_arg(int argc, char** argv, const char* name) {
  for (int i = 1; i + 1 < argc; i++)
    if (strcmp(argv[i], name) == 0) return argv[i + 1];
  return NULL;
}

void example_args_check(int argc, char** argv, const char* const* known, const char* usage) {
  for (int i = 1; i < argc; i += 2) {
    int found = 0;
    for (const char* const* k = known; *k && !found; k++) found = strcmp(argv[i], *k) == 0;
    if (!found || i + 1 >= argc) {
      fprintf(stderr, "%s: unexpected argument '%s'\nusage: %s %s\n", argv[0], argv[i], argv[0],
              usage);
      exit(2);
    }
  }
}

/* Waits for all children. The first one to fail decides the parent's status,
 * and the others are then sent SIGTERM: they may be blocked in a collective
 * waiting for the rank that ended (their own ends no longer count). The skip
 * code is not a failure: every rank makes the same check, so all skip. */
static int launch_wait(pid_t* pids, int n) {
  int result = 0, left = n;
  while (left > 0) {
    int status;
    pid_t pid = waitpid(-1, &status, 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      perror("waitpid");
      return 1;
    }
    int rank = -1;
    for (int r = 0; r < n; r++)
      if (pids[r] == pid) rank = r;
    if (rank < 0) continue;
    left--;
    pids[rank] = 0; /* reaped: never signal this pid again */
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (code == 0) continue;
    if (code == EXAMPLE_EXIT_SKIP) { /* the others skip too: let them say why */
      if (result == 0) result = code;
      continue;
    }
    if (result != 0 && result != EXAMPLE_EXIT_SKIP) continue; /* a rank we stopped */
    result = code;
    fprintf(stderr, "rank %d ended with status %d; stopping the other ranks\n", rank, code);
    for (int r = 0; r < n; r++)
      if (pids[r] > 0) kill(pids[r], SIGTERM);
  }
  return result;
}

static void launch_self(example_world_t* w, int nranks) {
  int(*fds)[2] = calloc((size_t)nranks, sizeof(*fds));
  pid_t* pids = calloc((size_t)nranks, sizeof(*pids));
  w->id_fds = calloc((size_t)nranks, sizeof(int));
  if (!fds || !pids || !w->id_fds) {
    perror("calloc");
    exit(1);
  }
  for (int r = 1; r < nranks; r++)
    if (pipe(fds[r]) != 0) {
      perror("pipe");
      exit(1);
    }
  fflush(stdout);
  fflush(stderr);
  pid_t parent = getpid();
  for (int r = 0; r < nranks; r++) {
    pids[r] = fork();
    if (pids[r] < 0) {
      perror("fork");
      exit(1);
    }
    if (pids[r] > 0) continue;
    /* Child: keep rank 0's write ends, or this rank's read end. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    for (int q = 1; q < nranks; q++) {
      if (r == 0) {
        close(fds[q][0]);
        w->id_fds[q] = fds[q][1];
      } else {
        close(fds[q][1]);
        if (q == r)
          w->id_fds[q] = fds[q][0];
        else
          close(fds[q][0]);
      }
    }
    free(fds);
    free(pids);
    w->rank = w->local_rank = r;
    w->nranks = w->local_nranks = nranks;
    w->self_launched = 1;
    return;
  }
  for (int r = 1; r < nranks; r++) {
    close(fds[r][0]);
    close(fds[r][1]);
  }
  free(fds);
  free(w->id_fds);
  int result = launch_wait(pids, nranks);
  free(pids);
  exit(result);
}

void example_world_init(example_world_t* w, int argc, char** argv) {
  memset(w, 0, sizeof(*w));
  const char* slash = strrchr(argv[0], '/');
  w->prog = slash ? slash + 1 : argv[0];
  const char* id_file = example_arg(argc, argv, "--id-file");
  if (getenv("OMPI_COMM_WORLD_RANK")) { /* Open MPI */
    w->rank = env_int("OMPI_COMM_WORLD_RANK", 0);
    w->nranks = env_int("OMPI_COMM_WORLD_SIZE", 1);
    w->local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", w->rank);
    w->local_nranks = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", w->nranks);
  } else if (getenv("PMI_RANK")) { /* MPICH, Intel MPI (Hydra) */
    w->rank = env_int("PMI_RANK", 0);
    w->nranks = env_int("PMI_SIZE", 1);
    w->local_rank = env_int("MPI_LOCALRANKID", w->rank);
    w->local_nranks = env_int("MPI_LOCALNRANKS", w->nranks);
  } else {
    const char* n = example_arg(argc, argv, "--nranks");
    int nranks = n ? atoi(n) : 2;
    if (nranks < 1 || nranks > 1024) {
      fprintf(stderr, "%s: --nranks must be between 1 and 1024\n", w->prog);
      exit(2);
    }
    launch_self(w, nranks);
    return;
  }
  /* Under mpirun the ranks on one host share their launcher (the parent
   * process) and, with Open MPI, a job name: together they name the file. */
  if (id_file)
    snprintf(w->id_path, sizeof(w->id_path), "%s", id_file);
  else
    snprintf(w->id_path, sizeof(w->id_path), "/tmp/%s-%s-%d.ncclid", w->prog,
             getenv("PMIX_NAMESPACE") ? getenv("PMIX_NAMESPACE") : "job", (int)getppid());
}

int example_gpu_select(example_world_t* w) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) {
    (void)cudaGetLastError();
    count = 0;
  } else {
    CUDA_CHECK(err);
  }
  /* One visible GPU under mpirun with CUDA_VISIBLE_DEVICES set: each rank was
   * given its own GPU. Otherwise the ranks of this host share its GPUs, one each. */
  int needed = w->local_nranks;
  if (count == 1 && !w->self_launched && getenv("CUDA_VISIBLE_DEVICES")) needed = 1;
  if (count < needed) {
    if (w->rank == 0)
      printf("%s: SKIP: needs %d GPU%s, %d visible%s\n", w->prog, needed, needed > 1 ? "s" : "",
             count,
             err == cudaErrorNoDevice             ? " (no CUDA device)"
             : err == cudaErrorInsufficientDriver ? " (no CUDA driver, or one too old)"
                                                  : "");
    fflush(stdout);
    example_unique_id_done(w); /* nothing to share: the id's pipes go */
    exit(EXAMPLE_EXIT_SKIP);
  }
  int dev = w->local_rank % count;
  CUDA_CHECK(cudaSetDevice(dev));
  return dev;
}

static void write_all(int fd, const void* buf, size_t len, const char* what) {
  const char* p = buf;
  while (len > 0) {
    ssize_t n = write(fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      perror(what);
      exit(1);
    }
    p += n;
    len -= (size_t)n;
  }
}

static int read_all(int fd, void* buf, size_t len) {
  char* p = buf;
  while (len > 0) {
    ssize_t n = read(fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return -1;
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

/* Rank 0 writes a temporary file and renames it, so a reader sees all of the
 * id or nothing. */
static void id_file_write(const example_world_t* w, const ncclUniqueId* id) {
  char tmp[600];
  snprintf(tmp, sizeof(tmp), "%s.%d.tmp", w->id_path, (int)getpid());
  FILE* f = fopen(tmp, "wb");
  if (!f || fwrite(id, sizeof(*id), 1, f) != 1 || fclose(f) != 0 || rename(tmp, w->id_path)) {
    fprintf(stderr, "%s: cannot write %s: %s\n", w->prog, w->id_path, strerror(errno));
    exit(1);
  }
}

static void id_file_read(const example_world_t* w, ncclUniqueId* id) {
  for (int tries = 0; tries < ID_WAIT_SECONDS * 100; tries++) {
    FILE* f = fopen(w->id_path, "rb");
    if (f) {
      size_t n = fread(id, sizeof(*id), 1, f);
      fclose(f);
      if (n == 1) return;
    }
    struct timespec ten_ms = {0, 10 * 1000 * 1000};
    nanosleep(&ten_ms, NULL);
  }
  fprintf(stderr, "%s: rank %d: no unique id in %s after %d s\n", w->prog, w->rank, w->id_path,
          ID_WAIT_SECONDS);
  exit(1);
}

void example_unique_id_share(example_world_t* w, ncclUniqueId* id) {
  if (w->rank == 0) NCCL_CHECK(ncclGetUniqueId(id));
  if (!w->self_launched) {
    if (w->rank == 0)
      id_file_write(w, id);
    else
      id_file_read(w, id);
    return;
  }
  if (w->rank == 0) {
    for (int r = 1; r < w->nranks; r++) {
      write_all(w->id_fds[r], id, sizeof(*id), "write unique id");
      close(w->id_fds[r]);
    }
  } else {
    if (read_all(w->id_fds[w->rank], id, sizeof(*id)) != 0) {
      fprintf(stderr, "%s: rank %d: rank 0 ended before sending the unique id\n", w->prog, w->rank);
      exit(1);
    }
    close(w->id_fds[w->rank]);
  }
}

void example_unique_id_done(example_world_t* w) {
  if (!w->self_launched && w->rank == 0) unlink(w->id_path);
  free(w->id_fds);
  w->id_fds = NULL;
}
