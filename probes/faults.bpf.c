/* faults.bpf.c - every file-backed page fault of the target's threads, as a read event with
 * the same in-flight evidence a syscall record gets.
 *
 * Tracepoints only.  There is no fault-exit tracepoint, so a fault is a span opened by its
 * entry and closed by the thread's next user-visible event (docs/model.md, "Page faults:
 * duration").  What fires on Linux 6.18 (measured with bpftrace on a numpy.memmap gather):
 *   cold page:   page_fault_user -> mm_filemap_fault(idx) -> add_to_page_cache -> block_bio_queue
 *                -> sched_switch out (D) ... in -> mm_filemap_map_pages(window with idx: the
 *                VM_FAULT_RETRY pass, no second mm_filemap_fault) -> rseq_update (return to user)
 *   cached page, not mapped: page_fault_user -> mm_filemap_map_pages(window)   (nothing else)
 *   mapped page: nothing.
 * A partly cached window gives mm_filemap_map_pages then mm_filemap_fault in one fault.
 *
 * Per thread (fault_by_tid): the open fault.  Entry = page_fault_user (HAVE_PFU) or the first
 * filemap event.  Every in-fault event (filemap, insertion, bio queued, reclaim end, switch-in,
 * rseq_update) moves its end.  It is closed and written to the ring when the thread:
 *   - enters another fault (a new page_fault_user; without it a filemap event that is not the
 *     fault's own continuation), or a syscall (raw_syscalls:sys_enter),
 *   - returns to user space after a sleep in it (rseq:rseq_update; end = that instant).
 * A preemption does not close it: inside the fault (before its retry pass) the fault goes on
 * after it; in user mode after the fault the fault keeps its end (its last in-fault event).
 * Continuation without page_fault_user: a filemap_fault whose index is in the window of the
 * map_pages that opened the fault; after a filemap_fault, one map_pages whose window holds its
 * page (the retry pass, which follows every cold fault here, slept or not); after a sleep, a
 * filemap_fault for the same page.
 *
 * Major or minor: the kernel's own rule (mm/memory.c mm_account_fault, on the pass that does not
 * return VM_FAULT_RETRY: major = VM_FAULT_MAJOR or FAULT_FLAG_TRIED).  A fault is one exception
 * however many passes it takes.  VM_FAULT_MAJOR comes from filemap_fault() finding the page missing
 * from the page cache: seen as sync readahead / read-around (readahead:page_cache_sync_ra,
 * page_cache_ra_order, page_cache_ra_unbounded not preceded by page_cache_async_ra) after the
 * fault's mm_filemap_fault, or the insertion of the faulting page itself (no readahead:
 * MADV_RANDOM, read_ahead_kb 0, mmap_miss).  FAULT_FLAG_TRIED is set after a pass under the
 * mmap lock returned VM_FAULT_RETRY (seen: the thread takes the mmap lock again after a
 * mm_filemap_fault that ran under it: mmap_lock:mmap_lock_acquire_returned).  The first pass
 * under the per-VMA lock (no mmap_lock event) that retries without VM_FAULT_MAJOR -- it waited
 * for a page another read was bringing in, or started async readahead -- leaves the fault minor,
 * as the kernel does.  Measured on 6.18 against getrusage(RUSAGE_THREAD) per access.
 *
 * Constants filled in before load (-D):
 *   TARGET_TGID, TARGET_TID, RING_PAGES, HAVE_MAP_PAGES, HAVE_PFU (x86 exceptions:page_fault_user; 0 forces the
 *   generic path), HAVE_RSEQ, HAVE_FILEMAP_ADD, HAVE_BIO, HAVE_VMSCAN_DIRECT, HAVE_VMSCAN_MEMCG,
 *   HAVE_MMAP_LOCK (mmap_lock:*), HAVE_RA (readahead:*), HAVE_PROC_EXIT (sched_process_exit),
 *   HAVE_PFK (exceptions:page_fault_kernel: faults a syscall takes on the target's mappings; with HAVE_PFU),
 *   HAVE_SCHED, TID_WORDS (u64 words of the switched-out-in-a-fault bitmap: tids < 64 * TID_WORDS),
 *   BIO_SLOTS, BIO_STALE_NS (the in-flight bio table: probes/bios.h).
 */
