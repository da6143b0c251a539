/* export.bpf.c - always-on aggregation of a reader's file reads, for `engramprof export`.
 *
 * Tracepoints only.  The hot path ends in maps, not in per-call ring records: every read of a
 * target thread adds to one `read_stats_by_file` entry, keyed by the file (device + inode) and
 * the read kind (syscall / fault), holding counters and a log2(ns) latency histogram.  User
 * space reads the maps when Prometheus scrapes.
 *
 * Syscall reads (preadv2 / preadv / pread64, and read / readv of regular files) use the mechanism of syscalls.bpf.c, one header
 * for both (probes/inflight.h): the call in task-local storage from enter to exit; evidence hooks that fire in the reading thread while
 * the call is in flight (page-cache insertions, bios queued and their queue -> complete time,
 * direct / memcg reclaim, being switched out and waiting for a CPU) add to it.  The bios are
 * kept in the in-flight bio table of probes/bios.h (completed at block_rq_complete for
 * request-based devices, block_bio_complete for bio-based ones); the hooks that fire for every
 * task or I/O of the machine (sched_switch's next task, sched_wakeup, the completions) test a
 * bit of call_out_bits or the count of taken bio slots before any hash lookup or clock read.
 * The file of a call is the one its fd names at entry (the fd walk of probes/targets.h: device
 * and inode); where the walk fails (the fd closed meanwhile), the inode of mm_filemap_get_pages,
 * which fires in the reader inside every buffered read that finds pages, then the inode its
 * (process, fd) had at its last read (`inode_by_fd`), else inode 0.
 *
 * Page faults (kind fault).  There is no fault-exit tracepoint.  With FAULT_SPANS (x86's
 * exceptions:page_fault_user and the raw_syscalls hook) a fault is a span, as in faults.bpf.c
 * but simpler: entry = page_fault_user (or the first filemap event when none opened it); it is
 * file-backed once mm_filemap_fault or mm_filemap_map_pages of a target file fires in it; every
 * in-fault event (those, a page insertion, the switch back in after sleeping in it) moves its
 * end; it is closed, and counted with its latency (entry -> last in-fault event), at the thread's
 * next fault, next syscall, or a preemption.  Without FAULT_SPANS each mm_filemap_fault counts
 * one fault with no latency.  Pages the thread inserts inside the fault (outside a syscall) are
 * its insertions; a fault that inserted any is a miss.
 *
 * The batch analysis of each export window needs per-read records: at syscall exit a record
 * (struct call_record, engramprof.h) goes into `sample_records` while `sample_budget` > 0 and
 * decrements it; user space refills the budget to N at each window start.  So each window's
 * first N reads are recorded (all of them when the window has fewer), the rest are only
 * aggregated.  Cost: one reserve/submit (no wake-up) per sampled read, N * 96 bytes a window.
 *
 * Constants filled in before load (-D):
 *   TARGET_TGID, TARGET_TID, MATCH_TGIDS, MATCH_CGROUPS, FOLLOW_CHILDREN  which processes
 *                 (probes/targets.h)
 *   RING_PAGES    sample ring size in pages       MAX_READ_FILES  entries of read_stats_by_file
 *   BIO_SLOTS, BIO_STALE_NS  the in-flight bio table (probes/bios.h)
 *   TID_WORDS     u64 words of call_out_bits (HAVE_SCHED: tids < 64 * TID_WORDS; probes/tidbits.h)
 *   MATCH_FILES and the OFF_* offsets: --file, matched in the kernel (targets.h: is_target_fd at
 *                 syscall entry, is_target_file for a fault's device + inode)
 *   USE_RAW_SYSCALLS  1: raw_syscalls sys_enter/sys_exit (x86_64); 0: per-syscall tracepoints
 *   HAVE_PREADV, HAVE_PREAD64, HAVE_FILEMAP, HAVE_GET_PAGES, HAVE_FAULT, HAVE_MAP_PAGES, HAVE_PFU, HAVE_BIO,
 *   HAVE_VMSCAN_DIRECT, HAVE_VMSCAN_MEMCG, HAVE_SCHED  feature-probed tracepoints
 */
