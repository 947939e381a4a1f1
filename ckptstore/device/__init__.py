"""Device: GPU kernels as torch ops -- quantization (``quant``), checkout decoding (``decode``),
changed rows (``rows``), bit packing (``bits``) and the CUDA stream of each I/O thread
(``streams``); bit-identical to the host's.

May import: state, history, format, chunkcodec, storage and the top-level helpers (errors, limits, info,
priority, progress, _version).
"""
