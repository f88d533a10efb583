/*
 * Command line of the perf tools: nccl-tests' flags, meanings and defaults
 * (checked against NVIDIA/nccl-tests src/common.cu and README), plus -p N to
 * self-launch N processes, -J for JSON lines, --alloc and -R (registration). Everything here is
 * pure (no GPU, no library call) so tests/unit/perf_unit_test.c covers it.
 *
 * Where nccl-tests silently falls back (an unknown -d name becomes float) we
 * refuse with a sentence instead: a benchmark that measured something else
 * than what was typed is worse than one that did not start.
 */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common.h"

/* Names in nccl-tests' order, which is also "-d all"'s order. */
static const char* const perf_type_names[ncclNumTypes] = {
    "int8", "uint8", "int32", "uint32", "int64", "uint64",
    "half", "float", "double", "bfloat16", "f8e4m3", "f8e5m2"};

/* Spellings people also type; each maps to one of the names above. */
static const struct {
  const char* alias;
  int type;
} perf_type_aliases[] = {
    {"char", ncclInt8},       {"int", ncclInt32},      {"float16", ncclFloat16},
    {"fp16", ncclFloat16},    {"float32", ncclFloat32}, {"fp32", ncclFloat32},
    {"float64", ncclFloat64}, {"fp64", ncclFloat64},   {"bf16", ncclBfloat16},
    {"fp8e4m3", ncclFloat8e4m3}, {"fp8e5m2", ncclFloat8e5m2},
};

/* Long options without a short letter (getopt_long returns these). */
#define PERF_OPT_PARALLEL_INIT 1000
#define PERF_OPT_SPLIT_SHARE 1001

static const char* const perf_op_names[PERF_NUM_OPS] = {"sum", "prod", "max", "min", "avg",
                                                        "mulsum"};

void perf_args_defaults(perf_args_t* a) {
  memset(a, 0, sizeof(*a));
  a->nthreads = 1;
  a->ngpus = 1;
  a->min_bytes = 32u << 20;
  a->max_bytes = 32u << 20;
  a->step_bytes = 1u << 20;
  a->step_factor = 1;
  a->iters = 20;
  a->warmup_iters = 1; /* nccl-tests lowered its default from 5 to 1 */
  a->agg_iters = 1;
  a->run_cycles = 1;
  a->check = 1;
  a->type = ncclFloat32;
  a->op = ncclSum;
  a->root = 0;
  a->average = 1;
  a->min_bw = -1.0;
  a->device0 = -1;
  a->split_share = -1;
}

const char* perf_type_name(int type) {
  if (type < 0 || type >= ncclNumTypes) return "?";
  return perf_type_names[type];
}

int perf_type_parse(const char* name) {
  if (strcmp(name, "all") == 0) return PERF_ALL;
  for (int t = 0; t < ncclNumTypes; t++)
    if (strcmp(name, perf_type_names[t]) == 0) return t;
  for (size_t i = 0; i < sizeof(perf_type_aliases) / sizeof(perf_type_aliases[0]); i++)
    if (strcmp(name, perf_type_aliases[i].alias) == 0) return perf_type_aliases[i].type;
  return -2;
}

const char* perf_op_name(int op) {
  if (op < 0 || op >= PERF_NUM_OPS) return "?";
  return perf_op_names[op];
}

int perf_op_parse(const char* name) {
  if (strcmp(name, "all") == 0) return PERF_ALL;
  for (int o = 0; o < PERF_NUM_OPS; o++)
    if (strcmp(name, perf_op_names[o]) == 0) return o;
  return -2;
}

/* The multiplier of an optional K/M/G unit (powers of 1024, as nccl-tests),
   which may be followed by "B" or "iB". Returns 0 for anything else. */
