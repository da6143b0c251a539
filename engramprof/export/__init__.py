"""``engramprof export``: always-on Prometheus metrics of a table reader's reads.

The probe (probes/export.bpf.c) aggregates in the kernel; user space only decodes its maps
into prometheus_client collectors and, every window, runs the batch analysis on a capped
sample of read records.  Modules: ``probe`` (build, load, read the maps), ``metrics`` (the
metric families), ``window`` (the per-window cause split), ``files`` ((device, inode) ->
path), ``server`` (the listener and the run loop), ``options`` (checked command-line values).
"""
