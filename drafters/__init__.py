"""Built-in drafters, registered through the ``specframe`` entry point like any plugin."""

from specframe.plugins import hookimpl


@hookimpl
def register_drafters(register):
    """Register the built-in drafters."""
    from .model import ModelDrafter

    register(ModelDrafter)

    from .ngram import NgramDrafter

    register(NgramDrafter)
