/*
 * perf_main: from argv to exit code. Picks the world (mpirun, -p N, or one
 * process), gives each local rank its GPU, stream, buffers and communicator,
 * tells every process what the others loaded and hold, prints the header,
 * runs one thread per -t, and tears everything down in reverse.
 *
 * A failure inside a thread ends the whole job (world finish, then _exit):
 * the other threads and processes would otherwise wait for it forever in a
 * barrier or inside the library. Failures before the threads start unwind
 * normally and return exit code 3.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "driver.h"

/* ---- error lines ----------------------------------------------------------- */

static int perf_ctx_proc;
static char perf_ctx_host[64] = "?";

void perf_error_context(int proc, const char* host) {
  perf_ctx_proc = proc;
  snprintf(perf_ctx_host, sizeof(perf_ctx_host), "%s", host);
}

static void perf_error_prefix(const perf_rank_t* r) {
  if (r)
    fprintf(stderr, "perf: rank %d (host %s, pid %d, GPU %d): ", r->rank, perf_ctx_host,
            (int)getpid(), r->device);
  else
    fprintf(stderr, "perf: process %d (host %s, pid %d): ", perf_ctx_proc, perf_ctx_host,
            (int)getpid());
}

int perf_cuda_failed(cudaError_t e, const char* call, const char* file, int line,
                     const perf_rank_t* r) {
  if (e == cudaSuccess) return 0;
  perf_error_prefix(r);
  fprintf(stderr, "%s failed: %s (%s) [%s:%d]\n", call, cudaGetErrorString(e), cudaGetErrorName(e),
          file, line);
  return -1;
}

int perf_nccl_failed(ncclResult_t res, const char* call, const char* file, int line,
                     const perf_rank_t* r) {
  if (res == ncclSuccess) return 0;
  const char* last = ncclGetLastError(r ? r->comm : NULL);
  perf_error_prefix(r);
  fprintf(stderr, "%s failed: %s%s%s [%s:%d]\n", call, ncclGetErrorString(res),
          last && *last ? ": " : "", last ? last : "", file, line);
  return -1;
}

/* ---- team: the threads of this process, extended to the world by thread 0 */

int perf_team_barrier(perf_thread_t* t) {
  perf_team_t* team = &t->job->team;
  int rc = 0;
  pthread_barrier_wait(&team->barrier);
  if (t->index == 0) rc = t->job->world->ops->barrier(t->job->world);
  pthread_barrier_wait(&team->barrier);
  return rc;
}

static double perf_combine(const double* v, int n, int mode) {
  double r = v[0];
  for (int i = 1; i < n; i++) {
    if (mode == 1) r += v[i];
    if (mode == 2 && v[i] < r) r = v[i];
    if (mode == 3 && v[i] > r) r = v[i];
  }
  return r; /* mode 0: the first (process 0's thread 0) */
}

/* Thread 0: this process's threads combined, then all processes combined. */
static int perf_world_reduce(perf_thread_t* t, int mode, double* result) {
  perf_job_t* job = t->job;
  double local = perf_combine(job->team.doubles, job->team.nthreads, mode);
  double* all = calloc((size_t)job->world->nprocs, sizeof(double));
  if (!all) return -1;
  int rc = job->world->ops->allgather(job->world, &local, all, sizeof(double));
  *result = perf_combine(all, job->world->nprocs, mode);
  if (mode == 1) *result /= (double)job->world->nprocs * job->team.nthreads;
  free(all);
  return rc;
}

int perf_team_reduce_double(perf_thread_t* t, double* value, int mode) {
  perf_team_t* team = &t->job->team;
  int rc = 0;
  team->doubles[t->index] = *value;
  pthread_barrier_wait(&team->barrier);
  if (t->index == 0) rc = perf_world_reduce(t, mode, &team->double_result);
  pthread_barrier_wait(&team->barrier);
  *value = team->double_result;
  return rc;
}

int perf_team_sum_int(perf_thread_t* t, int64_t* value) {
  perf_team_t* team = &t->job->team;
  int rc = 0;
  team->ints[t->index] = *value;
  pthread_barrier_wait(&team->barrier);
  if (t->index == 0) {
    perf_job_t* job = t->job;
    int64_t local = 0;
    for (int i = 0; i < team->nthreads; i++) local += team->ints[i];
    int64_t* all = calloc((size_t)job->world->nprocs, sizeof(int64_t));
    rc = all ? job->world->ops->allgather(job->world, &local, all, sizeof(local)) : -1;
    team->int_result = 0;
    for (int p = 0; all && p < job->world->nprocs; p++) team->int_result += all[p];
    free(all);
  }
  pthread_barrier_wait(&team->barrier);
  *value = team->int_result;
  return rc;
}

