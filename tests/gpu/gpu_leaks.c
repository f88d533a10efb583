/*
 * Leaks: make and destroy 1000 communicators and check that the process is
 * left where it started.
 *
 * Each cycle splits the world's communicator (every rank, one colour, so
 * the child connects exactly as the parent did: P2P, shared memory or the
 * network), runs one AllReduce on the child, and destroys it. After a
 * warm-up of LEAK_WARMUP cycles (first-use costs: CUDA modules, the proxy
 * thread, allocator pools) the process's open file descriptors, threads,
 * resident host memory and the GPU's free memory are read; after LEAK_CYCLES
 * more they are read again. File descriptors and threads must come back
 * exactly; memory within LEAK_HOST_SLACK / LEAK_DEV_SLACK (a leak of one
 * FIFO per communicator would be gigabytes). The figures are printed.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_test.h"

#define LEAK_WARMUP 10
#define LEAK_CYCLES 1000
#define LEAK_COUNT 1024                  /* elements of the AllReduce in each cycle */
#define LEAK_HOST_SLACK (32L << 10)      /* KiB of resident memory */
#define LEAK_DEV_SLACK ((size_t)64 << 20) /* bytes of device memory */

struct usage {
  int fds;
  int threads;
  long rss_kb;
  size_t dev_free;
};

static int count_fds(void) {
  DIR* d = opendir("/proc/self/fd");
  int n = 0;
  if (d == NULL) return -1;
  for (struct dirent* e; (e = readdir(d)) != NULL;)
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n - 1; /* the directory's own descriptor */
}

/* The value of "Name:" in /proc/self/status, or -1. */
static long status_field(const char* name) {
  char line[256];
  long v = -1;
  size_t len = strlen(name);
  FILE* f = fopen("/proc/self/status", "r");
  if (f == NULL) return -1;
  while (fgets(line, sizeof line, f))
    if (strncmp(line, name, len) == 0 && line[len] == ':') v = strtol(line + len + 1, NULL, 10);
  fclose(f);
  return v;
}

static int usage_read(struct gpu_world* w, struct usage* u) {
  size_t free_b = 0, total = 0;
  u->fds = count_fds();
  u->threads = (int)status_field("Threads");
  u->rss_kb = status_field("VmRSS");
  u->dev_free = 0;
  for (int l = 0; l < w->nlocal; l++) {
    if (world_cuda(w, cudaSetDevice(w->dev[l]), "cudaSetDevice") ||
        world_cuda(w, cudaMemGetInfo(&free_b, &total), "cudaMemGetInfo"))
      return -1;
    u->dev_free += free_b;
  }
  return u->fds < 0 || u->threads < 0 || u->rss_kb < 0 ? -1 : 0;
}

/* One communicator made, used and destroyed on every local rank; 0 on success. */
static int leak_cycle(struct gpu_world* w, float** buf) {
  ncclComm_t child[GPU_MAX_RANKS] = {0};
  int rc = world_group_start(w);
  for (int l = 0; rc == 0 && l < w->nlocal; l++)
    rc = world_nccl(w, ncclCommSplit(w->comm[l], 0, w->rank0 + l, &child[l], NULL), w->comm[l],
                    "ncclCommSplit");
  rc |= world_group_end(w);
  if (rc == 0) {
    rc = world_group_start(w);
    for (int l = 0; rc == 0 && l < w->nlocal; l++)
      rc = world_nccl(w, ncclAllReduce(buf[l], buf[l], LEAK_COUNT, ncclFloat, ncclSum, child[l],
                                       w->stream[l]),
                      child[l], "ncclAllReduce");
    rc |= world_group_end(w);
    rc |= world_sync(w);
  }
  for (int l = 0; l < w->nlocal; l++)
    if (child[l]) rc |= world_nccl(w, ncclCommDestroy(child[l]), NULL, "ncclCommDestroy");
  return rc ? -1 : 0;
}

/* Every rank at the same point before reading: an AllReduce on the world's communicator. */
static int leak_align(struct gpu_world* w, float** buf) {
  int rc = world_group_start(w);
  for (int l = 0; rc == 0 && l < w->nlocal; l++)
    rc = world_nccl(w, ncclAllReduce(buf[l], buf[l], 1, ncclFloat, ncclSum, w->comm[l],
                                     w->stream[l]),
                    w->comm[l], "ncclAllReduce (align)");
  rc |= world_group_end(w);
  return rc || world_sync(w) ? -1 : 0;
}

void suite_leaks(struct gpu_world* w) {
  char name[128];
  snprintf(name, sizeof name, "Leaks: %d communicators made and destroyed mode=%s", LEAK_CYCLES,
           w->opts->mode);
  if (!world_case_begin(w, name)) return;
  float* buf[GPU_MAX_RANKS] = {0};
  struct usage before, after;
  for (int l = 0; l < w->nlocal; l++)
    if (world_cuda(w, cudaSetDevice(w->dev[l]), "cudaSetDevice") ||
        world_cuda(w, cudaMalloc((void**)&buf[l], LEAK_COUNT * sizeof(float)), "cudaMalloc") ||
        world_cuda(w, cudaMemset(buf[l], 0, LEAK_COUNT * sizeof(float)), "cudaMemset"))
      goto out;
  for (int i = 0; i < LEAK_WARMUP; i++)
    if (leak_cycle(w, buf) != 0) goto out;
  if (leak_align(w, buf) != 0 || usage_read(w, &before) != 0) goto out;
  for (int i = 0; i < LEAK_CYCLES; i++) {
    if (leak_cycle(w, buf) != 0) {
      world_case_fail(w, "cycle %d failed", i);
      goto out;
    }
  }
  if (leak_align(w, buf) != 0 || usage_read(w, &after) != 0) goto out;
  long dev_lost = (long)before.dev_free - (long)after.dev_free;
  printf("leaks [rank %d]: %d communicators: fds %d -> %d, threads %d -> %d, host RSS %+ld KiB, "
         "device free %+.1f MiB\n",
         w->rank0, LEAK_CYCLES, before.fds, after.fds, before.threads, after.threads,
         after.rss_kb - before.rss_kb, -(double)dev_lost / (1 << 20));
  if (after.fds != before.fds)
    world_case_fail(w, "%d file descriptors left open", after.fds - before.fds);
  if (after.threads != before.threads)
    world_case_fail(w, "%d threads left running", after.threads - before.threads);
  if (after.rss_kb - before.rss_kb > LEAK_HOST_SLACK)
    world_case_fail(w, "resident host memory grew by %ld KiB", after.rss_kb - before.rss_kb);
  if (dev_lost > (long)LEAK_DEV_SLACK)
    world_case_fail(w, "device memory shrank by %.1f MiB", (double)dev_lost / (1 << 20));
out:
  for (int l = 0; l < w->nlocal; l++) {
    if (buf[l] == NULL) continue;
    cudaSetDevice(w->dev[l]);
    cudaFree(buf[l]);
  }
  world_case_end(w);
}
