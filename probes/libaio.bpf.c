/* libaio.bpf.c - every read iocb (IOCB_CMD_PREAD, IOCB_CMD_PREADV) a target submits with
 * io_submit as one read event, from the submit to the moment its completion reaches the process.
 *
 * There is no aio tracepoint (Linux 6.18): the probe works from the syscalls' tracepoints and the
 * process's own memory.
 *   syscalls:sys_enter_io_submit (ctx_id, nr, iocbpp): the iocb pointers (user memory) and each
 *       iocb (64 bytes, include/uapi/linux/aio_abi.h) are read; a PREAD/PREADV's fd is followed
 *       to its file in the kernel (probes/targets.h fd_file_walk(): dev, ino, i_mode, f_flags'
 *       O_DIRECT) and the iocb goes into the in-flight map, keyed by (tgid, ctx, iocb address) --
 *       the key the kernel's io_event gives back (obj = the iocb's user address).  Other types
 *       are counted apart (other_iocbs); files that are not regular files (a pipe) are counted
 *       (not_regular) and not tracked.
 *   syscalls:sys_exit_io_submit (ret): io_submit took the first ret iocbs (ret < nr: the
 *       (ret+1)th failed its checks, the rest were not looked at; ret < 0: none).  The iocbs it
 *       did not take are removed from the in-flight map (submit_failed).
 *   syscalls:sys_exit_io_getevents / sys_exit_io_pgetevents (ret): the first ret io_events of
 *       the caller's array (user memory; pointer saved at the entry) are the completions: each
 *       (data, obj, res) is looked up by (tgid, ctx, obj), recorded with res and deleted.  The
 *       reaping thread may be any thread of the process (reap_tid).
 *   The context's ring (the aio_context_t is the user address of struct aio_ring: id, nr, head,
 *       tail, then nr io_events) is read at every io_submit, io_getevents, io_pgetevents and
 *       io_destroy entry: if its head moved since the probe last saw it after a syscall reap, the
 *       process consumed events in user space (fio's userspace_reap); those events, still in the
 *       ring's slots [seen, head), are read and recorded (AIO_RING_REAP).  A context made while
 *       traced starts at head 0 (sys_exit_io_setup); an older one from the first header read.  The slots cannot have
 *       been reused: a new completion needs a submit, and every submit is this probe's scan.
 *   syscalls:sys_{enter,exit}_io_destroy: the reads still in flight never reach the process;
 *       (tgid, ctx, destroy time) goes into `aio_destroyed`, and user space removes and counts
 *       the context's entries submitted before it.
 *
 * Time: ts_ns is the io_submit entry; dur_ns ends at the reap (the exit of the syscall that
 * returned the event, or the scan that found it consumed): an upper bound of the read's latency
 * (docs/model.md, "libaio: timing").
 *
 * EXPORT_MODE (`engramprof export`): every reaped read is also aggregated in the kernel into
 * `read_stats_by_file` (probes/readstats.h, kind READ_KIND_LIBAIO), and a record is written only
 * while `sample_budget` lasts (the window's sample: user space refills it at each window start).
 *
 * Constants filled in before load (-D): RING_PAGES, MAX_INFLIGHT, AIO_MAX_NR (iocbs read per
 * io_submit), AIO_MAX_EVENTS (io_events read per reap), AIO_MAX_IOV,
 * O_DIRECT_BIT, HAVE_PGETEVENTS, HAVE_DESTROY, HAVE_SETUP, EXPORT_MODE, MAX_READ_FILES
 * (EXPORT_MODE), and targets.h's (FD_WALK 1).
 */
/* aio_context_t, for the syscalls tracepoints' args */
#include "kernel_types.h"
#include "libaio.h"
/* bpf_probe_read_user without BCC's per-call kallsyms look-up */
#include "readuser.h"

#define IOCB_CMD_PREAD 0
#define IOCB_CMD_PREADV 7
#define S_IFMT_ 00170000
#define S_IFREG_ 0100000
#define AIO_RING_HEADER 32   /* sizeof(struct aio_ring) before its io_events */

struct aio_key {
	u64 ctx;
	u64 iocb;
	u32 tgid;
	u32 __pad0;
};

struct aio_state {
	u64 ts;
	u64 bio_ns;
	s64 offset;
	u64 size;
	u64 flags;
	u64 ino;
	u64 aio_data;
	u32 tid;
	u32 dev;
	s32 fd;
	u32 bio_count;
	u16 opcode;
	u16 aflags;
	u32 idx;          /* its index in its io_submit: its id is (ts + idx, tid) */
};

