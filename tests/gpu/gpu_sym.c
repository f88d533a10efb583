/*
 * The symmetric all-reduce and reduce-scatter (--suite sym): all-reduces and reduce-scatters
 * whose input lies in a window registered with ncclCommWindowRegister(...,
 * NCCL_WIN_COLL_SYMMETRIC) on buffers from ncclMemAlloc. A reduce-scatter's input is nranks
 * parts of recvcount elements; rank r's output is part r reduced over the ranks.
 *
 * Set-up: every rank allocates a send and a receive buffer with ncclMemAlloc and registers
 * each as a symmetric window (one thread per local rank: the registration is collective and
 * is not made inside a group), plus a plain cudaMalloc receive buffer. Every case then uses
 * them at one byte offset of its input inside the window, the same on every rank (0, 4 (8 for
 * the 8-byte types) and 16 + 2 * sizeof(T)), in three layouts: in place (the output is the input,
 * in the send window; a reduce-scatter's is its own part of it, sendbuff + rank * recvcount
 * elements), out of place into the receive window, and out of place into the plain buffer
 * (odd ranks' output one element further: alignments that differ from rank to rank).
 *
 * A case issues SYM_REPS all-reduces back to back on every rank, with no synchronization in
 * between: each one poisons its output (and, in place, the window around the input), copies
 * fresh random input from a device staging area, reduces, and copies its output away, all
 * on the rank's stream. A rank whose kernel left before the others had read its window, or
 * that began reading a peer's next input too early, sees another operation's data. After one
 * synchronization every output is compared with the host reference (gpu_ref.c), the poisoned
 * bytes around the output must be untouched, an out-of-place input unchanged, and every rank's
 * all-reduce outputs must be bit-identical to every other rank's (an all-gather of their
 * hashes; a reduce-scatter's differ from rank to rank: each local rank's output is compared
 * with the reference, and in place on the symmetric path the other parts of its input must
 * be unchanged). Floating results are compared within the reference's tolerance (it reduces
 * in double, not in the type in rank order as the symmetric kernel does). Graph
 * cases capture SYM_GRAPH_REPS of those steps in one CUDA graph and replay it, with fresh
 * inputs between the replays and then several replays back to back.
 *
 * Operators: sum, prod, max, min, avg; PreMulSum with one scalar on every rank
 * (premul-same), and with a different scalar per rank (premul-host, premul-dev), which a
 * rank reducing the others' inputs itself cannot apply: it must take the ordinary path.
 *
 * The matrix: every type x operator x count 1, 2, 3, 7, 8, 1023, 4097 x offset x layout;
 * counts 65537 and 262149 for every type with sum and for float and bfloat16 with every
 * operator; float sum at BRAID_SYM_MAX_BYTES and one element past it (up to 64 MiB); graphs
 * of five types and four operators at 7, 4097 and 65537 elements. --quick: 4 types, 4
 * operators, counts 1, 7, 4097, 4 calls a case, fewer graphs.
 *
 * Then the reduce-scatters (fewer combinations: the all-reduces cover the type and operator
 * arithmetic): every type x operator x recvcount 1, 2, 3, 7, 8, 1023, 1024, 4097 x layout, at
 * every offset with sum and at one offset (turning) with the other operators; recvcounts
 * 262144 (whole packs) and 262149 (elements), several rounds where a part outgrows what the
 * blocks hold in one (BRAID_SYM_ROUND_BYTES each: 4- and 8-byte types on up to 16 blocks),
 * for every type with sum and float and bfloat16 with every operator, one offset a layout,
 * SYM_RS_LARGE_REPS calls;
 * float sum at BRAID_SYM_MAX_BYTES of input (recvcount * nranks * 4, as nccl-tests counts it)
 * and one receive element past it; graphs of three types and operators at recvcounts 7, 1024
 * and 65537. --quick: recvcounts 1, 8, 4097, fewer graphs.
 *
 * Which path ran: with GPU_SYM_CHECK_LOG=1 (tests/gpu/expect_sym.sh sets it with
 * BRAID_DEBUG=INFO, BRAID_DEBUG_SUBSYS=TUNING and a BRAID_DEBUG_FILE of one file per
 * process), every case reads what its process logged meanwhile: where BRAID_SYM_MAX_BYTES
 * (as this process reads it, 131072 unset) admits the input's size and the operator is not a
 * per-rank PreMulSum, each local rank must have logged "AllReduce <count> elements from a
 * symmetric window" ("ReduceScatter <recvcount> elements ..."); otherwise no such line may
 * appear. Outputs past one LL block (4 KB) may go either way unless BRAID_SYM_PULL=1.
 * premul-same may go either way (no rank can know that the others' scalars equal its own).
 * Without
 * GPU_SYM_CHECK_LOG the cases check results only (as against NVIDIA's NCCL).
 *
 * The last cases deregister the windows, and destroy a communicator of its own with its
 * windows still registered (freeing the memory after the destroy).
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gpu_test.h"

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define SYM_REPS 20      /* back-to-back calls of a case */
#define SYM_GRAPH_REPS 4 /* calls captured in a graph */
#define SYM_REPLAYS 3    /* replays, each with fresh inputs */
#define SYM_BURST 5      /* then replays back to back */
#define SYM_LARGE_REPS 20
/* The library's BRAID_SYM_MAX_BYTES default, and what one block of its LL variant holds
 * (BRAID_SYM_LL_BYTES). */
#define SYM_DEFAULT_MAX_BYTES 131072
#define SYM_LL_BLOCK_BYTES 4096
#define SYM_LIMIT_REPS 2                   /* the cases at BRAID_SYM_MAX_BYTES and just past it */
#define SYM_LIMIT_CAP ((size_t)64 << 20)   /* those run only up to this size */
#define SYM_MAX_OFFSET 32                  /* 16 + 2 * sizeof(T) for 8-byte types */
#define SYM_STAGE_BYTES ((size_t)48 << 20) /* reps x bytes of the largest case */
#define SYM_RS_LARGE_REPS 4                /* fewer, or 2, where the inputs outgrow the stage */
#define SYM_RS_LARGEST 262149              /* the largest reduce-scatter's receive count */

enum { SYM_INPLACE, SYM_RECV_WINDOW, SYM_RECV_PLAIN, SYM_LAYOUTS };
static const char* const sym_layout_names[SYM_LAYOUTS] = {"inplace", "outofplace recv=window",
                                                          "outofplace recv=cudaMalloc"};

/* What a case expects of the path: the symmetric one, the ordinary one, or either. */
enum { SYM_EXPECT_PLAIN, SYM_EXPECT_SYM, SYM_EXPECT_EITHER };

struct sym_state {
  int ready;
  int check_log;
  char log_path[4096];
  long long max_bytes; /* BRAID_SYM_MAX_BYTES as read here; 0 off */
  int pull;            /* BRAID_SYM_PULL=1: the pull variant beyond the LL variant's reach */
  size_t win_bytes;    /* each window's size, and the plain buffer's */
  char* send[GPU_MAX_RANKS];
  char* recv[GPU_MAX_RANKS];
  char* plain[GPU_MAX_RANKS];
  int odd[GPU_MAX_RANKS]; /* the local rank's global rank is odd: its plain output is skewed */
  ncclWindow_t send_win[GPU_MAX_RANKS], recv_win[GPU_MAX_RANKS];
  char* stage_in[GPU_MAX_RANKS]; /* reps x bytes of inputs, copied in on the stream */
  char* stage_out[GPU_MAX_RANKS];
  void* scalar[GPU_MAX_RANKS];   /* premul-dev's device scalar */
  uint64_t* hash[GPU_MAX_RANKS]; /* [0] this rank's, [1 + r] every rank's after the gather */
};

