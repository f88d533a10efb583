/*
 * What the printer (process 0, thread 0) writes: nccl-tests' header, device
 * list, table and footer, plus the lines that name the libnccl.so.2 this
 * process actually loaded, and the -J JSON lines.
 *
 * The library lines exist so a comparison can never silently measure one
 * library twice: the loader may pick a library other than the one meant
 * (RPATH beats LD_LIBRARY_PATH; RUNPATH does not), so we ask the loader what
 * it mapped instead of trusting the environment. perf/compare parses them:
 *   # nccl library path: <canonical path>
 *   # nccl library version: <x.y.z> (<code>)
 *   # braid version: <braidGetVersionString()> | none (...)
 */
#include <dlfcn.h>
#include <link.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "driver.h"

#ifndef BRAID_PERF_VERSION
#define BRAID_PERF_VERSION "dev"
#endif

typedef ncclResult_t (*perf_get_version_fn)(int*);
typedef const char* (*perf_braid_version_fn)(void);

/* The loaded object that defines ncclGetVersion, by soname first (exact even
   in a non-PIE binary, where &ncclGetVersion is the executable's PLT slot). */
static void* perf_libnccl_handle(char* name, size_t len) {
  void* h = dlopen("libnccl.so.2", RTLD_LAZY | RTLD_NOLOAD);
  if (h) {
    struct link_map* map = NULL;
    if (dlinfo(h, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name)
      snprintf(name, len, "%s", map->l_name);
    return h;
  }
  Dl_info info;
  if (dladdr((void*)ncclGetVersion, &info) && info.dli_fname) snprintf(name, len, "%s", info.dli_fname);
  return NULL;
}

void perf_libinfo_read(perf_libinfo_t* lib) {
  char name[PATH_MAX] = "unknown";
  void* h = perf_libnccl_handle(name, sizeof(name));
  if (!realpath(name, lib->path)) snprintf(lib->path, sizeof(lib->path), "%s", name);
  perf_get_version_fn get_version = ncclGetVersion;
  lib->braid[0] = '\0';
  lib->version = 0;
  void* scope = h ? h : RTLD_DEFAULT;
  void* fn = dlsym(scope, "ncclGetVersion");
  if (fn) memcpy(&get_version, &fn, sizeof(fn));
  if (get_version(&lib->version) != ncclSuccess) lib->version = 0;
  void* braid = dlsym(scope, "braidGetVersionString");
  if (braid) {
    perf_braid_version_fn braid_version;
    memcpy(&braid_version, &braid, sizeof(braid));
    const char* s = braid_version();
    snprintf(lib->braid, sizeof(lib->braid), "%s", s && *s ? s : "(empty)");
  }
  if (h) dlclose(h); /* NOLOAD took a reference; the library stays mapped */
}

void perf_version_string(int code, char* out, size_t len) {
  if (code >= 10000) /* NCCL_VERSION for 2.9 and later: X*10000 + Y*100 + Z */
    snprintf(out, len, "%d.%d.%d", code / 10000, code % 10000 / 100, code % 100);
  else
    snprintf(out, len, "%d.%d.%d", code / 1000, code % 1000 / 100, code % 100);
}

void perf_report_header(const perf_job_t* job) {
  const perf_args_t* a = job->args;
  char version[32];
  perf_version_string(job->lib.version, version, sizeof(version));
  printf("# braid-perf version %s nccl-headers=%d nccl-library=%d\n", BRAID_PERF_VERSION,
         NCCL_VERSION_CODE, job->lib.version);
  printf("# Collective test starting: %s\n", job->program);
  printf("# nccl library path: %s\n", job->lib.path);
  printf("# nccl library version: %s (%d)\n", version, job->lib.version);
  if (job->lib.braid[0])
    printf("# braid version: %s\n", job->lib.braid);
  else
    printf("# braid version: none (braidGetVersionString is not exported: not Braid)\n");
  printf("# Launch: %s, %d processes x %d threads x %d GPUs = %d ranks\n", job->world->ops->name,
         job->world->nprocs, a->nthreads, a->ngpus, job->nranks);
  printf("# nThread %d nGpus %d minBytes %zu maxBytes %zu step: %zu(%s) warmup iters: %d iters: %d "
         "agg iters: %d validation: %d graph: %d\n",
         a->nthreads, a->ngpus, a->min_bytes, a->max_bytes,
         a->step_factor > 1 ? a->step_factor : a->step_bytes,
         a->step_factor > 1 ? "factor" : "bytes", a->warmup_iters, a->iters, a->agg_iters,
         a->check, a->graph_launches);
  if (a->blocking)
    printf("# Blocking Enabled: wait for completion and barrier after each collective \n");
  if (a->parallel_init)
    printf("# Parallel Init Enabled: threads call into NcclInitRank concurrently \n");
  if (a->split_share >= 0)
    printf("# On a split child of the world communicator, splitShare %d\n", a->split_share);
  printf("#\n");
}

void perf_report_devices(const perf_job_t* job, const char* lines) {
  printf("# Using devices\n%s", lines);
  if (job->max_bytes < job->args->max_bytes)
    printf("#\n# Reducing maxBytes to %zu due to memory limitation\n", job->max_bytes);
}

void perf_report_table_header(const perf_job_t* job) {
  const char* time = job->args->report_cputime ? "cputime" : "time";
  printf("#\n");
  printf("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          \n",
         "", "", "", "", "");
  printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s \n", "size", "count",
         "type", "redop", "root", time, "algbw", "busbw", "#wrong", time, "algbw", "busbw", "#wrong");
  printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s \n", "(B)",
         "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
}

