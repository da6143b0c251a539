/* watched.h - the watched-file test of the page-cache and eviction probes, cheap for the files
 * nobody watches (included by probes/pagecache.bpf.c and probes/evictions.bpf.c; filled in
 * before load).
 *
 * Both probes hook a tracepoint that fires for every page of the machine
 * (filemap:mm_filemap_add_to_page_cache, mm_filemap_delete_from_page_cache) and record only the
 * pages of the files in their `watched_files` hash (device + inode).  A hash lookup for every
 * page of every file cost 183 ns a run against 72 for an empty program (benchmarks/RESULTS.md,
 * "Page-fault probe overhead", 2026-12-01 run A).  In front of it, `watched_bits`: WATCH_BITS
 * slots indexed by watch_bit(dev, ino), one inlined array lookup.  A clear slot: not watched,
 * return.  A set slot: maybe watched, the hash decides (another watched file may share the slot).
 *
 * A slot is set wherever a key is put into watched_files: user space sets it right after the
 * hash update (engramprof/bpf/watched.py, WatchedFiles.add), the page-cache probe's
 * watch_file() after its own update for a target's insertion.  Slots are never cleared (a
 * collision only costs the hash lookup; nothing removes a watched file today).  One slot is one
 * u8 array element (8 bytes in the kernel), not one bit of a shared u64 word: user space and a
 * BPF program then never read-modify-write the same word, so neither can lose the other's bit,
 * and no atomic instruction is needed.
 *
 * watch_bit() is murmur3's 64-bit finalizer of (dev << 32) ^ ino, masked to WATCH_BITS - 1;
 * engramprof/bpf/watched.py computes the same (tests/test_watched_bits.py checks that the two
 * agree on many pairs, computed here by a test program).
 *
 * Constants (-D, engramprof/bpf/watched.py): WATCH_BITS, a power of two (default 65,536:
 * 512 KiB; with 4,096 files watched at most 1 in 16 unwatched files takes the hash lookup).
 */
#ifndef WATCH_BITS
#define WATCH_BITS 65536
#endif

struct file_key {
	u32 dev;
	u32 __pad0;
	u64 ino;
};

BPF_ARRAY(watched_bits, u8, WATCH_BITS);

static __always_inline u32 watch_bit(u32 dev, u64 ino)
{
	u64 x = ((u64)dev << 32) ^ ino;
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdULL;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ULL;
	x ^= x >> 33;
	return (u32)(x & (WATCH_BITS - 1));
}

/* the slot of (dev, ino): *slot 0 = certainly not in watched_files, 1 = maybe (look in the hash) */
static __always_inline u8 *watched_slot(u32 dev, u64 ino)
{
	u32 slot = watch_bit(dev, ino);
	return watched_bits.lookup(&slot);
}

static __always_inline int maybe_watched(u32 dev, u64 ino)
{
	u8 *set = watched_slot(dev, ino);
	return set && *set;
}