static double perf_size_unit(const char* s) {
  double unit = 1;
  switch (*s) {
    case 'k': case 'K': unit = 1024.0; s++; break;
    case 'm': case 'M': unit = 1024.0 * 1024; s++; break;
    case 'g': case 'G': unit = 1024.0 * 1024 * 1024; s++; break;
    default: break;
  }
  if (unit > 1 && *s == 'i') s++;
  if (*s == 'b' || *s == 'B') s++;
  while (isspace((unsigned char)*s)) s++;
  return *s == '\0' ? unit : 0;
}

int perf_parse_size(const char* text, size_t* out) {
  if (text == NULL) return -1;
  const char* s = text;
  while (isspace((unsigned char)*s)) s++;
  if (*s == '-' || *s == '+' || *s == '\0') return -1;
  if (!isdigit((unsigned char)*s) && *s != '.') return -1;
  errno = 0;
  char* end = NULL;
  double number = strtod(s, &end);
  if (end == s || errno != 0 || !isfinite(number)) return -1;
  while (isspace((unsigned char)*end)) end++;
  double unit = perf_size_unit(end);
  if (unit == 0) return -1;
  double bytes = number * unit;
  /* 2^63 is a bound no buffer reaches and that a double holds exactly. */
  if (bytes >= 9223372036854775808.0) return -1;
  if (bytes != floor(bytes)) return -1; /* "1.5" bytes: say what you mean */
  *out = (size_t)bytes;
  return 0;
}

int perf_size_next(const perf_args_t* a, size_t size, size_t* next) {
  size_t n;
  if (a->step_factor > 1) {
    if (size > SIZE_MAX / a->step_factor) return 0;
    n = size * a->step_factor;
  } else {
    if (size > SIZE_MAX - a->step_bytes) return 0;
    n = size + a->step_bytes;
  }
  if (n <= size || n > a->max_bytes) return 0;
  *next = n;
  return 1;
}

/* Formats a sentence into err; always returns -1 so callers can return it. */
__attribute__((format(printf, 3, 4))) static int perf_fail(char* err, size_t err_len,
                                                           const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, err_len, fmt, ap);
  va_end(ap);
  return -1;
}

/* Strict integer in [lo, hi] with nccl-tests' base 0 (so 0x10 works). */
static int perf_parse_int(const char* text, long lo, long hi, int* out) {
  errno = 0;
  char* end = NULL;
  long v = strtol(text, &end, 0);
  if (end == text || *end != '\0' || errno != 0 || v < lo || v > hi) return -1;
  *out = (int)v;
  return 0;
}

static int perf_parse_root(const char* text, int* out) {
  if (strcmp(text, "all") == 0 || strcmp(text, "-1") == 0) {
    *out = PERF_ALL;
    return 0;
  }
  return perf_parse_int(text, 0, INT_MAX, out);
}

/* -p N: N >= 2 forks N processes; 0 and 1 keep nccl-tests' parallel_init. */
static void perf_apply_procs(perf_args_t* a, int n) {
  a->procs = n >= 2 ? n : 0;
  a->parallel_init = n == 1;
}

static const struct option perf_long_options[] = {
    {"nthreads", required_argument, 0, 't'},
    {"ngpus", required_argument, 0, 'g'},
    {"minbytes", required_argument, 0, 'b'},
    {"maxbytes", required_argument, 0, 'e'},
    {"stepbytes", required_argument, 0, 'i'},
    {"stepfactor", required_argument, 0, 'f'},
    {"iters", required_argument, 0, 'n'},
    {"agg_iters", required_argument, 0, 'm'},
    {"warmup_iters", required_argument, 0, 'w'},
    {"run_cycles", required_argument, 0, 'N'},
    {"procs", required_argument, 0, 'p'},
    {"parallel_init", required_argument, 0, PERF_OPT_PARALLEL_INIT},
    {"split_share", required_argument, 0, PERF_OPT_SPLIT_SHARE},
    {"check", required_argument, 0, 'c'},
    {"op", required_argument, 0, 'o'},
    {"datatype", required_argument, 0, 'd'},
    {"root", required_argument, 0, 'r'},
    {"blocking", required_argument, 0, 'z'},
    {"stream_null", required_argument, 0, 'y'},
    {"timeout", required_argument, 0, 'T'},
    {"cudagraph", required_argument, 0, 'G'},
    {"report_cputime", required_argument, 0, 'C'},
    {"average", required_argument, 0, 'a'},
    {"output_file", required_argument, 0, 'J'},
    {"local_register", required_argument, 0, 'R'},
    {"alloc", required_argument, 0, 'A'},
    {"help", no_argument, 0, 'h'},
    {0, 0, 0, 0}};

