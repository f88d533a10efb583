/*
 * Parsing of BRAID_ALGO / BRAID_PROTO (see tune_override.h). The values are
 * read once per communicator, when its tuning model is built.
 */
#include <ctype.h>
#include <string.h>
#include <strings.h>

#include "base/debug.h"
#include "base/error.h"
#include "base/param.h"
#include "base/utils.h"
#include "graph/tune_override.h"

struct override_names {
  const char* var; /* for messages */
  const char* const* names;
  int count;
  const char* const* ignored; /* NCCL names we accept without implementing */
  const char* expected;       /* for messages */
};

static const char* const algo_names[] = {"ring", "tree", "direct"};
static const char* const algo_ignored[] = {"collnetdirect", "collnetchain", "collnet", "nvls",
                                           "nvlstree",      "pat",          NULL};
static const char* const proto_names[] = {"simple", "ll", "ll128"};
static const char* const proto_ignored[] = {NULL};
static const char* const coll_names[] = {"broadcast",     "reduce",    "allgather",
                                         "reducescatter", "allreduce", "sendrecv"};

/* Copies [s, e) trimmed of spaces into out. */
static void override_word(const char* s, const char* e, char* out, size_t size) {
  while (s < e && isspace((unsigned char)*s)) s++;
  while (e > s && isspace((unsigned char)e[-1])) e--;
  size_t n = BRAID_MIN((size_t)(e - s), size - 1);
  memcpy(out, s, n);
  out[n] = '\0';
}

/* "ring,tree" or "^tree" -> mask; ignored names add nothing. */
static ncclResult_t override_list(const struct override_names* on, const char* s, const char* e,
                                  unsigned* mask, unsigned* named) {
  char word[64];
  unsigned bits = 0;
  while (s < e && isspace((unsigned char)*s)) s++;
  int exclude = s < e && *s == '^';
  if (exclude) s++;
  for (const char* p = s; p <= e; p++) {
    if (p < e && *p != ',') continue;
    override_word(s, p, word, sizeof word);
    s = p + 1;
    if (word[0] == '\0') continue;
    int found = 0;
    for (int i = 0; i < on->count && !found; i++)
      if (strcasecmp(word, on->names[i]) == 0) bits |= 1u << i, found = 1;
    for (int i = 0; on->ignored[i] && !found; i++)
      if (strcasecmp(word, on->ignored[i]) == 0) found = 1;
    if (!found)
      return braid_err(ncclInvalidUsage,
                       "%s: unknown name '%s': expected a comma list of %s, "
                       "optionally after ^ (all but)",
                       on->var, word, on->expected);
  }
  *mask = exclude ? ~bits : bits;
  *named = exclude ? 0u : bits;
  return ncclSuccess;
}

/* Parses one variable into per-collective masks. */
static ncclResult_t override_parse(const struct override_names* on, const char* text,
                                   unsigned* masks, unsigned* named) {
  ncclResult_t res = ncclSuccess;
  char word[64];
  for (int c = 0; c < BRAID_COLL_COUNT; c++) masks[c] = ~0u, named[c] = 0u;
  if (text == NULL || text[0] == '\0') return ncclSuccess;
  if (strchr(text, ':') == NULL) {
    unsigned mask, pos;
    BRAID_TRY(override_list(on, text, text + strlen(text), &mask, &pos));
    for (int c = 0; c < BRAID_COLL_COUNT; c++) masks[c] = mask, named[c] = pos;
    return ncclSuccess;
  }
  /* "allreduce:tree,ring;allgather:ring" */
  for (const char* s = text; *s;) {
    const char* end = strchr(s, ';');
    if (end == NULL) end = s + strlen(s);
    const char* colon = memchr(s, ':', (size_t)(end - s));
    BRAID_CHECK(colon != NULL, ncclInvalidUsage,
                "%s=\"%s\": expected collective:list entries separated by ';'", on->var, text);
    override_word(s, colon, word, sizeof word);
    int coll = -1;
    for (int c = 0; c < BRAID_COLL_COUNT; c++)
      if (strcasecmp(word, coll_names[c]) == 0) coll = c;
    BRAID_CHECK(coll >= 0, ncclInvalidUsage,
                "%s: unknown collective '%s': expected broadcast, reduce, allgather, "
                "reducescatter, allreduce or sendrecv",
                on->var, word);
    BRAID_TRY(override_list(on, colon + 1, end, &masks[coll], &named[coll]));
    s = *end ? end + 1 : end;
  }
fail:
  return res;
}

ncclResult_t tune_override_parse(struct tune_model* m) {
  ncclResult_t res = ncclSuccess;
  const struct override_names algo = {
      "BRAID_ALGO", algo_names, 3, algo_ignored,
      "Ring, Tree, Direct (NCCL's CollNet*, NVLS*, PAT are accepted and ignored)"};
  const struct override_names proto = {"BRAID_PROTO", proto_names, 3, proto_ignored,
                                       "Simple, LL, LL128"};
  BRAID_TRY(override_parse(&algo, braid_param_str(BRAID_P_ALGO), m->algo_override, m->algo_named));
  BRAID_TRY(
      override_parse(&proto, braid_param_str(BRAID_P_PROTO), m->proto_override, m->proto_named));
fail:
  return res;
}