static struct sym_state sym;

/* One case: what it runs. */
struct sym_case {
  int scatter; /* ncclReduceScatter (count: the receive count); else ncclAllReduce */
  ncclDataType_t type;
  gpu_op_t op;
  size_t count;
  size_t offset; /* bytes, the input's (and the output's) place in its buffer */
  int layout;
  int reps;
  int graph; /* captured: SYM_GRAPH_REPS calls, replayed */
};

/* The collective's name as Braid logs it and the cases are named. */
static const char* sym_coll_name(const struct sym_case* c) {
  return c->scatter ? "ReduceScatter" : "AllReduce";
}

/* Bytes of one rank's output, and of one rank's input (reduce-scatter: nranks parts). */
static size_t sym_out_bytes(const struct sym_case* c) { return c->count * ref_type(c->type)->size; }

static size_t sym_in_bytes(const struct gpu_world* w, const struct sym_case* c) {
  return sym_out_bytes(c) * (c->scatter ? (size_t)w->nranks : 1);
}

/* ---- collective calls from one thread per local rank ---------------------------------------- */

enum { SYM_CALL_REGISTER, SYM_CALL_DEREGISTER, SYM_CALL_DESTROY };

struct sym_call {
  int kind, dev;
  ncclComm_t comm;
  void* buf;
  size_t bytes;
  ncclWindow_t win;
  ncclResult_t res;
  char err[256];
};

static void* sym_call_main(void* p) {
  struct sym_call* c = p;
  if (cudaSetDevice(c->dev) != cudaSuccess) {
    c->res = ncclUnhandledCudaError;
    snprintf(c->err, sizeof c->err, "cudaSetDevice(%d) failed", c->dev);
    return NULL;
  }
  if (c->kind == SYM_CALL_REGISTER)
    c->res = ncclCommWindowRegister(c->comm, c->buf, c->bytes, &c->win, NCCL_WIN_COLL_SYMMETRIC);
  else if (c->kind == SYM_CALL_DEREGISTER)
    c->res = ncclCommWindowDeregister(c->comm, c->win);
  else
    c->res = ncclCommDestroy(c->comm);
  if (c->res != ncclSuccess) {
    const char* last = ncclGetLastError(c->kind == SYM_CALL_DESTROY ? NULL : c->comm);
    snprintf(c->err, sizeof c->err, "%s", last && *last ? last : "(empty)");
  }
  return NULL;
}

/* Runs calls[0 .. w->nlocal) at once, one thread each when several; 0 when all succeeded. */
static int sym_call_all(struct gpu_world* w, struct sym_call* calls, const char* what) {
  pthread_t th[GPU_MAX_RANKS];
  int started[GPU_MAX_RANKS] = {0}, rc = 0;
  if (w->nlocal == 1) {
    sym_call_main(&calls[0]);
  } else {
    for (int l = 0; l < w->nlocal; l++) {
      started[l] = pthread_create(&th[l], NULL, sym_call_main, &calls[l]) == 0;
      if (!started[l]) {
        /* The started ones wait for this rank: they fail or time out, and the case with them. */
        world_case_fail(w, "%s: cannot start a thread for local rank %d", what, l);
        calls[l].res = ncclSystemError;
        snprintf(calls[l].err, sizeof calls[l].err, "no thread");
      }
    }
    for (int l = 0; l < w->nlocal; l++)
      if (started[l]) pthread_join(th[l], NULL);
  }
  for (int l = 0; l < w->nlocal; l++) {
    if (calls[l].res == ncclSuccess) continue;
    world_case_fail(w, "%s on rank %d returned %d (%s); ncclGetLastError: %s", what, w->rank0 + l,
                    (int)calls[l].res, ncclGetErrorString(calls[l].res), calls[l].err);
    rc = -1;
  }
  return rc;
}

/* Registers bufs[l] (bytes each) as a symmetric window of comms[l]; win[l] gets the window. */
static int sym_register(struct gpu_world* w, ncclComm_t* comms, char** bufs, size_t bytes,
                        ncclWindow_t* win, const char* what) {
  struct sym_call calls[GPU_MAX_RANKS];
  memset(calls, 0, sizeof calls);
  for (int l = 0; l < w->nlocal; l++)
    calls[l] = (struct sym_call){.kind = SYM_CALL_REGISTER,
                                 .dev = w->dev[l],
                                 .comm = comms[l],
                                 .buf = bufs[l],
                                 .bytes = bytes};
  int rc = sym_call_all(w, calls, what);
  for (int l = 0; l < w->nlocal; l++) {
    win[l] = calls[l].win;
    if (calls[l].res == ncclSuccess && win[l] == NULL) {
      world_case_fail(w, "%s on rank %d returned success and a NULL window", what, w->rank0 + l);
      rc = -1;
    }
  }
  return rc;
}

static int sym_deregister(struct gpu_world* w, ncclComm_t* comms, ncclWindow_t* win,
                          const char* what) {
  struct sym_call calls[GPU_MAX_RANKS];
  memset(calls, 0, sizeof calls);
  for (int l = 0; l < w->nlocal; l++)
    calls[l] = (struct sym_call){
        .kind = SYM_CALL_DEREGISTER, .dev = w->dev[l], .comm = comms[l], .win = win[l]};
  int rc = sym_call_all(w, calls, what);
  for (int l = 0; l < w->nlocal; l++) win[l] = NULL;
  return rc;
}

/* ---- the log --------------------------------------------------------------------------------- */

/* This process's BRAID_DEBUG_FILE (or NCCL_DEBUG_FILE), %h and %p expanded as Braid does. */
static int sym_log_path(char* out, size_t len) {
  const char* pat = getenv("BRAID_DEBUG_FILE");
  char host[256];
  size_t n = 0;
  if (pat == NULL || pat[0] == '\0') pat = getenv("NCCL_DEBUG_FILE");
  if (pat == NULL || pat[0] == '\0') return -1;
  if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "unknown");
  host[sizeof host - 1] = '\0';
  char* dot = strchr(host, '.');
  if (dot) *dot = '\0';
  for (const char* p = pat; *p && n + 1 < len; p++) {
    if (p[0] == '%' && (p[1] == 'h' || p[1] == 'p')) {
      int k = p[1] == 'h' ? snprintf(out + n, len - n, "%s", host)
                          : snprintf(out + n, len - n, "%d", (int)getpid());
      if (k > 0) n += (size_t)k < len - n ? (size_t)k : len - n - 1;
      p++;
    } else {
      out[n++] = *p;
    }
  }
  out[n] = '\0';
  return 0;
}

/* The log's size now (where the lines of the case about to run begin); 0 when absent. */
static long long sym_log_mark(void) {
  struct stat st;
  if (!sym.check_log || stat(sym.log_path, &st) != 0) return 0;
  return (long long)st.st_size;
}

/*
 * Counts the lines logged since `mark` that say "from a symmetric window": all of them in
 * *any, those of collective `coll` ("AllReduce") of `count` elements in *exact. 0, or -1
 * when unreadable.
 */
static int sym_log_count(long long mark, const char* coll, size_t count, int* any, int* exact) {
  FILE* f = fopen(sym.log_path, "r");
  char line[4096], want[96];
  *any = *exact = 0;
  if (f == NULL) return -1;
  if (fseeko(f, (off_t)mark, SEEK_SET) != 0) {
    fclose(f);
    return -1;
  }
  snprintf(want, sizeof want, "%s %zu elements from a symmetric window", coll, count);
  while (fgets(line, sizeof line, f)) {
    if (!strstr(line, "from a symmetric window")) continue;
    (*any)++;
    if (strstr(line, want)) (*exact)++;
  }
  fclose(f);
  return 0;
}

