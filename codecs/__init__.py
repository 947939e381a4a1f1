"""ckptcodecs: compression codecs for checkpoints (installed from the ``codecs/`` folder).

Depends on numpy, numcodecs, numba and zarr only -- never on ``ckptstore``.
"""
