/* evictions.bpf.c - every removal of a traced file's page from the page cache, with who
 * removed it and in which context.
 *
 * filemap:mm_filemap_delete_from_page_cache fires system-wide, in the context of whoever
 * removes the folio (Linux 6.18, /work/shared/KERNEL.md): reclaim from kswapd or from the
 * allocating task inside mm_vmscan_{direct,memcg}_reclaim_begin..end, posix_fadvise(DONTNEED)
 * in the calling task, a write to /proc/sys/vm/drop_caches in the writing task, truncation in
 * the truncating task.  The hot path is one array lookup: the folio's (device, inode) must have
 * its `watched_bits` slot set (probes/watched.h), then be in `watched_files`, which user space
 * fills with the files the target reads (its open fds and file mappings at start, then every
 * file it is seen reading; engramprof/record/evictions.py), setting the slot after each key.
 *
 * The removing context is per-task state (`ctx_by_tid`) set by:
 *   - mm_vmscan_direct_reclaim_begin / _end, mm_vmscan_memcg_reclaim_begin / _end (reclaim: it
 *     takes precedence over the syscall the task is in while it lasts),
 *   - sys_enter/exit_fadvise64 with advice POSIX_FADV_DONTNEED,
 *   - sys_enter/exit_write of 1-3 bytes whose first byte is '1'..'3' (what a drop_caches write
 *     looks like; user space checks the fd's path when the writer still exists),
 *   - sys_enter/exit of truncate, ftruncate, fallocate, unlink, unlinkat,
 *   - sys_enter/exit_madvise and _process_madvise with MADV_PAGEOUT or MADV_REMOVE.
 * No state and the task's comm is "kswapd*": kswapd; "kdamond*" (DAMON): proactive reclaim.  Otherwise: unknown (a kernel thread, or
 * another syscall), with the task's pid and comm.
 *
 * Constants filled in before load (-D): RING_PAGES, MAX_FILES, MAX_TASKS, WATCH_BITS, FADV_DONTNEED,
 * HAVE_VMSCAN_DIRECT, HAVE_VMSCAN_MEMCG, HAVE_FADVISE, HAVE_WRITE, HAVE_TRUNCATE, HAVE_FTRUNCATE,
 * HAVE_FALLOCATE, HAVE_UNLINK, HAVE_UNLINKAT, HAVE_MADVISE, HAVE_PROCESS_MADVISE, MADV_PAGEOUT_,
 * MADV_REMOVE_, and targets.h's (the EVICT_BY_TARGET flag).
 */
#include "evictions.h"
/* bpf_probe_read_user without BCC's per-call kallsyms look-up */
#include "readuser.h"

struct evict_ctx {
	u64 sys_ts;       /* syscall entry; 0 = not in a watched syscall */
	u64 reclaim_ts;   /* reclaim begin; 0 = not reclaiming */
	s32 fd;
	u16 sys_kind;     /* EVICT_FADVISE / _WRITE / _TRUNCATE */
	u16 reclaim_kind; /* EVICT_DIRECT / _MEMCG */
};

/* struct file_key, watched_bits (the pre-filter of watched_files), watch_bit(): probes/watched.h */
#include "watched.h"
BPF_HASH(watched_files, struct file_key, u8, MAX_FILES);
BPF_HASH(ctx_by_tid, u32, struct evict_ctx, MAX_TASKS);
BPF_RINGBUF_OUTPUT(eviction_records, RING_PAGES);
BPF_PERCPU_ARRAY(eviction_totals, struct eviction_totals, 1);
BPF_ARRAY(eviction_record_layout, struct eviction_record, 1);
BPF_ARRAY(eviction_totals_layout, struct eviction_totals, 1);

/* is_target(pid_tgid): probes/targets.h (one pid, a set of pids, cgroups, children) */
#include "targets.h"

static __always_inline struct eviction_totals *totals(void)
{
	int zero = 0;
	return eviction_totals.lookup(&zero);
}

/* comm starts with "kswapd" (6 bytes, little endian) */
#define KSWAPD_PREFIX 0x64706177736bULL
#define KSWAPD_MASK   0xffffffffffffULL
/* "kdamond" (7 bytes): DAMON's proactive reclaim thread */
#define KDAMOND_PREFIX 0x646e6f6d61646bULL
#define KDAMOND_MASK   0xffffffffffffffULL