/* Fails the case when the path the log shows is not the one `expect` names. */
static void sym_log_check(struct gpu_world* w, long long mark, const char* coll, size_t count,
                          int expect) {
  int any, exact;
  if (!sym.check_log || expect == SYM_EXPECT_EITHER) return;
  if (sym_log_count(mark, coll, count, &any, &exact) != 0) {
    world_case_fail(w,
                    "cannot read the log %s: %s (BRAID_DEBUG=INFO and "
                    "BRAID_DEBUG_SUBSYS=TUNING set?)",
                    sym.log_path, strerror(errno));
    return;
  }
  if (expect == SYM_EXPECT_SYM && exact < w->nlocal)
    world_case_fail(w,
                    "the symmetric path was not taken: %d log line(s) \"%s %zu elements "
                    "from a symmetric window\" in %s, %d expected (one per local rank at least; "
                    "BRAID_SYM_MAX_BYTES=%lld)",
                    exact, coll, count, sym.log_path, w->nlocal, sym.max_bytes);
  if (expect == SYM_EXPECT_PLAIN && any > 0)
    world_case_fail(w,
                    "the symmetric path was taken where it must not be: %d log line(s) \"from a "
                    "symmetric window\" in %s (BRAID_SYM_MAX_BYTES=%lld)",
                    any, sym.log_path, sym.max_bytes);
}

/* ---- set-up ---------------------------------------------------------------------------------- */

/*
 * Ends the set-up or the teardown: its case when it had one; else (--filter left it out, yet
 * it ran) a failure of its own still fails the run, which the next case's start would forget.
 */
static void sym_uncased_end(struct gpu_world* w, int cased) {
  if (cased) {
    world_case_end(w);
  } else if (w->case_failed) {
    w->failures++;
    w->case_failed = 0;
  }
}

static void sym_setup(struct gpu_world* w) {
  char name[160];
  snprintf(name, sizeof name, "Sym setup: ncclMemAlloc, two symmetric windows a rank mode=%s",
           w->opts->mode);
  memset(&sym, 0, sizeof sym);
  const char* max = getenv("BRAID_SYM_MAX_BYTES");
  sym.max_bytes = max && max[0] ? strtoll(max, NULL, 0) : SYM_DEFAULT_MAX_BYTES;
  const char* pull = getenv("BRAID_SYM_PULL");
  sym.pull = pull && strcmp(pull, "1") == 0;
  /* Runs whatever --filter says (the cases need it); a case of its own when it passes. */
  int cased = world_case_begin(w, name);
  if (!cased && w->opts->list) return;
  if (!cased) snprintf(w->case_name, sizeof w->case_name, "%s", name);
  const char* chk = getenv("GPU_SYM_CHECK_LOG");
  sym.check_log = chk && strcmp(chk, "1") == 0;
  if (sym.check_log && sym_log_path(sym.log_path, sizeof sym.log_path) != 0) {
    world_case_fail(w, "GPU_SYM_CHECK_LOG=1 needs BRAID_DEBUG_FILE (one file per process)");
    goto out;
  }
  /*
   * Large enough for the largest reduce-scatter's input (nranks parts), and for the cases at
   * BRAID_SYM_MAX_BYTES and one element past it (a reduce-scatter: nranks elements past),
   * when they run.
   */
  size_t need = (size_t)262149 * 8, past = 4 * (size_t)w->nranks > 8 ? 4 * (size_t)w->nranks : 8;
  if ((size_t)w->nranks * SYM_RS_LARGEST * 8 > need) need = (size_t)w->nranks * SYM_RS_LARGEST * 8;
  if (sym.max_bytes > 0 && (size_t)sym.max_bytes + 8 <= SYM_LIMIT_CAP)
    need = (size_t)sym.max_bytes + past > need ? (size_t)sym.max_bytes + past : need;
  sym.win_bytes = (need + SYM_MAX_OFFSET + GPU_GUARD + 4095) & ~(size_t)4095;
  for (int l = 0; l < w->nlocal; l++) sym.odd[l] = (w->rank0 + l) % 2;
  for (int l = 0; l < w->nlocal; l++) {
    if (world_cuda(w, cudaSetDevice(w->dev[l]), "cudaSetDevice") ||
        world_nccl(w, ncclMemAlloc((void**)&sym.send[l], sym.win_bytes), NULL, "ncclMemAlloc") ||
        world_nccl(w, ncclMemAlloc((void**)&sym.recv[l], sym.win_bytes), NULL, "ncclMemAlloc") ||
        world_cuda(w, cudaMalloc((void**)&sym.plain[l], sym.win_bytes + 16), "cudaMalloc") ||
        world_cuda(w, cudaMalloc((void**)&sym.stage_in[l], SYM_STAGE_BYTES), "cudaMalloc") ||
        world_cuda(w, cudaMalloc((void**)&sym.stage_out[l], SYM_STAGE_BYTES), "cudaMalloc") ||
        world_cuda(w, cudaMalloc(&sym.scalar[l], 8), "cudaMalloc") ||
        world_cuda(w, cudaMalloc((void**)&sym.hash[l], (GPU_MAX_RANKS + 1) * sizeof(uint64_t)),
                   "cudaMalloc"))
      goto out;
  }
  if (sym_register(w, w->comm, sym.send, sym.win_bytes, sym.send_win,
                   "ncclCommWindowRegister (send buffer, NCCL_WIN_COLL_SYMMETRIC)") != 0 ||
      sym_register(w, w->comm, sym.recv, sym.win_bytes, sym.recv_win,
                   "ncclCommWindowRegister (receive buffer, NCCL_WIN_COLL_SYMMETRIC)") != 0)
    goto out;
  sym.ready = 1;
out:
  sym_uncased_end(w, cased);
}

static void sym_free(struct gpu_world* w) {
  for (int l = 0; l < w->nlocal; l++) {
    if (cudaSetDevice(w->dev[l]) != cudaSuccess) continue;
    if (sym.send[l]) world_nccl(w, ncclMemFree(sym.send[l]), NULL, "ncclMemFree");
    if (sym.recv[l]) world_nccl(w, ncclMemFree(sym.recv[l]), NULL, "ncclMemFree");
    cudaFree(sym.plain[l]);
    cudaFree(sym.stage_in[l]);
    cudaFree(sym.stage_out[l]);
    cudaFree(sym.scalar[l]);
    cudaFree(sym.hash[l]);
  }
  memset(&sym, 0, sizeof sym);
}

/* The last case on the world's communicator: deregister both windows, free the memory. */
static void sym_teardown(struct gpu_world* w) {
  char name[160];
  snprintf(name, sizeof name, "Sym ncclCommWindowDeregister both windows, ncclMemFree mode=%s",
           w->opts->mode);
  int cased = world_case_begin(w, name);
  if (!cased && w->opts->list) return;
  if (!cased) snprintf(w->case_name, sizeof w->case_name, "%s", name);
  int windows = sym.send_win[0] != NULL || sym.recv_win[0] != NULL;
  if (world_sync(w) == 0 && windows) {
    if (sym.send_win[0])
      sym_deregister(w, w->comm, sym.send_win, "ncclCommWindowDeregister (send)");
    if (sym.recv_win[0])
      sym_deregister(w, w->comm, sym.recv_win, "ncclCommWindowDeregister (receive)");
  }
  sym_free(w);
  sym_uncased_end(w, cased);
}

/* ---- one case -------------------------------------------------------------------------------- */

