/*
 * NCCL's plugin libraries (net, tuner, profiler): how a setting names one
 * and where it was found. Shared by the three loaders, which differ only in
 * what they look up once a library is open.
 */
#ifndef BRAID_BASE_PLUGIN_LIB_H
#define BRAID_BASE_PLUGIN_LIB_H

#include <stddef.h>

#include "base/param.h"

/*
 * Opens the library `entry` names, as NCCL does: as given (a file name the
 * dynamic loader searches for, or a path), then, for a bare name (no '/', not
 * lib*.so), libnccl-<kind>-<entry>.so; `entry` NULL: libnccl-<kind>.so. What
 * dlopen said about each file tried is appended to `why` ("; " between).
 */
void* braid_plugin_open(const char* kind, const char* entry, char* why, size_t why_size);

/* The file an opened library was loaded from (dlinfo), else `fallback`. */
void braid_plugin_path(void* dl, const char* fallback, char* out, size_t size);

/* What a loader searches for (the tuner's and the profiler's: one library per process). */
struct braid_plugin_search {
  const char* kind;        /* "tuner": libnccl-tuner.so, libnccl-tuner-<name>.so */
  const char* label;       /* "TUNER": log prefix */
  braid_param_id_t param;  /* the setting: a name, a file or path, none, or unset */
  int log_subsys;          /* INFO subsystem of "none found" */
  const char* without;     /* what happens without one, for messages */
  const char* net_lib;     /* the loaded net plugin's library, searched last; NULL: none */
  char* not_found;         /* the search last made in vain (setting and net_lib), kept by the */
  size_t not_found_size;   /* caller; the same search is not repeated; "" after a find */
};

/*
 * NCCL's search for a plugin library: the setting (`none`: nothing), else
 * libnccl-<kind>.so, then the net plugin's library. Logs what it tried (WARN
 * when the user named a library that would not load). Returns the library or
 * NULL; `opened` names it for messages, *from_net says it is the net plugin's,
 * *quiet that a library without a known version is INFO rather than WARN
 * (the user did not name it). The caller clears not_found once it uses it.
 */
void* braid_plugin_find(const struct braid_plugin_search* s, char* opened, size_t opened_size,
                        int* from_net, int* quiet);

#endif
