/*
 * Host-only tests of the perf tools (perf/): the command line, the size
 * sequence, each collective's layout and bus-bandwidth factor, the values the
 * check kernels put in buffers and what they accept back, the table format,
 * and the fork launcher of -p N. Links perf's pure files plus stand-ins for
 * the NCCL calls (perf_nccl_stubs.c); needs no GPU and no libnccl.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "test.h"
#include "verify.h"
#include "world.h"

static const perf_coll_ops_t* const all_colls[] = {
    &perf_coll_all_reduce, &perf_coll_all_gather, &perf_coll_reduce_scatter,
    &perf_coll_broadcast,  &perf_coll_reduce,     &perf_coll_sendrecv,
    &perf_coll_alltoall,   &perf_coll_gather,     &perf_coll_scatter};
#define NCOLLS ((int)(sizeof(all_colls) / sizeof(all_colls[0])))

/* Parses "flags..." as argv[1..]; returns perf_args_parse's result. */
static int parse(perf_args_t* a, const char* line, char* err, size_t err_len) {
  static char buf[1024];
  char* argv[64];
  int argc = 0;
  snprintf(buf, sizeof(buf), "%s", line);
  argv[argc++] = "x_perf";
  for (char* tok = strtok(buf, " "); tok && argc < 63; tok = strtok(NULL, " ")) argv[argc++] = tok;
  argv[argc] = NULL;
  err[0] = '\0';
  return perf_args_parse(a, argc, argv, err, err_len);
}

#define SAME(a, b) ((int)(a) == (int)(b))

static void test_codes(void) {
  TEST_CHECK(SAME(PERF_T_INT8, ncclInt8) && SAME(PERF_T_UINT64, ncclUint64) &&
                 SAME(PERF_T_HALF, ncclFloat16) && SAME(PERF_T_FLOAT, ncclFloat32) &&
                 SAME(PERF_T_DOUBLE, ncclFloat64) && SAME(PERF_T_BF16, ncclBfloat16) &&
                 SAME(PERF_T_E4M3, ncclFloat8e4m3) && SAME(PERF_T_E5M2, ncclFloat8e5m2) &&
                 SAME(PERF_T_COUNT, ncclNumTypes),
             "verify.h type codes are NCCL's");
  TEST_CHECK(SAME(PERF_O_SUM, ncclSum) && SAME(PERF_O_PROD, ncclProd) && SAME(PERF_O_MAX, ncclMax) &&
                 SAME(PERF_O_MIN, ncclMin) && SAME(PERF_O_AVG, ncclAvg) &&
                 SAME(PERF_O_MULSUM, PERF_OP_MULSUM),
             "verify.h op codes are NCCL's");
  for (int c = 0; c < NCOLLS; c++) {
    const perf_coll_ops_t* o = all_colls[c];
    TEST_CHECK(o->size == sizeof(perf_coll_ops_t) && o->name && o->counts && o->bandwidth &&
                   o->input_count && o->expected && o->run,
               "ops table %d has every slot filled", c);
  }
}

static void test_parse_size(void) {
  static const struct { const char* text; size_t bytes; } ok[] = {
      {"8", 8},          {"0", 0},           {"1K", 1024},           {"1k", 1024},
      {"32M", 32u << 20}, {"32m", 32u << 20}, {"1G", 1u << 30},      {"2g", 2ull << 30},
      {"1.5K", 1536},    {"64KB", 65536},    {"64KiB", 65536},       {"16 M", 16u << 20},
      {"8G", 8ull << 30}, {" 4", 4},          {"0.5M", 512 * 1024}};
  for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
    size_t got = 12345;
    TEST_CHECK(perf_parse_size(ok[i].text, &got) == 0 && got == ok[i].bytes, "size '%s' -> %zu (got %zu)",
               ok[i].text, ok[i].bytes, got);
  }
  static const char* const bad[] = {"", "-1", "abc", "1X", "3x", "1.5", "M", "1KK", "nan", "inf",
                                    "1e30", "32Mx", "+4", "1 2"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    size_t got = 0;
    TEST_CHECK(perf_parse_size(bad[i], &got) != 0, "size '%s' rejected", bad[i]);
  }
}

static void test_defaults(void) {
  perf_args_t a;
  char err[512];
  TEST_CHECK(parse(&a, "", err, sizeof(err)) == 0, "no flags parse: %s", err);
  TEST_CHECK(a.nthreads == 1 && a.ngpus == 1, "default -t 1 -g 1");
  TEST_CHECK(a.min_bytes == 32u << 20 && a.max_bytes == 32u << 20, "default -b 32M -e 32M");
  TEST_CHECK(a.step_bytes == 1u << 20 && a.step_factor == 1, "default -i 1M -f 1");
  TEST_CHECK(a.iters == 20 && a.warmup_iters == 1 && a.agg_iters == 1 && a.run_cycles == 1,
             "default -n 20 -w 1 -m 1 -N 1");
  TEST_CHECK(a.check == 1 && a.type == ncclFloat32 && a.op == ncclSum && a.root == 0,
             "default -c 1 -d float -o sum -r 0");
  TEST_CHECK(a.blocking == 0 && a.stream_null == 0 && a.timeout_s == 0 && a.graph_launches == 0 &&
                 a.report_cputime == 0 && a.average == 1,
             "default -z 0 -y 0 -T 0 -G 0 -C 0 -a 1");
  TEST_CHECK(a.procs == 0 && a.parallel_init == 0 && a.alloc_cuda == 0 && a.json_path == NULL &&
                 a.help == 0,
             "default no -p, ncclMemAlloc, no -J");
}

