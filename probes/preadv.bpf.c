/* preadv.bpf.c - per-call preadv2 / preadv / pread64 tracing with each call's cause evidence.
 *
 * Tracepoints only (no kprobes, no fentry).  The enter hook stores the call in task-local
 * storage; evidence hooks that fire in the reading thread's context while the call is in
 * flight (page-cache insertions, bio queueing, direct/memcg reclaim, being switched out) add
 * to that storage; the exit hook writes one fixed-size record into the `call_records` ring
 * buffer without waking user space (it drains on a timer) and updates in-kernel totals and
 * per-fd log2 latency histograms.
 *
 * Constants filled in before load (-D):
 *   TARGET_TGID, TARGET_TID, MATCH_TGIDS, MATCH_CGROUPS, FOLLOW_CHILDREN  which processes,
 *   MATCH_FILES, OFF_*  which files (--file: the call's fd is followed to its inode at entry)
 *                 (probes/targets.h)
 *   MIN_NS        record only calls at least this long (all calls are still counted)
 *   RING_PAGES    ring buffer size in pages
 *   BIO_SLOTS, BIO_STALE_NS  the in-flight bio table (probes/bios.h)
 *   USE_RAW_SYSCALLS  1: hook raw_syscalls sys_enter/sys_exit (x86_64 only, cheaper);
 *                     0: the syscalls:sys_{enter,exit}_{preadv2,preadv,pread64} tracepoints
 *   HAVE_PREADV, HAVE_PREAD64, HAVE_FILEMAP, HAVE_BIO, HAVE_VMSCAN_DIRECT, HAVE_VMSCAN_MEMCG,
 *   HAVE_SCHED, HAVE_KSWAPD  feature-probed tracepoints; evidence for a missing one is left at 0 and the
 *                 trace says which columns are absent
 *   TID_WORDS     u64 words of the switched-out-in-a-call bitmap (HAVE_SCHED: tids < 64 * TID_WORDS)
 */
#include <linux/fs.h>
#include <linux/ptrace.h>
#include <linux/uio.h>
#include "engramprof.h"

#define MAX_IOV 8
#define RWF_NOWAIT_BIT 0x00000008
#define EAGAIN_RET (-11)

struct inflight {
	u64 ts;           /* entry ns; 0 = no call in flight */
	s64 offset;
	u64 size;
	u64 flags;
	u64 reclaim_start;
	u64 reclaim_ns;
	s32 fd;
	u32 pages_added;
	u32 bio_count;
	u16 syscall;
	u8 switched;      /* switched out during the call: collect offcpu_by_tid at exit */
	u8 __pad0;
};

/* off-CPU bookkeeping for threads switched out in the middle of a traced call */
struct offcpu_state {
	u64 out_ts;       /* switched out at; 0 = running */
	u64 wake_ts;      /* woken at (blocked -> runnable) */
	u64 offcpu_ns;
	u64 runq_ns;
	u32 preempted;    /* switched out while runnable: all of the gap is run-queue wait */
	u32 __pad0;
};

/* bios of one call that completed while it was still in flight (the call waited for them) */
struct bio_wait {
	u64 call_ts;
	u64 ns;
	u64 count;
};

BPF_TASK_STORAGE(inflight_by_task, struct inflight);
#if HAVE_SCHED
/* bit (tid & 63) of word (tid >> 6): that target thread is switched out inside a traced call
 * (its offcpu_by_tid entry has out_ts set).  sched_switch (next) and sched_wakeup fire for every
 * task of the machine: they test this bit (an inlined array lookup) before the clock read and the
 * hash lookup.  A tid past the bitmap (pid_max raised beyond TID_WORDS' headroom while recording)
 * has no word: its hooks do the hash lookup, as without the bitmap. */
BPF_ARRAY(call_out_bits, u64, TID_WORDS);

static __always_inline u64 *call_out_word(u32 tid)
{
	u32 w = tid >> 6;
	return call_out_bits.lookup(&w);  /* array: inlined, bounds-checked */
}

static __always_inline u64 tid_bit(u32 tid)
{
	return 1ULL << (tid & 63);
}
#endif
BPF_HASH(offcpu_by_tid, u32, struct offcpu_state, 4096);
#if HAVE_BIO
/* bio_slots, bio_slots_taken: the bios the target's calls queued, until their completion (the
 * owner's time in a slot is the call's entry time: it identifies the call) */
