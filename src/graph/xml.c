/*
 * The XML reader and writer behind topology and graph files (see xml.h).
 * The reader is a recursive-descent parser over a byte buffer that counts
 * lines as it goes, so that every error can name the line a user has to fix.
 * It is fed untrusted files (BRAID_TOPO_FILE) and is fuzzed
 * (tests/unit/fuzz_topo_xml.c): every length, depth and count is bounded.
 */
#include "graph/xml.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/utils.h"

struct xml_parser {
  const char* buf;
  size_t len;
  size_t pos;
  int line;
  struct xml_doc* doc;
};

/* Logs "source:line: message" once and returns ncclInvalidUsage. */
static ncclResult_t xml_parse_error(const struct xml_parser* p, int line, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
static ncclResult_t xml_parse_error(const struct xml_parser* p, int line, const char* fmt, ...) {
  char what[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  return braid_err(ncclInvalidUsage, "%s:%d: malformed XML: %s", p->doc->source, line, what);
}

/* A printable description of the byte at the cursor, for error messages. */
static const char* xml_parse_found(const struct xml_parser* p, char* buf, size_t size) {
  if (p->pos >= p->len) return "end of file";
  unsigned char c = (unsigned char)p->buf[p->pos];
  if (c >= 0x20 && c < 0x7f)
    snprintf(buf, size, "'%c'", c);
  else
    snprintf(buf, size, "byte 0x%02x", c);
  return buf;
}

static int xml_parse_peek(const struct xml_parser* p, const char* s) {
  size_t n = strlen(s);
  return p->len - p->pos >= n && memcmp(p->buf + p->pos, s, n) == 0;
}

static void xml_parse_advance(struct xml_parser* p, size_t n) {
  for (size_t i = 0; i < n && p->pos < p->len; i++) {
    if (p->buf[p->pos] == '\n') p->line++;
    p->pos++;
  }
}

static int xml_is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static void xml_parse_skip_space(struct xml_parser* p) {
  while (p->pos < p->len && xml_is_space(p->buf[p->pos])) xml_parse_advance(p, 1);
}

/* Skips until `end` (included); fails when the file ends first. */
static ncclResult_t xml_parse_skip_until(struct xml_parser* p, const char* end, const char* what) {
  int start = p->line;
  while (p->pos < p->len && !xml_parse_peek(p, end)) xml_parse_advance(p, 1);
  if (p->pos >= p->len)
    return xml_parse_error(p, start, "%s is never closed: expected \"%s\"", what, end);
  xml_parse_advance(p, strlen(end));
  return ncclSuccess;
}

/* Skips whitespace, comments, <?...?> and <!DOCTYPE ...> between elements. */
static ncclResult_t xml_parse_skip_misc(struct xml_parser* p) {
  ncclResult_t res = ncclSuccess;
  for (;;) {
    xml_parse_skip_space(p);
    if (xml_parse_peek(p, "<!--"))
      BRAID_TRY(xml_parse_skip_until(p, "-->", "comment"));
    else if (xml_parse_peek(p, "<?"))
      BRAID_TRY(xml_parse_skip_until(p, "?>", "<? ... ?>"));
    else if (xml_parse_peek(p, "<!"))
      BRAID_TRY(xml_parse_skip_until(p, ">", "<! ... >"));
    else
      return ncclSuccess;
  }
fail:
  return res;
}

static int xml_is_name_char(char c, int first) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':') return 1;
  return !first && ((c >= '0' && c <= '9') || c == '-' || c == '.');
}

static ncclResult_t xml_parse_name(struct xml_parser* p, char* out, const char* what) {
  size_t n = 0;
  char found[32];
  if (p->pos >= p->len || !xml_is_name_char(p->buf[p->pos], 1))
    return xml_parse_error(p, p->line, "expected %s, found %s", what,
                           xml_parse_found(p, found, sizeof found));
  while (p->pos < p->len && xml_is_name_char(p->buf[p->pos], 0)) {
    if (n + 1 >= XML_NAME_MAX)
      return xml_parse_error(p, p->line, "%s longer than %d characters: expected a shorter name",
                             what, XML_NAME_MAX - 1);
    out[n++] = p->buf[p->pos++];
  }
  out[n] = '\0';
  return ncclSuccess;
}

