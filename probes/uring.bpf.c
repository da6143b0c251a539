/* uring.bpf.c - every read request of a target's io_uring rings (IORING_OP_READ, READV,
 * READ_FIXED, READV_FIXED; registered files too) as one read event, submit -> complete.
 *
 * Tracepoints only (Linux 6.18, io_uring/io_uring.c and io_uring/rw.c):
 *   io_uring:io_uring_submit_req   (ctx, req, user_data, opcode, flags, sq_thread) fires in
 *       io_submit_sqe after io_init_req, so the read's prep (io_prep_rw) has filled the request:
 *       io_rw's kiocb.ki_pos = sqe->off, addr, len, rw_flags; req->cqe.fd = sqe->fd.  req->file is
 *       still NULL (it is assigned at issue).  The thread is the submitter: the user's thread, or
 *       the ring's SQPOLL kernel thread (sq_thread), a thread of the ring owner's process.
 *   (io_uring:io_uring_file_get, where a plain fd becomes req->file at issue, is not hooked: it
 *   cost a program run on every request; the io-wq worker issuing a punted request is found from
 *   the worker itself, current->worker_private->cur_work, where its insertions and bios are seen.)
 *   io_uring:io_uring_queue_async_work (req, ...) fires when the request is handed to io-wq
 *       (IOSQE_ASYNC, or an inline attempt that could not proceed without blocking).
 *   io_uring:io_uring_complete     (req, res, cflags) fires when the CQE is filled: in the
 *       submitter for inline and task-work completions, in the io-wq worker for a punted request
 *       of an ordinary ring (rings with lockless_cq post it from the owner's task work).
 * The request pointer joins them: the in-flight table is keyed by it, filled at submit for the
 * target's read opcodes only, read and deleted at complete.  No tracepoint carries the file,
 * offset or length: they are read from the request with member offsets of the running kernel's
 * BTF (engramprof/bpf/uring.py fills U_OFF_* before load).  At complete, req->file is set (a
 * plain fd holds its reference until the request is freed, a registered file is the table's):
 * file -> f_inode -> (i_ino, i_sb -> s_dev, i_mode), and f_flags (O_DIRECT).  A read of a file
 * that is not a regular file (a pipe, socket, tty, procfs) is counted (nonregular), not recorded.
 *
 * Path (URING_PATH_*, probes/uring.h): punted when queue_async_work was seen; else async when the
 * read was queued rather than done by its issue: a buffered read armed on the page's wait queue
 * (kiocb.ki_waitq, which io_prep_rw sets to NULL, is set by io_rw_should_retry) or an O_DIRECT
 * read (returns -EIOCBQUEUED; completes from the bio's end through task work); else inline.
 *
 * In-flight evidence (HAVE_ISSUE_EVIDENCE): the thread that issues a request -- the submitter,
 * from io_uring_submit_req (its inline issue follows at once) until the next submit or its
 * io_uring_enter returns -- holds the request in its slot of `uring_issuing` (by tid); an io-wq
 * worker (PF_IO_WORKER) issues the request its struct io_worker's cur_work is (the request's
 * embedded io_wq_work: req = cur_work - U_OFF_REQ_WORK), read where it is used (worker_req()).  The submitter's mark is not cleared
 * when io_uring_enter returns (a program on sys_exit_io_uring_enter cost every io_uring_enter of
 * the machine a run): it is judged where it is used, in the insertion and bio hooks, which read the
 * thread's syscall registers (bpf_task_pt_regs): a mark set at a submit counts only while the
 * thread is in an io_uring_enter that submits (to_submit > 0; submits replace the mark before any
 * I/O of theirs).  Unlike the hook it replaces, it also credits what the task work run on the way
 * out of that io_uring_enter (after its sys_exit) inserts or queues.  Pages that thread inserts into the page
 * cache (filemap:mm_filemap_add_to_page_cache: sync readahead of the inline attempt, a worker's
 * blocking read) and bios it queues (block:block_bio_queue: O_DIRECT, readahead) are the
 * request's; a bio is found again at its completion in the bio table of probes/bios.h (its
 * owner is the request pointer) and its queue -> complete time added while the request is in
 * flight.  A buffered request completed by task work after the page's wait queue woke it did
 * its I/O through readahead already counted at its issue (or another request's): it has none.
 * No off-CPU or reclaim time per request: many requests share one wait in io_uring_enter.
 *
 * EXPORT_MODE (`engramprof export`): every completed request is also aggregated in the kernel
 * into `read_stats_by_file` (probes/readstats.h: struct read_stats of probes/export.h, keyed by
 * file and kind READ_KIND_IO_URING), and a record is written only while `sample_budget` lasts
 * (the window's sample: user space refills it at each window start).
 *
 * Constants filled in before load (-D): RING_PAGES, INFLIGHT_SLOTS (a power of two), INFLIGHT_SLOT_BITS
 *   (its log2), URING_PROBES (slots a request may take from its home), URING_MAX_IOV, EXPORT_MODE,
 *   MAX_READ_FILES (EXPORT_MODE),
 *   OP_READV, OP_READ_FIXED, OP_READ, OP_READV_FIXED (the kernel's enum io_uring_op; -1 = absent),
 *   U_OFF_* (BTF member offsets), REQ_SPAN / CSPAN (bytes of the request read at submit / complete),
 *   O_DIRECT_BIT,
 *   HAVE_QUEUE_ASYNC, HAVE_ISSUE_EVIDENCE (the filemap and block tracepoints), BIO_SLOTS / BIO_STALE_NS (probes/bios.h), and targets.h's.
 */
