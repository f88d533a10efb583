/*
 * The OFI backend without GPU memory: where the provider offers no FI_HMEM
 * (or no GPU memory registers at init), and where BRAID_OFI_HMEM=0 turns it
 * off, the backend must still carry messages through host buffers, advertise
 * host pointers only, refuse to register GPU memory, and say why in one NET
 * INFO line ("net OFI: GPU memory off: <why>; staging every message through
 * host memory"). Two processes over libfabric's tcp;ofi_rxm provider on
 * loopback; skipped when the provider cannot run, and (the fallback case)
 * when the device path is on here (a provider with FI_HMEM and a GPU).
 *
 *   net_ofi_hmem_test ofi_hmem_fallback   the default setting, BRAID_OFI_HMEM=1
 *   net_ofi_hmem_test ofi_hmem_off        BRAID_OFI_HMEM=0
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/utils.h"
#include "boot_util.h"
#include "mp_runner.h"
#include "net_util.h"
#include "test.h"

#define WAIT_SEC 20.0
#define MSG_BYTES ((size_t)1 << 20)
#define OFF_LINE "net OFI: GPU memory off: "
#define STAGING " staging every message through host memory"

enum { F_LISTENING = 0, F_DONE = 1 };

static int off_case; /* BRAID_OFI_HMEM=0 */

/* This process's NET INFO lines go to a file of its own; the backend is opened after. */
static int child_open(const struct mp_child* c, const struct braid_net_ops** ops, char* log,
                      size_t log_size) {
  int ndev = 0;
  test_failures = 0;
  test_checks = 0;
  snprintf(log, log_size, "%s/braid-ofi-hmem.%d.%d.log",
           getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid(), c->index);
  boot_env("BRAID_DEBUG_SUBSYS", "NET");
  if (off_case) boot_env("BRAID_OFI_HMEM", "0");
  boot_log_to(log, "INFO");
  return net_util_open("ofi", ops, &ndev);
}

/* The INFO line about GPU memory: exactly one, "off", with the reason the case expects. */
static int check_log(const char* log) {
  const char* text = boot_slurp(log);
  if (strstr(text, "net OFI: GPU memory on: ")) {
    if (off_case) {
      TEST_CHECK(0, "BRAID_OFI_HMEM=0, yet the GPU memory path is on:\n%s", text);
      return 1;
    }
    fprintf(stderr,
            "SKIP: the provider offers FI_HMEM and GPU memory registers here: the host "
            "staging fallback cannot be shown (gpu_net_ofi_hmem_* tests that path)\n");
    return MP_SKIPPED;
  }
  TEST_CHECK(boot_count_lines(text, OFF_LINE) == 1, "one \"%s\" line expected in:\n%s", OFF_LINE,
             text);
  const char* line = strstr(text, OFF_LINE);
  if (line == NULL) return 1;
  const char* why = line + strlen(OFF_LINE);
  const char* end = strchr(why, '\n');
  size_t len = end ? (size_t)(end - why) : strlen(why);
  char reason[512];
  snprintf(reason, sizeof reason, "%.*s", (int)len, why);
  printf("INFO line: %s%s\n", OFF_LINE, reason);
  TEST_CHECK(strstr(reason, STAGING) != NULL, "the line does not say it stages: %s", reason);
  if (off_case) {
    TEST_CHECK(strncmp(reason, "turned off by BRAID_OFI_HMEM=0;", 31) == 0, "reason: %s", reason);
  } else {
    /* Either the provider has no FI_HMEM, or this process has no GPU whose memory registers. */
    TEST_CHECK(strstr(reason, "does not offer FI_HMEM") || strstr(reason, "CUDA device") ||
                   strstr(reason, "GPU "),
               "no reason given: %s", reason);
    TEST_CHECK(strstr(reason, "BRAID_OFI_HMEM") == NULL, "the default setting blamed: %s", reason);
  }
  return 0;
}