#include "bios.h"
#endif
BPF_HASH(bio_wait_by_tid, u32, struct bio_wait, 4096);
BPF_RINGBUF_OUTPUT(call_records, RING_PAGES);
BPF_RINGBUF_OUTPUT(vm_events, 16);
BPF_PERCPU_ARRAY(call_totals, struct call_totals, 1);
BPF_PERCPU_ARRAY(latency_log2_by_fd, u64, FD_SLOTS * LAT_SLOTS);
/* queue -> complete of every bio the target's threads queued inside a traced call: the
 * device's own service time, the baseline a slow miss is compared against */
BPF_ARRAY(bio_latency_log2, u64, LAT_SLOTS);
/* never written: lets user space read the layout clang compiled */
BPF_ARRAY(call_record_layout, struct call_record, 1);
BPF_ARRAY(call_totals_layout, struct call_totals, 1);
BPF_ARRAY(vm_event_layout, struct vm_event, 1);

/* is_target(pid_tgid): probes/targets.h (one pid, a set of pids, cgroups, children) */
#include "targets.h"

static __always_inline struct inflight *current_call(void)
{
	struct inflight *s = inflight_by_task.task_storage_get(bpf_get_current_task_btf(), 0, 0);
	if (s && s->ts)
		return s;
	return 0;
}

static __always_inline void call_enter(u16 sc, s32 fd, s64 offset, u64 size, u64 flags)
{
	if (!is_target_fd(fd))
		return;      /* --file: a read of another file */
	struct inflight *s = inflight_by_task.task_storage_get(bpf_get_current_task_btf(), 0,
							     BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!s)
		return;
	s->offset = offset;
	s->size = size;
	s->flags = flags;
	s->reclaim_start = 0;
	s->reclaim_ns = 0;
	s->fd = fd;
	s->pages_added = 0;
	s->bio_count = 0;
	s->syscall = sc;
	s->switched = 0;
	s->ts = bpf_ktime_get_ns();
}

static __always_inline u64 iov_bytes(const struct iovec *vec, u64 vlen)
{
	u64 total = 0;
	struct iovec iov;
#pragma unroll
	for (int i = 0; i < MAX_IOV; i++) {
		if (i >= vlen)
			break;
		if (bpf_probe_read_user(&iov, sizeof(iov), &vec[i]))
			break;
		total += iov.iov_len;
	}
	return total;
}

static __always_inline void call_exit(u64 pid_tgid, s64 ret)
{
	u64 now = bpf_ktime_get_ns();
	struct inflight *s = current_call();
	if (!s)
		return;      /* entered before we attached, or not a traced call */
	u64 dur = now - s->ts;
	u32 tid = (u32)pid_tgid;

	u64 offcpu = 0, runq = 0;
	if (s->switched) {
		struct offcpu_state *o = offcpu_by_tid.lookup(&tid);
		if (o) {
			offcpu = o->offcpu_ns;
			runq = o->runq_ns;
			offcpu_by_tid.delete(&tid);
		}
#if HAVE_SCHED
		/* the thread runs: its switch-in cleared the bit.  Should one have been missed, the
		 * bit goes with the entry, or an untraced thread reusing the tid pays lookups */
		u64 *w = call_out_word(tid);
		if (w && (*w & tid_bit(tid)))
			__sync_fetch_and_and(w, ~tid_bit(tid));
#endif
	}
	u64 bio_ns = 0;
	if (s->bio_count) {
		struct bio_wait *w = bio_wait_by_tid.lookup(&tid);
		if (w) {
			if (w->call_ts == s->ts)
				bio_ns = w->ns;
			bio_wait_by_tid.delete(&tid);
		}
	}

	int zero = 0;
	struct call_totals *t = call_totals.lookup(&zero);
	if (t) {
		t->calls++;
		t->sum_ns += dur;
		if (dur > t->max_ns)
			t->max_ns = dur;
		if (ret == EAGAIN_RET)
			t->eagain++;
		if (s->flags & RWF_NOWAIT_BIT)
			t->nowait++;
	}
	u32 fdslot = (u32)s->fd < FD_SLOTS - 1 ? (u32)s->fd : FD_SLOTS - 1;
	u32 slot = bpf_log2l(dur);
	if (slot >= LAT_SLOTS)
		slot = LAT_SLOTS - 1;
	u32 idx = fdslot * LAT_SLOTS + slot;
	u64 *h = latency_log2_by_fd.lookup(&idx);
	if (h)
		(*h)++;

	if (dur >= MIN_NS) {
		struct call_record *r = call_records.ringbuf_reserve(sizeof(struct call_record));
		if (r) {
			r->ts_ns = s->ts;
			r->dur_ns = dur;
			r->offset = s->offset;
			r->size = s->size;
			r->ret = ret;
			r->flags = s->flags;
			r->offcpu_ns = offcpu;
			r->runq_ns = runq;
			r->reclaim_ns = s->reclaim_ns;
			r->bio_ns = bio_ns;
			r->pid = pid_tgid >> 32;
			r->tid = (u32)pid_tgid;
			r->fd = s->fd;
			r->pages_added = s->pages_added;
			r->bio_count = s->bio_count;
			r->syscall = s->syscall;
			r->__pad0 = 0;
			call_records.ringbuf_submit(r, BPF_RB_NO_WAKEUP);
		} else if (t) {
			t->lost_records++;
		}
	} else if (t) {
		t->filtered++;
	}
	s->ts = 0;
}

