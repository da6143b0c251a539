/* syscalls.h - the syscall read probe's records (probes/syscalls.bpf.c).
 *
 * Only what the probe and user space share: engramprof/bpf/structs.py parses these structs
 * into the numpy dtypes it decodes the ring with and checks them against what clang compiled.
 * Fixed-width types only, explicit padding, 8-byte multiples.
 */
#ifndef ENGRAMPROF_SYSCALLS_H
#define ENGRAMPROF_SYSCALLS_H

#include "common.h"

/* One completed read call: written once, at syscall exit, into the `call_records` ring. */
struct call_record {
	u64 ts_ns;        /* entry, CLOCK_MONOTONIC (bpf_ktime_get_ns) */
	u64 dur_ns;       /* entry -> exit */
	s64 offset;       /* file offset; -1 = current position (preadv2 only); read() / readv(): f_pos at entry */
	u64 size;         /* bytes requested (sum of iov_len, first MAX_IOV iovecs) */
	s64 ret;          /* bytes read, or -errno */
	u64 flags;        /* RWF_* (preadv2), 0 otherwise */
	u64 offcpu_ns;    /* time switched out during the call (includes runq_ns) */
	u64 runq_ns;      /* of which runnable, waiting for a CPU */
	u64 reclaim_ns;   /* direct + memcg reclaim inside the call, on this thread */
	u64 bio_ns;       /* sum of queue -> complete of bios this thread queued in the call */
	u64 ino;          /* the file the fd named at entry (probes/targets.h fd_file_walk); 0: not known */
	u32 pid;          /* tgid */
	u32 tid;
	s32 fd;
	u32 pages_added;  /* page-cache insertions on this thread during the call */
	u32 bio_count;    /* bios queued on this thread during the call */
	u32 dev;          /* its superblock's s_dev, the kernel's encoding (major << 20 | minor) */
	u16 syscall;      /* SYSCALL_* */
	u8 direct;        /* the fd's f_flags had O_DIRECT at entry: the page cache was bypassed */
	u8 __pad0;
	u32 __pad1;
};

/* Totals kept in the kernel, so the summary is right even when records were lost. */
struct call_totals {
	u64 calls;
	u64 eagain;
	u64 nowait;        /* calls with RWF_NOWAIT */
	u64 lost_records;  /* ring buffer full: record dropped (call still counted here) */
	u64 filtered;      /* shorter than MIN_NS: counted, not recorded */
	u64 sum_ns;
	u64 max_ns;
	u64 vm_events_lost; /* vm_events ring full */
	u64 bios_untracked; /* bios queued in a call whose bio-table slot another bio held (probes/bios.h):
	                     * in bio_count, never in bio_ns or the bio latency histogram */
	u64 nonregular_skipped; /* read() / readv() of a target on a file that is not a regular file
	                         * (pipe, socket, tty, procfs...): not a table read, not an event */
};

#define VM_KSWAPD_WAKE  0
#define VM_KSWAPD_SLEEP 1

/* A system-wide memory event (kswapd woken / going to sleep), for the kswapd spans. */
struct vm_event {
	u64 ts_ns;
	s32 nid;
	u32 kind;         /* VM_* */
};

#endif
