"""The experiment harness: an experiment file in, answers, a summary, a report and plots out.

:mod:`~specframe.experiments.config` (the TOML schema, arms and checks), :mod:`~specframe.experiments.data`,
:mod:`~specframe.experiments.experiment` (arms x questions, resumable) with its rooms
:mod:`~specframe.experiments.loading`, :mod:`~specframe.experiments.runners`,
:mod:`~specframe.experiments.records` and :mod:`~specframe.experiments.batching`,
:mod:`~specframe.experiments.runs` (the run directory), :mod:`~specframe.experiments.metrics`,
:mod:`~specframe.experiments.accuracy`, :mod:`~specframe.experiments.report`,
:mod:`~specframe.experiments.plots`, :mod:`~specframe.experiments.explorer` (trees.html),
:mod:`~specframe.experiments.divergence`, the baselines
(:mod:`~specframe.experiments.baselines`, :mod:`~specframe.experiments.batch_baselines`),
:mod:`~specframe.experiments.runlock` and :mod:`~specframe.errors`. It builds on
the decode layer and reads engine arms through :mod:`specframe.serving`; replay and the CLI
build on it.
"""
