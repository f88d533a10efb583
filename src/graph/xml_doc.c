/*
 * XML documents in memory: building, copying, looking up and writing them
 * (the parser is in xml.c). Detection builds a document, dumps write one,
 * and the per-host merge copies elements between documents.
 */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/utils.h"
#include "graph/xml.h"

ncclResult_t xml_doc_create(const char* source, struct xml_doc** out) {
  ncclResult_t res = ncclSuccess;
  struct xml_doc* doc = NULL;
  BRAID_TRY(BRAID_CALLOC(&doc, 1, "an XML document"));
  snprintf(doc->source, sizeof doc->source, "%s", source ? source : "(memory)");
  *out = doc;
fail:
  return res;
}

static void xml_node_free(struct xml_node* node) {
  if (node == NULL) return;
  for (int i = 0; i < node->nchildren; i++) xml_node_free(node->children[i]);
  for (int i = 0; i < node->nattrs; i++) free(node->attrs[i].value);
  free(node->children);
  free(node->attrs);
  free(node);
}

void xml_doc_free(struct xml_doc* doc) {
  if (doc == NULL) return;
  xml_node_free(doc->root);
  free(doc);
}

ncclResult_t xml_node_add(struct xml_doc* doc, struct xml_node* parent, const char* name,
                          struct xml_node** out) {
  ncclResult_t res = ncclSuccess;
  struct xml_node* node = NULL;
  if (strlen(name) >= XML_NAME_MAX)
    return braid_err(ncclInternalError, "XML element name '%s' is too long", name);
  if (parent == NULL && doc->root != NULL)
    return braid_err(ncclInternalError, "%s: a second root element <%s>", doc->source, name);
  BRAID_TRY(BRAID_CALLOC(&node, 1, "an XML element"));
  snprintf(node->name, sizeof node->name, "%s", name);
  node->parent = parent;
  if (parent == NULL) {
    doc->root = node;
  } else {
    if (parent->nchildren == parent->cap_children) {
      int cap = parent->cap_children ? parent->cap_children * 2 : 4;
      struct xml_node** c = realloc(parent->children, (size_t)cap * sizeof *c);
      if (c == NULL) {
        res = braid_err(ncclSystemError, "out of memory adding XML element <%s>", name);
        goto fail;
      }
      parent->children = c;
      parent->cap_children = cap;
    }
    parent->children[parent->nchildren++] = node;
  }
  doc->nnodes++;
  *out = node;
  return ncclSuccess;
fail:
  free(node);
  return res;
}

const char* xml_attr_get(const struct xml_node* node, const char* key) {
  for (int i = 0; i < node->nattrs; i++)
    if (strcmp(node->attrs[i].key, key) == 0) return node->attrs[i].value;
  return NULL;
}

ncclResult_t xml_attr_set(struct xml_node* node, const char* key, const char* value) {
  if (strlen(key) >= XML_NAME_MAX || strlen(value) >= XML_VALUE_MAX)
    return braid_err(ncclInternalError, "XML attribute %s of <%s> is too long", key, node->name);
  char* copy = strdup(value);
  if (copy == NULL)
    return braid_err(ncclSystemError, "out of memory setting XML attribute %s", key);
  for (int i = 0; i < node->nattrs; i++) {
    if (strcmp(node->attrs[i].key, key) == 0) {
      free(node->attrs[i].value);
      node->attrs[i].value = copy;
      return ncclSuccess;
    }
  }
  struct xml_attr* a = realloc(node->attrs, (size_t)(node->nattrs + 1) * sizeof *a);
  if (a == NULL) {
    free(copy);
    return braid_err(ncclSystemError, "out of memory setting XML attribute %s", key);
  }
  node->attrs = a;
  snprintf(a[node->nattrs].key, sizeof a[node->nattrs].key, "%s", key);
  a[node->nattrs].value = copy;
  node->nattrs++;
  return ncclSuccess;
}

