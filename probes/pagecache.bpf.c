/* pagecache.bpf.c - the life of the target's table pages on their way into the page cache:
 * insertions, the kernel's readahead decisions, and the target's own page-cache hints.
 *
 * Tracepoints only (Linux 6.18: /work/shared/KERNEL.md, docs/kernel.md).  Three streams, one
 * ring (`pagecache_records`, struct pagecache_record below):
 *
 *   PC_INSERT  filemap:mm_filemap_add_to_page_cache, system-wide, filtered in the kernel to the
 *              watched files (device + inode in `watched_files`).  A file becomes watched when a
 *              target thread inserts a page of it (so every miss of the target is seen from its
 *              first page; a target's readahead event does the same), or when user space
 *              puts it there (the target's open and mapped data files, at start and about
 *              every two seconds).  Consecutive insertions of one
 *              thread into one file (index, index + 1, ...) are coalesced into one run record:
 *              readahead inserts its window page by page (or folio by folio), and one record
 *              per window keeps a 2.6-million-page readahead storm to thousands of records.  A
 *              run is written when the thread inserts elsewhere, when it enters or leaves a
 *              hint syscall, or (still open) by user space at the end from `open_runs`.
 *   PC_RA_*    readahead:page_cache_sync_ra / page_cache_async_ra / page_cache_ra_order /
 *              page_cache_ra_unbounded of the watched files: the readahead window the kernel
 *              chose (start index, size, async size, ra_pages).  ra_order is also the mmap
 *              read-around of a fault without MADV_RANDOM; ra_unbounded the forced readahead
 *              of fadvise(WILLNEED) / madvise(WILLNEED) / readahead(2).
 *   PC_HINT    the target's fadvise64, madvise (the behaviours of HINT_MADV_MASK) and
 *              readahead(2) calls: args at entry, written at exit with the return value and
 *              duration.  madvise gives an address range: user space maps it to file pages
 *              through the target's mappings (engramprof/record/pagecache.py).
 *
 * Constants filled in before load (-D, engramprof/bpf/pagecache.py): RING_PAGES, MAX_WATCHED,
 * WATCH_BITS (probes/watched.h: the array slot tested before the watched_files lookup),
 * HAVE_RA_SYNC (sync + async), HAVE_RA_ORDER, HAVE_RA_UNBOUNDED, HAVE_FADVISE, HAVE_MADVISE,
 * HAVE_READAHEAD (the syscall), and targets.h's (TARGET_TGID, MATCH_TGIDS, ...).
 *
 * struct pagecache_record is defined here (not in engramprof.h); engramprof/bpf/pagecache.py
 * parses it from this file and checks it against the compiled layout (pagecache_record_layout).
 */
#include "pagecache.h"

struct run_state {
	u64 ts;           /* first insertion */
	u64 last_ts;
	u64 ino;
	u64 first;
	u64 next;         /* index after the run's last page */
	u32 dev;
	u32 pid;
	u16 flags;
	u16 __pad0;
	u32 __pad1;
};

struct hint_state {
	u64 ts;
	u64 index;
	u64 count;
	u64 advice;
	s32 fd;
	u16 call;
	u16 __pad0;
};

/* struct file_key, watched_bits (the pre-filter of watched_files), watch_bit(): probes/watched.h */
#include "watched.h"
BPF_HASH(watched_files, struct file_key, u8, MAX_WATCHED);
BPF_HASH(open_runs, u32, struct run_state, 16384);
BPF_HASH(hint_by_tid, u32, struct hint_state, 16384);
BPF_RINGBUF_OUTPUT(pagecache_records, RING_PAGES);
BPF_PERCPU_ARRAY(pagecache_totals, struct pagecache_totals, 1);
BPF_ARRAY(pagecache_record_layout, struct pagecache_record, 1);
BPF_ARRAY(pagecache_totals_layout, struct pagecache_totals, 1);

/* is_target(pid_tgid): probes/targets.h (one pid, a set of pids, cgroups, children) */
#include "targets.h"

static __always_inline struct pagecache_totals *totals(void)
{
	int zero = 0;
	return pagecache_totals.lookup(&zero);
}

