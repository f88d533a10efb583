/*
 * braid-info: what Braid is, how it is configured, and what it sees.
 *   braid-info --version          library version and NCCL API level
 *   braid-info --env              every parameter: value, where it came from, help
 *   braid-info --topo [--topo-file F] [--dot FILE] [--expect FILE]
 *                                 the machine, the paths between GPUs, the rings and trees;
 *                                 with --expect, whether it matches the node FILE describes
 * Without arguments: --version and a one-line hint.
 */
#include <stdio.h>
#include <string.h>

#include "base/param.h"
#include "graph/graph.h"
#include "nccl.h"

static void usage(FILE* out) {
  fprintf(out,
          "usage: braid-info [--version] [--env]\n"
          "                  [--topo [--topo-file FILE] [--dot FILE] [--expect FILE]]\n"
          "  --version         print Braid's version and the NCCL API level it implements\n"
          "  --env             print every BRAID_* parameter (NCCL_* aliases accepted) with its\n"
          "                    value, where the value came from, and what it does\n"
          "  --topo            detect this machine (or read --topo-file, NCCL's topology XML) and\n"
          "                    print GPUs, NICs, paths, and the rings and trees Braid would use\n"
          "  --topo-file FILE  read the topology from FILE instead of detecting it\n"
          "                    (default: BRAID_TOPO_FILE when set)\n"
          "  --dot FILE        also write a Graphviz picture of the topology to FILE\n"
          "  --expect FILE     compare the topology with the node FILE describes: exit 1\n"
          "                    when GPUs, paths between them or rings differ\n"
          "  BRAID_TOPO_DUMP_FILE=F braid-info --topo  writes the topology XML to F\n");
}

static int print_version(void) {
  int v = 0;
  ncclGetVersion(&v);
  printf("%s\nNCCL API version code %d\n", braidGetVersionString(), v);
  return 0;
}

int main(int argc, char** argv) {
  int want_version = 0, want_env = 0, want_topo = 0;
  const char* topo_file = NULL;
  const char* dot_file = NULL;
  const char* expect_file = NULL;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--version") == 0) {
      want_version = 1;
    } else if (strcmp(argv[i], "--env") == 0) {
      want_env = 1;
    } else if (strcmp(argv[i], "--topo") == 0) {
      want_topo = 1;
    } else if (strcmp(argv[i], "--topo-file") == 0 && i + 1 < argc) {
      topo_file = argv[++i];
      want_topo = 1;
    } else if (strcmp(argv[i], "--dot") == 0 && i + 1 < argc) {
      dot_file = argv[++i];
      want_topo = 1; /* a picture of the topology needs the topology */
    } else if (strcmp(argv[i], "--expect") == 0 && i + 1 < argc) {
      expect_file = argv[++i];
      want_topo = 1;
    } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      usage(stdout);
      return 0;
    } else {
      fprintf(stderr, "braid-info: unknown or incomplete argument '%s'\n", argv[i]);
      usage(stderr);
      return 2;
    }
  }
  if (!want_version && !want_env && !want_topo) {
    print_version();
    printf("(braid-info --help lists more)\n");
    return 0;
  }
  if (want_version) print_version();
  if (want_env) braid_param_print_all(stdout);
  if (want_topo) {
    ncclResult_t res = expect_file ? topo_compare(stdout, topo_file, expect_file)
                                   : topo_report(stdout, topo_file, dot_file);
    if (res != ncclSuccess) {
      fprintf(stderr, "braid-info: %s\n", ncclGetLastError(NULL));
      return 1;
    }
  }
  return 0;
}
