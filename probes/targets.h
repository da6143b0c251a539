/* targets.h - which processes a probe traces (included by every probe; filled in before load).
 *
 * Constants (-D, engramprof/bpf/targets.py):
 *   MATCH_TGIDS      0: any process; 1: the one process TARGET_TGID (a compare);
 *                    2: the processes in the `target_tgids` hash (filled from user space right
 *                    after load, before the recording is armed; --pid repeated, --children,
 *                    the processes of a cgroup v1 path)
 *   MATCH_CGROUPS    2: the current task's cgroup2 must be a --cgroup v2 directory or below one:
 *                    bpf_get_current_ancestor_cgroup_id(CG_LEVEL_i) == CG_ID_i for one of the
 *                    CGROUP_SLOTS_USED (<= 8) directories (level in the hierarchy, inode number):
 *                    constants, so a sub-group made later matches from its first event;
 *                    1: (more directories, or a tracer in a cgroup namespace, where levels are
 *                    not known) its cgroup2 id (bpf_get_current_cgroup_id) must be in
 *                    `target_cgroups` (the directories and their sub-groups, synced every second)
 *   TRACER_TGID      the tracer's own process: never a target (with --file or --cgroup alone its
 *                    own reads of the table, the identity and layout reads, would pass)
 *   FOLLOW_CHILDREN  1: a process forked by a target becomes a target (sched_process_fork);
 *                    it is forgotten when its thread group dies (sched_process_exit)
 *   HAVE_GROUP_DEAD  sched_process_exit has group_dead (else: when the leader exits)
 *   MATCH_FILES      1: only reads of the files in `target_files` (--file: device + inode, the
 *                    kernel's encoding, filled from user space before the recording is armed);
 *                    target_fd_file(fd, &f) follows current->files->fdt->fd[fd] to the file and
 *                    its inode with the running kernel's member offsets OFF_* (engramprof/bpf/btf.py
 *                    FD_WALK) and judges it, is_target_fd(fd) the same without keeping the file,
 *                    is_target_file(dev, ino) tests what a tracepoint gives (mm_filemap_fault);
 *                    all are 1 when 0
 *   FD_WALK          1: the probe names the file of every call it traces (the syscall probe: each
 *                    read event's dev, ino, O_DIRECT, and read()'s f_pos), so the walk is compiled
 *                    in (OFF_* given) without --file too; --file's verdict then reuses the same
 *                    walk (one walk per call)
 *   TARGET_TID       one thread, 0 = all          MAX_TARGETS, MAX_CGROUPS, MAX_FILES  map sizes
 *
 * Cost (issue 13: --cgroup and --file within 10% of one --pid's compare; is_target runs in every
 * hook, system-wide ones included):
 *   --cgroup  one bpf_get_current_ancestor_cgroup_id() and a compare per directory (a helper that
 *             reads current->cgroups->dfl_cgrp->ancestors[level]->kn->id): about as cheap as the
 *             one-pid compare, where a hash lookup cost 50-80 ns more an event (measured side by
 *             side, benchmarks/RESULTS.md "Target selectors").  A per-CPU memo of the last verdict
 *             (2026-12-01) measured no cheaper than the lookup; the lookup stays for MATCH_CGROUPS 1.
 *   --file    task->files->fdt->{max_fds, fd} are direct loads through the BTF pointer of
 *             bpf_get_current_task_btf() (verifier-checked against the running kernel's BTF,
 *             no helper call); the fd slot, the file's f_inode..f_pos span, the inode's
 *             i_mode..i_ino span and the superblock's s_dev are four bpf_probe_read_kernel
 *             (FD_ID, a pread's walk: the f_inode..f_flags and i_sb..i_ino spans, 12 and 32
 *             bytes on 6.x against 88 and 72; benchmarks/RESULTS.md "Tracer overhead").
 *             Nothing about an fd is cached: a closed, reused or dup2'ed fd is followed afresh on
 *             every call, to its inode's (i_sb, i_ino); only the superblock's s_dev and the
 *             verdict for the pair are memoized per CPU (`file_memo`: the s_dev read and the hash
 *             lookup skipped when they repeat).  The one case it could misjudge: the file's
 *             filesystem unmounted and another mounted whose superblock lands at the same
 *             address, read on that CPU before any other file (its s_dev, and with a file of the
 *             same inode number its verdict).
 */
