"""benchmarks/cold_ops.py on the shipped tiny pair: every operation timed in all three settings,
and the Python stand-in does what a TALON layer does (it is timed, so it must be the real work)."""

from benchmark_scripts import benchmark_script


def _script():
    return benchmark_script("cold_ops")


def test_every_operation_is_timed_warm_after_a_forward_and_after_idling():
    cold_ops = _script()
    rows = cold_ops.measure("tiny", reps=1, threads=1)
    assert [name for name, *_ in rows] == list(cold_ops.operations(8, 16))
    assert all(len(times) == 3 and all(t > 0 for t in times) for _, *times in rows)


def test_the_bookkeeping_stand_in_gates_and_ranks_like_a_talon_layer():
    cold_ops = _script()
    values, scores = [0.0, -1.0, -10.0], [0.0, -0.5]
    # Candidates (parent-major): 0, -1, -10, -0.5, -1.5, -10.5; the gate at log(0.03) = -3.5 drops
    # the -10s, and the six best of the rest, by score then index, come back in index order.
    assert cold_ops.bookkeeping(values, scores) == [0, 1, 3, 4]
