/* pagecache.h - the page-cache probe's records (probes/pagecache.bpf.c).
 *
 * Only what the probe and user space share (user space decodes these records), as in
 * libbpf-tools.  Fixed-width types only, explicit padding, 8-byte multiples.
 */
#ifndef ENGRAMPROF_PAGECACHE_H
#define ENGRAMPROF_PAGECACHE_H

#include "common.h"

#define PC_INSERT       0
#define PC_RA_SYNC      1
#define PC_RA_ASYNC     2
#define PC_RA_ORDER     3
#define PC_RA_UNBOUNDED 4
#define PC_HINT         5

#define PCF_TARGET  1   /* written in a target thread's context */
#define PCF_IN_HINT 2   /* inside a target's hint syscall (fadvise / madvise / readahead) */
#define PCF_OPEN    4   /* a run still open when user space read it (end of the recording) */

#define HINT_FADVISE   1
#define HINT_MADVISE   2
#define HINT_READAHEAD 3

/* madvise behaviours recorded: NORMAL 0, RANDOM 1, SEQUENTIAL 2, WILLNEED 3, DONTNEED 4,
 * COLD 20, PAGEOUT 21, POPULATE_READ 22 (bit n = behaviour n) */
#define HINT_MADV_MASK ((1ULL << 0) | (1ULL << 1) | (1ULL << 2) | (1ULL << 3) | (1ULL << 4) | \
                        (1ULL << 20) | (1ULL << 21) | (1ULL << 22))

struct pagecache_record {
	u64 ts_ns;        /* CLOCK_MONOTONIC: first insertion of a run; the tracepoint; hint entry */
	u64 dur_ns;       /* a run: first -> last insertion; a hint: entry -> exit; else 0 */
	u64 ino;          /* inode (0 for a hint: the fd / address says which file) */
	u64 index;        /* first page of the run / readahead window; a hint: offset or address */
	u64 count;        /* pages of the run / window; a hint: length in bytes (0 = to the end) */
	u64 extra;        /* readahead: async_size (pages); ra_pages in the upper 32 bits; hint: advice */
	s64 ret;          /* a hint's return value; 0 otherwise */
	u32 pid;
	u32 tid;
	u32 dev;          /* kernel dev_t (major << 20 | minor); 0 for a hint */
	s32 fd;           /* a hint's fd (-1 for madvise); -1 otherwise */
	u16 kind;         /* PC_* */
	u16 flags;        /* PCF_* */
	u16 call;         /* HINT_* for a hint; 0 otherwise */
	u16 __pad0;
};

struct pagecache_totals {
	u64 inserted_pages;   /* pages inserted into watched files (in runs written or open) */
	u64 target_pages;     /* of which by a target thread */
	u64 runs;             /* run records written */
	u64 readahead;        /* readahead records written */
	u64 hints;            /* hint records written */
	u64 lost_records;     /* ring full: record dropped (its pages still counted above) */
	u64 watched_full;     /* a file could not be watched: watched_files full */
	u64 runs_untracked;   /* open_runs full: an insertion written as its own run */
};

#endif