/* struct pt_regs, struct iovec, S_IFMT (probes/kernel_types.h: not the kernel headers) */
#include "kernel_types.h"
#include "export.h"

#define FD_WALK 1               /* every call's file, from its fd (probes/targets.h) */
#define INFLIGHT_PLAIN_READS 1  /* read() and readv() of regular files are reads too */

#define FAULT_SPANS (HAVE_PFU && USE_RAW_SYSCALLS && HAVE_FAULT)

/* ---- the exporter's own state ---- */

/* more of struct inflight (probes/inflight.h): the call's file, the thread's last fault */
#define INFLIGHT_EXTRA \
	u64 ino;          /* the call's file (mm_filemap_get_pages); 0: not seen */ \
	u32 dev; \
	u8 fault_open;    /* the thread's last fault is file-backed: its file is fault_key */ \
	u8 fault_missed;  /* that fault already counted as a miss */ \
	u8 fault_slept;   /* FAULT_SPANS: switched out asleep inside the open fault */ \
	u8 __pad1; \
	struct read_key fault_key; \
	u64 pf_ts;        /* FAULT_SPANS: the open fault's entry; 0 = none */ \
	u64 pf_end;       /* its last in-fault event */ \
	u64 pf_pages;     /* pages it inserted */ \
	u64 pf_index;     /* the file page it read: mm_filemap_fault's index, else fault-around's first */
/* FAULT_SPANS: any syscall of a target thread ends its open fault (every_syscall) */
#define INFLIGHT_EVERY_SYSCALL FAULT_SPANS

struct fd_key {
	u32 tgid;
	s32 fd;
};

struct file_id {
	u64 ino;
	u32 dev;
	u32 __pad0;
};

/* read_stats_by_file, sample_budget, read_stats_of(), read_stats_latency(), sample_take():
 * probes/readstats.h (the one definition of the per-file aggregates and the window sample) */
#include "readstats.h"
BPF_PERCPU_ARRAY(export_totals, struct export_totals, 1);
/* the sum of bio_latency_log2's (probes/inflight.h) bios: every bio a target thread queued inside
 * a syscall read (all files) */
BPF_ARRAY(bio_latency_sum_ns, u64, 1);
/* 1 once every program is attached (set by user space): BCC attaches them one by one while it
 * loads, and a read that began before the evidence hooks were all in place would be counted
 * without its file or its evidence, so nothing is counted before */
BPF_ARRAY(export_armed, u32, 1);
BPF_RINGBUF_OUTPUT(sample_records, RING_PAGES);
BPF_ARRAY(call_record_layout, struct call_record, 1);

#if HAVE_BIO
/* bio_slots, bio_slots_taken: the bios the targets' syscall reads queued, until their
 * completion (the owner's time in a slot is the call's entry time: it identifies the call) */
#include "bios.h"
#endif
BPF_TABLE("lru_hash", struct fd_key, struct file_id, inode_by_fd, 16384);

/* is_target(pid_tgid): probes/targets.h (one pid, a set of pids, cgroups, children) */
#include "targets.h"
/* struct inflight in task storage, offcpu_by_tid, bio_wait_by_tid, call_out_bits (asleep inside
 * an open fault too), bio_latency_log2; the syscall, bio, reclaim and sched_wakeup hooks:
 * probes/inflight.h */
#include "inflight.h"

static __always_inline struct export_totals *totals(void)
{
	int zero = 0;
	return export_totals.lookup(&zero);
}

static __always_inline int armed(void)
{
	int zero = 0;
	u32 *a = export_armed.lookup(&zero);
	return a && *a;
}

/* the file's entry (probes/readstats.h); a full map is counted */
static __always_inline struct read_stats *stats_of(struct read_key *k)
{
	struct read_stats *st = read_stats_of(k);
	if (!st) {
		struct export_totals *t = totals();
		if (t)
			t->files_overflow++;
	}
	return st;
}

static __always_inline struct call_record *sample_reserve(struct export_totals *t);

#if FAULT_SPANS
/* The sample record of a file-backed fault (kind fault: syscall SYSCALL_FAULT, fd -1, one page
 * at the page it read, no bio evidence: bios are followed inside syscall reads only). */