/*
 * nccl-tests flags we do not implement: refuse by name rather than guess, except a value of 0,
 * which is their default and asks for nothing.
 */
static const char* perf_unsupported_option(int c, const char* v) {
  if (c != 'F' && v != NULL && strcmp(v, "0") == 0) return NULL;
  switch (c) {
    case 'S': return "-S (report_timestamps)";
    case 'M': return "-M (memory_report)";
    case 'x': return "-x (cta_policy)";
    case 'D': return "-D (device_implementation)";
    case 'V': return "-V (device_cta_count)";
    case 'F': return "-F (CSV output_file; use -J for JSON lines)";
    default: return NULL;
  }
}

typedef struct perf_int_flag {
  char flag;
  const char* what;
  long lo, hi;
  size_t offset;
} perf_int_flag_t;

/* The plain integer flags, with the range each accepts. */
static const perf_int_flag_t perf_int_flags[] = {
    {'t', "threads per process", 1, 1024, offsetof(perf_args_t, nthreads)},
    {'g', "GPUs per thread", 1, 1024, offsetof(perf_args_t, ngpus)},
    {'n', "iterations", 1, INT_MAX, offsetof(perf_args_t, iters)},
    {'w', "warmup iterations", 0, INT_MAX, offsetof(perf_args_t, warmup_iters)},
    {'m', "aggregated iterations", 1, INT_MAX, offsetof(perf_args_t, agg_iters)},
    {'N', "run cycles (0 = forever)", 0, INT_MAX, offsetof(perf_args_t, run_cycles)},
    {'c', "check iterations", 0, INT_MAX, offsetof(perf_args_t, check)},
    {'z', "blocking mode (0 or nonzero)", 0, INT_MAX, offsetof(perf_args_t, blocking)},
    {'y', "stream_null (0 or 1)", 0, 1, offsetof(perf_args_t, stream_null)},
    {'T', "timeout in seconds", 0, INT_MAX, offsetof(perf_args_t, timeout_s)},
    {'G', "CUDA graph launches", 0, INT_MAX, offsetof(perf_args_t, graph_launches)},
    {'C', "report_cputime (0 or 1)", 0, 1, offsetof(perf_args_t, report_cputime)},
    {'a', "average mode (0 rank0, 1 avg, 2 min, 3 max)", 0, 3, offsetof(perf_args_t, average)},
};

static const perf_int_flag_t* perf_find_int_flag(int c) {
  for (size_t i = 0; i < sizeof(perf_int_flags) / sizeof(perf_int_flags[0]); i++)
    if (perf_int_flags[i].flag == c) return &perf_int_flags[i];
  return NULL;
}

