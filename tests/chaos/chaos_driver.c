/*
 * The chaos test's driver (see chaos.h). Usage:
 *
 *   braid_chaos [--iters N] [--seed S] [--start I]
 *
 * or the same through CHAOS_ITERS (default 200), CHAOS_SEED (default: from the clock; printed,
 * so a failure can be replayed) and CHAOS_START (the first iteration's index: --seed S --start I
 * --iters 1 replays iteration I alone). CHAOS_RANKS caps the ranks (default: every GPU, at most
 * CHAOS_MAX_RANKS); CHAOS_FAULTS restricts the faults ("kill,stop,socket"); CHAOS_BAR_S is the
 * bar after a SIGKILL or a socket loss (default 3 s); CHAOS_STOP_TIMEOUT is BRAID_TIMEOUT in a
 * SIGSTOP iteration (default 5 s; its bar is that plus CHAOS_BAR_S).
 *
 * An iteration's mode is one of 36 combinations, taken in an order shuffled by the seed (so 36
 * iterations visit each once): the fault (SIGKILL, SIGSTOP, socket loss), every GPU visible to
 * every rank or CUDA_VISIBLE_DEVICES naming each rank's own, the killed victim reaped at once
 * or left a zombie until the survivors are done, and BRAID_TIMEOUT unset, 0 or 600 (SIGSTOP
 * iterations use CHAOS_STOP_TIMEOUT: a stopped process is not dead, only the hang verdict can
 * find it). The victim and the fault's time (0 to 1 s after every rank completed a batch) are
 * drawn from the seed and the iteration's index.
 *
 * The iteration passes when every survivor reported an error within the bar (ncclRemoteError
 * after a SIGKILL; any error after a SIGSTOP or a socket loss) and none before the fault,
 * ncclCommAbort returned ncclSuccess within CHAOS_ABORT_BAR_S, every survivor exited 0 by the
 * bar plus 30 s (else it is killed and counted a HANG), no file of the iteration's processes is
 * left in /dev/shm, and the driver holds as many descriptors as before. One line is printed per
 * iteration, then a summary. Exit status: 0 all passed, 1 a failure (or no iteration ran),
 * 77 fewer than two GPUs.
 */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime.h>

#include "chaos.h"

#define NCOMBOS 36
#define INIT_S 150.0      /* every rank ready by then (the ranks give up at 120 s) */
#define HANG_EXTRA_S 30.0 /* a survivor not gone by bar + this is killed: a HANG */
#define VICTIM_EXIT_S 10.0

static const char* const fault_names[CHAOS_NFAULTS] = {"SIGKILL", "SIGSTOP", "socket-loss"};
static const char* const timeout_names[3] = {"unset", "0", "600"};

struct options {
  long iters, start;
  uint64_t seed;
  int nranks;
  int faults[CHAOS_NFAULTS]; /* 1: this fault is drawn */
  double bar_s, stop_timeout_s;
  char visible[CHAOS_MAX_RANKS][32]; /* each rank's CUDA_VISIBLE_DEVICES when isolated */
  int order[NCOMBOS], norder;        /* the combinations drawn, in the seed's order */
  char self[4096];
};

struct mode {
  int fault, isolated, zombie, timeout, victim;
  double delay_s;
};

struct totals {
  long ran, passed, hangs, shm_leaks, fd_leaks;
  double worst_err[CHAOS_NFAULTS][3]; /* by fault and BRAID_TIMEOUT (SIGSTOP: [0] alone) */
  double worst_abort;
};

struct proc {
  pid_t pid;
  int reaped, status;
};

static uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

static double env_double(const char* name, double dflt) {
  const char* v = getenv(name);
  return v && *v ? strtod(v, NULL) : dflt;
}

/* Open descriptors of the driver (the listing's own excluded). */
static int count_fds(void) {
  DIR* d = opendir("/proc/self/fd");
  if (d == NULL) return -1;
  int n = 0;
  struct dirent* e;
  while ((e = readdir(d)) != NULL)
    if (e->d_name[0] != '.' && atoi(e->d_name) != dirfd(d)) n++;
  closedir(d);
  return n;
}

