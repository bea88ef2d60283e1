"""The decode layer: the one decode step and what it runs over.

:mod:`~specframe.decode.engine` (``SpecDecoder`` and its step), :mod:`~specframe.decode.batch`
(rows, allocators' budgets, continuous batching), the KV layouts the step runs over
(:mod:`~specframe.decode.kv_single`, :mod:`~specframe.decode.kv_padded`,
:mod:`~specframe.decode.kv_flat`), lockstep drafting (:mod:`~specframe.decode.lockstep`),
batch allocators (:mod:`~specframe.decode.allocate`), the step's one host read
(:mod:`~specframe.decode.read`), the tree contract it enforces
(:mod:`~specframe.decode.contract`) and the batch cost curves
(:mod:`~specframe.decode.batch_curves`). It imports the core, the models and sizing, never the
experiment harness.
"""