/* a syscall of a target thread between its entry and its exit */
struct aio_call {
	u64 ctx;
	u64 ptr;          /* iocbpp (io_submit) or the io_event array (io_getevents) */
	s64 nr;           /* io_submit's nr; CALL_* below for the other syscalls */
	u64 ts;
	u64 cur;          /* io_submit: the iocb whose bios the thread queues now (its id), 0: none */
};
#define CALL_DESTROY (-1)
#define CALL_SETUP (-2)
#define CALL_REAP (-3)

/* a tracked iocb's id (for the bio table, whose slots keep a u64 and a tid): the submitter's
 * io_submit entry time plus the iocb's index in the call, and the submitting thread */
struct aio_id {
	u64 owner;
	u32 tid;
	u32 __pad0;
};

/* an O_DIRECT read iocb by what iomap:iomap_dio_rw_begin gives when the kernel issues it */
struct aio_pos {
	s64 pos;
	u64 ino;
	u32 dev;
	u32 tgid;
};

struct ring_key {
	u64 ctx;
	u32 tgid;
	u32 __pad0;
};

/* the 32 bytes of struct io_event / struct iocb's first 64 (the kernel's uapi layout) */
struct user_event {
	u64 data;
	u64 obj;
	s64 res;
	s64 res2;
};

struct user_iocb {
	u64 aio_data;
	u32 aio_key;
	s32 aio_rw_flags;
	u16 aio_lio_opcode;
	s16 aio_reqprio;
	u32 aio_fildes;
	u64 aio_buf;
	u64 aio_nbytes;
	s64 aio_offset;
	u64 aio_reserved2;
	u32 aio_flags;
	u32 aio_resfd;
};

BPF_HASH(aio_inflight, struct aio_key, struct aio_state, MAX_INFLIGHT);
#if HAVE_BIO
/* id -> key of tracked iocbs (LRU: an iocb never reaped, its context destroyed, goes by itself) */
BPF_TABLE("lru_hash", struct aio_id, struct aio_key, aio_ids, MAX_INFLIGHT);
#if HAVE_IOMAP
BPF_TABLE("lru_hash", struct aio_pos, struct aio_id, aio_by_pos, MAX_INFLIGHT);
#endif
#endif
BPF_HASH(aio_calls, u64, struct aio_call, 4096);
BPF_HASH(aio_ring_seen, struct ring_key, u32, 4096);  /* the ring head after the last reap the probe saw */
BPF_HASH(aio_destroyed, struct ring_key, u64, 1024);  /* io_destroy time, swept by user space */
BPF_RINGBUF_OUTPUT(aio_records, RING_PAGES);
BPF_PERCPU_ARRAY(aio_totals, struct aio_totals, 1);
BPF_ARRAY(aio_record_layout, struct aio_record, 1);
BPF_ARRAY(aio_totals_layout, struct aio_totals, 1);

/* is_target(pid_tgid), is_target_file(dev, ino), fd_file_walk(fd, ...): probes/targets.h */
#include "targets.h"
#if HAVE_BIO
/* bio_slots, bio_claim, bio_completed: the in-flight bio table (probes/bios.h) */
#include "bios.h"
#endif
#if EXPORT_MODE
/* read_stats_by_file, sample_budget and their helpers: probes/readstats.h */
#include "readstats.h"

/* The reaped iocb, aggregated per file (kind libaio); 1 when it is also to be recorded (the
 * window's sample budget lasts).  A miss: O_DIRECT (the page cache bypassed) or bios queued for
 * it (a buffered read that read the device inside io_submit). */
static __always_inline int aio_export(struct aio_state *s, s64 res, u64 dur, struct aio_totals *t)
{
	return read_stats_account(s->dev, s->ino, READ_KIND_LIBAIO, res, dur, (s->aflags & AIO_DIRECT) || s->bio_count,
				  0, s->bio_count, s->bio_ns, t ? &t->files_overflow : 0, t ? &t->unsampled : 0);
}
#endif

static __always_inline struct aio_totals *totals(void)
{
	int zero = 0;
	return aio_totals.lookup(&zero);
}

/* the iocb's completion (data, obj, res) was seen at now (one instant for all the events of a reap),
 * in thread reap_tid */
