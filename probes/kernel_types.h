/* The kernel types the probes name, declared here instead of by the kernel's headers.
 *
 * <linux/fs.h>, <linux/ptrace.h>, <linux/uio.h> and <linux/aio_abi.h> each cost clang about
 * a second per probe program on a 2-core VM (0.3 s for a program with none of them): a recorder
 * compiles eight programs, and four of them took 1.6-2.3 s, mostly in those headers.  What the
 * probes use of them is user-space ABI, fixed per architecture: the x86-64 register frame
 * (struct user_regs_struct's order), struct iovec, aio_context_t, rwf_t (the syscall
 * tracepoints' arguments name it) and the file-type bits of i_mode.  On other architectures the kernel's own headers are included.  Offsets into kernel
 * structures that are not ABI (struct file, struct inode, io_kiocb) come from BTF, as #defines
 * filled in before load (engramprof/bpf/targets.py, uring.py).
 */
#ifndef EP_KERNEL_TYPES_H
#define EP_KERNEL_TYPES_H

#if defined(__x86_64__)
struct pt_regs {  /* arch/x86/include/asm/ptrace.h */
	unsigned long r15, r14, r13, r12, bp, bx, r11, r10, r9, r8;
	unsigned long ax, cx, dx, si, di, orig_ax, ip, cs, flags, sp, ss;
};
struct iovec {  /* include/uapi/linux/uio.h */
	void *iov_base;
	unsigned long iov_len;
};
typedef unsigned long aio_context_t;  /* include/uapi/linux/aio_abi.h */
#else
#include <linux/ptrace.h>
#include <linux/uio.h>
#include <linux/aio_abi.h>
#endif

/* the flags argument of the preadv2 tracepoint (include/uapi/linux/fs.h: __kernel_rwf_t) */
typedef int rwf_t;

#ifndef S_IFMT  /* include/uapi/linux/stat.h */
#define S_IFMT  00170000
#define S_IFREG 0100000
#endif

#endif /* EP_KERNEL_TYPES_H */