#if USE_RAW_SYSCALLS
/* raw_syscalls: one cheap hook for every syscall; the id filter runs first.  x86_64 only. */
#define NR_PREAD64 17
#define NR_PREADV 295
#define NR_PREADV2 327
RAW_TRACEPOINT_PROBE(sys_enter)
{
	u64 id = ctx->args[1];
	if (id != NR_PREADV2 && id != NR_PREADV && id != NR_PREAD64)
		return 0;
	if (!is_target(bpf_get_current_pid_tgid()))
		return 0;
	/* one read of the saved registers (cheaper than one probe read per argument) */
	struct pt_regs regs = {};
	bpf_probe_read_kernel(&regs, sizeof(regs), (void *)ctx->args[0]);
	u64 a0 = regs.di, a1 = regs.si, a2 = regs.dx, a3 = regs.r10;
	u64 a5 = id == NR_PREADV2 ? regs.r9 : 0;
	if (id == NR_PREAD64) {
		call_enter(SYSCALL_PREAD64, (s32)a0, (s64)a3, a2, 0);
		return 0;
	}
	call_enter(id == NR_PREADV2 ? SYSCALL_PREADV2 : SYSCALL_PREADV, (s32)a0, (s64)a3,
		   iov_bytes((const struct iovec *)a1, a2), a5);
	return 0;
}

RAW_TRACEPOINT_PROBE(sys_exit)
{
	u64 pid_tgid = bpf_get_current_pid_tgid();
	if (!is_target(pid_tgid))
		return 0;
	call_exit(pid_tgid, (s64)ctx->args[1]);
	return 0;
}
#else
TRACEPOINT_PROBE(syscalls, sys_enter_preadv2)
{
	if (!is_target(bpf_get_current_pid_tgid()))
		return 0;
	call_enter(SYSCALL_PREADV2, (s32)args->fd, (s64)args->pos_l,
		   iov_bytes((const struct iovec *)args->vec, args->vlen), (u64)args->flags);
	return 0;
}

TRACEPOINT_PROBE(syscalls, sys_exit_preadv2)
{
	u64 pid_tgid = bpf_get_current_pid_tgid();
	if (!is_target(pid_tgid))
		return 0;
	call_exit(pid_tgid, args->ret);
	return 0;
}

#if HAVE_PREADV
TRACEPOINT_PROBE(syscalls, sys_enter_preadv)
{
	if (!is_target(bpf_get_current_pid_tgid()))
		return 0;
	call_enter(SYSCALL_PREADV, (s32)args->fd, (s64)args->pos_l,
		   iov_bytes((const struct iovec *)args->vec, args->vlen), 0);
	return 0;
}

TRACEPOINT_PROBE(syscalls, sys_exit_preadv)
{
	u64 pid_tgid = bpf_get_current_pid_tgid();
	if (!is_target(pid_tgid))
		return 0;
	call_exit(pid_tgid, args->ret);
	return 0;
}
#endif

#if HAVE_PREAD64
TRACEPOINT_PROBE(syscalls, sys_enter_pread64)
{
	if (!is_target(bpf_get_current_pid_tgid()))
		return 0;
	call_enter(SYSCALL_PREAD64, (s32)args->fd, (s64)args->pos, args->count, 0);
	return 0;
}

