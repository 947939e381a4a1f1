"""Decoding of BytePlanes payloads (the layout is described in :mod:`ckptcodecs.planes`): every
field checked before anything is allocated; the items put together from the planes where they
are (a raw plane where the payload holds it, a coded one decoded into a scratch buffer the
thread reuses), into the whole array or only a block of its rows and columns."""

from __future__ import annotations

import struct
import threading

import numpy as np
from numcodecs import Zstd

from ._pkernels import ERR_CODE, REFERENCE, _PLANE as _KERNEL_PLANE
from ._backend import CHOICE, kernels, native
from ._buffers import check_int, out_array, payload
from ._bytegroup import merge2, merge4, merge8
from ._pdecode import huffman_decode
from ._pkernels import HUFFMAN, RAW, ZSTD
from .errors import CodecError

__all__ = ["planes_decode", "planes_decode_region"]

VERSION = 1
#: the layout of a buffer that ends in part of an item: its last bytes follow the planes, raw
VERSION_TAIL = 2
_HEAD = struct.Struct("<BBBBQI")
_PLANE = struct.Struct("<BQ")
assert _PLANE.size == _KERNEL_PLANE
_ITEMSIZES = (1, 2, 4, 8)
#: BytePlanes' Huffman coder and plane layout (encoder's kernels too: planes.py calls them from
#: here): the C twins of the numba kernels (or those, under CKPTCODECS_KERNELS=numba)
_K = kernels("planes", huffman_decode=huffman_decode, **REFERENCE)
_ZSTD = Zstd(level=1)
#: zstd expands at most ~32768x (an RLE block of 128 KiB in 4 bytes)
_ZSTD_MAX_RATIO = 1 << 15


def _check_config(itemsize: int, block: int) -> None:
    """Refuse an itemsize or block no payload can have (wrong types: CodecTypeError)."""
    itemsize, block = check_int("itemsize", itemsize), check_int("block", block)
    if itemsize not in _ITEMSIZES:
        raise CodecError(f"itemsize must be one of {_ITEMSIZES}, not {itemsize!r}")
    if not 1024 <= block <= 1 << 24:
        raise CodecError(f"block must be between 1024 and 2**24 bytes, not {block!r}")


def planes_decode(buf, out: np.ndarray | None = None) -> np.ndarray:
    """Decode a BytePlanes payload to uint8 (into ``out``'s bytes when given); raise
    :class:`CodecError` when it is malformed."""
    if _INTO is not None and isinstance(out, np.ndarray):  # the store's call: one C call
        dst = _flat_bytes(out)
        if dst is not None and _into(_bytes(buf), dst):
            return dst
    b, itemsize, rotate, n, block, spans, tail = _parse(buf)
    whole = n * itemsize
    if out is None:
        dst = np.empty(whole + tail.size, np.uint8)
        if _INTO is not None and _into(b, dst):
            return dst
    else:
        dst = out_array(out, whole + tail.size, "BytePlanes")
        if not (dst.flags.c_contiguous or dst.flags.f_contiguous):
            raise CodecError("BytePlanes decodes into a contiguous out buffer only")
        dst = dst.reshape(-1, order="A").view(np.uint8)
    if itemsize == 1:
        _decode_plane(*spans[0], b, block, dst, 0)
    else:
        _merge(_sources(b, itemsize, n, block, spans), itemsize, rotate,
               dst[:whole].view(_UINT[itemsize]), 1, n, n, 0, n)
    dst[whole:] = tail
    return dst


#: the whole decode of the layouts the store writes (raw and Huffman planes of 2-, 4- or 8-byte
#: items) in one C call, block by block (planes_whole.c), where the kernels are C; it leaves
#: every other payload, and every malformed one, to the steps of planes_decode
_INTO = native().planes_decode_into if CHOICE == "c" else None


def _into(b, dst: np.ndarray) -> bool:
    """Whether ``_INTO`` decoded payload ``b`` into ``dst`` (with this thread's scratch: a
    block of each coded plane, 1 MiB covers the store's chunks)."""
    status = _INTO(b, dst, _scratch(0))
    if status > 1:  # a larger block than the scratch holds
        status = _INTO(b, dst, _scratch(status))
    return status == 0


def _bytes(buf):
    """``buf`` itself when it is bytes or a flat memoryview of bytes (what the store hands
    over: no numpy view to make), else :func:`payload`'s view of it."""
    if type(buf) is bytes or (type(buf) is memoryview and buf.itemsize == 1
                              and buf.ndim == 1 and buf.c_contiguous):
        return buf
    return payload(buf)


def _flat_bytes(out: np.ndarray) -> np.ndarray | None:
    """``out``'s bytes as a flat uint8 view when it is a writeable contiguous array of numbers
    (else None: planes_decode's checks say what is wrong with it)."""
    if out.dtype.hasobject or not out.flags.writeable or not (
            out.flags.c_contiguous or out.flags.f_contiguous):
        return None
    return out.reshape(-1, order="A").view(np.uint8)