static void test_every_flag(void) {
  perf_args_t a;
  char err[512];
  int rc = parse(&a,
                 "-t 2 -g 4 -b 8 -e 1G -i 64K -f 4 -n 50 -m 3 -w 7 -N 2 -c 3 -o prod -d bfloat16 "
                 "-r 1 -T 30 -C 1 -a 2 -J out.json --alloc cuda",
                 err, sizeof(err));
  TEST_CHECK(rc == 0, "all flags parse: %s", err);
  TEST_CHECK(a.nthreads == 2 && a.ngpus == 4 && a.min_bytes == 8 && a.max_bytes == (1u << 30) &&
                 a.step_bytes == 65536 && a.step_factor == 4,
             "-t -g -b -e -i -f");
  TEST_CHECK(a.iters == 50 && a.agg_iters == 3 && a.warmup_iters == 7 && a.run_cycles == 2 &&
                 a.check == 3,
             "-n -m -w -N -c");
  TEST_CHECK(a.op == ncclProd && a.type == ncclBfloat16 && a.root == 1, "-o -d -r");
  TEST_CHECK(a.timeout_s == 30 && a.report_cputime == 1 && a.average == 2, "-T -C -a");
  TEST_CHECK(a.json_path && strcmp(a.json_path, "out.json") == 0 && a.alloc_cuda == 1, "-J --alloc");

  TEST_CHECK(parse(&a, "-R 1", err, sizeof(err)) == 0 && a.local_register == 1, "-R 1");
  TEST_CHECK(parse(&a, "--local_register 2", err, sizeof(err)) == 0 && a.local_register == 2,
             "--local_register 2");
  TEST_CHECK(parse(&a, "-z 1", err, sizeof(err)) == 0 && a.blocking == 1, "-z 1");
  TEST_CHECK(parse(&a, "-z 2", err, sizeof(err)) == 0 && a.blocking, "-z 2 blocks, as -z 1");
  TEST_CHECK(parse(&a, "-R 0 -S 0 -M 0 -x 0 -D 0 -V 0", err, sizeof(err)) == 0,
             "nccl-tests' options at 0 (their default) are accepted: %s", err);
  TEST_CHECK(
      parse(&a, "--parallel_init 2", err, sizeof(err)) == 0 && a.parallel_init && a.procs == 0,
      "--parallel_init 2 is parallel init (never a process count)");
  TEST_CHECK(parse(&a, "-n 1", err, sizeof(err)) == 0 && a.split_share == -1,
             "no --split_share: the world communicator itself");
  TEST_CHECK(parse(&a, "--split_share 1", err, sizeof(err)) == 0 && a.split_share == 1,
             "--split_share 1: %s", err);
  TEST_CHECK(parse(&a, "--split_share 0", err, sizeof(err)) == 0 && a.split_share == 0,
             "--split_share 0: %s", err);
  TEST_CHECK(parse(&a, "--split_share 2", err, sizeof(err)) != 0 && strstr(err, "--split_share"),
             "--split_share 2 is refused: %s", err);
  TEST_CHECK(parse(&a, "-f 0 -b 1M -e 3M -i 1M", err, sizeof(err)) == 0 && a.step_factor == 0,
             "-f 0 steps by -i");
  setenv("NCCL_TESTS_MIN_BW", "123.5", 1);
  setenv("NCCL_TESTS_DEVICE", "3", 1);
  TEST_CHECK(parse(&a, "-n 1", err, sizeof(err)) == 0 && a.min_bw == 123.5 && a.device0 == 3,
             "NCCL_TESTS_MIN_BW / NCCL_TESTS_DEVICE: %s", err);
  setenv("NCCL_TESTS_MIN_BW", "fast", 1);
  TEST_CHECK(parse(&a, "-n 1", err, sizeof(err)) != 0 && strstr(err, "NCCL_TESTS_MIN_BW=fast"),
             "a MIN_BW that is not a number is refused: %s", err);
  unsetenv("NCCL_TESTS_MIN_BW");
  unsetenv("NCCL_TESTS_DEVICE");
  setenv("NCCL_TESTS_SPLIT_MASK", "0x1", 1);
  TEST_CHECK(parse(&a, "-n 1", err, sizeof(err)) != 0 && strstr(err, "NCCL_TESTS_SPLIT_MASK"),
             "a split mask is refused, not ignored: %s", err);
  unsetenv("NCCL_TESTS_SPLIT_MASK");
  TEST_CHECK(parse(&a, "-n 1", err, sizeof(err)) == 0 && a.min_bw < 0 && a.device0 == -1,
             "no nccl-tests variables: defaults");
  TEST_CHECK(parse(&a, "-y 1", err, sizeof(err)) == 0 && a.stream_null == 1, "-y 1");
  TEST_CHECK(parse(&a, "-G 10", err, sizeof(err)) == 0 && a.graph_launches == 10, "-G 10");
  TEST_CHECK(parse(&a, "-p 4", err, sizeof(err)) == 0 && a.procs == 4 && !a.parallel_init, "-p 4 forks");
  TEST_CHECK(parse(&a, "-p 1", err, sizeof(err)) == 0 && a.procs == 0 && a.parallel_init,
             "-p 1 keeps nccl-tests' parallel_init");
  TEST_CHECK(parse(&a, "-p 0", err, sizeof(err)) == 0 && a.procs == 0 && !a.parallel_init, "-p 0");
  TEST_CHECK(parse(&a, "-r all", err, sizeof(err)) == 0 && a.root == PERF_ALL, "-r all");
  TEST_CHECK(parse(&a, "-r -1", err, sizeof(err)) == 0 && a.root == PERF_ALL, "-r -1 is all");
  TEST_CHECK(parse(&a, "-d all -o all", err, sizeof(err)) == 0 && a.type == PERF_ALL && a.op == PERF_ALL,
             "-d all -o all");
  TEST_CHECK(parse(&a, "-o mulsum", err, sizeof(err)) == 0 && a.op == PERF_OP_MULSUM, "-o mulsum");
  TEST_CHECK(parse(&a, "-d f8e5m2", err, sizeof(err)) == 0 && a.type == ncclFloat8e5m2, "-d f8e5m2");
  TEST_CHECK(parse(&a, "-d fp16", err, sizeof(err)) == 0 && a.type == ncclFloat16, "-d fp16 alias");
  TEST_CHECK(parse(&a, "-n 0x10", err, sizeof(err)) == 0 && a.iters == 16, "base 0 integers");
  TEST_CHECK(parse(&a, "--nthreads 3 --ngpus 2 --minbytes 1K --maxbytes 4K --stepbytes 1K --iters 5 "
                       "--warmup_iters 0 --agg_iters 2 --check 0 --op max --datatype int8 --root 0 "
                       "--blocking 1 --average 3 --cudagraph 0 --output_file x.json --procs 2",
                   err, sizeof(err)) == 0,
             "long options parse: %s", err);
  TEST_CHECK(a.nthreads == 3 && a.ngpus == 2 && a.min_bytes == 1024 && a.max_bytes == 4096 &&
                 a.iters == 5 && a.warmup_iters == 0 && a.agg_iters == 2 && a.check == 0 &&
                 a.op == ncclMax && a.type == ncclInt8 && a.blocking == 1 && a.average == 3 &&
                 a.procs == 2,
             "long options land");
  TEST_CHECK(parse(&a, "-h", err, sizeof(err)) == 0 && a.help == 1, "-h");
}