static __always_inline void aio_complete(u32 tgid, u64 ctx, struct user_event *ev, u32 reap_tid, u16 how,
					 u64 now, struct aio_totals *t)
{
	struct aio_key k = {.ctx = ctx, .iocb = ev->obj, .tgid = tgid};
	struct aio_state *p = aio_inflight.lookup(&k);
	if (!p) {
		if (t)
			t->unknown_events++;
		return;
	}
	struct aio_state s = *p;
	aio_inflight.delete(&k);
#if HAVE_BIO
	if (s.bio_count) {
		struct aio_id id = {.owner = s.ts + s.idx, .tid = s.tid};
		aio_ids.delete(&id);
	}
#endif
	u64 dur = now - s.ts;
	u16 af = s.aflags | how;
	if (reap_tid != s.tid)
		af |= AIO_OTHER_THREAD;
	if (t) {
		t->reaped++;
		if (af & AIO_OTHER_THREAD)
			t->other_thread++;
		if (how & AIO_RING_REAP)
			t->ring_reaped++;
		t->sum_ns += dur;
		if (dur > t->max_ns)
			t->max_ns = dur;
	}
#if EXPORT_MODE
	if (!aio_export(&s, ev->res, dur, t))
		return;
#endif
	struct aio_record *r = aio_records.ringbuf_reserve(sizeof(struct aio_record));
	if (!r) {
		if (t)
			t->lost_records++;
		return;
	}
	r->ts_ns = s.ts;
	r->dur_ns = dur;
	r->offset = s.offset;
	r->size = s.size;
	r->ret = ev->res;
	r->flags = s.flags;
	r->ino = s.ino;
	r->aio_data = s.aio_data;
	r->ctx = ctx;
	r->iocb = ev->obj;
	r->bio_ns = s.bio_ns;
	r->bio_count = s.bio_count;
	r->__pad0 = 0;
	r->pid = tgid;
	r->tid = s.tid;
	r->reap_tid = reap_tid;
	r->dev = s.dev;
	r->fd = s.fd;
	r->opcode = s.opcode;
	r->aflags = af;
	aio_records.ringbuf_submit(r, BPF_RB_NO_WAKEUP);
}

/* Events the process consumed from the context's ring in user space since the probe last looked:
 * the ring's slots [seen, head).  */
struct scan_ctx {
	u64 ctx;
	u32 tgid;
	u32 tid;
	u64 now;
	u32 seen;
	u32 n;            /* events consumed: (head - seen) mod nr */
	u32 nr;
	u32 __pad0;
};

/* the i-th consumed event: slot (seen + i) mod nr (a modulo, not a wrapped counter: the verifier
 * then sees the same state at every iteration but for i, and prunes) */
static __always_inline long ring_scan_one(u32 i, struct scan_ctx *c)
{
	if (i >= c->n)
		return 1;
	u64 slot = ((u64)c->seen + i) % c->nr;
	struct user_event ev = {};
	if (bpf_probe_read_user(&ev, sizeof(ev), (void *)(c->ctx + AIO_RING_HEADER + 32 * slot)))
		return 1;
	aio_complete(c->tgid, c->ctx, &ev, c->tid, AIO_RING_REAP, c->now, totals());
	return 0;
}

/* The scan of the context's ring a hook begins (it is the chain's CHAIN_SCAN, below): 1 when the
 * process consumed events the probe has not seen, in c; the ring head is then marked seen */
static __always_inline int ring_scan_begin(u32 tgid, u64 ctx, u32 tid, struct scan_ctx *c)
{
	u32 hdr[4] = {};  /* id, nr, head, tail */
	if (bpf_probe_read_user(hdr, sizeof(hdr), (void *)ctx))
		return 0;
	struct ring_key rk = {.ctx = ctx, .tgid = tgid};
	u32 *seen = aio_ring_seen.lookup(&rk);
	if (!seen) {
		aio_ring_seen.update(&rk, &hdr[2]);
		return 0;
	}
	u32 nr = hdr[1], head = hdr[2], at = *seen;
	if (at == head || nr == 0 || head >= nr || at >= nr)
		return 0;
	c->ctx = ctx;
	c->tgid = tgid;
	c->tid = tid;
	c->now = bpf_ktime_get_ns();
	c->seen = at;
	c->nr = nr;
	c->n = head > at ? head - at : nr - at + head;
	c->__pad0 = 0;
	*seen = head;
	return 1;
}

/* the ring head now: the probe has seen every event before it */
static __always_inline void ring_mark(u32 tgid, u64 ctx)
{
	u32 hdr[4] = {};
	if (bpf_probe_read_user(hdr, sizeof(hdr), (void *)ctx))
		return;
	struct ring_key rk = {.ctx = ctx, .tgid = tgid};
	aio_ring_seen.update(&rk, &hdr[2]);
}