/* One option with its argument; returns 0 or -1 with err filled. */
static int perf_apply_option(perf_args_t* a, int c, const char* v, char* err, size_t n) {
  const perf_int_flag_t* f = perf_find_int_flag(c);
  if (f) {
    if (perf_parse_int(v, f->lo, f->hi, (int*)((char*)a + f->offset)) != 0)
      return perf_fail(err, n, "-%c expects %s in [%ld, %ld], got '%s'", c, f->what, f->lo,
                       f->hi, v);
    return 0;
  }
  int iv = 0;
  switch (c) {
    case 'b':
    case 'e':
    case 'i': {
      size_t* dst = c == 'b' ? &a->min_bytes : c == 'e' ? &a->max_bytes : &a->step_bytes;
      if (perf_parse_size(v, dst) != 0)
        return perf_fail(err, n,
                         "invalid size '%s' for -%c: expected a whole number of bytes with an "
                         "optional K, M or G suffix (powers of 1024), e.g. 8, 64K, 32M, 1G",
                         v, c);
      return 0;
    }
    case 'f': /* 0 and 1 both step by -i, as in nccl-tests */
      if (perf_parse_int(v, 0, INT_MAX, &iv) != 0)
        return perf_fail(err, n, "-f expects a multiplication factor >= 0, got '%s'", v);
      a->step_factor = (size_t)iv;
      return 0;
    case PERF_OPT_PARALLEL_INIT: /* nccl-tests: any nonzero value */
      if (perf_parse_int(v, 0, INT_MAX, &iv) != 0)
        return perf_fail(err, n, "--parallel_init expects 0 or 1, got '%s'", v);
      a->parallel_init = iv != 0;
      return 0;
    case PERF_OPT_SPLIT_SHARE:
      if (perf_parse_int(v, 0, 1, &iv) != 0)
        return perf_fail(err, n, "--split_share expects 0 or 1, got '%s'", v);
      a->split_share = iv;
      return 0;
    case 'p':
      if (perf_parse_int(v, 0, 1024, &iv) != 0)
        return perf_fail(err, n, "-p expects a process count (>= 2 to self-launch), got '%s'", v);
      perf_apply_procs(a, iv);
      return 0;
    case 'd':
      a->type = perf_type_parse(v);
      if (a->type == -2)
        return perf_fail(err, n,
                         "unknown datatype '%s' for -d: use int8, uint8, int32, uint32, int64, "
                         "uint64, half, float, double, bfloat16, f8e4m3, f8e5m2 or all", v);
      return 0;
    case 'o':
      a->op = perf_op_parse(v);
      if (a->op == -2)
        return perf_fail(err, n,
                         "unknown reduction '%s' for -o: use sum, prod, max, min, avg, mulsum or "
                         "all", v);
      return 0;
    case 'r':
      if (perf_parse_root(v, &a->root) != 0)
        return perf_fail(err, n, "-r expects a root rank >= 0, or 'all' (or -1), got '%s'", v);
      return 0;
    case 'J':
      if (*v == '\0') return perf_fail(err, n, "-J expects a file name");
      a->json_path = v;
      return 0;
    case 'R':
      if (perf_parse_int(v, 0, 2, &a->local_register) != 0)
        return perf_fail(err, n, "-R expects 0 (no registration), 1 (ncclCommRegister) or 2 "
                         "(symmetric windows, ncclCommWindowRegister), got '%s'", v);
      return 0;
    case 'A':
      if (strcmp(v, "nccl") == 0) a->alloc_cuda = 0;
      else if (strcmp(v, "cuda") == 0) a->alloc_cuda = 1;
      else return perf_fail(err, n, "--alloc expects 'nccl' (ncclMemAlloc) or 'cuda' (cudaMalloc)");
      return 0;
    case 'h':
      a->help = 1;
      return 0;
    default:
      return perf_fail(err, n, "internal: option -%c has no handler", c);
  }
}

/*
 * nccl-tests' environment: NCCL_TESTS_MIN_BW (a GB/s floor for the average busbw) and
 * NCCL_TESTS_DEVICE (each process's first GPU). NCCL_TESTS_SPLIT_MASK / NCCL_TESTS_SPLIT would
 * split the world into several communicators, which these tools do not: refused, not ignored.
 * A value that is not a number is refused too (nccl-tests' atof would read it as 0).
 */
