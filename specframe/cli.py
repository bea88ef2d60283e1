"""The ``specframe`` command line (click). Plugins add commands through ``register_commands``."""

from __future__ import annotations

import click

from .options import describe_options
from .plugins import KINDS, get_registry


@click.group()
@click.version_option(package_name="specframe")
def cli() -> None:
    """specframe: tree-based speculative decoding with pluggable policies, drafters, verifiers."""


@cli.command("plugins")
def plugins_command() -> None:
    """List every registered policy, drafter and verifier with its origin and options."""
    from rich.console import Console
    from rich.table import Table

    reg = get_registry()
    console = Console()
    for kind in KINDS:
        table = Table(title=kind, show_lines=False)
        for col in ("name", "distribution", "version", "options (default)"):
            table.add_column(col, overflow="fold")
        for info in reg.infos(kind):
            opts = ", ".join(f"{n}: {t} = {d!r}" for n, t, d in describe_options(info.cls.Options)) or "-"
            table.add_row(info.name, info.dist, info.version, opts)
        console.print(table)


def main() -> None:
    """Entry point: load plugin commands, then run the click group."""
    get_registry().commands_hook()(cli=cli)
    cli()


if __name__ == "__main__":
    main()
