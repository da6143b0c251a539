/* uring.h - what probes/uring.bpf.c and user space (engramprof/bpf/uring.py) share: the
 * record of one io_uring read request and the probe's totals.
 *
 * engramprof/bpf/uring.py parses the structs below (engramprof/bpf/structs.py's parser) and
 * checks them at load time against the layout clang compiled (the *_layout maps).  Keep:
 * fixed-width types only, explicit padding, 8-byte multiples.
 */
#ifndef ENGRAMPROF_URING_H
#define ENGRAMPROF_URING_H

/* how the request was served (uring_record.path) */
#define URING_PATH_INLINE 0  /* issued from the submitting thread and completed by that issue */
#define URING_PATH_ASYNC  1  /* issued from the submitting thread, queued (O_DIRECT bios, or a buffered
                              * read armed on the page's wait queue) and completed through task work */
#define URING_PATH_PUNTED 2  /* handed to an io-wq worker (io_uring_queue_async_work) */

/* uring_record.uflags */
#define URING_SQPOLL     1   /* submitted by the ring's SQPOLL kernel thread (iou-sqp-N) */
#define URING_FIXED_FILE 2   /* a registered file: fd is the index in the ring's file table */
#define URING_DIRECT     4   /* the file was open with O_DIRECT: the page cache was bypassed */
#define URING_CUR_POS    8   /* the sqe's offset was -1 (the file position): offset is where it read */
#define URING_IOV_TRUNC  16  /* READV with more than URING_MAX_IOV iovecs: size counts the first ones */
#define URING_WAITQ      32  /* the buffered read waited for a page on its wait queue (IOCB_WAITQ) */
#define URING_IO_TID_COMPLETE 64 /* io_tid is the io-wq worker that posted the completion */
#define URING_NO_FILE    128 /* no file at completion (bad fd, failed before the file was assigned) */

/* One read request of a target's ring (IORING_OP_READ, READV, READ_FIXED, READV_FIXED): written
 * at its completion (io_uring_complete) into the `uring_records` ring. */
struct uring_record {
	u64 ts_ns;        /* io_uring_submit_req, CLOCK_MONOTONIC (bpf_ktime_get_ns) */
	u64 dur_ns;       /* submit -> io_uring_complete (the CQE posted) */
	s64 offset;       /* file offset (the sqe's off; see URING_CUR_POS) */
	u64 size;         /* bytes requested (len; READV: sum of iov_len) */
	s64 ret;          /* the CQE's res: bytes read, or -errno */
	u64 flags;        /* RWF_* of the sqe (rw_flags) */
	u64 ino;          /* the file read: inode number (req->file->f_inode->i_ino) */
	u64 user_data;    /* the sqe's user_data */
	u64 ctx;          /* the ring (struct io_ring_ctx *): requests of one ring share it */
	u64 punt_ns;      /* submit -> io_uring_queue_async_work (0: not punted) */
	u64 bio_ns;       /* queue -> complete of the bios the issuing thread queued for it (those that
	                   * completed while it was in flight) */
	u32 pid;          /* tgid of the submitter: the ring's owner (io-wq and SQPOLL threads are its threads) */
	u32 tid;          /* the submitting thread (an SQPOLL ring: its iou-sqp thread) */
	u32 io_tid;       /* the thread that issued the read (0: an io-wq worker not seen) */
	u32 complete_tid; /* the thread in whose context the CQE was posted */
	u32 dev;          /* the file's superblock s_dev: major << 20 | minor */
	s32 fd;           /* the sqe's fd (URING_FIXED_FILE: the registered file's index) */
	u32 sqe_flags;    /* IOSQE_* of the sqe (the low byte of the request's flags) */
	u32 pages_added;  /* page-cache insertions by the thread issuing it, while issuing it */
	u32 bio_count;    /* bios queued by that thread while issuing it */
	u16 opcode;       /* IORING_OP_* */
	u16 path;         /* URING_PATH_* */
	u16 uflags;       /* URING_* */
	u16 __pad0;
	u32 __pad1;
};

/* Totals kept in the kernel (per CPU), right even when records were lost. */
struct uring_totals {
	u64 submitted;     /* read requests of the target seen at submit */
	u64 completed;     /* of which completed (recorded, lost or filtered) */
	u64 inline_n;      /* completed, URING_PATH_INLINE */
	u64 async_n;       /* completed, URING_PATH_ASYNC */
	u64 punted;        /* completed, URING_PATH_PUNTED */
	u64 sqpoll;        /* completed, submitted by an SQPOLL thread */
	u64 lost_records;  /* ring full: record dropped (still counted here) */
	u64 no_state;      /* in-flight map full at a submit: the request is not tracked */
	u64 replaced;      /* a submit found its request pointer still in flight: the earlier one's
	                    * completion was not seen (IOSQE_CQE_SKIP_SUCCESS, or a missed event) */
	u64 filtered;      /* completed reads of files not selected (--file) */
	u64 nonregular;    /* completed reads of files that are not regular files (pipes, sockets, procfs) */
	u64 sum_ns;        /* submit -> complete, summed over completed requests */
	u64 max_ns;
	u64 bios_untracked; /* bios queued for a request whose bio-table slot another bio held
	                     * (probes/bios.h): in its bio_count, not in its bio_ns */
	u64 unsampled;     /* EXPORT_MODE: completed after the window's sample budget was spent (no record) */
	u64 files_overflow; /* EXPORT_MODE: read_stats_by_file full: counted in the totals only */
};

#endif
