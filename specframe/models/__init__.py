"""The models layer: the target adapter and everything that loads or speeds up a model.

:mod:`~specframe.models.target` (``TargetModel``: tree attention over a transformers model),
:mod:`~specframe.models.attention`, :mod:`~specframe.models.gguf` and
:mod:`~specframe.models.assets` (shipped and registry models),
:mod:`~specframe.models.packed_linear` with :mod:`~specframe.models.native_gemm` (the CPU
kernel), :mod:`~specframe.models.cache_keys`, :mod:`~specframe.models.synthetic` and
:mod:`~specframe.models.pairs`. The lowest layer: it imports nothing else of specframe.
"""