#if MATCH_TGIDS == 2
BPF_HASH(target_tgids, u32, u8, MAX_TARGETS);
#endif
#if MATCH_CGROUPS == 1
BPF_HASH(target_cgroups, u64, u8, MAX_CGROUPS);
#endif
#if MATCH_CGROUPS == 2
/* slot i (a constant; unused slots compile away) */
#define IN_CG_SLOT(i) (CGROUP_SLOTS_USED > i && bpf_get_current_ancestor_cgroup_id(CG_LEVEL_##i) == CG_ID_##i)
#endif
#ifndef FD_WALK
#define FD_WALK 0
#endif
/* the fd -> file walk is compiled in: --file, or a probe that names every call's file (FD_WALK) */
#define FD_WALK_ON (FD_WALK || MATCH_FILES)
#if MATCH_FILES
struct target_file_key {
	u32 dev;          /* superblock s_dev: major << 20 | minor */
	u32 __pad0;
	u64 ino;
};
BPF_HASH(target_files, struct target_file_key, u8, MAX_FILES);
#endif
#if FD_WALK_ON
/* per-CPU memo of the last file walked: its superblock's s_dev (an s_dev read saved while the
 * superblock repeats) and, with --file, the verdict for (superblock, inode number): in
 * target_files or not.  target_files only grows (an overlay file's copy-up,
 * engramprof/bpf/targets.py), and user space clears the memo after adding; only syscall entry
 * hooks (preemption off, they do not nest) walk an fd, so an entry is never torn. */
struct file_memo {
	u64 sb;           /* struct super_block *; 0: empty */
	u64 ino;
	u32 dev;
	u16 in;
	u16 pseudo;
};
BPF_PERCPU_ARRAY(file_memo, struct file_memo, 1);
#endif

static __always_inline int is_target_file(u32 dev, u64 ino)
{
#if MATCH_FILES
	struct target_file_key k = {.dev = dev, .ino = ino};
	return target_files.lookup(&k) != 0;
#else
	return 1;
#endif
}

/* The file behind an fd of the current task at this instant (fd_file_walk). */
struct fd_file {
	u64 sb;           /* struct super_block * (0: not walked / no file) */
	u64 ino;          /* inode number */
	s64 pos;          /* f_pos: where read() / readv() reads from */
	u32 dev;          /* superblock s_dev, the kernel's encoding: major << 20 | minor */
	u32 flags;        /* f_flags (O_DIRECT, ...) */
	u16 mode;         /* i_mode (S_IFREG, ...) */
	u16 pseudo;       /* on a pseudo filesystem (procfs, sysfs, cgroupfs, ...: PSEUDO_FS) */
	u32 __pad0;
};

/* filesystems whose "regular" files are the kernel's own text, never a table: proc, sysfs,
 * cgroup v1 / v2, debugfs, tracefs, securityfs, bpffs, selinuxfs, pstore, efivarfs, configfs
 * (their superblock's s_magic, include/uapi/linux/magic.h) */
#define PSEUDO_FS(m) ((m) == 0x9fa0 || (m) == 0x62656572 || (m) == 0x27e0eb || (m) == 0x63677270 || \
		      (m) == 0x64626720 || (m) == 0x74726163 || (m) == 0x73636673 || (m) == 0xcafe4a11 || \
		      (m) == 0xf97cff8c || (m) == 0x6165676c || (m) == 0xde5e81e4 || (m) == 0x62656570)

#if FD_WALK_ON
#define MIN2(a, b) ((a) < (b) ? (a) : (b))
#define MAX2(a, b) ((a) > (b) ? (a) : (b))
/* the members of struct file and struct inode the walk needs, each read as one span */
#define FILE_SPAN_FROM MIN2(OFF_FILE_INODE, MIN2(OFF_FILE_FLAGS, OFF_FILE_POS))
#define FILE_SPAN_TO MAX2(OFF_FILE_INODE + 8, MAX2(OFF_FILE_FLAGS + 4, OFF_FILE_POS + 8))
#define INODE_SPAN_FROM MIN2(OFF_INODE_MODE, MIN2(OFF_INODE_SB, OFF_INODE_INO))
#define INODE_SPAN_TO MAX2(OFF_INODE_MODE + 2, MAX2(OFF_INODE_SB + 8, OFF_INODE_INO + 8))
/* the same for the identity alone (FD_ID: no f_pos, no i_mode) */
#define FILE_ID_SPAN_FROM MIN2(OFF_FILE_INODE, OFF_FILE_FLAGS)
#define FILE_ID_SPAN_TO MAX2(OFF_FILE_INODE + 8, OFF_FILE_FLAGS + 4)
#define INODE_ID_SPAN_FROM MIN2(OFF_INODE_SB, OFF_INODE_INO)
#define INODE_ID_SPAN_TO MAX2(OFF_INODE_SB + 8, OFF_INODE_INO + 8)
#define SB_SPAN_FROM MIN2(OFF_SB_DEV, OFF_SB_MAGIC)
#define SB_SPAN_TO MAX2(OFF_SB_DEV + 4, OFF_SB_MAGIC + 8)
#endif