/*
 * The maker's pid of a /dev/shm name of the SHM transport: "braid-<pid>-r<rank>-..." or
 * "braid-<pid namespace>-<pid>-<start time>-r<rank>-..."; -1 for any other name.
 */
static int shm_name_pid(const char* name) {
  if (strncmp(name, "braid-", 6) != 0) return -1;
  char copy[256], *tok[8], *save = NULL;
  snprintf(copy, sizeof copy, "%s", name);
  int n = 0;
  for (char* t = strtok_r(copy, "-", &save); t && n < 8; t = strtok_r(NULL, "-", &save))
    tok[n++] = t;
  for (int k = 1; k < n; k++) {
    if (tok[k][0] != 'r' || tok[k][1] < '0' || tok[k][1] > '9') continue;
    if (k == 2) return atoi(tok[1]);
    if (k == 4) return atoi(tok[2]);
    return -1;
  }
  return -1;
}

/* Entries of /dev/shm named braid*; with `pids`, only those made by one of them. */
static int count_shm(const struct proc* pids, int npids, char* first, size_t first_size) {
  DIR* d = opendir("/dev/shm");
  if (d == NULL) return 0;
  int n = 0;
  struct dirent* e;
  while ((e = readdir(d)) != NULL) {
    if (strncmp(e->d_name, "braid", 5) != 0) continue;
    if (pids) {
      int who = shm_name_pid(e->d_name), ours = 0;
      for (int i = 0; i < npids; i++) ours |= who == pids[i].pid;
      if (!ours) continue;
    }
    if (n++ == 0 && first) snprintf(first, first_size, "%s", e->d_name);
  }
  closedir(d);
  return n;
}

/* How many GPUs a process sees, asked in a child so the driver never initializes CUDA. */
static int count_gpus(void) {
  pid_t pid = fork();
  if (pid == 0) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    _exit(n > 100 ? 100 : n);
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return 0;
  return WEXITSTATUS(status);
}

static void reap(struct proc* p, int block) {
  if (p->reaped || p->pid <= 0) return;
  if (waitpid(p->pid, &p->status, block ? 0 : WNOHANG) == p->pid) p->reaped = 1;
}

/* Waits up to `seconds` for `p` to be reaped. 1 when it was. */
static int reap_within(struct proc* p, double seconds) {
  for (double end = chaos_now() + seconds; !p->reaped && chaos_now() < end; usleep(5000))
    reap(p, 0);
  return p->reaped;
}

static pid_t spawn_rank(const struct options* o, const struct mode* m, int rank, int fd,
                        uint64_t ops_seed) {
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid != 0) return pid;
  /* The rank dies with the driver (a killed test leaves nothing running or stopped). */
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(3);
  int device = rank;
  if (m->isolated) {
    setenv("CUDA_VISIBLE_DEVICES", o->visible[rank], 1);
    device = 0;
  }
  char stop_timeout[32];
  snprintf(stop_timeout, sizeof stop_timeout, "%.0f", o->stop_timeout_s);
  if (m->fault == CHAOS_STOP)
    setenv("BRAID_TIMEOUT", stop_timeout, 1);
  else if (m->timeout == 0)
    unsetenv("BRAID_TIMEOUT");
  else
    setenv("BRAID_TIMEOUT", timeout_names[m->timeout], 1);
  char a_rank[16], a_nranks[16], a_fd[16], a_seed[32], a_dev[16];
  snprintf(a_rank, sizeof a_rank, "%d", rank);
  snprintf(a_nranks, sizeof a_nranks, "%d", o->nranks);
  snprintf(a_fd, sizeof a_fd, "%d", fd);
  snprintf(a_seed, sizeof a_seed, "%llu", (unsigned long long)ops_seed);
  snprintf(a_dev, sizeof a_dev, "%d", device);
  execl(o->self, o->self, "--rank", a_rank, a_nranks, a_fd, a_seed, a_dev, (char*)NULL);
  fprintf(stderr, "chaos: exec %s: %s\n", o->self, strerror(errno));
  _exit(3);
}

