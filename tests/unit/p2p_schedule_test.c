/*
 * The send/recv schedule (runtime/p2p_work.c), host only.
 *
 * p2p_alltoall_partner: on every even rank count from 4 to 256, each round pairs every rank
 * with another (the partner's partner is the rank, never itself), and over the nranks - 1
 * rounds every rank meets every other once.
 *
 * p2p_schedule: random groups on 1-9 and 16 ranks, the same calls on every rank as NCCL asks
 * (all-to-alls, some in place, which leave out the self message as api.c does; user sends and
 * receives between random ranks, to itself too; interleaved differently on each rank). Every
 * message is walked once on each end, and the send and its receive are met in the same round
 * (phase and d: the channel key both ends give p2p_work_pair) at the same index: what keeps two
 * ranks from waiting on each other, and sender and receiver on the same channels. A self-send
 * without its receive is refused.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/p2p_work.h"
#include "test.h"

static void test_partner(void) {
  TEST_CHECK(!p2p_alltoall_pairwise(1) && !p2p_alltoall_pairwise(2) &&
                 !p2p_alltoall_pairwise(3) && !p2p_alltoall_pairwise(5),
             "pairwise rounds only on an even count of 4 or more");
  for (int n = 4; n <= 256 && !test_failures; n += 2) {
    TEST_CHECK(p2p_alltoall_pairwise(n), "%d ranks: pairwise", n);
    unsigned char* met = calloc((size_t)n * (size_t)n, 1);
    if (met == NULL) exit(1);
    for (int k = 1; k < n; k++)
      for (int r = 0; r < n; r++) {
        const int p = p2p_alltoall_partner(r, n, k);
        TEST_CHECK(p >= 0 && p < n && p != r, "%d ranks, round %d: rank %d gets partner %d", n, k,
                   r, p);
        if (p < 0 || p >= n) continue;
        TEST_CHECK(p2p_alltoall_partner(p, n, k) == r,
                   "%d ranks, round %d: %d pairs with %d, which pairs with %d", n, k, r, p,
                   p2p_alltoall_partner(p, n, k));
        met[(size_t)r * (size_t)n + (size_t)p]++;
      }
    for (int a = 0; a < n; a++)
      for (int b = 0; b < n; b++)
        TEST_CHECK(met[(size_t)a * (size_t)n + (size_t)b] == (a != b),
                   "%d ranks: rank %d meets rank %d %d times", n, a, b,
                   met[(size_t)a * (size_t)n + (size_t)b]);
    free(met);
  }
}

/* ---- the schedule ------------------------------------------------------------------------- */

#define MAX_RANKS 16
#define MAX_OPS 512

static uint64_t rng = 0x243f6a8885a308d3ULL;
static unsigned rnd(unsigned n) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (unsigned)(rng % n);
}

/* A message's id rides in its buffer pointer (never dereferenced). */
static void* id_ptr(int id) { return (void*)(uintptr_t)(0x1000 + (uintptr_t)id * 16); }
static int ptr_id(const void* p) { return (int)(((uintptr_t)p - 0x1000) / 16); }

/* Where the walk met an op: its round (phase 0 self, 1 all-to-all rounds, 2 shift; d) and index. */
struct seen {
  int times, phase, d, index;
};

struct walk {
  const struct braid_op* ops;
  int nops, pairwise;
  long last_key;
  struct seen seen[MAX_OPS];
};

static void walk_mark(struct walk* w, const struct braid_op* op, int phase, int d, int index) {
  if (op == NULL) return;
  struct seen* s = &w->seen[op - w->ops];
  s->times++;
  s->phase = phase;
  s->d = d;
  s->index = index;
}

static ncclResult_t walk_pair(void* ctx, const struct braid_op* s, const struct braid_op* r, int d,
                              int index) {
  struct walk* w = ctx;
  const struct braid_op* op = s ? s : r;
  const int phase = d == 0 ? 0 : w->pairwise && op->uniform ? 1 : 2;
  const long key = ((long)phase * 1024 + d) * 65536 + index;
  TEST_CHECK(op != NULL, "a pair of nothing");
  TEST_CHECK(key > w->last_key, "walked out of order: phase %d round %d index %d after key %ld",
             phase, d, index, w->last_key);
  w->last_key = key;
  TEST_CHECK(!w->pairwise || d == 0 || !s || !r || s->uniform == r->uniform,
             "a pair mixes an all-to-all message with another");
  TEST_CHECK(!w->pairwise || !s || !r || d == 0 || !op->uniform || s->peer == r->peer,
             "an all-to-all round's pair has two peers");
  walk_mark(w, s, phase, d, index);
  walk_mark(w, r, phase, d, index);
  return ncclSuccess;
}

struct msg {
  int from, to, bytes, uniform;
};