static int perf_team_init(perf_team_t* team, int nthreads) {
  team->nthreads = nthreads;
  team->doubles = calloc((size_t)nthreads, sizeof(double));
  team->ints = calloc((size_t)nthreads, sizeof(int64_t));
  if (!team->doubles || !team->ints) return -1;
  return pthread_barrier_init(&team->barrier, NULL, (unsigned)nthreads) ? -1 : 0;
}

static void perf_team_fini(perf_team_t* team) {
  if (team->doubles) pthread_barrier_destroy(&team->barrier);
  free(team->doubles);
  free(team->ints);
}

/* ---- what processes tell each other before the run ------------------------ */

#define PERF_DEVICE_LINES 4096

typedef struct perf_proc_info {
  int min_cc_major;       /* smallest compute capability major of this process's GPUs */
  int ok;                 /* 0: this process failed to read its devices */
  size_t min_mem;         /* smallest total memory of this process's GPUs */
  char lib_path[PATH_MAX];
  char lines[PERF_DEVICE_LINES];
} perf_proc_info_t;

/* Assigns GPUs (nccl-tests' rule: local index * ranks per process + i) and
   describes them. */
static int perf_describe_devices(perf_job_t* job, perf_proc_info_t* info) {
  int visible = 0;
  if (PERF_CUDA(NULL, cudaGetDeviceCount(&visible))) return -1;
  size_t len = 0;
  info->min_cc_major = 1 << 20;
  info->min_mem = (size_t)-1;
  for (int i = 0; i < job->nlocal; i++) {
    perf_rank_t* r = &job->ranks[i];
    r->rank = job->world->proc * job->nlocal + i;
    r->device = (job->args->device0 >= 0 ? job->args->device0 : job->local_index * job->nlocal) + i;
    if (r->device >= visible) {
      const char* cvd = getenv("CUDA_VISIBLE_DEVICES");
      fprintf(stderr, "perf: process %d on %s needs GPU %d but sees %d GPU(s)%s%s%s: use fewer "
              "processes (-p, mpirun -np) or GPUs (-g, -t)\n", job->world->proc, job->host,
              r->device, visible, cvd ? " (CUDA_VISIBLE_DEVICES=" : "", cvd ? cvd : "", cvd ? ")" : "");
      return -1;
    }
    struct cudaDeviceProp prop;
    if (PERF_CUDA(r, cudaGetDeviceProperties(&prop, r->device))) return -1;
    if (prop.major < info->min_cc_major) info->min_cc_major = prop.major;
    if (prop.totalGlobalMem < info->min_mem) info->min_mem = prop.totalGlobalMem;
    if (len < sizeof(info->lines))
      len += (size_t)snprintf(info->lines + len, sizeof(info->lines) - len,
                              "#  Rank %2d Group %2d Pid %6d on %10s device %2d [%04x:%02x:%02x] %s\n",
                              r->rank, 0, (int)getpid(), job->host, r->device, prop.pciDomainID,
                              prop.pciBusID, prop.pciDeviceID, prop.name);
  }
  return 0;
}

/*
 * nccl-tests' memory rule: send + recv of max bytes (and its `expected` buffer when checking,
 * though the checks here need none: the same sizes run either way), minus a reserve.
 */
static size_t perf_memory_limit(size_t total, int check) {
  const size_t gib = (size_t)1 << 30;
  size_t reserve = (total + 16 * gib - 1) / (16 * gib) * gib;
  if (reserve > 4 * gib) reserve = 4 * gib;
  if (total <= reserve + gib) return 0;
  return (total - reserve - gib) / (check ? 3 : 2);
}

/* Types of "-d all": fp8 only where every GPU is Hopper or newer and the
   library is 2.24 or newer, as nccl-tests. */
static void perf_job_types(perf_job_t* job, int min_cc_major) {
  job->ntypes = 0;
  if (job->args->type != PERF_ALL) {
    job->types[job->ntypes++] = job->args->type;
    return;
  }
  for (int t = 0; t < ncclNumTypes; t++) {
    int fp8 = t == ncclFloat8e4m3 || t == ncclFloat8e5m2;
    if (fp8 && (min_cc_major < 9 || job->lib.version < 22400)) continue;
    job->types[job->ntypes++] = t;
  }
}

