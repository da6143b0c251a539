/* readstats.h - what `engramprof export` keeps in the kernel for each read path: per-file read
 * aggregates and the window's sample budget.  One definition for the three programs that count
 * reads for it: probes/export.bpf.c (syscall reads, page faults), and probes/uring.bpf.c /
 * probes/libaio.bpf.c compiled with EXPORT_MODE (io_uring requests, libaio iocbs).  Each program
 * is its own BPF object, so each has its own maps of these names; user space reads them the same
 * way (engramprof/bpf/readstats.py).
 *
 *   read_stats_by_file  (file, kind) -> struct read_stats (probes/export.h), per CPU: counters and
 *                       a log2(ns) latency histogram, added to once per read
 *   sample_budget       records the window's sample may still take: user space sets it to N at
 *                       each window start; each sampled read takes one
 *
 * Constants (-D): MAX_READ_FILES  entries of read_stats_by_file.
 */
#ifndef ENGRAMPROF_READSTATS_H
#define ENGRAMPROF_READSTATS_H

/* struct read_key, struct read_stats, READ_KIND_* */
#include "export.h"

BPF_PERCPU_HASH(read_stats_by_file, struct read_key, struct read_stats, MAX_READ_FILES);
BPF_PERCPU_ARRAY(read_stats_zero, struct read_stats, 1);   /* never written: the initial value */
BPF_ARRAY(sample_budget, s64, 1);

/* The file's entry, made on its first read; 0 when the map is full (the caller counts it). */
static __always_inline struct read_stats *read_stats_of(struct read_key *k)
{
	struct read_stats *st = read_stats_by_file.lookup(k);
	if (st)
		return st;
	int zero = 0;
	struct read_stats *init = read_stats_zero.lookup(&zero);
	if (!init)
		return 0;
	read_stats_by_file.update(k, init);
	return read_stats_by_file.lookup(k);
}

/* one read's latency: its sum and its log2(ns) slot */
static __always_inline void read_stats_latency(struct read_stats *st, u64 dur)
{
	st->sum_ns += dur;
	u32 slot = bpf_log2l(dur);
	if (slot >= LAT_SLOTS)
		slot = LAT_SLOTS - 1;
	st->latency_log2[slot]++;
}

/* 1: this read goes into the window's sample (one of the budget taken); 0: the budget is spent
 * (the caller counts it unsampled) */
static __always_inline int sample_take(void)
{
	int zero = 0;
	s64 *budget = sample_budget.lookup(&zero);
	if (!budget || *budget <= 0)
		return 0;
	__sync_fetch_and_add(budget, -1);
	return 1;
}

/* A completed request of a read path (io_uring, libaio), aggregated per file (kind READ_KIND_*),
 * then the window's sample: 1 when it is also to be recorded (the budget lasts).  miss: the page
 * cache did not have it or was bypassed (insertions, bios, O_DIRECT).  The caller's totals count
 * a file beyond MAX_READ_FILES (*files_overflow) and a request past the budget (*unsampled);
 * either pointer may be 0 (no totals). */
static __always_inline int read_stats_account(u32 dev, u64 ino, u32 kind, s64 res, u64 dur, int miss,
					      u32 pages_added, u32 bio_count, u64 bio_ns,
					      u64 *files_overflow, u64 *unsampled)
{
	struct read_key k = {.ino = ino, .dev = dev, .kind = kind};
	struct read_stats *st = read_stats_of(&k);
	if (st) {
		st->reads++;
		if (res > 0)
			st->bytes += res;
		if (miss)
			st->misses++;
		st->pages_added += pages_added;
		st->bio_count += bio_count;
		st->bio_ns += bio_ns;
		read_stats_latency(st, dur);
	} else if (files_overflow) {
		(*files_overflow)++;
	}
	if (!sample_take()) {
		if (unsampled)
			(*unsampled)++;
		return 0;
	}
	return 1;
}

#endif
