/*
 * libibverbs loaded at run time (see net_ib_verbs.h): one library serves
 * machines with and without rdma-core. Built only with infiniband/verbs.h.
 * Tests name another library with BRAID_IB_VERBS_LIB (a verbs provider of
 * their own that exports the same functions).
 */
#ifdef BRAID_HAVE_IBVERBS

#include "transport/net_ib_verbs.h"

#include <dlfcn.h>
#include <stdio.h>

#include "base/debug.h"
#include "base/param.h"

struct ib_fns ibv_fn;

static void* ib_lib;

/* Required symbols; ibv_reg_dmabuf_mr (rdma-core 34 and later) and ibv_reg_mr_iova2 are optional. */
static const struct {
  const char* name;
  void** slot;
} ib_syms[] = {
  {"ibv_get_device_list", (void**)&ibv_fn.get_device_list},
  {"ibv_free_device_list", (void**)&ibv_fn.free_device_list},
  {"ibv_get_device_name", (void**)&ibv_fn.get_device_name},
  {"ibv_open_device", (void**)&ibv_fn.open_device},
  {"ibv_close_device", (void**)&ibv_fn.close_device},
  {"ibv_query_device", (void**)&ibv_fn.query_device},
  {"ibv_query_port", (void**)&ibv_fn.query_port},
  {"ibv_query_gid", (void**)&ibv_fn.query_gid},
  {"ibv_alloc_pd", (void**)&ibv_fn.alloc_pd},
  {"ibv_dealloc_pd", (void**)&ibv_fn.dealloc_pd},
  {"ibv_reg_mr", (void**)&ibv_fn.reg_mr},
  {"ibv_dereg_mr", (void**)&ibv_fn.dereg_mr},
  {"ibv_create_cq", (void**)&ibv_fn.create_cq},
  {"ibv_destroy_cq", (void**)&ibv_fn.destroy_cq},
  {"ibv_create_qp", (void**)&ibv_fn.create_qp},
  {"ibv_destroy_qp", (void**)&ibv_fn.destroy_qp},
  {"ibv_modify_qp", (void**)&ibv_fn.modify_qp},
  {"ibv_wc_status_str", (void**)&ibv_fn.wc_status_str},
};

int ib_verbs_load(char* why, size_t why_size) {
  if (ib_lib) return 0;
  const char* name = braid_param_str(BRAID_P_IB_VERBS_LIB);
  const int other = name != NULL && name[0] != '\0';
  if (!other) name = "libibverbs.so.1";
  void* lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    snprintf(why, why_size, "%s not found (%s)%s", name, dlerror(),
             other ? " (BRAID_IB_VERBS_LIB)" : "; install rdma-core's libibverbs1");
    return -1;
  }
  for (size_t i = 0; i < sizeof ib_syms / sizeof ib_syms[0]; i++) {
    *ib_syms[i].slot = dlsym(lib, ib_syms[i].name);
    if (*ib_syms[i].slot == NULL) {
      snprintf(why, why_size, "%s lacks %s%s", name, ib_syms[i].name, other ? "" : " (rdma-core too old)");
      dlclose(lib);
      return -1;
    }
  }
  ibv_fn.reg_dmabuf_mr = dlsym(lib, "ibv_reg_dmabuf_mr");
  ibv_fn.reg_mr_iova2 = dlsym(lib, "ibv_reg_mr_iova2"); /* IBVERBS_1.8: relaxed ordering */
  if (other) INFO(BRAID_LOG_NET, "net IB: verbs from %s (BRAID_IB_VERBS_LIB)", name);
  ib_lib = lib;
  return 0;
}

#endif /* BRAID_HAVE_IBVERBS */
