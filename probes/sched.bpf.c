/* sched.bpf.c - every off-CPU span of the target's threads, in or out of a read, with its waker.
 *
 * Tracepoints only.  sched_switch runs in the context of the task being switched out (prev =
 * current): when prev is a target thread a span opens (its state says preempted, i.e. still
 * runnable, or a voluntary sleep); when next is a thread with an open span, the span closes
 * and one fixed-size record goes into the `offcpu_records` ring without waking user space (it
 * drains on a timer).  sched_waking (in the waker's own context, unlike sched_wakeup, which
 * may run on the wakee's CPU from the wake list, in whatever task is current there) and
 * sched_wakeup_new note who woke the thread.
 *
 * Cost: this fires on every context switch of the machine.  The fast path for a task that is
 * not a target is one helper call (bpf_get_current_pid_tgid), a compare, and one bit test in
 * a plain array (an inlined lookup, no helper) for "is next a target thread with a span open";
 * only target threads touch the span hash and the ring.
 *
 * Constants filled in before load (-D):
 *   TARGET_TGID, TARGET_TID, MATCH_TGIDS, MATCH_CGROUPS, FOLLOW_CHILDREN  which processes
 *                 (probes/targets.h)
 *   RING_PAGES    ring buffer size in pages
 *   TID_WORDS     u64 words of the open-span bitmap (covers tids < 64 * TID_WORDS)
 *   MAX_THREADS   entries of the span-state hash
 *   HAVE_WAKING, HAVE_WAKEUP, HAVE_WAKEUP_NEW, HAVE_NEWTASK  feature-probed tracepoints
 *                 (waking is preferred; sched_wakeup is the fallback when waking is absent;
 *                 task_newtask tells a new thread from a forked process: without it a
 *                 forked child's first wait is recorded too)
 */
#include "sched.h"

/* prev_state as the tracepoint reports it: 0 runnable, S D T t X Z P I bits, and
 * TASK_REPORT_MAX (0x100 here, 0x80 on older kernels) added for a preemption */
#define STATE_SLEEP_BITS 0x7f   /* S D T t X Z P */
#define STATE_DEAD_BITS  0x30   /* X (EXIT_DEAD), Z (EXIT_ZOMBIE): the thread's last switch */

struct span_state {
	u64 start_ns;
	s32 waker_tid;
	s32 waker_pid;
	u32 preempted;
	u32 __pad0;
};

BPF_HASH(span_by_tid, u32, struct span_state, MAX_THREADS);
/* a span of that target thread is open: one bit per tid (probes/tidbits.h; a tid past the array
 * has no word: not traced) */
BPF_ARRAY(open_spans, u64, TID_WORDS);
#include "tidbits.h"
BPF_RINGBUF_OUTPUT(offcpu_records, RING_PAGES);
BPF_PERCPU_ARRAY(offcpu_totals, struct offcpu_totals, 1);
/* never written: lets user space read the layout clang compiled */
BPF_ARRAY(offcpu_record_layout, struct offcpu_record, 1);
BPF_ARRAY(offcpu_totals_layout, struct offcpu_totals, 1);

/* is_target(pid_tgid): probes/targets.h (one pid, a set of pids, cgroups, children) */
#include "targets.h"

static __always_inline u64 *open_word(u32 tid)
{
	u32 w = tid_word_index(tid);
	return open_spans.lookup(&w);   /* array: inlined, bounds-checked */
}

static __always_inline void span_open(u32 tid, u64 now, u32 preempted, s32 waker_tid, s32 waker_pid)
{
	struct span_state *s = span_by_tid.lookup(&tid);
	if (!s) {
		struct span_state init = {};
		span_by_tid.update(&tid, &init);
		s = span_by_tid.lookup(&tid);
		if (!s) {
			int zero = 0;
			struct offcpu_totals *t = offcpu_totals.lookup(&zero);
			if (t)
				t->no_state++;
			return;
		}
	}
	s->start_ns = now;
	s->preempted = preempted;
	s->waker_tid = waker_tid;
	s->waker_pid = waker_pid;
	tid_bit_set(open_word(tid), tid);
}

