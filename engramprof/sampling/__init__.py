"""The samplers' parts: procfs parsers, sources, rows, summaries (engramprof/sampling/sampler.py runs them)."""
