"""Loading the BPF probes (BCC) and decoding what they write."""