/* struct pt_regs: in_submitting_enter() */
#include "kernel_types.h"
#include "uring.h"
/* bpf_probe_read_user without BCC's per-call kallsyms look-up */
#include "readuser.h"

struct uring_state {
	u64 req;          /* the request pointer: 0 = a free slot */
	u64 ts;
	s64 offset;
	u64 size;
	u64 flags;        /* rw_flags (RWF_*) */
	u64 user_data;
	u64 ctx;
	u64 punt_ts;      /* 0: not punted */
	u32 pid;
	u32 tid;
	u32 io_tid;
	s32 fd;
	u32 sqe_flags;
	u16 opcode;
	u16 uflags;
	u64 bio_ns;       /* queue -> complete of its bios that completed while it was in flight */
	u32 pages_added;  /* page-cache insertions by the thread issuing it */
	u32 bio_count;    /* bios queued by that thread */
};

/* The requests in flight: an open-addressed table of INFLIGHT_SLOTS (a power of two) slots,
 * each request in one of the URING_PROBES slots from its home (a multiplicative hash of the request
 * pointer).  A slot is taken by a compare-and-swap of its req from 0; its completion frees it.  No
 * lock and no helper call (an array lookup is inlined by the verifier), where a hash map cost an
 * insert at submit and a lookup and a delete at completion (benchmarks/RESULTS.md "io_uring probe
 * overhead", 2026-12-03).  A find looks at all URING_PROBES slots (a freed slot before the
 * request's own does not end the search).  A request whose slots are all taken is not tracked
 * (no_state), as when the hash was full. */
BPF_ARRAY(uring_inflight, struct uring_state, INFLIGHT_SLOTS);
BPF_RINGBUF_OUTPUT(uring_records, RING_PAGES);
BPF_PERCPU_ARRAY(uring_totals, struct uring_totals, 1);
BPF_ARRAY(uring_record_layout, struct uring_record, 1);
BPF_ARRAY(uring_totals_layout, struct uring_totals, 1);

/* is_target(pid_tgid), is_target_file(dev, ino): probes/targets.h */
#include "targets.h"

#if EXPORT_MODE
/* read_stats_by_file, sample_budget and their helpers (struct read_key, struct read_stats,
 * READ_KIND_IO_URING): probes/readstats.h */
#include "readstats.h"
#endif


static __always_inline struct uring_totals *totals(void)
{
	int zero = 0;
	return uring_totals.lookup(&zero);
}

static __always_inline u32 inflight_home(u64 req)
{
	return (u32)((req * 0x9e3779b97f4a7c15ULL) >> (64 - INFLIGHT_SLOT_BITS));
}

static __always_inline struct uring_state *inflight_slot(u32 home, u32 i)
{
	u32 idx = (home + i) & (INFLIGHT_SLOTS - 1);
	return uring_inflight.lookup(&idx);
}