static __always_inline void fault_sample(struct inflight *s, u64 dur, u64 offcpu, u64 runq, struct export_totals *t)
{
	struct call_record *r = sample_reserve(t);
	if (!r)
		return;
	u64 pid_tgid = bpf_get_current_pid_tgid();
	r->ts_ns = s->pf_ts;
	r->dur_ns = dur;
	r->offset = (s64)(s->pf_index << 12);
	r->size = 4096;
	r->ret = 0;
	r->flags = 0;
	r->offcpu_ns = offcpu;
	r->runq_ns = runq;
	r->reclaim_ns = 0;
	r->bio_ns = 0;
	r->pid = pid_tgid >> 32;
	r->tid = (u32)pid_tgid;
	r->fd = -1;
	r->pages_added = s->pf_pages;
	r->bio_count = 0;
	r->syscall = SYSCALL_FAULT;
	r->__pad0 = 0;
	sample_records.ringbuf_submit(r, BPF_RB_NO_WAKEUP);
	if (t)
		t->sampled++;
}

/* Count the thread's open fault (if file-backed) and forget it; runs in the thread itself. */
static __always_inline void fault_close(struct inflight *s, u32 tid)
{
	if (!s->pf_ts)
		return;
	u64 end = s->pf_end, off = 0, rq = 0;
	if (s->fault_slept) {
		struct offcpu_state *o = offcpu_by_tid.lookup(&tid);
		if (o) {
			if (o->in_ts > end)
				end = o->in_ts;
			off = o->offcpu_ns;
			rq = o->runq_ns;
			offcpu_by_tid.delete(&tid);
		}
		call_out_clear(tid);
	}
	if (s->fault_open) {
		struct export_totals *t = totals();
		if (t)
			t->faults++;
		struct read_stats *st = stats_of(&s->fault_key);
		if (st) {
			st->reads++;
			if (s->pf_pages) {
				st->misses++;
				st->pages_added += s->pf_pages;
			}
			st->offcpu_ns += off;
			st->runq_ns += rq;
			read_stats_latency(st, end > s->pf_ts ? end - s->pf_ts : 0);
		}
		fault_sample(s, end > s->pf_ts ? end - s->pf_ts : 0, off, rq, t);
	}
	s->pf_ts = 0;
	s->pf_pages = 0;
	s->fault_open = 0;
	s->fault_slept = 0;
}

/* A filemap event of a target file in the current thread's fault (opens one if none is open). */
static __always_inline void fault_file_event(u32 dev, u64 ino, u64 index, int exact)
{
	if (!armed())
		return;
	struct inflight *s = task_state(1);
	if (!s || s->ts)
		return;      /* a kernel-mode fault inside a syscall read: the call's time */
	u64 now = bpf_ktime_get_ns();
	if (!s->pf_ts) {
		s->pf_ts = now;
		s->pf_pages = 0;
		s->fault_slept = 0;
	}
	struct read_key k = {.ino = ino, .dev = dev, .kind = READ_KIND_FAULT};
	if (exact || !s->fault_open)
		s->pf_index = index;
	s->fault_key = k;
	s->fault_open = 1;
	s->pf_end = now;
}
#endif

#if FAULT_SPANS
/* any syscall entry of a target thread (raw sys_enter): its open fault had returned to user
 * space before it */
static __always_inline void every_syscall(u64 pid_tgid)
{
	struct inflight *fs = task_state(0);
	if (fs && fs->pf_ts)
		fault_close(fs, (u32)pid_tgid);
}
#endif

/* A target thread entered a read call: one walk of its fd (probes/targets.h) names its file, for
 * --file and for the per-file key.  read() / readv() read from the file position, and only a
 * regular file's read is a table read: a pipe, socket, tty or pseudo-filesystem file is counted
 * (nonregular_skipped) and not aggregated (as the recorder's probe, syscalls.bpf.c). */
