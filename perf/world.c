/*
 * The single-process and the self-launched (fork) worlds, and what every
 * world shares: launcher detection and the per-host index.
 *
 * Fork world ownership: the launcher maps the shared area and creates its
 * process-shared barrier before forking; children only use it; the launcher
 * unmaps it after the last child is reaped. A child that dies leaves the
 * others blocked in the barrier, so the launcher, which reaps every child,
 * stops them (SIGTERM, then SIGKILL) and reports who failed.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "world.h"

/* ---- single --------------------------------------------------------------- */

static int single_barrier(perf_world_t* w) { return 0; }

static int single_allgather(perf_world_t* w, const void* mine, void* all, size_t len) {
  memmove(all, mine, len);
  return 0;
}

static void single_finish(perf_world_t* w, int exit_code) {}

static const perf_world_ops_t single_ops = {
    .size = sizeof(perf_world_ops_t),
    .name = "single",
    .barrier = single_barrier,
    .allgather = single_allgather,
    .finish = single_finish,
};

void perf_world_single(perf_world_t* w) {
  w->ops = &single_ops;
  w->proc = 0;
  w->nprocs = 1;
  w->state = NULL;
}

/* ---- fork ----------------------------------------------------------------- */

/* Bytes each process may publish per barrier round; allgather loops over it. */
#define FORK_SLOT_BYTES 16384

typedef struct fork_shared {
  pthread_barrier_t barrier;
  int nprocs;
  unsigned char slots[]; /* nprocs * FORK_SLOT_BYTES */
} fork_shared_t;

static int fork_barrier(perf_world_t* w) {
  fork_shared_t* s = w->state;
  int rc = pthread_barrier_wait(&s->barrier);
  if (rc != 0 && rc != PTHREAD_BARRIER_SERIAL_THREAD) {
    fprintf(stderr, "perf: process %d: pthread_barrier_wait failed: %s\n", w->proc, strerror(rc));
    return -1;
  }
  return 0;
}

static int fork_allgather(perf_world_t* w, const void* mine, void* all, size_t len) {
  fork_shared_t* s = w->state;
  for (size_t done = 0; done < len; done += FORK_SLOT_BYTES) {
    size_t n = len - done < FORK_SLOT_BYTES ? len - done : FORK_SLOT_BYTES;
    memcpy(s->slots + (size_t)w->proc * FORK_SLOT_BYTES, (const char*)mine + done, n);
    if (fork_barrier(w) != 0) return -1;
    for (int p = 0; p < s->nprocs; p++)
      memcpy((char*)all + (size_t)p * len + done, s->slots + (size_t)p * FORK_SLOT_BYTES, n);
    /* No one may overwrite a slot before everyone has read this round. */
    if (fork_barrier(w) != 0) return -1;
  }
  return 0;
}

static void fork_finish(perf_world_t* w, int exit_code) {
  /* The launcher reaps us; a failure code makes it stop the others. */
  fflush(stdout);
  fflush(stderr);
}

static const perf_world_ops_t fork_ops = {
    .size = sizeof(perf_world_ops_t),
    .name = "fork",
    .barrier = fork_barrier,
    .allgather = fork_allgather,
    .finish = fork_finish,
};

static double fork_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void fork_signal_all(const pid_t* pids, const int* alive, int n, int sig) {
  for (int i = 0; i < n; i++)
    if (alive[i]) kill(pids[i], sig);
}

/* What one reaped child says about the run: its exit code, or a failure
   (with a line on stderr) when a signal ended it. */
static int fork_child_code(int proc, pid_t pid, int status, int stopped_by_us) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (!stopped_by_us)
    fprintf(stderr, "perf: process %d (pid %d) was killed by signal %d (%s)\n", proc, (int)pid,
            WTERMSIG(status), strsignal(WTERMSIG(status)));
  return PERF_EXIT_FAILED;
}

/* Waits for every child. The first failure (exit >= 2 or a signal) stops the
   others: SIGTERM, and SIGKILL 10 s later. Returns the run's exit code. */
static int fork_supervise(const pid_t* pids, int n) {
  int* alive = calloc((size_t)n, sizeof(int));
  if (!alive) return PERF_EXIT_FAILED;
  for (int i = 0; i < n; i++) alive[i] = 1;
  int remaining = n, code = PERF_EXIT_OK, stopping = 0, killed = 0;
  double stop_time = 0;
  while (remaining > 0) {
    int status;
    pid_t pid = waitpid(-1, &status, stopping ? WNOHANG : 0);
    if (pid < 0 && errno == EINTR) continue;
    if (pid < 0) break; /* ECHILD: nothing left to wait for */
    if (pid == 0) {     /* stopping, and some still run */
      if (!killed && fork_now() - stop_time > 10.0) {
        fork_signal_all(pids, alive, n, SIGKILL);
        killed = 1;
      }
      usleep(20000);
      continue;
    }
    int proc = 0;
    while (proc < n && pids[proc] != pid) proc++;
    if (proc == n) continue;
    alive[proc] = 0;
    remaining--;
    int c = fork_child_code(proc, pid, status, stopping);
    if (c != PERF_EXIT_OK && code == PERF_EXIT_OK) code = c;
    if (c >= PERF_EXIT_USAGE && !stopping) {
      fprintf(stderr, "perf: process %d failed (exit %d); stopping the other %d\n", proc, c,
              remaining);
      fork_signal_all(pids, alive, n, SIGTERM);
      stopping = 1;
      stop_time = fork_now();
    }
  }
  free(alive);
  return code;
}

