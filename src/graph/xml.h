/*
 * A small XML reader and writer for the two formats NCCL uses: the node
 * topology (<system>...) and the search result (<graphs>...). Only what those
 * formats need: elements, attributes, comments, a <?xml ?> prolog. Text
 * between elements must be whitespace.
 *
 * The reader never trusts its input: every limit below is checked, and a
 * malformed document gives ncclInvalidUsage with "source:line: what was
 * found, what was expected" (logged once through braid_err).
 *
 * Ownership: a document owns all of its nodes; xml_doc_free releases them.
 */
#ifndef BRAID_GRAPH_XML_H
#define BRAID_GRAPH_XML_H

#include <stddef.h>
#include <stdio.h>

#include "nccl.h"

#define XML_NAME_MAX 64    /* element and attribute names, with the NUL */
#define XML_VALUE_MAX 1024 /* attribute values, with the NUL */
#define XML_MAX_DEPTH 64
#define XML_MAX_ATTRS 64     /* per element */
#define XML_MAX_NODES 100000 /* per document */

struct xml_attr {
  char key[XML_NAME_MAX];
  char* value; /* owned */
};

struct xml_node {
  char name[XML_NAME_MAX];
  int line; /* where the element starts in its source; 0 when built in memory */
  int nattrs;
  struct xml_attr* attrs;
  struct xml_node* parent;
  int nchildren, cap_children;
  struct xml_node** children;
};

struct xml_doc {
  char source[256]; /* file name (or a description) for error messages */
  struct xml_node* root;
  int nnodes;
};

ncclResult_t xml_doc_create(const char* source, struct xml_doc** out);
void xml_doc_free(struct xml_doc* doc);

/* Parses `path`; a missing or unreadable file is ncclSystemError naming it. */
ncclResult_t xml_parse_file(const char* path, struct xml_doc** out);
/* Parses `len` bytes (need not be NUL-terminated); `source` names them in errors. */
ncclResult_t xml_parse_buffer(const char* buf, size_t len, const char* source,
                              struct xml_doc** out);

/* Writes the document, two spaces of indent per level, values escaped. */
ncclResult_t xml_write(FILE* out, const struct xml_doc* doc);
ncclResult_t xml_write_file(const char* path, const struct xml_doc* doc);
/* The document as a NUL-terminated string the caller frees. */
ncclResult_t xml_write_string(const struct xml_doc* doc, char** text, size_t* len);

/* Adds an element under `parent` (NULL: becomes the root, which must not exist yet). */
ncclResult_t xml_node_add(struct xml_doc* doc, struct xml_node* parent, const char* name,
                          struct xml_node** out);
/* Deep-copies `src` under `parent` of `doc`. */
ncclResult_t xml_node_copy(struct xml_doc* doc, struct xml_node* parent, const struct xml_node* src,
                           struct xml_node** out);

/* Sets (adds or replaces) an attribute. */
ncclResult_t xml_attr_set(struct xml_node* node, const char* key, const char* value);
ncclResult_t xml_attr_set_int(struct xml_node* node, const char* key, long long value);
/* Sets the attribute only when it is absent. */
ncclResult_t xml_attr_init(struct xml_node* node, const char* key, const char* value);
/* The value, or NULL when absent. */
const char* xml_attr_get(const struct xml_node* node, const char* key);

/* First child called `name` (whose attribute `key` equals `value` when key is not NULL). */
struct xml_node* xml_child_find(const struct xml_node* node, const char* name, const char* key,
                                const char* value);

#endif