static void perf_job_ops(perf_job_t* job) {
  job->nops = 0;
  if (job->args->op != PERF_ALL) {
    job->ops[job->nops++] = job->args->op;
    return;
  }
  for (int o = 0; o < PERF_NUM_OPS; o++) job->ops[job->nops++] = o;
}

/* Exchanges device and library facts; the printer prints the header. */
static int perf_exchange_info(perf_job_t* job) {
  perf_world_t* w = job->world;
  perf_proc_info_t* mine = calloc(1, sizeof(*mine));
  perf_proc_info_t* all = calloc((size_t)w->nprocs, sizeof(*all));
  int rc = -1;
  if (!mine || !all) goto done;
  mine->ok = perf_describe_devices(job, mine) == 0;
  snprintf(mine->lib_path, sizeof(mine->lib_path), "%s", job->lib.path);
  if (w->ops->allgather(w, mine, all, sizeof(*mine))) goto done;
  int min_cc = 1 << 20;
  size_t min_mem = (size_t)-1;
  for (int p = 0; p < w->nprocs; p++) {
    if (!all[p].ok) goto done; /* that process said why */
    if (all[p].min_cc_major < min_cc) min_cc = all[p].min_cc_major;
    if (all[p].min_mem < min_mem) min_mem = all[p].min_mem;
  }
  size_t limit = perf_memory_limit(min_mem, job->args->check != 0);
  job->max_bytes = job->args->max_bytes < limit ? job->args->max_bytes : limit;
  perf_job_types(job, min_cc);
  if (w->proc == 0) {
    perf_report_header(job);
    for (int p = 1; p < w->nprocs; p++)
      if (strcmp(all[p].lib_path, all[0].lib_path) != 0)
        printf("# WARNING: processes loaded different libnccl.so.2: process 0 %s, process %d %s\n",
               all[0].lib_path, p, all[p].lib_path);
    char* lines = calloc((size_t)w->nprocs, PERF_DEVICE_LINES);
    if (!lines) goto done;
    for (int p = 0; p < w->nprocs; p++) strncat(lines, all[p].lines, PERF_DEVICE_LINES - 1);
    perf_report_devices(job, lines);
    free(lines);
  }
  rc = 0;
done:
  free(mine);
  free(all);
  return rc;
}

/* Process 0 makes the unique id; everyone learns it, or that it failed. */
static int perf_share_unique_id(perf_job_t* job) {
  struct {
    int ok;
    ncclUniqueId id;
  } mine = {1, {{0}}}, *all = calloc((size_t)job->world->nprocs, sizeof(mine));
  int rc = -1;
  if (!all) return -1;
  if (job->world->proc == 0) mine.ok = PERF_NCCL(NULL, ncclGetUniqueId(&mine.id)) == 0;
  if (job->world->ops->allgather(job->world, &mine, all, sizeof(mine)) == 0 && all[0].ok) {
    job->id = all[0].id;
    rc = 0;
  }
  free(all);
  return rc;
}

/* Stream, buffers of max_bytes and a wrong-element counter for one rank. */
static int perf_rank_resources(perf_job_t* job, perf_rank_t* r) {
  const perf_args_t* a = job->args;
  size_t bytes = job->max_bytes > 256 ? job->max_bytes : 256;
  if (PERF_CUDA(r, cudaSetDevice(r->device))) return -1;
  if (!a->stream_null &&
      PERF_CUDA(r, cudaStreamCreateWithFlags(&r->stream, cudaStreamNonBlocking)))
    return -1;
  if (a->alloc_cuda) {
    if (PERF_CUDA(r, cudaMalloc(&r->send, bytes)) || PERF_CUDA(r, cudaMalloc(&r->recv, bytes)))
      return -1;
  } else if (PERF_NCCL(r, ncclMemAlloc(&r->send, bytes)) ||
             PERF_NCCL(r, ncclMemAlloc(&r->recv, bytes))) {
    fprintf(stderr, "perf: (--alloc cuda allocates with cudaMalloc instead of ncclMemAlloc)\n");
    return -1;
  }
  return PERF_CUDA(r, cudaMalloc((void**)&r->wrong, sizeof(*r->wrong)));
}

