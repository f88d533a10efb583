/*
 * Helper threads that launch one group's kernels on several GPUs at once.
 *
 * One thread driving several GPUs (nccl-tests' -g, torch.nn.DataParallel, a JAX-style
 * single-process program) ends a group with one launch per GPU; one after another they cost
 * a launch each (~4-5 us on H100/H200), so four GPUs took 17-24 us a call where the kernels
 * need ~6 (docs/tuning.md, BRAID_LAUNCH_THREADS). The pool keeps one helper per GPU of the
 * process: the caller hands each helper its GPU's launch and makes the first one itself, and
 * the group end returns when every launch is out.
 *
 * A helper spins a short while after each launch (the next group comes soon in a loop of
 * calls), yielding its CPU now and then, then sleeps until handed work. A helper that another
 * thread's group is using is not waited for: that launch runs on the calling thread. Helpers
 * live as long as the process (the library is not meant to be unloaded while they do).
 */
#ifndef BRAID_RUNTIME_LAUNCH_POOL_H
#define BRAID_RUNTIME_LAUNCH_POOL_H

#include "base/error.h"
#include "nccl.h"

struct ncclComm;

/* One launch: fn(comm)'s result, and its message when it failed (the helper's own). */
struct launch_job {
  struct ncclComm* comm;
  ncclResult_t res;
  char msg[BRAID_ERROR_MAX];
};

/* One launch; `ctx` is what the caller passed to launch_pool_run, the same for every job. */
typedef ncclResult_t (*launch_pool_fn)(struct ncclComm* comm, const void* ctx);

/* The most jobs of one call (a group on more GPUs launches one after another). */
#define LAUNCH_POOL_MAX_JOBS 16

/*
 * Runs fn on each of jobs[0..n), n <= LAUNCH_POOL_MAX_JOBS: jobs[0] on the calling thread, each other one on the helper
 * of its comm's device (started at its first use), or on the calling thread when that helper
 * is busy or cannot start. Returns when all are done; every job's res and, for a failure,
 * msg are set. The comms must be on distinct devices.
 */
void launch_pool_run(struct launch_job* jobs, int n, launch_pool_fn fn, const void* ctx);

/*
 * The CPUs this process may run on (its affinity mask when it was first asked): the helpers
 * and the caller spin while a call is out, so a group uses them only with a CPU to spare.
 */
int launch_pool_cpus(void);

#endif
