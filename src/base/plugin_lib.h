/*
 * NCCL's plugin libraries (net, tuner, profiler): how a setting names one
 * and where it was found. Shared by the three loaders, which differ only in
 * what they look up once a library is open.
 */
#ifndef BRAID_BASE_PLUGIN_LIB_H
#define BRAID_BASE_PLUGIN_LIB_H

#include <stddef.h>

/*
 * Opens the library `entry` names, as NCCL does: as given (a file name the
 * dynamic loader searches for, or a path), then, for a bare name (no '/', not
 * lib*.so), libnccl-<kind>-<entry>.so; `entry` NULL: libnccl-<kind>.so. What
 * dlopen said about each file tried is appended to `why` ("; " between).
 */
void* braid_plugin_open(const char* kind, const char* entry, char* why, size_t why_size);

/* The file an opened library was loaded from (dlinfo), else `fallback`. */
void braid_plugin_path(void* dl, const char* fallback, char* out, size_t size);

#endif
