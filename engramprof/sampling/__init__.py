"""The samplers' parts: procfs parsers, sources, rows, summaries (engramprof/samplers.py runs them)."""
