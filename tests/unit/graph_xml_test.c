/*
 * The XML reader/writer and NCCL's topology format: every fixture loads,
 * dumps and reloads to the same text and the same graph; an NCCL dump with
 * attributes and elements Braid does not use loads unchanged; malformed
 * files fail with an error naming the file, the line and what was expected.
 */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
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

/*
 * Malformed documents, each with the message it must give: "case.xml:LINE:"
 * first, then what was found and what was expected. Every case is parsed
 * and, when it parses, converted to a graph.
 */
struct malformed_case {
  const char* why;
  const char* text;
  const char* want; /* a part of the message, from the file and line on */
};

/* `body` on line 4, inside a GPU's <pci>. */
#define GPU_IN(body) \
  "<system>\n<cpu numaid=\"0\">\n<pci busid=\"0000:01:00.0\">\n" body "\n</pci></cpu></system>"

static const struct malformed_case malformed_cases[] = {
    {"missing attribute", GPU_IN("<gpu dev=\"0\"/>"), "case.xml:4: <gpu> has no sm attribute"},
    {"unclosed tag", "<system version=\"1\">\n  <cpu numaid=\"0\">\n</system>\n",
     "case.xml:3: malformed XML: </system> closes <cpu> opened at line 2: expected </cpu>"},
    {"truncated inside", "<system version=\"1\">\n  <cpu numaid=\"0\">\n",
     "case.xml:3: malformed XML: <cpu> opened at line 2 is never closed"},
    {"truncated tag", "<system version=\"1\">\n<cpu numaid=\"0\"",
     "case.xml:2: malformed XML: <cpu> is cut off"},
    {"garbage", "\x01\x02garbage",
     "case.xml:1: malformed XML: expected '<' starting the root element, found byte 0x01"},
    {"huge number", GPU_IN("<gpu dev=\"0\" sm=\"99999999999999999999999\"/>"),
     "case.xml:4: <gpu sm=\"99999999999999999999999\">: expected an integer from 10 to 10000"},
    {"negative device", GPU_IN("<gpu dev=\"-5\" sm=\"90\"/>"),
     "case.xml:4: <gpu dev=\"-5\">: expected an integer from 0 to 65535"},
    {"bad bus id", "<system>\n<cpu numaid=\"0\">\n<pci busid=\"not-a-bus\"/>\n</cpu></system>",
     "case.xml:3: <pci busid=\"not-a-bus\">: expected a PCI bus id"},
    {"bad number", "<system>\n<cpu numaid=\"0x\"/></system>",
     "case.xml:2: <cpu numaid=\"0x\">: expected an integer"},
    {"duplicate attribute", "<system a=\"1\" a=\"2\"/>",
     "case.xml:1: malformed XML: <system>: attribute a given twice: expected it once"},
    {"unterminated value", "<system version=\"1/>", "never closed: expected \""},
    {"missing =", "<system version 1/>",
     "case.xml:1: malformed XML: <system> attribute version: expected '='"},
    {"bad entity", "<system v=\"&bogus;\"/>",
     "case.xml:1: malformed XML: unknown character reference: expected &amp;"},
    {"empty", "", "case.xml:1: malformed XML: no element: expected a root element"},
    {"two roots", "<system/>\n<system/>",
     "case.xml:2: malformed XML: content after the end of <system>: expected end of file"},
    {"wrong root", "<graphs version=\"1\"/>",
     "case.xml:1: the root element is <graphs>: expected <system"},
    {"text content", "<system>text</system>",
     "case.xml:1: malformed XML: unexpected text inside <system>: expected '<'"},
    {"open comment", "<system>\n<!-- never closed",
     "case.xml:2: malformed XML: comment is never closed: expected \"-->\""},
    {"nvlink without count",
     GPU_IN("<gpu dev=\"0\" sm=\"90\">\n<nvlink target=\"0000:02:00.0\" tclass=\"0x030200\"/>"
            "</gpu>"),
     "case.xml:5: <nvlink> has no count attribute"},
    {"duplicate cpu", "<system>\n<cpu numaid=\"0\"/>\n<cpu numaid=\"0\"/>\n</system>",
     "case.xml:3: <cpu numaid=\"0\"> appears twice (also line 2): expected one <cpu> per numaid"},
    {"duplicate switch",
     "<system>\n<cpu numaid=\"0\">\n<pci busid=\"0000:10:00.0\"/>\n<pci busid=\"0000:10:00.0\"/>\n"
     "</cpu></system>",
     "case.xml:4: <pci busid=\"0000:10:00.0\"> appears twice (also line 3): expected one <pci>"},
    {"duplicate net",
     "<system>\n<cpu numaid=\"0\">\n<pci busid=\"0000:10:00.0\" class=\"0x020700\"><nic>\n"
     "<net name=\"a\" dev=\"0\"/>\n<net name=\"b\" dev=\"0\"/>\n</nic></pci></cpu></system>",
     "case.xml:5: <net dev=\"0\"> appears twice (also line 4): expected one <net> per dev"},
    {"GPU outside a pci",
     "<system>\n<cpu numaid=\"0\">\n<gpu dev=\"0\" sm=\"90\"/>\n</cpu></system>",
     "case.xml:3: <gpu> inside <cpu>: expected it inside a <pci busid=...> element"},
    {"'<' in a value", "<system>\n<cpu numaid=\"0<\"/></system>",
     "case.xml:2: malformed XML: <cpu> attribute numaid: '<' inside a value: expected \" first"},
    {"no value quotes", "<system>\n<cpu numaid=0/></system>",
     "case.xml:2: malformed XML: <cpu> attribute numaid: expected a quoted value"},
    {"bad close", "<system>\n</system x>", "case.xml:2: malformed XML: </system: expected '>'"},
    {"float out of range",
     "<system>\n<cpu numaid=\"0\">\n<pci busid=\"0000:10:00.0\" class=\"0x020700\"><nic>\n"
     "<net name=\"a\" dev=\"0\" latency=\"-3\"/>\n</nic></pci></cpu></system>",
     "case.xml:4: <net latency=\"-3\">: expected a number from 0"},
    {"nvlink to a bad bus id",
     GPU_IN("<gpu dev=\"0\" sm=\"90\">\n<nvlink target=\"zz\" count=\"2\" "
            "tclass=\"0x030200\"/></gpu>"),
     "case.xml:5: <nvlink target=\"zz\">: expected a PCI bus id"},
};

