/* engramprof.h - records shared by the BPF programs and user space.
 *
 * engramprof/bpf/layout.py parses the structs below to build the numpy dtypes it decodes
 * ring-buffer memory with, and checks them at load time against the layout clang actually
 * compiled (the *_layout maps).  Keep: fixed-width types only, explicit padding, 8-byte
 * multiples.  Bump ENGRAMPROF_PROBE_VERSION when a struct changes.
 */
#ifndef ENGRAMPROF_H
#define ENGRAMPROF_H

#define ENGRAMPROF_PROBE_VERSION 1

#define SYSCALL_PREADV2 0
#define SYSCALL_PREADV  1
#define SYSCALL_PREAD64 2
#define SYSCALL_FAULT   3  /* not a syscall: the name of page-fault read events (probes/faults.bpf.c) */

#define LAT_SLOTS 40       /* log2(ns) latency histogram slots: up to 2^40 ns (~18 min) */
#define FD_SLOTS  512      /* per-fd histograms for fd 0..510; fd >= 511 share slot 511 */

/* One completed read call: written once, at syscall exit, into the `call_records` ring. */
struct call_record {
	u64 ts_ns;        /* entry, CLOCK_MONOTONIC (bpf_ktime_get_ns) */
	u64 dur_ns;       /* entry -> exit */
	s64 offset;       /* file offset; -1 = current position (preadv2 only) */
	u64 size;         /* bytes requested (sum of iov_len, first MAX_IOV iovecs) */
	s64 ret;          /* bytes read, or -errno */
	u64 flags;        /* RWF_* (preadv2), 0 otherwise */
	u64 offcpu_ns;    /* time switched out during the call (includes runq_ns) */
	u64 runq_ns;      /* of which runnable, waiting for a CPU */
	u64 reclaim_ns;   /* direct + memcg reclaim inside the call, on this thread */
	u64 bio_ns;       /* sum of queue -> complete of bios this thread queued in the call */
	u32 pid;          /* tgid */
	u32 tid;
	s32 fd;
	u32 pages_added;  /* page-cache insertions on this thread during the call */
	u32 bio_count;    /* bios queued on this thread during the call */
	u16 syscall;      /* SYSCALL_* */
	u16 __pad0;
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
};

#define VM_KSWAPD_WAKE  0
#define VM_KSWAPD_SLEEP 1

/* A system-wide memory event (kswapd woken / going to sleep), for the kswapd spans. */
struct vm_event {
	u64 ts_ns;
	s32 nid;
	u32 kind;         /* VM_* */
};

/* ---- page faults (probes/faults.bpf.c) ---- */

#define FAULT_MAJOR       1   /* inserted pages into the page cache, or was retried (FAULT_FLAG_TRIED) */
#define FAULT_INDEX_EXACT 2   /* index is the faulting page (mm_filemap_fault); else the first page of
                               * the fault-around window (a fault served by mm_filemap_map_pages alone) */
#define FAULT_RETRIED     4   /* a filemap event after sleeping: the VM_FAULT_RETRY second pass */
#define FAULT_ADDRESS     8   /* address is the faulting user address (exceptions:page_fault_user) */
#define FAULT_SLEPT       16  /* switched out (voluntarily) inside the fault */
#define FAULT_END_RSEQ    32  /* ended at rseq_update: the return to user space itself */

/* One file-backed page fault of a target thread: written when the fault is closed (by the
 * thread's next fault, syscall entry, return to user after a sleep, or a preemption). */
