/* inflight.h - the in-flight read call shared by the syscall probe (probes/syscalls.bpf.c) and the
 * exporter's (probes/export.bpf.c): the call in task-local storage from its entry to its exit,
 * and the evidence hooks that fire in the reading thread while it is in flight (bios queued and
 * their queue -> complete time, direct / memcg reclaim, being switched out and waiting for a CPU).
 *
 * The syscall hooks (raw_syscalls sys_enter / sys_exit, or the syscalls:sys_{enter,exit}_
 * {preadv2,preadv,pread64} tracepoints), the bio, reclaim and sched_wakeup hooks are here.  What
 * each probe does with a call is its own: the including probe defines
 *   call_enter(sc, fd, offset, size, flags)  a call entered (its checks, then call_begin())
 *   call_exit(pid_tgid, ret)                 a call returned (call_evidence(), then its accounting)
 *   call_bio_untracked()                     (HAVE_BIO) a bio of a call its bio-table slot did not take
 *   call_bio_done(delta)                     (HAVE_BIO) a bio of a call completed after delta ns
 * and its own sched_switch, built from call_switched_in() and call_switched_out() (the exporter
 * also times sleeps inside page faults there), and mm_filemap_add_to_page_cache.  A probe that
 * defines INFLIGHT_EVERY_SYSCALL to 1 also defines every_syscall(pid_tgid), run at the raw
 * sys_enter of every target syscall before the preadv id filter.  INFLIGHT_EXTRA: more members
 * of struct inflight (the exporter's file and open fault).
 *
 * Included after probes/targets.h (is_target) and, with HAVE_BIO, probes/bios.h.
 *
 * Constants (-D): USE_RAW_SYSCALLS, HAVE_PREADV, HAVE_PREAD64, HAVE_READ, HAVE_READV (with
 * INFLIGHT_PLAIN_READS), HAVE_BIO, HAVE_VMSCAN_DIRECT, HAVE_VMSCAN_MEMCG, HAVE_SCHED, TID_WORDS
 * (probes/tidbits.h), O_DIRECT_BIT (the architecture's O_DIRECT: struct inflight's direct).
 */
#ifndef ENGRAMPROF_INFLIGHT_H
#define ENGRAMPROF_INFLIGHT_H

/* struct pt_regs, struct iovec */
#include "kernel_types.h"
#include "tidbits.h"
/* bpf_probe_read_user without BCC's per-call kallsyms look-up */
#include "readuser.h"

#define MAX_IOV 8
#define RWF_NOWAIT_BIT 0x00000008
#define EAGAIN_RET (-11)

#ifndef INFLIGHT_EXTRA
#define INFLIGHT_EXTRA
#endif
#ifndef INFLIGHT_EVERY_SYSCALL
#define INFLIGHT_EVERY_SYSCALL 0
#endif
/* 1: read() and readv() are traced calls too (their offset is the file position: the including
 * probe's call_enter reads it from the fd's file) */
#ifndef INFLIGHT_PLAIN_READS
#define INFLIGHT_PLAIN_READS 0
#endif

struct inflight {
	u64 ts;           /* entry ns; 0 = no call in flight */
	s64 offset;
	u64 size;
	u64 flags;
	u64 reclaim_start;
	u64 reclaim_ns;
	u64 file_ino;     /* the file the fd named at entry (struct fd_file, probes/targets.h); 0: not walked */
	u32 file_dev;
	s32 fd;
	u32 pages_added;
	u32 bio_count;
	u16 syscall;
	u8 switched;      /* switched out during the call: collect offcpu_by_tid at exit */
	u8 direct;        /* the fd had O_DIRECT at entry */
	INFLIGHT_EXTRA
};

/* off-CPU bookkeeping for threads switched out in the middle of a traced call (the exporter's
 * sleeps inside a page fault too) */
