"""The serving commands: ``specframe acceptance`` and ``specframe export`` (:mod:`.serving`) and
the acceptance probe replayed over a trace (:mod:`.probe`).

They read experiment files, run directories and traces, so they sit above the experiment
harness and replay (docs/architecture.md), while what they call lives in :mod:`specframe.serving`.
"""