static __always_inline void emit(u64 ts, u64 dur, u32 dev, u64 ino, u64 index, u64 count, u64 extra, s64 ret,
                                 u64 pid_tgid, s32 fd, u16 kind, u16 flags, u16 call)
{
	struct pagecache_totals *t = totals();
	struct pagecache_record *r = pagecache_records.ringbuf_reserve(sizeof(struct pagecache_record));
	if (!r) {
		if (t)
			t->lost_records++;
		return;
	}
	r->ts_ns = ts;
	r->dur_ns = dur;
	r->ino = ino;
	r->index = index;
	r->count = count;
	r->extra = extra;
	r->ret = ret;
	r->pid = pid_tgid >> 32;
	r->tid = (u32)pid_tgid;
	r->dev = dev;
	r->fd = fd;
	r->kind = kind;
	r->flags = flags;
	r->call = call;
	r->__pad0 = 0;
	pagecache_records.ringbuf_submit(r, BPF_RB_NO_WAKEUP);
	if (t) {
		if (kind == PC_INSERT)
			t->runs++;
		else if (kind == PC_HINT)
			t->hints++;
		else
			t->readahead++;
	}
}

static __always_inline void write_run(struct run_state *s, u32 tid)
{
	if (!s->ts)
		return;
	u64 pid_tgid = ((u64)s->pid << 32) | tid;
	emit(s->ts, s->last_ts - s->ts, s->dev, s->ino, s->first, s->next - s->first, 0, 0, pid_tgid, -1,
	     PC_INSERT, s->flags, 0);
	s->ts = 0;
}

/* The thread's open run, written now (it enters or leaves a hint). */
static __always_inline void close_run(u32 tid)
{
	struct run_state *s = open_runs.lookup(&tid);
	if (s)
		write_run(s, tid);
}

/* 1 when the file is watched; a target's first event on a file makes it watched.  Another
 * process's insertion into a file whose watched_bits slot is clear returns after one array
 * lookup (probes/watched.h); a set slot sends it to the hash. */
static __always_inline int watch_file(u32 dev, u64 ino, int target)
{
	u8 *set = watched_slot(dev, ino);
	if (!set || (!*set && !target))
		return 0;
	struct file_key k = {.dev = dev, .ino = ino};
	if (!watched_files.lookup(&k)) {
		if (!target)
			return 0;
		u8 one = 1;
		if (watched_files.update(&k, &one)) {
			struct pagecache_totals *t = totals();
			if (t)
				t->watched_full++;
			return 0;
		}
	}
	if (!*set)
		*set = 1;  /* after the key: a set slot's file is in the hash or about to be */
	return 1;
}

TRACEPOINT_PROBE(filemap, mm_filemap_add_to_page_cache)
{
	u32 dev = args->s_dev;
	u64 ino = args->i_ino;
	u64 pid_tgid = bpf_get_current_pid_tgid();
	int target = is_target(pid_tgid);
	if (!watch_file(dev, ino, target))
		return 0;
	u64 now = bpf_ktime_get_ns();
	u64 index = args->index;
	u64 n = 1ULL << (args->order & 31);
	u32 tid = (u32)pid_tgid;
	u16 flags = target ? PCF_TARGET : 0;
	if (target && hint_by_tid.lookup(&tid))
		flags |= PCF_IN_HINT;
	struct pagecache_totals *t = totals();
	if (t) {
		t->inserted_pages += n;
		if (target)
			t->target_pages += n;
	}
	struct run_state *s = open_runs.lookup(&tid);
	if (!s) {
		struct run_state init = {};
		if (open_runs.update(&tid, &init)) {
			if (t)
				t->runs_untracked++;
			emit(now, 0, dev, ino, index, n, 0, 0, pid_tgid, -1, PC_INSERT, flags, 0);
			return 0;
		}
		s = open_runs.lookup(&tid);
		if (!s)
			return 0;
	}
	if (s->ts && s->dev == dev && s->ino == ino && s->next == index && s->flags == flags
	    && s->pid == (u32)(pid_tgid >> 32)) {
		s->next = index + n;
		s->last_ts = now;
		return 0;
	}
	write_run(s, tid);
	s->ts = now;
	s->last_ts = now;
	s->dev = dev;
	s->ino = ino;
	s->first = index;
	s->next = index + n;
	s->pid = pid_tgid >> 32;
	s->flags = flags;
	return 0;
}

