/*
 * The main of every benchmark: CMake compiles this file once per program
 * with PERF_COLL naming that program's ops table (e.g. perf_coll_all_reduce).
 */
#include "common.h"

#ifndef PERF_COLL
#error "PERF_COLL must name a collective's ops table, e.g. -DPERF_COLL=perf_coll_all_reduce"
#endif

int main(int argc, char** argv) { return perf_main(&PERF_COLL, argc, argv); }
