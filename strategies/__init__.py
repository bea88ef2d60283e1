"""Built-in tree policies, registered through the ``specframe`` entry point like any plugin."""

from specframe.plugins import hookimpl


@hookimpl
def register_tree_policies(register):
    """Register the built-in tree policies."""
    from .chain import ChainPolicy

    register(ChainPolicy)