/* Decodes one entity at the cursor (just after '&') into *c. */
static ncclResult_t xml_parse_entity(struct xml_parser* p, char* c) {
  static const struct {
    const char* name;
    char c;
  } names[] = {{"amp;", '&'}, {"lt;", '<'}, {"gt;", '>'}, {"quot;", '"'}, {"apos;", '\''}};
  for (size_t i = 0; i < BRAID_ARRAY_LEN(names); i++) {
    if (xml_parse_peek(p, names[i].name)) {
      *c = names[i].c;
      xml_parse_advance(p, strlen(names[i].name));
      return ncclSuccess;
    }
  }
  if (xml_parse_peek(p, "#")) {
    int hex = xml_parse_peek(p, "#x");
    xml_parse_advance(p, hex ? 2 : 1);
    unsigned v = 0;
    int digits = 0;
    while (p->pos < p->len && p->buf[p->pos] != ';' && digits < 4) {
      char d = p->buf[p->pos];
      int dv = d >= '0' && d <= '9'          ? d - '0'
               : hex && d >= 'a' && d <= 'f' ? d - 'a' + 10
               : hex && d >= 'A' && d <= 'F' ? d - 'A' + 10
                                             : -1;
      if (dv < 0) break;
      v = v * (hex ? 16 : 10) + (unsigned)dv;
      digits++;
      p->pos++;
    }
    if (digits > 0 && xml_parse_peek(p, ";") && v > 0 && v < 0x80) {
      *c = (char)v;
      p->pos++;
      return ncclSuccess;
    }
  }
  return xml_parse_error(p, p->line,
                         "unknown character reference: expected &amp; &lt; &gt; &quot; &apos; "
                         "or an ASCII &#N;");
}

/* Reads a quoted attribute value into a new string (*out, caller frees). */
static ncclResult_t xml_parse_value(struct xml_parser* p, const char* elem, const char* key,
                                    char** out) {
  ncclResult_t res = ncclSuccess;
  char found[32];
  char* value = NULL;
  size_t n = 0;
  int start = p->line;
  *out = NULL;
  if (p->pos >= p->len || (p->buf[p->pos] != '"' && p->buf[p->pos] != '\''))
    return xml_parse_error(p, p->line, "<%s> attribute %s: expected a quoted value, found %s", elem,
                           key, xml_parse_found(p, found, sizeof found));
  char quote = p->buf[p->pos++];
  BRAID_TRY(BRAID_CALLOC(&value, XML_VALUE_MAX, "an XML attribute value"));
  for (;;) {
    if (p->pos >= p->len) {
      res = xml_parse_error(p, start, "<%s> attribute %s: value never closed: expected %c", elem,
                            key, quote);
      goto fail;
    }
    char c = p->buf[p->pos];
    if (c == quote) break;
    if (c == '<') {
      res = xml_parse_error(p, p->line, "<%s> attribute %s: '<' inside a value: expected %c first",
                            elem, key, quote);
      goto fail;
    }
    if (c == '&') {
      p->pos++;
      BRAID_TRY(xml_parse_entity(p, &c));
    } else {
      xml_parse_advance(p, 1);
    }
    if (n + 1 >= XML_VALUE_MAX) {
      res = xml_parse_error(p, start,
                            "<%s> attribute %s: value longer than %d characters: "
                            "expected a shorter value",
                            elem, key, XML_VALUE_MAX - 1);
      goto fail;
    }
    value[n++] = c;
  }
  p->pos++; /* the closing quote */
  value[n] = '\0';
  *out = value;
  return ncclSuccess;
fail:
  free(value);
  return res;
}

/* Parses the attributes of <elem ...> up to (not including) '>' or '/>'. */
static ncclResult_t xml_parse_attrs(struct xml_parser* p, struct xml_node* node) {
  ncclResult_t res = ncclSuccess;
  char key[XML_NAME_MAX];
  char* value = NULL;
  char found[32];
  for (;;) {
    size_t before = p->pos;
    xml_parse_skip_space(p);
    if (p->pos >= p->len)
      return xml_parse_error(p, node->line, "<%s> is cut off: expected '>' or '/>'", node->name);
    if (xml_parse_peek(p, ">") || xml_parse_peek(p, "/>")) return ncclSuccess;
    if (before == p->pos)
      return xml_parse_error(p, p->line, "<%s>: expected a space, '>' or '/>', found %s",
                             node->name, xml_parse_found(p, found, sizeof found));
    BRAID_TRY(xml_parse_name(p, key, "an attribute name"));
    xml_parse_skip_space(p);
    if (!xml_parse_peek(p, "="))
      return xml_parse_error(p, p->line, "<%s> attribute %s: expected '=', found %s", node->name,
                             key, xml_parse_found(p, found, sizeof found));
    p->pos++;
    xml_parse_skip_space(p);
    if (xml_attr_get(node, key) != NULL)
      return xml_parse_error(p, p->line, "<%s>: attribute %s given twice: expected it once",
                             node->name, key);
    if (node->nattrs >= XML_MAX_ATTRS)
      return xml_parse_error(p, p->line, "<%s>: more than %d attributes: expected fewer",
                             node->name, XML_MAX_ATTRS);
    BRAID_TRY(xml_parse_value(p, node->name, key, &value));
    BRAID_TRY(xml_attr_set(node, key, value));
    free(value);
    value = NULL;
  }
fail:
  free(value);
  return res;
}

static ncclResult_t xml_parse_element(struct xml_parser* p, struct xml_node* parent, int depth);