static int sym_expect(const struct gpu_world* w, const struct sym_case* c) {
  size_t bytes = sym_in_bytes(w, c); /* reduce-scatter: every part, as nccl-tests counts it */
  if (sym.max_bytes <= 0 || (long long)bytes > sym.max_bytes || w->nranks < 2)
    return SYM_EXPECT_PLAIN;
  if (c->op == GPU_OP_PREMUL_HOST || c->op == GPU_OP_PREMUL_DEV) return SYM_EXPECT_PLAIN;
  if (c->op == GPU_OP_PREMUL_SAME) return SYM_EXPECT_EITHER; /* no rank can know they agree */
  /* Without BRAID_SYM_PULL=1 only what the LL variant holds: one block's always, more as the
   * comm's channels allow (which this test does not know). */
  const size_t out = c->scatter ? bytes / (size_t)w->nranks : bytes;
  if (!sym.pull && out > SYM_LL_BLOCK_BYTES) return SYM_EXPECT_EITHER;
  return SYM_EXPECT_SYM;
}

static void sym_case_name(const struct gpu_world* w, const struct sym_case* c, char* out,
                          size_t len) {
  snprintf(out, len, "Sym %s %s %s %s=%zu offset=%zu %s %s%d mode=%s", sym_coll_name(c),
           ref_type(c->type)->name, ref_op_name(c->op), c->scatter ? "recvcount" : "count",
           c->count, c->offset, sym_layout_names[c->layout], c->graph ? "graph x" : "x",
           c->graph ? SYM_GRAPH_REPS : c->reps, w->opts->mode);
}

/*
 * Where local rank l's input and output of case c lie, and the region poisoned around them.
 * The plain output of an odd rank lies one element further than the even ranks' (an output
 * whose alignment differs from rank to rank: the symmetric path's rounds must not depend on
 * it, or the ranks' meetings would go out of step). A reduce-scatter in place receives into
 * its own part of its input, sendbuff + rank * recvcount elements (NCCL's definition).
 */
static void sym_bufs(const struct gpu_world* w, const struct sym_case* c, int l, char** send,
                     char** recv, char** region) {
  *send = sym.send[l] + c->offset;
  const size_t skew = sym.odd[l] ? ref_type(c->type)->size : 0;
  *region = c->layout == SYM_INPLACE       ? sym.send[l]
            : c->layout == SYM_RECV_WINDOW ? sym.recv[l]
                                           : sym.plain[l] + skew;
  *recv = *region + c->offset;
  if (c->scatter && c->layout == SYM_INPLACE) *recv += (size_t)(w->rank0 + l) * sym_out_bytes(c);
}

/* The bytes poisoned before each call: the output (in place, the input) and a guard after. */
static size_t sym_span(const struct gpu_world* w, const struct sym_case* c) {
  return c->offset + (c->layout == SYM_INPLACE ? sym_in_bytes(w, c) : sym_out_bytes(c)) + GPU_GUARD;
}

/* The operator of local rank l for case c (created on `comm` for PreMulSum). */
static int sym_bind(struct gpu_world* w, const struct sym_case* c, int l, ncclComm_t comm,
                    ncclRedOp_t* op, int* created) {
  static const ncclRedOp_t builtin[GPU_OP_COUNT] = {[GPU_OP_SUM] = ncclSum,
                                                    [GPU_OP_PROD] = ncclProd,
                                                    [GPU_OP_MAX] = ncclMax,
                                                    [GPU_OP_MIN] = ncclMin,
                                                    [GPU_OP_AVG] = ncclAvg};
  unsigned char scalar[8];
  ncclResult_t res;
  *created = 0;
  if (!ref_op_is_premul(c->op)) {
    *op = builtin[c->op];
    return 0;
  }
  ref_premul_scalar(c->type, c->op, w->rank0 + l, scalar);
  if (c->op == GPU_OP_PREMUL_DEV) {
    if (world_cuda(w, cudaSetDevice(w->dev[l]), "cudaSetDevice") ||
        world_cuda(
            w, cudaMemcpy(sym.scalar[l], scalar, ref_type(c->type)->size, cudaMemcpyHostToDevice),
            "cudaMemcpy (scalar)"))
      return -1;
    res = ncclRedOpCreatePreMulSum(op, sym.scalar[l], c->type, ncclScalarDevice, comm);
  } else {
    res = ncclRedOpCreatePreMulSum(op, scalar, c->type, ncclScalarHostImmediate, comm);
  }
  if (world_nccl(w, res, comm, "ncclRedOpCreatePreMulSum") != 0) return -1;
  *created = 1;
  return 0;
}

/*
 * Step k of a case on every local rank, on its stream: poison the output (and in place the
 * window around the input), copy input k in, all-reduce or reduce-scatter, copy the output
 * out to slot k.
 */
static int sym_step(struct gpu_world* w, const struct sym_case* c, ncclComm_t* comms,
                    const ncclRedOp_t* ops, int k) {
  size_t bytes = sym_in_bytes(w, c), out_bytes = sym_out_bytes(c);
  size_t span = sym_span(w, c);
  char what[80];
  for (int l = 0; l < w->nlocal; l++) {
    char *send, *recv, *region;
    sym_bufs(w, c, l, &send, &recv, &region);
    if (world_cuda(w, cudaSetDevice(w->dev[l]), "cudaSetDevice") ||
        world_cuda(w, cudaMemsetAsync(region, GPU_POISON, span, w->stream[l]), "cudaMemsetAsync") ||
        world_cuda(w,
                   cudaMemcpyAsync(send, sym.stage_in[l] + (size_t)k * bytes, bytes,
                                   cudaMemcpyDeviceToDevice, w->stream[l]),
                   "cudaMemcpyAsync (input)"))
      return -1;
  }
  if (world_group_start(w) != 0) return -1;
  int rc = 0;
  for (int l = 0; l < w->nlocal; l++) {
    char *send, *recv, *region;
    sym_bufs(w, c, l, &send, &recv, &region);
    snprintf(what, sizeof what, "nccl%s step %d on rank %d", sym_coll_name(c), k, w->rank0 + l);
    ncclResult_t res =
        c->scatter
            ? ncclReduceScatter(send, recv, c->count, c->type, ops[l], comms[l], w->stream[l])
            : ncclAllReduce(send, recv, c->count, c->type, ops[l], comms[l], w->stream[l]);
    rc |= world_nccl(w, res, comms[l], what);
  }
  rc |= world_group_end(w);
  if (rc) return -1;
  for (int l = 0; l < w->nlocal; l++) {
    char *send, *recv, *region;
    sym_bufs(w, c, l, &send, &recv, &region);
    if (world_cuda(w, cudaSetDevice(w->dev[l]), "cudaSetDevice") ||
        world_cuda(w,
                   cudaMemcpyAsync(sym.stage_out[l] + (size_t)k * out_bytes, recv, out_bytes,
                                   cudaMemcpyDeviceToDevice, w->stream[l]),
                   "cudaMemcpyAsync (output)"))
      return -1;
  }
  return 0;
}

/*
 * Every rank's inputs of `nsteps` steps: in[k * nranks + r] (a reduce-scatter's: nranks *
 * recvcount elements); and this process's uploaded.
 */
static int sym_inputs(struct gpu_world* w, const struct sym_case* c, uint64_t seed, int nsteps,
                      void** in) {
  size_t bytes = sym_in_bytes(w, c), elems = bytes / ref_type(c->type)->size;
  for (int k = 0; k < nsteps; k++)
    for (int r = 0; r < w->nranks; r++) {
      void** p = &in[(size_t)k * (size_t)w->nranks + (size_t)r];
      if (*p == NULL) *p = malloc(bytes);
      if (*p == NULL) {
        world_case_fail(w, "out of host memory");
        return -1;
      }
      ref_fill(
          c->type, c->op, w->nranks,
          seed + 0x9e3779b97f4a7c15ull * (uint64_t)(r + 1) + 0x632be59bd9b4e019ull * (uint64_t)k,
          *p, elems);
    }
  for (int l = 0; l < w->nlocal; l++) {
    if (world_cuda(w, cudaSetDevice(w->dev[l]), "cudaSetDevice")) return -1;
    for (int k = 0; k < nsteps; k++)
      if (world_cuda(w,
                     cudaMemcpy(sym.stage_in[l] + (size_t)k * bytes,
                                in[(size_t)k * (size_t)w->nranks + (size_t)(w->rank0 + l)], bytes,
                                cudaMemcpyHostToDevice),
                     "cudaMemcpy (inputs)"))
        return -1;
  }
  return 0;
}

