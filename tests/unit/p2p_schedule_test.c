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
 * without its receive is refused. Every rank's walk is also the very walk of the schedule as
 * first written (each pair found by a walk of the whole group), on those groups and on groups
 * of 31, 32 and 64 ranks, where p2p_schedule reads lists by peer instead.
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

#define MAX_RANKS 64
#define MAX_OPS 1024

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

/*
 * The schedule as first written, the reference: the i-th send of a kind to `to` and the i-th
 * receive from `from`, each found by walking the whole group, for every i of every round.
 * p2p_schedule (lists by peer for large groups) must walk the very same pairs in the same order.
 */
enum ref_kind { REF_ANY, REF_PLAIN, REF_ALLTOALL };

static const struct braid_op* ref_find(const struct braid_group_comm* g, int peer, int is_send,
                                       int index, enum ref_kind kind) {
  for (int i = 0; i < g->nops; i++) {
    const struct braid_op* op = &g->ops[i];
    if (op->coll != BRAID_COLL_SENDRECV || op->peer != peer || op->is_send != is_send) continue;
    if ((kind == REF_PLAIN && op->uniform) || (kind == REF_ALLTOALL && !op->uniform)) continue;
    if (index-- == 0) return op;
  }
  return NULL;
}

static void ref_round(const struct braid_group_comm* g, int to, int from, int d,
                      enum ref_kind kind, p2p_pair_fn fn, void* ctx) {
  for (int i = 0;; i++) {
    const struct braid_op* s = ref_find(g, to, 1, i, kind);
    const struct braid_op* r = ref_find(g, from, 0, i, kind);
    if (s == NULL && r == NULL) return;
    fn(ctx, s, r, d, i);
  }
}

static void ref_schedule(const struct braid_group_comm* g, int rank, int nranks, p2p_pair_fn fn,
                         void* ctx) {
  const int pairwise = p2p_alltoall_pairwise(nranks);
  ref_round(g, rank, rank, 0, REF_ANY, fn, ctx);
  for (int k = 1; pairwise && k < nranks; k++) {
    const int peer = p2p_alltoall_partner(rank, nranks, k);
    ref_round(g, peer, peer, k, REF_ALLTOALL, fn, ctx);
  }
  for (int d = 1; d < nranks; d++)
    ref_round(g, (rank + d) % nranks, (rank - d + nranks) % nranks, d,
              pairwise ? REF_PLAIN : REF_ANY, fn, ctx);
}

/* The pairs a walk met, in order. */
struct trace {
  int n;
  struct {
    const struct braid_op *s, *r;
    int d, index;
  } at[4 * MAX_OPS];
};

static ncclResult_t trace_pair(void* ctx, const struct braid_op* s, const struct braid_op* r, int d,
                               int index) {
  struct trace* t = ctx;
  if (t->n < 4 * MAX_OPS) {
    t->at[t->n].s = s;
    t->at[t->n].r = r;
    t->at[t->n].d = d;
    t->at[t->n].index = index;
  }
  t->n++;
  return ncclSuccess;
}

/* p2p_schedule walks rank r's group exactly as the reference does. */
static void check_as_reference(const struct braid_group_comm* g, int r, int n) {
  static struct trace got, want;
  got.n = want.n = 0;
  TEST_EXPECT_RES(p2p_schedule(g, r, n, trace_pair, &got), ncclSuccess);
  ref_schedule(g, r, n, trace_pair, &want);
  int same = got.n == want.n && got.n <= 4 * MAX_OPS;
  for (int i = 0; same && i < got.n; i++)
    same = got.at[i].s == want.at[i].s && got.at[i].r == want.at[i].r &&
           got.at[i].d == want.at[i].d && got.at[i].index == want.at[i].index;
  TEST_CHECK(same, "%d ranks, rank %d, %d ops: %d pairs walked, the reference walks %d (or "
             "another pair, round or order)", n, r, g->nops, got.n, want.n);
}

/*
 * One random group on each of n ranks (ops[r][0..nops[r])), the same calls on every rank:
 * all-to-alls (all ranks), user messages (their two ends); msgs[id] says each message's ends.
 */
static void make_group(int n, struct braid_op ops[][MAX_OPS], int* nops, struct msg* msgs) {
  int nmsg = 0;
  const int ncalls = 1 + (int)rnd(6);
  int call_a2a[8], call_first[8], call_last[8];
  for (int r = 0; r < n; r++) nops[r] = 0;
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
}

static struct braid_op group_ops[MAX_RANKS][MAX_OPS];
static struct msg group_msgs[MAX_OPS * MAX_RANKS];

static void test_schedule_once(int n) {
  static struct walk walks[MAX_RANKS];
  struct braid_op(*ops)[MAX_OPS] = group_ops;
  int nops[MAX_RANKS];
  make_group(n, ops, nops, group_msgs);
  for (int r = 0; r < n; r++) {
    struct braid_group_comm g = {.ops = ops[r], .nops = nops[r]};
    struct walk* w = &walks[r];
    memset(w, 0, sizeof *w);
    w->ops = ops[r];
    w->nops = nops[r];
    w->pairwise = p2p_alltoall_pairwise(n);
    w->last_key = -1;
    TEST_EXPECT_RES(p2p_schedule(&g, r, n, walk_pair, w), ncclSuccess);
    check_as_reference(&g, r, n);
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
  /* Larger groups (lists by peer): every rank walks as the reference does. */
  const int large[] = {31, 32, 64};
  for (size_t c = 0; c < sizeof large / sizeof large[0] && !test_failures; c++)
    for (int t = 0; t < 10 && !test_failures; t++) {
      int nops[MAX_RANKS];
      make_group(large[c], group_ops, nops, group_msgs);
      for (int r = 0; r < large[c]; r++) {
        struct braid_group_comm g = {.ops = group_ops[r], .nops = nops[r]};
        check_as_reference(&g, r, large[c]);
      }
    }
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
