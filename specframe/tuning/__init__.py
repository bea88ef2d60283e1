"""``specframe tune``: search every plugin's declared options for each arm, on a replayed trace.

Layer: above replay (it replays arms over a trace) and below the CLI. Modules, one job each:

* :mod:`~specframe.tuning.space`: an arm's search space (its plugins' declared spaces, keyed
  ``drafter.X`` / ``policy.X`` / ``verifier.X`` as sweeps key them) and the arm a point makes;
* :mod:`~specframe.tuning.evaluate`: replays one arm over some questions, scoring tau and the
  projected speedup, reporting partial scores to a pruner;
* :mod:`~specframe.tuning.study`: the Optuna studies (journal file, fingerprint, resume,
  workers);
* :mod:`~specframe.tuning.outputs`: best.toml, the confirmation questions and tune.json;
* :mod:`~specframe.tuning.report`: report.md and its plots;
* :mod:`~specframe.tuning.cli`: the command (progress, summary, ``--confirm``).
"""
