/*
 * Leaks: make and destroy many communicators and check that the process is
 * left where it started. Two cases:
 *
 * Each cycle splits the world's communicator (every rank, one colour, so
 * the child connects exactly as the parent did: P2P, shared memory or the
 * network), runs one AllReduce on the child, and destroys it.
 *
 * The strict count: after LEAK_STRICT_WARMUP cycles (state the process
 * makes once, on first use: CUDA modules, allocator pools, thread stacks),
 * the open file descriptors (/proc/self/fd), the memory mappings (lines of
 * /proc/self/maps: a peer's buffer imported and left mapped shows there, and
 * so does a shared-memory segment) and the device memory in use
 * (cudaMemGetInfo) are read; after LEAK_STRICT_CYCLES more they are read
 * again. Descriptors and mappings must not grow at all, device memory by at
 * most LEAK_STRICT_DEV_SLACK; a failure names the counts and the mappings
 * that appeared.
 *
 * The long run: after a warm-up of LEAK_WARMUP cycles the process's open
 * file descriptors, threads, resident host memory and the GPU's free memory
 * are read; after LEAK_CYCLES more they are read again. File descriptors and
 * threads must come back exactly; memory within LEAK_HOST_SLACK /
 * LEAK_DEV_SLACK (a leak of one FIFO per communicator would be gigabytes).
 *
 * The figures are printed.
 */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "gpu_test.h"

#define LEAK_WARMUP 10
#define LEAK_CYCLES 1000
#define LEAK_COUNT 1024                   /* elements of the AllReduce in each cycle */
#define LEAK_HOST_SLACK (32L << 10)       /* KiB of resident memory */
#define LEAK_DEV_SLACK ((size_t)64 << 20) /* bytes of device memory */
#define LEAK_STRICT_WARMUP 5
#define LEAK_STRICT_CYCLES 100
#define LEAK_STRICT_DEV_SLACK ((size_t)2 << 20) /* bytes of device memory (one 2 MiB page) */
#define LEAK_MAPS_BYTES ((size_t)8 << 20)       /* room for the text of /proc/self/maps */
#define LEAK_MAPS_SHOWN 12                      /* new mappings printed on a failure */

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

/*
 * /proc/self/maps, read into a buffer mapped before the first count (a buffer allocated
 * while counting would be counted itself).
 */
struct leak_maps {
  char* text; /* LEAK_MAPS_BYTES, mapped once; the first len bytes read, NUL-terminated */
  size_t len;
  int lines; /* every line of the file, also those past the buffer */
};

static int leak_maps_map(struct gpu_world* w, struct leak_maps* m) {
  m->text = mmap(NULL, LEAK_MAPS_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m->text != MAP_FAILED) return 0;
  m->text = NULL;
  world_case_fail(w, "cannot map %zu bytes for /proc/self/maps", LEAK_MAPS_BYTES);
  return -1;
}

static void leak_maps_unmap(struct leak_maps* m) {
  if (m->text) munmap(m->text, LEAK_MAPS_BYTES);
  m->text = NULL;
}

/* Reads /proc/self/maps into m (open, read, close: no allocation); 0, or -1. */
static int leak_maps_read(struct leak_maps* m) {
  char spill[4096];
  int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  m->len = 0;
  m->lines = 0;
  for (;;) {
    size_t room = LEAK_MAPS_BYTES - 1 - m->len;
    char* at = room > 0 ? m->text + m->len : spill;
    ssize_t n = read(fd, at, room > 0 ? room : sizeof spill);
    if (n < 0) {
      close(fd);
      return -1;
    }
    if (n == 0) break;
    for (ssize_t i = 0; i < n; i++) m->lines += at[i] == '\n';
    if (room > 0) m->len += (size_t)n;
  }
  close(fd);
  m->text[m->len] = '\0';
  return 0;
}

/* 1 when `line` (len bytes, without its newline) is a whole line of `text`. */
static int leak_maps_has(const char* text, const char* line, size_t len) {
  for (const char* p = text; *p;) {
    const char* end = strchr(p, '\n');
    size_t n = end ? (size_t)(end - p) : strlen(p);
    if (n == len && memcmp(p, line, len) == 0) return 1;
    if (end == NULL) break;
    p = end + 1;
  }
  return 0;
}

/* Prints the lines of `after` that `before` does not have (at most LEAK_MAPS_SHOWN). */
static void leak_maps_show_new(struct gpu_world* w, const struct leak_maps* before,
                               const struct leak_maps* after) {
  int shown = 0;
  for (const char* p = after->text; *p && shown < LEAK_MAPS_SHOWN;) {
    const char* end = strchr(p, '\n');
    size_t n = end ? (size_t)(end - p) : strlen(p);
    if (!leak_maps_has(before->text, p, n)) {
      fprintf(stderr, "leaks [rank %d]: new mapping: %.*s\n", w->rank0, (int)n, p);
      shown++;
    }
    if (end == NULL) break;
    p = end + 1;
  }
}

/* What the strict count reads: descriptors, mappings, device memory in use (every local GPU). */
struct leak_counts {
  int fds;
  size_t dev_used;
};