static int perf_args_env(perf_args_t* a, char* err, size_t n) {
  const char* v = getenv("NCCL_TESTS_MIN_BW");
  if (v && *v) {
    char* end = NULL;
    a->min_bw = strtod(v, &end);
    if (end == v || *end != '\0' || !(a->min_bw >= 0))
      return perf_fail(err, n, "NCCL_TESTS_MIN_BW=%s is not a bandwidth in GB/s", v);
  }
  v = getenv("NCCL_TESTS_DEVICE");
  if (v && *v && perf_parse_int(v, 0, 1 << 20, &a->device0) != 0)
    return perf_fail(err, n, "NCCL_TESTS_DEVICE=%s is not a GPU index", v);
  const char* split = getenv("NCCL_TESTS_SPLIT_MASK") ? "NCCL_TESTS_SPLIT_MASK"
                      : getenv("NCCL_TESTS_SPLIT")    ? "NCCL_TESTS_SPLIT"
                                                      : NULL;
  if (split)
    return perf_fail(err, n,
                     "%s is set: Braid's perf tools run one communicator over all "
                     "ranks and do not split it; unset it",
                     split);
  return 0;
}

/* Combinations that cannot mean anything, refused before any GPU work. */
static int perf_args_validate(const perf_args_t* a, char* err, size_t n) {
  if (a->min_bytes > a->max_bytes)
    return perf_fail(err, n, "invalid sizes for 'minbytes' and 'maxbytes': %zu > %zu",
                     a->min_bytes, a->max_bytes);
  if (a->step_factor <= 1 && a->step_bytes == 0 && a->min_bytes < a->max_bytes)
    return perf_fail(err, n, "-i 0 never reaches -e %zu: give -i > 0 or -f > 1", a->max_bytes);
  if (a->step_factor > 1 && a->min_bytes == 0 && a->max_bytes > 0)
    return perf_fail(err, n, "-b 0 with -f %zu never grows: start at -b 1 or more, or use -i",
                     a->step_factor);
  if (a->blocking && a->graph_launches)
    return perf_fail(err, n, "-z (blocking) waits inside the loop -G captures: use one of them");
  if (a->local_register == 2 && a->alloc_cuda)
    return perf_fail(err, n, "-R 2 registers windows, which need ncclMemAlloc buffers: drop "
                     "--alloc cuda");
  if (a->stream_null && a->graph_launches)
    return perf_fail(err, n, "-y 1 (legacy default stream) cannot be captured by -G: use one of them");
  return 0;
}

int perf_args_parse(perf_args_t* a, int argc, char** argv, char* err, size_t err_len) {
  static const char shortopts[] = ":t:g:b:e:i:f:n:m:w:N:p:c:o:d:r:z:y:T:G:C:a:J:hR:S:M:x:D:V:F:";
  perf_args_defaults(a);
  optind = 0; /* glibc: 0 restarts the scan, so parsing twice works (tests do) */
  opterr = 0;
  for (;;) {
    int c = getopt_long(argc, argv, shortopts, perf_long_options, NULL);
    if (c == -1) break;
    if (c == '?') {
      if (optopt) return perf_fail(err, err_len, "unknown option -%c (see -h)", optopt);
      return perf_fail(err, err_len, "unknown option '%s' (see -h)", argv[optind - 1]);
    }
    if (c == ':') return perf_fail(err, err_len, "option '%s' needs a value", argv[optind - 1]);
    const char* unsupported = perf_unsupported_option(c, optarg);
    if (unsupported)
      return perf_fail(err, err_len, "nccl-tests option %s is not supported by Braid's perf tools",
                       unsupported);
    if (strchr("SMxDV", c)) continue; /* one of those at 0: nothing to do */
    if (perf_apply_option(a, c, optarg, err, err_len) != 0) return -1;
  }
  if (optind < argc)
    return perf_fail(err, err_len, "unexpected argument '%s' (options only; see -h)", argv[optind]);
  if (perf_args_env(a, err, err_len) != 0) return -1;
  return perf_args_validate(a, err, err_len);
}