static void perf_rank_release(perf_job_t* job, perf_rank_t* r) {
  if (!r->comm && !r->parent && !r->send && !r->recv && !r->wrong && !r->stream)
    return; /* never set up */
  if (r->comm && PERF_CUDA(r, cudaSetDevice(r->device)) == 0) {
    if (r->send_reg) PERF_NCCL(r, ncclCommDeregister(r->comm, r->send_reg));
    if (r->recv_reg) PERF_NCCL(r, ncclCommDeregister(r->comm, r->recv_reg));
  }
  r->send_reg = r->recv_reg = NULL;
  if (r->comm) PERF_NCCL(r, ncclCommDestroy(r->comm));
  if (r->parent) PERF_NCCL(r, ncclCommDestroy(r->parent));
  r->comm = r->parent = NULL;
  if (PERF_CUDA(r, cudaSetDevice(r->device))) return; /* leave the rest to process exit */
  if (job->args->alloc_cuda) {
    if (r->send) PERF_CUDA(r, cudaFree(r->send));
    if (r->recv) PERF_CUDA(r, cudaFree(r->recv));
  } else {
    if (r->send) PERF_NCCL(r, ncclMemFree(r->send));
    if (r->recv) PERF_NCCL(r, ncclMemFree(r->recv));
  }
  if (r->wrong) PERF_CUDA(r, cudaFree(r->wrong));
  if (r->stream) PERF_CUDA(r, cudaStreamDestroy(r->stream));
  r->send = r->recv = NULL;
  r->wrong = NULL;
  r->stream = NULL;
}

/* Communicators of n consecutive ranks, created in one group (one thread may
   drive several GPUs only this way). */
static int perf_init_comms(perf_job_t* job, perf_rank_t* ranks, int n) {
  if (PERF_NCCL(NULL, ncclGroupStart())) return -1;
  int rc = 0;
  for (int i = 0; i < n && rc == 0; i++) {
    perf_rank_t* r = &ranks[i];
    rc = PERF_CUDA(r, cudaSetDevice(r->device)) ||
         PERF_NCCL(r, ncclCommInitRank(&r->comm, job->nranks, job->id, r->rank));
  }
  if (PERF_NCCL(NULL, ncclGroupEnd())) rc = -1;
  if (rc || job->args->split_share < 0) return rc ? -1 : 0;
  /* --split_share: the benchmark runs on a child of the same ranks. */
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.splitShare = job->args->split_share;
  if (PERF_NCCL(NULL, ncclGroupStart())) return -1;
  for (int i = 0; i < n && rc == 0; i++) {
    perf_rank_t* r = &ranks[i];
    r->parent = r->comm;
    r->comm = NULL;
    rc = PERF_CUDA(r, cudaSetDevice(r->device)) ||
         PERF_NCCL(r, ncclCommSplit(r->parent, 0, r->rank, &r->comm, &config));
  }
  if (PERF_NCCL(NULL, ncclGroupEnd())) rc = -1;
  return rc ? -1 : 0;
}

/*
 * -R: the buffers registered with the communicator, as nccl-tests does: 1 ncclCommRegister
 * (local registration), 2 windows with NCCL_WIN_COLL_SYMMETRIC (collective over the ranks, so
 * one group for every rank of the thread).
 */
static int perf_register(perf_job_t* job, perf_rank_t* ranks, int n) {
  const size_t bytes = job->max_bytes > 256 ? job->max_bytes : 256;
  int rc = 0;
  if (job->args->local_register == 1) {
    for (int i = 0; i < n && rc == 0; i++) {
      perf_rank_t* r = &ranks[i];
      rc = PERF_CUDA(r, cudaSetDevice(r->device)) ||
           PERF_NCCL(r, ncclCommRegister(r->comm, r->send, bytes, &r->send_reg)) ||
           PERF_NCCL(r, ncclCommRegister(r->comm, r->recv, bytes, &r->recv_reg));
    }
  } else if (job->args->local_register == 2) {
    if (PERF_NCCL(NULL, ncclGroupStart())) return -1;
    for (int i = 0; i < n && rc == 0; i++) {
      perf_rank_t* r = &ranks[i];
      rc = PERF_CUDA(r, cudaSetDevice(r->device)) ||
           PERF_NCCL(r, ncclCommWindowRegister(r->comm, r->send, bytes, &r->send_win,
                                               NCCL_WIN_COLL_SYMMETRIC)) ||
           PERF_NCCL(r, ncclCommWindowRegister(r->comm, r->recv, bytes, &r->recv_win,
                                               NCCL_WIN_COLL_SYMMETRIC));
    }
    if (PERF_NCCL(NULL, ncclGroupEnd())) rc = -1;
  }
  return rc ? -1 : 0;
}

