/* syscalls.bpf.c - per-call preadv2 / preadv / pread64 / read / readv tracing with each call's cause
 * evidence.
 *
 * Tracepoints only (no kprobes, no fentry).  The enter hook stores the call in task-local
 * storage; evidence hooks that fire in the reading thread's context while the call is in
 * flight (page-cache insertions, bio queueing, direct/memcg reclaim, being switched out) add
 * to that storage (the in-flight call, its syscall, bio, reclaim and scheduler hooks:
 * probes/inflight.h, shared with the exporter's probe); the exit hook writes one fixed-size record into the `call_records` ring
 * buffer without waking user space (it drains on a timer) and updates in-kernel totals and
 * per-fd log2 latency histograms.
 *
 * The file of every call is walked in the kernel at entry (probes/targets.h fd_file_walk: the
 * fd's file, its inode and superblock): the record carries its device and inode (a path is a name
 * for that identity, given in user space, never a guess from the fd number, which another file
 * may have had), whether it was open with O_DIRECT, and for read() / readv() the file position
 * (the offset).  read() and readv() of anything but a regular file are counted apart
 * (nonregular_skipped) and not traced.  The --file verdict reuses the same walk.
 *
 * Constants filled in before load (-D):
 *   TARGET_TGID, TARGET_TID, MATCH_TGIDS, MATCH_CGROUPS, FOLLOW_CHILDREN  which processes,
 *   MATCH_FILES   which files (--file) (probes/targets.h)
 *   OFF_*         the fd -> file -> inode walk's member offsets (engramprof/bpf/btf.py FD_WALK)
 *   O_DIRECT_BIT  the architecture's O_DIRECT
 *   MIN_NS        record only calls at least this long (all calls are still counted)
 *   RING_PAGES    ring buffer size in pages
 *   BIO_SLOTS, BIO_STALE_NS  the in-flight bio table (probes/bios.h)
 *   USE_RAW_SYSCALLS  1: hook raw_syscalls sys_enter/sys_exit (x86_64 only, cheaper);
 *                     0: the syscalls:sys_{enter,exit}_{preadv2,preadv,pread64,read,readv} tracepoints
 *   HAVE_PREADV, HAVE_PREAD64, HAVE_READ, HAVE_READV, HAVE_FILEMAP, HAVE_BIO, HAVE_VMSCAN_DIRECT, HAVE_VMSCAN_MEMCG,
 *   HAVE_SCHED, HAVE_KSWAPD  feature-probed tracepoints; evidence for a missing one is left at 0 and the
 *                 trace says which columns are absent
 *   NATIVE_STACKS, NATIVE_EVERY_NS, NATIVE_RING_PAGES  a read's user stack for its native frames
 *                 (probes/native.h; 0: compiled out)
 *   TID_WORDS     u64 words of call_out_bits, the switched-out-in-a-call bitmap (HAVE_SCHED:
 *                 tids < 64 * TID_WORDS; probes/tidbits.h)
 */
/* struct pt_regs, struct iovec, S_IFMT (probes/kernel_types.h: not the kernel headers) */
#include "kernel_types.h"
#include "syscalls.h"
/* NATIVE_STACKS: a read's user stack, copied at its exit for the native frames (probes/native.h) */
#include "native.h"

#define FD_WALK 1               /* every call's file: its dev, ino, O_DIRECT, read()'s f_pos */
#define INFLIGHT_PLAIN_READS 1  /* read() and readv() are traced calls */

#if HAVE_BIO
/* bio_slots, bio_slots_taken: the bios the target's calls queued, until their completion (the
 * owner's time in a slot is the call's entry time: it identifies the call) */
