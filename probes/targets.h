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
 *   TARGET_TID       one thread, 0 = all          MAX_TARGETS, MAX_CGROUPS  map sizes
 */
#if MATCH_TGIDS == 2
BPF_HASH(target_tgids, u32, u8, MAX_TARGETS);
#endif
#if MATCH_CGROUPS
BPF_HASH(target_cgroups, u64, u8, MAX_CGROUPS);
#endif

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