/* struct pt_regs */
#include "kernel_types.h"
#include "faults.h"

struct fault_state {
	u64 ts;           /* entry; 0 = no fault open */
	u64 end;          /* last in-fault event */
	u64 address;
	u64 index;
	u64 ino;
	u64 map_first;
	u64 map_last;
	u64 out_ts;       /* switched out at (inside the fault); 0 = running */
	u64 wake_ts;
	u64 offcpu_ns;
	u64 runq_ns;
	u64 reclaim_start;
	u64 reclaim_ns;
	u64 bio_ns;
	u64 pfu_ts;       /* a page_fault_user not yet matched to a filemap event; 0 = none */
	u64 pfu_addr;
	u32 dev;
	u32 pages_added;
	u32 bio_count;
	u16 flags;
	u8 slept_since_filemap;
	u8 last_was_map;  /* the fault's last filemap event was map_pages */
	u8 have_map;      /* map_first / map_last are set */
	u8 lock_held;     /* the thread holds the mmap lock (per thread: kept across faults) */
	u8 fault_locked;  /* the fault's last mm_filemap_fault ran under the mmap lock */
	u8 async_since_fault; /* page_cache_async_ra since the fault's last mm_filemap_fault */
	u8 lock_retry_pending; /* generic path: the lock was taken again; a continuation confirms it */
	u8 pfu_kernel;    /* the pending hardware fault was taken in kernel mode (page_fault_kernel) */
	u8 __pad0[2];
};

BPF_HASH(fault_by_tid, u32, struct fault_state, 16384);
#include "tidbits.h"
#if HAVE_SCHED
/* that target thread is switched out inside an open fault: sched_switch (next) and sched_wakeup
 * fire for every task of the machine, and test its bit (probes/tidbits.h) before any hash lookup.
 * A tid past the array (no word) is not timed. */
BPF_ARRAY(fault_out_bits, u64, TID_WORDS);
#endif
/* that target thread may have work for its next syscall entry: a fault open or a hardware fault
 * pending (set where s->ts or s->pfu_ts is set: open_new, hardware_fault; cleared by the
 * sys_enter that finds them).  raw_syscalls:sys_enter fires for every syscall of the target:
 * a bit test instead of a hash lookup of fault_by_tid (~53 ns a call, benchmarks/RESULTS.md
 * "Page-fault probe overhead") when there is none, the common case.  A bit left set with
 * nothing behind it (a fault closed elsewhere) costs one lookup at the next syscall.  A tid past
 * the array (no word) is looked up as before. */
BPF_ARRAY(fault_open_bits, u64, TID_WORDS);

static __always_inline u64 *open_word(u32 tid)
{
	u32 w = tid_word_index(tid);
	return fault_open_bits.lookup(&w);  /* array: inlined, bounds-checked */
}

static __always_inline void open_bit_set(u32 tid)
{
	u64 *w = open_word(tid);
	if (w && !(*w & tid_bit(tid)))
		tid_bit_set(w, tid);
}
#if HAVE_BIO
/* bio_slots, bio_slots_taken: the bios the target's faults queued, until their completion */
#include "bios.h"
#endif
BPF_RINGBUF_OUTPUT(fault_records, RING_PAGES);
BPF_PERCPU_ARRAY(fault_totals, struct fault_totals, 1);
BPF_ARRAY(fault_record_layout, struct fault_record, 1);
BPF_ARRAY(fault_totals_layout, struct fault_totals, 1);

/* is_target(pid_tgid): probes/targets.h (one pid, a set of pids, cgroups, children) */
#include "targets.h"

static __always_inline struct fault_totals *totals(void)
{
	int zero = 0;
	return fault_totals.lookup(&zero);
}

static __always_inline struct fault_state *state_of(u32 tid)
{
	return fault_by_tid.lookup(&tid);
}

static __always_inline struct fault_state *open_fault(u32 tid)
{
	struct fault_state *s = fault_by_tid.lookup(&tid);
	if (s && s->ts)
		return s;
	return 0;
}