/* the in-flight state of req, or 0 */
static __always_inline struct uring_state *inflight_find(u64 req)
{
	u32 home = inflight_home(req);
#pragma unroll
	for (u32 i = 0; i < URING_PROBES; i++) {
		struct uring_state *s = inflight_slot(home, i);
		if (s && s->req == req)
			return s;
	}
	return 0;
}

/* Take a slot for req: the slot it still holds (its completion was not seen: *replaced = 1), else
 * a free one (compare-and-swap of req from 0); 0 when its slots are all taken.  The caller
 * writes every other member. */
static __always_inline struct uring_state *inflight_claim(u64 req, int *replaced)
{
	u32 home = inflight_home(req);
	struct uring_state *fr = 0;
	*replaced = 0;
#pragma unroll
	for (u32 i = 0; i < URING_PROBES; i++) {
		struct uring_state *o = inflight_slot(home, i);
		if (!o)
			continue;
		if (o->req == req) {
			*replaced = 1;
			return o;
		}
		if (!fr && !o->req)
			fr = o;
	}
	if (fr && __sync_val_compare_and_swap(&fr->req, 0, req) == 0)
		return fr;
	/* the free slot was just taken on another CPU: any other */
#pragma unroll
	for (u32 i = 0; i < URING_PROBES; i++) {
		struct uring_state *o = inflight_slot(home, i);
		if (o && !o->req && __sync_val_compare_and_swap(&o->req, 0, req) == 0)
			return o;
	}
	return 0;
}

#if HAVE_ISSUE_EVIDENCE
/* The request a thread is issuing (req 0: none), in slot tid & (ISSUE_SLOTS - 1) with its tid: an
 * inlined array lookup, where task storage cost a helper call at every submit and every
 * io_uring_enter exit.  ISSUE_SLOTS covers pid_max up to 65536 slots (engramprof/bpf/uring.py);
 * past it two target threads whose tids share a slot overwrite each other's mark (the
 * overwritten one's insertions are then credited to no request; tid is compared first). */
struct uring_issuing {
	u32 tid;
	u32 in_enter;     /* set at a submit inside io_uring_enter (not by an SQPOLL thread or a worker) */
	u64 req;
};
BPF_ARRAY(uring_issuing, struct uring_issuing, ISSUE_SLOTS);
/* bio_slots, bio_slots_taken (owner = the request pointer) */
#include "bios.h"

static __always_inline struct uring_issuing *issuing_slot(u32 tid)
{
	u32 idx = tid & (ISSUE_SLOTS - 1);
	return uring_issuing.lookup(&idx);
}

static __always_inline void issuing_set(u32 tid, u64 req, u32 in_enter)
{
	struct uring_issuing *i = issuing_slot(tid);
	if (i) {
		/* req 0 while the tid changes: a colliding thread reading meanwhile sees no mark */
		*(volatile u64 *)&i->req = 0;
		*(volatile u32 *)&i->tid = tid;
		i->in_enter = in_enter;
		*(volatile u64 *)&i->req = req;
	}
}

/* The current thread is in an io_uring_enter that submits (its syscall number and to_submit, the
 * second argument, from its user registers): a submitter's mark is live.  Read only on the rare
 * paths (a target's page-cache insertion or bio). */
#define IO_URING_ENTER_NR 426  /* the same on every architecture (the unified table, Linux 5.1) */
static __always_inline int in_submitting_enter(void)
{
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
	long nr = -1;
	unsigned long to_submit = 0;
#if defined(__x86_64__)
	bpf_probe_read_kernel(&nr, sizeof(nr), &regs->orig_ax);
	bpf_probe_read_kernel(&to_submit, sizeof(to_submit), &regs->si);
#elif defined(__aarch64__)
	int n = -1;
	bpf_probe_read_kernel(&n, sizeof(n), &regs->syscallno);
	nr = n;
	bpf_probe_read_kernel(&to_submit, sizeof(to_submit), &regs->regs[1]);
#endif
	return nr == IO_URING_ENTER_NR && (u32)to_submit != 0;
}

/* the current thread's mark, when it is on req (any request: req 0), goes */
static __always_inline void issuing_clear(u32 tid, u64 req)
{
	struct uring_issuing *i = issuing_slot(tid);
	if (i && i->tid == tid && i->req && (!req || i->req == req))
		i->req = 0;
}

