"""Export a commit's tensors to plain files other tools read.

>>> import ckptstore, ckptstore.export, torch, tempfile, os
>>> store = ckptstore.open("memory://export-doctest")
>>> _ = store.commit({"model": {"w": torch.ones(2, 3)}, "step": 5})
>>> out = os.path.join(tempfile.mkdtemp(), "model.safetensors")
>>> ckptstore.export.to_safetensors(store, "main", out, strip_prefix="model.").tensors
1

May import: the store facade (``ckptstore.store``) and everything below it.
"""

from .dcp_dir import to_dcp
from .hf_dir import to_hf_directory
from .result import ExportError, ExportResult
from .safetensors_file import SAFETENSORS_DTYPES, to_safetensors, write_safetensors

__all__ = ["SAFETENSORS_DTYPES", "ExportError", "ExportResult", "to_dcp", "to_hf_directory",
           "to_safetensors", "write_safetensors"]
