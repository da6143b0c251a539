/* sched.h - the sched probe's off-CPU records (probes/sched.bpf.c).
 *
 * Only what the probe and user space share: engramprof/bpf/structs.py parses these structs
 * into the numpy dtypes it decodes the ring with and checks them against what clang compiled.
 * Fixed-width types only, explicit padding, 8-byte multiples.
 */
#ifndef ENGRAMPROF_SCHED_H
#define ENGRAMPROF_SCHED_H

#include "common.h"

/* One off-CPU span of a target thread (probes/sched.bpf.c): switched out at start_ns, back on a
 * CPU at end_ns.  Written once, at the switch-in, into the `offcpu_records` ring. */
struct offcpu_record {
	u64 start_ns;     /* sched_switch, prev = the thread (CLOCK_MONOTONIC) */
	u64 end_ns;       /* sched_switch, next = the thread */
	u32 tid;
	s32 waker_tid;    /* the task that woke it (sched_waking / sched_wakeup_new); -1: not seen */
	s32 waker_pid;    /* its tgid; -1: not seen */
	u32 preempted;    /* 1: switched out while runnable (waited for a CPU); 0: went to sleep */
};

/* Totals of the sched probe, kept in the kernel (per CPU). */
struct offcpu_totals {
	u64 spans;         /* spans ended (recorded or lost) */
	u64 preempted;     /* of which preempted */
	u64 woken;         /* of which with a waker seen */
	u64 lost_records;  /* offcpu_records ring full: span dropped (still counted here) */
	u64 no_state;      /* span state map full at a switch-out: span not tracked */
	u64 sum_ns;        /* total off-CPU ns of the spans ended */
};

#endif
