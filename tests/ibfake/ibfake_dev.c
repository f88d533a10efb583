/*
 * ibfake's devices and the verbs objects that carry no traffic: the device list (configured from
 * the environment, see README.md), contexts, ports and GIDs, protection domains, memory
 * registrations, completion queues, and the attribute log tests read.
 */
#include "ibfake.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

/* Real libibverbs defines these names as macros over inline wrappers; we export the functions. */
#undef ibv_get_device_list
#undef ibv_query_port
#undef ibv_reg_mr

#define IBFAKE_MIN_WINDOW_MS 50.0

static struct {
  pthread_mutex_t lock;
  int ndev;
  struct fdev devs[IBFAKE_MAX_DEVS];
  char log_path[512];
  double time_scale;
  int memlock;     /* registrations count against RLIMIT_MEMLOCK */
  size_t pinned;   /* bytes registered, for that count */
  int cq_entries;  /* IBFAKE_CQ_ENTRIES: every CQ holds at most this many (0: as asked) */
  int rnr_left;    /* IBFAKE_RNR: receives still to refuse as not ready */
  struct fnic* open; /* the open contexts, for the port changes tests make */
} cfg = {.lock = PTHREAD_MUTEX_INITIALIZER, .time_scale = 16};

/* Drops every request arriving at this process's NICs, unanswered: a path that lost its
   packets, or a peer that stopped (tests turn it on with ibfake_set_drop or IBFAKE_DROP=1). */
static int drop_requests = -1;

IBFAKE_EXPORT void ibfake_set_drop(int on) {
  __atomic_store_n(&drop_requests, on != 0, __ATOMIC_RELAXED);
}

int ibfake_dropping(void) {
  int on = __atomic_load_n(&drop_requests, __ATOMIC_RELAXED);
  if (on < 0) {
    const char* v = getenv("IBFAKE_DROP");
    on = v != NULL && atoi(v) != 0;
    __atomic_store_n(&drop_requests, on, __ATOMIC_RELAXED);
  }
  return on;
}

int ibfake_force_rnr(void) {
  return __atomic_load_n(&cfg.rnr_left, __ATOMIC_RELAXED) > 0 &&
         __atomic_sub_fetch(&cfg.rnr_left, 1, __ATOMIC_RELAXED) >= 0;
}

double ibfake_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Item `i` of the comma list in environment variable `name` (the last item repeats), or `def`. */
static void env_item(const char* name, int i, const char* def, char* out, size_t size) {
  const char* v = getenv(name);
  snprintf(out, size, "%s", def);
  if (v == NULL || v[0] == '\0') return;
  for (int k = 0;; k++) {
    const char* comma = strchr(v, ',');
    size_t len = comma ? (size_t)(comma - v) : strlen(v);
    if (k == i || comma == NULL) {
      snprintf(out, size, "%.*s", (int)len, v);
      return;
    }
    v = comma + 1;
  }
}

