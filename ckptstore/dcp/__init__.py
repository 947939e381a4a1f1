"""torch.distributed.checkpoint (DCP) storage for a ckptstore: sharded commits and checkouts.

``dcp.save(state_dict, storage_writer=StorageWriter(store))`` commits into a store and
``dcp.load(state_dict, storage_reader=StorageReader(store, "main"))`` checks out of it. DCP does
the planning (dedup of replicated tensors, DTensor and ShardedTensor chunks, resharding on
load); ckptstore does the storage:

- every rank persists the tensors its plan gives it (:func:`ckptstore.dcp.shards.write_part`: the
  store's policy per shard -- quantized, incremental, delta -- and its own packed array);
- the coordinator's ``finish`` writes the manifest and only then moves the ref: a rank that
  fails makes DCP fail the save before ``finish``, leaving the ref where it was;
- a load reads, on each rank, only the chunks that overlap what the rank asks for.

No pickle: DCP's planners ``torch.save`` non-tensor values (step counters, param_groups) and read
them back with the unrestricted unpickler (``weights_only`` off). The writer stores such values as plain msgpack in
the manifest's tree (as ``Store.commit`` stores plain leaves); the reader hands DCP only bytes it
made itself from those plain values, after ``torch.load(weights_only=True)`` accepted them.

May import: commit, checkout and everything below them, and the top-level helpers (errors, limits, info,
priority, progress, _version).
"""

from .reader import StorageReader
from .writer import StorageWriter

__all__ = ["StorageReader", "StorageWriter"]