/* The request an io-wq worker (current) is working on: its struct io_worker's cur_work, the
 * request's embedded io_wq_work; 0 when current is not a worker or has none. */
#define PF_IO_WORKER 0x00000010
static __always_inline u64 worker_req(void)
{
	char *task = (char *)bpf_get_current_task_btf();
	u32 flags = 0;
	u64 worker = 0, work = 0;
	if (bpf_probe_read_kernel(&flags, sizeof(flags), task + U_OFF_TASK_FLAGS) || !(flags & PF_IO_WORKER))
		return 0;
	if (bpf_probe_read_kernel(&worker, sizeof(worker), task + U_OFF_TASK_WORKER) || !worker)
		return 0;  /* (an SQPOLL thread: PF_IO_WORKER without an io_worker) */
	if (bpf_probe_read_kernel(&work, sizeof(work), (void *)(worker + U_OFF_WORKER_CUR_WORK)) || !work)
		return 0;
	return work - U_OFF_REQ_WORK;
}

/* the in-flight state of the request the current thread issues, if any */
static __always_inline struct uring_state *issuing_state(u32 tid, u64 *req)
{
	struct uring_issuing *i = issuing_slot(tid);
	if (i && i->tid == tid && i->req) {
		*req = i->req;
		struct uring_state *s = inflight_find(*req);
		if (s && !(i->in_enter && !in_submitting_enter()))
			return s;  /* (a mark set at a submit counts inside a submitting io_uring_enter) */
	}
	/* an io-wq worker: the request it is working on */
	*req = worker_req();
	if (!*req)
		return 0;
	struct uring_state *s = inflight_find(*req);
	if (s && s->io_tid == s->tid)
		s->io_tid = tid;  /* the worker that issued it */
	return s;
}
#endif

/* Any thread of a target process: the request's io-wq workers and SQPOLL thread are threads of
 * its ring's owner (a --tid target's too).  Tested first in the hooks that fire for every io_uring
 * request of the machine, before any map is touched: an untraced process pays the test alone. */
static __always_inline int is_target_process(u64 pid_tgid)
{
#if TARGET_TID
	pid_tgid = (pid_tgid & 0xffffffff00000000ULL) | TARGET_TID;
#endif
	return is_target(pid_tgid);
}

static __always_inline int is_read_op(u32 op)
{
	return op == OP_READ || op == OP_READV || op == OP_READ_FIXED || op == OP_READV_FIXED;
}

static __always_inline int is_vectored(u32 op)
{
	return op == OP_READV || op == OP_READV_FIXED;
}

#if EXPORT_MODE
/* The request, aggregated per file (probes/readstats.h); 1 when it is also to be recorded. */
static __always_inline int uring_export(struct uring_state *s, u32 dev, u64 ino, s64 res, u64 dur, u32 direct,
					struct uring_totals *t)
{
	return read_stats_account(dev, ino, READ_KIND_IO_URING, res, dur, s->pages_added || s->bio_count || direct,
				  s->pages_added, s->bio_count, s->bio_ns, t ? &t->files_overflow : 0,
				  t ? &t->unsampled : 0);
}
#endif