struct offcpu_state {
	u64 out_ts;       /* switched out at; 0 = running */
	u64 in_ts;        /* last switch back in (the exporter's fault end) */
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
/* a target thread is switched out inside a traced call (its offcpu_by_tid entry has out_ts
 * set): probes/tidbits.h */
BPF_ARRAY(call_out_bits, u64, TID_WORDS);

static __always_inline u64 *call_out_word(u32 tid)
{
	u32 w = tid_word_index(tid);
	return call_out_bits.lookup(&w);  /* array: inlined, bounds-checked */
}
#endif
BPF_HASH(offcpu_by_tid, u32, struct offcpu_state, 4096);
BPF_HASH(bio_wait_by_tid, u32, struct bio_wait, 4096);
/* queue -> complete of every bio a target thread queued inside a traced call: the device's own
 * service time, the baseline a slow miss is compared against */
BPF_ARRAY(bio_latency_log2, u64, LAT_SLOTS);

/* what the including probe defines (see above) */
static __always_inline void call_enter(u16 sc, s32 fd, s64 offset, u64 size, u64 flags);
static __always_inline void call_exit(u64 pid_tgid, s64 ret);
#if HAVE_BIO
static __always_inline void call_bio_untracked(void);
static __always_inline void call_bio_done(u64 delta);
#endif
#if INFLIGHT_EVERY_SYSCALL
static __always_inline void every_syscall(u64 pid_tgid);
#endif

/* the current thread's task storage (create: make it when absent) */
static __always_inline struct inflight *task_state(int create)
{
	return inflight_by_task.task_storage_get(bpf_get_current_task_btf(), 0,
						 create ? BPF_LOCAL_STORAGE_GET_F_CREATE : 0);
}

/* the current thread's call in flight, or 0 */
static __always_inline struct inflight *current_call(void)
{
	struct inflight *s = task_state(0);
	if (s && s->ts)
		return s;
	return 0;
}

/* start the call in s on the file f (its walk at entry: fd_file_walk; zeroed when the probe did
 * not walk the fd), entry time last: it marks the call in flight */
static __always_inline void call_begin(struct inflight *s, u16 sc, s32 fd, s64 offset, u64 size, u64 flags,
				       const struct fd_file *f)
{
	s->offset = offset;
	s->size = size;
	s->flags = flags;
	s->reclaim_start = 0;
	s->reclaim_ns = 0;
	s->fd = fd;
	s->file_ino = f->ino;
	s->file_dev = f->dev;
	s->direct = (f->flags & O_DIRECT_BIT) != 0;
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

/* tid's offcpu_by_tid entry is deleted: a bit of call_out_bits its switch-in did not clear goes
 * with it, or an untraced thread reusing the tid pays lookups */
static __always_inline void call_out_clear(u32 tid)
{
#if HAVE_SCHED
	tid_bit_clear(call_out_word(tid), tid);
#endif
}

/* At the exit of the call s of thread tid: its off-CPU and run-queue time, and the time of its
 * bios that completed while it was in flight (the entries go). */
static __always_inline void call_evidence(struct inflight *s, u32 tid, u64 *offcpu, u64 *runq, u64 *bio_ns)
{
	*offcpu = 0;
	*runq = 0;
	*bio_ns = 0;
	if (s->switched) {
		struct offcpu_state *o = offcpu_by_tid.lookup(&tid);
		if (o) {
			*offcpu = o->offcpu_ns;
			*runq = o->runq_ns;
			offcpu_by_tid.delete(&tid);
		}
		call_out_clear(tid);
	}
	if (s->bio_count) {
		struct bio_wait *w = bio_wait_by_tid.lookup(&tid);
		if (w) {
			if (w->call_ts == s->ts)
				*bio_ns = w->ns;
			bio_wait_by_tid.delete(&tid);
		}
	}
}

/* the record of the call s (engramprof.h) */
static __always_inline void call_record_fill(struct call_record *r, struct inflight *s, u64 pid_tgid, u64 dur,
					     s64 ret, u64 offcpu, u64 runq, u64 bio_ns)
{
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
	r->ino = s->file_ino;
	r->pid = pid_tgid >> 32;
	r->tid = (u32)pid_tgid;
	r->fd = s->fd;
	r->pages_added = s->pages_added;
	r->bio_count = s->bio_count;
	r->dev = s->file_dev;
	r->syscall = s->syscall;
	r->direct = s->direct;
	r->__pad0 = 0;
	r->__pad1 = 0;
}

/* ---- the calls: preadv2 / preadv / pread64 (and read / readv: INFLIGHT_PLAIN_READS) ---- */

#if USE_RAW_SYSCALLS
/* raw_syscalls: one cheap hook for every syscall; the id filter runs first.  x86_64 only. */
#define NR_READ 0
#define NR_READV 19
#define NR_PREAD64 17
#define NR_PREADV 295
#define NR_PREADV2 327
/* pt_regs from r10 (the 4th argument) to di (the 1st), r9 (the 6th) among them */
#define REGS_SPAN (__builtin_offsetof(struct pt_regs, di) + 8 - __builtin_offsetof(struct pt_regs, r10))
#if INFLIGHT_PLAIN_READS
#define TRACED_ID(id) ((id) == NR_PREADV2 || (id) == NR_PREADV || (id) == NR_PREAD64 || (id) == NR_READ || (id) == NR_READV)
#else
#define TRACED_ID(id) ((id) == NR_PREADV2 || (id) == NR_PREADV || (id) == NR_PREAD64)
#endif
RAW_TRACEPOINT_PROBE(sys_enter)
{
	u64 id = ctx->args[1];
#if INFLIGHT_EVERY_SYSCALL
	u64 pt = bpf_get_current_pid_tgid();
	if (!is_target(pt))
		return 0;
	every_syscall(pt);
	if (!TRACED_ID(id))
		return 0;
#else
	if (!TRACED_ID(id))
		return 0;
	if (!is_target(bpf_get_current_pid_tgid()))
		return 0;
#endif
	/* one read of the saved registers the arguments are in, r10..di (cheaper than one probe
	 * read per argument; 64 of pt_regs' 168 bytes) */
	struct pt_regs regs = {};
	bpf_probe_read_kernel(&regs.r10, REGS_SPAN, (char *)ctx->args[0] + __builtin_offsetof(struct pt_regs, r10));
	u64 a0 = regs.di, a1 = regs.si, a2 = regs.dx, a3 = regs.r10;
	u64 a5 = id == NR_PREADV2 ? regs.r9 : 0;
	if (id == NR_PREAD64) {
		call_enter(SYSCALL_PREAD64, (s32)a0, (s64)a3, a2, 0);
		return 0;
	}
#if INFLIGHT_PLAIN_READS
	if (id == NR_READ) {
		call_enter(SYSCALL_READ, (s32)a0, -1, a2, 0);
		return 0;
	}
	if (id == NR_READV) {
		call_enter(SYSCALL_READV, (s32)a0, -1, iov_bytes((const struct iovec *)a1, a2), 0);
		return 0;
	}
#endif
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
static __always_inline int target_call_exit(s64 ret)
{
	u64 pid_tgid = bpf_get_current_pid_tgid();
	if (!is_target(pid_tgid))
		return 0;
	call_exit(pid_tgid, ret);
	return 0;
}

/* One syscall's tracepoint pair: its entry starts the target's call (SYSCALL_* code, fd, file
 * offset, bytes asked for, RWF_* flags: expressions of the entry's args), its exit ends it.
 * (BCC refuses a map call written inside a macro: the bodies only call functions.) */
#define CALL_HOOKS(name, code, fd, pos, bytes, flags)				\
TRACEPOINT_PROBE(syscalls, sys_enter_##name)					\
{										\
	if (!is_target(bpf_get_current_pid_tgid()))				\
		return 0;							\
	call_enter(code, fd, pos, bytes, flags);				\
	return 0;								\
}										\
TRACEPOINT_PROBE(syscalls, sys_exit_##name)					\
{										\
	return target_call_exit(args->ret);					\
}

#define ARGS_IOV_BYTES iov_bytes((const struct iovec *)args->vec, args->vlen)

CALL_HOOKS(preadv2, SYSCALL_PREADV2, (s32)args->fd, (s64)args->pos_l, ARGS_IOV_BYTES, (u64)args->flags)
#if HAVE_PREADV
CALL_HOOKS(preadv, SYSCALL_PREADV, (s32)args->fd, (s64)args->pos_l, ARGS_IOV_BYTES, 0)
#endif
#if HAVE_PREAD64
CALL_HOOKS(pread64, SYSCALL_PREAD64, (s32)args->fd, (s64)args->pos, args->count, 0)
#endif
#if INFLIGHT_PLAIN_READS && HAVE_READ
CALL_HOOKS(read, SYSCALL_READ, (s32)args->fd, -1, args->count, 0)
#endif
#if INFLIGHT_PLAIN_READS && HAVE_READV
CALL_HOOKS(readv, SYSCALL_READV, (s32)args->fd, -1, ARGS_IOV_BYTES, 0)
#endif
#endif /* USE_RAW_SYSCALLS */

/* ---- bios ---- */

#if HAVE_BIO
/* A bio queued by the reading thread during the call.  Its completion is seen at the request
 * level (block_rq_complete, interrupt context; block_bio_complete only fires for bio-based
 * drivers): a bio that starts its request matches it by device and first sector (the bio table
 * of probes/bios.h).  A bio back-merged into an earlier request is dropped from matching
 * (counted in bio_count, not in bio_ns).  bio_ns counts only bios that completed while their
 * call was still in flight: the I/O the call actually waited for.  Bios held by a throttle are
 * queued later from a worker thread and are not attributed (the wait appears as off-CPU time).
 * A bio whose slot of the bio table is held by another bio in flight is not tracked either
 * (call_bio_untracked: the probe's bios_untracked total). */
TRACEPOINT_PROBE(block, block_bio_queue)
{
	if (!is_target(bpf_get_current_pid_tgid()))
		return 0;
	struct inflight *s = current_call();
	if (!s)
		return 0;
	s->bio_count++;
	if (bio_claim(args->dev, args->sector, bpf_ktime_get_ns(), s->ts, (u32)bpf_get_current_pid_tgid()))
		call_bio_untracked();
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

/* the completion hooks (every I/O of the machine, interrupt context): the count of taken slots
 * comes first (probes/bios.h) */
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
	call_bio_done(delta);
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

#if BIO_RAW_COMPLETION
/* raw tracepoints where the kernel's BTF allows (probes/bios.h): not skipped while another
 * BPF program runs on the CPU */
BIO_RAW_COMPLETION_HOOKS(bio_done)
#else
/* request-based devices (NVMe, SCSI, virtio, loop): the request's first sector is the bio's */
TRACEPOINT_PROBE(block, block_rq_complete)
{
	bio_done(args->dev, args->sector);
	return 0;
}

/* bio-based devices (device-mapper / LVM, md, zram, NVMe multipath's head) complete the bio
 * itself and make no request: without this their bios never left the bio table (no bio time
 * for the call, and slots held until they go stale).  For a request-based device the bio's
 * sector has advanced by then: no match.  (As old as block_bio_queue: compiled with HAVE_BIO.) */
TRACEPOINT_PROBE(block, block_bio_complete)
{
	bio_done(args->dev, args->sector);
	return 0;
}
#endif
#endif

/* ---- direct and memcg reclaim inside the call ---- */

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

/* ---- off-CPU: switched out, woken, waiting for a CPU ---- */

#if HAVE_SCHED
/* sched_switch's next task (any task of the machine) is back on a CPU: when it is a target
 * thread switched out inside a call (its bit, or no word: the hash decides), add the gap to its
 * off-CPU time (all of it run-queue wait when it was preempted, else from its wake-up on).
 * Returns the clock read (0: none). */
static __always_inline u64 call_switched_in(u32 next)
{
	u64 now = 0;
	u64 *w = call_out_word(next);
	if (tid_bit_maybe(w, next)) {
		tid_bit_drop(w, next);
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
			o->in_ts = now;
		}
	}
	return now;
}

/* The target thread prev (current) is switched out inside something timed: fresh, its first
 * switch-out there (its offcpu_by_tid entry starts at 0).  now: the clock read of
 * call_switched_in (0: none yet).  Returns 0 when the state map is full. */
static __always_inline int call_switched_out(u32 prev, int fresh, u32 preempted, u64 now)
{
	struct offcpu_state init = {};
	if (fresh)
		offcpu_by_tid.update(&prev, &init);
	struct offcpu_state *o = offcpu_by_tid.lookup(&prev);
	if (!o)
		return 0;
	o->out_ts = now ? now : bpf_ktime_get_ns();
	o->wake_ts = 0;
	o->preempted = preempted;
	tid_bit_set(call_out_word(prev), prev);
	return 1;
}

/* prev_state of sched_switch: no sleep-state bit (S D T t X Z P): preempted, still runnable.
 * Kernels report a preemption as 0 or as TASK_REPORT_MAX (0x80, 0x100); both pass this test. */
static __always_inline u32 switch_preempted(long prev_state)
{
	return (prev_state & 0x7f) == 0;
}

TRACEPOINT_PROBE(sched, sched_wakeup)
{
	u32 pid = args->pid;
	if (!tid_bit_maybe(call_out_word(pid), pid))
		return 0;
	struct offcpu_state *o = offcpu_by_tid.lookup(&pid);
	if (o && o->out_ts && !o->wake_ts)
		o->wake_ts = bpf_ktime_get_ns();
	return 0;
}
#endif

#endif
