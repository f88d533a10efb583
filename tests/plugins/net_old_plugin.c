/*
 * A library that looks like a net plugin of a version NCCL 2.28 no longer
 * loads: it exports ncclNetPlugin_v5 (and nothing newer), so a loader must
 * find no table it knows and say which versions it looked for. Only the
 * name is filled: nothing may call into it.
 */
typedef struct {
  const char* name;
  void* slots[16];
} old_net_t;

old_net_t ncclNetPlugin_v5 = {.name = "BraidTestOld"};