/*
 * The wrong elements of one output: a few reported when `report`; returns how many. A
 * reduce-scatter's output is part `rank` of the reduced input.
 */
static size_t sym_check_output(struct gpu_world* w, const struct sym_case* c, void* const* in,
                               const unsigned char* got, int rank, int k, int report,
                               const char* when) {
  struct ref_ctx ref;
  char why[256];
  size_t bad = 0, base = c->scatter ? (size_t)rank * c->count : 0;
  ref_ctx_init(&ref, c->type, c->op, w->nranks);
  for (size_t j = 0; j < c->count; j++) {
    int say = report && bad < 3;
    if (ref_check_reduced(&ref, (const void* const*)in, base + j, got, j, say ? why : NULL,
                          sizeof why))
      continue;
    if (say) world_case_fail(w, "%srank %d step %d element %zu: %s", when, rank, k, j, why);
    bad++;
  }
  if (report && bad > 3)
    world_case_fail(w, "%srank %d step %d: %zu of %zu elements wrong", when, rank, k, bad,
                    c->count);
  return bad;
}

/*
 * After the steps and a synchronization: every output against the reference (all-reduce:
 * the first local rank's, the other local ranks' must equal it bit for bit; reduce-scatter:
 * every local rank's, each a different part), the poison around the last output, an
 * out-of-place input unchanged (in place, a reduce-scatter's other parts where the symmetric
 * path runs: its ranks read them from the window while this one writes its own);
 * all-reduce: every rank's hash gathered and compared.
 * `when` prefixes the failures ("replay 2: ").
 */
static int sym_check(struct gpu_world* w, const struct sym_case* c, int nsteps, void** in,
                     const char* when) {
  size_t bytes = sym_out_bytes(c), in_bytes = sym_in_bytes(w, c), span = sym_span(w, c);
  size_t total = (size_t)nsteps * bytes, hlen = total > span ? total : span;
  if (in_bytes > hlen) hlen = in_bytes;
  unsigned char* first = malloc(total ? total : 1);
  unsigned char* host = malloc(hlen);
  int failed_before = w->case_failed, rc = 0;
  w->case_failed = 0;
  if (first == NULL || host == NULL) {
    world_case_fail(w, "out of host memory");
    goto out;
  }
  for (int l = 0; l < w->nlocal; l++) {
    int rank = w->rank0 + l;
    uint64_t h = 0xcbf29ce484222325ull;
    char *send, *recv, *region;
    sym_bufs(w, c, l, &send, &recv, &region);
    const int own = l == 0 || c->scatter; /* this rank's outputs checked against the reference */
    unsigned char* got = own ? first : host;
    if (world_cuda(w, cudaSetDevice(w->dev[l]), "cudaSetDevice") ||
        world_cuda(w, cudaMemcpy(got, sym.stage_out[l], total, cudaMemcpyDeviceToHost),
                   "cudaMemcpy (outputs)"))
      goto out;
    for (size_t i = 0; i < total; i++) h = (h ^ got[i]) * 0x100000001b3ull;
    if (own) {
      int wrong = 0; /* steps with wrong elements: the first two told in detail */
      for (int k = 0; k < nsteps; k++)
        wrong += sym_check_output(w, c, &in[(size_t)k * (size_t)w->nranks],
                                  first + (size_t)k * bytes, rank, k, wrong < 2, when) > 0;
      if (wrong > 2)
        world_case_fail(w, "%srank %d: %d of %d steps wrong", when, rank, wrong, nsteps);
    } else if (memcmp(first, host, total) != 0) {
      size_t i = 0;
      while (first[i] == host[i]) i++;
      world_case_fail(w, "%srank %d's outputs differ from rank %d's from byte %zu (step %zu)", when,
                      rank, w->rank0, i, i / (bytes ? bytes : 1));
    }
    if (!c->scatter && world_cuda(w, cudaMemcpy(sym.hash[l], &h, sizeof h, cudaMemcpyHostToDevice),
                                  "cudaMemcpy (hash)"))
      goto out;
    /* The poison around the last output; in place, the window around the last input. */
    if (world_cuda(w, cudaMemcpy(host, region, span, cudaMemcpyDeviceToHost), "cudaMemcpy"))
      goto out;
    const size_t out_at = (size_t)(recv - region);
    const size_t in_end = c->layout == SYM_INPLACE ? c->offset + in_bytes : 0;
    for (size_t i = 0; i < span; i++) {
      if ((i >= out_at && i < out_at + bytes) || (i >= c->offset && i < in_end) ||
          host[i] == GPU_POISON)
        continue;
      world_case_fail(w,
                      "%srank %d: byte %zu of the output's buffer was written (0x%02x), "
                      "outside the output [%zu, %zu)",
                      when, rank, i, host[i], out_at, out_at + bytes);
      break;
    }
    const unsigned char* last = in[(size_t)(nsteps - 1) * (size_t)w->nranks + (size_t)rank];
    if (c->scatter && c->layout == SYM_INPLACE && sym_expect(w, c) == SYM_EXPECT_SYM) {
      for (size_t i = 0; i < in_bytes; i++) {
        if ((i >= out_at - c->offset && i < out_at - c->offset + bytes) ||
            host[c->offset + i] == last[i])
          continue;
        world_case_fail(w,
                        "%srank %d: byte %zu of its input (part %zu) was modified in place, "
                        "outside its own part [%zu, %zu)",
                        when, rank, i, i / (bytes ? bytes : 1), out_at - c->offset,
                        out_at - c->offset + bytes);
        break;
      }
    }
    if (c->layout != SYM_INPLACE) {
      if (world_cuda(w, cudaMemcpy(host, send, in_bytes, cudaMemcpyDeviceToHost), "cudaMemcpy"))
        goto out;
      if (memcmp(host, last, in_bytes) != 0)
        world_case_fail(w, "%srank %d: the input in its window was modified", when, rank);
    }
  }
out:
  /*
   * All-reduce: every process gathers, even after a failure here: the others wait for it.
   * A reduce-scatter's outputs differ from rank to rank: no process gathers.
   */
  if (!c->scatter && world_group_start(w) == 0) {
    for (int l = 0; l < w->nlocal; l++)
      world_nccl(
          w, ncclAllGather(sym.hash[l], sym.hash[l] + 1, 1, ncclUint64, w->comm[l], w->stream[l]),
          w->comm[l], "ncclAllGather (hashes)");
    world_group_end(w);
  }
  if (!c->scatter && world_sync(w) == 0) {
    uint64_t all[GPU_MAX_RANKS];
    if (world_cuda(w, cudaSetDevice(w->dev[0]), "cudaSetDevice") == 0 &&
        world_cuda(w,
                   cudaMemcpy(all, sym.hash[0] + 1, sizeof(uint64_t) * (size_t)w->nranks,
                              cudaMemcpyDeviceToHost),
                   "cudaMemcpy (hashes)") == 0)
      for (int r = 1; r < w->nranks; r++)
        if (all[r] != all[0]) {
          world_case_fail(w,
                          "%sthe outputs of rank %d differ from rank 0's (hash %016llx, "
                          "%016llx)",
                          when, r, (unsigned long long)all[r], (unsigned long long)all[0]);
          break;
        }
  }
  rc = w->case_failed ? -1 : 0;
  w->case_failed |= failed_before;
  free(first);
  free(host);
  return rc;
}