ncclResult_t xml_attr_set_int(struct xml_node* node, const char* key, long long value) {
  char text[32];
  snprintf(text, sizeof text, "%lld", value);
  return xml_attr_set(node, key, text);
}

ncclResult_t xml_attr_init(struct xml_node* node, const char* key, const char* value) {
  return xml_attr_get(node, key) ? ncclSuccess : xml_attr_set(node, key, value);
}

struct xml_node* xml_child_find(const struct xml_node* node, const char* name, const char* key,
                                const char* value) {
  for (int i = 0; i < node->nchildren; i++) {
    struct xml_node* c = node->children[i];
    if (strcmp(c->name, name) != 0) continue;
    if (key == NULL) return c;
    const char* v = xml_attr_get(c, key);
    if (v && value && strcmp(v, value) == 0) return c;
  }
  return NULL;
}

ncclResult_t xml_node_copy(struct xml_doc* doc, struct xml_node* parent, const struct xml_node* src,
                           struct xml_node** out) {
  ncclResult_t res = ncclSuccess;
  struct xml_node* node = NULL;
  BRAID_TRY(xml_node_add(doc, parent, src->name, &node));
  node->line = src->line;
  for (int i = 0; i < src->nattrs; i++)
    BRAID_TRY(xml_attr_set(node, src->attrs[i].key, src->attrs[i].value));
  for (int i = 0; i < src->nchildren; i++)
    BRAID_TRY(xml_node_copy(doc, node, src->children[i], NULL));
  if (out) *out = node;
fail:
  return res; /* a partial copy stays in `doc`, which the caller frees */
}

static void xml_write_escaped(FILE* out, const char* s) {
  for (; *s; s++) {
    switch (*s) {
      case '&':
        fputs("&amp;", out);
        break;
      case '<':
        fputs("&lt;", out);
        break;
      case '>':
        fputs("&gt;", out);
        break;
      case '"':
        fputs("&quot;", out);
        break;
      default:
        fputc(*s, out);
        break;
    }
  }
}

static void xml_write_node(FILE* out, const struct xml_node* node, int depth) {
  fprintf(out, "%*s<%s", depth * 2, "", node->name);
  for (int i = 0; i < node->nattrs; i++) {
    fprintf(out, " %s=\"", node->attrs[i].key);
    xml_write_escaped(out, node->attrs[i].value);
    fputc('"', out);
  }
  if (node->nchildren == 0) {
    fputs("/>\n", out);
    return;
  }
  fputs(">\n", out);
  for (int i = 0; i < node->nchildren; i++) xml_write_node(out, node->children[i], depth + 1);
  fprintf(out, "%*s</%s>\n", depth * 2, "", node->name);
}

ncclResult_t xml_write(FILE* out, const struct xml_doc* doc) {
  if (doc->root) xml_write_node(out, doc->root, 0);
  if (ferror(out)) return braid_err(ncclSystemError, "writing XML failed: %s", strerror(errno));
  return ncclSuccess;
}

ncclResult_t xml_write_file(const char* path, const struct xml_doc* doc) {
  ncclResult_t res = ncclSuccess;
  FILE* f = fopen(path, "w");
  if (f == NULL) return braid_err(ncclSystemError, "cannot create %s: %s", path, strerror(errno));
  res = xml_write(f, doc);
  if (fclose(f) != 0 && res == ncclSuccess)
    res = braid_err(ncclSystemError, "cannot write %s: %s", path, strerror(errno));
  return res;
}

ncclResult_t xml_write_string(const struct xml_doc* doc, char** text, size_t* len) {
  ncclResult_t res = ncclSuccess;
  char* buf = NULL;
  size_t size = 0;
  FILE* f = open_memstream(&buf, &size);
  if (f == NULL) return braid_err(ncclSystemError, "open_memstream failed: %s", strerror(errno));
  res = xml_write(f, doc);
  fclose(f);
  if (res != ncclSuccess) {
    free(buf);
    return res;
  }
  *text = buf;
  *len = size;
  return ncclSuccess;
}