TRACEPOINT_PROBE(filemap, mm_filemap_delete_from_page_cache)
{
	if (!maybe_watched(args->s_dev, args->i_ino))
		return 0;
	struct file_key k = {.dev = args->s_dev, .__pad0 = 0, .ino = args->i_ino};
	if (!watched_files.lookup(&k))
		return 0;
	u64 pid_tgid = bpf_get_current_pid_tgid();
	u32 tid = (u32)pid_tgid;
	u32 pages = 1U << args->order;
	u16 kind = EVICT_UNKNOWN;
	u64 since = 0;
	s32 fd = -1;
	struct evict_ctx *c = ctx_by_tid.lookup(&tid);
	if (c && c->reclaim_ts) {
		kind = c->reclaim_kind;
		since = c->reclaim_ts;
	} else if (c && c->sys_ts) {
		kind = c->sys_kind;
		since = c->sys_ts;
		fd = c->fd;
	}
	u64 comm[2] = {0, 0};
	bpf_get_current_comm(&comm, sizeof(comm));
	if (kind == EVICT_UNKNOWN && (comm[0] & KSWAPD_MASK) == KSWAPD_PREFIX)
		kind = EVICT_KSWAPD;
	else if (kind == EVICT_UNKNOWN && (comm[0] & KDAMOND_MASK) == KDAMOND_PREFIX)
		kind = EVICT_PROACTIVE;
	struct eviction_totals *t = totals();
	if (t) {
		t->evictions++;
		t->pages += pages;
		switch (kind) {
		case EVICT_KSWAPD: t->ctx_kswapd += pages; break;
		case EVICT_DIRECT: t->ctx_direct += pages; break;
		case EVICT_MEMCG: t->ctx_memcg += pages; break;
		case EVICT_FADVISE: t->ctx_fadvise += pages; break;
		case EVICT_WRITE: t->ctx_write += pages; break;
		case EVICT_TRUNCATE: t->ctx_truncate += pages; break;
		case EVICT_MADVISE: t->ctx_madvise += pages; break;
		case EVICT_PROACTIVE: t->ctx_proactive += pages; break;
		default: t->ctx_unknown += pages; break;
		}
	}
	struct eviction_record *r = eviction_records.ringbuf_reserve(sizeof(struct eviction_record));
	if (!r) {
		if (t)
			t->lost_records++;
		return 0;
	}
	r->ts_ns = bpf_ktime_get_ns();
	r->ino = args->i_ino;
	r->index = args->index;
	r->cgroup_id = bpf_get_current_cgroup_id();
	r->ctx_ns = since;
	r->comm_lo = comm[0];
	r->comm_hi = comm[1];
	r->dev = args->s_dev;
	r->pid = pid_tgid >> 32;
	r->tid = tid;
	r->pages = pages;
	r->fd = fd;
	r->context = kind;
	r->flags = is_target(pid_tgid) ? EVICT_BY_TARGET : 0;
	eviction_records.ringbuf_submit(r, BPF_RB_NO_WAKEUP);
	return 0;
}

/* ---- per-task context ---- */

static __always_inline struct evict_ctx *ctx_of(u32 tid, int create)
{
	struct evict_ctx *c = ctx_by_tid.lookup(&tid);
	if (c || !create)
		return c;
	struct evict_ctx init = {.sys_ts = 0, .reclaim_ts = 0, .fd = -1, .sys_kind = 0, .reclaim_kind = 0};
	ctx_by_tid.update(&tid, &init);
	c = ctx_by_tid.lookup(&tid);
	if (!c) {
		struct eviction_totals *t = totals();
		if (t)
			t->no_state++;
	}
	return c;
}

static __always_inline void ctx_forget_if_idle(u32 tid, struct evict_ctx *c)
{
	if (!c->sys_ts && !c->reclaim_ts)
		ctx_by_tid.delete(&tid);
}

static __always_inline void sys_begin(u16 kind, s32 fd)
{
	u32 tid = (u32)bpf_get_current_pid_tgid();
	struct evict_ctx *c = ctx_of(tid, 1);
	if (!c)
		return;
	c->sys_ts = bpf_ktime_get_ns();
	c->sys_kind = kind;
	c->fd = fd;
}

static __always_inline void sys_end(void)
{
	u32 tid = (u32)bpf_get_current_pid_tgid();
	struct evict_ctx *c = ctx_of(tid, 0);
	if (!c)
		return;
	c->sys_ts = 0;
	c->fd = -1;
	ctx_forget_if_idle(tid, c);
}

static __always_inline void reclaim_begin(u16 kind)
{
	u32 tid = (u32)bpf_get_current_pid_tgid();
	struct evict_ctx *c = ctx_of(tid, 1);
	if (!c)
		return;
	c->reclaim_ts = bpf_ktime_get_ns();
	c->reclaim_kind = kind;
}