TRACEPOINT_PROBE(syscalls, sys_exit_pread64)
{
	u64 pid_tgid = bpf_get_current_pid_tgid();
	if (!is_target(pid_tgid))
		return 0;
	call_exit(pid_tgid, args->ret);
	return 0;
}
#endif
#endif /* USE_RAW_SYSCALLS */

#if HAVE_FILEMAP
/* Fires in the context of the thread inserting the page: for a buffered read miss, the
 * reader itself (sync readahead).  Pages inserted by another thread's readahead that this
 * call then waits on are NOT counted here (they show up as off-CPU time instead). */
TRACEPOINT_PROBE(filemap, mm_filemap_add_to_page_cache)
{
	if (!is_target(bpf_get_current_pid_tgid()))
		return 0;
	struct inflight *s = current_call();
	if (s)
		s->pages_added += 1 << args->order;
	return 0;
}
#endif

#if HAVE_BIO
/* A bio queued by the reading thread during the call.  Its completion is seen at the request
 * level (block_rq_complete, interrupt context; block_bio_complete only fires for bio-based
 * drivers): a bio that starts its request matches it by device and first sector.  A bio
 * back-merged into an earlier request is dropped from matching (counted in bio_count, not in
 * bio_ns).  bio_ns counts only bios that completed while their call was still in flight: the
 * I/O the call actually waited for.  Bios held by a throttle are queued later from a worker
 * thread and are not attributed (the wait appears as off-CPU time).  A bio whose slot of the
 * bio table is held by another bio in flight is not tracked either (call_totals.bios_untracked). */

TRACEPOINT_PROBE(block, block_bio_queue)
{
	if (!is_target(bpf_get_current_pid_tgid()))
		return 0;
	struct inflight *s = current_call();
	if (!s)
		return 0;
	s->bio_count++;
	if (bio_claim(args->dev, args->sector, bpf_ktime_get_ns(), s->ts, (u32)bpf_get_current_pid_tgid())) {
		int zero = 0;
		struct call_totals *t = call_totals.lookup(&zero);
		if (t)
			t->bios_untracked++;
	}
	return 0;
}

TRACEPOINT_PROBE(block, block_bio_backmerge)
{
	if (!is_target(bpf_get_current_pid_tgid()))
		return 0;
	struct bio_found b;
	bio_completed(args->dev, args->sector, &b);  /* merged: no completion of its own to time */
	return 0;
}

/* the completion hooks: the count of taken slots comes first (probes/bios.h) */
static __always_inline void bio_done(u32 dev, u64 sector)
{
	struct bio_found b;
	if (!bio_completed(dev, sector, &b))
		return;
	u64 delta = bpf_ktime_get_ns() - b.ts;
	u32 tid = b.tid;
	u64 call_ts = b.owner_ts;
	u32 slot = bpf_log2l(delta);
	if (slot >= LAT_SLOTS)
		slot = LAT_SLOTS - 1;
	u64 *h = bio_latency_log2.lookup(&slot);
	if (h)
		__sync_fetch_and_add(h, 1);
	/* credit the call that queued it; if that call already returned (an RWF_NOWAIT call that
	 * started readahead and got EAGAIN), the exit hook will see a different call_ts and drop it */
	struct bio_wait *w = bio_wait_by_tid.lookup(&tid);
	if (!w || w->call_ts != call_ts) {
		struct bio_wait fresh = {.call_ts = call_ts};
		bio_wait_by_tid.update(&tid, &fresh);
		w = bio_wait_by_tid.lookup(&tid);
		if (!w)
			return;
	}
	__sync_fetch_and_add(&w->ns, delta);
	__sync_fetch_and_add(&w->count, 1);
}

/* request-based devices (NVMe, SCSI, virtio, loop): the request's first sector is the bio's */
TRACEPOINT_PROBE(block, block_rq_complete)
{
	bio_done(args->dev, args->sector);
	return 0;
}

/* bio-based devices (device-mapper / LVM, md, zram, NVMe multipath's head) complete the bio
 * itself and make no request: without this their bios never left the bio table (no bio time
 * for the call, and slots held until they go stale).  For a request-based device the bio's sector has advanced by then: no match.
 * (As old as block_bio_queue: compiled with HAVE_BIO.) */
TRACEPOINT_PROBE(block, block_bio_complete)
{
	bio_done(args->dev, args->sector);
	return 0;
}
#endif

static __always_inline void reclaim_begin(void)
{
	if (!is_target(bpf_get_current_pid_tgid()))
		return;
	struct inflight *s = current_call();
	if (s)
		s->reclaim_start = bpf_ktime_get_ns();
}