/* Host pointers only; GPU memory refused with a message that points at the INFO line. */
static void check_props(const struct braid_net_ops* ops, void* comm) {
  struct braid_net_props props;
  void* mh = NULL;
  char word[64];
  TEST_EXPECT_RES(ops->get_properties(0, &props), ncclSuccess);
  TEST_CHECK(props.ptr_support == BRAID_NET_PTR_HOST, "ptr_support %#x, host only expected",
             props.ptr_support);
  TEST_CHECK(ops->reg_mr(comm, word, sizeof word, 1, &mh) != ncclSuccess && mh == NULL,
             "GPU memory registered without FI_HMEM");
  TEST_CHECK(strstr(ncclGetLastError(NULL), "FI_HMEM") != NULL, "the refusal says: %s",
             ncclGetLastError(NULL));
}

static int hmem_child(const struct mp_child* c) {
  struct net_shared* sh = c->arg;
  const struct braid_net_ops* ops;
  char log[256];
  int rc = child_open(c, &ops, log, sizeof log);
  if (rc) return rc;
  rc = check_log(log);
  unlink(log);
  if (rc) return rc;
  char* buf = malloc(MSG_BYTES);
  void *l = NULL, *comm = NULL, *req = NULL;
  size_t size = 0;
  if (buf == NULL) return 1;
  if (c->index == 0) {
    TEST_EXPECT_RES(ops->listen(0, sh->key, sh->handle[0], &l), ncclSuccess);
    boot_set_flag(&sh->flags[F_LISTENING], 1);
    TEST_EXPECT_RES(net_util_accept(ops, l, &comm, WAIT_SEC), ncclSuccess);
  } else {
    if (boot_wait_flag(&sh->flags[F_LISTENING], 1, WAIT_SEC) == 0)
      TEST_EXPECT_RES(net_util_connect(ops, 0, sh->key, sh->handle[0], &comm, WAIT_SEC),
                      ncclSuccess);
    net_util_fill(buf, MSG_BYTES, 7);
  }
  if (comm) {
    check_props(ops, comm);
    int is_send = c->index == 1;
    TEST_EXPECT_RES(net_util_post(ops, comm, is_send, buf, MSG_BYTES, &req, WAIT_SEC), ncclSuccess);
    if (req) TEST_EXPECT_RES(net_util_wait(ops, req, &size, WAIT_SEC), ncclSuccess);
    if (!is_send) {
      TEST_CHECK(size == MSG_BYTES, "%zu bytes received", size);
      TEST_CHECK(net_util_check(buf, MSG_BYTES, 7) == 0, "the message arrived damaged");
    }
    if (!is_send)
      boot_set_flag(&sh->flags[F_DONE], 1);
    else
      boot_wait_flag(&sh->flags[F_DONE], 1, WAIT_SEC); /* the send's data stays until it landed */
    net_util_close(ops, comm, is_send);
  }
  if (l) ops->close_listen(l);
  free(buf);
  return comm && test_failures == 0 ? 0 : 1;
}

int main(int argc, char** argv) {
  const char* which = argc > 1 ? argv[1] : "";
  if (strcmp(which, "ofi_hmem_fallback") != 0 && strcmp(which, "ofi_hmem_off") != 0) {
    fprintf(stderr, "usage: %s ofi_hmem_fallback|ofi_hmem_off\n", argv[0]);
    return 2;
  }
  off_case = strcmp(which, "ofi_hmem_off") == 0;
  struct net_shared* sh = mp_shared_alloc(sizeof *sh);
  braid_random_bytes(sh->key, sizeof sh->key);
  struct mp_opts opts = {.name = which, .nprocs = 2, .timeout_sec = 40, .arg = sh};
  int rc = mp_run(&opts, hmem_child);
  mp_shared_free(sh, sizeof *sh);
  return mp_verdict_exit(rc, test_failures);
}
