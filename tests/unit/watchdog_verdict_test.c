/*
 * The hang verdict from the ranks' ledger summaries (watchdog_verdict),
 * without GPUs or peers: each situation names the rank to blame in words
 * such as "rank 0 waits in AllReduce #12 (channel 1, step 40) for rank 1,
 * whose last op is AllReduce #11".
 */
#include <string.h>

#include "abi/coll.h"
#include "runtime/watchdog.h"
#include "test.h"

static struct braid_ledger_op op(uint64_t seq, int coll, uint64_t count) {
  struct braid_ledger_op o = {.seq = seq, .coll = coll, .dtype = ncclFloat, .root = 0, .peer = -1,
                              .count = count};
  return o;
}

/* Rank r answered: issued and completed so far, stuck in `stuck` (seq 0: nothing pending). */
static void rank_set(struct braid_ledger_summary* s, int r, uint64_t issued, uint64_t completed,
                     struct braid_ledger_op stuck, struct braid_ledger_op last) {
  memset(s, 0, sizeof *s);
  s->magic = BRAID_LEDGER_MAGIC;
  s->rank = r;
  s->pid = 1000 + r;
  snprintf(s->host, sizeof s->host, "node%d", r);
  s->issued = issued;
  s->completed = completed;
  s->stuck = stuck;
  s->last = last;
  s->chan = stuck.seq ? 1 : -1;
  s->chan_recv = 40 + (uint64_t)r;
  s->waiting_s = stuck.seq ? 600 : 0;
}

static void expect(const struct braid_ledger_summary* all, int n, int me, const char* const* want) {
  char text[768];
  watchdog_verdict(all, n, me, text, sizeof text);
  for (int i = 0; want[i]; i++)
    TEST_CHECK(strstr(text, want[i]) != NULL, "verdict lacks \"%s\": %s", want[i], text);
}

int main(void) {
  struct braid_ledger_summary all[4];
  struct braid_ledger_op ar12 = op(12, BRAID_COLL_ALLREDUCE, 1024), ar11 = op(11, BRAID_COLL_ALLREDUCE, 1024);
  struct braid_ledger_op none = {0};

  /* Rank 1 never called #12. */
  rank_set(&all[0], 0, 12, 11, ar12, ar12);
  rank_set(&all[1], 1, 11, 11, none, ar11);
  expect(all, 2, 0, (const char*[]){"rank 0 waits in AllReduce #12 (float count=1024) (channel 1, step 40)",
                                    "for rank 1, whose last op is AllReduce #11", "complete",
                                    "pid 1001 on node1", "no progress for 600 s", NULL});

  /* Rank 1 issued nothing at all. */
  rank_set(&all[1], 1, 0, 0, none, none);
  expect(all, 2, 0, (const char*[]){"for rank 1, which has issued no operation", NULL});

  /* Rank 2 of 3 does not answer; rank 1 is in #12 too. */
  rank_set(&all[1], 1, 12, 11, ar12, ar12);
  memset(&all[2], 0, sizeof all[2]);
  expect(all, 3, 0, (const char*[]){"for rank 2, which does not answer", NULL});

  /* Rank 1's #12 is another operation. */
  struct braid_ledger_op ag12 = op(12, BRAID_COLL_ALLGATHER, 7);
  rank_set(&all[1], 1, 12, 11, ag12, ag12);
  expect(all, 2, 0, (const char*[]){"rank 1, whose op is AllGather #12 (float count=7)",
                                    "disagree", NULL});

  /* Everyone in #12: the least advanced other rank is named. */
  rank_set(&all[1], 1, 12, 11, ar12, ar12);
  rank_set(&all[2], 2, 12, 11, ar12, ar12);
  all[2].chan_recv = 3;
  expect(all, 3, 0, (const char*[]){"rank 2, the least advanced", "step 3", NULL});

  /* Nothing pending. */
  rank_set(&all[0], 0, 12, 12, none, ar12);
  expect(all, 2, 0, (const char*[]){"waits for nothing", NULL});

  /* Send/recv and rooted operations are described with their peer and root. */
  char text[160];
  struct braid_ledger_op s = {.seq = 5, .coll = BRAID_COLL_SENDRECV, .dtype = ncclInt8, .root = 1,
                              .peer = 3, .count = 9};
  watchdog_op_describe(&s, text, sizeof text);
  TEST_CHECK(strcmp(text, "Send #5 (int8 count=9 to rank 3)") == 0, "send: %s", text);
  struct braid_ledger_op b = op(6, BRAID_COLL_BROADCAST, 2);
  b.root = 1;
  watchdog_op_describe(&b, text, sizeof text);
  TEST_CHECK(strcmp(text, "Broadcast #6 (float count=2 root=1)") == 0, "broadcast: %s", text);
  return test_summary();
}