/* The windows of -R 2 go in one group before the communicators (collective, as registering). */
static void perf_deregister_windows(perf_rank_t* ranks, int n) {
  int any = 0;
  for (int i = 0; i < n; i++) any |= ranks[i].send_win != NULL || ranks[i].recv_win != NULL;
  if (!any || PERF_NCCL(NULL, ncclGroupStart())) return;
  for (int i = 0; i < n; i++) {
    perf_rank_t* r = &ranks[i];
    if (!r->comm || PERF_CUDA(r, cudaSetDevice(r->device))) continue;
    if (r->send_win) PERF_NCCL(r, ncclCommWindowDeregister(r->comm, r->send_win));
    if (r->recv_win) PERF_NCCL(r, ncclCommWindowDeregister(r->comm, r->recv_win));
    r->send_win = r->recv_win = NULL;
  }
  PERF_NCCL(NULL, ncclGroupEnd());
}

/* The end of a thread that failed: stop every thread and process now. */
static void perf_thread_fail(perf_thread_t* t) {
  fprintf(stderr, "perf: process %d (host %s): stopping the run after the error above\n",
          t->job->world->proc, t->job->host);
  fflush(stdout);
  t->job->world->ops->finish(t->job->world, PERF_EXIT_FAILED);
  _exit(PERF_EXIT_FAILED);
}

static void* perf_thread_main(void* arg) {
  perf_thread_t* t = arg;
  perf_job_t* job = t->job;
  if (PERF_CUDA(&t->ranks[0], cudaSetDevice(t->ranks[0].device))) perf_thread_fail(t);
  if (job->args->parallel_init && (perf_init_comms(job, t->ranks, job->args->ngpus) ||
                                   perf_register(job, t->ranks, job->args->ngpus)))
    perf_thread_fail(t);
  if (perf_bench_thread(t)) perf_thread_fail(t);
  int64_t errors = t->errors;
  if (perf_team_sum_int(t, &errors)) perf_thread_fail(t);
  const double avg = t->busbw_count ? t->busbw_sum / t->busbw_count : 0.0;
  const int slow = job->args->min_bw >= 0 && avg < job->args->min_bw * 0.9; /* as nccl-tests */
  if (perf_is_printer(t)) perf_report_footer(job, (int)errors, avg);
  t->exit_code = errors || slow ? PERF_EXIT_WRONG : PERF_EXIT_OK;
  return NULL;
}

/* Thread 0 runs on the caller's thread (MPI calls stay on the main thread). */
static int perf_run_threads(perf_job_t* job) {
  int n = job->args->nthreads;
  perf_thread_t* threads = calloc((size_t)n, sizeof(*threads));
  if (!threads) return PERF_EXIT_FAILED;
  for (int i = 0; i < n; i++) {
    threads[i].job = job;
    threads[i].index = i;
    threads[i].ranks = &job->ranks[i * job->args->ngpus];
  }
  for (int i = 1; i < n; i++) {
    int rc = pthread_create(&threads[i].tid, NULL, perf_thread_main, &threads[i]);
    if (rc) {
      fprintf(stderr, "perf: pthread_create failed: %s\n", strerror(rc));
      perf_thread_fail(&threads[0]);
    }
  }
  perf_thread_main(&threads[0]);
  int code = threads[0].exit_code;
  for (int i = 1; i < n; i++) {
    pthread_join(threads[i].tid, NULL);
    if (threads[i].exit_code > code) code = threads[i].exit_code;
  }
  free(threads);
  return code;
}

/* Checks that need the rank count: a root that exists. */
static int perf_check_root(const perf_job_t* job) {
  const perf_args_t* a = job->args;
  if (!job->coll->uses_root || a->root == PERF_ALL || a->root < job->nranks) return 0;
  if (job->world->proc == 0)
    fprintf(stderr, "%s: -r %d: there are only %d ranks (0..%d)\n", job->program, a->root,
            job->nranks, job->nranks - 1);
  return -1;
}

static int perf_open_json(perf_job_t* job) {
  if (!job->args->json_path || job->world->proc != 0) return 0;
  job->json = fopen(job->args->json_path, "w");
  if (job->json) {
    printf("# Writing JSON lines to %s\n", job->args->json_path);
    return 0;
  }
  fprintf(stderr, "perf: -J %s: cannot write: %s\n", job->args->json_path, strerror(errno));
  return -1;
}