void perf_usage(const char* program, const char* collective) {
  printf(
      "USAGE: %s [options]   (benchmark of %s; flags and output as nccl-tests)\n"
      "  -t,--nthreads <n>        threads per process (1)\n"
      "  -g,--ngpus <n>           GPUs per thread (1)\n"
      "  -b,--minbytes <size>     smallest size (32M); K, M, G are powers of 1024\n"
      "  -e,--maxbytes <size>     largest size (32M)\n"
      "  -i,--stepbytes <size>    increment between sizes (1M), used when -f is 1\n"
      "  -f,--stepfactor <n>      multiply sizes by n (1 = use -i)\n"
      "  -n,--iters <n>           timed iterations (20)\n"
      "  -w,--warmup_iters <n>    warmup iterations at the largest and smallest size (1)\n"
      "  -m,--agg_iters <n>       operations per group in each iteration (1)\n"
      "  -N,--run_cycles <n>      repeat the whole size sweep n times, 0 = forever (1)\n"
      "  -c,--check <n>           checked iterations per size, 0 = no check (1)\n"
      "  -o,--op <op>             sum, prod, max, min, avg, mulsum or all (sum)\n"
      "  -d,--datatype <type>     int8 uint8 int32 uint32 int64 uint64 half float double\n"
      "                           bfloat16 f8e4m3 f8e5m2 or all (float)\n"
      "  -r,--root <rank>         root of rooted collectives, or all / -1 (0)\n"
      "  -z,--blocking <0|1>      1: wait and barrier after each op (0)\n"
      "  -y,--stream_null <0|1>   run on the legacy default stream (0)\n"
      "  -T,--timeout <s>         abort an op taking longer than s seconds, 0 = never (0)\n"
      "  -G,--cudagraph <n>       capture the timed loop in a CUDA graph, replay it n times (0)\n"
      "  -C,--report_cputime <0|1> report the time to enqueue instead of to complete (0)\n"
      "  -a,--average <0..3>      time across ranks: 0 rank 0, 1 mean, 2 min, 3 max (1)\n"
      "  -J,--output_file <file>  also write every row as one JSON object per line\n"
      "  -p,--procs <n>           n >= 2: fork n processes on this host, one GPU set each,\n"
      "                           meeting through the library's own bootstrap (no MPI needed);\n"
      "                           -p 0 / -p 1 keep nccl-tests' parallel_init meaning\n"
      "     --parallel_init <0|1> threads create their communicators concurrently (0)\n"
      "     --alloc <nccl|cuda>   buffers from ncclMemAlloc (as nccl-tests) or cudaMalloc (nccl)\n"
      "     --split_share <0|1>   run on a child of the world (ncclCommSplit, one colour, the\n"
      "                           same ranks) made with splitShare 0 or 1 (not in nccl-tests)\n"
      "  -R,--local_register <n>  1: ncclCommRegister the buffers; 2: symmetric windows\n"
      "                           (ncclCommWindowRegister, NCCL_WIN_COLL_SYMMETRIC) (0)\n"
      "  -S -M -x -D -V           nccl-tests options Braid does not implement: only 0 accepted\n"
      "  -h,--help                this text\n"
      "Environment, as nccl-tests: NCCL_TESTS_MIN_BW=<GB/s> fails the run (exit 1) when the\n"
      "average busbw is below 0.9x that; NCCL_TESTS_DEVICE=<i> makes GPU i each process's first.\n"
      "Launch modes: under mpirun (one process per GPU set; built with MPI), one process\n"
      "driving -t x -g GPUs, or -p N self-launched processes. Ranks = processes x threads x GPUs.\n"
      "Exit status: 0 ok, 1 wrong results, 2 bad usage, 3 a CUDA/NCCL/system failure or timeout.\n"
      "Example: %s -b 8 -e 2G -f 4 -g 2\n",
      program, collective, program);
}
