/*
 * A library that looks like a tuner plugin but exports no version NCCL 2.28
 * reads: only ncclTunerPlugin_v1 (an interface NCCL no longer loads). The
 * loader must refuse it with a message that names what it found.
 */
struct old_tuner {
  const char* name;
  void* functions[3];
};

__attribute__((visibility("default")))
const struct old_tuner ncclTunerPlugin_v1 = {.name = "Old", .functions = {0, 0, 0}};