/* submit_one's working state, per CPU: the iocb, its in-flight state and its file (targets.h
 * fd_file_walk) do not fit the BPF stack beside the walk's spans and the ring scan */
struct submit_scratch {
	struct user_iocb cb;
	struct aio_state s;
	struct fd_file f;
};
BPF_PERCPU_ARRAY(aio_submit_scratch, struct submit_scratch, 1);

/* the i-th iocb of an io_submit: a read of a regular file goes into the in-flight map (returns 1) */
static __always_inline int submit_one(u64 pid_tgid, u64 ctx, u64 uiocb, u64 ts, u32 i, struct aio_totals *t)
{
	int zero = 0;
	struct submit_scratch *w = aio_submit_scratch.lookup(&zero);
	if (!w)
		return 0;
	struct user_iocb *cb = &w->cb;
	struct aio_state *s = &w->s;
	struct fd_file *f = &w->f;
	if (bpf_probe_read_user(cb, sizeof(*cb), (void *)uiocb))
		return 0;
	u16 op = cb->aio_lio_opcode;
	if (op != IOCB_CMD_PREAD && op != IOCB_CMD_PREADV) {
		if (t)
			t->other_iocbs++;
		return 0;
	}
	__builtin_memset(s, 0, sizeof(*s));
	s->ts = ts;
	s->offset = cb->aio_offset;
	s->flags = (u32)cb->aio_rw_flags;
	s->aio_data = cb->aio_data;
	s->tid = (u32)pid_tgid;
	s->fd = (s32)cb->aio_fildes;
	s->opcode = op;
	s->idx = i;
	if (op == IOCB_CMD_PREADV) {
		u64 total = 0;
		s->aflags |= AIO_VECTORED;
		for (int v = 0; v < AIO_MAX_IOV; v++) {
			if (v >= cb->aio_nbytes)
				break;
			u64 iov[2] = {};
			if (bpf_probe_read_user(iov, sizeof(iov), (void *)(cb->aio_buf + 16 * v)))
				break;
			total += iov[1];
		}
		if (cb->aio_nbytes > AIO_MAX_IOV)
			s->aflags |= AIO_IOV_TRUNC;
		s->size = total;
	} else {
		s->size = cb->aio_nbytes;
	}
	if (!fd_file_walk(s->fd, f)) {
		if (t)
			t->no_file++;
		return 0;
	}
	if ((f->mode & S_IFMT_) != S_IFREG_ || f->pseudo) {
		if (t)
			t->not_regular++;
		return 0;
	}
	if (!is_target_file(f->dev, f->ino)) {  /* --file */
		if (t)
			t->filtered++;
		return 0;
	}
	if (f->flags & O_DIRECT_BIT)
		s->aflags |= AIO_DIRECT;
	s->dev = f->dev;
	s->ino = f->ino;
	if (t)
		t->submitted++;
	struct aio_key k = {.ctx = ctx, .iocb = uiocb, .tgid = pid_tgid >> 32};
	struct aio_state *old = aio_inflight.lookup(&k);
	if (old) {
		if (t)
			t->replaced++;
		*old = *s;
	} else if (aio_inflight.update(&k, s)) {
		if (t)
			t->no_state++;
		return 0;
	}
#if HAVE_BIO
	struct aio_id id = {.owner = ts + i, .tid = s->tid};
	aio_ids.update(&id, &k);
#if HAVE_IOMAP
	if (s->aflags & AIO_DIRECT) {
		struct aio_pos ap = {.pos = s->offset, .ino = f->ino, .dev = f->dev, .tgid = pid_tgid >> 32};
		aio_by_pos.update(&ap, &id);
	}
#endif
#endif
	return 1;
}

struct submit_ctx {
	u64 pid_tgid;
	u64 ctx;
	u64 iocbpp;
	u64 ts;
	s64 nr;
	u64 tracked;      /* iocbs tracked */
};

static __always_inline long submit_nth(u32 i, void *data)
{
	struct submit_ctx *c = data;
	if ((s64)i >= c->nr)
		return 1;
	u64 uiocb = 0;
	if (bpf_probe_read_user(&uiocb, sizeof(uiocb), (void *)(c->iocbpp + 8 * (u64)i)) || !uiocb)
		return 1;
	c->tracked += submit_one(c->pid_tgid, c->ctx, uiocb, c->ts, i, totals());
	return 0;
}

