/* The ABI facts of the system's NCCL header (compiled with only its directory on the path). */
#include <nccl.h>

#include "abi_facts.h"

void abi_facts_fill_system(struct abi_facts* out) {
#include "abi_facts.inc"
}