/* The iteration's mode: its combination from the seeded order, the victim and the delay. */
static struct mode pick_mode(const struct options* o, long iter) {
  struct mode m;
  int combo = o->order[iter % o->norder];
  m.fault = combo % 3;
  m.timeout = (combo / 3) % 3;
  m.isolated = (combo / 9) % 2;
  m.zombie = (combo / 18) % 2;
  uint64_t r = mix64(o->seed ^ mix64((uint64_t)iter + 1));
  m.victim = (int)(r % (uint64_t)o->nranks);
  m.delay_s = (double)(mix64(r) % 1000) / 1000.0;
  return m;
}

/* A result's name (ncclGetErrorString gives a sentence). */
static const char* result_name(int res) {
  static const char* const names[] = {
      "ncclSuccess",         "ncclUnhandledCudaError", "ncclSystemError", "ncclInternalError",
      "ncclInvalidArgument", "ncclInvalidUsage",       "ncclRemoteError", "ncclInProgress"};
  return res >= 0 && res < (int)(sizeof names / sizeof names[0]) ? names[res] : "ncclResult?";
}

/* Waits until every rank is ready; 0, or -1 with the reason in `why`. */
static int wait_ready(struct chaos_shared* sh, struct proc* p, int n, char* why, size_t size) {
  for (double end = chaos_now() + INIT_S;; usleep(10000)) {
    int ready = 0;
    for (int r = 0; r < n; r++) {
      ready += sh->slot[r].ready;
      reap(&p[r], 0);
      if (p[r].reaped && !sh->slot[r].ready) {
        snprintf(why, size, "rank %d ended before its first batch (%s: %s%s%s)", r,
                 sh->slot[r].where[0] ? sh->slot[r].where : "no account",
                 result_name(sh->slot[r].result), sh->slot[r].msg[0] ? ": " : "", sh->slot[r].msg);
        return -1;
      }
    }
    if (ready == n) return 0;
    if (chaos_now() > end) {
      snprintf(why, size, "%d of %d ranks ready after %.0f s", ready, n, INIT_S);
      return -1;
    }
  }
}

/* Delivers the fault; 0, or -1 with the reason. */
static int deliver(struct chaos_shared* sh, const struct mode* m, struct proc* victim, char* why,
                   size_t size) {
  static const int sig[CHAOS_NFAULTS] = {SIGKILL, SIGSTOP, SIGUSR2};
  sh->victim = m->victim;
  sh->fault_at = chaos_now();
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  if (kill(victim->pid, sig[m->fault]) != 0) {
    snprintf(why, size, "kill(%d): %s", (int)victim->pid, strerror(errno));
    return -1;
  }
  if (m->fault == CHAOS_KILL && !m->zombie && !reap_within(victim, VICTIM_EXIT_S)) {
    snprintf(why, size, "the victim was not gone %.0f s after SIGKILL", VICTIM_EXIT_S);
    return -1;
  }
  return 0;
}

/* Appends to the iteration's line. */
static void say(char* line, size_t size, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void say(char* line, size_t size, const char* fmt, ...) {
  size_t len = strlen(line);
  if (len + 1 >= size) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line + len, size - len, fmt, ap);
  va_end(ap);
}

/*
 * Waits for the survivors' exits (killing any left at the deadline), judges their accounts.
 * Returns the number of failures, written into `line`.
 */
