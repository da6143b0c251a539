/* names.bpf.c - the name of every file a target opens, from the kernel, by identity.
 *
 * A read event carries its file's identity (device, inode), taken in the kernel at the read;
 * user space names identities from the process's open files and mappings (/proc).  A file
 * opened, read and closed between two looks at /proc (a reader doing open / read / close per
 * chunk) is in none of them.  This probe names it where it is opened:
 *   syscalls:sys_exit_openat, sys_exit_openat2, sys_exit_open (ret: the new fd): the fd is
 *       walked to its file (probes/targets.h fd_file_walk: identity, i_mode, the filesystem);
 *       a regular file on a real filesystem whose identity is not named yet, or named from
 *       another dentry, gets its dentry's name and its parents' (d_name, up to NAME_LEVELS)
 *       into the `file_names` map.  An open of a named file costs the walk and one lookup.
 * User space (engramprof/bpf/names.py) reads the map only for identities /proc did not name.
 * Not seen: files opened by io_uring (IORING_OP_OPENAT), open_by_handle_at, and files opened
 * before the probe was attached (those are open at the first look at /proc, or never read).
 */
#include <uapi/linux/stat.h>
#include "names.h"

#define FD_WALK 1

BPF_HASH(file_names, struct name_key, struct file_name, MAX_NAMES);
BPF_PERCPU_ARRAY(name_scratch, struct file_name, 1);
BPF_PERCPU_ARRAY(name_totals, struct name_totals, 1);
BPF_ARRAY(name_totals_layout, struct name_totals, 1);

/* is_target(pid_tgid), fd_file_walk(fd, ...), fd_file_ptr(fd): probes/targets.h */
#include "targets.h"

static __always_inline u64 kread64(u64 addr)
{
	u64 v = 0;
	bpf_probe_read_kernel(&v, sizeof(v), (void *)addr);
	return v;
}

/* the dentry's components, leaf first, into n; 0: nothing read */
static __always_inline int walk_dentries(u64 d, struct file_name *n)
{
	u32 pos = 0;
	n->dentry = d;
	n->depth = 0;
	n->complete = 0;
#pragma unroll
	for (int i = 0; i < NAME_LEVELS; i++) {
		u64 parent = kread64(d + OFF_DENTRY_PARENT);
		if (!parent || parent == d) {  /* the superblock's root: its name is the mount's */
			n->complete = 1;
			break;
		}
		if (pos >= NAME_BUF)
			break;
		u64 name = kread64(d + OFF_DENTRY_NAME);
		long r = bpf_probe_read_kernel_str(&n->buf[pos & (NAME_BUF - 1)], NAME_PART, (void *)name);
		if (r <= 0)
			break;
		pos += r;
		n->depth++;
		d = parent;
	}
	n->len = pos;
	return n->depth > 0;
}

static __always_inline int name_fd(s64 ret)
{
	u64 pid_tgid = bpf_get_current_pid_tgid();
	if (ret < 0 || !is_target(pid_tgid))
		return 0;
	struct fd_file f;
	if (!fd_file_walk((s32)ret, &f) || (f.mode & S_IFMT) != S_IFREG || f.pseudo)
		return 0;
	int zero = 0;
	struct name_totals *t = name_totals.lookup(&zero);
	if (t)
		t->opens++;
	u64 file = fd_file_ptr((s32)ret);
	u64 d = file ? kread64(file + OFF_FILE_DENTRY) : 0;
	if (!d)
		return 0;
	struct name_key k = {.dev = f.dev, .ino = f.ino};
	struct file_name *have = file_names.lookup(&k);
	if (have && have->dentry == d)
		return 0;
	struct file_name *n = name_scratch.lookup(&zero);
	if (!n || !walk_dentries(d, n))
		return 0;
	if (file_names.update(&k, n)) {
		if (t)
			t->full++;
		return 0;
	}
	if (t) {
		t->named++;
		t->partial += !n->complete;
	}
	return 0;
}

TRACEPOINT_PROBE(syscalls, sys_exit_openat)
{
	return name_fd(args->ret);
}

#if HAVE_OPENAT2
TRACEPOINT_PROBE(syscalls, sys_exit_openat2)
{
	return name_fd(args->ret);
}
#endif

#if HAVE_OPEN
TRACEPOINT_PROBE(syscalls, sys_exit_open)
{
	return name_fd(args->ret);
}
#endif