TRACEPOINT_PROBE(io_uring, io_uring_submit_req)
{
	u32 op = args->opcode;
	if (!is_read_op(op))
		return 0;
	u64 pid_tgid = bpf_get_current_pid_tgid();
	if (!is_target(pid_tgid))
		return 0;
	u64 req = (u64)args->req;
	u64 now = bpf_ktime_get_ns();
	struct uring_totals *t = totals();
	if (t)
		t->submitted++;
	/* the state is written straight into the request's slot (no copy from the stack) */
	int replaced;
	struct uring_state *s = inflight_claim(req, &replaced);
	if (!s) {
		if (t)
			t->no_state++;
		return 0;
	}
	if (replaced && t)
		t->replaced++;
	s->ts = now;
	s->pid = pid_tgid >> 32;
	s->tid = (u32)pid_tgid;
	s->io_tid = (u32)pid_tgid;  /* the submitter issues it inline (io_queue_sqe follows this tracepoint) */
	s->user_data = args->user_data;
	s->ctx = (u64)args->ctx;
	s->opcode = op;
	s->sqe_flags = args->flags & 0xff;
	s->punt_ts = 0;
	s->bio_ns = 0;
	s->pages_added = 0;
	s->bio_count = 0;
	u16 uflags = 0;
	if (args->sq_thread)
		uflags |= URING_SQPOLL;
	if (args->flags & 1)  /* REQ_F_FIXED_FILE == IOSQE_FIXED_FILE */
		uflags |= URING_FIXED_FILE;
	/* the prepared request: io_rw (req->cmd) and req->cqe.fd, in one read */
	s64 offset = 0;
	u64 size = 0, addr = 0;
	u32 len = 0, rwf = 0;
	s32 fd = 0;
	char span[REQ_SPAN];
	if (bpf_probe_read_kernel(span, sizeof(span), (void *)req) == 0) {
		__builtin_memcpy(&offset, span + U_OFF_RW_POS, 8);
		__builtin_memcpy(&addr, span + U_OFF_RW_ADDR, 8);
		__builtin_memcpy(&len, span + U_OFF_RW_LEN, 4);
		__builtin_memcpy(&rwf, span + U_OFF_RW_FLAGS, 4);
		__builtin_memcpy(&fd, span + U_OFF_REQ_FD, 4);
		if (is_vectored(op)) {
			/* len is the iovec count: sum the first URING_MAX_IOV iov_len (user memory; an
			 * SQPOLL thread shares the owner's mm) */
#pragma unroll
			for (int i = 0; i < URING_MAX_IOV; i++) {
				if (i >= len)
					break;
				u64 iov[2] = {};
				if (bpf_probe_read_user(iov, sizeof(iov), (void *)(addr + 16 * i)))
					break;
				size += iov[1];
			}
			if (len > URING_MAX_IOV)
				uflags |= URING_IOV_TRUNC;
		} else {
			size = len;
		}
		if (offset == -1)
			uflags |= URING_CUR_POS;
	}
	s->offset = offset;
	s->size = size;
	s->flags = rwf;
	s->fd = fd;
	s->uflags = uflags;
#if HAVE_ISSUE_EVIDENCE
	issuing_set((u32)pid_tgid, req, !args->sq_thread);
#endif
	return 0;
}

#if HAVE_ISSUE_EVIDENCE
TRACEPOINT_PROBE(filemap, mm_filemap_add_to_page_cache)
{
	u64 pid_tgid = bpf_get_current_pid_tgid();
	if (!is_target(pid_tgid))
		return 0;
	u64 req;
	struct uring_state *s = issuing_state((u32)pid_tgid, &req);
	if (s)
		s->pages_added += 1 << args->order;
	return 0;
}