static void devs_configure(void) {
  const char* n = getenv("IBFAKE_NDEV");
  const char* log = getenv("IBFAKE_LOG");
  const char* scale = getenv("IBFAKE_TIME_SCALE");
  const char* memlock = getenv("IBFAKE_MEMLOCK");
  const char* cqe = getenv("IBFAKE_CQ_ENTRIES");
  const char* rnr = getenv("IBFAKE_RNR");
  cfg.ndev = n ? atoi(n) : 1;
  if (cfg.ndev < 0) cfg.ndev = 0;
  if (cfg.ndev > IBFAKE_MAX_DEVS) cfg.ndev = IBFAKE_MAX_DEVS;
  snprintf(cfg.log_path, sizeof cfg.log_path, "%s", log ? log : "");
  cfg.time_scale = scale && atof(scale) > 0 ? atof(scale) : 16;
  cfg.memlock = memlock && atoi(memlock) != 0;
  cfg.cq_entries = cqe && atoi(cqe) > 0 ? atoi(cqe) : 0;
  cfg.rnr_left = rnr && atoi(rnr) > 0 ? atoi(rnr) : 0;
  for (int i = 0; i < cfg.ndev; i++) {
    struct fdev* d = &cfg.devs[i];
    char text[32];
    memset(d, 0, sizeof *d);
    d->index = i;
    d->ibdev.node_type = IBV_NODE_CA;
    d->ibdev.transport_type = IBV_TRANSPORT_IB;
    snprintf(d->ibdev.name, sizeof d->ibdev.name, "ibfake%d", i);
    snprintf(d->ibdev.dev_name, sizeof d->ibdev.dev_name, "uverbs-fake%d", i);
    env_item("IBFAKE_LINK_LAYER", i, "roce", text, sizeof text);
    d->link_layer = strcmp(text, "ib") == 0 ? IBV_LINK_LAYER_INFINIBAND : IBV_LINK_LAYER_ETHERNET;
    env_item("IBFAKE_PORT_STATE", i, "active", text, sizeof text);
    d->state = strcmp(text, "down") == 0 ? IBV_PORT_DOWN
             : strcmp(text, "init") == 0 ? IBV_PORT_INIT
             : strcmp(text, "armed") == 0 ? IBV_PORT_ARMED : IBV_PORT_ACTIVE;
    env_item("IBFAKE_MTU", i, "4096", text, sizeof text);
    int mtu = atoi(text);
    d->mtu = mtu == 256 ? IBV_MTU_256 : mtu == 512 ? IBV_MTU_512 : mtu == 1024 ? IBV_MTU_1024
           : mtu == 2048 ? IBV_MTU_2048 : IBV_MTU_4096;
  }
}