/* Everything before the threads; a partly set-up job is still safe to tear down. */
static int perf_job_setup(perf_job_t* job) {
  if (perf_world_local_index(job->world, &job->local_index)) return -1;
  job->ranks = calloc((size_t)job->nlocal, sizeof(*job->ranks));
  if (!job->ranks || perf_team_init(&job->team, job->args->nthreads)) return -1;
  perf_libinfo_read(&job->lib);
  perf_job_ops(job);
  job->roots_all = job->args->root == PERF_ALL;
  if (perf_exchange_info(job) || perf_share_unique_id(job)) return -1;
  if (job->max_bytes == 0 && job->args->max_bytes > 0) {
    fprintf(stderr, "perf: the GPUs are too small for any buffer\n");
    return -1;
  }
  for (int i = 0; i < job->nlocal; i++)
    if (perf_rank_resources(job, &job->ranks[i])) return -1;
  if (!job->args->parallel_init && (perf_init_comms(job, job->ranks, job->nlocal) ||
                                    perf_register(job, job->ranks, job->nlocal)))
    return -1;
  if (perf_open_json(job)) return -1;
  if (job->world->proc == 0) perf_report_table_header(job);
  return 0;
}

static void perf_job_teardown(perf_job_t* job) {
  if (job->ranks) perf_deregister_windows(job->ranks, job->nlocal);
  for (int i = 0; job->ranks && i < job->nlocal; i++) perf_rank_release(job, &job->ranks[i]);
  free(job->ranks);
  perf_team_fini(&job->team);
  if (job->json) fclose(job->json);
}

static int perf_job_run(perf_job_t* job) {
  if (perf_check_root(job)) return PERF_EXIT_USAGE;
  int code = perf_job_setup(job) ? PERF_EXIT_FAILED : perf_run_threads(job);
  perf_job_teardown(job);
  return code;
}

static void perf_short_hostname(char* out, size_t len) {
  if (gethostname(out, len) != 0) snprintf(out, len, "unknown");
  out[len - 1] = '\0';
  char* dot = strchr(out, '.');
  if (dot) *dot = '\0';
}

/* Starts the processes. Returns 0 to go on in w, or 1 with *exit_code set
   (the launcher of -p N after its children ended, or an error). */
static int perf_start_world(const perf_args_t* a, const char* program, perf_world_t* w, int* argc,
                            char*** argv, int* exit_code) {
  int launcher_size = 0;
  const char* launcher = perf_world_launcher(&launcher_size);
  *exit_code = PERF_EXIT_FAILED;
  if (a->procs >= 2 && launcher) {
    fprintf(stderr, "%s: -p %d starts its own processes; it cannot also run under %s (drop -p, or "
            "run without mpirun)\n", program, a->procs, launcher);
    *exit_code = PERF_EXIT_USAGE;
    return 1;
  }
  if (a->procs >= 2) {
    int rc = perf_world_fork(w, a->procs, exit_code);
    return rc == 0 ? 0 : 1;
  }
  if (launcher) return perf_world_mpi(w, argc, argv) ? 1 : 0;
  perf_world_single(w);
  return 0;
}

int perf_main(const perf_coll_ops_t* coll, int argc, char** argv) {
  setlinebuf(stdout);
  char program[64];
  snprintf(program, sizeof(program), "%s_perf", coll->name);
  if (coll->size != sizeof(perf_coll_ops_t)) {
    fprintf(stderr, "%s: ops table of %zu bytes, driver expects %zu: rebuild perf/\n", program,
            coll->size, sizeof(perf_coll_ops_t));
    return PERF_EXIT_FAILED;
  }
  perf_args_t args;
  char err[512];
  if (perf_args_parse(&args, argc, argv, err, sizeof(err)) != 0) {
    fprintf(stderr, "%s: %s\nRun '%s -h' for the options.\n", program, err, program);
    return PERF_EXIT_USAGE;
  }
  if (args.help) {
    perf_usage(program, coll->name);
    return PERF_EXIT_OK;
  }
  perf_world_t world;
  int code = PERF_EXIT_OK;
  if (perf_start_world(&args, program, &world, &argc, &argv, &code)) return code;
  perf_job_t job = {.args = &args, .coll = coll, .program = program, .world = &world};
  perf_short_hostname(job.host, sizeof(job.host));
  perf_error_context(world.proc, job.host);
  job.nlocal = args.nthreads * args.ngpus;
  job.nranks = world.nprocs * job.nlocal;
  code = perf_job_run(&job);
  world.ops->finish(&world, code);
  return code;
}