static int judge_survivors(struct chaos_shared* sh, const struct mode* m, struct proc* p, int n,
                           struct totals* t, char* line, size_t size) {
  int fails = 0;
  double deadline = sh->fault_at + sh->bar_s + HANG_EXTRA_S;
  for (int r = 0; r < n; r++) {
    if (r == m->victim) continue;
    if (!reap_within(&p[r], deadline - chaos_now())) {
      kill(p[r].pid, SIGKILL);
      reap_within(&p[r], VICTIM_EXIT_S);
      say(line, size, " rank%d HANG (%s)", r, sh->slot[r].done ? "after its abort" : "no account");
      t->hangs++;
      fails++;
      continue;
    }
    struct chaos_slot* s = &sh->slot[r];
    if (!s->done) {
      say(line, size, " rank%d DIED (status 0x%x)", r, p[r].status);
      fails++;
      continue;
    }
    double tte = s->result != ncclSuccess ? s->err_at - sh->fault_at : -1.0;
    say(line, size, " rank%d %s", r, result_name(s->result));
    if (s->cuda_error) say(line, size, "+cuda:%s", cudaGetErrorName((cudaError_t)s->cuda_error));
    say(line, size, " %.3fs abort %.3fs (%d batches)", tte, s->abort_s, s->batches);
    int bad = 0;
    if (s->result == ncclSuccess) {
      say(line, size, " [no error by %.0f s]", sh->bar_s + CHAOS_GIVE_UP_S);
      bad = 1;
    } else if (s->early) {
      say(line, size, " [error before the fault: %s: %s]", s->where, s->msg);
      bad = 1;
    } else {
      double* worst = &t->worst_err[m->fault][m->fault == CHAOS_STOP ? 0 : m->timeout];
      if (tte > *worst) *worst = tte;
      if (tte > sh->bar_s) {
        say(line, size, " [over the %.0f s bar]", sh->bar_s);
        bad = 1;
      }
      if (m->fault == CHAOS_KILL && s->result != ncclRemoteError) {
        say(line, size, " [not ncclRemoteError: %s]", s->where);
        bad = 1;
      }
    }
    if (s->abort_s > t->worst_abort) t->worst_abort = s->abort_s;
    if (s->abort_s < 0 || s->abort_s > CHAOS_ABORT_BAR_S || s->abort_result != ncclSuccess) {
      say(line, size, " [abort %s in %.3f s]", result_name(s->abort_result), s->abort_s);
      bad = 1;
    }
    if (!WIFEXITED(p[r].status) || WEXITSTATUS(p[r].status) != 0) {
      say(line, size, " [exit status 0x%x]", p[r].status);
      bad = 1;
    }
    if (bad && s->msg[0]) say(line, size, " (\"%s\")", s->msg);
    fails += bad;
  }
  return fails;
}

/* The victim's end: a stopped one continued and killed, a live one given time, then killed. */
static void end_victim(struct chaos_shared* sh, const struct mode* m, struct proc* v, char* line,
                       size_t size) {
  if (m->fault == CHAOS_STOP) {
    kill(v->pid, SIGCONT);
    kill(v->pid, SIGKILL);
  } else if (m->fault == CHAOS_SOCKET) {
    struct chaos_slot* s = &sh->slot[m->victim];
    if (!reap_within(v, VICTIM_EXIT_S)) {
      kill(v->pid, SIGKILL);
      say(line, size, "; victim (%d sockets shut) still running, killed", s->sockets_shut);
    } else {
      say(line, size, "; victim (%d sockets shut) %s %.3fs", s->sockets_shut,
          result_name(s->result), s->result != ncclSuccess ? s->err_at - sh->fault_at : -1.0);
    }
  }
  reap_within(v, VICTIM_EXIT_S);
}

