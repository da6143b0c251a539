/* engramprof.h - every record the probes share with user space, in one text.
 *
 * Each probe includes its own header (probes/<p>.h, as in libbpf-tools); this one includes them
 * all, for the struct parser (engramprof/bpf/structs.py header_text) and for a probe source of
 * an older checkout built by the benchmarks' before arms.
 */
#ifndef ENGRAMPROF_H
#define ENGRAMPROF_H

#include "common.h"
#include "syscalls.h"
#include "faults.h"
#include "sched.h"
#include "evictions.h"

#endif
