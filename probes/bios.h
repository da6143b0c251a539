/* bios.h - the in-flight bio table shared by the fault probe (faults.bpf.c), the syscall
 * probe (syscalls.bpf.c) and the exporter's (export.bpf.c): a bio a target thread queued inside
 * one of its reads, found again at its completion by (device, first sector).
 *
 * A direct-mapped array of BIO_SLOTS slots (a power of two), indexed by a hash of (dev, sector).
 * A slot is taken when its tag is nonzero.  The tag holds the hash's high 32 bits (a quick
 * reject before the exact dev / sector compare) and the queue time in units of 2^20 ns (~1 ms,
 * low bit forced to 1 so a taken tag is never 0): whether a taken slot is stale is read from the
 * same word that is compared-and-swapped, so two CPUs never both take a slot.
 *   claim (block_bio_queue): compare-and-swap the tag 0 -> tag.  A slot held for more than
 *     BIO_STALE_NS (a completion never seen) is taken over by a compare-and-swap from the tag
 *     read; so is, with BIO_SECTOR_ONCE, a slot held by an earlier bio of the same sector;
 *     a slot held by another live bio: this bio is not tracked (bios_untracked: the read
 *     gets it in bio_count, not in bio_ns).
 * A completion is never seen when the kernel skipped the completion hook's program (another BPF
 * program was running on that CPU: engramprof/bpf/progstats.py counts it); its slot stays held.
 *   find + release (completion, back-merge): compare the tag's hash and the slot's dev / sector,
 *     read the slot, compare-and-swap the tag read -> 0; only the CPU whose swap succeeded uses
 *     what it read.
 * No lock, no helper call: an array lookup is inlined by the verifier.  bio_slots_taken counts the
 * slots taken (claims - releases; a stale slot taken over stays counted once): the completion
 * hooks, which fire for every I/O of the machine, stop at it before any slot lookup.
 *
 * Constants filled in before load (-D): BIO_SLOTS (power of two), BIO_STALE_NS, BIO_RAW_COMPLETION
 * (and its OFF_* offsets), BIO_SECTOR_ONCE
 * (1: the probe's bios are page-cache reads, and a sector is never read twice at once: its page
 * stays locked until the read ends; so an earlier bio of the same sector has completed unseen.
 * 0 where O_DIRECT reads may read one sector from two threads at once).
 */
#ifndef ENGRAMPROF_BIOS_H
#define ENGRAMPROF_BIOS_H

#define BIO_TICK_SHIFT 20
#define BIO_STALE_TICKS ((u32)(BIO_STALE_NS >> BIO_TICK_SHIFT))
#define BIO_TAG_HASH_MASK 0xffffffff00000000ULL

struct bio_slot {
	u64 tag;          /* 0: free; else hash >> 32 << 32 | queue tick | 1 */
	u64 sector;       /* first sector: equals the request's when the bio starts a request */
	u64 ts;           /* queued at (ns) */
	u64 owner_ts;     /* the read that queued it: the fault's or the call's entry time */
	u32 dev;
	u32 tid;          /* the thread that queued it */
};

/* what a completion found: the released slot's contents */
struct bio_found {
	u64 ts;
	u64 owner_ts;
	u32 tid;
	u32 __pad0;
};

BPF_ARRAY(bio_slots, struct bio_slot, BIO_SLOTS);
BPF_ARRAY(bio_slots_taken, s64, 1);

static __always_inline u64 bio_hash(u32 dev, u64 sector)
{
	u64 h = sector ^ ((u64)dev << 40) ^ dev;
	/* murmur3's 64-bit finalizer: sectors of one read differ in a few low bits */
	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdULL;
	h ^= h >> 33;
	h *= 0xc4ceb9fe1a85ec53ULL;
	h ^= h >> 33;
	return h;
}

static __always_inline struct bio_slot *bio_slot_of(u64 h)
{
	u32 idx = (u32)h & (BIO_SLOTS - 1);
	return bio_slots.lookup(&idx);
}

static __always_inline void bio_slots_taken_add(s64 n)
{
	int zero = 0;
	s64 *c = bio_slots_taken.lookup(&zero);
	if (c)
		__sync_fetch_and_add(c, n);
}

/* Track a bio queued at now by tid for the read that began at owner_ts.  Returns 0 when it is
 * tracked, 1 when its slot is held by another live bio (not tracked). */