static void expect_error(const struct malformed_case* c) {
  struct xml_doc* doc = NULL;
  struct topo_system* sys = NULL;
  braid_err_clear();
  ncclResult_t res = xml_parse_buffer(c->text, strlen(c->text), "case.xml", &doc);
  if (res == ncclSuccess) res = topo_xml_to_system(doc, &sys);
  const char* msg = braid_err_last();
  TEST_CHECK(res == ncclInvalidUsage, "%s: returned %d, expected ncclInvalidUsage", c->why,
             (int)res);
  TEST_CHECK(strstr(msg, c->want) != NULL, "%s: message \"%s\" lacks \"%s\"", c->why, msg, c->want);
  /* File and line first, and always what was expected. */
  int line = 0, n = 0;
  const char* at = strstr(msg, "case.xml:");
  TEST_CHECK(at && sscanf(at, "case.xml:%d:%n", &line, &n) == 1 && n > 0 && line >= 1,
             "%s: no file:line in \"%s\"", c->why, msg);
  TEST_CHECK(strstr(msg, "expected") != NULL, "%s: \"%s\" does not say what was expected", c->why,
             msg);
  topo_system_free(sys);
  xml_doc_free(doc);
}

/* Limits: names, values, depth, attributes. */
static void test_limits(void) {
  static char text[1 << 16];
  struct malformed_case c = {"deep nesting", text, "nested deeper than 64 levels: expected fewer"};
  text[0] = '\0';
  for (int i = 0; i < 70; i++) strcat(text, "<a>");
  expect_error(&c);
  snprintf(text, sizeof text, "<system>\n<%0100d/></system>", 0);
  text[10] = 'x'; /* a 100-character element name */
  c = (struct malformed_case){"long name", text, "case.xml:2: malformed XML: an element name"};
  expect_error(&c);
  int len = snprintf(text, sizeof text, "<system>\n<cpu numaid=\"");
  memset(text + len, '7', 2000);
  snprintf(text + len + 2000, sizeof text - (size_t)len - 2000, "\"/></system>");
  c = (struct malformed_case){"long value", text,
                              "case.xml:2: malformed XML: <cpu> attribute "
                              "numaid: value longer than 1023 characters"};
  expect_error(&c);
  len = snprintf(text, sizeof text, "<system");
  for (int i = 0; i < 70; i++)
    len += snprintf(text + len, sizeof text - (size_t)len, " a%d=\"1\"", i);
  snprintf(text + len, sizeof text - (size_t)len, "/>");
  c = (struct malformed_case){"many attributes", text,
                              "case.xml:1: malformed XML: <system>: more "
                              "than 64 attributes: expected fewer"};
  expect_error(&c);
}

static void test_malformed(void) {
  for (size_t i = 0; i < sizeof malformed_cases / sizeof malformed_cases[0]; i++)
    expect_error(&malformed_cases[i]);
  test_limits();
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
