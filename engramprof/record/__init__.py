"""The recorder, as a pipeline: probe -> decoder -> enrichers -> trace writer.

Followed as data, a drained batch of ring-buffer records goes straight through:

1. :mod:`.decode` -- one decoder per record kind turns the probe's fixed-size records (numpy
   structured arrays, decoded in bulk by engramprof/bpf/ringbuf.py) into a :class:`ReadBatch`
   (``CallDecoder``: struct call_record -> read events of kind ``syscall``) or into sample rows
   (``VmEventDecoder``: struct vm_event -> ``kswapd_events``);
2. :mod:`.enrich` -- enrichers add columns the kernel cannot know: a path enricher (the file
   the kernel read, device + inode -> path, path_stale), ``TensorEnricher`` (path + offset ->
   tensor, row);
3. :mod:`.columns` -- the batch as an Arrow table of the trace's EVENT_SCHEMA, built from the
   column list in engramprof/trace/schema.py;
4. :mod:`.sink` -- the tables go to the TraceWriter from a background thread.

Beside the line, :mod:`.live` keeps running aggregates for the live view and the summary
(:mod:`.summary`).  Everything is columnar: a drain costs a few numpy / Arrow calls per
distinct file, never Python work per event.

Each probe's side of a recording is a source (:mod:`.sources`: syscalls, faults, sched,
evictions, pagecache, samples) implementing one protocol (:mod:`.sources.base`); the
recorder (:mod:`.recorder`) loops over the registered sources and never names one.  The fault
source adds a decoder and an enricher (mapping -> path); the tensor enricher, the table builder
and the sink are shared.
"""
