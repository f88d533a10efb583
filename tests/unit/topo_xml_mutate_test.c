/*
 * Robustness of the topology reader without a fuzzer: a few hundred
 * deterministic mutants of every fixture (truncated, bytes flipped, ranges
 * deleted or repeated, XML-ish tokens and huge numbers spliced in) go
 * through the parser, the graph builder and, when they still describe
 * GPUs, the whole search. Each must succeed or fail with ncclInvalidUsage
 * and a message naming the document; none may crash (run it under
 * BRAID_ASAN/BRAID_UBSAN for the full effect).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "graph/topo.h"
#include "test.h"

static const char* fixtures[] = {
    "h200x2_nvswitch.xml",    "h200x8_nvswitch.xml", "pcie_4gpu_2socket.xml", "ib_nic_node.xml",
    "nvlink_bridge_3gpu.xml", "nccl_dump_vm.xml",    "nccl_h200x2_dump.xml"};
static const char* tokens[] = {
    "<",
    ">",
    "/>",
    "\"",
    "'",
    "=",
    "</cpu>",
    "<pci busid=\"0000:01:00.0\">",
    "<gpu dev=\"0\" sm=\"90\"/>",
    "99999999999999999999",
    "-1",
    "0x",
    "fffffff:ff:ff.0",
    "&amp;",
    "&",
    "<!--",
    "-->",
    "<?",
    "\n",
    "\0",
    "<nvlink target=\"0000:19:00.0\" count=\"1000\" tclass=\"0x030200\"/>",
    "<net name=\"x\" dev=\"0\"/>",
    "<cpu numaid=\"0\">",
    "sm=\"1e9\""};

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;
static uint64_t rng(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

static char* read_fixture(const char* name, size_t* len) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", BRAID_FIXTURES, name);
  FILE* f = fopen(path, "rb");
  if (f == NULL) return NULL;
  char* buf = malloc(1 << 16);
  *len = buf ? fread(buf, 1, 1 << 16, f) : 0;
  fclose(f);
  return buf;
}

/* One mutant of `src` into `dst` (capacity cap); returns its length. */
static size_t mutate(const char* src, size_t len, char* dst, size_t cap, int kind) {
  size_t a = len ? rng() % len : 0, b = len ? rng() % len : 0, n = 0;
  if (a > b) {
    size_t t = a;
    a = b;
    b = t;
  }
  switch (kind % 5) {
    case 0: /* truncate */
      memcpy(dst, src, a);
      return a;
    case 1: /* flip a few bytes */
      memcpy(dst, src, len);
      for (int i = 0; i < 1 + (int)(rng() % 4) && len; i++)
        dst[rng() % len] ^= (char)(1u << (rng() % 8));
      return len;
    case 2: /* delete [a, b) */
      memcpy(dst, src, a);
      memcpy(dst + a, src + b, len - b);
      return len - (b - a);
    case 3: { /* splice a token at a */
      const char* tok = tokens[rng() % (sizeof tokens / sizeof tokens[0])];
      size_t tl = strlen(tok) ? strlen(tok) : 1;
      memcpy(dst, src, a);
      memcpy(dst + a, tok, tl);
      memcpy(dst + a + tl, src + a, len - a);
      return len + tl;
    }
    default: /* repeat [a, b) */
      if (len + (b - a) > cap) b = a;
      memcpy(dst, src, b);
      memcpy(dst + b, src + a, b - a);
      n = b + (b - a);
      memcpy(dst + n, src + b, len - b);
      return n + len - b;
  }
}

/* Parses and builds one mutant: 1 when it was accepted whole, 0 rejected. */
static int try_mutant(const char* text, size_t len, const char* source) {
  struct xml_doc* doc = NULL;
  struct topo_system* sys = NULL;
  struct braid_topo* topo = NULL;
  braid_err_clear();
  ncclResult_t res = xml_parse_buffer(text, len, source, &doc);
  if (res == ncclSuccess) res = topo_xml_to_system(doc, &sys);
  if (res == ncclSuccess) {
    int ngpus = topo_system_count(sys, TOPO_GPU);
    int nranks = ngpus < 8 ? ngpus : 8, rank_host[8] = {0};
    if (nranks > 0) res = topo_build(&doc, 1, rank_host, NULL, nranks, NULL, &topo);
    if (res == ncclSuccess && topo) {
      const struct braid_rings* r = topo_rings(topo);
      TEST_CHECK(r->nchannels >= 1 && r->order != NULL, "%s: accepted but no rings", source);
    }
  }
  TEST_CHECK(res == ncclSuccess || res == ncclInvalidUsage, "%s: returned %d", source, (int)res);
  if (res != ncclSuccess)
    TEST_CHECK(strstr(braid_err_last(), source) != NULL, "%s: message does not name it: %s", source,
               braid_err_last());
  topo_free(topo);
  topo_system_free(sys);
  xml_doc_free(doc);
  return res == ncclSuccess;
}

int main(void) {
  setenv("BRAID_DEBUG", "NONE", 1);
  static char mutant[1 << 18];
  int accepted = 0, total = 0;
  for (size_t f = 0; f < sizeof fixtures / sizeof fixtures[0]; f++) {
    size_t len = 0;
    char* text = read_fixture(fixtures[f], &len);
    TEST_CHECK(text != NULL, "cannot read %s", fixtures[f]);
    if (text == NULL) continue;
    for (int i = 0; i < 80; i++) {
      char source[64];
      snprintf(source, sizeof source, "mutant-%zu-%d", f, i);
      size_t n = mutate(text, len, mutant, sizeof mutant, i);
      accepted += try_mutant(mutant, n, source);
      total++;
    }
    /* Every truncation point of the smallest fixtures. */
    for (size_t cut = 0; f == 0 && cut < len; cut += 7) {
      char source[64];
      snprintf(source, sizeof source, "truncated-%zu", cut);
      accepted += try_mutant(text, cut, source);
      total++;
    }
    free(text);
  }
  fprintf(stderr, "%d of %d mutants accepted, the rest rejected cleanly\n", accepted, total);
  TEST_CHECK(total >= 300, "only %d mutants", total);
  return test_summary();
}
