/*
 * braid-info --topo --expect FILE: does this machine look, to a
 * communicator, like the node FILE describes? Used on the GPU machine to
 * check detection against the fixture written for it (h200x2_nvswitch.xml),
 * and by anyone who wants to know whether a BRAID_TOPO_FILE still fits.
 *
 * Both nodes are built as one communicator over all their GPUs. What the
 * data path depends on must match: the GPUs (count, SM version), every
 * GPU-to-GPU path (type, bandwidth within 1%) and the rings (channels,
 * bandwidth). What it does not (NICs, sockets, PCIe switches: a VM shows
 * none of its host's) is printed as a note.
 */
#include <math.h>
#include <stdarg.h>
#include <string.h>

#include "base/error.h"
#include "base/utils.h"
#include "graph/topo.h"

struct compare_state {
  FILE* out;
  int ndiff;
  char first[256]; /* the first difference, for the error */
};

static void compare_say(struct compare_state* st, int must, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void compare_say(struct compare_state* st, int must, const char* fmt, ...) {
  char line[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  fprintf(st->out, "  %s %s\n", must ? "DIFFERS:" : "note:", line);
  if (must && st->ndiff++ == 0) snprintf(st->first, sizeof st->first, "%s", line);
}

static int compare_bw_close(float a, float b) { return fabsf(a - b) <= 0.01f * fmaxf(a, b); }

static void compare_gpus(struct compare_state* st, const struct braid_topo* a,
                         const struct braid_topo* b) {
  if (a->nranks != b->nranks) {
    compare_say(st, 1, "%d GPUs, expected %d", a->nranks, b->nranks);
    return;
  }
  for (int r = 0; r < a->nranks; r++) {
    int sa = a->hosts[0].sys->nodes[a->rank_gpu[r]].u.gpu.sm;
    int sb = b->hosts[0].sys->nodes[b->rank_gpu[r]].u.gpu.sm;
    if (sa != sb) compare_say(st, 1, "GPU %d is SM %d, expected SM %d", r, sa, sb);
  }
}

static void compare_paths(struct compare_state* st, const struct braid_topo* a,
                          const struct braid_topo* b) {
  for (int x = 0; x < a->nranks; x++) {
    for (int y = 0; y < a->nranks; y++) {
      float ba, bb;
      braid_path_type_t ta = topo_path(a, x, y, &ba), tb = topo_path(b, x, y, &bb);
      if (x != y && (ta != tb || !compare_bw_close(ba, bb)))
        compare_say(st, 1, "GPU %d -> GPU %d: %s %.1f GB/s, expected %s %.1f GB/s", x, y,
                    topo_path_type_name(ta), ba, topo_path_type_name(tb), bb);
    }
  }
}

static void compare_rings(struct compare_state* st, const struct braid_topo* a,
                          const struct braid_topo* b) {
  const struct braid_rings *ra = &a->rings, *rb = &b->rings;
  if (ra->nchannels != rb->nchannels || !compare_bw_close(ra->bw_per_channel, rb->bw_per_channel))
    compare_say(st, 1, "rings: %d channels x %.1f GB/s, expected %d x %.1f GB/s", ra->nchannels,
                ra->bw_per_channel, rb->nchannels, rb->bw_per_channel);
}

/* Devices the data path does not depend on: a note each when their counts differ. */
static void compare_devices(struct compare_state* st, const struct braid_topo* a,
                            const struct braid_topo* b) {
  static const int types[] = {TOPO_CPU, TOPO_PCI, TOPO_NIC, TOPO_NET};
  static const char* names[] = {"CPU sockets", "PCIe switches", "NICs", "network ports"};
  for (size_t i = 0; i < BRAID_ARRAY_LEN(types); i++) {
    int na = topo_system_count(a->hosts[0].sys, types[i]);
    int nb = topo_system_count(b->hosts[0].sys, types[i]);
    if (na != nb) compare_say(st, 0, "%d %s, expected %d", na, names[i], nb);
  }
}

ncclResult_t topo_compare(FILE* out, const char* topo_file, const char* expect_file) {
  ncclResult_t res = ncclSuccess;
  struct braid_topo *have = NULL, *want = NULL;
  struct compare_state st = {.out = out};
  BRAID_TRY(topo_node_load(out, topo_file, 1, &have));
  BRAID_TRY(topo_node_load(out, expect_file, 0, &want));
  fprintf(out, "Comparing %s with %s:\n", have->hosts[0].sys->source, want->hosts[0].sys->source);
  compare_gpus(&st, have, want);
  if (st.ndiff == 0) compare_paths(&st, have, want);
  compare_rings(&st, have, want);
  compare_devices(&st, have, want);
  fprintf(out, "%s\n",
          st.ndiff ? "The node differs from the expected one where a communicator would notice."
                   : "The node matches: same GPUs, paths and rings.");
  if (st.ndiff)
    res = braid_err(ncclInvalidUsage, "%s differs from %s in %d way%s (first: %s)",
                    have->hosts[0].sys->source, expect_file, st.ndiff, st.ndiff == 1 ? "" : "s",
                    st.first);
fail:
  topo_free(have);
  topo_free(want);
  return res;
}
