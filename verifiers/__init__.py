"""Built-in verifiers, registered through the ``specframe`` entry point like any plugin."""

from specframe.plugins import hookimpl


@hookimpl
def register_verifiers(register):
    """Register the built-in verifiers."""
    from .greedy import GreedyVerifier
    from .margin import MarginVerifier
    from .sampling import SamplingVerifier
    from .traversal import TraversalVerifier
    from .typical import TypicalVerifier

    register(GreedyVerifier)
    register(SamplingVerifier)
    register(TraversalVerifier)
    register(TypicalVerifier)
    register(MarginVerifier)
