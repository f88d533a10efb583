/*
 * The bootstrap under the environment a launcher sets:
 *
 *   rootless  BRAID_COMM_ID=host:port: every rank derives the same id, no
 *             root thread is started by ncclGetUniqueId, rank 0 runs the root
 *             (late, so the others retry), and the port serves a second
 *             rendezvous right after the first; over IPv4 and IPv6 loopback
 *   ifname    BRAID_SOCKET_IFNAME / NCCL_SOCKET_IFNAME / BRAID_SOCKET_FAMILY:
 *             what the default picks, =exact, ^exclude, a spec that matches
 *             nothing (the message lists the interfaces there are), IPv6 only
 *   netns     ranks in two network namespaces joined by a veth pair ("hosts"
 *             with their own addresses); needs root and `ip`, else skipped
 *
 *   bootstrap_env_test rootless | ifname | netns
 */
#include <ifaddrs.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "boot_util.h"
#include "bootstrap/bootstrap.h"
#include "bootstrap/bootstrap_internal.h"
#include "base/error.h"
#include "base/socket.h"
#include "mp_runner.h"
#include "test.h"

#define MAX_CHILDREN 8

static void child_reset(void) {
  test_failures = 0;
  test_checks = 0;
}

/* Whether interface `name` is up with an address of `family` (AF_UNSPEC: any). */
static int have_address(const char* name, int family) {
  struct ifaddrs* list = NULL;
  int found = 0;
  if (getifaddrs(&list) != 0) return 0;
  for (struct ifaddrs* a = list; a; a = a->ifa_next) {
    if (!a->ifa_addr || !(a->ifa_flags & IFF_UP) || strcmp(a->ifa_name, name) != 0) continue;
    int f = a->ifa_addr->sa_family;
    if ((f == AF_INET || f == AF_INET6) && (family == AF_UNSPEC || f == family)) found = 1;
  }
  freeifaddrs(list);
  return found;
}

/* One rendezvous with the id each rank derives, checked; returns 0 when it all worked. */
static int join_and_check(const ncclUniqueId* id, int rank, int nranks, int salt) {
  struct bootstrap* b = NULL;
  TEST_EXPECT_RES(bootstrap_init(id, 1, rank, nranks, NULL, &b), ncclSuccess);
  if (b == NULL) return -1;
  TEST_CHECK(boot_allgather_check(b, 200, salt) == 0, "allgather (salt %d)", salt);
  TEST_EXPECT_RES(bootstrap_barrier(b), ncclSuccess);
  TEST_CHECK(boot_ring_tags_check(b, salt) == 0, "send/recv (salt %d)", salt);
  TEST_EXPECT_RES(bootstrap_close(b), ncclSuccess);
  return 0;
}

/* ---------------------------------------------------------- rootless */

struct rootless_shared {
  char comm_id[96];
  char ifname[16];
  uint64_t hash[MAX_CHILDREN];
};

static int rootless_child(const struct mp_child* c) {
  struct rootless_shared* sh = c->arg;
  child_reset();
  boot_env("BRAID_SOCKET_IFNAME", sh->ifname);
  boot_env("BRAID_COMM_ID", sh->comm_id);
  boot_env("BRAID_BOOTSTRAP_TIMEOUT", "10");
  int fds = boot_fd_count(), threads = boot_thread_count(), found = 0;
  ncclUniqueId from_env, from_api;
  TEST_EXPECT_RES(bootstrap_id_from_env(&from_env, &found), ncclSuccess);
  TEST_CHECK(found == 1, "BRAID_COMM_ID not seen");
  TEST_EXPECT_RES(bootstrap_get_unique_id(&from_api), ncclSuccess);
  TEST_CHECK(memcmp(&from_env, &from_api, sizeof from_env) == 0, "ncclGetUniqueId ignored BRAID_COMM_ID");
  TEST_CHECK(boot_thread_count() == threads, "ncclGetUniqueId started a root in BRAID_COMM_ID mode");
  sh->hash[c->index] = bootstrap_id_hash(&from_env);
  /* Rank 0 runs the root and comes late: the others must keep trying. */
  if (c->index == 0) mp_sleep(0.3);
  join_and_check(&from_env, c->index, c->nprocs, 1);
  /* The same address again, at once: the port must be free for the next communicator. */
  join_and_check(&from_env, c->index, c->nprocs, 2);
  TEST_CHECK(boot_settle(fds, threads, 2.0) == 0, "fds or threads left behind");
  return test_failures ? 1 : 0;
}

