/*
 * Starting N ranks on one host and sharing the NCCL unique id, without MPI.
 *
 * An example that uses one process per GPU calls, in this order:
 *
 *   example_world_init()       find out who we are: under mpirun the rank and the
 *                              number of ranks come from the launcher's environment
 *                              (Open MPI's OMPI_COMM_WORLD_*, MPICH's PMI_RANK and
 *                              PMI_SIZE); otherwise the program forks --nranks N
 *                              copies of itself (default 2) and the parent only
 *                              waits for them. No CUDA call happens before the fork.
 *   example_gpu_select()       pick and set this rank's GPU, or exit with status 77
 *                              when the host has fewer GPUs than ranks.
 *   example_unique_id_share()  rank 0 creates the ncclUniqueId, every rank gets it:
 *                              through pipes made before the fork, or, under mpirun,
 *                              through a file in /tmp named after the job (override
 *                              with --id-file PATH, on a shared file system when the
 *                              ranks span several hosts).
 *   ncclCommInitRank()
 *   example_unique_id_done()   rank 0 removes the id file, once every rank has joined.
 */
#ifndef EXAMPLES_LAUNCH_H
#define EXAMPLES_LAUNCH_H

#include <nccl.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  const char* prog; /* program name, for messages */
  int rank;
  int nranks;
  int local_rank; /* among the ranks on this host */
  int local_nranks;
  int self_launched; /* 1: forked by this program, 0: started by mpirun */
  int* id_fds;       /* self-launched: rank 0 holds the write ends, others one read end */
  char id_path[512]; /* under mpirun: the file that carries the unique id */
} example_world_t;

/* Fills *w. In the self-launching case the parent process never returns from
 * here: it exits with the children's combined status (0, 77 when they skipped,
 * otherwise the first failure's status). */
void example_world_init(example_world_t* w, int argc, char** argv);

/* Sets this rank's CUDA device and returns its index; exits with
 * EXAMPLE_EXIT_SKIP, saying why, when there are not enough GPUs. */
int example_gpu_select(example_world_t* w);

void example_unique_id_share(example_world_t* w, ncclUniqueId* id);
void example_unique_id_done(example_world_t* w);

/* The value after option `name` in argv ("--steps 20"), or NULL. */
const char* example_arg(int argc, char** argv, const char* name);

/* Exits with status 2 and a usage line when argv holds an option that is not
 * in `known` (a NULL-terminated list) or an option without its value. Every
 * option takes one value. Programs that call example_world_init() list the
 * launch options --nranks and --id-file among theirs. */
void example_args_check(int argc, char** argv, const char* const* known, const char* usage);

#ifdef __cplusplus
}
#endif

#endif /* EXAMPLES_LAUNCH_H */
