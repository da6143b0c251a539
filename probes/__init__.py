"""BPF C sources for engramprof's probes, shipped as package data (engramprof.probes)."""