static __always_inline void reclaim_end(void)
{
	u32 tid = (u32)bpf_get_current_pid_tgid();
	struct evict_ctx *c = ctx_of(tid, 0);
	if (!c)
		return;
	c->reclaim_ts = 0;
	ctx_forget_if_idle(tid, c);
}

#if HAVE_VMSCAN_DIRECT
TRACEPOINT_PROBE(vmscan, mm_vmscan_direct_reclaim_begin) { reclaim_begin(EVICT_DIRECT); return 0; }
TRACEPOINT_PROBE(vmscan, mm_vmscan_direct_reclaim_end) { reclaim_end(); return 0; }
#endif
#if HAVE_VMSCAN_MEMCG
TRACEPOINT_PROBE(vmscan, mm_vmscan_memcg_reclaim_begin) { reclaim_begin(EVICT_MEMCG); return 0; }
TRACEPOINT_PROBE(vmscan, mm_vmscan_memcg_reclaim_end) { reclaim_end(); return 0; }
#endif

#if HAVE_FADVISE
TRACEPOINT_PROBE(syscalls, sys_enter_fadvise64)
{
	if (args->advice == FADV_DONTNEED)
		sys_begin(EVICT_FADVISE, (s32)args->fd);
	return 0;
}
TRACEPOINT_PROBE(syscalls, sys_exit_fadvise64) { sys_end(); return 0; }
#endif

#if HAVE_WRITE
/* drop_caches takes "1", "2" or "3" (and a newline): only such writes get a context */
TRACEPOINT_PROBE(syscalls, sys_enter_write)
{
	if (args->count == 0 || args->count > 3)
		return 0;
	char ch = 0;
	bpf_probe_read_user(&ch, 1, (void *)args->buf);
	if (ch < '1' || ch > '3')
		return 0;
	sys_begin(EVICT_WRITE, (s32)args->fd);
	return 0;
}
TRACEPOINT_PROBE(syscalls, sys_exit_write) { sys_end(); return 0; }
#endif

#if HAVE_TRUNCATE
TRACEPOINT_PROBE(syscalls, sys_enter_truncate) { sys_begin(EVICT_TRUNCATE, -1); return 0; }
TRACEPOINT_PROBE(syscalls, sys_exit_truncate) { sys_end(); return 0; }
#endif
#if HAVE_FTRUNCATE
TRACEPOINT_PROBE(syscalls, sys_enter_ftruncate) { sys_begin(EVICT_TRUNCATE, (s32)args->fd); return 0; }
TRACEPOINT_PROBE(syscalls, sys_exit_ftruncate) { sys_end(); return 0; }
#endif
#if HAVE_FALLOCATE
TRACEPOINT_PROBE(syscalls, sys_enter_fallocate) { sys_begin(EVICT_TRUNCATE, (s32)args->fd); return 0; }
TRACEPOINT_PROBE(syscalls, sys_exit_fallocate) { sys_end(); return 0; }
#endif
#if HAVE_UNLINK
TRACEPOINT_PROBE(syscalls, sys_enter_unlink) { sys_begin(EVICT_TRUNCATE, -1); return 0; }
TRACEPOINT_PROBE(syscalls, sys_exit_unlink) { sys_end(); return 0; }
#endif
#if HAVE_UNLINKAT
TRACEPOINT_PROBE(syscalls, sys_enter_unlinkat) { sys_begin(EVICT_TRUNCATE, -1); return 0; }
TRACEPOINT_PROBE(syscalls, sys_exit_unlinkat) { sys_end(); return 0; }
#endif

#if HAVE_MADVISE
TRACEPOINT_PROBE(syscalls, sys_enter_madvise)
{
	if (args->behavior == MADV_PAGEOUT_ || args->behavior == MADV_REMOVE_)
		sys_begin(EVICT_MADVISE, -1);
	return 0;
}
TRACEPOINT_PROBE(syscalls, sys_exit_madvise) { sys_end(); return 0; }
#endif
#if HAVE_PROCESS_MADVISE
TRACEPOINT_PROBE(syscalls, sys_enter_process_madvise)
{
	if (args->behavior == MADV_PAGEOUT_ || args->behavior == MADV_REMOVE_)
		sys_begin(EVICT_MADVISE, -1);
	return 0;
}
TRACEPOINT_PROBE(syscalls, sys_exit_process_madvise) { sys_end(); return 0; }
#endif