#include "bios.h"
#endif
BPF_RINGBUF_OUTPUT(call_records, RING_PAGES);
BPF_RINGBUF_OUTPUT(vm_events, 16);
BPF_PERCPU_ARRAY(call_totals, struct call_totals, 1);
BPF_PERCPU_ARRAY(latency_log2_by_fd, u64, FD_SLOTS * LAT_SLOTS);
/* never written: lets user space read the layout clang compiled */
BPF_ARRAY(call_record_layout, struct call_record, 1);
BPF_ARRAY(call_totals_layout, struct call_totals, 1);
BPF_ARRAY(vm_event_layout, struct vm_event, 1);

/* is_target(pid_tgid): probes/targets.h (one pid, a set of pids, cgroups, children) */
#include "targets.h"
/* struct inflight in task storage, offcpu_by_tid, bio_wait_by_tid, call_out_bits,
 * bio_latency_log2; the syscall, bio, reclaim and sched_wakeup hooks: probes/inflight.h */
#include "inflight.h"

static __always_inline void nonregular_skipped(void)
{
	int zero = 0;
	struct call_totals *t = call_totals.lookup(&zero);
	if (t)
		t->nonregular_skipped++;
}

/* A target thread entered a read call (is_target passed): one walk of its fd names the file for
 * both --file and the record (probes/targets.h).  read() / readv() read from the file position,
 * and only a regular file's read is a table read: a pipe, socket, tty, or a file of procfs, sysfs
 * or another pseudo filesystem (PSEUDO_FS) is counted (nonregular_skipped) and not traced.  preadv2 / preadv / pread64 are traced on any file,
 * and their walk reads only the identity and f_flags (FD_ID: smaller spans of the file and inode). */
static __always_inline void call_enter(u16 sc, s32 fd, s64 offset, u64 size, u64 flags)
{
	struct fd_file f;
	int plain = sc == SYSCALL_READ || sc == SYSCALL_READV;  /* a constant at each call site */
	if (!target_fd_file_parts(fd, &f, plain ? FD_ALL : FD_ID))
		return;      /* --file: a read of another file */
	if (plain) {
		if ((f.mode & S_IFMT) != S_IFREG || f.pseudo) {
			nonregular_skipped();
			return;
		}
		offset = f.pos;
	}
	struct inflight *s = task_state(1);
	if (!s)
		return;
	call_begin(s, sc, fd, offset, size, flags, &f);
}

static __always_inline void call_exit(u64 pid_tgid, s64 ret)
{
	u64 now = bpf_ktime_get_ns();
	struct inflight *s = current_call();
	if (!s)
		return;      /* entered before we attached, or not a traced call */
	u64 dur = now - s->ts;
	u64 offcpu, runq, bio_ns;
	call_evidence(s, (u32)pid_tgid, &offcpu, &runq, &bio_ns);

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

#if NATIVE_STACKS
	native_stack_take(s->ts, pid_tgid, now);
#endif
	if (dur >= MIN_NS) {
		struct call_record *r = call_records.ringbuf_reserve(sizeof(struct call_record));
		if (r) {
			call_record_fill(r, s, pid_tgid, dur, ret, offcpu, runq, bio_ns);
			call_records.ringbuf_submit(r, BPF_RB_NO_WAKEUP);
		} else if (t) {
			t->lost_records++;
		}
	} else if (t) {
		t->filtered++;
	}
	s->ts = 0;
}

#if HAVE_BIO
static __always_inline void call_bio_untracked(void)
{
	int zero = 0;
	struct call_totals *t = call_totals.lookup(&zero);
	if (t)
		t->bios_untracked++;
}

static __always_inline void call_bio_done(u64 delta)
{
}
#endif

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

#if HAVE_SCHED
/* sched_switch runs in the context of the task being switched out (prev = current). */
TRACEPOINT_PROBE(sched, sched_switch)
{
	u64 now = call_switched_in(args->next_pid);
	if (!is_target(bpf_get_current_pid_tgid()))
		return 0;
	struct inflight *s = current_call();
	if (!s)
		return 0;
	if (call_switched_out((u32)bpf_get_current_pid_tgid(), !s->switched, switch_preempted(args->prev_state), now))
		s->switched = 1;
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
