/*
 * The generated table of kernels: braid_kernel_table[dtype][devop] is the
 * __global__ function for that element type and operator (see
 * CMakeLists.txt in this folder, the one list of types).
 */
#ifndef BRAID_DEVICE_KERNEL_TABLE_H
#define BRAID_DEVICE_KERNEL_TABLE_H

#include "abi/dev_comm.h"
#include "nccl.h"

/* Which table a launch's kernel comes from: a launch runs one family's kernel. */
enum braid_kernel_family {
  BRAID_KERNELS_RING = 0,  /* braid_kernel: ring reductions (Simple, LL); copies: send/recv too */
  BRAID_KERNELS_TREE = 1,  /* braid_tree_kernel: tree and direct all-reduce (Simple, LL) */
  BRAID_KERNELS_LL128 = 2, /* braid_ll128_kernel: every LL128 reduction; copies: rings */
  BRAID_KERNEL_FAMILIES = 3
};

#ifdef __cplusplus
extern "C" {
#endif

extern const void* const* const braid_kernel_table[ncclNumTypes];
/* The same kernels able to run tree all-reduce (a launch holding a tree work uses these). */
extern const void* const* const braid_tree_kernel_table[ncclNumTypes];
/* The kernels of LL128 works (a launch holding one uses these, and runs only LL128 works). */
extern const void* const* const braid_ll128_kernel_table[ncclNumTypes];
/*
 * The byte-moving collectives' kernel of each family (AllGather, Broadcast, send/recv; NULL
 * for the tree family, which runs none): a launch holds copies or reductions, never both.
 */
extern const void* const braid_copy_kernel_table[BRAID_KERNEL_FAMILIES];
/* The copy-engine exchange's kernels (ce.h), launched on their own, never with works. */
extern const void* const* const braid_ce_kernel_table[ncclNumTypes];
/* The copy streams' step kernel (ce.h), or NULL in a build without kernels. */
const void* braid_ce_step_kernel(void);
/* The all-gather fan's kernel (ce.h, runtime/ce_fan.c), or NULL in a build without kernels. */
const void* braid_ce_fan_kernel(void);
/* The fan's copy-stream step (ce.h), or NULL in a build without kernels. */
const void* braid_ce_fan_step_kernel(void);

#ifdef __cplusplus
}
#endif

#endif