/* Parses what follows <elem ...>: children, then </elem>. */
static ncclResult_t xml_parse_content(struct xml_parser* p, struct xml_node* node, int depth) {
  ncclResult_t res = ncclSuccess;
  char name[XML_NAME_MAX];
  char found[32];
  for (;;) {
    BRAID_TRY(xml_parse_skip_misc(p));
    if (p->pos >= p->len)
      return xml_parse_error(p, p->line, "<%s> opened at line %d is never closed: expected </%s>",
                             node->name, node->line, node->name);
    if (xml_parse_peek(p, "</")) break;
    if (p->buf[p->pos] != '<')
      return xml_parse_error(p, p->line, "unexpected text inside <%s>: expected '<', found %s",
                             node->name, xml_parse_found(p, found, sizeof found));
    BRAID_TRY(xml_parse_element(p, node, depth + 1));
  }
  p->pos += 2;
  BRAID_TRY(xml_parse_name(p, name, "the name of a closing tag"));
  if (strcmp(name, node->name) != 0)
    return xml_parse_error(p, p->line, "</%s> closes <%s> opened at line %d: expected </%s>", name,
                           node->name, node->line, node->name);
  xml_parse_skip_space(p);
  if (!xml_parse_peek(p, ">"))
    return xml_parse_error(p, p->line, "</%s: expected '>', found %s", name,
                           xml_parse_found(p, found, sizeof found));
  p->pos++;
fail:
  return res;
}

/* Parses one element at the cursor ('<'), adding it under `parent`. */
static ncclResult_t xml_parse_element(struct xml_parser* p, struct xml_node* parent, int depth) {
  ncclResult_t res = ncclSuccess;
  struct xml_node* node = NULL;
  char name[XML_NAME_MAX];
  int line = p->line;
  if (depth > XML_MAX_DEPTH)
    return xml_parse_error(p, line, "elements nested deeper than %d levels: expected fewer",
                           XML_MAX_DEPTH);
  if (p->doc->nnodes >= XML_MAX_NODES)
    return xml_parse_error(p, line, "more than %d elements: expected fewer", XML_MAX_NODES);
  p->pos++; /* '<' */
  BRAID_TRY(xml_parse_name(p, name, "an element name after '<'"));
  BRAID_TRY(xml_node_add(p->doc, parent, name, &node));
  node->line = line;
  BRAID_TRY(xml_parse_attrs(p, node));
  if (xml_parse_peek(p, "/>")) {
    p->pos += 2;
    return ncclSuccess;
  }
  p->pos++; /* '>' */
  BRAID_TRY(xml_parse_content(p, node, depth));
fail:
  return res;
}

ncclResult_t xml_parse_buffer(const char* buf, size_t len, const char* source,
                              struct xml_doc** out) {
  ncclResult_t res = ncclSuccess;
  struct xml_parser p = {.buf = buf, .len = len, .pos = 0, .line = 1, .doc = NULL};
  char found[32];
  *out = NULL;
  BRAID_TRY(xml_doc_create(source, &p.doc));
  BRAID_TRY(xml_parse_skip_misc(&p));
  if (p.pos >= p.len) {
    res = xml_parse_error(&p, p.line, "no element: expected a root element such as <system>");
    goto fail;
  }
  if (p.buf[p.pos] != '<' || xml_parse_peek(&p, "</")) {
    res = xml_parse_error(&p, p.line, "expected '<' starting the root element, found %s",
                          xml_parse_found(&p, found, sizeof found));
    goto fail;
  }
  BRAID_TRY(xml_parse_element(&p, NULL, 1));
  BRAID_TRY(xml_parse_skip_misc(&p));
  if (p.pos < p.len) {
    res = xml_parse_error(&p, p.line, "content after the end of <%s>: expected end of file",
                          p.doc->root->name);
    goto fail;
  }
  *out = p.doc;
  return ncclSuccess;
fail:
  xml_doc_free(p.doc);
  return res;
}

ncclResult_t xml_parse_file(const char* path, struct xml_doc** out) {
  ncclResult_t res = ncclSuccess;
  char* buf = NULL;
  size_t len = 0, cap = 0;
  *out = NULL;
  FILE* f = fopen(path, "rb");
  if (f == NULL)
    return braid_err(ncclSystemError, "cannot open XML file %s: %s", path, strerror(errno));
  for (;;) {
    if (len + 4096 > cap) {
      if (cap >= (64u << 20)) {
        res = braid_err(ncclInvalidUsage, "%s: larger than 64 MiB; not a topology file", path);
        goto fail;
      }
      size_t ncap = cap ? cap * 2 : 65536;
      char* nbuf = realloc(buf, ncap);
      if (nbuf == NULL) {
        res = braid_err(ncclSystemError, "out of memory reading %s", path);
        goto fail;
      }
      buf = nbuf;
      cap = ncap;
    }
    size_t n = fread(buf + len, 1, cap - len, f);
    len += n;
    if (n == 0) break;
  }
  if (ferror(f)) {
    res = braid_err(ncclSystemError, "cannot read %s: %s", path, strerror(errno));
    goto fail;
  }
  res = xml_parse_buffer(buf, len, path, out);
fail:
  free(buf);
  fclose(f);
  return res;
}