/* Write the open fault of s (pid_tgid's thread) and clear it; t: this CPU's totals (a
 * caller that has them already passes them: one lookup less on the hot path). */
static __always_inline void close_fault_with(struct fault_state *s, u64 pid_tgid, struct fault_totals *t)
{
	if (!s->ts)
		return;
	u64 dur = s->end > s->ts ? s->end - s->ts : 0;
	if (t) {
		t->faults++;
		if (s->flags & FAULT_MAJOR)
			t->major++;
		if (s->flags & FAULT_RETRIED)
			t->retried++;
		if (s->flags & FAULT_MISSING)
			t->missing++;
		if (s->flags & FAULT_LOCK_RETRY)
			t->lock_retried++;
		if (s->flags & FAULT_ASYNC_RA)
			t->async_ra++;
		if (s->have_map && !(s->flags & FAULT_INDEX_EXACT))
			t->fault_around++;
		t->sum_ns += dur;
		if (dur > t->max_ns)
			t->max_ns = dur;
	}
	struct fault_record *r = fault_records.ringbuf_reserve(sizeof(struct fault_record));
	if (r) {
		r->ts_ns = s->ts;
		r->dur_ns = dur;
		r->address = s->address;
		r->index = s->index;
		r->ino = s->ino;
		r->map_first = s->map_first;
		r->offcpu_ns = s->offcpu_ns;
		r->runq_ns = s->runq_ns;
		r->reclaim_ns = s->reclaim_ns;
		r->bio_ns = s->bio_ns;
		r->pid = pid_tgid >> 32;
		r->tid = (u32)pid_tgid;
		r->dev = s->dev;
		r->pages_added = s->pages_added;
		r->bio_count = s->bio_count;
		r->mapped_pages = s->have_map ? (u32)(s->map_last - s->map_first + 1) : 0;
		r->flags = s->flags;
		r->__pad0 = 0;
		r->__pad1 = 0;
		fault_records.ringbuf_submit(r, BPF_RB_NO_WAKEUP);
	} else if (t) {
		t->lost_records++;
	}
	s->ts = 0;
}

static __always_inline void close_fault(struct fault_state *s, u64 pid_tgid)
{
	if (s->ts)
		close_fault_with(s, pid_tgid, totals());
}

/* A page_fault_user that no filemap event claimed: not file-backed. */
static __always_inline void drop_pending_pfu_with(struct fault_state *s, struct fault_totals *t)
{
	if (s->pfu_ts) {
		if (t)
			t->other_faults++;
		s->pfu_ts = 0;
	}
}

static __always_inline void drop_pending_pfu(struct fault_state *s)
{
	if (s->pfu_ts)
		drop_pending_pfu_with(s, totals());
}

static __always_inline void open_new(struct fault_state *s, u32 tid, u64 now, u32 dev, u64 ino)
{
	open_bit_set(tid);
	u8 held = s->lock_held;  /* the thread's, not the fault's */
	__builtin_memset(s, 0, sizeof(*s));
	s->lock_held = held;
	s->ts = now;
	s->end = now;
	s->dev = dev;
	s->ino = ino;
}

/* The fault's last filemap event was its mm_filemap_fault on this file: inside ->fault(). */
static __always_inline int in_filemap_fault(struct fault_state *s, u32 dev, u64 ino)
{
	return (s->flags & FAULT_INDEX_EXACT) && !s->last_was_map && s->dev == dev && s->ino == ino;
}

