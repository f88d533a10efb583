/*
 * The parts of the IB backend that need no device, so that unit tests run
 * them anywhere: which HCAs BRAID_IB_HCA selects, which GID a RoCE port
 * uses, what to tell a user whose memory registration failed, and how a
 * message is split across a connection's queue pairs.
 */
#include "transport/net_ib.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "base/utils.h"

struct ib_port_name {
  const char* name;
  int port;
};

/* One token "name[:port]" against a device port. */
static int ib_token_match(const char* tok, size_t len, int exact, const void* arg) {
  const struct ib_port_name* want = arg;
  const char* colon = memchr(tok, ':', len);
  size_t name_len = colon ? (size_t)(colon - tok) : len;
  if (colon && atoi(colon + 1) != want->port) return 0;
  if (exact) return strlen(want->name) == name_len && strncmp(want->name, tok, name_len) == 0;
  return strncmp(want->name, tok, name_len) == 0;
}

int ib_hca_match(const char* spec, const char* name, int port) {
  struct ib_port_name want = {name, port};
  return braid_spec_match(spec, ib_token_match, &want);
}

static int ib_gid_zero(const uint8_t* raw) {
  for (int i = 0; i < 16; i++)
    if (raw[i]) return 0;
  return 1;
}

static int ib_gid_v4_mapped(const uint8_t* raw) {
  static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return memcmp(raw, prefix, sizeof prefix) == 0;
}

static int ib_gid_link_local(const uint8_t* raw) { return raw[0] == 0xfe && (raw[1] & 0xc0) == 0x80; }

/* Preference of one entry, lower is better; -1: unusable. */
static int ib_gid_rank(const struct ib_gid_cand* c) {
  if (ib_gid_zero(c->raw)) return -1;
  if (c->type == IB_GID_ROCE_V2 && ib_gid_v4_mapped(c->raw)) return 0;
  if (c->type == IB_GID_ROCE_V2 && !ib_gid_link_local(c->raw)) return 1;
  if (c->type == IB_GID_ROCE_V1 && !ib_gid_link_local(c->raw)) return 2;
  if (!ib_gid_link_local(c->raw)) return 3;
  return c->type == IB_GID_ROCE_V2 ? 4 : 5;
}

int ib_gid_choose(const struct ib_gid_cand* cands, int n, int forced, char* why, size_t why_size) {
  if (forced >= 0) {
    for (int i = 0; i < n; i++) {
      if (cands[i].index != forced) continue;
      if (ib_gid_zero(cands[i].raw)) break;
      return forced;
    }
    snprintf(why, why_size,
             "BRAID_IB_GID_INDEX=%d names no valid GID on this port (%d entries; see "
             "show_gids, or unset it to let Braid choose)", forced, n);
    return -1;
  }
  int best = -1, best_rank = 99;
  for (int i = 0; i < n; i++) {
    int r = ib_gid_rank(&cands[i]);
    if (r >= 0 && r < best_rank) {
      best = cands[i].index;
      best_rank = r;
    }
  }
  if (best < 0)
    snprintf(why, why_size, "the port has no usable GID (is an IP address configured on its "
             "Ethernet interface?)");
  return best;
}

void ib_gid_str(const uint8_t* raw, char* out, size_t size) {
  char text[INET6_ADDRSTRLEN];
  if (ib_gid_v4_mapped(raw))
    inet_ntop(AF_INET, raw + 12, text, sizeof text);
  else
    inet_ntop(AF_INET6, raw, text, sizeof text);
  snprintf(out, size, "%s", text);
}

void ib_memlock_advice(size_t bytes, int err, char* out, size_t size) {
  struct rlimit lim;
  if (getrlimit(RLIMIT_MEMLOCK, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) {
    snprintf(out, size, "registering %zu bytes failed: %s (the memlock limit is unlimited; the "
             "HCA may be out of resources)", bytes, strerror(err));
    return;
  }
  snprintf(out, size,
           "registering %zu bytes failed: %s; the locked-memory limit is %llu KiB, too low for "
           "RDMA: raise it (ulimit -l unlimited; memlock in /etc/security/limits.conf; "
           "LimitMEMLOCK=infinity for systemd services; docker run --ulimit memlock=-1)",
           bytes, strerror(err), (unsigned long long)(lim.rlim_cur >> 10));
}

void ib_split(size_t size, int nqps, int q, size_t* off, size_t* len) {
  size_t chunk = nqps > 1 ? BRAID_ALIGN_UP((size + (size_t)nqps - 1) / (size_t)nqps, IB_PIECE_ALIGN) : size;
  size_t start = BRAID_MIN((size_t)q * chunk, size);
  *off = start;
  *len = BRAID_MIN(chunk, size - start);
}
