/*
 * The generated table of kernels: braid_kernel_table[dtype][devop] is the
 * __global__ function for that element type and operator (see
 * CMakeLists.txt in this folder, the one list of types).
 */
#ifndef BRAID_DEVICE_KERNEL_TABLE_H
#define BRAID_DEVICE_KERNEL_TABLE_H

#include "collectives/device/dev_comm.h"
#include "nccl.h"

extern const void* const* const braid_kernel_table[ncclNumTypes];
/* The same kernels able to run tree all-reduce (a launch holding a tree work uses these). */
extern const void* const* const braid_tree_kernel_table[ncclNumTypes];
/* The kernels of LL128 works (a launch holding one uses these, and runs only LL128 works). */
extern const void* const* const braid_ll128_kernel_table[ncclNumTypes];

#endif
