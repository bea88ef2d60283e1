"""pluggy hook specifications of specframe (project name ``"specframe"``).

A plugin package exposes a module under the ``specframe`` entry-point group and implements any
of these hooks with ``@specframe.hookimpl``. Built-ins use exactly the same path.
"""

from __future__ import annotations

from typing import Any, Callable

import pluggy

hookspec = pluggy.HookspecMarker("specframe")


@hookspec
def register_tree_policies(register: Callable[[type], None]) -> None:
    """Register TreePolicy subclasses: call ``register(PolicyClass)`` once per class."""


@hookspec
def register_drafters(register: Callable[[type], None]) -> None:
    """Register Drafter subclasses: call ``register(DrafterClass)`` once per class."""


@hookspec
def register_verifiers(register: Callable[[type], None]) -> None:
    """Register Verifier subclasses: call ``register(VerifierClass)`` once per class."""


@hookspec
def register_commands(cli: Any) -> None:
    """Add subcommands to the ``specframe`` command line.

    :param cli: the ``specframe`` :class:`click.Group`; call ``cli.add_command(command)``.

    Called once by ``specframe.cli.main`` before the group runs. The built-in drafters add
    ``train-eagle`` this way: the core never imports a command by name.
    """


@hookspec
def register_batch_allocators(register: Callable[[type], None]) -> None:
    """Register :class:`specframe.decode.allocate.BatchAllocator` subclasses (how batched decoding
    splits one node budget across the live sequences of a step): ``register(AllocatorClass)``."""
