"""``specframe load``: an open-loop serving benchmark (docs/load.md).

Requests arrive at a rate (seeded Poisson, or a file of arrival times), join a continuously
batched decoder up to ``max_live`` and wait beyond it; every arm serves the same arrivals. A
(rate, arm) cell is the unit of work, written atomically, so a rerun computes only missing cells.

Modules: ``settings`` (the [load] table and CLI overrides), ``arrivals``, ``serve`` (one cell),
``metrics`` (per-request figures and the cell summary), ``store`` (cells on disk),
``plots``, ``table`` (the markdown table of a summary) and ``run`` (all cells of a file).
"""