TRACEPOINT_PROBE(block, block_bio_queue)
{
	u64 pid_tgid = bpf_get_current_pid_tgid();
	if (!is_target(pid_tgid))
		return 0;
	u64 req;
	struct uring_state *s = issuing_state((u32)pid_tgid, &req);
	if (!s)
		return 0;
	s->bio_count++;
	if (bio_claim(args->dev, args->sector, bpf_ktime_get_ns(), req, (u32)bpf_get_current_pid_tgid())) {
		struct uring_totals *t = totals();
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

/* every I/O of the machine: the count of taken slots first (probes/bios.h) */
static __always_inline void uring_bio_done(u32 dev, u64 sector)
{
	struct bio_found b;
	if (!bio_completed(dev, sector, &b))
		return;
	u64 req = b.owner_ts;
	struct uring_state *s = inflight_find(req);
	/* the kernel recycles io_kiocb: a request pointer found in flight now may be a later
	 * request's, submitted after this bio was queued (a readahead bio outliving its request):
	 * its time is not that request's */
	if (s && b.ts >= s->ts)
		__sync_fetch_and_add(&s->bio_ns, bpf_ktime_get_ns() - b.ts);
}

#if BIO_RAW_COMPLETION
/* raw tracepoints where the kernel's BTF allows (probes/bios.h): not skipped while another
 * BPF program runs on the CPU */
BIO_RAW_COMPLETION_HOOKS(uring_bio_done)
#else
TRACEPOINT_PROBE(block, block_rq_complete)
{
	uring_bio_done(args->dev, args->sector);
	return 0;
}

TRACEPOINT_PROBE(block, block_bio_complete)
{
	uring_bio_done(args->dev, args->sector);
	return 0;
}
#endif
#endif

#if HAVE_QUEUE_ASYNC
TRACEPOINT_PROBE(io_uring, io_uring_queue_async_work)
{
	if (!is_target_process(bpf_get_current_pid_tgid()))
		return 0;
	u64 req = (u64)args->req;
	struct uring_state *s = inflight_find(req);
	if (s && !s->punt_ts)
		s->punt_ts = bpf_ktime_get_ns();
	return 0;
}
#endif

/* per-CPU memo of the last superblock's s_dev (a probe read saved while it repeats; a superblock
 * is freed only at an unmount); tracepoint programs do not nest on a CPU */
struct uring_sb_memo {
	u64 sb;
	u32 dev;
	u32 __pad0;
};
BPF_PERCPU_ARRAY(uring_sb_memo, struct uring_sb_memo, 1);

static __always_inline u32 sb_dev(u64 sb)
{
	int zero = 0;
	struct uring_sb_memo *m = uring_sb_memo.lookup(&zero);
	if (m && m->sb == sb)
		return m->dev;
	u32 dev = 0;
	if (bpf_probe_read_kernel(&dev, 4, (void *)(sb + U_OFF_SB_DEV)))
		return 0;
	if (m) {
		m->sb = sb;
		m->dev = dev;
	}
	return dev;
}

#define U_FILE_SPAN_FROM (U_OFF_FILE_INODE < U_OFF_FILE_FLAGS ? U_OFF_FILE_INODE : U_OFF_FILE_FLAGS)
#define U_FILE_SPAN_TO (U_OFF_FILE_INODE < U_OFF_FILE_FLAGS ? U_OFF_FILE_FLAGS + 4 : U_OFF_FILE_INODE + 8)
#define U_MIN(a, b) ((a) < (b) ? (a) : (b))
#define U_MAX(a, b) ((a) > (b) ? (a) : (b))
#define U_INODE_SPAN_FROM U_MIN(U_OFF_INODE_MODE, U_MIN(U_OFF_INODE_SB, U_OFF_INODE_INO))
#define U_INODE_SPAN_TO U_MAX(U_OFF_INODE_MODE + 2, U_MAX(U_OFF_INODE_SB, U_OFF_INODE_INO) + 8)
#define U_S_IFMT 0170000
#define U_S_IFREG 0100000

TRACEPOINT_PROBE(io_uring, io_uring_complete)
{
	u64 pid_tgid = bpf_get_current_pid_tgid();
	if (!is_target_process(pid_tgid))
		return 0;
	u64 req = (u64)args->req;
	struct uring_state *p = inflight_find(req);
	if (!p)
		return 0;
	u64 now = bpf_ktime_get_ns();
	struct uring_state s = *p;
	p->req = 0;  /* the slot is free */
	u32 ctid = (u32)pid_tgid;
#if HAVE_ISSUE_EVIDENCE
	if (ctid != s.tid) {
		/* a worker that issued it has posted it: its next insertions are not this request's.
		 * (The submitter's own mark goes at its next submit and counts only inside a submitting
		 * io_uring_enter; meanwhile it names a request no longer in flight, which issuing_state()
		 * does not find.) */
		issuing_clear(ctid, req);
	}
#endif
	s64 res = args->res;
	/* the file and the kiocb's state now */
	u64 file = 0, pos = 0, waitq = 0, inode = 0, sb = 0, ino = 0;
	u32 f_flags = 0, dev = 0;
	u16 mode = 0;
	/* req->file, kiocb.ki_pos and kiocb.ki_waitq in one read (the first CSPAN bytes of the
	 * request), f_inode and f_flags in another, the inode's span in a third, the superblock's
 * s_dev in a fourth unless it is the per-CPU memo's (sb_dev) */
	char rspan[CSPAN];
	if (bpf_probe_read_kernel(rspan, sizeof(rspan), (void *)req) == 0) {
		__builtin_memcpy(&file, rspan + U_OFF_REQ_FILE, 8);
		__builtin_memcpy(&pos, rspan + U_OFF_RW_POS, 8);
		__builtin_memcpy(&waitq, rspan + U_OFF_RW_WAITQ, 8);
	}
	if (file) {
		char fspan[U_FILE_SPAN_TO - U_FILE_SPAN_FROM];
		if (bpf_probe_read_kernel(fspan, sizeof(fspan), (void *)(file + U_FILE_SPAN_FROM)) == 0) {
			__builtin_memcpy(&inode, fspan + (U_OFF_FILE_INODE - U_FILE_SPAN_FROM), 8);
			__builtin_memcpy(&f_flags, fspan + (U_OFF_FILE_FLAGS - U_FILE_SPAN_FROM), 4);
		}
	} else {
		s.uflags |= URING_NO_FILE;
	}
	if (inode) {
		char span[U_INODE_SPAN_TO - U_INODE_SPAN_FROM];
		if (bpf_probe_read_kernel(span, sizeof(span), (void *)(inode + U_INODE_SPAN_FROM)) == 0) {
			__builtin_memcpy(&sb, span + (U_OFF_INODE_SB - U_INODE_SPAN_FROM), 8);
			__builtin_memcpy(&ino, span + (U_OFF_INODE_INO - U_INODE_SPAN_FROM), 8);
			__builtin_memcpy(&mode, span + (U_OFF_INODE_MODE - U_INODE_SPAN_FROM), 2);
		}
		if (sb)
			dev = sb_dev(sb);
	}
	struct uring_totals *t = totals();
	if (inode && (mode & U_S_IFMT) != U_S_IFREG) {
		/* a pipe, socket, tty or procfs file read through the ring: not a table read */
		if (t)
			t->nonregular++;
		return 0;
	}
	if (!is_target_file(dev, ino)) {  /* --file: targets.h */
		if (t)
			t->filtered++;
		return 0;
	}
	u16 path = URING_PATH_INLINE;
	if (s.punt_ts) {
		path = URING_PATH_PUNTED;
		if (s.io_tid == s.tid) {
			/* its worker inserted no page and queued no bio: the worker that posted it, if any */
			if (ctid != s.tid) {
				s.io_tid = ctid;
				s.uflags |= URING_IO_TID_COMPLETE;
			} else {
				s.io_tid = 0;
			}
		}
	} else if (waitq) {
		path = URING_PATH_ASYNC;
		s.uflags |= URING_WAITQ;
	} else if (f_flags & O_DIRECT_BIT) {
		path = URING_PATH_ASYNC;
	}
	if (f_flags & O_DIRECT_BIT)
		s.uflags |= URING_DIRECT;
	if ((s.uflags & URING_CUR_POS) && file) {
		/* the position it read from: ki_pos has moved past the bytes read */
		s.offset = (s64)pos - (res > 0 ? res : 0);
	}
	u64 dur = now - s.ts;
	if (t) {
		t->completed++;
		if (path == URING_PATH_INLINE)
			t->inline_n++;
		else if (path == URING_PATH_ASYNC)
			t->async_n++;
		else
			t->punted++;
		if (s.uflags & URING_SQPOLL)
			t->sqpoll++;
		t->sum_ns += dur;
		if (dur > t->max_ns)
			t->max_ns = dur;
	}
#if EXPORT_MODE
	if (!uring_export(&s, dev, ino, res, dur, f_flags & O_DIRECT_BIT, t))
		return 0;
#endif
	struct uring_record *r = uring_records.ringbuf_reserve(sizeof(struct uring_record));
	if (!r) {
		if (t)
			t->lost_records++;
		return 0;
	}
	r->ts_ns = s.ts;
	r->dur_ns = dur;
	r->offset = s.offset;
	r->size = s.size;
	r->ret = res;
	r->flags = s.flags;
	r->ino = ino;
	r->user_data = s.user_data;
	r->ctx = s.ctx;
	r->punt_ns = s.punt_ts ? s.punt_ts - s.ts : 0;
	r->pid = s.pid;
	r->tid = s.tid;
	r->io_tid = s.io_tid;
	r->complete_tid = ctid;
	r->dev = dev;
	r->fd = s.fd;
	r->sqe_flags = s.sqe_flags;
	r->opcode = s.opcode;
	r->path = path;
	r->uflags = s.uflags;
	r->bio_ns = s.bio_ns;
	r->pages_added = s.pages_added;
	r->bio_count = s.bio_count;
	r->__pad0 = 0;
	r->__pad1 = 0;
	uring_records.ringbuf_submit(r, BPF_RB_NO_WAKEUP);
	return 0;
}