static int leak_counts_read(struct gpu_world* w, struct leak_counts* c, struct leak_maps* m) {
  size_t free_b = 0, total = 0;
  c->fds = count_fds();
  c->dev_used = 0;
  for (int l = 0; l < w->nlocal; l++) {
    if (world_cuda(w, cudaSetDevice(w->dev[l]), "cudaSetDevice") ||
        world_cuda(w, cudaMemGetInfo(&free_b, &total), "cudaMemGetInfo"))
      return -1;
    c->dev_used += total - free_b;
  }
  if (c->fds < 0 || leak_maps_read(m) != 0) {
    world_case_fail(w, "cannot read /proc/self/fd or /proc/self/maps");
    return -1;
  }
  return 0;
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

/* Every local rank's AllReduce buffer; 0 on success (buf is freed by leak_bufs_free either way). */
static int leak_bufs_alloc(struct gpu_world* w, float** buf) {
  for (int l = 0; l < w->nlocal; l++)
    if (world_cuda(w, cudaSetDevice(w->dev[l]), "cudaSetDevice") ||
        world_cuda(w, cudaMalloc((void**)&buf[l], LEAK_COUNT * sizeof(float)), "cudaMalloc") ||
        world_cuda(w, cudaMemset(buf[l], 0, LEAK_COUNT * sizeof(float)), "cudaMemset"))
      return -1;
  return 0;
}

static void leak_bufs_free(struct gpu_world* w, float** buf) {
  for (int l = 0; l < w->nlocal; l++) {
    if (buf[l] == NULL) continue;
    cudaSetDevice(w->dev[l]);
    cudaFree(buf[l]);
    buf[l] = NULL;
  }
}

/*
 * Reads the strict counts with every rank at the same point: aligned before (every rank's
 * communicators of the cycles destroyed) and after (no rank starts allocating again while
 * another reads: ranks that share a GPU see each other's device memory).
 */
static int leak_strict_read(struct gpu_world* w, float** buf, struct leak_counts* c,
                            struct leak_maps* m) {
  if (leak_align(w, buf) != 0 || leak_counts_read(w, c, m) != 0) return -1;
  return leak_align(w, buf);
}

static void leak_strict(struct gpu_world* w) {
  char name[160];
  snprintf(name, sizeof name,
           "Leaks: %d communicators leave no descriptor, mapping or device memory mode=%s",
           LEAK_STRICT_CYCLES, w->opts->mode);
  if (!world_case_begin(w, name)) return;
  float* buf[GPU_MAX_RANKS] = {0};
  struct leak_maps maps_before = {0}, maps_after = {0};
  struct leak_counts before, after;
  if (leak_maps_map(w, &maps_before) != 0 || leak_maps_map(w, &maps_after) != 0 ||
      leak_bufs_alloc(w, buf) != 0)
    goto out;
  for (int i = 0; i < LEAK_STRICT_WARMUP; i++)
    if (leak_cycle(w, buf) != 0) goto out;
  if (leak_strict_read(w, buf, &before, &maps_before) != 0) goto out;
  for (int i = 0; i < LEAK_STRICT_CYCLES; i++) {
    if (leak_cycle(w, buf) != 0) {
      world_case_fail(w, "cycle %d failed", i);
      goto out;
    }
  }
  if (leak_strict_read(w, buf, &after, &maps_after) != 0) goto out;
  printf("leaks [rank %d]: %d communicators after %d: fds %d -> %d, mappings %d -> %d, device "
         "memory in use %.1f -> %.1f MiB\n",
         w->rank0, LEAK_STRICT_CYCLES, LEAK_STRICT_WARMUP, before.fds, after.fds,
         maps_before.lines, maps_after.lines, (double)before.dev_used / (1 << 20),
         (double)after.dev_used / (1 << 20));
  if (after.fds > before.fds)
    world_case_fail(w, "open file descriptors grew from %d to %d over %d communicators",
                    before.fds, after.fds, LEAK_STRICT_CYCLES);
  if (maps_after.lines > maps_before.lines) {
    world_case_fail(w, "memory mappings (/proc/self/maps lines) grew from %d to %d over %d "
                    "communicators", maps_before.lines, maps_after.lines, LEAK_STRICT_CYCLES);
    leak_maps_show_new(w, &maps_before, &maps_after);
  }
  if (after.dev_used > before.dev_used + LEAK_STRICT_DEV_SLACK)
    world_case_fail(w, "device memory in use grew from %zu to %zu bytes (%+.1f MiB, %zu MiB "
                    "allowed) over %d communicators", before.dev_used, after.dev_used,
                    (double)(after.dev_used - before.dev_used) / (1 << 20),
                    LEAK_STRICT_DEV_SLACK >> 20, LEAK_STRICT_CYCLES);
out:
  leak_bufs_free(w, buf);
  leak_maps_unmap(&maps_before);
  leak_maps_unmap(&maps_after);
  world_case_end(w);
}

static void leak_many(struct gpu_world* w) {
  char name[128];
  snprintf(name, sizeof name, "Leaks: %d communicators made and destroyed mode=%s", LEAK_CYCLES,
           w->opts->mode);
  if (!world_case_begin(w, name)) return;
  float* buf[GPU_MAX_RANKS] = {0};
  struct usage before, after;
  if (leak_bufs_alloc(w, buf) != 0) goto out;
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
  leak_bufs_free(w, buf);
  world_case_end(w);
}

void suite_leaks(struct gpu_world* w) {
  leak_strict(w);
  leak_many(w);
}