def planes_decode_region(buf, shape: tuple[int, ...], rows: tuple[int, int],
                         cols: tuple[int, int], out: np.ndarray) -> None:
    """Decode into ``out`` only the block ``[rows[0]:rows[1], cols[0]:cols[1]]`` (whole in every
    later dimension) of the payload of an array of ``shape``: the planes are decoded, and only
    the block's items are put together, straight into ``out`` (of the block's shape and
    ``itemsize``-byte items, any strides; 1-d arrays take ``cols=(0, 1)``)."""
    b, itemsize, rotate, n, block, spans, tail = _parse(buf)
    if tail.size:
        raise CodecError(f"BytePlanes payload of {n * itemsize + tail.size} bytes is not a "
                         f"whole number of {itemsize}-byte items: decode it whole")
    shape = tuple(int(d) for d in shape) or (1,)
    nrows, ncols = shape[0], shape[1] if len(shape) > 1 else 1
    depth = int(np.prod(shape[2:], dtype=np.int64))
    h, length = rows[1] - rows[0], (cols[1] - cols[0]) * depth
    if nrows * ncols * depth != n:
        raise CodecError(f"BytePlanes payload holds {n} items, not an array of shape {shape}")
    if not (0 <= rows[0] <= rows[1] <= nrows and 0 <= cols[0] <= cols[1] <= ncols):
        raise ValueError(f"block rows {rows}, columns {cols} outside an array of shape {shape}")
    if out.dtype.itemsize != itemsize:
        raise CodecError(f"BytePlanes payload holds {itemsize}-byte items, the block "
                         f"{out.dtype.itemsize}-byte ones")
    if not out.flags.writeable or out.size != h * length:
        raise ValueError(f"out must be a writable block of {h * length} items")
    sources = _sources(b, itemsize, n, block, spans)
    src, src_pitch = (rows[0] * ncols + cols[0]) * depth, ncols * depth
    if itemsize == 1:  # one plane: its block, by numpy (bits as they are, whatever the dtype)
        whole = sources[0].reshape(nrows, ncols, depth)
        out.view(np.uint8)[...] = whole[rows[0]:rows[1], cols[0]:cols[1]].reshape(out.shape)
        return
    flat, pitch = _run_view(out.view(_UINT[itemsize]), h, length)
    tmp = None
    if flat is None:  # runs that are not one block of memory each: through a buffer
        tmp = np.empty((h, length), _UINT[itemsize])
        flat, pitch = tmp.reshape(-1), length
    _merge(sources, itemsize, rotate, flat, h, length, pitch, src, src_pitch)
    if tmp is not None:
        out.view(_UINT[itemsize])[...] = tmp.reshape(out.shape)


def _run_view(dst: np.ndarray, h: int, length: int) -> tuple[np.ndarray | None, int]:
    """``dst`` (``h * length`` items) as one 1-d contiguous array spanning its memory and the
    item pitch of its runs of ``length`` items, or ``(None, 0)`` when its runs are not
    contiguous."""
    if h == 0 or length == 0:
        return np.zeros(0, dst.dtype), 0
    runs = dst.view()
    try:
        runs.shape = (h, length)  # a view of any strides, never a copy
    except AttributeError:
        return None, 0
    step, item = runs.strides[0], dst.itemsize
    if runs.strides[1] != item and length > 1 or step % item or step < 0 or (
            h > 1 and step < length * item):
        return None, 0
    pitch = step // item if h > 1 else length
    span = (h - 1) * pitch + length
    return np.lib.stride_tricks.as_strided(runs, (span,), (item,), writeable=True), pitch


_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_SCRATCH = threading.local()
#: coded planes of up to this many bytes a chunk decode into a buffer each thread keeps and reuses
#: (no page faults a chunk; the store's 4 MiB chunks fit); larger ones into a fresh buffer
_SCRATCH_MAX = 8 << 20


def _parse(buf) -> tuple[np.ndarray, int, bool, int, int, list[tuple[int, int, int]],
                         np.ndarray]:
    """The payload's bytes, itemsize, rotation, items, Huffman block, plane spans and tail (the
    raw last bytes of a buffer that ends in part of an item), every field checked before
    anything is allocated."""
    b = payload(buf)
    if b.size < _HEAD.size:
        raise CodecError(f"BytePlanes payload truncated: {b.size} bytes, header needs "
                         f"{_HEAD.size}")
    version, itemsize, flags, _, nbytes, block = _HEAD.unpack_from(b)
    if version not in (VERSION, VERSION_TAIL):
        raise CodecError(f"BytePlanes format version {version} is not supported (expected "
                         f"{VERSION} or {VERSION_TAIL}); was it written by a newer ckptcodecs?")
    _check_config(itemsize, block)
    n, tail = divmod(nbytes, itemsize)
    if bool(tail) != (version == VERSION_TAIL) or flags > 1:
        raise CodecError(f"BytePlanes header corrupted: {nbytes} bytes of {itemsize}-byte "
                         f"items in format version {version}, flags {flags}")
    spans = _plane_spans(b, itemsize, n, block)
    pos = spans[-1][2] if spans else _HEAD.size
    if pos + tail != b.size:
        raise CodecError(f"BytePlanes payload holds {b.size - pos} bytes after its planes, "
                         f"expected {tail}")
    return b, itemsize, bool(flags & 1), n, block, spans, b[pos:]


