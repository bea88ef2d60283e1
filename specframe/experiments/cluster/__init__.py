"""Running past one process: the one Ray layer (:mod:`.rayrun`) that ``run``, ``record``,
``sweep`` and ``tune`` share, the watch that stops a job when a node is lost (:mod:`.nodes`),
the actors of a sharded job (:mod:`.pool`), and the sharded run of an experiment
(:mod:`.driver` on the driver, :mod:`.worker` in each Ray actor; ``record --ray`` is
``specframe.replay.sharded_record``). The device an answer ran on, which a run in one process
records too, is the harness's :mod:`specframe.experiments.device`."""