/* A filemap event (is_map: mm_filemap_map_pages [index, last]; else mm_filemap_fault index). */
static __always_inline void filemap_event(int is_map, u32 dev, u64 ino, u64 index, u64 last)
{
	u64 pid_tgid = bpf_get_current_pid_tgid();
	if (!is_target(pid_tgid) || !is_target_file(dev, ino))  /* --file: targets.h */
		return;
	u64 now = bpf_ktime_get_ns();
	u32 tid = (u32)pid_tgid;
	struct fault_state *s = state_of(tid);
	if (!s) {
		struct fault_state init = {};
		fault_by_tid.update(&tid, &init);
		s = state_of(tid);
		if (!s) {
			struct fault_totals *t = totals();
			if (t)
				t->no_state++;
			return;
		}
	}
	int cont = 0;
	if (s->ts && s->ino == ino && s->dev == dev) {
#if HAVE_PFU
		cont = s->pfu_ts == 0;  /* no new hardware fault since this one opened */
#else
		int exact = (s->flags & FAULT_INDEX_EXACT) != 0;
		if (is_map)
			/* the VM_FAULT_RETRY pass after ->fault() read the page (slept or not: the mmap
			 * lock was dropped for the I/O): fault-around maps it, no second filemap_fault */
			cont = exact && !s->last_was_map && index <= s->index && s->index <= last;
		else if (!exact)
			/* fault-around did not map the faulting page: ->fault() follows in the same fault */
			cont = s->last_was_map && s->map_first <= index && index <= s->map_last;
		else
			/* a retry that re-entered ->fault() for the same page after sleeping */
			cont = index == s->index && s->slept_since_filemap;
#endif
	}
	if (!cont) {
		u64 start = now, addr = 0;
		u16 fl = 0;
		if (s->ts)
			close_fault(s, pid_tgid);
#if HAVE_PFU
		if (s->pfu_ts) {
			start = s->pfu_ts;
			addr = s->pfu_addr;
			fl = FAULT_ADDRESS | (s->pfu_kernel ? FAULT_KERNEL_MODE : 0);
		}
#endif
		open_new(s, tid, start, dev, ino);  /* also consumes the pending page_fault_user */
		s->end = now;
		s->address = addr;
		s->flags = fl;
	} else {
		s->end = now;
		/* a filemap event after ->fault() ran: another pass (VM_FAULT_RETRY).  Not by itself
		 * major: a first pass under the per-VMA lock that waited for a page in flight or
		 * started async readahead retries without VM_FAULT_MAJOR, and the kernel counts the
		 * fault minor.  Major only when the page was missing or a pass under the mmap lock
		 * retried (then the next pass runs with FAULT_FLAG_TRIED). */
		if (s->flags & FAULT_INDEX_EXACT)
			s->flags |= FAULT_RETRIED;
#if !HAVE_FILEMAP_ADD && !HAVE_RA
		/* no way to see a missing page: the retry is the best sign left (over-counts) */
		if (s->flags & FAULT_INDEX_EXACT)
			s->flags |= FAULT_MAJOR;
#endif
		if (s->lock_retry_pending)
			s->flags |= FAULT_LOCK_RETRY | FAULT_RETRIED | FAULT_MAJOR;
	}
	s->lock_retry_pending = 0;
	s->slept_since_filemap = 0;
	s->last_was_map = is_map;
	if (is_map) {
		s->have_map = 1;
		s->map_first = index;
		s->map_last = last;
		if (!(s->flags & FAULT_INDEX_EXACT) && !cont)
			s->index = index;
	} else {
		s->index = index;
		s->flags |= FAULT_INDEX_EXACT;
		s->fault_locked = s->lock_held;
		s->async_since_fault = 0;
	}
}

TRACEPOINT_PROBE(filemap, mm_filemap_fault)
{
	filemap_event(0, args->s_dev, args->i_ino, args->index, args->index);
	return 0;
}

#if HAVE_MAP_PAGES
TRACEPOINT_PROBE(filemap, mm_filemap_map_pages)
{
	filemap_event(1, args->s_dev, args->i_ino, args->index, args->last_index);
	return 0;
}
#endif

#if HAVE_PFU
/* A hardware page fault of a target thread: user mode (page_fault_user), or kernel mode on a user
 * address (page_fault_kernel: a syscall copying from or to a mapping, write(fd, mapped rows)):
 * the kernel counts both in the thread's maj_flt / min_flt. */
