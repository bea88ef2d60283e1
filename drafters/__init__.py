"""Built-in drafters, registered through the ``specframe`` entry point like any plugin."""

from specframe.plugins import hookimpl


@hookimpl
def register_drafters(register):
    """Register the built-in drafters."""
    from .model import ModelDrafter

    register(ModelDrafter)

    from .eagle import EagleDrafter
    from .eagle3 import Eagle3Drafter

    register(EagleDrafter)
    register(Eagle3Drafter)

    from .ngram import NgramDrafter

    register(NgramDrafter)

    from .suffix import SuffixDrafter

    register(SuffixDrafter)

    from .recycle import RecycleDrafter
    from .sam import SamDrafter

    register(RecycleDrafter)
    register(SamDrafter)

    from .hybrid import HybridDrafter

    register(HybridDrafter)

    from .medusa import MedusaDrafter

    register(MedusaDrafter)

    from .lookahead import LookaheadDrafter

    register(LookaheadDrafter)

    from .layerskip import LayerSkipDrafter

    register(LayerSkipDrafter)

    from .hydra import HydraDrafter

    register(HydraDrafter)


@hookimpl
def register_commands(cli):
    """Add ``train-eagle``, ``train-medusa`` and ``train-hydra`` (head trainers) and ``datastore``
    (REST and SAM datastores)."""
    from .datastore import datastore_command
    from .eagle_train import train_eagle_command
    from .hydra_train import train_hydra_command
    from .medusa_train import train_medusa_command

    cli.add_command(train_eagle_command)
    cli.add_command(train_medusa_command)
    cli.add_command(train_hydra_command)
    cli.add_command(datastore_command())