int perf_world_fork(perf_world_t* w, int nprocs, int* launcher_exit) {
  size_t bytes = sizeof(fork_shared_t) + (size_t)nprocs * FORK_SLOT_BYTES;
  fork_shared_t* s = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (s == MAP_FAILED) {
    fprintf(stderr, "perf: -p %d: mmap of %zu shared bytes failed: %s\n", nprocs, bytes,
            strerror(errno));
    return -1;
  }
  pthread_barrierattr_t attr;
  pthread_barrierattr_init(&attr);
  pthread_barrierattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  int rc = pthread_barrier_init(&s->barrier, &attr, (unsigned)nprocs);
  pthread_barrierattr_destroy(&attr);
  if (rc != 0) {
    fprintf(stderr, "perf: -p %d: pthread_barrier_init failed: %s\n", nprocs, strerror(rc));
    munmap(s, bytes);
    return -1;
  }
  s->nprocs = nprocs;
  pid_t* pids = calloc((size_t)nprocs, sizeof(pid_t));
  if (!pids) goto fail_barrier;
  fflush(stdout);
  fflush(stderr);
  pid_t launcher = getpid();
  for (int p = 0; p < nprocs; p++) {
    pid_t pid = fork();
    if (pid < 0) {
      fprintf(stderr, "perf: -p %d: fork of process %d failed: %s\n", nprocs, p, strerror(errno));
      for (int q = 0; q < p; q++) kill(pids[q], SIGKILL);
      for (int q = 0; q < p; q++) waitpid(pids[q], NULL, 0);
      free(pids);
      munmap(s, bytes); /* children may have entered the barrier: no destroy */
      return -1;
    }
    if (pid == 0) {
      /* A child must not outlive a launcher that was killed. */
      prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (getppid() != launcher) _exit(PERF_EXIT_FAILED);
      free(pids);
      w->ops = &fork_ops;
      w->proc = p;
      w->nprocs = nprocs;
      w->state = s;
      return 0;
    }
    pids[p] = pid;
  }
  *launcher_exit = fork_supervise(pids, nprocs);
  free(pids);
  /* No pthread_barrier_destroy: it waits for waiters to leave, and a child
     stopped inside the barrier never leaves. Unmapping is enough. */
  munmap(s, bytes);
  return 1;

fail_barrier:
  pthread_barrier_destroy(&s->barrier);
  munmap(s, bytes);
  return -1;
}

/* ---- shared by every world ---------------------------------------------- */

const char* perf_world_launcher(int* size) {
  static const char* const vars[][2] = {
      {"OMPI_COMM_WORLD_SIZE", "Open MPI"}, {"PMIX_SIZE", "PMIx"},        {"PMI_SIZE", "PMI"},
      {"MV2_COMM_WORLD_SIZE", "MVAPICH2"},  {"MPI_LOCALNRANKS", "MPICH"}, {"PMIX_RANK", "PMIx"},
      {"PMI_RANK", "PMI"}};
  for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
    const char* v = getenv(vars[i][0]);
    if (v && *v) {
      *size = strstr(vars[i][0], "SIZE") || strstr(vars[i][0], "NRANKS") ? atoi(v) : 0;
      return vars[i][1];
    }
  }
  return NULL;
}

/*
 * Hostname plus boot id: two containers with one hostname still differ. A
 * host id given to the library (BRAID_HOSTID, or NCCL's NCCL_HOSTID) wins, as
 * it does there, so processes posing as separate hosts on one machine each
 * count as the first of their host and take GPU 0 (tools/as-host.sh).
 */
static uint64_t perf_host_hash(void) {
  char id[512] = {0};
  const char* forced = getenv("BRAID_HOSTID");
  if (!forced || !*forced) forced = getenv("NCCL_HOSTID");
  if (forced && *forced) {
    snprintf(id, sizeof id, "hostid:%s", forced);
  } else {
    gethostname(id, 255);
    FILE* f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
      size_t len = strlen(id);
      if (!fgets(id + len, (int)(sizeof(id) - len), f)) id[len] = '\0';
      fclose(f);
    }
  }
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (const char* p = id; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
  return h;
}

/*
 * Processes posing as other GPUs of a topology file (BRAID_TOPO_BUSID, a
 * testing mode of the library: tools/as-gpu.sh) all share the first GPU.
 */
int perf_world_local_index(perf_world_t* w, int* local_index) {
  uint64_t mine = perf_host_hash();
  uint64_t* all = calloc((size_t)w->nprocs, sizeof(uint64_t));
  if (!all) return -1;
  int rc = w->ops->allgather(w, &mine, all, sizeof(mine));
  int index = 0;
  for (int p = 0; p < w->proc; p++) index += all[p] == mine;
  free(all);
  const char* posing = getenv("BRAID_TOPO_BUSID");
  *local_index = posing && *posing ? 0 : index;
  return rc;
}

#ifndef PERF_HAVE_MPI
int perf_world_mpi(perf_world_t* w, int* argc, char*** argv) {
  fprintf(stderr,
          "perf: this benchmark was built without MPI, so under mpirun every process would run\n"
          "      alone. Rebuild where CMake finds MPI (libopenmpi-dev), or run without mpirun:\n"
          "      -p N (N processes on this host) or -g N (one process, N GPUs).\n");
  return -1;
}
#endif
