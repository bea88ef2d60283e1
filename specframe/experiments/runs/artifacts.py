"""What the local files an arm's options name hold, so that answers are tied to them.

An option such as the ``suffix`` drafter's ``datastore = "DIR"`` or a head's ``path`` names
files whose content decides the answers; the option's text alone would let a rebuilt datastore
or a retrained head reuse answers of the old one. :func:`arm_artifacts` maps every option value
that names an existing file or folder to a digest of its content; run.json keeps it in the
arm's definition, so a changed file makes the arm "changed" (refused unless ``--fresh``).

Digest: SHA-1 over the folder's files in name order (relative name, size and content). A file
over :data:`WHOLE_BYTES` is read at its first and last MiB only, with its size: weights do not
change in the middle alone, and hashing a multi-GB checkpoint on every run would cost more
than the run. A shipped name (``smollm2-135m-instruct-medusa``) is hashed as the folder it names.

The models themselves are tied the same way: :func:`model_files` digests the folder each
``[target]`` / ``[models.*]`` name resolves to here (a local path, a shipped name, a registry
model's converted checkpoint), and the run's fingerprint keeps it, so answers of other weights
under the same name are never reused. ``random:`` and ``perturbed:`` models are decided by
their options (already in the fingerprint); a hub id not on disk has nothing to hash.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Iterator

#: Files up to this size are hashed whole.
WHOLE_BYTES = 64 << 20
EDGE = 1 << 20


def file_digest(path: Path, into: Any) -> None:
    """Feed ``path``'s size and content (or its first and last MiB when large) to ``into``."""
    size = path.stat().st_size
    into.update(str(size).encode())
    with path.open("rb") as fh:
        if size <= WHOLE_BYTES:
            for block in iter(lambda: fh.read(EDGE), b""):
                into.update(block)
        else:
            into.update(fh.read(EDGE))
            fh.seek(size - EDGE)
            into.update(fh.read(EDGE))


def digest(path: str | Path) -> str:
    """The content digest of a file or folder (16 hex digits)."""
    path = Path(path)
    h = hashlib.sha1()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for f in files:
        h.update(str(f.relative_to(path) if f != path else f.name).encode())
        file_digest(f, h)
    return h.hexdigest()[:16]


def _strings(value: Any, at: str) -> Iterator[tuple[str, str]]:
    """``(where, text)`` of every string inside an option value (lists and tables included)."""
    if isinstance(value, str):
        yield at, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(v, f"{at}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _strings(v, f"{at}[{i}]")


def arm_artifacts(options: dict[str, dict]) -> dict[str, str]:
    """``{"drafter.datastore": digest, ...}`` for the option values (by scope: ``{"drafter":
    {...}, ...}``) that name an existing local file or folder, or a shipped model."""
    from specframe.models.assets import SHIPPED_MODELS

    out = {}
    for scope, values in options.items():
        for where, text in _strings(values or {}, scope):
            if text in SHIPPED_MODELS and SHIPPED_MODELS[text].exists():
                out[where] = digest(SHIPPED_MODELS[text])
            elif text and ("/" in text or text.startswith(".")) and Path(text).exists():
                out[where] = digest(text)
    return out


def local_model_dir(name: str) -> Path | None:
    """The local folder (or file) a model or tokenizer name resolves to here; None for a hub id
    that is not on disk."""
    from specframe.models.assets import resolve_model_path

    try:
        path = Path(resolve_model_path(name))
    except (FileNotFoundError, OSError):
        return None
    return path if path.exists() else None


def model_files(specs: dict[str, Any]) -> dict[str, str]:
    """``{"target": digest, "target.tokenizer": digest, "draft": digest, ...}``: the content of
    the local folders the models (:class:`~specframe.experiments.config.ModelSpec`, by alias)
    and their tokenizers resolve to (the names :meth:`ModelSpec.file_names` gives)."""
    out = {}
    for alias, spec in specs.items():
        for part, name in spec.file_names().items():
            path = local_model_dir(name)
            if path is not None:
                out[f"{alias}.{part}" if part else alias] = digest(path)
    return out
