"""The host: what this machine and kernel offer, read without tracing.

cachestat(2) and mincore(2) residency, files as the kernel names them, page-allocation policy, the
tracepoints engramprof uses, and the checks ``doctor`` runs.  Imports nothing above it but
``tables`` (a file's tensors, for residency by tensor).
"""