static void sym_graphs_destroy(struct gpu_world* w, cudaGraph_t* graph, cudaGraphExec_t* exec) {
  for (int l = 0; l < w->nlocal; l++) {
    cudaSetDevice(w->dev[l]);
    if (exec[l]) cudaGraphExecDestroy(exec[l]);
    if (graph[l]) cudaGraphDestroy(graph[l]);
  }
}

/* Captures SYM_GRAPH_REPS steps on every local rank's stream; 0 when every graph instantiated. */
static int sym_capture(struct gpu_world* w, const struct sym_case* c, const ncclRedOp_t* ops,
                       cudaGraph_t* graph, cudaGraphExec_t* exec) {
  int rc = 0;
  for (int l = 0; rc == 0 && l < w->nlocal; l++)
    rc = world_cuda(w, cudaSetDevice(w->dev[l]), "cudaSetDevice") ||
         world_cuda(w, cudaStreamBeginCapture(w->stream[l], cudaStreamCaptureModeThreadLocal),
                    "cudaStreamBeginCapture");
  for (int k = 0; rc == 0 && k < SYM_GRAPH_REPS; k++) rc = sym_step(w, c, w->comm, ops, k);
  for (int l = 0; l < w->nlocal; l++) {
    enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    cudaSetDevice(w->dev[l]);
    if (cudaStreamIsCapturing(w->stream[l], &st) == cudaSuccess &&
        st != cudaStreamCaptureStatusNone &&
        world_cuda(w, cudaStreamEndCapture(w->stream[l], &graph[l]), "cudaStreamEndCapture"))
      rc = -1;
  }
  for (int l = 0; rc == 0 && l < w->nlocal; l++)
    rc = world_cuda(w, cudaSetDevice(w->dev[l]), "cudaSetDevice") ||
         world_cuda(w, cudaGraphInstantiate(&exec[l], graph[l], 0), "cudaGraphInstantiate");
  return rc;
}

static int sym_replay(struct gpu_world* w, cudaGraphExec_t* exec, int times) {
  for (int k = 0; k < times; k++)
    for (int l = 0; l < w->nlocal; l++)
      if (world_cuda(w, cudaSetDevice(w->dev[l]), "cudaSetDevice") ||
          world_cuda(w, cudaGraphLaunch(exec[l], w->stream[l]), "cudaGraphLaunch"))
        return -1;
  return world_sync(w);
}

static void sym_run(struct gpu_world* w, const struct sym_case* c, size_t index) {
  char name[sizeof w->case_name];
  sym_case_name(w, c, name, sizeof name);
  size_t bytes = sym_in_bytes(w, c); /* the outputs are no larger */
  int nsteps = c->graph ? SYM_GRAPH_REPS : c->reps;
  if (!w->opts->list) {
    if (!sym.ready) {
      world_case_skip(w, name, "the windows' setup failed");
      return;
    }
    if (!world_case_fits(w, name,
                         c->offset + bytes + GPU_GUARD <= sym.win_bytes &&
                             (size_t)nsteps * bytes <= SYM_STAGE_BYTES,
                         "larger than the windows"))
      return;
  }
  if (!world_case_begin(w, name)) return;
  ncclRedOp_t ops[GPU_MAX_RANKS];
  int created[GPU_MAX_RANKS] = {0};
  void** in = calloc((size_t)nsteps * (size_t)w->nranks, sizeof *in);
  cudaGraph_t graph[GPU_MAX_RANKS] = {0};
  cudaGraphExec_t exec[GPU_MAX_RANKS] = {0};
  uint64_t seed = world_seed(w, SUITE_SYM, index, 0);
  long long mark = sym_log_mark();
  int ok = in != NULL;
  if (!ok) world_case_fail(w, "out of host memory");
  for (int l = 0; ok && l < w->nlocal; l++)
    ok = sym_bind(w, c, l, w->comm[l], &ops[l], &created[l]) == 0;
  if (ok) ok = sym_inputs(w, c, seed, nsteps, in) == 0;
  if (ok && !c->graph) {
    int issued = 0;
    for (int k = 0; k < c->reps && issued == 0; k++) issued = sym_step(w, c, w->comm, ops, k);
    if (issued == 0 && world_sync(w) == 0) {
      sym_log_check(w, mark, sym_coll_name(c), c->count, sym_expect(w, c));
      sym_check(w, c, nsteps, in, "");
    }
  } else if (ok) {
    if (sym_capture(w, c, ops, graph, exec) == 0) {
      sym_log_check(w, mark, sym_coll_name(c), c->count, sym_expect(w, c));
      /* A wrong result goes on to the next replay: every process runs the same calls. */
      char when[64];
      int issued = 0;
      for (int r = 0; r < SYM_REPLAYS && issued == 0; r++) {
        snprintf(when, sizeof when, "replay %d: ", r);
        issued = r > 0 ? sym_inputs(w, c, seed + 0x51ull * (uint64_t)r, nsteps, in) : 0;
        if (issued == 0) issued = sym_replay(w, exec, 1);
        if (issued == 0) sym_check(w, c, nsteps, in, when);
      }
      snprintf(when, sizeof when, "%d replays back to back: ", SYM_BURST);
      if (issued == 0 && sym_replay(w, exec, SYM_BURST) == 0) sym_check(w, c, nsteps, in, when);
    }
  }
  sym_graphs_destroy(w, graph, exec);
  for (int l = 0; l < w->nlocal; l++)
    if (created[l])
      world_nccl(w, ncclRedOpDestroy(ops[l], w->comm[l]), w->comm[l], "ncclRedOpDestroy");
  for (size_t i = 0; in && i < (size_t)nsteps * (size_t)w->nranks; i++) free(in[i]);
  free(in);
  world_case_end(w);
}

/* ---- a communicator destroyed with its windows registered ------------------------------------ */

