/*
 * The XML reader/writer and NCCL's topology format: every fixture loads,
 * dumps and reloads to the same text and the same graph; an NCCL dump with
 * attributes and elements Braid does not use loads unchanged; malformed
 * files fail with an error naming the file, the line and what was expected.
 */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "graph/topo.h"
#include "test.h"

static const char* fixtures[] = {
    "h200x2_nvswitch.xml",    "h200x4_nvswitch.xml", "h200x8_nvswitch.xml",
    "pcie_4gpu_2socket.xml",  "ib_nic_node.xml",     "twohost_b.xml",
    "nvlink_bridge_3gpu.xml", "nccl_dump_vm.xml",    "nccl_h200x2_dump.xml"};

static const char* fixture(const char* name) {
  static char path[512];
  snprintf(path, sizeof path, "%s/%s", BRAID_FIXTURES, name);
  return path;
}

static int graph_links(const struct topo_system* sys) {
  int n = 0;
  for (int i = 0; i < sys->nnodes; i++) n += sys->nodes[i].nlinks;
  return n;
}

/* Load, write, reload: same text, same graph. */
static void test_round_trip(const char* name) {
  struct xml_doc *a = NULL, *b = NULL;
  struct topo_system *sa = NULL, *sb = NULL;
  char *ta = NULL, *tb = NULL;
  size_t la = 0, lb = 0;
  TEST_EXPECT_RES(xml_parse_file(fixture(name), &a), ncclSuccess);
  if (a == NULL) return;
  TEST_EXPECT_RES(xml_write_string(a, &ta, &la), ncclSuccess);
  TEST_EXPECT_RES(xml_parse_buffer(ta, la, "rewritten", &b), ncclSuccess);
  if (b) TEST_EXPECT_RES(xml_write_string(b, &tb, &lb), ncclSuccess);
  TEST_CHECK(ta && tb && la == lb && memcmp(ta, tb, la) == 0, "%s: rewritten text differs", name);
  TEST_EXPECT_RES(topo_xml_to_system(a, &sa), ncclSuccess);
  if (b) TEST_EXPECT_RES(topo_xml_to_system(b, &sb), ncclSuccess);
  if (sa && sb) {
    TEST_CHECK(sa->nnodes == sb->nnodes, "%s: %d nodes, %d after a round trip", name, sa->nnodes,
               sb->nnodes);
    TEST_CHECK(graph_links(sa) == graph_links(sb), "%s: links differ after a round trip", name);
    for (int t = 0; t < TOPO_NODE_TYPES; t++)
      TEST_CHECK(topo_system_count(sa, t) == topo_system_count(sb, t), "%s: %s count differs", name,
                 topo_node_type_name(t));
  }
  topo_system_free(sa);
  topo_system_free(sb);
  free(ta);
  free(tb);
  xml_doc_free(a);
  xml_doc_free(b);
}

/* What each fixture must contain. */
static void test_contents(void) {
  struct {
    const char* name;
    int gpus, nvs, cpus, nets, pcis;
  } want[] = {
      {"h200x2_nvswitch.xml", 2, 1, 2, 1, 2},
      {"h200x4_nvswitch.xml", 4, 1, 2, 0, 4},
      {"h200x8_nvswitch.xml", 8, 1, 2, 0, 8},
      {"pcie_4gpu_2socket.xml", 4, 0, 2, 0, 2},
      {"ib_nic_node.xml", 4, 1, 2, 3, 2},
      {"nvlink_bridge_3gpu.xml", 3, 0, 1, 0, 0},
      {"nccl_dump_vm.xml", 2, 1, 1, 2, 0},
      {"nccl_h200x2_dump.xml", 2, 1, 1, 1, 0}, /* NCCL 2.28's own dump from the 2x H200 machine */
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    struct xml_doc* doc = NULL;
    struct topo_system* sys = NULL;
    TEST_EXPECT_RES(xml_parse_file(fixture(want[i].name), &doc), ncclSuccess);
    if (doc) TEST_EXPECT_RES(topo_xml_to_system(doc, &sys), ncclSuccess);
    if (sys) {
      TEST_CHECK(topo_system_count(sys, TOPO_GPU) == want[i].gpus, "%s: GPUs", want[i].name);
      TEST_CHECK(topo_system_count(sys, TOPO_NVS) == want[i].nvs, "%s: NVSwitch", want[i].name);
      TEST_CHECK(topo_system_count(sys, TOPO_CPU) == want[i].cpus, "%s: CPUs", want[i].name);
      TEST_CHECK(topo_system_count(sys, TOPO_NET) == want[i].nets, "%s: network ports %d",
                 want[i].name, topo_system_count(sys, TOPO_NET));
      TEST_CHECK(topo_system_count(sys, TOPO_PCI) == want[i].pcis, "%s: PCI switches %d",
                 want[i].name, topo_system_count(sys, TOPO_PCI));
    }
    topo_system_free(sys);
    xml_doc_free(doc);
  }
}

