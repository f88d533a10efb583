/*
 * braid-info --topo's engine: the report of a node given as a topology file
 * (BRAID_TOPO_FILE, set by CTest to the 2x H200 fixture) names the GPUs, the
 * NVLink paths, the rings and why, and writes a Graphviz file; without a
 * file on a machine without GPUs it fails with a message saying what to do.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "core/param.h"
#include "graph/graph.h"
#include "test.h"

static void expect_in(const char* text, const char* want) {
  TEST_CHECK(text && strstr(text, want) != NULL, "report lacks \"%s\"", want);
}

int main(void) {
  setenv("BRAID_DEBUG", "NONE", 1);
  braid_param_reload();
  const char* file = braid_param_str(BRAID_P_TOPO_FILE);
  if (file == NULL) file = BRAID_FIXTURES "/h200x2_nvswitch.xml";
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
  /* No file: detection; this host has no GPU in CI, and must say what to do instead. */
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
