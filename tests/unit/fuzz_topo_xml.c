/*
 * libFuzzer harness for the topology reader (BRAID_FUZZ=ON, clang only):
 * bytes -> XML parser -> node graph -> paths, rings, trees and tuning for
 * the GPUs it describes, as one host and as three. Any crash, leak or sanitizer report is a bug; an
 * error return is the expected answer to bad input.
 *
 *   CC=clang cmake -B build-fuzz -DBRAID_FUZZ=ON
 *   cmake --build build-fuzz --target fuzz_topo_xml
 *   mkdir corpus && cp tests/unit/fixtures/[a-z]?*.xml corpus
 *   build-fuzz/tests/unit/fuzz_topo_xml -max_total_time=300 corpus
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "graph/topo.h"

int LLVMFuzzerInitialize(int* argc, char*** argv);
int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int LLVMFuzzerInitialize(int* argc, char*** argv) {
  (void)argc;
  (void)argv;
  setenv("BRAID_DEBUG", "NONE", 1); /* every rejected input would WARN */
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  struct xml_doc* doc = NULL;
  struct topo_system* sys = NULL;
  struct braid_topo* topo = NULL;
  int rank_host[8] = {0};
  if (xml_parse_buffer((const char*)data, size, "fuzz", &doc) == ncclSuccess &&
      topo_xml_to_system(doc, &sys) == ncclSuccess) {
    int n = topo_system_count(sys, TOPO_GPU);
    if (n > 8) n = 8;
    if (n > 0 && topo_build(&doc, 1, rank_host, NULL, n, NULL, &topo) == ncclSuccess) {
      struct braid_tune_choice c;
      tune_choose_topo(topo, BRAID_COLL_ALLREDUCE, size, ~0u, ~0u, &c);
      topo_free(topo);
      topo = NULL;
      /* Three hosts of this node: the search across NICs, twins, double binary trees. */
      struct xml_doc* docs[3] = {doc, doc, doc};
      int hosts[24];
      for (int i = 0; i < 3 * n; i++) hosts[i] = i / n;
      if (topo_build(docs, 3, hosts, NULL, 3 * n, NULL, &topo) == ncclSuccess)
        tune_choose_topo(topo, BRAID_COLL_ALLREDUCE, size, ~0u, ~0u, &c);
    }
  }
  topo_free(topo);
  topo_system_free(sys);
  xml_doc_free(doc);
  return 0;
}