static void test_bad_flags(void) {
  static const struct { const char* line; const char* says;
  } bad[] = {{"-t 0", "-t"},
             {"-g x", "-g"},
             {"-n 0", "-n"},
             {"-a 4", "-a"},
             {"-z -1", "-z"},
             {"-c -1", "-c"},
             {"-f -1", "-f"},
             {"-w -1", "-w"},
             {"-m 0", "-m"},
             {"-y 2", "-y"},
             {"-C 2", "-C"},
             {"-G -1", "-G"},
             {"-b 1G -e 1M", "minbytes"},
             {"-b 1M -e 2M -i 0", "-i 0"},
             {"-b 0 -e 1M -f 2", "-b 0"},
             {"-d foo", "datatype"},
             {"-o foo", "reduction"},
             {"-r x", "-r"},
             {"-r -2", "-r"},
             {"-q", "unknown option"},
             {"--bogus", "unknown option"},
             {"-b", "needs a value"},
             {"extra", "unexpected argument"},
             {"-R 3", "-R expects"},
             {"-R 2 --alloc cuda", "ncclMemAlloc"},
             {"-S 1", "not supported"},
             {"-z 1 -G 2", "-G"},
             {"-y 1 -G 2", "-G"},
             {"--alloc foo", "--alloc"},
             {"-F 0", "not supported"},
             {"-b 12Q", "invalid size"},
             {"-p 1025", "-p"},
             {"-t 99999999999", "-t"}};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    perf_args_t a;
    char err[512];
    int rc = parse(&a, bad[i].line, err, sizeof(err));
    TEST_CHECK(rc != 0 && strstr(err, bad[i].says), "'%s' rejected mentioning '%s' (got: %s)",
               bad[i].line, bad[i].says, err);
  }
}

/* The sizes a sweep visits, as a string like "8 16 32". */
static void sweep(const char* flags, char* out, size_t len) {
  perf_args_t a;
  char err[512];
  out[0] = '\0';
  if (parse(&a, flags, err, sizeof(err)) != 0) {
    snprintf(out, len, "error: %s", err);
    return;
  }
  size_t n = 0, s = a.min_bytes;
  for (int more = 1, k = 0; more && k < 100; more = perf_size_next(&a, s, &s), k++)
    n += (size_t)snprintf(out + n, len - n, n ? " %zu" : "%zu", s);
}

static void test_size_sequence(void) {
  char got[2048];
  static const struct { const char* flags; const char* sizes; } cases[] = {
      {"-b 8 -e 128 -f 2", "8 16 32 64 128"},
      {"-b 8 -e 100 -f 4", "8 32"},
      {"-b 1K -e 4K -i 1K", "1024 2048 3072 4096"},
      {"-b 1K -e 4K -i 1K -f 1", "1024 2048 3072 4096"},
      {"-b 1K -e 4K -i 1000 -f 2", "1024 2048 4096"}, /* -f wins over -i */
      {"", "33554432"},
      {"-b 0 -e 0", "0"},
      {"-b 0 -e 3 -i 1", "0 1 2 3"},
      {"-b 8 -e 8G -f 1024", "8 8192 8388608 8589934592"}};
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    sweep(cases[i].flags, got, sizeof(got));
    TEST_CHECK(strcmp(got, cases[i].sizes) == 0, "'%s' visits %s (got %s)", cases[i].flags,
               cases[i].sizes, got);
  }
  perf_args_t a;
  perf_args_defaults(&a);
  a.max_bytes = SIZE_MAX;
  a.step_factor = 2;
  size_t next = 0;
  TEST_CHECK(perf_size_next(&a, SIZE_MAX / 2 + 1, &next) == 0, "no overflow past SIZE_MAX");
}