static __always_inline void span_close(u32 tid, u64 *w, u64 now)
{
	tid_bit_drop(w, tid);
	struct span_state *s = span_by_tid.lookup(&tid);
	if (!s)
		return;
	int zero = 0;
	struct offcpu_totals *t = offcpu_totals.lookup(&zero);
	if (t) {
		t->spans++;
		t->sum_ns += now - s->start_ns;
		if (s->preempted)
			t->preempted++;
		if (s->waker_tid >= 0)
			t->woken++;
	}
	struct offcpu_record *r = offcpu_records.ringbuf_reserve(sizeof(struct offcpu_record));
	if (!r) {
		if (t)
			t->lost_records++;
		return;
	}
	r->start_ns = s->start_ns;
	r->end_ns = now;
	r->tid = tid;
	r->waker_tid = s->waker_tid;
	r->waker_pid = s->waker_pid;
	r->preempted = s->preempted;
	offcpu_records.ringbuf_submit(r, BPF_RB_NO_WAKEUP);
}

TRACEPOINT_PROBE(sched, sched_switch)
{
	u64 pid_tgid = bpf_get_current_pid_tgid();
	u64 now = 0;
	/* next first: its span ends now */
	u32 next = args->next_pid;
	u64 *w = open_word(next);
	if (tid_bit_is_set(w, next)) {
		now = bpf_ktime_get_ns();
		span_close(next, w, now);
	}
	if (!is_target(pid_tgid))
		return 0;
	u32 prev = (u32)pid_tgid;
	if (prev == 0)
		return 0;
	long state = args->prev_state;
	if (state & STATE_DEAD_BITS) {  /* exiting: no span; forget the thread */
		span_by_tid.delete(&prev);
		return 0;
	}
	if (!now)
		now = bpf_ktime_get_ns();
	span_open(prev, now, (state & STATE_SLEEP_BITS) == 0, -1, -1);
	return 0;
}

static __always_inline void woken(u32 tid)
{
	if (!tid_bit_is_set(open_word(tid), tid))
		return;
	struct span_state *s = span_by_tid.lookup(&tid);
	if (!s || s->waker_tid >= 0)
		return;
	u64 cur = bpf_get_current_pid_tgid();
	s->waker_tid = (s32)(u32)cur;
	s->waker_pid = (s32)(cur >> 32);
}

#if HAVE_WAKING
TRACEPOINT_PROBE(sched, sched_waking)
{
	woken(args->pid);
	return 0;
}
#elif HAVE_WAKEUP
TRACEPOINT_PROBE(sched, sched_wakeup)
{
	woken(args->pid);
	return 0;
}
#endif

#if HAVE_WAKEUP_NEW
#define CLONE_THREAD_FLAG 0x00010000
#if HAVE_NEWTASK
/* A thread (CLONE_THREAD) created by a target thread: note it, so that sched_wakeup_new opens
 * a span for it and not for a forked child process (another tgid, not traced). */
TRACEPOINT_PROBE(task, task_newtask)
{
	if (!is_target(bpf_get_current_pid_tgid()) || !(args->clone_flags & CLONE_THREAD_FLAG))
		return 0;
	u32 tid = args->pid;
	struct span_state init = {.waker_tid = -1, .waker_pid = -1};
	span_by_tid.update(&tid, &init);
	return 0;
}
#endif

/* A new thread of the target, woken for the first time by its creator (current): its first
 * wait for a CPU is a span, preempted (runnable from the start), woken by the creator. */
TRACEPOINT_PROBE(sched, sched_wakeup_new)
{
	u64 cur = bpf_get_current_pid_tgid();
	if (!is_target(cur))
		return 0;
#if TARGET_TID
	return 0;  /* tracing one thread: a new thread is not it */
#endif
	u32 tid = args->pid;
#if HAVE_NEWTASK
	if (!span_by_tid.lookup(&tid))
		return 0;  /* not a thread of the target (a fork): not traced */
#endif
	span_open(tid, bpf_ktime_get_ns(), 1, (s32)(u32)cur, (s32)(cur >> 32));
	return 0;
}
#endif
