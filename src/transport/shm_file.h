/*
 * The files behind the SHM transport's FIFOs, without CUDA: their names, making one, opening
 * one (which removes its name), and removing what dead processes left behind.
 *
 * A name says who made the file: "braid-<pid namespace>-<pid>-<start time>-..." (the first
 * and third in hex; the start time as braid_process_start reads it). A later process of the
 * same pid namespace can then tell a live maker from a dead one, and remove only the dead
 * one's files (shm_file_sweep).
 */
#ifndef BRAID_TRANSPORT_SHM_FILE_H
#define BRAID_TRANSPORT_SHM_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

#define SHM_FILE_PREFIX "braid-"
#define SHM_FILE_NAME_MAX 128

/*
 * Writes "/braid-<pid_ns>-<pid>-<start>-r<rank>-p<peer>-c<channel>-<nonce>" (shm_open's form,
 * with the leading slash); an error when it does not fit.
 */
ncclResult_t shm_file_name(char* out, size_t size, uint64_t pid_ns, int pid, uint64_t start,
                           int rank, int peer, int channel, uint32_t nonce);

/*
 * Parses a name of /dev/shm (without the slash) made by shm_file_name: 1 with its maker's
 * pid namespace, pid and start time; 0 for any other name.
 */
int shm_file_parse(const char* name, uint64_t* pid_ns, int* pid, uint64_t* start);

/*
 * Creates the file `name` (shm_open's form) of `bytes`, every byte zero and backed now
 * (posix_fallocate: a /dev/shm too small fails here, with the size it needs); *fd open.
 */
ncclResult_t shm_file_create(const char* name, size_t bytes, int* fd);

/*
 * Opens the file `name` another process created, checks it has `bytes`, and removes its name
 * at once: both ends then hold it through a descriptor or a mapping, and nothing of it is
 * left in /dev/shm when either process dies. *fd open.
 */
ncclResult_t shm_file_open_unlink(const char* name, size_t bytes, int* fd);

/*
 * Removes the files of directory `dir` (normally "/dev/shm") whose maker, a process of pid
 * namespace `pid_ns`, is gone (braid_process_gone with its start time). Files of other pid
 * namespaces, of live makers, of an unknown start time, and every other name are kept.
 * Returns how many it removed.
 */
int shm_file_sweep(const char* dir, uint64_t pid_ns);

#endif