static int near(double a, double b) { return fabs(a - b) <= 1e-9 * (fabs(b) + 1); }

static void test_bus_bandwidth(void) {
  /* 1000 floats in 1 us: 4 GB/s of payload per rank-share. */
  static const int ranks[] = {1, 2, 3, 4, 8, 16};
  for (size_t i = 0; i < sizeof(ranks) / sizeof(ranks[0]); i++) {
    int n = ranks[i];
    for (int c = 0; c < NCOLLS; c++) {
      const perf_coll_ops_t* o = all_colls[c];
      double algbw = -1, busbw = -1, want_alg = 4.0, want_bus = 4.0;
      o->bandwidth(1000, 4, 1e-6, n, &algbw, &busbw);
      if (o == &perf_coll_all_reduce) {
        want_bus = 4.0 * 2.0 * (n - 1) / n;
      } else if (o == &perf_coll_all_gather || o == &perf_coll_reduce_scatter ||
                 o == &perf_coll_alltoall || o == &perf_coll_gather || o == &perf_coll_scatter) {
        want_alg = 4.0 * n; /* count is one rank's share; the buffer is n shares */
        want_bus = want_alg * (n - 1) / n;
      }
      TEST_CHECK(near(algbw, want_alg) && near(busbw, want_bus),
                 "%s n=%d: algbw %g busbw %g, want %g %g", o->name, n, algbw, busbw, want_alg, want_bus);
      o->bandwidth(1000, 4, 0.0, n, &algbw, &busbw);
      TEST_CHECK(algbw == 0 && busbw == 0, "%s: no time gives 0, not inf", o->name);
    }
  }
}

static void check_counts(const perf_coll_ops_t* o, size_t count, size_t ts, int n, size_t send,
                         size_t recv, size_t param, size_t send_ip, size_t recv_ip) {
  perf_counts_t c;
  memset(&c, 0xA5, sizeof(c));
  o->counts(count, ts, n, &c);
  TEST_CHECK(c.send_count == send && c.recv_count == recv && c.param_count == param &&
                 c.send_inplace_offset == send_ip && c.recv_inplace_offset == recv_ip,
             "%s(%zu x %zuB, %d ranks): got %zu %zu %zu %zu %zu", o->name, count, ts, n, c.send_count,
             c.recv_count, c.param_count, c.send_inplace_offset, c.recv_inplace_offset);
}

