"""Prose and code from the installed packages' own descriptions (``*.dist-info/METADATA``).

Optional extra data for the SmolLM2 EAGLE-3 head (there is no dataset hub here): English text
with code snippets, as the target reads it. Written as ``{"text": ...}`` lines, one package each,
sorted by name so that the file is the same for the same installed set.

    python scripts/package_text.py --out scripts/.smollm2-eagle/data/packages.jsonl
"""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path

import click


@click.command()
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True)
@click.option("--min-chars", type=int, default=800, show_default=True)
@click.option("--max-chars", type=int, default=20000, show_default=True)
def main(out: Path, min_chars: int, max_chars: int) -> None:
    """Write the long descriptions of installed distributions."""
    texts = {}
    for dist in metadata.distributions():
        body = dist.metadata.get_payload() or dist.metadata.get("Description") or ""
        name = dist.metadata.get("Name") or ""
        if len(body) >= min_chars and name not in texts:
            texts[name] = body[:max_chars]
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as fh:
        for name in sorted(texts):
            fh.write(json.dumps({"text": texts[name]}) + "\n")
    click.echo(f"{len(texts)} package descriptions, {sum(map(len, texts.values())):,} characters -> {out}")


if __name__ == "__main__":
    main()