static void sym_destroy_registered(struct gpu_world* w) {
  char name[160];
  snprintf(name, sizeof name, "Sym ncclCommDestroy with symmetric windows registered mode=%s",
           w->opts->mode);
  if (!world_case_begin(w, name)) return;
  ncclComm_t comms[GPU_MAX_RANKS] = {0};
  char* buf[GPU_MAX_RANKS] = {0};
  ncclWindow_t win[GPU_MAX_RANKS] = {0};
  const size_t count = 4097, bytes = count * sizeof(float) + GPU_GUARD;
  if (w->nlocal == w->nranks) {
    if (world_nccl(w, ncclCommInitAll(comms, w->nranks, w->dev), NULL, "ncclCommInitAll")) goto out;
  } else {
    ncclUniqueId id;
    if (world_id(w, 2, &id) || world_cuda(w, cudaSetDevice(w->dev[0]), "cudaSetDevice") ||
        world_nccl(w, ncclCommInitRank(&comms[0], w->nranks, id, w->rank0), NULL,
                   "ncclCommInitRank"))
      goto out;
  }
  for (int l = 0; l < w->nlocal; l++)
    if (world_cuda(w, cudaSetDevice(w->dev[l]), "cudaSetDevice") ||
        world_nccl(w, ncclMemAlloc((void**)&buf[l], bytes), NULL, "ncclMemAlloc"))
      goto out;
  if (sym_register(w, comms, buf, bytes, win, "ncclCommWindowRegister (own communicator)"))
    goto out;
  /* One in-place sum on it, checked: its inputs are 1 + rank, so every output is the sum. */
  {
    float* h = malloc(count * sizeof *h);
    float want = (float)(w->nranks * (w->nranks + 1) / 2);
    if (h == NULL) {
      world_case_fail(w, "out of host memory");
      goto out;
    }
    for (int l = 0; l < w->nlocal; l++) {
      for (size_t i = 0; i < count; i++) h[i] = (float)(w->rank0 + l + 1);
      if (world_cuda(w, cudaSetDevice(w->dev[l]), "cudaSetDevice") ||
          world_cuda(w, cudaMemcpy(buf[l], h, count * sizeof *h, cudaMemcpyHostToDevice),
                     "cudaMemcpy"))
        break;
    }
    long long mark = sym_log_mark();
    int rc = world_group_start(w);
    for (int l = 0; rc == 0 && l < w->nlocal; l++)
      rc = world_nccl(
          w, ncclAllReduce(buf[l], buf[l], count, ncclFloat32, ncclSum, comms[l], w->stream[l]),
          comms[l], "ncclAllReduce (own communicator)");
    rc |= world_group_end(w);
    for (int l = 0; rc == 0 && l < w->nlocal; l++)
      rc = world_cuda(w, cudaSetDevice(w->dev[l]), "cudaSetDevice") ||
           world_cuda(w, cudaStreamSynchronize(w->stream[l]), "cudaStreamSynchronize");
    if (rc == 0) {
      struct sym_case c = {.type = ncclFloat32, .op = GPU_OP_SUM, .count = count};
      sym_log_check(w, mark, "AllReduce", count, sym_expect(w, &c));
    }
    for (int l = 0; rc == 0 && l < w->nlocal; l++) {
      cudaSetDevice(w->dev[l]);
      if (world_cuda(w, cudaMemcpy(h, buf[l], count * sizeof *h, cudaMemcpyDeviceToHost),
                     "cudaMemcpy"))
        break;
      for (size_t i = 0; i < count; i++)
        if (h[i] != want) {
          world_case_fail(w, "rank %d element %zu: got %g, expected %g", w->rank0 + l, i,
                          (double)h[i], (double)want);
          break;
        }
    }
    free(h);
  }
out:
  /*
   * Destroyed with the windows registered (never deregistered), one thread per local rank
   * (whatever a library's destroy waits for, no rank waits on another in the same thread);
   * then the memory freed.
   */
  if (comms[0] != NULL) {
    struct sym_call calls[GPU_MAX_RANKS];
    memset(calls, 0, sizeof calls);
    for (int l = 0; l < w->nlocal; l++)
      calls[l] = (struct sym_call){.kind = SYM_CALL_DESTROY, .dev = w->dev[l], .comm = comms[l]};
    sym_call_all(w, calls, "ncclCommDestroy (windows registered)");
  }
  for (int l = 0; l < w->nlocal; l++)
    if (buf[l]) {
      cudaSetDevice(w->dev[l]);
      world_nccl(w, ncclMemFree(buf[l]), NULL, "ncclMemFree (after the destroy)");
    }
  world_case_end(w);
}

/* ---- the matrix ------------------------------------------------------------------------------ */

static const gpu_op_t sym_all_ops[] = {GPU_OP_SUM,         GPU_OP_PROD,      GPU_OP_MAX,
                                       GPU_OP_MIN,         GPU_OP_AVG,       GPU_OP_PREMUL_SAME,
                                       GPU_OP_PREMUL_HOST, GPU_OP_PREMUL_DEV};
static const size_t sym_small_counts[] = {1, 2, 3, 7, 8, 1023, 4097};
static const size_t sym_large_counts[] = {65537, 262144 + 5};
static const ncclDataType_t sym_quick_types[] = {ncclInt8, ncclFloat16, ncclFloat32,
                                                 ncclFloat8e4m3};
static const gpu_op_t sym_quick_ops[] = {GPU_OP_SUM, GPU_OP_MAX, GPU_OP_AVG, GPU_OP_PREMUL_DEV};
static const size_t sym_quick_counts[] = {1, 7, 4097};
/*
 * Reduce-scatter receive counts: the small ones, and 1024 (whole packs for every type);
 * 262144 (whole packs) and SYM_RS_LARGEST (elements), large enough for several rounds.
 */
static const size_t sym_rs_counts[] = {1, 2, 3, 7, 8, 1023, 1024, 4097};
static const size_t sym_rs_large_counts[] = {262144, SYM_RS_LARGEST};
static const size_t sym_rs_quick_counts[] = {1, 8, 4097};

/*
 * The input's byte offset i (0..2) in its window: 0, then 4 (8 for the 8-byte types, which
 * no kernel loads from a 4-byte boundary), then 16 + 2 * sizeof(T).
 */
static size_t sym_offset(ncclDataType_t t, int i) {
  size_t size = ref_type(t)->size;
  return i == 0 ? 0 : i == 1 ? (size > 4 ? size : 4) : 16 + 2 * size;
}

/*
 * The reduce-scatters, after the all-reduces (case indices from *index on): every type and
 * operator at every small receive count in every layout, at all three offsets with sum and
 * at one offset (turning with the count, layout and operator) with the others; the large
 * counts with every type (sum) and float and bfloat16 (every operator), SYM_RS_LARGE_REPS
 * calls; float sum at BRAID_SYM_MAX_BYTES of input and one receive element past it; graphs
 * of three types and operators.
 */