static void test_layouts(void) {
  /* 1000 floats on 4 ranks: share 250, rounded down to 16 bytes: 248. */
  check_counts(&perf_coll_all_reduce, 1000, 4, 4, 1000, 1000, 1000, 0, 0);
  check_counts(&perf_coll_broadcast, 1000, 4, 4, 1000, 1000, 1000, 0, 0);
  check_counts(&perf_coll_reduce, 1000, 4, 4, 1000, 1000, 1000, 0, 0);
  check_counts(&perf_coll_sendrecv, 1000, 4, 4, 1000, 1000, 1000, 0, 0);
  check_counts(&perf_coll_all_gather, 1000, 4, 4, 248, 992, 248, 248, 0);
  check_counts(&perf_coll_reduce_scatter, 1000, 4, 4, 992, 248, 248, 0, 248);
  check_counts(&perf_coll_alltoall, 1000, 4, 4, 992, 992, 248, 0, 0);
  check_counts(&perf_coll_gather, 1000, 4, 4, 248, 992, 248, 248, 0);
  check_counts(&perf_coll_scatter, 1000, 4, 4, 992, 248, 248, 0, 248);
  check_counts(&perf_coll_all_gather, 100, 1, 2, 48, 96, 48, 48, 0);  /* int8: 16 elements */
  check_counts(&perf_coll_all_gather, 10, 8, 2, 4, 8, 4, 4, 0);       /* double: 2 elements */
  check_counts(&perf_coll_all_gather, 2, 4, 2, 0, 0, 0, 0, 0);        /* 8 bytes: nothing */

  perf_counts_t c;
  perf_segment_t seg[8];
  perf_coll_alltoall.counts(48, 4, 3, &c); /* share 16 */
  int n = perf_coll_alltoall.expected(&c, 3, 1, -1, seg);
  TEST_CHECK(n == 3 && seg[2].dst_offset == 32 && seg[2].count == 16 && seg[2].src_rank == 2 &&
                 seg[2].src_offset == 16,
             "alltoall rank 1 gets block 1 of every rank");
  perf_coll_scatter.counts(48, 4, 3, &c);
  n = perf_coll_scatter.expected(&c, 3, 2, 1, seg);
  TEST_CHECK(n == 1 && seg[0].src_rank == 1 && seg[0].src_offset == 32 && seg[0].count == 16,
             "scatter rank 2 gets share 2 of root 1");
  TEST_CHECK(perf_coll_scatter.input_count(&c, 2, 1) == 0 && perf_coll_scatter.input_count(&c, 1, 1) == 48,
             "scatter: only the root has input");
  perf_coll_gather.counts(48, 4, 3, &c);
  TEST_CHECK(perf_coll_gather.expected(&c, 3, 0, 1, seg) == 0, "gather: non-root unchecked");
  n = perf_coll_gather.expected(&c, 3, 1, 1, seg);
  TEST_CHECK(n == 3 && seg[1].dst_offset == 16 && seg[1].src_rank == 1 && seg[1].src_offset == 0,
             "gather root holds every share");
  perf_coll_reduce_scatter.counts(48, 4, 3, &c);
  n = perf_coll_reduce_scatter.expected(&c, 3, 2, -1, seg);
  TEST_CHECK(n == 1 && seg[0].src_rank == PERF_SEG_REDUCE && seg[0].src_offset == 32 && seg[0].count == 16,
             "reduce_scatter rank 2: reduction of share 2");
  perf_coll_reduce.counts(10, 4, 3, &c);
  TEST_CHECK(perf_coll_reduce.expected(&c, 3, 0, 2, seg) == 0, "reduce: non-root unchecked");
  perf_coll_sendrecv.counts(10, 4, 4, &c);
  n = perf_coll_sendrecv.expected(&c, 4, 0, -1, seg);
  TEST_CHECK(n == 1 && seg[0].src_rank == 3, "sendrecv rank 0 receives from rank 3");
  perf_coll_broadcast.counts(10, 4, 4, &c);
  TEST_CHECK(perf_coll_broadcast.input_count(&c, 0, 3) == 0 &&
                 perf_coll_broadcast.input_count(&c, 3, 3) == 10,
             "broadcast: only the root has input");
  TEST_CHECK(perf_coll_sendrecv.in_place_checked == 0 && perf_coll_alltoall.in_place_checked == 0 &&
                 perf_coll_all_reduce.in_place_checked == 1,
             "in place N/A where nccl-tests says so");
  TEST_CHECK(perf_coll_all_reduce.uses_op && !perf_coll_all_reduce.uses_root &&
                 perf_coll_reduce.uses_op && perf_coll_reduce.uses_root &&
                 !perf_coll_broadcast.uses_op && perf_coll_broadcast.uses_root &&
                 perf_coll_sendrecv.uses_op && !perf_coll_alltoall.uses_op,
             "op and root columns as nccl-tests");
  /* Every layout fits in the max-size buffer, in place included. */
  for (int k = 0; k < NCOLLS; k++)
    for (int nr = 1; nr <= 8; nr++) {
      all_colls[k]->counts(1000, 4, nr, &c);
      size_t total = c.send_count > c.recv_count ? c.send_count : c.recv_count;
      size_t last = (size_t)(nr - 1);
      TEST_CHECK(total <= 1000 && last * c.send_inplace_offset + c.send_count <= total &&
                     last * c.recv_inplace_offset + c.recv_count <= total,
                 "%s on %d ranks fits its buffer", all_colls[k]->name, nr);
    }
}

static double round_to(int type, double v) {
  return perf_float_from_bits(type, perf_float_to_bits(type, v));
}

static void test_minifloat(void) {
  static const int types[] = {PERF_T_HALF, PERF_T_BF16, PERF_T_E4M3, PERF_T_E5M2};
  for (size_t i = 0; i < 4; i++) {
    int t = types[i];
    uint32_t patterns = 1u << (8 * perf_type_size(t));
    int mismatches = 0;
    for (uint32_t bits = 0; bits < patterns; bits++) {
      double v = perf_float_from_bits(t, bits);
      uint64_t back = perf_float_to_bits(t, v);
      if (v != v) {
        if (perf_float_from_bits(t, back) == perf_float_from_bits(t, back)) mismatches++;
      } else if (back != bits) {
        mismatches++;
      }
    }
    TEST_CHECK(mismatches == 0, "type %d: every bit pattern decodes and encodes back (%d off)", t,
               mismatches);
  }
  TEST_CHECK(perf_float_to_bits(PERF_T_HALF, 1.0) == 0x3C00 &&
                 perf_float_to_bits(PERF_T_HALF, 65504.0) == 0x7BFF &&
                 perf_float_to_bits(PERF_T_HALF, -2.0) == 0xC000 &&
                 perf_float_to_bits(PERF_T_HALF, ldexp(1.0, -24)) == 0x0001,
             "half encodings");
  TEST_CHECK(perf_float_to_bits(PERF_T_HALF, 1.0 + ldexp(1.0, -11)) == 0x3C00 &&
                 perf_float_to_bits(PERF_T_HALF, 1.0 + 3 * ldexp(1.0, -11)) == 0x3C02 &&
                 perf_float_to_bits(PERF_T_HALF, 70000.0) == 0x7C00,
             "half rounds to nearest even, overflows to inf");
  TEST_CHECK(perf_float_to_bits(PERF_T_BF16, 1.0) == 0x3F80 &&
                 perf_float_to_bits(PERF_T_BF16, -0.5) == 0xBF00,
             "bfloat16 encodings");
  TEST_CHECK(perf_float_to_bits(PERF_T_E4M3, 448.0) == 0x7E &&
                 perf_float_to_bits(PERF_T_E4M3, 1.0) == 0x38 &&
                 perf_float_to_bits(PERF_T_E4M3, ldexp(1.0, -9)) == 0x01,
             "e4m3 encodings");
  TEST_CHECK(perf_float_from_bits(PERF_T_E4M3, 0x7F) != perf_float_from_bits(PERF_T_E4M3, 0x7F),
             "e4m3 0x7F is NaN");
  TEST_CHECK(perf_float_to_bits(PERF_T_E5M2, 57344.0) == 0x7B &&
                 perf_float_to_bits(PERF_T_E5M2, 1.0) == 0x3C,
             "e5m2 encodings");
  TEST_CHECK(round_to(PERF_T_FLOAT, 1.0 + ldexp(1.0, -30)) == 1.0, "float rounds");
}