static __always_inline void readahead_event(u16 kind, u32 dev, u64 ino, u64 index, u64 size, u64 async_size,
                                            u64 ra_pages)
{
	u64 pid_tgid = bpf_get_current_pid_tgid();
	u16 flags = is_target(pid_tgid) ? PCF_TARGET : 0;
	if (!watch_file(dev, ino, flags))
		return;
	u32 tid = (u32)pid_tgid;
	if (flags && hint_by_tid.lookup(&tid))
		flags |= PCF_IN_HINT;
	emit(bpf_ktime_get_ns(), 0, dev, ino, index, size, (async_size & 0xffffffffULL) | (ra_pages << 32), 0,
	     pid_tgid, -1, kind, flags, 0);
}

#if HAVE_RA_SYNC
TRACEPOINT_PROBE(readahead, page_cache_sync_ra)
{
	readahead_event(PC_RA_SYNC, args->s_dev, args->i_ino, args->index, args->size, args->async_size,
	                args->ra_pages);
	return 0;
}

TRACEPOINT_PROBE(readahead, page_cache_async_ra)
{
	readahead_event(PC_RA_ASYNC, args->s_dev, args->i_ino, args->index, args->size, args->async_size,
	                args->ra_pages);
	return 0;
}
#endif

#if HAVE_RA_ORDER
TRACEPOINT_PROBE(readahead, page_cache_ra_order)
{
	readahead_event(PC_RA_ORDER, args->s_dev, args->i_ino, args->index, args->size, args->async_size,
	                args->ra_pages);
	return 0;
}
#endif

#if HAVE_RA_UNBOUNDED
TRACEPOINT_PROBE(readahead, page_cache_ra_unbounded)
{
	readahead_event(PC_RA_UNBOUNDED, args->s_dev, args->i_ino, args->index, args->nr_to_read,
	                args->lookahead_size, 0);
	return 0;
}
#endif

/* ---- the target's hints: entry keeps the arguments, exit writes the record ---- */

static __always_inline void hint_enter(u16 call, s32 fd, u64 index, u64 count, u64 advice)
{
	u64 pid_tgid = bpf_get_current_pid_tgid();
	if (!is_target(pid_tgid))
		return;
	u32 tid = (u32)pid_tgid;
	close_run(tid);  /* insertions from here to the exit are the hint's */
	struct hint_state h = {.ts = bpf_ktime_get_ns(), .index = index, .count = count, .advice = advice,
	                       .fd = fd, .call = call};
	hint_by_tid.update(&tid, &h);
}

static __always_inline void hint_exit(s64 ret)
{
	u64 pid_tgid = bpf_get_current_pid_tgid();
	u32 tid = (u32)pid_tgid;
	struct hint_state *h = hint_by_tid.lookup(&tid);
	if (!h)
		return;
	close_run(tid);
	u64 now = bpf_ktime_get_ns();
	emit(h->ts, now - h->ts, 0, 0, h->index, h->count, h->advice, ret, pid_tgid, h->fd, PC_HINT, PCF_TARGET,
	     h->call);
	hint_by_tid.delete(&tid);
}

#if HAVE_FADVISE
TRACEPOINT_PROBE(syscalls, sys_enter_fadvise64)
{
	hint_enter(HINT_FADVISE, (s32)args->fd, (u64)args->offset, (u64)args->len, (u64)args->advice);
	return 0;
}

TRACEPOINT_PROBE(syscalls, sys_exit_fadvise64)
{
	hint_exit(args->ret);
	return 0;
}
#endif

#if HAVE_MADVISE
TRACEPOINT_PROBE(syscalls, sys_enter_madvise)
{
	u64 behavior = (u64)args->behavior;
	if (behavior > 63 || !((1ULL << behavior) & HINT_MADV_MASK))
		return 0;
	hint_enter(HINT_MADVISE, -1, (u64)args->start, (u64)args->len_in, behavior);
	return 0;
}

TRACEPOINT_PROBE(syscalls, sys_exit_madvise)
{
	hint_exit(args->ret);
	return 0;
}
#endif

#if HAVE_READAHEAD
TRACEPOINT_PROBE(syscalls, sys_enter_readahead)
{
	hint_enter(HINT_READAHEAD, (s32)args->fd, (u64)args->offset, (u64)args->count, 0);
	return 0;
}

TRACEPOINT_PROBE(syscalls, sys_exit_readahead)
{
	hint_exit(args->ret);
	return 0;
}
#endif