/* One iteration: 1 when it passed. */
static int iteration(const struct options* o, long iter, struct totals* t) {
  struct mode m = pick_mode(o, iter);
  char line[4096] = "", why[512] = "";
  int fds_before = count_fds(), shm_before = count_shm(NULL, 0, NULL, 0), fails = 0;
  say(line, sizeof line, "iter %ld: %s victim=%d %s %s BRAID_TIMEOUT=", iter, fault_names[m.fault],
      m.victim, m.isolated ? "isolated" : "all-visible", m.zombie ? "zombie" : "reaped");
  if (m.fault == CHAOS_STOP)
    say(line, sizeof line, "%.0f", o->stop_timeout_s);
  else
    say(line, sizeof line, "%s", timeout_names[m.timeout]);
  say(line, sizeof line, " delay=%.3fs:", m.delay_s);

  int fd = memfd_create("braid_chaos", 0);
  struct chaos_shared* sh = MAP_FAILED;
  if (fd < 0 || ftruncate(fd, sizeof *sh) != 0 ||
      (sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
    printf("%s memfd: %s FAIL\n", line, strerror(errno));
    if (fd >= 0) close(fd);
    return 0;
  }
  sh->victim = -1;
  sh->bar_s = m.fault == CHAOS_STOP ? o->stop_timeout_s + o->bar_s : o->bar_s;
  struct proc p[CHAOS_MAX_RANKS] = {{0}};
  uint64_t ops_seed = mix64(o->seed + 0x51ed270b27cf1f1bULL * (uint64_t)(iter + 1));
  for (int r = 0; r < o->nranks; r++) p[r].pid = spawn_rank(o, &m, r, fd, ops_seed);
  close(fd);

  int ok = wait_ready(sh, p, o->nranks, why, sizeof why) == 0;
  if (ok) {
    usleep((useconds_t)(m.delay_s * 1e6));
    for (int r = 0; r < o->nranks && ok; r++) {
      reap(&p[r], 0);
      if (p[r].reaped || sh->slot[r].done) {
        snprintf(why, sizeof why, "rank %d ended before the fault (%s: %s: %s)", r,
                 sh->slot[r].where, result_name(sh->slot[r].result), sh->slot[r].msg);
        ok = 0;
      }
    }
    ok = ok && deliver(sh, &m, &p[m.victim], why, sizeof why) == 0;
  }
  if (!ok) {
    say(line, sizeof line, " %s", why);
    fails++;
    for (int r = 0; r < o->nranks; r++) {
      kill(p[r].pid, SIGCONT);
      kill(p[r].pid, SIGKILL);
      reap_within(&p[r], VICTIM_EXIT_S);
    }
  } else {
    fails += judge_survivors(sh, &m, p, o->nranks, t, line, sizeof line);
    end_victim(sh, &m, &p[m.victim], line, sizeof line);
  }
  for (int r = 0; r < o->nranks; r++) {
    if (p[r].reaped) continue;
    kill(p[r].pid, SIGKILL);
    if (!reap_within(&p[r], VICTIM_EXIT_S)) {
      say(line, sizeof line, " [rank %d unkillable]", r);
      fails++;
    }
  }
  munmap(sh, sizeof *sh);

  char first[256] = "";
  int ours = count_shm(p, o->nranks, first, sizeof first);
  int shm_after = count_shm(NULL, 0, NULL, 0), fds_after = count_fds();
  say(line, sizeof line, "; /dev/shm braid* %d->%d", shm_before, shm_after);
  if (ours > 0) {
    say(line, sizeof line, " [%d file(s) of this iteration's ranks left: %s ...]", ours, first);
    t->shm_leaks++;
    fails++;
  }
  say(line, sizeof line, "; fds %d->%d", fds_before, fds_after);
  if (fds_after != fds_before) {
    say(line, sizeof line, " [descriptor leak]");
    t->fd_leaks++;
    fails++;
  }
  printf("%s: %s\n", line, fails ? "FAIL" : "PASS");
  fflush(stdout);
  return fails == 0;
}

static int parse_options(int argc, char** argv, struct options* o) {
  o->iters = (long)env_double("CHAOS_ITERS", 200);
  o->start = (long)env_double("CHAOS_START", 0);
  const char* seed = getenv("CHAOS_SEED");
  o->seed =
      seed && *seed ? strtoull(seed, NULL, 0) : mix64((uint64_t)time(NULL) ^ (uint64_t)getpid());
  o->bar_s = env_double("CHAOS_BAR_S", 3.0);
  o->stop_timeout_s = env_double("CHAOS_STOP_TIMEOUT", 5.0);
  for (int i = 1; i < argc; i++) {
    if (i + 1 < argc && strcmp(argv[i], "--iters") == 0) {
      o->iters = strtol(argv[++i], NULL, 0);
    } else if (i + 1 < argc && strcmp(argv[i], "--seed") == 0) {
      o->seed = strtoull(argv[++i], NULL, 0);
    } else if (i + 1 < argc && strcmp(argv[i], "--start") == 0) {
      o->start = strtol(argv[++i], NULL, 0);
    } else {
      fprintf(stderr, "usage: %s [--iters N] [--seed S] [--start I]\n", argv[0]);
      return -1;
    }
  }
  const char* faults = getenv("CHAOS_FAULTS");
  for (int f = 0; f < CHAOS_NFAULTS; f++) {
    static const char* const keys[CHAOS_NFAULTS] = {"kill", "stop", "socket"};
    o->faults[f] = faults == NULL || *faults == '\0' || strstr(faults, keys[f]) != NULL;
  }
  ssize_t n = readlink("/proc/self/exe", o->self, sizeof o->self - 1);
  if (n <= 0) return -1;
  o->self[n] = '\0';
  return 0;
}

/* Each rank's own device for the isolated mode: the n-th entry of CUDA_VISIBLE_DEVICES, or n. */
static void isolated_devices(struct options* o) {
  const char* vis = getenv("CUDA_VISIBLE_DEVICES");
  char copy[1024], *save = NULL;
  snprintf(copy, sizeof copy, "%s", vis ? vis : "");
  char* tok = vis && *vis ? strtok_r(copy, ",", &save) : NULL;
  for (int r = 0; r < CHAOS_MAX_RANKS; r++) {
    if (tok) {
      snprintf(o->visible[r], sizeof o->visible[r], "%s", tok);
      tok = strtok_r(NULL, ",", &save);
    } else {
      snprintf(o->visible[r], sizeof o->visible[r], "%d", r);
    }
  }
}

static void summary(const struct options* o, const struct totals* t) {
  printf("chaos: %ld of %ld iterations passed (seed %llu, %d ranks); hangs %ld\n", t->passed,
         t->ran, (unsigned long long)o->seed, o->nranks, t->hangs);
  for (int f = 0; f < CHAOS_NFAULTS; f++)
    for (int k = 0; k < 3; k++) {
      if (!o->faults[f] || (f == CHAOS_STOP && k > 0)) continue;
      printf("chaos: worst time to error, %s, BRAID_TIMEOUT=%s: ", fault_names[f],
             f == CHAOS_STOP ? "CHAOS_STOP_TIMEOUT" : timeout_names[k]);
      double w = t->worst_err[f][k];
      if (w > 0)
        printf("%.3f s\n", w);
      else
        printf("none measured\n");
    }
  printf("chaos: worst ncclCommAbort %.3f s (bar %.1f s)\n", t->worst_abort, CHAOS_ABORT_BAR_S);
  printf("chaos: leaks: /dev/shm in %ld iteration(s), descriptors in %ld iteration(s)\n",
         t->shm_leaks, t->fd_leaks);
}

int main(int argc, char** argv) {
  if (argc == 7 && strcmp(argv[1], "--rank") == 0)
    return chaos_rank_main(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), strtoull(argv[5], NULL, 0),
                           atoi(argv[6]));
  struct options o = {0};
  if (parse_options(argc, argv, &o) != 0) return 1;
  for (int c = 0; c < NCOMBOS; c++)
    if (o.faults[c % 3]) o.order[o.norder++] = c;
  if (o.iters < 1 || o.norder == 0) {
    printf(
        "chaos: FAILED: nothing to run (iterations %ld, CHAOS_FAULTS '%s': kill, stop, socket)\n",
        o.iters, getenv("CHAOS_FAULTS") ? getenv("CHAOS_FAULTS") : "");
    return 1;
  }
  int gpus = count_gpus();
  int cap = (int)env_double("CHAOS_RANKS", CHAOS_MAX_RANKS);
  o.nranks = gpus < cap ? gpus : cap;
  if (o.nranks > CHAOS_MAX_RANKS) o.nranks = CHAOS_MAX_RANKS;
  if (o.nranks < 2) {
    printf("chaos: skipped: %d GPU(s) visible, 2 needed\n", gpus);
    return CHAOS_SKIP;
  }
  isolated_devices(&o);
  uint64_t s = mix64(o.seed);
  for (int i = o.norder - 1; i > 0; i--) {
    s = mix64(s);
    int j = (int)(s % (uint64_t)(i + 1)), tmp = o.order[i];
    o.order[i] = o.order[j];
    o.order[j] = tmp;
  }
  printf(
      "chaos: seed %llu, iterations %ld..%ld, %d ranks (one GPU each), bar %.1f s, "
      "SIGSTOP bar %.1f s (BRAID_TIMEOUT=%.0f)\n",
      (unsigned long long)o.seed, o.start, o.start + o.iters - 1, o.nranks, o.bar_s,
      o.stop_timeout_s + o.bar_s, o.stop_timeout_s);
  fflush(stdout);
  signal(SIGPIPE, SIG_IGN);
  struct totals t = {0};
  for (long i = o.start; i < o.start + o.iters; i++) {
    t.ran++;
    t.passed += iteration(&o, i, &t);
  }
  summary(&o, &t);
  if (t.ran == 0) {
    printf("chaos: FAILED: no iteration ran\n");
    return 1;
  }
  return t.passed == t.ran ? 0 : 1;
}