/* Inputs are exact in their type and inside the documented ranges. */
static void test_inputs(void) {
  for (int t = 0; t < PERF_T_COUNT; t++)
    for (int op = 0; op <= PERF_O_MULSUM; op++) {
      perf_value_desc_t d = {t, op, 8, 42};
      int inexact = 0, out_of_range = 0;
      for (int r = 0; r < 8; r++)
        for (size_t i = 0; i < 2000; i++) {
          if (perf_type_is_float(t)) {
            double v = perf_input_float(&d, r, i);
            if (round_to(t, v) != v) inexact++;
            if (op == PERF_O_PROD ? !(fabs(v) == 0.5 || fabs(v) == 1 || fabs(v) == 2) : fabs(v) > 1)
              out_of_range++;
          } else {
            int64_t v = perf_input_int(&d, r, i);
            int64_t range = (int64_t)perf_int_range(t, 8);
            if (v > range || v < (perf_type_is_signed(t) ? -range : 0)) out_of_range++;
          }
        }
      TEST_CHECK(inexact == 0 && out_of_range == 0, "type %d op %d: inputs exact (%d) and in range (%d)",
                 t, op, inexact, out_of_range);
    }
  perf_value_desc_t a = {PERF_T_FLOAT, PERF_O_SUM, 2, 1}, b = {PERF_T_FLOAT, PERF_O_SUM, 2, 2};
  TEST_CHECK(perf_input_float(&a, 0, 5) != perf_input_float(&b, 0, 5) ||
                 perf_input_float(&a, 0, 6) != perf_input_float(&b, 0, 6),
             "the seed changes the data");
  TEST_CHECK(perf_input_float(&a, 0, 5) != perf_input_float(&a, 1, 5) ||
                 perf_input_float(&a, 0, 6) != perf_input_float(&a, 1, 6),
             "the rank changes the data");
  TEST_CHECK(perf_int_range(PERF_T_INT8, 2) == 15 && perf_int_range(PERF_T_UINT8, 2) == 31 &&
                 perf_int_range(PERF_T_INT8, 8) == 3,
             "integer ranges are max / (4 nranks)");
}

/* Writes v (a type's bits) into a one-element buffer and asks the checker. */
static int wrong_bits(const perf_value_desc_t* d, int src, size_t idx, uint64_t bits) {
  unsigned char buf[8];
  perf_store_bits(d->type, buf, 0, bits);
  return perf_element_wrong(d, src, idx, buf, 0);
}

static void test_integer_expectations(void) {
  for (int t = PERF_T_INT8; t <= PERF_T_UINT64; t++)
    for (int n = 1; n <= 5; n++)
      for (size_t i = 0; i < 200; i++) {
        perf_value_desc_t d = {t, PERF_O_SUM, n, 7};
        int64_t sum = 0, mx = INT64_MIN, mn = INT64_MAX, premul = 0;
        uint64_t prod = 1;
        for (int r = 0; r < n; r++) {
          int64_t x = perf_input_int(&d, r, i);
          sum += x;
          premul += (1 + (r & 1)) * x;
          mx = x > mx ? x : mx;
          mn = x < mn ? x : mn;
        }
        uint64_t mask = perf_type_mask(t);
        TEST_CHECK(perf_reduce_int(&d, i) == ((uint64_t)sum & mask), "int sum t%d n%d", t, n);
        d.op = PERF_O_AVG;
        TEST_CHECK(perf_reduce_int(&d, i) == ((uint64_t)(sum / n) & mask), "int avg truncates t%d", t);
        d.op = PERF_O_MULSUM;
        TEST_CHECK(perf_reduce_int(&d, i) == ((uint64_t)premul & mask), "int mulsum t%d", t);
        d.op = PERF_O_PROD;
        for (int r = 0; r < n; r++) prod *= (uint64_t)perf_input_int(&d, r, i);
        TEST_CHECK(perf_reduce_int(&d, i) == (prod & mask), "int prod wraps t%d", t);
        d.op = PERF_O_MAX;
        TEST_CHECK(perf_reduce_int(&d, i) == ((uint64_t)mx & mask), "int max t%d", t);
        d.op = PERF_O_MIN;
        TEST_CHECK(perf_reduce_int(&d, i) == ((uint64_t)mn & mask), "int min t%d", t);
        TEST_CHECK(!wrong_bits(&d, PERF_SEG_REDUCE, i, (uint64_t)mn & mask) &&
                       wrong_bits(&d, PERF_SEG_REDUCE, i, ((uint64_t)mn + 1) & mask),
                   "integers compare exactly t%d", t);
      }
  perf_value_desc_t d = {PERF_T_INT32, PERF_O_AVG, 3, 1};
  int checked = 0;
  for (size_t i = 0; i < 1000 && !checked; i++) {
    int64_t s = perf_input_int(&d, 0, i) + perf_input_int(&d, 1, i) + perf_input_int(&d, 2, i);
    if (s < 0 && s % 3 != 0) { /* e.g. -7 / 3 must be -2, not -3 */
      TEST_CHECK((int32_t)perf_reduce_int(&d, i) == (int32_t)(s / 3) &&
                     (int32_t)perf_reduce_int(&d, i) > (int32_t)floor((double)s / 3),
                 "signed average truncates toward zero");
      checked = 1;
    }
  }
  TEST_CHECK(checked, "found a negative average to check");
}

