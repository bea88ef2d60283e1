"""Built-in tree policies, registered through the ``specframe`` entry point like any plugin."""

from specframe.plugins import hookimpl


@hookimpl
def register_tree_policies(register):
    """Register the built-in tree policies."""
    from .chain import ChainPolicy
    from .eagle import EaglePolicy
    from .opt_tree import OptTreePolicy
    from .sampled_tree import SampledTreePolicy
    from .sequoia import SequoiaPolicy
    from .static import StaticPolicy
    from .talon import TalonPolicy

    register(ChainPolicy)
    for policy in (TalonPolicy, EaglePolicy, StaticPolicy, OptTreePolicy, SequoiaPolicy):
        register(policy)
    register(SampledTreePolicy)

    from .swift import SwiftTreePolicy

    register(SwiftTreePolicy)


@hookimpl
def register_batch_allocators(register):
    """Register the built-in batch allocators (see specframe.decode.allocate)."""
    from .allocators import AcceptanceShare, EqualSplit, SharedBudget
    from .load_allocators import Goodput, Schedule, Threshold

    for allocator in (EqualSplit, SharedBudget, AcceptanceShare, Threshold, Schedule, Goodput):
        register(allocator)