struct fault_record {
	u64 ts_ns;        /* entry: page_fault_user, else the fault's first filemap event */
	u64 dur_ns;       /* entry -> the fault's last in-fault event (docs/model.md "Page faults") */
	u64 address;      /* faulting user address, 0 = unknown */
	u64 index;        /* file page index (see FAULT_INDEX_EXACT) */
	u64 ino;          /* inode of the mapped file */
	u64 map_first;    /* the last fault-around window (mm_filemap_map_pages), first page */
	u64 offcpu_ns;    /* switched-out time inside the fault (includes runq_ns) */
	u64 runq_ns;      /* of which runnable, waiting for a CPU */
	u64 reclaim_ns;   /* direct + memcg reclaim inside the fault */
	u64 bio_ns;       /* queue -> complete of bios the fault queued that completed while it was open */
	u32 pid;
	u32 tid;
	u32 dev;          /* kernel dev_t of the file's superblock: major << 20 | minor */
	u32 pages_added;  /* page-cache insertions on this thread during the fault */
	u32 bio_count;    /* bios queued on this thread during the fault */
	u32 mapped_pages; /* pages of that fault-around window (0: no fault-around event) */
	u16 flags;        /* FAULT_* */
	u16 __pad0;
	u32 __pad1;
};

struct fault_totals {
	u64 faults;        /* file-backed faults closed (recorded or lost) */
	u64 major;
	u64 retried;
	u64 lost_records;  /* fault ring full */
	u64 sum_ns;
	u64 max_ns;
	u64 user_faults;   /* exceptions:page_fault_user of the target (0 when not hooked) */
	u64 other_faults;  /* of those, no filemap event: anonymous, COW of a mapped page, spurious */
	u64 bios_untracked; /* bios queued in a fault whose bio-table slot another bio held (probes/bios.h):
	                     * in bio_count, never in bio_ns */
};

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

/* ---- evictions of the traced files' pages (probes/evictions.bpf.c) ---- */

#define EVICT_UNKNOWN  0   /* no context seen: another syscall, a kernel thread other than kswapd */
#define EVICT_KSWAPD   1   /* kswapd (global reclaim) */
#define EVICT_DIRECT   2   /* inside mm_vmscan_direct_reclaim_begin..end of the removing task */
#define EVICT_MEMCG    3   /* inside mm_vmscan_memcg_reclaim_begin..end of the removing task */
#define EVICT_FADVISE  4   /* inside fadvise64(POSIX_FADV_DONTNEED) */
#define EVICT_WRITE    5   /* inside a write() of 1-3 bytes starting with a digit: drop_caches */
#define EVICT_TRUNCATE 6   /* inside truncate, ftruncate, fallocate, unlink, unlinkat */
#define EVICT_MADVISE  7   /* inside madvise / process_madvise(MADV_PAGEOUT or MADV_REMOVE) */
#define EVICT_PROACTIVE 8  /* no context, and the task is DAMON's kdamond (proactive reclaim) */

#define EVICT_BY_TARGET 1  /* flags: the removing task is one of the traced processes */

/* One removal of a watched file's page (folio) from the page cache. */
struct eviction_record {
	u64 ts_ns;        /* CLOCK_MONOTONIC */
	u64 ino;          /* inode of the file */
	u64 index;        /* first page index of the folio */
	u64 cgroup_id;    /* cgroup2 id of the removing task (bpf_get_current_cgroup_id) */
	u64 ctx_ns;       /* when the removing context began (reclaim or syscall entry); 0 = none */
	u64 comm_lo;      /* the removing task's comm: 16 bytes, NUL padded */
	u64 comm_hi;
	u32 dev;          /* kernel dev_t of the file's superblock: major << 20 | minor */
	u32 pid;          /* tgid of the removing task */
	u32 tid;
	u32 pages;        /* 1 << folio order */
	s32 fd;           /* the syscall's fd (fadvise, write, ftruncate, fallocate); -1 */
	u16 context;      /* EVICT_* */
	u16 flags;        /* EVICT_BY_TARGET */
};

struct eviction_totals {
	u64 evictions;     /* removals of watched pages seen (recorded or lost) */
	u64 pages;
	u64 lost_records;  /* eviction ring full: record dropped (still counted here) */
	u64 ctx_kswapd;    /* pages per context, exact even when records were lost */
	u64 ctx_direct;
	u64 ctx_memcg;
	u64 ctx_fadvise;
	u64 ctx_write;
	u64 ctx_truncate;
	u64 ctx_madvise;
	u64 ctx_proactive;
	u64 ctx_unknown;
	u64 no_state;      /* context map full at a reclaim / syscall entry: context not tracked */
};

#endif