def _sources(b: np.ndarray, itemsize: int, n: int, block: int,
             spans: list[tuple[int, int, int]]) -> list[np.ndarray]:
    """Each plane's ``n`` bytes: a raw plane where the payload holds it, a coded one decoded
    into this thread's scratch buffer (valid until the thread's next decode)."""
    coded = sum(method != RAW for method, _, _ in spans)
    scratch = _scratch(coded * n) if coded else None
    out, k = [], 0
    for p, (method, start, stop) in enumerate(spans):
        if method == RAW:
            if stop - start != n:
                raise CodecError(f"BytePlanes raw plane {p} holds {stop - start} bytes, "
                                 f"expected {n}")
            out.append(b[start:stop])
        else:
            plane = scratch[k * n:(k + 1) * n]
            _decode_plane(method, start, stop, b, block, plane, p)
            out.append(plane)
            k += 1
    return out


def _scratch(nbytes: int) -> np.ndarray:
    if nbytes > _SCRATCH_MAX:
        return np.empty(nbytes, np.uint8)
    buf = getattr(_SCRATCH, "buf", None)
    if buf is None or buf.size < nbytes:
        buf = _SCRATCH.buf = np.empty(max(nbytes, 1 << 20), np.uint8)
    return buf


def _merge(sources: list[np.ndarray], itemsize: int, rotate: bool, *runs: int) -> None:
    """Put the planes' items together into ``runs`` (see :func:`merge2`)."""
    if itemsize == 2:
        merge2(sources[0], sources[1], rotate, *runs)
    elif itemsize == 4:
        merge4(*sources, rotate, *runs)
    else:
        merge8(*sources, rotate, *runs)


def _plane_spans(b: np.ndarray, itemsize: int, n: int,
                 block: int) -> list[tuple[int, int, int]]:
    """(method, start, stop) of each plane's payload; refuses a plane that cannot decode to ``n``
    bytes (a corrupted size must not make the decoder allocate without bound)."""
    pos, spans = _HEAD.size, []
    for p in range(itemsize):
        if pos + _PLANE.size > b.size:
            raise CodecError(f"BytePlanes payload truncated before plane {p}")
        method, size = _PLANE.unpack_from(b, pos)
        pos += _PLANE.size
        if size > b.size - pos:
            raise CodecError(f"BytePlanes plane {p} claims {size} bytes, "
                             f"{b.size - pos} remain")
        most = {RAW: size, HUFFMAN: (size // 2) * block, ZSTD: _ZSTD_MAX_RATIO * size}.get(method)
        if most is None:
            raise CodecError(f"BytePlanes plane {p} has unknown method {method}")
        if n > most:
            raise CodecError(f"BytePlanes header corrupted: plane {p} of {size} bytes cannot "
                             f"decode to {n} bytes")
        spans.append((method, pos, pos + size))
        pos += size
    return spans


def _decode_plane(method: int, start: int, stop: int, b: np.ndarray, block: int,
                  plane: np.ndarray, p: int) -> None:
    """Decode plane ``p`` (``b[start:stop]``, coded with ``method``) into ``plane``."""
    payload = b[start:stop]
    if method == RAW:
        if payload.size != plane.size:
            raise CodecError(f"BytePlanes raw plane {p} holds {payload.size} bytes, expected "
                             f"{plane.size}")
        plane[...] = payload
    elif method == HUFFMAN:
        used = _K.huffman_decode(payload, block, plane)
        if used != payload.size:
            raise CodecError(f"BytePlanes Huffman plane {p} is corrupted "
                             f"({'bad code' if used == ERR_CODE else 'truncated'})")
    elif method == ZSTD:
        if _zstd_content_size(payload) != plane.size:
            raise CodecError(f"BytePlanes zstd plane {p} is not one zstd frame of "
                             f"{plane.size} bytes")
        try:
            _ZSTD.decode(payload, out=plane)
        except Exception as e:  # numcodecs raises RuntimeError / ValueError on bad frames
            raise CodecError(f"BytePlanes zstd plane {p} does not decode: {e}") from e


def _zstd_content_size(frame: np.ndarray) -> int:
    """The content size a zstd frame header declares (-1 when absent or not a frame)."""
    if frame.size < 6 or bytes(frame[:4]) != b"\x28\xb5\x2f\xfd":
        return -1
    fhd = int(frame[4])
    single, fcs_flag, did_flag = (fhd >> 5) & 1, fhd >> 6, fhd & 3
    pos = 5 + (0 if single else 1) + (0, 1, 2, 4)[did_flag]
    width = (1 if single else 0, 2, 4, 8)[fcs_flag]
    if width == 0 or pos + width > frame.size:
        return -1
    size = int.from_bytes(bytes(frame[pos:pos + width]), "little")
    return size + 256 if width == 2 else size