static void add_op(struct braid_op* ops, int* nops, int is_send, int peer, int id, int bytes,
                   int uniform) {
  struct braid_op* op = &ops[(*nops)++];
  memset(op, 0, sizeof *op);
  op->coll = BRAID_COLL_SENDRECV;
  op->is_send = is_send;
  op->peer = peer;
  op->dtype = ncclUint8;
  op->count = (size_t)bytes;
  op->uniform = uniform;
  if (is_send)
    op->sendbuff = id_ptr(id);
  else
    op->recvbuff = id_ptr(id);
}

static void test_schedule_once(int n) {
  static struct braid_op ops[MAX_RANKS][MAX_OPS];
  static struct walk walks[MAX_RANKS];
  static struct msg msgs[MAX_OPS * MAX_RANKS];
  int nops[MAX_RANKS] = {0}, nmsg = 0;
  /* The calls, in one order: all-to-alls (all ranks), user messages (their two ends). */
  const int ncalls = 1 + (int)rnd(6);
  int call_a2a[8], call_first[8], call_last[8];
  for (int c = 0; c < ncalls; c++) {
    call_a2a[c] = rnd(2);
    call_first[c] = nmsg;
    if (call_a2a[c]) {
      const int bytes = (int)rnd(3) * 1000;
      for (int a = 0; a < n; a++)
        for (int b = 0; b < n; b++) msgs[nmsg++] = (struct msg){a, b, bytes, 1};
    } else {
      for (int k = 1 + (int)rnd(4); k > 0; k--) {
        const int a = (int)rnd((unsigned)n), b = (int)rnd((unsigned)n);
        msgs[nmsg++] = (struct msg){a, b, (int)rnd(5000), 0};
      }
    }
    call_last[c] = nmsg;
  }
  /* Each rank issues the calls in order; an all-to-all in place (a coin per rank) leaves out
     its self message, as api.c does. */
  for (int r = 0; r < n; r++) {
    for (int c = 0; c < ncalls; c++) {
      const int in_place = call_a2a[c] && rnd(2);
      for (int m = call_first[c]; m < call_last[c]; m++) {
        const struct msg* g = &msgs[m];
        if (in_place && g->from == g->to) continue;
        if (g->from == r) add_op(ops[r], &nops[r], 1, g->to, m, g->bytes, g->uniform);
        if (g->to == r) add_op(ops[r], &nops[r], 0, g->from, m, g->bytes, g->uniform);
      }
    }
  }
  for (int r = 0; r < n; r++) {
    struct braid_group_comm g = {.ops = ops[r], .nops = nops[r]};
    struct walk* w = &walks[r];
    memset(w, 0, sizeof *w);
    w->ops = ops[r];
    w->nops = nops[r];
    w->pairwise = p2p_alltoall_pairwise(n);
    w->last_key = -1;
    TEST_EXPECT_RES(p2p_schedule(&g, r, n, walk_pair, w), ncclSuccess);
    for (int i = 0; i < nops[r]; i++)
      TEST_CHECK(w->seen[i].times == 1, "%d ranks: rank %d's op %d (%s peer %d) walked %d times",
                 n, r, i, ops[r][i].is_send ? "send to" : "recv from", ops[r][i].peer,
                 w->seen[i].times);
  }
  /* Each send meets its receive in the same round at the same index. */
  for (int a = 0; a < n; a++)
    for (int i = 0; i < nops[a]; i++) {
      const struct braid_op* s = &ops[a][i];
      if (!s->is_send) continue;
      const int id = ptr_id(s->sendbuff), b = s->peer;
      int j = 0;
      while (j < nops[b] && !(!ops[b][j].is_send && ptr_id(ops[b][j].recvbuff) == id)) j++;
      TEST_CHECK(j < nops[b], "%d ranks: message %d from %d to %d has no receive", n, id, a, b);
      if (j == nops[b]) continue;
      const struct seen *x = &walks[a].seen[i], *y = &walks[b].seen[j];
      TEST_CHECK(x->phase == y->phase && x->d == y->d && x->index == y->index,
                 "%d ranks: message %d from %d to %d (%s): sent in phase %d round %d index %d, "
                 "received in phase %d round %d index %d",
                 n, id, a, b, s->uniform ? "all-to-all" : "send/recv", x->phase, x->d, x->index,
                 y->phase, y->d, y->index);
    }
}

static void test_schedule(void) {
  const int counts[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 16};
  for (size_t c = 0; c < sizeof counts / sizeof counts[0] && !test_failures; c++)
    for (int t = 0; t < 200 && !test_failures; t++) test_schedule_once(counts[c]);
  /* A self-send without a self-receive of its size. */
  struct braid_op ops[2];
  int n = 0;
  add_op(ops, &n, 1, 0, 1, 100, 0);
  add_op(ops, &n, 0, 0, 2, 50, 0);
  struct braid_group_comm g = {.ops = ops, .nops = n};
  struct walk w;
  memset(&w, 0, sizeof w);
  w.ops = ops;
  w.last_key = -1;
  TEST_EXPECT_RES(p2p_schedule(&g, 0, 4, walk_pair, &w), ncclInvalidUsage);
}

int main(void) {
  test_partner();
  test_schedule();
  return test_summary();
}
