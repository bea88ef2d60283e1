"""Built-in verifiers, registered through the ``specframe`` entry point like any plugin."""

from specframe.plugins import hookimpl


@hookimpl
def register_verifiers(register):
    """Register the built-in verifiers."""
    from .greedy import GreedyVerifier
    from .sampling import SamplingVerifier

    register(GreedyVerifier)
    register(SamplingVerifier)