/* The calling thread's AIO syscall from its entry to its exit (aio_calls, by pid_tgid): the
 * entry hooks save it, the exit hooks take it (found: copied out and removed). */
static __always_inline void save_call(u64 pid_tgid, struct aio_call *c)
{
	aio_calls.update(&pid_tgid, c);
}

static __always_inline int take_call(u64 pid_tgid, struct aio_call *out)
{
	struct aio_call *p = aio_calls.lookup(&pid_tgid);
	if (!p)
		return 0;
	*out = *p;
	aio_calls.delete(&pid_tgid);
	return 1;
}

struct reap_ctx {
	u64 now;
	u64 ctx;
	u64 events;
	s64 ret;
	u32 tgid;
	u32 tid;
	u16 how;
	u16 __pad0;
	u32 __pad1;
};

/* The loops over a call's iocbs and over the events of a reap or of the ring run in chunks of
 * AIO_CHUNK iterations, each chunk one run of a program reached by a tail call (aio_chain, filled
 * by user space before the hooks are attached): the verifier walks AIO_CHUNK iterations of each
 * loop once, where the loops inlined in every hook made it walk 935,727 instructions (about one
 * second of every recorder's start; benchmarks/RESULTS.md "Probe compile time").  A hook fills
 * the CPU's aio_loop_state (tracepoint programs on one CPU never nest, and a chain runs on the
 * CPU of its hook) and tail-calls the first chunk; the last chunk does what the hook did after
 * its loop.  At most AIO_MAX_EVENTS / AIO_CHUNK + AIO_MAX_NR / AIO_CHUNK tail calls in a row (the
 * kernel allows 33).  A tail call that fails (never, once the array is filled) falls through to
 * the hook's own end: the iterations left are not done. */
#define AIO_CHUNK 16
#if AIO_MAX_NR % AIO_CHUNK || AIO_MAX_EVENTS % AIO_CHUNK || AIO_MAX_NR / AIO_CHUNK + AIO_MAX_EVENTS / AIO_CHUNK > 32
#error "AIO_MAX_NR and AIO_MAX_EVENTS: multiples of AIO_CHUNK, at most 32 chunks together"
#endif
/* aio_chain's slots: user space puts these programs there (engramprof/bpf/libaio.py CHAIN) */
#define CHAIN_SCAN 0    /* aio_scan_chunk: events consumed from the ring, then CHAIN_SUBMIT or the call's save */
#define CHAIN_SUBMIT 1  /* aio_submit_chunk: an io_submit's iocbs, then the call's save */
#define CHAIN_REAP 2    /* aio_reap_chunk: the events io_getevents returned, then the ring's mark */
BPF_PROG_ARRAY(aio_chain, 3);

struct aio_loop {
	struct scan_ctx scan;
	struct submit_ctx submit;
	struct reap_ctx reap;
	struct aio_call call;  /* saved for the syscall's exit once the loops are done */
	u32 i;                 /* the loop's next iteration */
	u32 submit_next;       /* after the ring's scan: the iocbs of an io_submit (1) or not (0) */
};
BPF_PERCPU_ARRAY(aio_loop_state, struct aio_loop, 1);

/* a tail call to the chain's slot; one that returns failed (the slot empty, or the kernel's 33
 * tail calls in a row spent): counted, and the caller ends the loop there */
static __always_inline void chain_to(void *ctx, int slot)
{
	aio_chain.call(ctx, slot);
	struct aio_totals *t = totals();
	if (t)
		t->chain_broken++;
}

static __always_inline struct aio_loop *loop_state(void)
{
	int zero = 0;
	return aio_loop_state.lookup(&zero);
}

/* the end of an entry hook's work: the call saved for its exit (an io_submit's only iocb, if
 * tracked, names the bios the thread queues inside it) */
static __always_inline void entry_done(struct aio_loop *L)
{
	/* the only iocb of the call: every bio the thread queues inside it is that read's (a buffered
	 * read's readahead too); several: iomap_dio_rw_begin names each O_DIRECT read as it is issued */
	if (L->submit_next && L->call.nr == 1 && L->submit.tracked == 1)
		L->call.cur = L->call.ts;
	save_call(L->submit.pid_tgid, &L->call);
}

