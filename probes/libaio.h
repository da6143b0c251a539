/* libaio.h - what probes/libaio.bpf.c and user space (engramprof/bpf/libaio.py) share: the
 * record of one Linux AIO read (an io_submit iocb of type IOCB_CMD_PREAD / PREADV) and the
 * probe's totals.
 *
 * engramprof/bpf/libaio.py parses the structs below (engramprof/bpf/structs.py's parser) and
 * checks them at load time against the layout clang compiled (the *_layout maps).  Keep:
 * fixed-width types only, explicit padding, 8-byte multiples.
 */
#ifndef ENGRAMPROF_LIBAIO_H
#define ENGRAMPROF_LIBAIO_H

/* aio_record.aflags */
#define AIO_DIRECT       1   /* the fd was open with O_DIRECT at submit: the page cache was bypassed */
#define AIO_VECTORED     2   /* IOCB_CMD_PREADV: size is the sum of the iovecs' lengths */
#define AIO_IOV_TRUNC    4   /* PREADV with more than AIO_MAX_IOV iovecs: size counts the first ones */
#define AIO_OTHER_THREAD 8   /* reaped by a thread other than the submitter */
#define AIO_PGETEVENTS   16  /* reaped by io_pgetevents (else io_getevents) */
#define AIO_RING_REAP    32  /* reaped in user space from the context's ring (no syscall): seen at the
                              * target's next io_submit / io_getevents on that context */

/* How the completion was seen (aio_record.aflags AIO_RING_REAP clear: a syscall returned it). */

/* One read iocb of a target: written when its completion is seen (an io_getevents /
 * io_pgetevents that returned its io_event, or its io_event read from the context's ring after
 * the process consumed it in user space) into the `aio_records` ring. */
struct aio_record {
	u64 ts_ns;        /* sys_enter_io_submit, CLOCK_MONOTONIC (bpf_ktime_get_ns) */
	u64 dur_ns;       /* submit -> reap (see aflags AIO_RING_REAP for how the reap was seen) */
	s64 offset;       /* iocb aio_offset */
	u64 size;         /* aio_nbytes (PREADV: sum of iov_len) */
	s64 ret;          /* the io_event's res: bytes read, or -errno */
	u64 flags;        /* iocb aio_rw_flags (RWF_*) */
	u64 ino;          /* the file read: inode number (fd -> file -> f_inode at submit) */
	u64 aio_data;     /* iocb aio_data (the io_event's data) */
	u64 ctx;          /* the aio_context_t (the ring's user address): iocbs of one context share it */
	u64 iocb;         /* the iocb's user address (the io_event's obj) */
	u64 bio_ns;       /* sum over its bios of queue -> complete (HAVE_BIO; see bio_count) */
	u32 bio_count;    /* bios queued for it by the submitter inside io_submit (the only iocb of
	                   * the call, or the one iomap:iomap_dio_rw_begin named: an O_DIRECT read) */
	u32 __pad0;
	u32 pid;          /* tgid of the submitter */
	u32 tid;          /* the submitting thread */
	u32 reap_tid;     /* the thread whose syscall returned the completion (AIO_RING_REAP: that saw it) */
	u32 dev;          /* the file's superblock s_dev: major << 20 | minor */
	s32 fd;           /* iocb aio_fildes */
	u16 opcode;       /* IOCB_CMD_* */
	u16 aflags;       /* AIO_* */
};

/* Totals kept in the kernel (per CPU), right even when records were lost. */
struct aio_totals {
	u64 submitted;      /* read iocbs of the target seen at io_submit's entry */
	u64 submit_failed;  /* of which io_submit did not take (it returned fewer than nr, or -errno) */
	u64 reaped;         /* read iocbs whose completion was seen (recorded, lost or filtered) */
	u64 other_thread;   /* of which reaped by another thread than the submitter */
	u64 ring_reaped;    /* of which seen in the context's ring after a user-space reap */
	u64 other_iocbs;    /* iocbs of the target of other types (writes, fsync, poll, ...): not reads */
	u64 not_regular;    /* read iocbs of files that are not regular files (pipes, sockets): not events */
	u64 no_file;        /* read iocbs whose fd named no open file at submit */
	u64 truncated;      /* iocbs of an io_submit beyond the first AIO_MAX_NR: not seen */
	u64 unknown_events; /* io_events reaped that matched no tracked read (submitted before arming,
	                     * another type, or a file left out) */
	u64 replaced;       /* a submit found its iocb address still in flight on the context: the
	                     * earlier one's completion was not seen (reaped in user space unseen) */
	u64 lost_records;   /* ring full: record dropped (still counted here) */
	u64 no_state;       /* in-flight map full at a submit: the iocb is not tracked */
	u64 filtered;       /* read iocbs of files not selected (--file) */
	u64 destroyed;      /* io_destroy calls of the target (in-flight reads swept from user space) */
	u64 bios;           /* bios credited to a read iocb (bio_count summed) */
	u64 bios_untracked; /* of which not timed: their slot of the in-flight bio table was held */
	u64 sum_ns;         /* submit -> reap, summed over reaped iocbs */
	u64 max_ns;
	u64 unsampled;      /* EXPORT_MODE: reaped after the window's sample budget was spent (no record) */
	u64 files_overflow; /* EXPORT_MODE: read_stats_by_file full: counted in the totals only */
	u64 events_truncated; /* io_events a reap returned beyond the first AIO_MAX_EVENTS: not read (their
	                       * reads stay in the in-flight map until their context goes) */
	u64 chain_broken;   /* a tail call to the next chunk of a loop failed: that loop's iocbs / events
	                     * left were not read (never, with the chain filled before attach) */
};

#endif