static __always_inline int bio_claim(u32 dev, u64 sector, u64 now, u64 owner_ts, u32 tid)
{
	u64 h = bio_hash(dev, sector);
	struct bio_slot *b = bio_slot_of(h);
	if (!b)
		return 1;
	u32 tick = (u32)(now >> BIO_TICK_SHIFT) | 1;
	u64 tag = (h & BIO_TAG_HASH_MASK) | tick;
	u64 old = __sync_val_compare_and_swap(&b->tag, 0, tag);
	if (old) {
		/* taken: take it over only when its bio was queued more than BIO_STALE_NS ago, or (BIO_SECTOR_ONCE)
		 * was an earlier bio of this sector */
		int same = BIO_SECTOR_ONCE && (old & BIO_TAG_HASH_MASK) == (h & BIO_TAG_HASH_MASK) &&
			   b->sector == sector && b->dev == dev;
		if ((u32)(tick - (u32)old) <= BIO_STALE_TICKS && !same)
			return 1;
		if (__sync_val_compare_and_swap(&b->tag, old, tag) != old)
			return 1;
	}
	b->sector = sector;
	b->ts = now;
	b->owner_ts = owner_ts;
	b->dev = dev;
	b->tid = tid;
	if (!old)
		bio_slots_taken_add(1);
	return 0;
}

/* Release the slot of bio (dev, sector) if it is tracked; 1 and *out filled when this CPU
 * released it. */
static __always_inline int bio_release(u32 dev, u64 sector, struct bio_found *out)
{
	u64 h = bio_hash(dev, sector);
	struct bio_slot *b = bio_slot_of(h);
	if (!b)
		return 0;
	u64 tag = b->tag;
	if (!tag || (tag & BIO_TAG_HASH_MASK) != (h & BIO_TAG_HASH_MASK) || b->sector != sector || b->dev != dev)
		return 0;
	out->ts = b->ts;
	out->owner_ts = b->owner_ts;
	out->tid = b->tid;
	if (__sync_val_compare_and_swap(&b->tag, tag, 0) != tag)
		return 0;  /* another CPU released it, or a new bio took over a stale slot */
	bio_slots_taken_add(-1);
	return 1;
}

/* Any slot taken now (an inlined array lookup): a completion hook stops here when none is. */
static __always_inline int bio_any_taken(void)
{
	int zero = 0;
	s64 *taken = bio_slots_taken.lookup(&zero);
	return taken && *taken > 0;
}

/* A completion of any I/O of the machine: 1 and *out filled when it was a tracked bio.  The
 * count of taken slots comes first: with none taken, no hash. */
static __always_inline int bio_completed(u32 dev, u64 sector, struct bio_found *out)
{
	if (!bio_any_taken())
		return 0;
	return bio_release(dev, sector, out);
}

#if BIO_RAW_COMPLETION
/* The completion hooks as raw tracepoints (BIO_RAW_COMPLETION_HOOKS(done) in a probe, done(dev,
 * sector) its completion handler).  A tracepoint program is skipped whenever another BPF program
 * runs on its CPU (a completion interrupt inside a sched_switch or block_bio_queue program: the
 * kernel's bpf_prog_active guard); a raw tracepoint's only when it is itself running there.  They
 * read what the tracepoints report, at offsets from the kernel's BTF (OFF_*, engramprof/bpf/bios.py):
 * block_rq_complete(rq, error, nr_bytes): sector = rq->__sector, dev = rq->q->disk's (major << 20 |
 * first_minor), 0 without a disk; block_bio_complete(q, bio): bio->bi_bdev->bd_dev, bi_iter.bi_sector. */
static __always_inline u32 bio_rq_dev(void *rq)
{
	void *q = 0, *disk = 0;
	int major = 0, minor = 0;
	bpf_probe_read_kernel(&q, sizeof(q), rq + OFF_RQ_Q);
	if (!q)
		return 0;
	bpf_probe_read_kernel(&disk, sizeof(disk), q + OFF_Q_DISK);
	if (!disk)
		return 0;
	bpf_probe_read_kernel(&major, sizeof(major), disk + OFF_DISK_MAJOR);
	bpf_probe_read_kernel(&minor, sizeof(minor), disk + OFF_DISK_MINOR);
	return ((u32)major << 20) | (u32)minor;
}

#define BIO_RAW_COMPLETION_HOOKS(done)							\
RAW_TRACEPOINT_PROBE(block_rq_complete)							\
{											\
	if (!bio_any_taken())								\
		return 0;								\
	void *rq = (void *)ctx->args[0];						\
	u64 sector = 0;									\
	bpf_probe_read_kernel(&sector, sizeof(sector), rq + OFF_RQ_SECTOR);		\
	done(bio_rq_dev(rq), sector);							\
	return 0;									\
}											\
RAW_TRACEPOINT_PROBE(block_bio_complete)						\
{											\
	if (!bio_any_taken())								\
		return 0;								\
	void *bio = (void *)ctx->args[1], *bdev = 0;					\
	u64 sector = 0;									\
	u32 dev = 0;									\
	bpf_probe_read_kernel(&bdev, sizeof(bdev), bio + OFF_BIO_BDEV);			\
	if (bdev)									\
		bpf_probe_read_kernel(&dev, sizeof(dev), bdev + OFF_BDEV_DEV);		\
	bpf_probe_read_kernel(&sector, sizeof(sector), bio + OFF_BIO_SECTOR);		\
	done(dev, sector);								\
	return 0;									\
}
#endif

#endif
