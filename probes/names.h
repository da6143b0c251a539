/* names.h - what probes/names.bpf.c and user space (engramprof/bpf/names.py) share: the name
 * the kernel gave a file when a target opened it, keyed by the file's identity.
 *
 * engramprof/bpf/names.py parses the structs below (engramprof/bpf/structs.py's parser) and
 * checks them at load time against the layout clang compiled (the *_layout maps).  Keep:
 * fixed-width types only, explicit padding, 8-byte multiples.
 */
#ifndef ENGRAMPROF_NAMES_H
#define ENGRAMPROF_NAMES_H

#define NAME_LEVELS   16   /* dentries walked up from the file (deeper: the name is partial) */
#define NAME_BUF      512  /* bytes of components; one more component may start below it */
#define NAME_PART     256  /* NAME_MAX + 1: the most one component takes */

/* The key: the file's identity as the read probes take it (probes/targets.h fd_file_walk). */
struct name_key {
	u32 dev;          /* its superblock's s_dev (major << 20 | minor) */
	u32 __pad0;
	u64 ino;
};

/* The dentry's name and its parents', leaf first, each NUL-terminated, up to (not including)
 * the superblock's root: the path inside its filesystem, which user space joins to a mount
 * point of that device (/proc/PID/mountinfo). */
struct file_name {
	u64 dentry;       /* the leaf dentry named: a new dentry on the same identity (inode number
	                   * reused after a delete, a rename) is named again */
	u32 len;          /* bytes of buf used */
	u16 depth;        /* components in buf */
	u16 complete;     /* 1: the walk reached the root (else the name is the last depth levels) */
	char buf[NAME_BUF + NAME_PART];
};

struct name_totals {
	u64 opens;        /* opens of a target that returned an fd of a regular file */
	u64 named;        /* of which named (a new identity or a new dentry for it) */
	u64 partial;      /* of which deeper than NAME_LEVELS or NAME_BUF: the name is partial */
	u64 full;         /* the name map was full: not named (user space falls back to /proc) */
};

#endif
