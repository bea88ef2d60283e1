"""``specframe bench spec-bench``: Spec-Bench's leaderboard (hemingkx/Spec-Bench) from one command.

The benchmark is a ``specframe run`` with a layout (:mod:`.layout`): the experiment's answers
live in ``DIR/run`` (resumable and checked against the experiment exactly as ``run``'s), and the
leaderboard is recomputed from them on every call (:mod:`.leaderboard`), so it is never stale.
:mod:`.tasks` maps question categories to Spec-Bench's six tasks, :mod:`.table` writes the
leaderboard's table, :mod:`.plots` its figure and :mod:`.command` ties them together.
"""
