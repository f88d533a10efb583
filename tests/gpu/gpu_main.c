/*
 * gpu_coll: the GPU correctness suite's command line.
 *
 *   gpu_coll [--mode threads|procs|hosts|sharegpu|isolated|mixed]
 *            [--suite all|...|sym|hang|hangsend|abortwait|abortstuck]
 *            [--nranks N] [--quick] [--filter SUBSTR] [--seed S]
 *            [--case-timeout SEC] [--timeout SEC] [--list] [--verbose]
 *            [--no-cases | --init-fails]
 *
 * Exit status: 0 every case that ran passed (the summary line counts the
 * skipped ones); 1 a case failed, or no case ran at all (a --filter that
 * matches nothing) unless --no-cases or --init-fails said so; 77 (CTest's
 * skip code) when fewer than N GPUs are visible, CUDA finds none, or every
 * case skipped.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gpu_test.h"

static const char* main_suite; /* what the suites callback runs; set once before it is called */

static void main_usage(FILE* f) {
  fprintf(
      f,
      "usage: gpu_coll [options]\n"
      "  --mode threads|procs|hosts|sharegpu|isolated|mixed\n"
      "                         one process over all GPUs (default), one process per GPU, or\n"
      "                         one process per rank posing as separate hosts (BRAID_HOSTID,\n"
      "                         NCCL_HOSTID), sharing the visible GPUs: the network path;\n"
      "                         sharegpu: one process per rank on the visible GPUs, rank i\n"
      "                         posing as GPU i of BRAID_TOPO_FILE (bus ids in GPU_COLL_BUSIDS,\n"
      "                         comma-separated; Braid only): the intra-node path on one GPU;\n"
      "                         isolated: one process per GPU, each seeing only its own\n"
      "                         (CUDA_VISIBLE_DEVICES set per rank: the i-th entry of the\n"
      "                         caller's, or i); mixed: the even ranks so, the odd ones seeing\n"
      "                         every GPU\n"
      "  --suite NAME           all (default), coll, p2p, inflight, errors, api, shmfiles;\n"
      "                         leaks, sym, deadpeer, hang, hangsend, hanggraph, abortwait,\n"
      "                         abortpeer, abortstuck (not in all)\n"
      "                         sym: all-reduces and reduce-scatters from symmetric windows\n"
      "                         (tests/gpu/gpu_sym.c; with BRAID_SYM_MAX_BYTES and\n"
      "                         tests/gpu/expect_sym.sh)\n"
      "                         determinism (output hashes; tests/gpu/determinism_check.sh)\n"
      "  --nranks N             GPUs to use (default 2); exit 77 when fewer are visible\n"
      "  --ranks-per-host N     hosts mode: N consecutive ranks share an emulated host, each on\n"
      "                         its own GPU (P2P within a host, the network between hosts;\n"
      "                         default 1); exit 77 with fewer than N GPUs visible\n"
      "  --quick                a reduced matrix (for compute-sanitizer)\n"
      "  --filter SUBSTR        only the cases whose name contains SUBSTR\n"
      "  --seed S               the inputs' seed (default: from the clock, printed)\n"
      "  --case-timeout SEC     a case running longer fails as hung (default 240)\n"
      "  --timeout SEC          procs: the whole run (default 570)\n"
      "  --list                 print the case names and exit (needs no GPU)\n"
      "  --verbose              print each case as it starts\n"
      "  --no-cases             run no case on purpose: making and destroying the\n"
      "                         communicators is the test (without it, a run in which no\n"
      "                         case ran fails)\n"
      "  --init-fails           run no case; every rank's init must return an error\n"
      "                         (printed), else the run fails\n");
}

static void main_suites(struct gpu_world* w) {
  int all = strcmp(main_suite, "all") == 0;
  if (all || strcmp(main_suite, "coll") == 0) suite_coll(w);
  if (all || strcmp(main_suite, "p2p") == 0) {
    suite_p2pcoll(w);
    suite_p2p(w);
  }
  if (all || strcmp(main_suite, "inflight") == 0) suite_inflight(w);
  if (all || strcmp(main_suite, "errors") == 0) suite_errors(w);
  if (all || strcmp(main_suite, "api") == 0) suite_api(w);
  if (strcmp(main_suite, "leaks") == 0) suite_leaks(w); /* minutes: only on request */
  if (strcmp(main_suite, "sym") == 0) suite_sym(w); /* minutes: only on request */
  if (strcmp(main_suite, "deadpeer") == 0) suite_deadpeer(w); /* kills a rank: alone */
  if (strcmp(main_suite, "hang") == 0) suite_hang(w);         /* aborts the comm: alone */
  if (strcmp(main_suite, "hangsend") == 0) suite_hang_send(w); /* the same */
  if (strcmp(main_suite, "hanggraph") == 0) suite_hang_graph(w); /* the same */
  if (strcmp(main_suite, "abortwait") == 0) suite_abort_wait(w); /* the same */
  if (strcmp(main_suite, "abortpeer") == 0) suite_abort_peer(w); /* the same */
  if (strcmp(main_suite, "abortstuck") == 0) suite_abort_stuck(w); /* the same */
  if (all || strcmp(main_suite, "shmfiles") == 0) suite_shm_files(w);
  if (strcmp(main_suite, "determinism") == 0) suite_determinism(w);
}

static int main_parse_int(const char* s, long lo, long hi, long* out) {
  char* end;
  long v = strtol(s, &end, 10);
  if (*s == '\0' || *end != '\0' || v < lo || v > hi) return -1;
  *out = v;
  return 0;
}