/* Parses `text` (as "case.xml") and converts it; expects failure with `want` in the message. */
static void expect_error(const char* text, const char* want, const char* why) {
  struct xml_doc* doc = NULL;
  struct topo_system* sys = NULL;
  braid_err_clear();
  ncclResult_t res = xml_parse_buffer(text, strlen(text), "case.xml", &doc);
  if (res == ncclSuccess) res = topo_xml_to_system(doc, &sys);
  TEST_CHECK(res == ncclInvalidUsage, "%s: returned %d, expected ncclInvalidUsage", why, (int)res);
  TEST_CHECK(strstr(braid_err_last(), want) != NULL, "%s: message \"%s\" lacks \"%s\"", why,
             braid_err_last(), want);
  topo_system_free(sys);
  xml_doc_free(doc);
}

static void test_malformed(void) {
  expect_error(
      "<system version=\"1\">\n<cpu numaid=\"0\">\n<pci busid=\"0000:01:00.0\">\n<gpu dev=\"0\"/>\n"
      "</pci>\n</cpu>\n</system>\n",
      "case.xml:4: <gpu> has no sm attribute", "missing attribute");
  expect_error(
      "<system version=\"1\">\n  <cpu numaid=\"0\">\n</system>\n",
      "case.xml:3: malformed XML: </system> closes <cpu> opened at line 2: expected </cpu>",
      "unclosed tag");
  expect_error("<system version=\"1\">\n  <cpu numaid=\"0\">\n",
               "case.xml:3: malformed XML: <cpu> opened at line 2 is never closed",
               "truncated inside");
  expect_error("<system version=\"1\">\n<cpu numaid=\"0\"",
               "case.xml:2: malformed XML: <cpu> is cut off", "truncated tag");
  expect_error("\x01\x02garbage",
               "case.xml:1: malformed XML: expected '<' starting the root element, found byte 0x01",
               "garbage");
  expect_error(
      "<system>\n<cpu numaid=\"0\">\n<pci busid=\"0000:01:00.0\">\n<gpu dev=\"0\" "
      "sm=\"99999999999999999999999\"/>\n"
      "</pci></cpu></system>",
      "case.xml:4: <gpu sm=\"99999999999999999999999\">: expected an integer from 10 to 10000",
      "huge number");
  expect_error(
      "<system>\n<cpu numaid=\"0\">\n<pci busid=\"0000:01:00.0\">\n<gpu dev=\"-5\" "
      "sm=\"90\"/>\n</pci></cpu></system>",
      "case.xml:4: <gpu dev=\"-5\">: expected an integer from 0 to 65535", "negative device");
  expect_error("<system>\n<cpu numaid=\"0\">\n<pci busid=\"not-a-bus\"/>\n</cpu></system>",
               "case.xml:3: <pci busid=\"not-a-bus\">: expected a PCI bus id", "bad bus id");
  expect_error("<system>\n<cpu numaid=\"0x\"/></system>", "case.xml:2: <cpu numaid=\"0x\">",
               "bad number");
  expect_error("<system a=\"1\" a=\"2\"/>",
               "case.xml:1: malformed XML: <system>: attribute a given twice",
               "duplicate attribute");
  expect_error("<system version=\"1/>", "never closed: expected \"", "unterminated value");
  expect_error("<system version 1/>",
               "case.xml:1: malformed XML: <system> attribute version: expected '='", "missing =");
  expect_error("<system v=\"&bogus;\"/>", "unknown character reference", "bad entity");
  expect_error("", "case.xml:1: malformed XML: no element", "empty");
  expect_error("<system/><system/>", "content after the end of <system>", "two roots");
  expect_error("<graphs version=\"1\"/>",
               "case.xml:1: the root element is <graphs>: expected <system", "wrong root");
  expect_error("<system>text</system>", "unexpected text inside <system>: expected '<'",
               "text content");
  expect_error("<system>\n<!-- never closed", "case.xml:2: malformed XML: comment is never closed",
               "open comment");
  char deep[4096] = "";
  for (int i = 0; i < 70; i++) strcat(deep, "<a>");
  expect_error(deep, "nested deeper than 64 levels", "deep nesting");
  expect_error(
      "<system>\n<cpu numaid=\"0\">\n<pci busid=\"0000:01:00.0\"><gpu dev=\"0\" sm=\"90\">\n"
      "<nvlink target=\"0000:02:00.0\" tclass=\"0x030200\"/></gpu></pci></cpu></system>",
      "case.xml:4: <nvlink> has no count attribute", "nvlink without count");
  expect_error("<system>\n<cpu numaid=\"0\"/>\n<cpu numaid=\"0\"/>\n</system>",
               "case.xml:3: <cpu numaid=\"0\"> appears twice (also line 2)", "duplicate cpu");
  /* A missing file names itself. */
  struct xml_doc* doc = NULL;
  TEST_EXPECT_RES(xml_parse_file("/nonexistent/topo.xml", &doc), ncclSystemError);
  TEST_CHECK(strstr(braid_err_last(), "/nonexistent/topo.xml") != NULL, "missing file: %s",
             braid_err_last());
}

