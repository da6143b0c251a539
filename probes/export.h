/* export.h - what the exporter's probe keeps for user space (probes/export.bpf.c): per-file read stats, totals.
 *
 * Only what the probe and user space share (user space decodes these records), as in
 * libbpf-tools.  Fixed-width types only, explicit padding, 8-byte multiples.
 */
#ifndef ENGRAMPROF_EXPORT_H
#define ENGRAMPROF_EXPORT_H

#include "common.h"
#include "syscalls.h"

#define READ_KIND_SYSCALL 0
#define READ_KIND_FAULT   1
#define READ_KIND_IO_URING 2  /* kept by probes/uring.bpf.c compiled with EXPORT_MODE */
#define READ_KIND_LIBAIO  3   /* kept by probes/libaio.bpf.c compiled with EXPORT_MODE */
/* (the codes are the trace format's READ_KINDS, engramprof/trace/schema.py) */

/* ---- what user space reads ---- */

struct read_key {
	u64 ino;          /* 0: not known (no page-cache lookup in the call, fd never seen) */
	u32 dev;          /* kernel dev_t: major << 20 | minor */
	u16 kind;         /* READ_KIND_* */
	u16 __pad0;
};

struct read_stats {
	u64 reads;        /* calls (syscall), filemap faults (fault), requests (io_uring), iocbs (libaio) */
	u64 bytes;        /* bytes returned (syscall reads with ret > 0) */
	u64 eagain;       /* calls that returned -EAGAIN */
	u64 misses;       /* reads that inserted at least one page into the page cache */
	u64 pages_added;  /* pages inserted by the thread during the read */
	u64 bio_count;    /* bios queued by the thread during the read */
	u64 bio_ns;       /* queue -> complete of those bios that completed while the call was in flight */
	u64 reclaim_ns;   /* direct + memcg reclaim inside the read */
	u64 offcpu_ns;    /* switched out inside the read (includes runq_ns) */
	u64 runq_ns;      /* of which runnable, waiting for a CPU */
	u64 sum_ns;       /* sum of latencies (syscall) */
	u64 latency_log2[LAT_SLOTS];  /* slot i: latency in [2^i, 2^(i+1)) ns (slot 0 also 0-1 ns) */
};

struct export_totals {
	u64 syscall_reads;  /* every traced call (also those on files beyond MAX_READ_FILES) */
	u64 faults;
	u64 sampled;        /* records written to sample_records */
	u64 unsampled;      /* calls after the window's budget was spent: aggregated only */
	u64 sample_lost;    /* ring full: record dropped */
	u64 files_overflow; /* read_stats_by_file full: read counted here only */
	u64 bios_untracked; /* bios queued in a syscall read whose bio-table slot another bio held
			     * (probes/bios.h): in the read's bio_count, not in its bio_ns */
	u64 nonregular_skipped; /* read() / readv() of a pipe, socket, tty or pseudo-filesystem file:
				 * not a table read, not aggregated */
};

#endif