static __always_inline void hardware_fault(u64 address, int kernel_mode)
{
	u64 pid_tgid = bpf_get_current_pid_tgid();
	if (!is_target(pid_tgid))
		return;
	u32 tid = (u32)pid_tgid;
	struct fault_totals *t = totals();
	if (t) {
		if (kernel_mode)
			t->kernel_mode_faults++;
		else
			t->user_faults++;
	}
	struct fault_state *s = state_of(tid);
	if (!s) {
		struct fault_state init = {};
		fault_by_tid.update(&tid, &init);
		s = state_of(tid);
		if (!s) {
			if (t)
				t->no_state++;
			return;
		}
	}
	if (s->ts)
		close_fault_with(s, pid_tgid, t);
	drop_pending_pfu_with(s, t);
	open_bit_set(tid);
	s->pfu_ts = bpf_ktime_get_ns();
	s->pfu_addr = address;
	s->pfu_kernel = kernel_mode;
}

TRACEPOINT_PROBE(exceptions, page_fault_user)
{
	hardware_fault(args->address, 0);
	return 0;
}

#if HAVE_PFK
/* user addresses only (x86-64: below the canonical hole); a fault on kernel memory is not the
 * target's read */
#define USER_ADDR_END 0x0000800000000000ULL
TRACEPOINT_PROBE(exceptions, page_fault_kernel)
{
	if (args->address < USER_ADDR_END)
		hardware_fault(args->address, 1);
	return 0;
}
#endif
#endif

/* Any syscall entry: the fault (if any) had returned to user space. */
RAW_TRACEPOINT_PROBE(sys_enter)
{
	u64 pid_tgid = bpf_get_current_pid_tgid();
	if (!is_target(pid_tgid))
		return 0;
	u32 tid = (u32)pid_tgid;
	u64 *w = open_word(tid);
	if (!tid_bit_maybe(w, tid))
		return 0;  /* no fault open, none pending: the common case */
	tid_bit_clear(w, tid);  /* what is behind it is handled now */
	struct fault_state *s = state_of(tid);
	if (!s)
		return 0;
	if (s->ts)
		close_fault(s, pid_tgid);
#if HAVE_PFU
	drop_pending_pfu(s);
#endif
	return 0;
}

#if HAVE_RSEQ
/* The return to user space after a context switch (threads that registered rseq). */
TRACEPOINT_PROBE(rseq, rseq_update)
{
	u64 pid_tgid = bpf_get_current_pid_tgid();
	if (!is_target(pid_tgid))
		return 0;
	struct fault_state *s = open_fault((u32)pid_tgid);
	if (s && (s->flags & FAULT_SLEPT) && !s->out_ts) {
		s->end = bpf_ktime_get_ns();
		s->flags |= FAULT_END_RSEQ;
		close_fault(s, pid_tgid);
	}
	return 0;
}
#endif

#if HAVE_FILEMAP_ADD
TRACEPOINT_PROBE(filemap, mm_filemap_add_to_page_cache)
{
	u64 pid_tgid = bpf_get_current_pid_tgid();
	if (!is_target(pid_tgid))
		return 0;
	struct fault_state *s = open_fault((u32)pid_tgid);
	if (s) {
		u64 n = 1ULL << args->order;
		s->pages_added += n;
		s->end = bpf_ktime_get_ns();
		/* the faulting page itself inserted inside ->fault(): it was missing (VM_FAULT_MAJOR).
		 * Async readahead inserts pages past a cached one: not this page, not major. */
		if (in_filemap_fault(s, args->s_dev, args->i_ino) && args->index <= s->index && s->index < args->index + n)
			s->flags |= FAULT_MISSING | FAULT_MAJOR;
	}
	return 0;
}
#endif