/* Entities and quotes survive a round trip. */
static void test_escaping(void) {
  const char* text =
      "<?xml version=\"1.0\"?>\n<!-- c -->\n<system name='a&amp;b &lt;&quot;&gt; &#65;'/>\n";
  struct xml_doc *doc = NULL, *again = NULL;
  char* out = NULL;
  size_t len = 0;
  TEST_EXPECT_RES(xml_parse_buffer(text, strlen(text), "escape", &doc), ncclSuccess);
  if (doc == NULL) return;
  TEST_CHECK(strcmp(xml_attr_get(doc->root, "name"), "a&b <\"> A") == 0, "decoded: %s",
             xml_attr_get(doc->root, "name"));
  TEST_EXPECT_RES(xml_write_string(doc, &out, &len), ncclSuccess);
  TEST_EXPECT_RES(xml_parse_buffer(out, len, "escape2", &again), ncclSuccess);
  TEST_CHECK(again && strcmp(xml_attr_get(again->root, "name"), "a&b <\"> A") == 0, "re-decoded");
  free(out);
  xml_doc_free(doc);
  xml_doc_free(again);
}

/* Merging per-rank descriptions gives the whole node, whatever was split off. */
static void test_fuse(void) {
  struct xml_doc *whole = NULL, *merged = NULL;
  TEST_EXPECT_RES(xml_parse_file(fixture("ib_nic_node.xml"), &whole), ncclSuccess);
  TEST_EXPECT_RES(xml_doc_create("merged", &merged), ncclSuccess);
  if (!whole || !merged) return;
  TEST_EXPECT_RES(topo_xml_fuse(merged, whole), ncclSuccess);
  TEST_EXPECT_RES(topo_xml_fuse(merged, whole), ncclSuccess); /* twice: nothing new */
  char *a = NULL, *b = NULL;
  size_t la = 0, lb = 0;
  TEST_EXPECT_RES(xml_write_string(whole, &a, &la), ncclSuccess);
  TEST_EXPECT_RES(xml_write_string(merged, &b, &lb), ncclSuccess);
  TEST_CHECK(a && b && la == lb && memcmp(a, b, la) == 0,
             "fusing a document with itself changed it");
  free(a);
  free(b);
  xml_doc_free(whole);
  xml_doc_free(merged);
}

int main(void) {
  setenv("BRAID_DEBUG", "NONE", 1); /* the malformed cases WARN by design */
  for (size_t i = 0; i < sizeof fixtures / sizeof fixtures[0]; i++) test_round_trip(fixtures[i]);
  test_contents();
  test_malformed();
  test_escaping();
  test_fuse();
  return test_summary();
}
