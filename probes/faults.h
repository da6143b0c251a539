/* faults.h - the page-fault probe's records (probes/faults.bpf.c).
 *
 * Only what the probe and user space share: engramprof/bpf/structs.py parses these structs
 * into the numpy dtypes it decodes the ring with and checks them against what clang compiled.
 * Fixed-width types only, explicit padding, 8-byte multiples.
 */
#ifndef ENGRAMPROF_FAULTS_H
#define ENGRAMPROF_FAULTS_H

#include "common.h"

#define FAULT_MAJOR       1   /* the kernel's major fault (mm_account_fault): a pass found the page missing
                               * (FAULT_MISSING: VM_FAULT_MAJOR) or a pass under the mmap lock was
                               * retried (FAULT_LOCK_RETRY: FAULT_FLAG_TRIED); docs/model.md */
#define FAULT_INDEX_EXACT 2   /* index is the faulting page (mm_filemap_fault); else the first page of
                               * the fault-around window (a fault served by mm_filemap_map_pages alone) */
#define FAULT_RETRIED     4   /* took more than one pass (VM_FAULT_RETRY): not by itself major */
#define FAULT_ADDRESS     8   /* address is the faulting user address (exceptions:page_fault_user) */
#define FAULT_SLEPT       16  /* switched out (voluntarily) inside the fault */
#define FAULT_END_RSEQ    32  /* ended at rseq_update: the return to user space itself */
#define FAULT_MISSING     64  /* ->fault() found the page missing from the page cache (VM_FAULT_MAJOR):
                               * sync readahead / read-around ran, or the faulting page was inserted */
#define FAULT_ASYNC_RA    128 /* started async readahead (a page with the readahead marker) */
#define FAULT_LOCK_RETRY  256 /* a pass under the mmap lock reached ->fault() and the fault took the
                               * lock again: that pass returned VM_FAULT_RETRY (the next is TRIED) */
#define FAULT_KERNEL_MODE 512 /* taken in kernel mode on a user address (a syscall copying a mapping) */

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
	u64 missing;       /* faults that found their page missing (FAULT_MISSING) */
	u64 lock_retried;  /* faults with a retried pass under the mmap lock (FAULT_LOCK_RETRY) */
	u64 async_ra;      /* faults that started async readahead (FAULT_ASYNC_RA) */
	u64 fault_around;  /* faults served by fault-around alone (mm_filemap_map_pages, no ->fault()) */
	u64 no_state;      /* filemap events of a thread the per-thread table had no room for: not counted */
	u64 kernel_mode_faults; /* exceptions:page_fault_kernel of the target on user addresses */
};

#endif
