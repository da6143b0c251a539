"""engramprof: which of residency, reclaim, storage or Python scheduling holds a
table-on-disk reader's decode batches back, measured with tracepoint-only eBPF."""
__version__ = "0.1.0"