static void suite_sym_scatter(struct gpu_world* w, size_t* index) {
  int quick = w->opts->quick;
  const ncclDataType_t* types = quick ? sym_quick_types : gpu_all_types;
  size_t ntypes = quick ? ARRAY_LEN(sym_quick_types) : ARRAY_LEN(gpu_all_types);
  const gpu_op_t* ops = quick ? sym_quick_ops : sym_all_ops;
  size_t nops = quick ? ARRAY_LEN(sym_quick_ops) : ARRAY_LEN(sym_all_ops);
  const size_t* counts = quick ? sym_rs_quick_counts : sym_rs_counts;
  size_t ncounts = quick ? ARRAY_LEN(sym_rs_quick_counts) : ARRAY_LEN(sym_rs_counts);
  for (size_t t = 0; t < ntypes; t++)
    for (size_t o = 0; o < nops; o++)
      for (size_t k = 0; k < ncounts; k++)
        for (int lay = 0; lay < SYM_LAYOUTS; lay++)
          for (int off = 0; off < 3; off++) {
            if (ops[o] != GPU_OP_SUM && (size_t)off != (k + o + (size_t)lay) % 3) continue;
            struct sym_case c = {.scatter = 1,
                                 .type = types[t],
                                 .op = ops[o],
                                 .count = counts[k],
                                 .offset = sym_offset(types[t], off),
                                 .layout = lay,
                                 .reps = quick ? 4 : SYM_REPS};
            sym_run(w, &c, (*index)++);
          }
  for (size_t k = 0; k < ARRAY_LEN(sym_rs_large_counts) && !quick; k++)
    for (size_t t = 0; t < ARRAY_LEN(gpu_all_types); t++)
      for (size_t o = 0; o < ARRAY_LEN(sym_all_ops); o++) {
        ncclDataType_t ty = gpu_all_types[t];
        gpu_op_t op = sym_all_ops[o];
        if (op != GPU_OP_SUM && ty != ncclFloat32 && ty != ncclBfloat16) continue;
        size_t in = sym_rs_large_counts[k] * ref_type(ty)->size * (size_t)w->nranks;
        int reps = SYM_RS_LARGE_REPS;
        while (reps > 2 && (size_t)reps * in > SYM_STAGE_BYTES) reps--;
        for (int lay = 0; lay < SYM_LAYOUTS; lay++) {
          struct sym_case c = {.scatter = 1,
                               .type = ty,
                               .op = op,
                               .count = sym_rs_large_counts[k],
                               .offset = sym_offset(ty, (int)(k + t + (size_t)lay) % 3),
                               .layout = lay,
                               .reps = reps};
          sym_run(w, &c, (*index)++);
        }
      }
  /* At BRAID_SYM_MAX_BYTES of input (symmetric) and one receive element past it (ordinary). */
  for (int past = 0; past < 2; past++) {
    long long m = sym.max_bytes;
    size_t part = 4 * (size_t)w->nranks; /* one float of every rank's part */
    int fits = m >= (long long)part && (size_t)m + part <= SYM_LIMIT_CAP && (size_t)m % part == 0;
    struct sym_case c = {.scatter = 1,
                         .type = ncclFloat32,
                         .op = GPU_OP_SUM,
                         .count = fits ? (size_t)m / part + (size_t)past : 1 + (size_t)past,
                         .layout = past ? SYM_RECV_PLAIN : SYM_INPLACE,
                         .reps = SYM_LIMIT_REPS};
    char name[sizeof w->case_name];
    snprintf(name, sizeof name, "Sym ReduceScatter f32 sum %s BRAID_SYM_MAX_BYTES mode=%s",
             past ? "one element past" : "at", w->opts->mode);
    if (!world_case_fits(w, name, fits && !quick,
                         "needs BRAID_SYM_MAX_BYTES set, a multiple of 4 x nranks, at most "
                         "64 MiB (and no --quick)"))
      continue;
    sym_run(w, &c, (*index)++);
  }
  /* Captured in a graph: packs (1024, at offset 0) and elements (7, 65537) in every layout. */
  {
    static const ncclDataType_t gtypes[] = {ncclFloat32, ncclBfloat16, ncclUint8};
    static const gpu_op_t gops[] = {GPU_OP_SUM, GPU_OP_AVG, GPU_OP_PREMUL_DEV};
    static const size_t gcounts[] = {7, 1024, 65537};
    for (size_t t = 0; t < (quick ? 1 : ARRAY_LEN(gtypes)); t++)
      for (size_t o = 0; o < ARRAY_LEN(gops); o++)
        for (size_t k = 0; k < (quick ? 2 : ARRAY_LEN(gcounts)); k++)
          for (int lay = 0; lay < SYM_LAYOUTS; lay++) {
            int off = gcounts[k] == 1024 ? 0 : (int)(k + (size_t)lay) % 3;
            struct sym_case c = {.scatter = 1,
                                 .type = gtypes[t],
                                 .op = gops[o],
                                 .count = gcounts[k],
                                 .offset = sym_offset(gtypes[t], off),
                                 .layout = lay,
                                 .graph = 1};
            sym_run(w, &c, (*index)++);
          }
  }
}

void suite_sym(struct gpu_world* w) {
  int quick = w->opts->quick;
  const ncclDataType_t* types = quick ? sym_quick_types : gpu_all_types;
  size_t ntypes = quick ? ARRAY_LEN(sym_quick_types) : ARRAY_LEN(gpu_all_types);
  const gpu_op_t* ops = quick ? sym_quick_ops : sym_all_ops;
  size_t nops = quick ? ARRAY_LEN(sym_quick_ops) : ARRAY_LEN(sym_all_ops);
  const size_t* counts = quick ? sym_quick_counts : sym_small_counts;
  size_t ncounts = quick ? ARRAY_LEN(sym_quick_counts) : ARRAY_LEN(sym_small_counts);
  size_t index = 0;
  sym_setup(w);
  /* Every type, operator, small count, offset and layout. */
  for (size_t t = 0; t < ntypes; t++)
    for (size_t o = 0; o < nops; o++)
      for (size_t k = 0; k < ncounts; k++)
        for (int off = 0; off < 3; off++)
          for (int lay = 0; lay < SYM_LAYOUTS; lay++) {
            struct sym_case c = {.type = types[t],
                                 .op = ops[o],
                                 .count = counts[k],
                                 .offset = sym_offset(types[t], off),
                                 .layout = lay,
                                 .reps = quick ? 4 : SYM_REPS};
            sym_run(w, &c, index++);
          }
  /*
   * The large counts: every type with sum, and every operator with float and bfloat16, each
   * in the three layouts, at one offset each (float sum: every offset in every layout).
   */
  for (size_t k = 0; k < ARRAY_LEN(sym_large_counts) && !quick; k++) {
    for (size_t t = 0; t < ARRAY_LEN(gpu_all_types); t++)
      for (size_t o = 0; o < ARRAY_LEN(sym_all_ops); o++) {
        ncclDataType_t ty = gpu_all_types[t];
        gpu_op_t op = sym_all_ops[o];
        int wide = ty == ncclFloat32 || ty == ncclBfloat16;
        if (op != GPU_OP_SUM && !wide) continue;
        for (int lay = 0; lay < SYM_LAYOUTS; lay++)
          for (int off = 0; off < 3; off++) {
            if (!(ty == ncclFloat32 && op == GPU_OP_SUM) && off != lay) continue;
            struct sym_case c = {.type = ty,
                                 .op = op,
                                 .count = sym_large_counts[k],
                                 .offset = sym_offset(ty, off),
                                 .layout = lay,
                                 .reps = SYM_LARGE_REPS};
            sym_run(w, &c, index++);
          }
      }
  }
  /*
   * At BRAID_SYM_MAX_BYTES (symmetric) and one element past it (ordinary): float sum, when
   * it is set and at most SYM_LIMIT_CAP (skipped otherwise; every process skips alike).
   */
  for (int past = 0; past < 2; past++) {
    long long m = sym.max_bytes;
    int fits = m >= 4 && (size_t)m + 4 <= SYM_LIMIT_CAP && m % 4 == 0;
    struct sym_case c = {.type = ncclFloat32,
                         .op = GPU_OP_SUM,
                         .count = fits ? (size_t)m / 4 + (size_t)past : 1 + (size_t)past,
                         .layout = past ? SYM_RECV_PLAIN : SYM_INPLACE,
                         .reps = SYM_LIMIT_REPS};
    char name[sizeof w->case_name];
    snprintf(name, sizeof name, "Sym AllReduce f32 sum %s BRAID_SYM_MAX_BYTES mode=%s",
             past ? "one element past" : "at", w->opts->mode);
    if (!world_case_fits(w, name, fits && !quick,
                         "needs BRAID_SYM_MAX_BYTES set, a multiple of 4, at most 64 MiB "
                         "(and no --quick)"))
      continue;
    sym_run(w, &c, index++);
  }
  /* Captured in a graph: a few types and operators, every count class and layout. */
  {
    static const ncclDataType_t gtypes[] = {ncclFloat32, ncclBfloat16, ncclInt32, ncclUint8,
                                            ncclFloat64};
    static const gpu_op_t gops[] = {GPU_OP_SUM, GPU_OP_AVG, GPU_OP_MAX, GPU_OP_PREMUL_DEV};
    static const size_t gcounts[] = {7, 4097, 65537};
    for (size_t t = 0; t < ARRAY_LEN(gtypes); t++)
      for (size_t o = 0; o < ARRAY_LEN(gops); o++)
        for (size_t k = 0; k < (quick ? 2 : ARRAY_LEN(gcounts)); k++)
          for (int lay = 0; lay < SYM_LAYOUTS; lay++) {
            struct sym_case c = {.type = gtypes[t],
                                 .op = gops[o],
                                 .count = gcounts[k],
                                 .offset = sym_offset(gtypes[t], (int)(k + (size_t)lay) % 3),
                                 .layout = lay,
                                 .graph = 1};
            if (quick && t > 1) continue;
            sym_run(w, &c, index++);
          }
  }
  suite_sym_scatter(w, &index);
  sym_teardown(w);
  sym_destroy_registered(w);
}
