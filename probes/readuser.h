/* readuser.h - bpf_probe_read_user under a name BCC's rewriter does not look up.
 *
 * BCC (0.26) checks at every call of bpf_probe_read_user in a program's source that the kernel
 * has the helper, by resolving "bpf_probe_read_user" in /proc/kallsyms, and its symbol cache
 * rebuilds its whole name map (121,436 symbols here) at every such look-up (kallsyms has
 * duplicate names, so the map is never the size of the list it was built from: KSyms::
 * resolve_name).  About 30 ms of clang's time a call site: 0.25 s of the libaio probe's compile.
 * The probes need the helper (Linux 5.5+, a tracepoint program reading the target's memory), so
 * the check buys nothing: the same helper, called under another name.
 */
#ifndef EP_READUSER_H
#define EP_READUSER_H

static long (*ep_probe_read_user)(void *dst, u32 size, const void *unsafe_ptr) = (void *)BPF_FUNC_probe_read_user;
#define bpf_probe_read_user ep_probe_read_user

#endif /* EP_READUSER_H */