static __always_inline void call_enter(u16 sc, s32 fd, s64 offset, u64 size, u64 flags)
{
	struct fd_file f;
	if (!armed() || !target_fd_file(fd, &f))
		return;      /* not armed yet; --file: a read of another file (targets.h) */
	if (sc == SYSCALL_READ || sc == SYSCALL_READV) {
		if ((f.mode & S_IFMT) != S_IFREG || f.pseudo) {
			struct export_totals *t = totals();
			if (t)
				t->nonregular_skipped++;
			return;
		}
		offset = f.pos;
	}
	struct inflight *s = task_state(1);
	if (!s)
		return;
	s->ino = f.ino;      /* the walk's file (0 when the fd could not be followed: its pages name it) */
	s->dev = f.dev;
	s->fault_open = 0;   /* a syscall ends the thread's last fault */
	call_begin(s, sc, fd, offset, size, flags, &f);
}

static __always_inline void call_file(struct inflight *s, u64 pid_tgid, struct read_key *k)
{
	struct fd_key fk = {.tgid = pid_tgid >> 32, .fd = s->fd};
	if (s->ino) {
		struct file_id id = {.ino = s->ino, .dev = s->dev};
		struct file_id *old = inode_by_fd.lookup(&fk);
		if (!old || old->ino != id.ino || old->dev != id.dev)
			inode_by_fd.update(&fk, &id);
		k->ino = s->ino;
		k->dev = s->dev;
		return;
	}
	struct file_id *known = inode_by_fd.lookup(&fk);
	if (known) {
		k->ino = known->ino;
		k->dev = known->dev;
	}
}

/* A sample record for the window's analysis while its budget lasts (0: none; counted) */
static __always_inline struct call_record *sample_reserve(struct export_totals *t)
{
	if (!sample_take()) {
		if (t)
			t->unsampled++;
		return 0;
	}
	struct call_record *r = sample_records.ringbuf_reserve(sizeof(struct call_record));
	if (!r && t)
		t->sample_lost++;
	return r;
}

static __always_inline void sample(struct inflight *s, u64 pid_tgid, u64 dur, s64 ret, u64 offcpu, u64 runq,
				   u64 bio_ns, struct export_totals *t)
{
	struct call_record *r = sample_reserve(t);
	if (!r)
		return;
	call_record_fill(r, s, pid_tgid, dur, ret, offcpu, runq, bio_ns);
	sample_records.ringbuf_submit(r, BPF_RB_NO_WAKEUP);
	if (t)
		t->sampled++;
}

static __always_inline void call_exit(u64 pid_tgid, s64 ret)
{
	u64 now = bpf_ktime_get_ns();
	struct inflight *s = current_call();
	if (!s)
		return;
	u64 dur = now - s->ts;
	u64 offcpu, runq, bio_ns;
	call_evidence(s, (u32)pid_tgid, &offcpu, &runq, &bio_ns);

	struct export_totals *t = totals();
	if (t)
		t->syscall_reads++;
	struct read_key k = {.kind = READ_KIND_SYSCALL};
	call_file(s, pid_tgid, &k);
	struct read_stats *st = stats_of(&k);
	if (st) {
		st->reads++;
		if (ret > 0)
			st->bytes += ret;
		if (ret == EAGAIN_RET)
			st->eagain++;
		if (s->pages_added)
			st->misses++;
		st->pages_added += s->pages_added;
		st->bio_count += s->bio_count;
		st->bio_ns += bio_ns;
		st->reclaim_ns += s->reclaim_ns;
		st->offcpu_ns += offcpu;
		st->runq_ns += runq;
		read_stats_latency(st, dur);
	}
	sample(s, pid_tgid, dur, ret, offcpu, runq, bio_ns, t);
	s->ts = 0;
}

#if HAVE_GET_PAGES
/* Inside filemap_read, in the reader's context, once the pages of a chunk are found. */
TRACEPOINT_PROBE(filemap, mm_filemap_get_pages)
{
	if (!is_target(bpf_get_current_pid_tgid()))
		return 0;
	struct inflight *s = current_call();
	if (s && !s->ino) {
		s->ino = args->i_ino;
		s->dev = args->s_dev;
	}
	return 0;
}
#endif