static const char* perf_row_op_name(const perf_job_t* job, int op) {
  return job->coll->uses_op ? perf_op_name(op) : "none";
}

static void perf_json_place(FILE* f, const char* prefix, const perf_result_t* r) {
  fprintf(f, ",\"%s_time_us\":%.6g,\"%s_algbw\":%.6g,\"%s_busbw\":%.6g,\"%s_wrong\":", prefix,
          r->time_us, prefix, r->algbw, prefix, r->busbw, prefix);
  if (r->wrong < 0)
    fprintf(f, "null");
  else
    fprintf(f, "%lld", (long long)r->wrong);
}

/* One JSON object per line: flat keys, so any tool (jq, pandas) reads it. */
static void perf_json_row(const perf_job_t* job, const perf_row_t* row) {
  char host[160], path[2 * PATH_MAX], braid[600], version[32];
  perf_json_string(job->host, host, sizeof(host));
  perf_json_string(job->lib.path, path, sizeof(path));
  perf_json_string(job->lib.braid, braid, sizeof(braid));
  perf_version_string(job->lib.version, version, sizeof(version));
  const perf_args_t* a = job->args;
  fprintf(job->json,
          "{\"host\":%s,\"program\":\"%s\",\"collective\":\"%s\",\"library\":%s,"
          "\"library_version\":\"%s\",\"library_version_code\":%d,\"braid_version\":%s,"
          "\"launch\":\"%s\",\"nprocs\":%d,\"nthreads\":%d,\"ngpus\":%d,\"nranks\":%d,"
          "\"type\":\"%s\",\"op\":\"%s\",\"root\":%d,\"size\":%zu,\"count\":%zu,"
          "\"graph\":%d,\"time_kind\":\"%s\"",
          host, job->program, job->coll->name, path, version, job->lib.version,
          job->lib.braid[0] ? braid : "null", job->world->ops->name, job->world->nprocs,
          a->nthreads, a->ngpus, job->nranks, perf_type_name(row->type),
          perf_row_op_name(job, row->op), row->root, row->bytes, row->count, a->graph_launches,
          a->report_cputime ? "cputime" : "time");
  perf_json_place(job->json, "oop", &row->place[0]);
  perf_json_place(job->json, "ip", &row->place[1]);
  fprintf(job->json, "}\n");
  fflush(job->json);
}

void perf_report_row(perf_job_t* job, const perf_row_t* row) {
  char oop[96], ip[96];
  const perf_result_t* o = &row->place[0];
  const perf_result_t* i = &row->place[1];
  perf_format_result(o->time_us, o->algbw, o->busbw, o->wrong, oop, sizeof(oop));
  perf_format_result(i->time_us, i->algbw, i->busbw, i->wrong, ip, sizeof(ip));
  printf("%12zu  %12zu  %8s  %6s  %6d%s%s\n", row->bytes, row->count, perf_type_name(row->type),
         perf_row_op_name(job, row->op), row->root, oop, ip);
  if (job->json) perf_json_row(job, row);
}

void perf_report_footer(const perf_job_t* job, int errors, double avg_busbw) {
  printf("# %-20s : %d %s\n", "Out of bounds values", errors, errors ? "FAILED" : "OK");
  const double floor = job->args->min_bw;
  printf("# %-20s : %g %s\n", "Avg bus bandwidth", avg_busbw,
         floor < 0                 ? ""
         : avg_busbw < floor * 0.9 ? "FAILED"
                                   : "OK");
  printf("#\n");
  printf("# Collective test concluded: %s\n", job->program);
  printf("#\n\n");
  fflush(stdout);
}
