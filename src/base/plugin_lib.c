/* Finding NCCL plugin libraries (plugin_lib.h). */
#include "base/plugin_lib.h"

#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "base/debug.h"

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

void* braid_plugin_find(const struct braid_plugin_search* s, char* opened, size_t opened_size,
                        int* from_net, int* quiet) {
  const char* setting = braid_param_str(s->param);
  if (setting && setting[0] == '\0') setting = NULL;
  const char* net_lib = s->net_lib && s->net_lib[0] ? s->net_lib : NULL;
  char key[2 * PATH_MAX + 2];
  snprintf(key, sizeof key, "%s\n%s", setting ? setting : "", net_lib ? net_lib : "");
  *from_net = 0;
  *quiet = setting == NULL;
  if (setting)
    snprintf(opened, opened_size, "%s", setting);
  else
    snprintf(opened, opened_size, "libnccl-%s.so", s->kind);
  if (s->not_found[0] && strcmp(key, s->not_found) == 0) return NULL;
  snprintf(s->not_found, s->not_found_size, "%s", key);
  if (setting) {
    INFO(BRAID_LOG_ENV, "%s set by environment to %s", braid_param_var(s->param), setting);
    if (strcasecmp(setting, "none") == 0) return NULL;
  }
  char why[1024] = "";
  void* handle = braid_plugin_open(s->kind, setting, why, sizeof why);
  if (handle == NULL && setting) {
    WARN("%s=%s: no %s plugin loaded (%s); %s", braid_param_var(s->param), setting, s->kind, why,
         net_lib ? "looking in the net plugin's library" : s->without);
  } else {
    INFO(s->log_subsys, "%s/Plugin: no %s plugin (%s)%s", s->label, s->kind, why,
         net_lib ? "; looking in the net plugin's library" : "");
  }
  if (handle == NULL && net_lib) {
    handle = dlopen(net_lib, RTLD_NOW | RTLD_LOCAL);
    *from_net = handle != NULL;
    *quiet = 1;
    snprintf(opened, opened_size, "%s", net_lib);
  }
  return handle;
}
