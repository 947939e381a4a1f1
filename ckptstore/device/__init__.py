"""Device: GPU kernels as torch ops -- quantization (``quant``), checkout decoding (``decode``),
changed rows (``rows``), bit packing (``bits``), the CUDA stream of each I/O thread
(``streams``) and the room rule of device buffers (``memory``); bit-identical to the host's.
They take tensors and parameters: where an item is placed is the commit's choice
(:mod:`ckptstore.commit.placement`).

May import: state, history, format, chunkcodec, storage and the top-level helpers (errors, limits, info,
priority, progress, _version).
"""