/* an entry hook's loops: the ring's scan (scan: it has events to read), then an io_submit's iocbs */
static __always_inline void entry_loops(void *ctx, struct aio_loop *L, int scan)
{
	L->i = 0;
	if (scan)
		chain_to(ctx, CHAIN_SCAN);
	if (L->submit_next)
		chain_to(ctx, CHAIN_SUBMIT);
	entry_done(L);
}

/* an entry hook of a call that is not an io_submit: scan the ring, save the call */
static __always_inline int other_entry(void *ctx, u64 pid_tgid, u64 aio_ctx, struct aio_call *c)
{
	struct aio_loop *L = loop_state();
	if (!L)
		return 0;
	int scan = ring_scan_begin(pid_tgid >> 32, aio_ctx, (u32)pid_tgid, &L->scan);
	L->call = *c;
	L->submit.pid_tgid = pid_tgid;
	L->submit_next = 0;
	entry_loops(ctx, L, scan);
	return 0;
}

TRACEPOINT_PROBE(syscalls, sys_enter_io_submit)
{
	u64 pid_tgid = bpf_get_current_pid_tgid();
	if (!is_target(pid_tgid))
		return 0;
	struct aio_loop *L = loop_state();
	if (!L)
		return 0;
	u64 ctx = args->ctx_id;
	u64 iocbpp = (u64)args->iocbpp;
	s64 nr = args->nr;
	struct aio_totals *t = totals();
	int scan = ring_scan_begin(pid_tgid >> 32, ctx, (u32)pid_tgid, &L->scan);
	struct aio_call c = {.ctx = ctx, .ptr = iocbpp, .nr = nr, .ts = bpf_ktime_get_ns()};
	if (nr > AIO_MAX_NR && t)
		t->truncated += nr - AIO_MAX_NR;
	L->call = c;
	struct submit_ctx sc = {.pid_tgid = pid_tgid, .ctx = ctx, .iocbpp = iocbpp, .ts = c.ts, .nr = nr};
	L->submit = sc;
	L->submit_next = 1;
	entry_loops(args, L, scan);
	return 0;
}

/* io_submit took the first ret iocbs: the others' entries go (submit_failed) */
TRACEPOINT_PROBE(syscalls, sys_exit_io_submit)
{
	u64 pid_tgid = bpf_get_current_pid_tgid();
	struct aio_call c;
	if (!take_call(pid_tgid, &c))
		return 0;
	s64 ret = args->ret;
	if (ret >= c.nr)
		return 0;
	s64 from = ret > 0 ? ret : 0;
	struct aio_totals *t = totals();
	for (int i = 0; i < AIO_MAX_NR; i++) {
		if (from + i >= c.nr || from + i >= AIO_MAX_NR)
			break;
		u64 uiocb = 0;
		if (bpf_probe_read_user(&uiocb, sizeof(uiocb), (void *)(c.ptr + 8 * (u64)(from + i))))
			break;
		struct aio_key k = {.ctx = c.ctx, .iocb = uiocb, .tgid = pid_tgid >> 32};
		struct aio_state *s = aio_inflight.lookup(&k);
		if (s && s->ts == c.ts) {
			aio_inflight.delete(&k);
			if (t)
				t->submit_failed++;
		}
	}
	return 0;
}

static __always_inline int reap_enter(void *tp, u64 ctx, u64 events)
{
	u64 pid_tgid = bpf_get_current_pid_tgid();
	if (!is_target(pid_tgid))
		return 0;
	struct aio_call c = {.ctx = ctx, .ptr = events, .nr = CALL_REAP};
	return other_entry(tp, pid_tgid, ctx, &c);
}

static __always_inline long reap_nth(u32 i, void *data)
{
	struct reap_ctx *c = data;
	if ((s64)i >= c->ret)
		return 1;
	struct user_event ev = {};
	if (bpf_probe_read_user(&ev, sizeof(ev), (void *)(c->events + 32 * (u64)i)))
		return 1;
	aio_complete(c->tgid, c->ctx, &ev, c->tid, c->how, c->now, totals());
	return 0;
}

static __always_inline int reap_exit(void *tp, s64 ret, u16 how)
{
	u64 pid_tgid = bpf_get_current_pid_tgid();
	struct aio_call c;
	if (!take_call(pid_tgid, &c))
		return 0;
	u32 tgid = pid_tgid >> 32;
	struct aio_loop *L = loop_state();
	if (ret > AIO_MAX_EVENTS) {
		struct aio_totals *t = totals();
		if (t)
			t->events_truncated += ret - AIO_MAX_EVENTS;
	}
	if (L && ret > 0) {
		struct reap_ctx rc = {.now = bpf_ktime_get_ns(), .ctx = c.ctx, .events = c.ptr, .ret = ret, .tgid = tgid,
				      .tid = (u32)pid_tgid, .how = how};
		L->reap = rc;
		L->i = 0;
		chain_to(tp, CHAIN_REAP);
	}
	ring_mark(tgid, c.ctx);
	return 0;
}

