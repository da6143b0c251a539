/* native.h - a read's native stack (probes/syscalls.bpf.c with NATIVE_STACKS): the calling thread's
 * saved user registers and a copy of its user stack from sp up, taken at the exit of a traced call
 * (the user stack cannot change while the thread is in the kernel: it is the stack at the read).
 * Unwound with the binaries' DWARF CFI in user space (engramprof/sampling/native.py): the kernel's
 * own user stack walk (BPF_STACK_TRACE, BPF_F_USER_STACK) follows frame pointers, and Debian's
 * libc and RocksDB keep none (every stack of rocksdict's reads ended at pread64).
 *
 * Cost: a 32 KiB copy and ring record per stack, so at most one call per CPU every
 * NATIVE_EVERY_NS is taken (a per-CPU clock); the other reads carry none (a code site names the
 * native path of its reads that have one).
 * Constants (-D): NATIVE_STACKS (0: compiled out), NATIVE_EVERY_NS, NATIVE_RING_PAGES.
 */
#ifndef ENGRAMPROF_NATIVE_H
#define ENGRAMPROF_NATIVE_H

/* bpf_probe_read_user without BCC's per-call kallsyms look-up */
#include "readuser.h"

#define NATIVE_CHUNK 1024
#define NATIVE_CHUNKS 32

struct native_stack {
	u64 ts_ns;        /* the call's entry (its call_record's ts_ns): the exact join */
	u64 ip;           /* saved user registers at the syscall */
	u64 sp;
	u64 bp;
	u32 pid;
	u32 tid;
	u32 len;          /* bytes of data copied from sp up (the copy stops at the stack's end) */
	u32 __pad0;
	u8 data[NATIVE_CHUNK * NATIVE_CHUNKS];
};

#if NATIVE_STACKS
BPF_RINGBUF_OUTPUT(native_stacks, NATIVE_RING_PAGES);
BPF_PERCPU_ARRAY(native_stack_last, u64, 1);
BPF_PERCPU_ARRAY(native_stack_totals, u64, 2);  /* [0] taken, [1] ring full */
/* never written: lets user space check the layout clang compiled */
BPF_ARRAY(native_stack_layout, struct native_stack, 1);

static __always_inline void native_stack_take(u64 call_ts, u64 pid_tgid, u64 now)
{
	int zero = 0, one = 1;
	u64 *last = native_stack_last.lookup(&zero);
	if (!last || now - *last < NATIVE_EVERY_NS)
		return;
	*last = now;
	struct native_stack *r = native_stacks.ringbuf_reserve(sizeof(struct native_stack));
	if (!r) {
		u64 *full = native_stack_totals.lookup(&one);
		if (full)
			(*full)++;
		return;
	}
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
	r->ts_ns = call_ts;
	r->pid = pid_tgid >> 32;
	r->tid = (u32)pid_tgid;
	r->ip = 0;
	r->sp = 0;
	r->bp = 0;
	bpf_probe_read_kernel(&r->ip, sizeof(r->ip), &regs->ip);
	bpf_probe_read_kernel(&r->sp, sizeof(r->sp), &regs->sp);
	bpf_probe_read_kernel(&r->bp, sizeof(r->bp), &regs->bp);
	u32 len = 0;
#pragma unroll
	for (int i = 0; i < NATIVE_CHUNKS; i++) {
		if (bpf_probe_read_user(&r->data[i * NATIVE_CHUNK], NATIVE_CHUNK, (void *)(r->sp + i * NATIVE_CHUNK)))
			break;
		len += NATIVE_CHUNK;
	}
	r->len = len;
	r->__pad0 = 0;
	native_stacks.ringbuf_submit(r, BPF_RB_NO_WAKEUP);
	u64 *taken = native_stack_totals.lookup(&zero);
	if (taken)
		(*taken)++;
}
#endif
#endif