static __always_inline void reclaim_end(void)
{
	if (!is_target(bpf_get_current_pid_tgid()))
		return;
	struct inflight *s = current_call();
	if (s && s->reclaim_start) {
		s->reclaim_ns += bpf_ktime_get_ns() - s->reclaim_start;
		s->reclaim_start = 0;
	}
}

#if HAVE_VMSCAN_DIRECT
TRACEPOINT_PROBE(vmscan, mm_vmscan_direct_reclaim_begin) { reclaim_begin(); return 0; }
TRACEPOINT_PROBE(vmscan, mm_vmscan_direct_reclaim_end) { reclaim_end(); return 0; }
#endif
#if HAVE_VMSCAN_MEMCG
TRACEPOINT_PROBE(vmscan, mm_vmscan_memcg_reclaim_begin) { reclaim_begin(); return 0; }
TRACEPOINT_PROBE(vmscan, mm_vmscan_memcg_reclaim_end) { reclaim_end(); return 0; }
#endif

#if HAVE_SCHED
/* sched_switch runs in the context of the task being switched out (prev = current). */
TRACEPOINT_PROBE(sched, sched_switch)
{
	u64 now = 0;
	u32 next = args->next_pid;
	u64 *w = call_out_word(next);
	if (!w || (*w & tid_bit(next))) {
		if (w)
			__sync_fetch_and_and(w, ~tid_bit(next));
		struct offcpu_state *o = offcpu_by_tid.lookup(&next);
		if (o && o->out_ts) {
			now = bpf_ktime_get_ns();
			u64 gap = now - o->out_ts;
			o->offcpu_ns += gap;
			if (o->preempted)
				o->runq_ns += gap;
			else if (o->wake_ts)
				o->runq_ns += now - o->wake_ts;
			o->out_ts = 0;
			o->wake_ts = 0;
		}
	}
	if (!is_target(bpf_get_current_pid_tgid()))
		return 0;
	struct inflight *s = current_call();
	if (!s)
		return 0;
	u32 prev = (u32)bpf_get_current_pid_tgid();
	struct offcpu_state init = {};
	if (!s->switched)
		offcpu_by_tid.update(&prev, &init);
	struct offcpu_state *o = offcpu_by_tid.lookup(&prev);
	if (!o)
		return 0;
	if (!now)
		now = bpf_ktime_get_ns();
	s->switched = 1;
	o->out_ts = now;
	o->wake_ts = 0;
	/* no sleep-state bit (S D T t X Z P): preempted, still runnable.  Kernels report a
	 * preemption as 0 or as TASK_REPORT_MAX (0x80); both pass this test. */
	o->preempted = (args->prev_state & 0x7f) == 0;
	u64 *pw = call_out_word(prev);
	if (pw)
		__sync_fetch_and_or(pw, tid_bit(prev));
	return 0;
}

TRACEPOINT_PROBE(sched, sched_wakeup)
{
	u32 pid = args->pid;
	u64 *w = call_out_word(pid);
	if (w && !(*w & tid_bit(pid)))
		return 0;
	struct offcpu_state *o = offcpu_by_tid.lookup(&pid);
	if (o && o->out_ts && !o->wake_ts)
		o->wake_ts = bpf_ktime_get_ns();
	return 0;
}
#endif

#if HAVE_KSWAPD
/* kswapd wake (fires in the allocating task) and sleep (in kswapd): system-wide spans of
 * background reclaim, to line up with the calls. */
static __always_inline void vm_event(u32 kind, s32 nid)
{
	struct vm_event *e = vm_events.ringbuf_reserve(sizeof(struct vm_event));
	if (!e) {
		int zero = 0;
		struct call_totals *t = call_totals.lookup(&zero);
		if (t)
			t->vm_events_lost++;
		return;
	}
	e->ts_ns = bpf_ktime_get_ns();
	e->nid = nid;
	e->kind = kind;
	vm_events.ringbuf_submit(e, BPF_RB_NO_WAKEUP);
}

TRACEPOINT_PROBE(vmscan, mm_vmscan_kswapd_wake) { vm_event(VM_KSWAPD_WAKE, args->nid); return 0; }
TRACEPOINT_PROBE(vmscan, mm_vmscan_kswapd_sleep) { vm_event(VM_KSWAPD_SLEEP, args->nid); return 0; }
#endif
