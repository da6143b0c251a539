/* common.h - what every probe and user space share: the probe version, the read kinds, the
 * histogram sizes.
 * Bump ENGRAMPROF_PROBE_VERSION when a record struct of any probe/<p>.h changes.
 */
#ifndef ENGRAMPROF_COMMON_H
#define ENGRAMPROF_COMMON_H

#define ENGRAMPROF_PROBE_VERSION 2

#define SYSCALL_PREADV2 0
#define SYSCALL_PREADV  1
#define SYSCALL_PREAD64 2
#define SYSCALL_FAULT   3  /* not a syscall: the name of page-fault read events (probes/faults.bpf.c) */
#define SYSCALL_READ    4  /* read(): from the file position at entry */
#define SYSCALL_READV   5  /* readv() */

#define LAT_SLOTS 40       /* log2(ns) latency histogram slots: up to 2^40 ns (~18 min) */
#define FD_SLOTS  512      /* per-fd histograms for fd 0..510; fd >= 511 share slot 511 */

#endif
