"""What the ``zarr.json`` documents of a commit's data say beyond an array's shape and codecs
(:func:`~ckptstore.format.arrays.array_metadata` writes those): the group's document and the
``ckptstore`` attributes of each array. The writer writes them; ``verify`` rebuilds them from
the manifest and compares."""

from __future__ import annotations

import json

__all__ = ["GROUP_METADATA", "PACKED_ATTRIBUTES", "array_attributes"]

#: the zarr.json of a commit's data folder (a zarr v3 group)
GROUP_METADATA = json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}}).encode()

#: the ``attributes`` of the zarr.json of the packed array of small tensors
PACKED_ATTRIBUTES: dict[str, dict[str, object]] = {"ckptstore": {"packed": True}}


def array_attributes(dtype: str, path: str, part: str | None = None
                     ) -> dict[str, dict[str, object]]:
    """The ``attributes`` of an array's zarr.json: the tensor's dtype and path, and for a part
    of a chain link its key (``verify`` rebuilds them from the manifest)."""
    own: dict[str, object] = {"torch_dtype": dtype, "path": path}
    return {"ckptstore": own if part is None else {**own, "part": part}}