#if FAULT_SPANS
TRACEPOINT_PROBE(exceptions, page_fault_user)
{
	u64 pt = bpf_get_current_pid_tgid();
	if (!is_target(pt) || !armed())
		return 0;
	struct inflight *s = task_state(1);
	if (!s)
		return 0;
	fault_close(s, (u32)pt);
	s->pf_ts = bpf_ktime_get_ns();
	s->pf_end = s->pf_ts;
	return 0;
}

TRACEPOINT_PROBE(filemap, mm_filemap_fault)
{
	if (is_target(bpf_get_current_pid_tgid()) && is_target_file(args->s_dev, args->i_ino))
		fault_file_event(args->s_dev, args->i_ino, args->index, 1);
	return 0;
}

#if HAVE_MAP_PAGES
/* fault-around: a fault served from cached pages fires only this */
TRACEPOINT_PROBE(filemap, mm_filemap_map_pages)
{
	if (is_target(bpf_get_current_pid_tgid()) && is_target_file(args->s_dev, args->i_ino))
		fault_file_event(args->s_dev, args->i_ino, args->index, 0);
	return 0;
}
#endif
#elif HAVE_FAULT
TRACEPOINT_PROBE(filemap, mm_filemap_fault)
{
	if (!is_target(bpf_get_current_pid_tgid()) || !is_target_file(args->s_dev, args->i_ino) || !armed())
		return 0;
	struct export_totals *t = totals();
	if (t)
		t->faults++;
	struct read_key k = {.ino = args->i_ino, .dev = args->s_dev, .kind = READ_KIND_FAULT};
	struct read_stats *st = stats_of(&k);
	if (st)
		st->reads++;
	struct inflight *s = task_state(1);
	if (s && !s->ts) {
		s->fault_key = k;
		s->fault_open = 1;
		s->fault_missed = 0;
	}
	return 0;
}
#endif

#if HAVE_FILEMAP
TRACEPOINT_PROBE(filemap, mm_filemap_add_to_page_cache)
{
	if (!is_target(bpf_get_current_pid_tgid()))
		return 0;
	struct inflight *s = task_state(0);
	if (!s)
		return 0;
	u32 n = 1 << args->order;
	if (s->ts) {
		s->pages_added += n;
		return 0;
	}
#if FAULT_SPANS
	if (s->pf_ts && s->fault_open) {
		s->pf_pages += n;
		s->pf_end = bpf_ktime_get_ns();
	}
	return 0;
#endif
	if (!s->fault_open)
		return 0;
	struct read_stats *st = stats_of(&s->fault_key);
	if (!st)
		return 0;
	st->pages_added += n;
	if (!s->fault_missed) {
		st->misses++;
		s->fault_missed = 1;
	}
	return 0;
}
#endif

#if HAVE_BIO
/* the bio hooks are probes/inflight.h's */
static __always_inline void call_bio_untracked(void)
{
	struct export_totals *t = totals();
	if (t)
		t->bios_untracked++;
}

static __always_inline void call_bio_done(u64 delta)
{
	int zero = 0;
	u64 *sum = bio_latency_sum_ns.lookup(&zero);
	if (sum)
		__sync_fetch_and_add(sum, delta);
}
#endif

#if HAVE_SCHED
/* runs in the context of the task switched out (prev = current) */
TRACEPOINT_PROBE(sched, sched_switch)
{
	u64 now = call_switched_in(args->next_pid);
	if (!is_target(bpf_get_current_pid_tgid()))
		return 0;
	u32 prev = (u32)bpf_get_current_pid_tgid();
	u32 preempted = switch_preempted(args->prev_state);
#if FAULT_SPANS
	struct inflight *f = task_state(0);
	if (f && !f->ts && f->pf_ts) {
		if (preempted) {      /* runnable: back in user space (or about to be): the fault is over */
			fault_close(f, prev);
			return 0;
		}
		if (call_switched_out(prev, !f->fault_slept, 0, now))
			f->fault_slept = 1;
		return 0;
	}
#endif
	struct inflight *s = current_call();
	if (!s)
		return 0;
	if (call_switched_out(prev, !s->switched, preempted, now))
		s->switched = 1;
	return 0;
}
#endif
