"""Table layouts: file + offset -> tensor + row, from safetensors headers or a layout file.

:mod:`.safetensors` reads a safetensors header (never the data); :mod:`.raw` maps raw
``.bin`` tables through a TOML layout file.  The lowest layer: only ``errors`` below it.
"""