/* 0 on success, 2 on a bad command line (after printing why). */
static int main_parse(int argc, char** argv, struct gpu_opts* o) {
  static const struct option longopts[] = {{"mode", required_argument, NULL, 'm'},
                                           {"suite", required_argument, NULL, 's'},
                                           {"nranks", required_argument, NULL, 'n'},
                                           {"ranks-per-host", required_argument, NULL, 'H'},
                                           {"quick", no_argument, NULL, 'q'},
                                           {"filter", required_argument, NULL, 'f'},
                                           {"seed", required_argument, NULL, 'S'},
                                           {"case-timeout", required_argument, NULL, 'c'},
                                           {"timeout", required_argument, NULL, 't'},
                                           {"list", no_argument, NULL, 'l'},
                                           {"verbose", no_argument, NULL, 'v'},
                                           {"no-cases", no_argument, NULL, 'N'},
                                           {"init-fails", no_argument, NULL, 'I'},
                                           {"help", no_argument, NULL, 'h'},
                                           {NULL, 0, NULL, 0}};
  long v;
  int c;
  while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
    switch (c) {
      case 'm':
        o->mode = optarg;
        break;
      case 's':
        o->suite = optarg;
        break;
      case 'n':
        if (main_parse_int(optarg, 1, GPU_MAX_RANKS, &v) != 0) goto bad;
        o->nranks = (int)v;
        break;
      case 'H':
        if (main_parse_int(optarg, 1, GPU_MAX_RANKS, &v) != 0) goto bad;
        o->ranks_per_host = (int)v;
        break;
      case 'q':
        o->quick = 1;
        break;
      case 'f':
        o->filter = optarg;
        break;
      case 'S':
        o->seed = strtoull(optarg, NULL, 0);
        break;
      case 'c':
        if (main_parse_int(optarg, 1, 86400, &v) != 0) goto bad;
        o->case_timeout_s = (unsigned)v;
        break;
      case 't':
        if (main_parse_int(optarg, 1, 86400, &v) != 0) goto bad;
        o->timeout_s = (double)v;
        break;
      case 'l':
        o->list = 1;
        break;
      case 'v':
        o->verbose = 1;
        break;
      case 'I':
        o->init_fails = 1;
        o->no_cases = 1;
        break;
      case 'N':
        o->no_cases = 1;
        break;
      case 'h':
        main_usage(stdout);
        exit(0);
      default:
        goto bad;
    }
  }
  if (o->ranks_per_host > 1 &&
      (strcmp(o->mode, "hosts") != 0 || o->nranks % o->ranks_per_host != 0)) {
    fprintf(stderr, "gpu_coll: --ranks-per-host %d needs --mode hosts and a rank count it divides "
                    "(--nranks %d)\n", o->ranks_per_host, o->nranks);
    goto bad;
  }
  if (o->no_cases && (o->filter || o->list)) {
    fprintf(stderr, "gpu_coll: --no-cases and --init-fails run no case: --filter and --list do "
                    "not go with them\n");
    goto bad;
  }
  if (optind == argc &&
      (strcmp(o->mode, "threads") == 0 || strcmp(o->mode, "procs") == 0 ||
       strcmp(o->mode, "hosts") == 0 || strcmp(o->mode, "sharegpu") == 0 ||
       strcmp(o->mode, "isolated") == 0 || strcmp(o->mode, "mixed") == 0) &&
      (strcmp(o->suite, "all") == 0 || strcmp(o->suite, "coll") == 0 ||
       strcmp(o->suite, "p2p") == 0 || strcmp(o->suite, "inflight") == 0 ||
       strcmp(o->suite, "errors") == 0 || strcmp(o->suite, "api") == 0 ||
       strcmp(o->suite, "leaks") == 0 || strcmp(o->suite, "sym") == 0 ||
       strcmp(o->suite, "deadpeer") == 0 ||
       strcmp(o->suite, "hang") == 0 || strcmp(o->suite, "hangsend") == 0 ||
       strcmp(o->suite, "hanggraph") == 0 || strcmp(o->suite, "abortwait") == 0 ||
       strcmp(o->suite, "abortpeer") == 0 || strcmp(o->suite, "abortstuck") == 0 ||
       strcmp(o->suite, "shmfiles") == 0 || strcmp(o->suite, "determinism") == 0))
    return 0;
bad:
  main_usage(stderr);
  return 2;
}

int main(int argc, char** argv) {
  struct gpu_opts o = {
      .mode = "threads", .suite = "all", .nranks = 2, .ranks_per_host = 1, .case_timeout_s = 240,
      .timeout_s = 570};
  o.seed = (uint64_t)time(NULL) * 1000003u ^ (uint64_t)getpid();
  if (main_parse(argc, argv, &o) != 0) return 2;
  setvbuf(stdout, NULL, _IOLBF, 0);
  ref_init();
  main_suite = o.suite;
  /* The hang suite waits for the watchdog: a short timeout, unless the caller chose one. */
  if (strcmp(o.suite, "hang") == 0 || strcmp(o.suite, "hangsend") == 0 ||
      strcmp(o.suite, "hanggraph") == 0)
    setenv("BRAID_TIMEOUT", "3", 0);
  if (!o.list)
    printf("gpu_coll: mode=%s suite=%s nranks=%d ranks-per-host=%d%s seed=%llu%s%s (reproduce "
           "with --seed %llu)\n",
           o.mode, o.suite, o.nranks, o.ranks_per_host, o.quick ? " quick" : "",
           (unsigned long long)o.seed, o.filter ? " filter=" : "", o.filter ? o.filter : "",
           (unsigned long long)o.seed);
  return world_main(&o, main_suites);
}