#if HAVE_BIO
TRACEPOINT_PROBE(block, block_bio_queue)
{
	u64 pid_tgid = bpf_get_current_pid_tgid();
	if (!is_target(pid_tgid))
		return 0;
	struct fault_state *s = open_fault((u32)pid_tgid);
	if (!s)
		return 0;
	u64 now = bpf_ktime_get_ns();
	s->bio_count++;
	s->end = now;
	if (bio_claim(args->dev, args->sector, now, s->ts, (u32)pid_tgid)) {
		struct fault_totals *t = totals();
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

/* queue -> complete of every bio a target's fault queued, log2(ns) slots: with the calls' (probes/
 * inflight.h) tables/bio_latency_log2, the device's service as the target saw it */
BPF_ARRAY(bio_latency_log2, u64, LAT_SLOTS);

/* A bio the fault probe saw queued has completed: count it, and credit the fault that queued it if
 * it is still open.  Interrupt (or the device's own) context: no tgid to test, so the count of taken slots
 * comes first and every other completion of the machine stops there (probes/bios.h). */
static __always_inline void bio_done(u32 dev, u64 sector)
{
	struct bio_found b;
	if (!bio_completed(dev, sector, &b))
		return;
	u64 delta = bpf_ktime_get_ns() - b.ts;
	u32 slot = bpf_log2l(delta);
	if (slot >= LAT_SLOTS)
		slot = LAT_SLOTS - 1;
	u64 *h = bio_latency_log2.lookup(&slot);
	if (h)
		__sync_fetch_and_add(h, 1);
	struct fault_state *s = open_fault(b.tid);
	if (s && s->ts == b.owner_ts)
		__sync_fetch_and_add(&s->bio_ns, delta);
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

/* bio-based devices (zram, device-mapper, md, NVMe multipath's head) complete the bio itself and
 * make no request: without this their bios never left the bio table (then an LRU hash, which
 * filled up, and every insertion paid its eviction: ~900 ns a bio, measured on zram).  For a request-
 * based device the bio's sector has advanced by then: no match, no harm.  (As old as
 * block_bio_queue: compiled with HAVE_BIO.) */
TRACEPOINT_PROBE(block, block_bio_complete)
{
	bio_done(args->dev, args->sector);
	return 0;
}
#endif
#endif

#if HAVE_RA
/* Readahead run by ->fault() of an open fault of this thread on that file. */
static __always_inline struct fault_state *fault_readahead(u32 dev, u64 ino)
{
	u64 pid_tgid = bpf_get_current_pid_tgid();
	if (!is_target(pid_tgid))
		return 0;
	struct fault_state *s = open_fault((u32)pid_tgid);
	if (!s || !in_filemap_fault(s, dev, ino))
		return 0;
	s->end = bpf_ktime_get_ns();
	return s;
}

/* the page was there with the readahead marker: more readahead, the fault itself is not major */
TRACEPOINT_PROBE(readahead, page_cache_async_ra)
{
	struct fault_state *s = fault_readahead(args->s_dev, args->i_ino);
	if (s) {
		s->async_since_fault = 1;
		s->flags |= FAULT_ASYNC_RA;
	}
	return 0;
}

/* sync readahead / read-around: do_sync_mmap_readahead runs only when the page was missing
 * (page_cache_ra_order and _unbounded also run under page_cache_async_ra: after it, not missing) */
static __always_inline void sync_readahead(u32 dev, u64 ino)
{
	struct fault_state *s = fault_readahead(dev, ino);
	if (s && !s->async_since_fault)
		s->flags |= FAULT_MISSING | FAULT_MAJOR;
}

TRACEPOINT_PROBE(readahead, page_cache_sync_ra) { sync_readahead(args->s_dev, args->i_ino); return 0; }
TRACEPOINT_PROBE(readahead, page_cache_ra_order) { sync_readahead(args->s_dev, args->i_ino); return 0; }
TRACEPOINT_PROBE(readahead, page_cache_ra_unbounded) { sync_readahead(args->s_dev, args->i_ino); return 0; }
#endif

#if HAVE_MMAP_LOCK
/* The mmap lock taken: after a mm_filemap_fault that ran under it (a pass of the fallback path:
 * the per-VMA lock was not had), the fault takes it again only when that pass returned
 * VM_FAULT_RETRY; the next pass runs with FAULT_FLAG_TRIED and the kernel counts the fault major.
 * The first pass under the per-VMA lock takes no mmap lock. */
TRACEPOINT_PROBE(mmap_lock, mmap_lock_acquire_returned)
{
	if (!args->success)
		return 0;
	u64 pid_tgid = bpf_get_current_pid_tgid();
	if (!is_target(pid_tgid))
		return 0;
	struct fault_state *s = state_of((u32)pid_tgid);
	if (!s)
		return 0;
	s->lock_held = 1;
	if (s->ts && s->fault_locked) {
		s->fault_locked = 0;
		s->end = bpf_ktime_get_ns();
#if HAVE_PFU
		/* still the same exception: the next page_fault_user or syscall closes it */
		s->flags |= FAULT_LOCK_RETRY | FAULT_RETRIED | FAULT_MAJOR;
#else
		/* or the next fault, on the fallback path: a continuation filemap event confirms it */
		s->lock_retry_pending = 1;
#endif
	}
	return 0;
}

TRACEPOINT_PROBE(mmap_lock, mmap_lock_released)
{
	u64 pid_tgid = bpf_get_current_pid_tgid();
	if (!is_target(pid_tgid))
		return 0;
	struct fault_state *s = state_of((u32)pid_tgid);
	if (s)
		s->lock_held = 0;
	return 0;
}
#endif

#if HAVE_PROC_EXIT
/* A target thread exits: its fault (if any) is written, its slot freed for new threads. */
TRACEPOINT_PROBE(sched, sched_process_exit)
{
	u64 pid_tgid = bpf_get_current_pid_tgid();
	if (!is_target(pid_tgid))
		return 0;
	u32 tid = (u32)pid_tgid;
	struct fault_state *s = state_of(tid);
	if (!s)
		return 0;
	if (s->ts)
		close_fault(s, pid_tgid);
	fault_by_tid.delete(&tid);
	return 0;
}
#endif

static __always_inline void reclaim_begin(void)
{
	u64 pid_tgid = bpf_get_current_pid_tgid();
	if (!is_target(pid_tgid))
		return;
	struct fault_state *s = open_fault((u32)pid_tgid);
	if (s)
		s->reclaim_start = bpf_ktime_get_ns();
}

static __always_inline void reclaim_end(void)
{
	u64 pid_tgid = bpf_get_current_pid_tgid();
	if (!is_target(pid_tgid))
		return;
	struct fault_state *s = open_fault((u32)pid_tgid);
	if (s && s->reclaim_start) {
		u64 now = bpf_ktime_get_ns();
		s->reclaim_ns += now - s->reclaim_start;
		s->reclaim_start = 0;
		s->end = now;
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
static __always_inline u64 *out_word(u32 tid)
{
	u32 w = tid_word_index(tid);
	return fault_out_bits.lookup(&w);  /* array: inlined, bounds-checked */
}

/* runs in the context of the task switched out (prev = current) */
TRACEPOINT_PROBE(sched, sched_switch)
{
	u64 now = 0;
	u32 next = args->next_pid;
	u64 *w = out_word(next);
	if (tid_bit_is_set(w, next)) {
		tid_bit_drop(w, next);
		struct fault_state *o = fault_by_tid.lookup(&next);
		if (o && o->ts && o->out_ts) {
			now = bpf_ktime_get_ns();
			o->offcpu_ns += now - o->out_ts;
			if (o->wake_ts)
				o->runq_ns += now - o->wake_ts;
			o->out_ts = 0;
			o->wake_ts = 0;
			o->end = now;
		}
	}
	u64 pid_tgid = bpf_get_current_pid_tgid();
	if (!is_target(pid_tgid))
		return 0;
	u32 prev = (u32)pid_tgid;
	struct fault_state *s = open_fault(prev);
	if (!s)
		return 0;
	if ((args->prev_state & 0x7f) == 0) {
		/* preempted: in user mode after the fault, or inside it (common on a busy machine),
		 * before its retry pass.  Not closed: the retry is the same fault, and a fault that
		 * had ended keeps its end (its last in-fault event); the next fault, syscall or
		 * sleep closes it as usual. */
		return 0;
	}
	if (!now)
		now = bpf_ktime_get_ns();
	s->out_ts = now;
	s->wake_ts = 0;
	s->flags |= FAULT_SLEPT;
	s->slept_since_filemap = 1;
	tid_bit_set(out_word(prev), prev);
	return 0;
}

TRACEPOINT_PROBE(sched, sched_wakeup)
{
	u32 pid = args->pid;
	if (!tid_bit_is_set(out_word(pid), pid))
		return 0;
	struct fault_state *o = fault_by_tid.lookup(&pid);
	if (o && o->ts && o->out_ts && !o->wake_ts)
		o->wake_ts = bpf_ktime_get_ns();
	return 0;
}
#endif
