/*
 * ABI facts of an nccl.h: sizes, field offsets and enum/macro values. The
 * same body (abi_facts.inc) is compiled once against Braid's header and once
 * against the system NCCL header; abi_test compares the two tables.
 */
#ifndef BRAID_TESTS_ABI_FACTS_H
#define BRAID_TESTS_ABI_FACTS_H

#include <stddef.h>

#define ABI_MAX_FACTS 128

struct abi_fact {
  const char* name;
  long long value;
};

struct abi_facts {
  int count;
  struct abi_fact facts[ABI_MAX_FACTS];
};

void abi_facts_fill_braid(struct abi_facts* out);
void abi_facts_fill_system(struct abi_facts* out);

#endif