/* A library's reduction in the element type: left to right, or right to left,
   rounding after every step, with avg as premultiply-by-1/n then sum. */
static double simulate(const perf_value_desc_t* d, size_t i, int reverse) {
  int t = d->type, n = d->nranks;
  double acc = 0;
  double inv = round_to(t, 1.0 / n);
  for (int k = 0; k < n; k++) {
    int r = reverse ? n - 1 - k : k;
    double x = perf_input_float(d, r, i);
    if (d->op == PERF_O_MULSUM) x = round_to(t, x * perf_premul_float(r));
    if (d->op == PERF_O_AVG) x = round_to(t, x * inv);
    if (d->op == PERF_O_PROD)
      acc = k == 0 ? x : round_to(t, acc * x);
    else if (d->op == PERF_O_MAX)
      acc = k == 0 || x > acc ? x : acc;
    else if (d->op == PERF_O_MIN)
      acc = k == 0 || x < acc ? x : acc;
    else
      acc = round_to(t, acc + x);
  }
  return acc;
}

static void test_float_expectations(void) {
  static const int types[] = {PERF_T_HALF, PERF_T_FLOAT, PERF_T_DOUBLE, PERF_T_BF16, PERF_T_E4M3,
                              PERF_T_E5M2};
  static const int ranks[] = {1, 2, 3, 4, 8, 16};
  for (size_t ti = 0; ti < 6; ti++)
    for (size_t ni = 0; ni < 6; ni++)
      for (int op = 0; op <= PERF_O_MULSUM; op++) {
        int t = types[ti];
        perf_value_desc_t d = {t, op, ranks[ni], 3};
        int rejected = 0;
        for (size_t i = 0; i < 500; i++)
          for (int reverse = 0; reverse < 2; reverse++)
            rejected += wrong_bits(&d, PERF_SEG_REDUCE, i, perf_float_to_bits(t, simulate(&d, i, reverse)));
        TEST_CHECK(rejected == 0, "type %d n=%d op %d: a correct reduction in the type passes (%d)", t,
                   ranks[ni], op, rejected);
      }
  /* A missing rank is caught where the type is precise enough to tell. */
  static const int precise[] = {PERF_T_HALF, PERF_T_FLOAT, PERF_T_DOUBLE, PERF_T_BF16};
  for (size_t ti = 0; ti < 4; ti++) {
    perf_value_desc_t d = {precise[ti], PERF_O_SUM, 4, 9}, three = d;
    three.nranks = 3; /* same inputs for ranks 0..2: rank 3's share dropped */
    int caught = 0;
    for (size_t i = 0; i < 1000; i++) {
      double tol;
      double partial = perf_reduce_float(&three, i, &tol);
      caught += wrong_bits(&d, PERF_SEG_REDUCE, i, perf_float_to_bits(d.type, partial));
    }
    TEST_CHECK(caught > 800, "type %d: a dropped rank is caught in %d of 1000", d.type, caught);
  }
  double tol;
  perf_value_desc_t d = {PERF_T_FLOAT, PERF_O_SUM, 4, 1};
  perf_reduce_float(&d, 0, &tol);
  TEST_CHECK(tol > 0 && tol <= 4 * ldexp(1.0, -23) * 4, "float sum tolerance is n eps sum|x|");
  TEST_CHECK(perf_tolerance(PERF_T_HALF, PERF_O_SUM, 2, 1.0) == 2 * ldexp(1.0, -10) &&
                 perf_tolerance(PERF_T_BF16, PERF_O_SUM, 8, 2.0) == 16 * ldexp(1.0, -7) &&
                 perf_tolerance(PERF_T_HALF, PERF_O_AVG, 4, 1.0) == 6 * ldexp(1.0, -10) / 4 &&
                 perf_tolerance(PERF_T_FLOAT, PERF_O_MAX, 8, 5.0) == 0 &&
                 perf_tolerance(PERF_T_FLOAT, PERF_O_PROD, 8, 5.0) == 0,
             "tolerance depends on type, op and nranks");
}

/* Poisoned (never written) outputs are always wrong; copies compare exactly. */
static void test_poison_and_copies(void) {
  for (int t = 0; t < PERF_T_COUNT; t++)
    for (int op = 0; op <= PERF_O_MULSUM; op++) {
      perf_value_desc_t d = {t, op, 4, 5};
      unsigned char poison[8];
      memset(poison, perf_poison_byte(t), sizeof(poison));
      int missed = 0, copies_ok = 0;
      for (size_t i = 0; i < 300; i++) {
        missed += !perf_element_wrong(&d, 2, i, poison, 0);
        if (op != PERF_O_PROD) missed += !perf_element_wrong(&d, PERF_SEG_REDUCE, i, poison, 0);
        copies_ok += !wrong_bits(&d, 2, i, perf_input_bits_of(&d, 2, i));
      }
      TEST_CHECK(missed == 0, "type %d op %d: poison is never accepted (%d)", t, op, missed);
      TEST_CHECK(copies_ok == 300, "type %d op %d: exact copies accepted", t, op);
      int other_rank = 0;
      for (size_t i = 0; i < 300; i++) other_rank += wrong_bits(&d, 2, i, perf_input_bits_of(&d, 1, i));
      /* Products draw from +-{1/2, 1, 2}, and 8-bit types from few values:
         two ranks agree by chance more often there. */
      int enough = perf_type_size(t) == 1 || op == PERF_O_PROD ? 150 : 280;
      TEST_CHECK(other_rank > enough,
                 "type %d op %d: another rank's data is caught (%d of 300)", t, op, other_rank);
    }
}