/* One chunk of a loop, in a program of the chain: iterations L->i .. L->i + AIO_CHUNK - 1 of
 * nth(i, state) (1: the loop is over); while none ended it and some are left below max, the next
 * chunk, by a tail call to slot (which does not return).  After it: what follows the loop. */
#define LOOP_CHUNK(ctx, L, nth, state, max, slot)					\
	do {										\
		u32 base = (L)->i;							\
		int done = 0;								\
		for (u32 j = 0; j < AIO_CHUNK; j++)					\
			if (nth(base + j, state)) {					\
				done = 1;						\
				break;							\
			}								\
		if (!done && base + AIO_CHUNK < (max)) {				\
			(L)->i = base + AIO_CHUNK;					\
			chain_to(ctx, slot);						\
		}									\
	} while (0)

/* the chain's programs (aio_chain) */
int aio_scan_chunk(void *ctx)
{
	struct aio_loop *L = loop_state();
	if (!L)
		return 0;
	LOOP_CHUNK(ctx, L, ring_scan_one, &L->scan, AIO_MAX_EVENTS, CHAIN_SCAN);
	L->i = 0;
	if (L->submit_next)
		chain_to(ctx, CHAIN_SUBMIT);
	entry_done(L);
	return 0;
}

int aio_submit_chunk(void *ctx)
{
	struct aio_loop *L = loop_state();
	if (!L)
		return 0;
	LOOP_CHUNK(ctx, L, submit_nth, &L->submit, AIO_MAX_NR, CHAIN_SUBMIT);
	entry_done(L);
	return 0;
}

int aio_reap_chunk(void *ctx)
{
	struct aio_loop *L = loop_state();
	if (!L)
		return 0;
	LOOP_CHUNK(ctx, L, reap_nth, &L->reap, AIO_MAX_EVENTS, CHAIN_REAP);
	ring_mark(L->reap.tgid, L->reap.ctx);
	return 0;
}

TRACEPOINT_PROBE(syscalls, sys_enter_io_getevents)
{
	return reap_enter(args, args->ctx_id, (u64)args->events);
}

TRACEPOINT_PROBE(syscalls, sys_exit_io_getevents)
{
	return reap_exit(args, args->ret, 0);
}

#if HAVE_PGETEVENTS
TRACEPOINT_PROBE(syscalls, sys_enter_io_pgetevents)
{
	return reap_enter(args, args->ctx_id, (u64)args->events);
}

TRACEPOINT_PROBE(syscalls, sys_exit_io_pgetevents)
{
	return reap_exit(args, args->ret, AIO_PGETEVENTS);
}
#endif

#if HAVE_SETUP
/* A context made while traced: its ring's head starts at 0.  (ring_scan cannot read the ring's
 * header before the process touched its page: bpf_probe_read_user does not fault pages in, and
 * fio's first io_submit comes before any access to the ring.) */
TRACEPOINT_PROBE(syscalls, sys_enter_io_setup)
{
	u64 pid_tgid = bpf_get_current_pid_tgid();
	if (!is_target(pid_tgid))
		return 0;
	struct aio_call c = {.ptr = (u64)args->ctxp, .nr = CALL_SETUP};
	save_call(pid_tgid, &c);
	return 0;
}

TRACEPOINT_PROBE(syscalls, sys_exit_io_setup)
{
	u64 pid_tgid = bpf_get_current_pid_tgid();
	struct aio_call c;
	if (!take_call(pid_tgid, &c))
		return 0;
	u64 ctxp = c.ptr;
	u64 ctx = 0;
	if (args->ret != 0 || bpf_probe_read_user(&ctx, sizeof(ctx), (void *)ctxp) || !ctx)
		return 0;  /* io_setup wrote *ctxp (put_user): its page is in */
	struct ring_key rk = {.ctx = ctx, .tgid = pid_tgid >> 32};
	u32 zero = 0;
	aio_ring_seen.update(&rk, &zero);
	return 0;
}
#endif

