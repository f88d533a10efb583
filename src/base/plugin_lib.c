/* Finding NCCL plugin libraries (plugin_lib.h). */
#include "base/plugin_lib.h"

#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <stdio.h>
#include <string.h>

/* Appends what dlopen said about `file` to `why`. */
static void plugin_note_failure(const char* file, char* why, size_t size) {
  const char* err = dlerror();
  size_t len = strlen(why);
  if (len >= size) return;
  if (err == NULL) err = "unknown dlopen error";
  if (strstr(err, file))
    snprintf(why + len, size - len, "%s%s", len ? "; " : "", err);
  else
    snprintf(why + len, size - len, "%s%s: %s", len ? "; " : "", file, err);
}

static void* plugin_try(const char* file, char* why, size_t size) {
  void* dl = dlopen(file, RTLD_NOW | RTLD_LOCAL);
  if (dl == NULL) plugin_note_failure(file, why, size);
  return dl;
}

void* braid_plugin_open(const char* kind, const char* entry, char* why, size_t why_size) {
  char file[PATH_MAX];
  if (entry == NULL) {
    snprintf(file, sizeof file, "libnccl-%s.so", kind);
    return plugin_try(file, why, why_size);
  }
  void* dl = plugin_try(entry, why, why_size);
  if (dl) return dl;
  size_t len = strlen(entry);
  int lib_so = strncmp(entry, "lib", 3) == 0 && len > 3 && strcmp(entry + len - 3, ".so") == 0;
  if (strchr(entry, '/') || lib_so) return NULL;
  snprintf(file, sizeof file, "libnccl-%s-%s.so", kind, entry);
  return plugin_try(file, why, why_size);
}

void braid_plugin_path(void* dl, const char* fallback, char* out, size_t size) {
  struct link_map* map = NULL;
  if (dlinfo(dl, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name && map->l_name[0])
    snprintf(out, size, "%s", map->l_name);
  else
    snprintf(out, size, "%s", fallback);
}
