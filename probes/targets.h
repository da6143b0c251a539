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
 *                    is_target_fd(fd) follows current->files->fdt->fd[fd]->f_inode with the
 *                    running kernel's member offsets OFF_* (engramprof/bpf/btf.py), is_target_file
 *                    (dev, ino) tests what a tracepoint gives (mm_filemap_fault); both are 1 when 0
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
 *             no helper call); the fd slot, the file's f_inode, the inode's i_sb..i_ino span and
 *             the superblock's s_dev are four bpf_probe_read_kernel (was nine).  Nothing about an
 *             fd is cached: a closed, reused or dup2'ed fd is followed afresh on every call, to
 *             its inode's (i_sb, i_ino); only the verdict for that pair is memoized per CPU
 *             (`file_memo`: the s_dev read and the hash lookup skipped when the pair repeats).  The
 *             one case it could misjudge: the file's filesystem unmounted and another mounted
 *             whose superblock lands at the same address, with a file of the same inode number,
 *             read on that CPU before any other file.
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
#if MATCH_FILES
struct target_file_key {
	u32 dev;          /* superblock s_dev: major << 20 | minor */
	u32 __pad0;
	u64 ino;
};
BPF_HASH(target_files, struct target_file_key, u8, MAX_FILES);
/* per-CPU memo of the last verdict of is_target_fd: (superblock, inode number) -> in target_files
 * or not.  target_files only grows (an overlay file's copy-up, engramprof/bpf/targets.py), and user
 * space clears the memo after adding; only syscall entry hooks (preemption off, they do not nest)
 * call is_target_fd, so an entry is never torn. */
struct file_memo {
	u64 sb;           /* struct super_block *; 0: empty */
	u64 ino;
	u64 in;
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

/* fd (of the current task) -> its struct file and the inode's (i_sb, i_ino):
 * current->files->fdt->fd[fd]->f_inode.  The first three hops are BTF loads (a NULL or bad pointer
 * reads as 0, no fault); the rest are probe reads.  Returns the struct file * (0: a hop failed or
 * was NULL: fd closed meanwhile, a kernel thread); *inode, *sb and *ino are set with it.  Compiled
 * for --file (MATCH_FILES) and for a probe that reads the file of an fd itself (FD_WALK 1, e.g.
 * probes/libaio.bpf.c at io_submit); the OFF_* offsets come from engramprof/bpf/btf.py FD_WALK. */
#ifndef FD_WALK
#define FD_WALK 0
#endif
#if MATCH_FILES || FD_WALK
#define INODE_SPAN_FROM (OFF_INODE_SB < OFF_INODE_INO ? OFF_INODE_SB : OFF_INODE_INO)
#define INODE_SPAN_TO ((OFF_INODE_SB < OFF_INODE_INO ? OFF_INODE_INO : OFF_INODE_SB) + 8)
static __always_inline u64 fd_inode(s32 fd, u64 *inode, u64 *sb, u64 *ino)
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
	if (bpf_probe_read_kernel(&file, sizeof(file), (void *)(fds + 8 * (u64)(u32)fd)) || !file)
		return 0;
	if (bpf_probe_read_kernel(inode, sizeof(*inode), (void *)(file + OFF_FILE_INODE)) || !*inode)
		return 0;
#if INODE_SPAN_TO - INODE_SPAN_FROM <= 64
	/* i_sb and i_ino in one read (they are 24 bytes apart in 6.x's struct inode) */
	char span[INODE_SPAN_TO - INODE_SPAN_FROM];
	if (bpf_probe_read_kernel(span, sizeof(span), (void *)(*inode + INODE_SPAN_FROM)))
		return 0;
	__builtin_memcpy(sb, span + (OFF_INODE_SB - INODE_SPAN_FROM), sizeof(*sb));
	__builtin_memcpy(ino, span + (OFF_INODE_INO - INODE_SPAN_FROM), sizeof(*ino));
#else
	if (bpf_probe_read_kernel(ino, sizeof(*ino), (void *)(*inode + OFF_INODE_INO)))
		return 0;
	if (bpf_probe_read_kernel(sb, sizeof(*sb), (void *)(*inode + OFF_INODE_SB)))
		return 0;
#endif
	if (!*sb)
		return 0;
	return file;
}
#endif

/* Is fd (of the current task) one of the target files?  fd_inode(), then the superblock's s_dev.
 * A hop that fails or is NULL is not a target. */
static __always_inline int is_target_fd(s32 fd)
{
#if MATCH_FILES
	u64 inode = 0, sb = 0, ino = 0;
	u32 dev = 0;
	if (!fd_inode(fd, &inode, &sb, &ino))
		return 0;
	int zero = 0;
	struct file_memo *m = file_memo.lookup(&zero);
	if (m && m->sb == sb && m->ino == ino)
		return m->in;
	if (bpf_probe_read_kernel(&dev, sizeof(dev), (void *)(sb + OFF_SB_DEV)))
		return 0;
	int in = is_target_file(dev, ino);
	if (m) {
		m->sb = sb;
		m->ino = ino;
		m->in = in;
	}
	return in;
#else
	return 1;
#endif
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
