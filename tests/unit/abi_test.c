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
/* Every fact of the system header must hold for ours; ours may have more (a newer 2.28.x). */
static void abi_compare(void) {
  static struct abi_facts ours, theirs;
  abi_facts_fill_braid(&ours);
  abi_facts_fill_system(&theirs);
  for (int i = 0; i < theirs.count; i++) {
    int found = 0;
    for (int j = 0; j < ours.count && !found; j++) {
      if (strcmp(ours.facts[j].name, theirs.facts[i].name) != 0) continue;
      found = 1;
      TEST_CHECK(ours.facts[j].value == theirs.facts[i].value, "%s: Braid %lld, system NCCL %lld",
                 theirs.facts[i].name, ours.facts[j].value, theirs.facts[i].value);
    }
    TEST_CHECK(found, "%s is in the system header but not in Braid's", theirs.facts[i].name);
  }
  TEST_CHECK(theirs.count >= 80, "only %d facts recorded for the system header", theirs.count);
  fprintf(stderr, "compared %d ABI facts with %s\n", theirs.count, BRAID_SYSTEM_NCCL_HEADER);
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