static void test_format(void) {
  static const struct { double v; int w; const char* s; } cases[] = {
      {7.4, 7, "   7.40"},   {0, 6, "  0.00"},       {123.456, 6, "123.46"},
      {1234.5, 6, "1234.5"}, {12345.0, 6, " 12345"},  {1234567.0, 6, " 1e+06"},
      {12345.6, 7, "12345.6"}, {123456.7, 7, " 123457"}, {99999999.0, 7, "1.0e+08"},
      {9999.99, 7, "9999.99"}};
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    char out[32];
    perf_format_number(cases[i].v, cases[i].w, out, sizeof(out));
    TEST_CHECK(strcmp(out, cases[i].s) == 0, "%g width %d -> '%s' (got '%s')", cases[i].v, cases[i].w,
               cases[i].s, out);
  }
  char line[128];
  perf_format_result(7.4, 0.001, 0.002, 0, line, sizeof(line));
  TEST_CHECK(strcmp(line, "     7.40    0.00    0.00       0") == 0, "result columns: '%s'", line);
  perf_format_result(140.2, 239.6, 359.4, -1, line, sizeof(line));
  TEST_CHECK(strcmp(line, "   140.20  239.60  359.40    N/A") == 0, "N/A columns: '%s'", line);
  perf_format_result(1.0, 1.0, 1.0, 12, line, sizeof(line));
  TEST_CHECK(strstr(line, "      12") != NULL, "#wrong printed: '%s'", line);
  char json[64];
  perf_json_string("a\"b\\c\nd", json, sizeof(json));
  TEST_CHECK(strcmp(json, "\"a\\\"b\\\\c\\u000ad\"") == 0, "JSON escaping: %s", json);
}

/* ---- the fork launcher ----------------------------------------------------- */

#define FORK_BIG 40000 /* more than one 16 KiB slot: allgather must loop */

static int fork_child_checks(perf_world_t* w) {
  int mine = 100 + w->proc, all[8] = {0};
  if (w->ops->allgather(w, &mine, all, sizeof(int))) return 10;
  for (int p = 0; p < w->nprocs; p++)
    if (all[p] != 100 + p) return 11;
  unsigned char* big = malloc(FORK_BIG);
  unsigned char* every = malloc((size_t)FORK_BIG * w->nprocs);
  if (!big || !every) return 12;
  for (int i = 0; i < FORK_BIG; i++) big[i] = (unsigned char)(i * 7 + w->proc);
  if (w->ops->allgather(w, big, every, FORK_BIG)) return 13;
  for (int p = 0; p < w->nprocs; p++)
    for (int i = 0; i < FORK_BIG; i++)
      if (every[(size_t)p * FORK_BIG + i] != (unsigned char)(i * 7 + p)) return 14;
  free(big);
  free(every);
  int local = -1;
  if (perf_world_local_index(w, &local) || local != w->proc) return 15;
  if (w->ops->barrier(w)) return 16;
  return strcmp(w->ops->name, "fork") == 0 ? 0 : 17;
}

static void test_fork_world(void) {
  perf_world_t w;
  int code = -1;
  fflush(stdout);
  fflush(stderr);
  int rc = perf_world_fork(&w, 3, &code);
  if (rc == 0) _exit(fork_child_checks(&w));
  TEST_CHECK(rc == 1 && code == 0, "3 processes exchange and meet (rc %d, exit %d)", rc, code);

  /* Process 1 fails while the others wait in a barrier: the launcher must
     stop them and report the failure, not hang. */
  time_t start = time(NULL);
  rc = perf_world_fork(&w, 3, &code);
  if (rc == 0) {
    if (w.proc == 1) _exit(PERF_EXIT_FAILED);
    w.ops->barrier(&w);
    _exit(0);
  }
  TEST_CHECK(rc == 1 && code == PERF_EXIT_FAILED, "a failed process fails the run (exit %d)", code);
  TEST_CHECK(time(NULL) - start < 30, "the waiting processes were stopped");

  /* Wrong results (exit 1) are reported but do not stop the others. */
  rc = perf_world_fork(&w, 2, &code);
  if (rc == 0) _exit(w.proc == 0 ? PERF_EXIT_WRONG : 0);
  TEST_CHECK(rc == 1 && code == PERF_EXIT_WRONG, "wrong results give exit 1 (got %d)", code);

  perf_world_single(&w);
  int v = 5, out = 0;
  TEST_CHECK(w.nprocs == 1 && w.ops->allgather(&w, &v, &out, sizeof(v)) == 0 && out == 5 &&
                 w.ops->barrier(&w) == 0,
             "single world");
}

int main(void) {
  test_codes();
  test_parse_size();
  test_defaults();
  test_every_flag();
  test_bad_flags();
  test_size_sequence();
  test_bus_bandwidth();
  test_layouts();
  test_minifloat();
  test_inputs();
  test_integer_expectations();
  test_float_expectations();
  test_poison_and_copies();
  test_format();
  test_fork_world();
  return test_summary();
}
