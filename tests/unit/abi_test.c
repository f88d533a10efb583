/*
 * Braid's nccl.h against the system NCCL header: every size, offset, enum
 * value and initializer recorded in abi_facts.inc must match. Skipped
 * (exit 77, with the reason) when the build found no system nccl.h.
 */
#include <string.h>

#include "abi_facts.h"
#include "nccl.h"
#include "test.h"

#ifdef BRAID_HAVE_SYSTEM_NCCL
static void abi_compare(void) {
  static struct abi_facts ours, theirs;
  abi_facts_fill_braid(&ours);
  abi_facts_fill_system(&theirs);
  TEST_CHECK(ours.count == theirs.count, "fact counts differ: %d vs %d", ours.count, theirs.count);
  for (int i = 0; i < ours.count && i < theirs.count; i++) {
    TEST_CHECK(strcmp(ours.facts[i].name, theirs.facts[i].name) == 0, "fact %d: %s vs %s", i,
               ours.facts[i].name, theirs.facts[i].name);
    TEST_CHECK(ours.facts[i].value == theirs.facts[i].value, "%s: Braid %lld, system NCCL %lld",
               ours.facts[i].name, ours.facts[i].value, theirs.facts[i].value);
  }
  fprintf(stderr, "compared %d ABI facts with %s\n", ours.count, BRAID_SYSTEM_NCCL_HEADER);
}
#endif

int main(void) {
#ifdef BRAID_HAVE_SYSTEM_NCCL
  abi_compare();
  /* Facts that hold whatever the system header says. */
  TEST_CHECK(sizeof(ncclUniqueId) == 128, "ncclUniqueId is %zu bytes", sizeof(ncclUniqueId));
  TEST_CHECK(NCCL_VERSION_CODE == NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH),
             "NCCL_VERSION_CODE %d", NCCL_VERSION_CODE);
  TEST_CHECK(NCCL_MAJOR == 2 && NCCL_MINOR == 28, "API level %d.%d", NCCL_MAJOR, NCCL_MINOR);
  return test_summary();
#else
  TEST_SKIP("no system nccl.h was found at configure time; nothing to compare against");
#endif
}