#if HAVE_DESTROY
TRACEPOINT_PROBE(syscalls, sys_enter_io_destroy)
{
	u64 pid_tgid = bpf_get_current_pid_tgid();
	if (!is_target(pid_tgid))
		return 0;
	u64 ctx = args->ctx;
	struct aio_call c = {.ctx = ctx, .nr = CALL_DESTROY};
	return other_entry(args, pid_tgid, ctx, &c);  /* the scan reads the last user-space reaps */
}

/* io_destroy returns once the context's requests are done: those still in the map were never
 * reaped; user space removes them (submitted before now) and counts them */
TRACEPOINT_PROBE(syscalls, sys_exit_io_destroy)
{
	u64 pid_tgid = bpf_get_current_pid_tgid();
	struct aio_call c;
	if (!take_call(pid_tgid, &c))
		return 0;
	u64 ctx = c.ctx;
	if (args->ret != 0)
		return 0;
	struct ring_key rk = {.ctx = ctx, .tgid = pid_tgid >> 32};
	aio_ring_seen.delete(&rk);
	u64 now = bpf_ktime_get_ns();
	aio_destroyed.update(&rk, &now);
	struct aio_totals *t = totals();
	if (t)
		t->destroyed++;
	return 0;
}
#endif

#if HAVE_BIO
/* the state of the iocb whose id a bio slot or the thread's call holds */
static __always_inline struct aio_state *state_of(u64 owner, u32 tid)
{
	struct aio_id id = {.owner = owner, .tid = tid};
	struct aio_key *k = aio_ids.lookup(&id);
	if (!k)
		return 0;
	return aio_inflight.lookup(k);
}

#if HAVE_IOMAP
/* an O_DIRECT read issued by io_submit (aio): the iocb whose bios follow in this thread */
TRACEPOINT_PROBE(iomap, iomap_dio_rw_begin)
{
	if (!args->aio)
		return 0;
	u64 pid_tgid = bpf_get_current_pid_tgid();
	struct aio_call *c = aio_calls.lookup(&pid_tgid);
	if (!c || c->nr < 1)
		return 0;
	struct aio_pos ap = {.pos = args->pos, .ino = args->ino, .dev = args->dev, .tgid = pid_tgid >> 32};
	struct aio_id *id = aio_by_pos.lookup(&ap);
	if (id && id->tid == (u32)pid_tgid && id->owner - c->ts < AIO_MAX_NR) {
		c->cur = id->owner;
		aio_by_pos.delete(&ap);
	} else {
		c->cur = 0;
	}
	return 0;
}
#endif

TRACEPOINT_PROBE(block, block_bio_queue)
{
	u64 pid_tgid = bpf_get_current_pid_tgid();
	if (!is_target(pid_tgid))
		return 0;
	struct aio_call *c = aio_calls.lookup(&pid_tgid);
	if (!c || c->nr < 1 || !c->cur)
		return 0;
	struct aio_state *s = state_of(c->cur, (u32)pid_tgid);
	if (!s)
		return 0;
	s->bio_count++;
	struct aio_totals *t = totals();
	if (t)
		t->bios++;
	if (bio_claim(args->dev, args->sector, bpf_ktime_get_ns(), c->cur, (u32)pid_tgid) && t)
		t->bios_untracked++;
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

/* a tracked bio completed (interrupt context): its queue -> complete goes to its iocb */
static __always_inline void bio_done(u32 dev, u64 sector)
{
	struct bio_found b;
	if (!bio_completed(dev, sector, &b))
		return;
	u64 delta = bpf_ktime_get_ns() - b.ts;
	struct aio_state *s = state_of(b.owner_ts, b.tid);
	/* an iocb's user address is reused by the next batch: a bio queued before this iocb's
	 * submit is an earlier iocb's */
	if (s && b.ts >= s->ts)
		__sync_fetch_and_add(&s->bio_ns, delta);
}

#if BIO_RAW_COMPLETION
/* raw tracepoints where the kernel's BTF allows (probes/bios.h): not skipped while another
 * BPF program runs on the CPU */
BIO_RAW_COMPLETION_HOOKS(bio_done)
#else
/* request-based devices (NVMe, SCSI, virtio): the request's first sector is the bio's */
TRACEPOINT_PROBE(block, block_rq_complete)
{
	bio_done(args->dev, args->sector);
	return 0;
}

/* bio-based devices (zram, device-mapper, md) complete the bio itself (probes/faults.bpf.c) */
TRACEPOINT_PROBE(block, block_bio_complete)
{
	bio_done(args->dev, args->sector);
	return 0;
}
#endif
#endif
