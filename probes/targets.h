/* targets.h - which processes a probe traces (included by every probe; filled in before load).
 *
 * Constants (-D, engramprof/bpf/targets.py):
 *   MATCH_TGIDS      0: any process; 1: the one process TARGET_TGID (a compare);
 *                    2: the processes in the `target_tgids` hash (filled from user space right
 *                    after load, before the recording is armed; --pid repeated, --children,
 *                    the processes of a cgroup v1 path)
 *   MATCH_CGROUPS    1: the current task's cgroup2 id (bpf_get_current_cgroup_id) must be in
 *                    `target_cgroups` (a --cgroup v2 directory and its sub-groups, by inode)
 *   FOLLOW_CHILDREN  1: a process forked by a target becomes a target (sched_process_fork);
 *                    it is forgotten when its thread group dies (sched_process_exit)
 *   HAVE_GROUP_DEAD  sched_process_exit has group_dead (else: when the leader exits)
 *   MATCH_FILES      1: only reads of the files in `target_files` (--file: device + inode, the
 *                    kernel's encoding, filled from user space before the recording is armed);
 *                    is_target_fd(fd) follows current->files->fdt->fd[fd]->f_inode with the
 *                    running kernel's member offsets OFF_* (engramprof/bpf/btf.py), is_target_file
 *                    (dev, ino) tests what a tracepoint gives (mm_filemap_fault); both are 1 when 0
 *   TARGET_TID       one thread, 0 = all          MAX_TARGETS, MAX_CGROUPS, MAX_FILES  map sizes
 */
#if MATCH_TGIDS == 2
BPF_HASH(target_tgids, u32, u8, MAX_TARGETS);
#endif
#if MATCH_CGROUPS
BPF_HASH(target_cgroups, u64, u8, MAX_CGROUPS);
#endif
#if MATCH_FILES
struct target_file_key {
	u32 dev;          /* superblock s_dev: major << 20 | minor */
	u32 __pad0;
	u64 ino;
};
BPF_HASH(target_files, struct target_file_key, u8, MAX_FILES);
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

/* Is fd (of the current task) one of the target files?  Each hop is one probe read; a hop
 * that fails or is NULL (fd closed meanwhile, a kernel thread) is not a target. */
static __always_inline int is_target_fd(s32 fd)
{
#if MATCH_FILES
	if (fd < 0)
		return 0;
	u64 task = bpf_get_current_task(), files = 0, fdt = 0, fds = 0, file = 0, inode = 0, sb = 0, ino = 0;
	u32 max_fds = 0, dev = 0;
	if (bpf_probe_read_kernel(&files, sizeof(files), (void *)(task + OFF_TASK_FILES)) || !files)
		return 0;
	if (bpf_probe_read_kernel(&fdt, sizeof(fdt), (void *)(files + OFF_FILES_FDT)) || !fdt)
		return 0;
	if (bpf_probe_read_kernel(&max_fds, sizeof(max_fds), (void *)(fdt + OFF_FDT_MAX_FDS)) || (u32)fd >= max_fds)
		return 0;
	if (bpf_probe_read_kernel(&fds, sizeof(fds), (void *)(fdt + OFF_FDT_FD)) || !fds)
		return 0;
	if (bpf_probe_read_kernel(&file, sizeof(file), (void *)(fds + 8 * (u64)(u32)fd)) || !file)
		return 0;
	if (bpf_probe_read_kernel(&inode, sizeof(inode), (void *)(file + OFF_FILE_INODE)) || !inode)
		return 0;
	if (bpf_probe_read_kernel(&ino, sizeof(ino), (void *)(inode + OFF_INODE_INO)))
		return 0;
	if (bpf_probe_read_kernel(&sb, sizeof(sb), (void *)(inode + OFF_INODE_SB)) || !sb)
		return 0;
	if (bpf_probe_read_kernel(&dev, sizeof(dev), (void *)(sb + OFF_SB_DEV)))
		return 0;
	return is_target_file(dev, ino);
#else
	return 1;
#endif
}

static __always_inline int is_target(u64 pid_tgid)
{
#if MATCH_TGIDS == 1
	if ((pid_tgid >> 32) != TARGET_TGID)
		return 0;
#elif MATCH_TGIDS == 2
	u32 tgid = pid_tgid >> 32;
	if (!target_tgids.lookup(&tgid))
		return 0;
#endif
#if TARGET_TID
	if ((u32)pid_tgid != TARGET_TID)
		return 0;
#endif
#if MATCH_CGROUPS
	u64 cg = bpf_get_current_cgroup_id();
	if (!target_cgroups.lookup(&cg))
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