static int rootless_run(const char* host, const char* ifname) {
  struct rootless_shared* sh = mp_shared_alloc(sizeof *sh);
  int port = boot_free_port(host);
  TEST_CHECK(port > 0, "no free port on %s", host);
  snprintf(sh->comm_id, sizeof sh->comm_id, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
  snprintf(sh->ifname, sizeof sh->ifname, "%s", ifname);
  struct mp_opts opts = {.name = sh->comm_id, .nprocs = 4, .timeout_sec = 30, .arg = sh};
  int rc = mp_run(&opts, rootless_child);
  for (int i = 1; i < 4; i++) TEST_CHECK(sh->hash[i] == sh->hash[0], "rank %d derived another id", i);
  mp_shared_free(sh, sizeof *sh);
  return rc;
}

static int case_rootless(void) {
  /* Different addresses give different secrets; the same address the same id. */
  ncclUniqueId a, b, a2;
  int found = 0;
  boot_env("BRAID_COMM_ID", "127.0.0.1:40001");
  TEST_EXPECT_RES(bootstrap_id_from_env(&a, &found), ncclSuccess);
  TEST_EXPECT_RES(bootstrap_id_from_env(&a2, &found), ncclSuccess);
  boot_env("BRAID_COMM_ID", NULL);
  boot_env("NCCL_COMM_ID", "127.0.0.1:40002"); /* the NCCL name works too */
  TEST_EXPECT_RES(bootstrap_id_from_env(&b, &found), ncclSuccess);
  TEST_CHECK(found && memcmp(&a, &a2, sizeof a) == 0, "same BRAID_COMM_ID, different ids");
  struct bootstrap_id_layout la, lb;
  memcpy(&la, &a, sizeof la);
  memcpy(&lb, &b, sizeof lb);
  TEST_CHECK(memcmp(la.secret, lb.secret, sizeof la.secret) != 0, "two addresses, one secret");
  TEST_CHECK(la.mode == BOOTSTRAP_MODE_RANK0, "mode %d", la.mode);
  boot_env("NCCL_COMM_ID", "not an address");
  TEST_EXPECT_RES(bootstrap_id_from_env(&b, &found), ncclInvalidArgument);
  TEST_CHECK(strstr(braid_err_last(), "NCCL_COMM_ID=\"not an address\"") != NULL, "message: %s",
             braid_err_last());
  boot_env("NCCL_COMM_ID", "127.0.0.1:0"); /* the others could never find rank 0's port */
  TEST_EXPECT_RES(bootstrap_id_from_env(&b, &found), ncclInvalidArgument);
  TEST_CHECK(strstr(braid_err_last(), "NCCL_COMM_ID=127.0.0.1:0 names port 0") != NULL,
             "message: %s", braid_err_last());
  boot_env("NCCL_COMM_ID", NULL);
  TEST_EXPECT_RES(bootstrap_id_from_env(&b, &found), ncclSuccess);
  TEST_CHECK(found == 0, "found an id without BRAID_COMM_ID");

  int rc = rootless_run("127.0.0.1", "lo");
  if (have_address("lo", AF_INET6))
    rc = mp_verdict_merge(rc, rootless_run("::1", "lo"));
  else
    fprintf(stderr, "note: no IPv6 on lo, IPv6 root-less run skipped\n");
  return rc;
}

/* ------------------------------------------------------------ ifname */

static int list_has(const struct braid_netif* ifs, int n, const char* prefix) {
  for (int i = 0; i < n; i++)
    if (strncmp(ifs[i].name, prefix, strlen(prefix)) == 0) return 1;
  return 0;
}

/* Whether this host has an interface the default should prefer over loopback. */
static int have_real_interface(void) {
  static const char* const virt[] = {"docker", "veth", "virbr", "br-", "cni", "flannel"};
  struct ifaddrs* list = NULL;
  int found = 0;
  if (getifaddrs(&list) != 0) return 0;
  for (struct ifaddrs* a = list; a; a = a->ifa_next) {
    if (!a->ifa_addr || !(a->ifa_flags & IFF_UP) || (a->ifa_flags & IFF_LOOPBACK)) continue;
    if (a->ifa_addr->sa_family != AF_INET && a->ifa_addr->sa_family != AF_INET6) continue;
    int is_virtual = 0;
    for (size_t i = 0; i < sizeof virt / sizeof virt[0]; i++)
      is_virtual |= strncmp(a->ifa_name, virt[i], strlen(virt[i])) == 0;
    found |= !is_virtual;
  }
  freeifaddrs(list);
  return found;
}

/* A spec that matches nothing fails, naming the variable and every interface present. */
static void check_nothing_matches(const char* var) {
  struct braid_netif ifs[8];
  int n = -1;
  boot_env(var, "=nosuch0");
  braid_err_clear();
  TEST_EXPECT_RES(socket_find_interfaces(ifs, 8, &n), ncclSystemError);
  TEST_CHECK(n == 0, "count %d", n);
  const char* msg = braid_err_last();
  TEST_CHECK(strstr(msg, var) && strstr(msg, "nosuch0"), "\"%s\" does not name %s=nosuch0", msg, var);
  struct ifaddrs* list = NULL;
  if (getifaddrs(&list) == 0) {
    for (struct ifaddrs* a = list; a; a = a->ifa_next) {
      char needle[IF_NAMESIZE + 4];
      snprintf(needle, sizeof needle, "%s (", a->ifa_name);
      TEST_CHECK(strstr(msg, needle) != NULL, "\"%s\" does not list interface %s", msg, a->ifa_name);
    }
    freeifaddrs(list);
  }
  ncclUniqueId id;
  TEST_EXPECT_RES(bootstrap_get_unique_id(&id), ncclSystemError);
  boot_env(var, NULL);
}

static int ipv6_child(const struct mp_child* c) {
  struct boot_id_slot* slot = c->arg;
  child_reset();
  boot_env("BRAID_SOCKET_IFNAME", "lo");
  boot_env("BRAID_SOCKET_FAMILY", "AF_INET6");
  if (boot_id_share(slot, c->index, 20.0) != 0) return 1;
  struct bootstrap* b = NULL;
  TEST_EXPECT_RES(bootstrap_init(&slot->id, 1, c->index, c->nprocs, NULL, &b), ncclSuccess);
  if (b == NULL) return 1;
  for (int r = 0; r < c->nprocs; r++)
    TEST_CHECK(bootstrap_peer_addr(b, r)->sa.sa_family == AF_INET6, "rank %d is not on IPv6", r);
  TEST_CHECK(boot_allgather_check(b, 64, 7) == 0, "IPv6 allgather");
  TEST_EXPECT_RES(bootstrap_close(b), ncclSuccess);
  return test_failures ? 1 : 0;
}

static int case_ifname(void) {
  struct braid_netif ifs[32];
  int n = 0;
  boot_env("BRAID_SOCKET_IFNAME", NULL);
  boot_env("NCCL_SOCKET_IFNAME", NULL);
  TEST_EXPECT_RES(socket_find_interfaces(ifs, 32, &n), ncclSuccess);
  TEST_CHECK(n >= 1, "no interface by default");
  if (have_real_interface())
    TEST_CHECK(!list_has(ifs, n, "lo") && !list_has(ifs, n, "docker") && !list_has(ifs, n, "veth"),
               "the default picked loopback or a virtual bridge (%s first)", ifs[0].name);
  else
    TEST_CHECK(n == 1 && strcmp(ifs[0].name, "lo") == 0, "loopback is the only fallback");
  boot_env("BRAID_SOCKET_IFNAME", "=lo");
  TEST_EXPECT_RES(socket_find_interfaces(ifs, 32, &n), ncclSuccess);
  TEST_CHECK(n == 1 && strcmp(ifs[0].name, "lo") == 0 && ifs[0].addr.sa.sa_family == AF_INET,
             "=lo gave %d interfaces, first %s", n, n ? ifs[0].name : "-");
  boot_env("BRAID_SOCKET_IFNAME", "^lo");
  n = 0;
  if (socket_find_interfaces(ifs, 32, &n) == ncclSuccess) TEST_CHECK(!list_has(ifs, n, "lo"), "^lo kept lo");
  boot_env("BRAID_SOCKET_IFNAME", NULL);
  check_nothing_matches("BRAID_SOCKET_IFNAME");
  check_nothing_matches("NCCL_SOCKET_IFNAME");
  boot_env("BRAID_SOCKET_FAMILY", "AF_INET7");
  TEST_EXPECT_RES(socket_find_interfaces(ifs, 32, &n), ncclInvalidArgument);
  boot_env("BRAID_SOCKET_FAMILY", NULL);
  if (!have_address("lo", AF_INET6)) {
    fprintf(stderr, "note: no IPv6 on lo, IPv6 bootstrap skipped\n");
    return 0;
  }
  boot_env("BRAID_SOCKET_IFNAME", "lo");
  boot_env("BRAID_SOCKET_FAMILY", "AF_INET6");
  TEST_EXPECT_RES(socket_find_interfaces(ifs, 32, &n), ncclSuccess);
  TEST_CHECK(n == 1 && ifs[0].addr.sa.sa_family == AF_INET6, "AF_INET6 on lo gave family %d",
             ifs[0].addr.sa.sa_family);
  boot_env("BRAID_SOCKET_FAMILY", NULL);
  return boot_run("ipv6", 3, 20, sizeof(struct boot_id_slot), ipv6_child);
}

/* ------------------------------------------------------------- netns */

struct netns_shared {
  struct boot_id_slot slot;
  struct boot_netns net; /* two "hosts": braidA<id> and braidB<id>, devices bv* */
};

static int netns_child(const struct mp_child* c) {
  struct netns_shared* sh = c->arg;
  int side = c->index < c->nprocs / 2 ? 0 : 1;
  child_reset();
  TEST_CHECK(boot_netns_enter(&sh->net, side) == 0, "cannot enter %s", sh->net.ns[side]);
  boot_env("BRAID_SOCKET_IFNAME", "bv");
  boot_env("BRAID_BOOTSTRAP_TIMEOUT", "10"); /* fail with a message before the runner's limit */
  if (test_failures || boot_id_share(&sh->slot, c->index, 20.0) != 0) return 1;
  struct bootstrap* b = NULL;
  TEST_EXPECT_RES(bootstrap_init(&sh->slot.id, 1, c->index, c->nprocs, NULL, &b), ncclSuccess);
  if (b == NULL) return 1;
  for (int r = 0; r < c->nprocs; r++) {
    char text[80];
    const char* want = sh->net.addr[r < c->nprocs / 2 ? 0 : 1];
    socket_addr_str(bootstrap_peer_addr(b, r), text, sizeof text);
    TEST_CHECK(strncmp(text, want, strlen(want)) == 0 && text[strlen(want)] == ':',
               "rank %d listens at %s, expected %s", r, text, want);
  }
  TEST_CHECK(boot_allgather_check(b, 1000, 3) == 0, "allgather across namespaces");
  TEST_EXPECT_RES(bootstrap_barrier(b), ncclSuccess);
  TEST_CHECK(boot_ring_tags_check(b, 4) == 0, "send/recv across namespaces");
  TEST_EXPECT_RES(bootstrap_close(b), ncclSuccess);
  return test_failures ? 1 : 0;
}

static int case_netns(void) {
  const char* unavailable = boot_netns_unavailable();
  if (unavailable) TEST_SKIP("%s", unavailable);
  struct netns_shared* sh = mp_shared_alloc(sizeof *sh);
  if (boot_netns_setup(&sh->net, "braid", "bv", 213) != 0)
    TEST_SKIP("cannot create network namespaces with a veth pair here");
  struct mp_opts opts = {.name = "netns", .nprocs = 4, .timeout_sec = 30, .arg = sh};
  int rc = mp_run(&opts, netns_child);
  boot_netns_remove();
  mp_shared_free(sh, sizeof *sh);
  return rc;
}

int main(int argc, char** argv) {
  static const struct {
    const char* name;
    int (*run)(void);
  } cases[] = {{"rootless", case_rootless}, {"ifname", case_ifname}, {"netns", case_netns}};
  for (size_t i = 0; argc > 1 && i < sizeof cases / sizeof cases[0]; i++) {
    if (strcmp(argv[1], cases[i].name) != 0) continue;
    int rc = cases[i].run();
    test_summary();
    return mp_verdict_exit(rc, test_failures);
  }
  fprintf(stderr, "usage: %s rootless|ifname|netns\n", argv[0]);
  return 2;
}
