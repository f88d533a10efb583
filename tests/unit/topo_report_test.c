/*
 * braid-info --topo's engine: the report of a node given as a topology file
 * (BRAID_TOPO_FILE, set by CTest to the 2x H200 fixture) names the GPUs, the
 * NVLink paths, the rings and why, and writes a Graphviz file; without a
 * file on a machine without GPUs it fails with a message saying what to do.
 * With no file argument it reads BRAID_TOPO_FILE, and it writes the node to
 * BRAID_TOPO_DUMP_FILE, from which the same report comes again. --expect
 * (topo_compare) tells nodes that look alike to a communicator from ones
 * that do not, GPUs, paths and rings, and only notes other devices.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "base/param.h"
#include "graph/graph.h"
#include "test.h"

static void expect_in(const char* text, const char* want) {
  TEST_CHECK(text && strstr(text, want) != NULL, "report lacks \"%s\"", want);
}

int main(void) {
  setenv("BRAID_DEBUG", "NONE", 1);
  braid_param_reload();
  char file[512]; /* a copy: braid_param_reload frees the parameter's string */
  const char* from_env = braid_param_str(BRAID_P_TOPO_FILE);
  snprintf(file, sizeof file, "%s", from_env ? from_env : BRAID_FIXTURES "/h200x2_nvswitch.xml");
  char dot[] = "/tmp/braid_topo_dot_XXXXXX";
  int fd = mkstemp(dot);
  if (fd >= 0) close(fd);
  char* text = NULL;
  size_t len = 0;
  FILE* out = open_memstream(&text, &len);
  TEST_EXPECT_RES(topo_report(out, file, dot), ncclSuccess);
  fclose(out);
  expect_in(text, "2 GPUs");
  expect_in(text, "GPU/0000:19:00.0");
  expect_in(text, "NVLink 396 GB/s to NVS/0");
  expect_in(text, " NVL   396");
  expect_in(text, "Rings: 32 channels x 12.0 GB/s");
  expect_in(text, "why: ");
  expect_in(text, "AllReduce");
  if (test_failures) fputs(text ? text : "(no report)\n", stderr); /* show what was checked */
  FILE* f = fopen(dot, "r");
  char head[64] = "";
  TEST_CHECK(f && fgets(head, sizeof head, f) && strncmp(head, "graph topology {", 16) == 0,
             "dot file starts with \"%s\"", head);
  if (f) fclose(f);
  unlink(dot);
  free(text);
  /* No file given: BRAID_TOPO_FILE; BRAID_TOPO_DUMP_FILE receives the node, which loads again. */
  char dump[] = "/tmp/braid_topo_report_dump_XXXXXX";
  fd = mkstemp(dump);
  if (fd >= 0) close(fd);
  setenv("BRAID_TOPO_FILE", file, 1);
  setenv("BRAID_TOPO_DUMP_FILE", dump, 1);
  braid_param_reload();
  text = NULL;
  out = open_memstream(&text, &len);
  TEST_EXPECT_RES(topo_report(out, NULL, NULL), ncclSuccess);
  fclose(out);
  expect_in(text, "Rings: 32 channels x 12.0 GB/s");
  expect_in(text, "written to /tmp/braid_topo_report_dump_");
  free(text);
  text = NULL;
  unsetenv("BRAID_TOPO_DUMP_FILE");
  braid_param_reload();
  out = open_memstream(&text, &len);
  TEST_EXPECT_RES(topo_report(out, dump, NULL), ncclSuccess);
  fclose(out);
  expect_in(text, "Rings: 32 channels x 12.0 GB/s");
  expect_in(text, "GPU/0000:19:00.0");
  unlink(dump);
  free(text);
  /* --expect: a node matches itself and NCCL's dump of the machine it was written for. */
  static const struct {
    const char *have, *want;
    ncclResult_t res;
    const char* says;
  } compares[] = {
      {"h200x2_nvswitch.xml", "h200x2_nvswitch.xml", ncclSuccess, "The node matches"},
      {"nccl_h200x2_dump.xml", "h200x2_nvswitch.xml", ncclSuccess,
       "note: 1 CPU sockets, expected 2"},
      {"ib_nic_node.xml", "twohost_b.xml", ncclSuccess, "The node matches"},
      {"pcie_4gpu_2socket.xml", "h200x4_nvswitch.xml", ncclInvalidUsage,
       "DIFFERS: GPU 0 is SM 89, expected SM 90"},
      {"h200x4_nvswitch.xml", "h200x2_nvswitch.xml", ncclInvalidUsage,
       "DIFFERS: 4 GPUs, expected 2"},
      {"nvlink_bridge_3gpu.xml", "nvlink_bridge_3gpu.xml", ncclSuccess, "The node matches"},
  };
  for (size_t i = 0; i < sizeof compares / sizeof compares[0]; i++) {
    char have[512], want[512];
    snprintf(have, sizeof have, "%s/%s", BRAID_FIXTURES, compares[i].have);
    snprintf(want, sizeof want, "%s/%s", BRAID_FIXTURES, compares[i].want);
    text = NULL;
    out = open_memstream(&text, &len);
    TEST_EXPECT_RES(topo_compare(out, have, want), compares[i].res);
    fclose(out);
    TEST_CHECK(text && strstr(text, compares[i].says), "%s vs %s: no \"%s\" in:\n%s",
               compares[i].have, compares[i].want, compares[i].says, text ? text : "");
    if (compares[i].res != ncclSuccess)
      TEST_CHECK(strstr(braid_err_last(), "differs from") != NULL, "error: %s", braid_err_last());
    free(text);
  }
  /* A path that differs only in bandwidth: 2 NVLinks instead of 4 between bridge GPUs. */
  {
    char path[] = "/tmp/braid_compare_XXXXXX", want[512];
    snprintf(want, sizeof want, "%s/nvlink_bridge_3gpu.xml", BRAID_FIXTURES);
    FILE* in = fopen(want, "r");
    fd = mkstemp(path);
    FILE* w = fd >= 0 ? fdopen(fd, "w") : NULL;
    char line[1024];
    while (in && w && fgets(line, sizeof line, in)) {
      char* c = strstr(line, "count=\"4\"");
      if (c) c[7] = '2';
      fputs(line, w);
    }
    if (in) fclose(in);
    if (w) fclose(w);
    text = NULL;
    out = open_memstream(&text, &len);
    TEST_EXPECT_RES(topo_compare(out, path, want), ncclInvalidUsage);
    fclose(out);
    TEST_CHECK(text && strstr(text, "DIFFERS: GPU 0 -> GPU 1: NVL 40.0 GB/s, expected NVL 80.0"),
               "bandwidth difference not found:\n%s", text ? text : "");
    free(text);
    unlink(path);
  }
  /* No file at all: detection; this host has no GPU in CI, and must say what to do instead. */
  unsetenv("BRAID_TOPO_FILE");
  braid_param_reload();
  text = NULL;
  out = open_memstream(&text, &len);
  ncclResult_t res = topo_report(out, NULL, NULL);
  fclose(out);
  if (res != ncclSuccess)
    TEST_CHECK(strstr(braid_err_last(), "--topo-file") != NULL, "no-GPU message: %s",
               braid_err_last());
  free(text);
  return test_summary();
}
