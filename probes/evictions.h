/* evictions.h - the eviction probe's records (probes/evictions.bpf.c).
 *
 * Only what the probe and user space share: engramprof/bpf/structs.py parses these structs
 * into the numpy dtypes it decodes the ring with and checks them against what clang compiled.
 * Fixed-width types only, explicit padding, 8-byte multiples.
 */
#ifndef ENGRAMPROF_EVICTIONS_H
#define ENGRAMPROF_EVICTIONS_H

#include "common.h"

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