void ibfake_log(const struct fnic* nic, const char* fmt, ...) {
  char line[1024];
  if (cfg.log_path[0] == '\0') return;
  int n =
      snprintf(line, sizeof line, "pid=%d dev=%s ", (int)getpid(), nic ? nic->dev.ibdev.name : "-");
  va_list ap;
  va_start(ap, fmt);
  n += vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
  va_end(ap);
  if (n > (int)sizeof line - 2) n = (int)sizeof line - 2;
  line[n++] = '\n';
  int fd = open(cfg.log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return;
  if (write(fd, line, (size_t)n) != n) { /* a test reading the log will notice */ }
  close(fd);
}

double ibfake_timeout_sec(uint8_t timeout) {
  if (timeout == 0) return 0;
  double sec = 4.096e-6 * (double)(1ull << (timeout > 31 ? 31 : timeout)) / cfg.time_scale;
  return sec < IBFAKE_MIN_WINDOW_MS / 1e3 ? IBFAKE_MIN_WINDOW_MS / 1e3 : sec;
}

/* ---------------------------------------------------------------- devices */

IBFAKE_EXPORT struct ibv_device** ibv_get_device_list(int* num) {
  pthread_mutex_lock(&cfg.lock);
  devs_configure();
  struct ibv_device** list = calloc((size_t)cfg.ndev + 1, sizeof *list);
  for (int i = 0; list && i < cfg.ndev; i++) list[i] = &cfg.devs[i].ibdev;
  if (num) *num = list ? cfg.ndev : 0;
  pthread_mutex_unlock(&cfg.lock);
  if (list == NULL) errno = ENOMEM;
  return list;
}

IBFAKE_EXPORT void ibv_free_device_list(struct ibv_device** list) { free(list); }

IBFAKE_EXPORT const char* ibv_get_device_name(struct ibv_device* device) { return device->name; }

IBFAKE_EXPORT struct ibv_context* ibv_open_device(struct ibv_device* device) {
  struct fnic* nic = calloc(1, sizeof *nic);
  if (nic == NULL) return NULL;
  pthread_mutex_lock(&cfg.lock);
  nic->dev = *(struct fdev*)device;
  pthread_mutex_unlock(&cfg.lock);
  nic->ctx.device = device;
  nic->ctx.cmd_fd = -1;
  nic->ctx.async_fd = -1;
  nic->ctx.num_comp_vectors = 1;
  nic->ctx.abi_compat = NULL; /* not a verbs_context: verbs.h's extended ops read as missing */
  pthread_mutex_init(&nic->ctx.mutex, NULL);
  pthread_mutex_init(&nic->lock, NULL);
  ibfake_qp_ops_fill(&nic->ctx.ops);
  nic->next_qpn = 0x100;
  nic->next_key = 0x1000;
  if (ibfake_nic_start(nic) != 0) {
    int err = errno;
    ibfake_nic_stop(nic);
    free(nic);
    errno = err;
    return NULL;
  }
  pthread_mutex_lock(&cfg.lock);
  nic->next_open = cfg.open;
  cfg.open = nic;
  pthread_mutex_unlock(&cfg.lock);
  ibfake_log(nic, "open key=%s lid=%u", nic->key[nic->ngid - 1], nic->lid);
  return &nic->ctx;
}

IBFAKE_EXPORT int ibv_close_device(struct ibv_context* ctx) {
  struct fnic* nic = (struct fnic*)ctx;
  pthread_mutex_lock(&cfg.lock);
  for (struct fnic** p = &cfg.open; *p; p = &(*p)->next_open) {
    if (*p != nic) continue;
    *p = nic->next_open;
    break;
  }
  pthread_mutex_unlock(&cfg.lock);
  ibfake_nic_stop(nic);
  while (nic->mrs) {
    struct fmr* mr = nic->mrs;
    nic->mrs = mr->next;
    if (mr->map_len) munmap(mr->host, mr->map_len);
    free(mr);
  }
  pthread_mutex_destroy(&nic->lock);
  free(nic);
  return 0;
}

IBFAKE_EXPORT int ibv_query_device(struct ibv_context* ctx, struct ibv_device_attr* attr) {
  struct fnic* nic = (struct fnic*)ctx;
  memset(attr, 0, sizeof *attr);
  snprintf(attr->fw_ver, sizeof attr->fw_ver, "ibfake");
  attr->node_guid = (uint64_t)getpid() << 16 | (uint64_t)nic->dev.index;
  attr->sys_image_guid = attr->node_guid;
  attr->max_mr_size = UINT64_MAX;
  attr->page_size_cap = 4096;
  attr->vendor_id = 0xfa4e;
  attr->max_qp = 1 << 16;
  attr->max_qp_wr = 1 << 15;
  attr->max_sge = IBFAKE_MAX_SGE;
  attr->max_cq = 1 << 16;
  attr->max_cqe = 1 << 22;
  attr->max_mr = 1 << 20;
  attr->max_pd = 1 << 16;
  attr->max_qp_rd_atom = 16;
  attr->max_qp_init_rd_atom = 16;
  attr->max_pkeys = 1;
  attr->phys_port_cnt = 1;
  return 0;
}

/* libibverbs exports ibv_query_port with the layout of rdma-core before port_cap_flags2 (its
   inline wrapper reaches the full one through the extended context); so does this one. */
IBFAKE_EXPORT int ibv_query_port(struct ibv_context* ctx, uint8_t port,
                                 struct _compat_ibv_port_attr* out) {
  struct fnic* nic = (struct fnic*)ctx;
  struct ibv_port_attr full, *attr = &full;
  if (port != 1) return EINVAL;
  memset(attr, 0, sizeof *attr);
  attr->state = nic->dev.state;
  attr->max_mtu = IBV_MTU_4096;
  attr->active_mtu = nic->dev.mtu;
  attr->gid_tbl_len = nic->ngid;
  attr->max_msg_sz = 1u << 31;
  attr->pkey_tbl_len = 1;
  attr->lid = nic->lid;
  attr->sm_lid = 1;
  attr->lmc = 0;
  attr->active_width = 2; /* 4x */
  attr->active_speed = 32; /* EDR */
  attr->phys_state = nic->dev.state == IBV_PORT_ACTIVE ? 5 : 3; /* LinkUp, Disabled */
  attr->link_layer = (uint8_t)nic->dev.link_layer;
  memcpy(out, attr, offsetof(struct ibv_port_attr, port_cap_flags2));
  return 0;
}

IBFAKE_EXPORT int ibv_query_gid(struct ibv_context* ctx, uint8_t port, int index,
                                union ibv_gid* gid) {
  struct fnic* nic = (struct fnic*)ctx;
  if (port != 1 || index < 0 || index >= nic->ngid) return -1;
  pthread_mutex_lock(&nic->lock);
  if (nic->gid_gone[index]) memset(gid, 0, sizeof *gid); /* an empty entry reads as zeros */
  else *gid = nic->gid[index];
  pthread_mutex_unlock(&nic->lock);
  return 0;
}

/* Applies `fn` to the open contexts of device `dev`; 0 if there was one, else -1. */
static int for_open(int dev, void (*fn)(struct fnic*, int), int arg) {
  int found = 0;
  pthread_mutex_lock(&cfg.lock);
  for (struct fnic* nic = cfg.open; nic; nic = nic->next_open) {
    if (nic->dev.index != dev) continue;
    pthread_mutex_lock(&nic->lock);
    fn(nic, arg);
    pthread_mutex_unlock(&nic->lock);
    found = 1;
  }
  pthread_mutex_unlock(&cfg.lock);
  return found ? 0 : -1;
}

static void set_mtu(struct fnic* nic, int mtu) {
  nic->dev.mtu = (enum ibv_mtu)mtu;
  ibfake_log(nic, "port: active MTU now %d", 128 << mtu);
}

static void del_gid(struct fnic* nic, int index) {
  if (index >= nic->ngid || nic->gid_gone[index]) return;
  nic->gid_gone[index] = 1;
  ibfake_nic_forget_gid(nic, index);
  ibfake_log(nic, "port: GID index %d removed", index);
}

IBFAKE_EXPORT int ibfake_set_mtu(int dev, int mtu) {
  int e = mtu == 256 ? IBV_MTU_256 : mtu == 512 ? IBV_MTU_512 : mtu == 1024 ? IBV_MTU_1024
        : mtu == 2048 ? IBV_MTU_2048 : mtu == 4096 ? IBV_MTU_4096 : 0;
  return e == 0 ? -1 : for_open(dev, set_mtu, e);
}

IBFAKE_EXPORT int ibfake_del_gid(int dev, int index) {
  return index < 0 || index >= IBFAKE_NGID ? -1 : for_open(dev, del_gid, index);
}

/* ------------------------------------------------------ protection domains */

IBFAKE_EXPORT struct ibv_pd* ibv_alloc_pd(struct ibv_context* ctx) {
  struct fnic* nic = (struct fnic*)ctx;
  struct fpd* pd = calloc(1, sizeof *pd);
  if (pd == NULL) return NULL;
  pd->pd.context = ctx;
  pthread_mutex_lock(&nic->lock);
  pd->pd.handle = (uint32_t)++nic->npd;
  pthread_mutex_unlock(&nic->lock);
  return &pd->pd;
}

IBFAKE_EXPORT int ibv_dealloc_pd(struct ibv_pd* pd) {
  struct fnic* nic = (struct fnic*)pd->context;
  int busy = 0;
  pthread_mutex_lock(&nic->lock);
  for (struct fmr* m = nic->mrs; m; m = m->next) busy |= m->mr.pd == pd;
  for (struct fqp* q = nic->qps; q; q = q->next) busy |= q->qp.pd == pd;
  pthread_mutex_unlock(&nic->lock);
  if (busy) {
    ibfake_log(nic, "dealloc_pd refused: registrations or QPs still use it");
    return EBUSY;
  }
  free(pd);
  return 0;
}

/* ------------------------------------------------------------ registration */

static struct ibv_mr* mr_add(struct fnic* nic, struct fmr* mr);

/* Whether the process can read [addr, addr+len): host memory, not a GPU's (0 when unsure). */
static int mem_unreadable(void* addr, size_t len) {
  char byte;
  struct iovec local = {&byte, 1};
  struct iovec remote[2] = {{addr, 1}, {(char*)addr + len - 1, 1}};
  for (int i = 0; i < 2; i++)
    if (process_vm_readv(getpid(), &local, 1, &remote[i], 1, 0) < 0 && errno == EFAULT) return 1;
  return 0;
}

/* Host memory [addr, addr+length); `how` names the call in the log. */
static struct ibv_mr* reg_host(struct ibv_pd* pd, void* addr, size_t length, int access,
                               const char* how) {
  struct fnic* nic = (struct fnic*)pd->context;
  struct rlimit lim;
  if (length == 0 || addr == NULL) {
    errno = EINVAL;
    return NULL;
  }
  if (mem_unreadable(addr, length)) { /* a GPU's memory: this NIC can only copy host memory */
    ibfake_log(nic, "reg_mr refused: %zu bytes at %p are not host memory", length, addr);
    errno = EFAULT;
    return NULL;
  }
  pthread_mutex_lock(&cfg.lock);
  if (cfg.memlock && getrlimit(RLIMIT_MEMLOCK, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY &&
      cfg.pinned + length > lim.rlim_cur) {
    pthread_mutex_unlock(&cfg.lock);
    ibfake_log(nic, "reg_mr refused: %zu bytes over the memlock limit", length);
    errno = ENOMEM;
    return NULL;
  }
  cfg.pinned += length;
  pthread_mutex_unlock(&cfg.lock);
  struct fmr* mr = calloc(1, sizeof *mr);
  if (mr == NULL) {
    pthread_mutex_lock(&cfg.lock);
    cfg.pinned -= length;
    pthread_mutex_unlock(&cfg.lock);
    errno = ENOMEM;
    return NULL;
  }
  mr->access = access;
  mr->host = addr;
  mr->mr.context = pd->context;
  mr->mr.pd = pd;
  mr->mr.addr = addr;
  mr->mr.length = length;
  struct ibv_mr* out = mr_add(nic, mr);
  ibfake_log(nic, "%s length=%zu access=0x%x key=0x%x", how, length, access, out->lkey);
  return out;
}

IBFAKE_EXPORT struct ibv_mr* ibv_reg_mr(struct ibv_pd* pd, void* addr, size_t length, int access) {
  return reg_host(pd, addr, length, access, "reg_mr");
}

/* The IBVERBS_1.8 call, through which rdma-core passes optional access flags such as
   IBV_ACCESS_RELAXED_ORDERING (recorded: this NIC's copies have no PCIe ordering to relax).
   Only iova == addr is implemented. */
IBFAKE_EXPORT struct ibv_mr* ibv_reg_mr_iova2(struct ibv_pd* pd, void* addr, size_t length,
                                              uint64_t iova, unsigned int access) {
  if (iova != (uint64_t)(uintptr_t)addr) {
    ibfake_log((struct fnic*)pd->context, "reg_mr_iova2 refused: iova other than the address "
               "is not implemented");
    errno = EOPNOTSUPP;
    return NULL;
  }
  return reg_host(pd, addr, length, (int)access, "reg_mr_iova2");
}

/*
 * A dma-buf stands in as any file the process can map (a memfd, in the tests): the NIC reaches
 * bytes [offset, offset+length) of it through a mapping of its own, at the addresses
 * [iova, iova+length) that work requests name, as a NIC reaches a GPU's memory through the
 * dma-buf and not through the process's mapping. Files that cannot be mapped are refused.
 */
IBFAKE_EXPORT struct ibv_mr* ibv_reg_dmabuf_mr(struct ibv_pd* pd, uint64_t offset, size_t length,
                                               uint64_t iova, int fd, int access) {
  struct fnic* nic = (struct fnic*)pd->context;
  if (length == 0 || iova == 0 || fd < 0) {
    errno = EINVAL;
    return NULL;
  }
  void* map = mmap(NULL, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)offset);
  if (map == MAP_FAILED) {
    int err = errno;
    ibfake_log(nic, "reg_dmabuf_mr refused: fd %d cannot be mapped (%s)", fd, strerror(err));
    errno = err;
    return NULL;
  }
  struct fmr* mr = calloc(1, sizeof *mr);
  if (mr == NULL) {
    munmap(map, length);
    errno = ENOMEM;
    return NULL;
  }
  mr->access = access;
  mr->host = map;
  mr->map_len = length;
  mr->mr.context = pd->context;
  mr->mr.pd = pd;
  mr->mr.addr = (void*)(uintptr_t)iova;
  mr->mr.length = length;
  ibfake_log(nic, "reg_dmabuf_mr fd=%d offset=%llu length=%zu access=0x%x", fd,
             (unsigned long long)offset, length, access);
  return mr_add(nic, mr);
}

/* Gives `mr` its keys and puts it in the NIC's list. */
static struct ibv_mr* mr_add(struct fnic* nic, struct fmr* mr) {
  pthread_mutex_lock(&nic->lock);
  /* The low byte varies with the process, so that a key from another process (or a stale one)
     is unlikely to name a registration here by chance. */
  nic->next_key++;
  mr->mr.lkey = mr->mr.rkey =
      nic->next_key << 8 | ((nic->next_key * 37u + (uint32_t)getpid()) & 0xff);
  mr->mr.handle = mr->mr.lkey;
  mr->next = nic->mrs;
  nic->mrs = mr;
  pthread_mutex_unlock(&nic->lock);
  return &mr->mr;
}

IBFAKE_EXPORT int ibv_dereg_mr(struct ibv_mr* ibmr) {
  struct fnic* nic = (struct fnic*)ibmr->context;
  struct fmr* mr = (struct fmr*)ibmr;
  pthread_mutex_lock(&nic->lock);
  for (struct fmr** p = &nic->mrs; *p; p = &(*p)->next) {
    if (*p != mr) continue;
    *p = mr->next;
    break;
  }
  ibfake_nic_forget_mr(nic, mr);
  pthread_mutex_unlock(&nic->lock);
  if (mr->map_len) {
    munmap(mr->host, mr->map_len);
  } else {
    pthread_mutex_lock(&cfg.lock);
    cfg.pinned -= ibmr->length;
    pthread_mutex_unlock(&cfg.lock);
  }
  free(mr);
  return 0;
}

char* ibfake_mr_ptr(const struct fmr* mr, uint64_t addr) {
  return mr->host + (addr - (uint64_t)(uintptr_t)mr->mr.addr);
}

struct fmr* ibfake_mr_find(struct fnic* nic, struct ibv_pd* pd, uint32_t key, uint64_t addr,
                           uint64_t len, int access) {
  for (struct fmr* m = nic->mrs; m; m = m->next) {
    if (m->mr.lkey != key || m->mr.pd != pd) continue;
    uint64_t lo = (uint64_t)(uintptr_t)m->mr.addr, hi = lo + m->mr.length;
    if (addr < lo || addr + len > hi || addr + len < addr) return NULL;
    return (m->access & access) == access ? m : NULL;
  }
  return NULL;
}

/* ------------------------------------------------------- completion queues */

IBFAKE_EXPORT struct ibv_cq* ibv_create_cq(struct ibv_context* ctx, int cqe, void* cq_context,
                                           struct ibv_comp_channel* channel, int comp_vector) {
  struct fnic* nic = (struct fnic*)ctx;
  if (cqe <= 0 || cqe > (1 << 22) || channel != NULL) {
    errno = EINVAL;
    return NULL;
  }
  struct fcq* cq = calloc(1, sizeof *cq);
  if (cq) cq->wc = calloc((size_t)cqe, sizeof *cq->wc);
  if (cq == NULL || cq->wc == NULL) {
    free(cq);
    errno = ENOMEM;
    return NULL;
  }
  cq->cap = cfg.cq_entries > 0 && cfg.cq_entries < cqe ? cfg.cq_entries : cqe;
  if (cq->cap != cqe)
    ibfake_log(nic, "create_cq: %d entries asked for, %d given (IBFAKE_CQ_ENTRIES)", cqe, cq->cap);
  cq->cq.context = ctx;
  cq->cq.cq_context = cq_context;
  cq->cq.cqe = cqe;
  pthread_mutex_init(&cq->cq.mutex, NULL);
  pthread_cond_init(&cq->cq.cond, NULL);
  pthread_mutex_lock(&nic->lock);
  cq->cq.handle = (uint32_t)++nic->ncq;
  pthread_mutex_unlock(&nic->lock);
  return &cq->cq;
}

IBFAKE_EXPORT int ibv_destroy_cq(struct ibv_cq* ibcq) {
  struct fnic* nic = (struct fnic*)ibcq->context;
  struct fcq* cq = (struct fcq*)ibcq;
  pthread_mutex_lock(&nic->lock);
  int busy = cq->nqp > 0;
  pthread_mutex_unlock(&nic->lock);
  if (busy) {
    ibfake_log(nic, "destroy_cq refused: %d QPs still use it", cq->nqp);
    return EBUSY;
  }
  pthread_mutex_destroy(&cq->cq.mutex);
  pthread_cond_destroy(&cq->cq.cond);
  free(cq->wc);
  free(cq);
  return 0;
}

void ibfake_cq_push(struct fcq* cq, const struct ibv_wc* wc) {
  if (cq->count == cq->cap) {
    if (!cq->overflow)
      ibfake_log((struct fnic*)cq->cq.context, "cq=%u overflow: more than %d completions unpolled",
                 cq->cq.handle, cq->cap);
    cq->overflow = 1;
    return;
  }
  cq->wc[(cq->head + cq->count) % cq->cap] = *wc;
  cq->count++;
}

/* rdma-core's texts, so that messages read as they would on a real device. */
IBFAKE_EXPORT const char* ibv_wc_status_str(enum ibv_wc_status status) {
  static const char* const text[] = {
    [IBV_WC_SUCCESS] = "success",
    [IBV_WC_LOC_LEN_ERR] = "local length error",
    [IBV_WC_LOC_QP_OP_ERR] = "local QP operation error",
    [IBV_WC_LOC_EEC_OP_ERR] = "local EE context operation error",
    [IBV_WC_LOC_PROT_ERR] = "local protection error",
    [IBV_WC_WR_FLUSH_ERR] = "Work Request Flushed Error",
    [IBV_WC_MW_BIND_ERR] = "memory management operation error",
    [IBV_WC_BAD_RESP_ERR] = "bad response error",
    [IBV_WC_LOC_ACCESS_ERR] = "local access error",
    [IBV_WC_REM_INV_REQ_ERR] = "remote invalid request error",
    [IBV_WC_REM_ACCESS_ERR] = "remote access error",
    [IBV_WC_REM_OP_ERR] = "remote operation error",
    [IBV_WC_RETRY_EXC_ERR] = "transport retry counter exceeded",
    [IBV_WC_RNR_RETRY_EXC_ERR] = "RNR retry counter exceeded",
    [IBV_WC_LOC_RDD_VIOL_ERR] = "local RDD violation error",
    [IBV_WC_REM_INV_RD_REQ_ERR] = "remote invalid RD request",
    [IBV_WC_REM_ABORT_ERR] = "aborted error",
    [IBV_WC_INV_EECN_ERR] = "invalid EE context number",
    [IBV_WC_INV_EEC_STATE_ERR] = "invalid EE context state",
    [IBV_WC_FATAL_ERR] = "fatal error",
    [IBV_WC_RESP_TIMEOUT_ERR] = "response timeout error",
    [IBV_WC_GENERAL_ERR] = "general error",
  };
  if ((unsigned)status < sizeof text / sizeof text[0] && text[status]) return text[status];
  return "unknown";
}