/* The one walk of an fd: current->files->fdt->fd[fd] -> the file's f_inode, f_flags, f_pos ->
 * the inode's i_mode, i_ino, i_sb -> the superblock's s_dev and s_magic.  The first three hops are BTF loads
 * (a NULL or bad pointer reads as 0, no fault); then one probe read of the fd slot, one of the
 * file's span, one of the inode's span, one of the superblock's s_dev..s_magic unless the
 * superblock is the memo's (each span is at most 128 bytes on the kernels we know; else member by
 * member).  parts FD_ID reads less of the file and the inode: no f_pos, no i_mode (a pread has
 * its offset; only read() / readv() are tested for a regular file).  Returns 0
 * (f zeroed) when a hop fails or is NULL (fd closed meanwhile, a kernel thread).  Nothing about
 * an fd is cached: a closed, reused or dup2'ed fd is followed afresh on every call. */
#define FD_ALL 1  /* the walk reads everything struct fd_file has */
#define FD_ID 0   /* the identity and the flags only: dev, ino, f_flags, pseudo (f->pos, f->mode stay 0):
                   * a smaller span of the file and of the inode (a pread's walk: it has its offset) */
#if FD_WALK_ON
/* The struct file * behind fd of the current task now (the walk's first hops); 0: none. */
static __always_inline u64 fd_file_ptr(s32 fd)
{
	if (fd < 0)
		return 0;
	char *task = (char *)bpf_get_current_task_btf();
	char *files = *(char **)(task + OFF_TASK_FILES);
	if (!files)
		return 0;
	char *fdt = *(char **)(files + OFF_FILES_FDT);
	if (!fdt)
		return 0;
	u32 max_fds = *(u32 *)(fdt + OFF_FDT_MAX_FDS);
	u64 fds = *(u64 *)(fdt + OFF_FDT_FD);
	if ((u32)fd >= max_fds || !fds)
		return 0;
	u64 file = 0;
	if (bpf_probe_read_kernel(&file, sizeof(file), (void *)(fds + 8 * (u64)(u32)fd)))
		return 0;
	return file;
}
#endif

static __always_inline int fd_file_walk_parts(s32 fd, struct fd_file *f, int parts)
{
	__builtin_memset(f, 0, sizeof(*f));
#if FD_WALK_ON
	u64 file = fd_file_ptr(fd), inode = 0, sb = 0, ino = 0;
	if (!file)
		return 0;
	/* one buffer for the three spans (a caller may run the walk in an unrolled loop: the BPF
	 * stack has 512 bytes in all) */
	char buf[128];
	if (parts == FD_ALL) {
#if FILE_SPAN_TO - FILE_SPAN_FROM <= 128
		char *fspan = buf;
		if (bpf_probe_read_kernel(fspan, FILE_SPAN_TO - FILE_SPAN_FROM, (void *)(file + FILE_SPAN_FROM)))
			return 0;
		__builtin_memcpy(&inode, fspan + (OFF_FILE_INODE - FILE_SPAN_FROM), 8);
		__builtin_memcpy(&f->flags, fspan + (OFF_FILE_FLAGS - FILE_SPAN_FROM), 4);
		__builtin_memcpy(&f->pos, fspan + (OFF_FILE_POS - FILE_SPAN_FROM), 8);
#else
		if (bpf_probe_read_kernel(&inode, 8, (void *)(file + OFF_FILE_INODE)) ||
		    bpf_probe_read_kernel(&f->flags, 4, (void *)(file + OFF_FILE_FLAGS)) ||
		    bpf_probe_read_kernel(&f->pos, 8, (void *)(file + OFF_FILE_POS)))
			return 0;
#endif
	} else {
#if FILE_ID_SPAN_TO - FILE_ID_SPAN_FROM <= 128
		char *fspan = buf;
		if (bpf_probe_read_kernel(fspan, FILE_ID_SPAN_TO - FILE_ID_SPAN_FROM, (void *)(file + FILE_ID_SPAN_FROM)))
			return 0;
		__builtin_memcpy(&inode, fspan + (OFF_FILE_INODE - FILE_ID_SPAN_FROM), 8);
		__builtin_memcpy(&f->flags, fspan + (OFF_FILE_FLAGS - FILE_ID_SPAN_FROM), 4);
#else
		if (bpf_probe_read_kernel(&inode, 8, (void *)(file + OFF_FILE_INODE)) ||
		    bpf_probe_read_kernel(&f->flags, 4, (void *)(file + OFF_FILE_FLAGS)))
			return 0;
#endif
	}
	if (!inode)
		return 0;
	if (parts == FD_ALL) {
#if INODE_SPAN_TO - INODE_SPAN_FROM <= 128
		/* i_mode, i_sb and i_ino in one read (they are within 72 bytes in 6.x's struct inode) */
		char *span = buf;
		if (bpf_probe_read_kernel(span, INODE_SPAN_TO - INODE_SPAN_FROM, (void *)(inode + INODE_SPAN_FROM)))
			return 0;
		__builtin_memcpy(&f->mode, span + (OFF_INODE_MODE - INODE_SPAN_FROM), 2);
		__builtin_memcpy(&sb, span + (OFF_INODE_SB - INODE_SPAN_FROM), sizeof(sb));
		__builtin_memcpy(&ino, span + (OFF_INODE_INO - INODE_SPAN_FROM), sizeof(ino));
#else
		if (bpf_probe_read_kernel(&f->mode, 2, (void *)(inode + OFF_INODE_MODE)) ||
		    bpf_probe_read_kernel(&ino, sizeof(ino), (void *)(inode + OFF_INODE_INO)) ||
		    bpf_probe_read_kernel(&sb, sizeof(sb), (void *)(inode + OFF_INODE_SB)))
			return 0;
#endif
	} else {
#if INODE_ID_SPAN_TO - INODE_ID_SPAN_FROM <= 128
		/* i_sb and i_ino (32 bytes in 6.x's struct inode) */
		char *span = buf;
		if (bpf_probe_read_kernel(span, INODE_ID_SPAN_TO - INODE_ID_SPAN_FROM, (void *)(inode + INODE_ID_SPAN_FROM)))
			return 0;
		__builtin_memcpy(&sb, span + (OFF_INODE_SB - INODE_ID_SPAN_FROM), sizeof(sb));
		__builtin_memcpy(&ino, span + (OFF_INODE_INO - INODE_ID_SPAN_FROM), sizeof(ino));
#else
		if (bpf_probe_read_kernel(&ino, sizeof(ino), (void *)(inode + OFF_INODE_INO)) ||
		    bpf_probe_read_kernel(&sb, sizeof(sb), (void *)(inode + OFF_INODE_SB)))
			return 0;
#endif
	}
	if (!sb)
		return 0;
	f->sb = sb;
	f->ino = ino;
	int zero = 0;
	struct file_memo *m = file_memo.lookup(&zero);
	if (m && m->sb == sb) {
		f->dev = m->dev;
		f->pseudo = m->pseudo;
		return 1;
	}
	u64 magic = 0;
#if SB_SPAN_TO - SB_SPAN_FROM <= 128
	char *sspan = buf;
	if (bpf_probe_read_kernel(sspan, SB_SPAN_TO - SB_SPAN_FROM, (void *)(sb + SB_SPAN_FROM)))
		return 0;
	__builtin_memcpy(&f->dev, sspan + (OFF_SB_DEV - SB_SPAN_FROM), 4);
	__builtin_memcpy(&magic, sspan + (OFF_SB_MAGIC - SB_SPAN_FROM), 8);
#else
	if (bpf_probe_read_kernel(&f->dev, sizeof(f->dev), (void *)(sb + OFF_SB_DEV)) ||
	    bpf_probe_read_kernel(&magic, sizeof(magic), (void *)(sb + OFF_SB_MAGIC)))
		return 0;
#endif
	f->pseudo = PSEUDO_FS(magic);
	if (m) {  /* a new superblock: the verdict memo goes with it */
		m->sb = sb;
		m->dev = f->dev;
		m->pseudo = f->pseudo;
		m->ino = 0;
		m->in = 0;
	}
	return 1;
#else
	return 0;
#endif
}

static __always_inline int fd_file_walk(s32 fd, struct fd_file *f)
{
	return fd_file_walk_parts(fd, f, FD_ALL);
}

/* Is the walked file f one of the target files (--file)?  1 when there is no --file.  The
 * verdict for (superblock, inode number) is memoized per CPU (file_memo).  The one case it could
 * misjudge: the file's filesystem unmounted and another mounted whose superblock lands at the
 * same address, with a file of the same inode number, read on that CPU before any other file. */
static __always_inline int is_target_fd_file(struct fd_file *f)
{
#if MATCH_FILES
	if (!f->sb)
		return 0;
	int zero = 0;
	struct file_memo *m = file_memo.lookup(&zero);
	if (m && m->sb == f->sb && m->ino == f->ino)
		return m->in;
	int in = is_target_file(f->dev, f->ino);
	if (m && m->sb == f->sb) {
		m->ino = f->ino;
		m->in = in;      /* (m->ino 0 after a new superblock: no file has inode number 0) */
	}
	return in;
#else
	return 1;
#endif
}

/* Walk fd into f and say whether it is a target file: the one walk of a call serves both the
 * --file filter and the record (f: the file's identity, flags, position; zeroed when neither
 * --file nor FD_WALK asked for the walk). */
static __always_inline int target_fd_file_parts(s32 fd, struct fd_file *f, int parts)
{
	if (!fd_file_walk_parts(fd, f, parts))
		return !MATCH_FILES;
	return is_target_fd_file(f);
}

static __always_inline int target_fd_file(s32 fd, struct fd_file *f)
{
	return target_fd_file_parts(fd, f, FD_ALL);
}

/* Is fd (of the current task) one of the target files (--file)?  1 when there is no --file. */
static __always_inline int is_target_fd(s32 fd)
{
	struct fd_file f;
	return target_fd_file(fd, &f);
}

static __always_inline int is_target(u64 pid_tgid)
{
#if MATCH_TGIDS == 1
	if ((pid_tgid >> 32) != TARGET_TGID)
		return 0;
#else
	if ((pid_tgid >> 32) == TRACER_TGID)
		return 0;
#endif
#if MATCH_TGIDS == 2
	u32 tgid = pid_tgid >> 32;
	if (!target_tgids.lookup(&tgid))
		return 0;
#endif
#if TARGET_TID
	if ((u32)pid_tgid != TARGET_TID)
		return 0;
#endif
#if MATCH_CGROUPS == 1
	u64 cg = bpf_get_current_cgroup_id();
	if (!target_cgroups.lookup(&cg))
		return 0;
#elif MATCH_CGROUPS == 2
	if (!(IN_CG_SLOT(0) || IN_CG_SLOT(1) || IN_CG_SLOT(2) || IN_CG_SLOT(3) ||
	      IN_CG_SLOT(4) || IN_CG_SLOT(5) || IN_CG_SLOT(6) || IN_CG_SLOT(7)))
		return 0;
#endif
	return 1;
}

#if FOLLOW_CHILDREN && MATCH_TGIDS == 2
/* Runs in the parent (current).  A new thread fires it too (child_pid is then a tid): the entry
 * is harmless (no live process has a thread's tid as its tgid) and goes when the thread exits. */
TRACEPOINT_PROBE(sched, sched_process_fork)
{
	u32 parent = bpf_get_current_pid_tgid() >> 32;
	if (!target_tgids.lookup(&parent))
		return 0;
	u32 child = args->child_pid;
	u8 one = 1;
	target_tgids.update(&child, &one);
	return 0;
}

/* Every exiting thread: its own (thread) entry goes; the process's when its group is dead. */
TRACEPOINT_PROBE(sched, sched_process_exit)
{
	u64 pt = bpf_get_current_pid_tgid();
	u32 tid = (u32)pt, tgid = pt >> 32;
	if (tid != tgid)
		target_tgids.delete(&tid);
#if HAVE_GROUP_DEAD
	if (args->group_dead)
		target_tgids.delete(&tgid);
#else
	if (tid == tgid)
		target_tgids.delete(&tgid);
#endif
	return 0;
}
#endif
