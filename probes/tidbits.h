/* tidbits.h - one bit per thread id: "this target thread is switched out inside something we
 * time" (a traced call: call_out_bits of probes/inflight.h; an open fault: fault_out_bits of
 * probes/faults.bpf.c; an off-CPU span: open_spans of probes/sched.bpf.c).
 *
 * sched_switch (its next task) and sched_wakeup fire for every task of the machine.  Each probe
 * keeps a BPF_ARRAY of TID_WORDS u64 words: bit (tid & 63) of word (tid >> 6) is set at the
 * target thread's switch-out and cleared at its switch-in, and the hooks test it (an inlined
 * array lookup, no helper call) before any clock read or hash lookup.  TID_WORDS covers pid_max
 * with headroom (engramprof/bpf/sched.py, _tid_words); a tid past it has no word (w == NULL).
 *
 * The array is the probe's own (BCC rewrites `map.lookup()` only where the map is named in the
 * source, not through a macro): a probe declares it and looks its word up with tid_word_index();
 * everything done with the word is here.
 *
 * Constant (-D): TID_WORDS.
 */
#ifndef ENGRAMPROF_TIDBITS_H
#define ENGRAMPROF_TIDBITS_H

/* the index of tid's word in the probe's array */
static __always_inline u32 tid_word_index(u32 tid)
{
	return tid >> 6;
}

static __always_inline u64 tid_bit(u32 tid)
{
	return 1ULL << (tid & 63);
}

/* tid's bit is set: it is switched out inside something timed (no word: 0) */
static __always_inline int tid_bit_is_set(u64 *w, u32 tid)
{
	return w && (*w & tid_bit(tid));
}

/* tid may be switched out inside something timed: its bit is set, or it has no word (a tid past
 * the array: the caller's hash lookup decides, as without the bitmap) */
static __always_inline int tid_bit_maybe(u64 *w, u32 tid)
{
	return !w || (*w & tid_bit(tid));
}

static __always_inline void tid_bit_set(u64 *w, u32 tid)
{
	if (w)
		__sync_fetch_and_or(w, tid_bit(tid));
}

/* clear tid's bit, known to be set (a switch-in that tested it) */
static __always_inline void tid_bit_drop(u64 *w, u32 tid)
{
	if (w)
		__sync_fetch_and_and(w, ~tid_bit(tid));
}

/* clear tid's bit (the atomic only when it is set) */
static __always_inline void tid_bit_clear(u64 *w, u32 tid)
{
	if (w && (*w & tid_bit(tid)))
		__sync_fetch_and_and(w, ~tid_bit(tid));
}

#endif
