/* The ABI facts of Braid's include/nccl.h. */
#include "nccl.h"

#include "abi_facts.h"

void abi_facts_fill_braid(struct abi_facts* out) {
#include "abi_facts.inc"
}
