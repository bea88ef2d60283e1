"""Models shipped as package data, addressable by short names (``demo-target``, ...)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from specframe.models.gguf import REGISTRY_MODELS, converted_dir, registry_gguf

ASSET_DIR = Path(__file__).resolve().parent.parent / "assets"  # package data: specframe/assets/
SHIPPED_MODELS = {
    "demo-target": ASSET_DIR / "demo-pair" / "target",
    "demo-draft": ASSET_DIR / "demo-pair" / "draft",
    "demo-eagle": ASSET_DIR / "demo-pair" / "eagle",
    "smollm2-135m-instruct-eagle3": ASSET_DIR / "smollm2-eagle3",
    "smollm2-135m-instruct-medusa": ASSET_DIR / "smollm2-medusa",
}


def resolve_model_path(name_or_path: str | os.PathLike) -> str:
    """Map a shipped name to its directory; check that local-looking paths exist.

    A ``.gguf`` file, or a registry model name (``smollm2-135m-instruct``), resolves to its
    converted checkpoint in the user cache (see :mod:`specframe.models.gguf`), converting on first use.

    Anything that is neither a shipped name nor an existing path and does not look like a path
    is passed on as a hub id (which fails offline with transformers' own message).
    """
    text = str(name_or_path)
    if text in REGISTRY_MODELS:
        return str(converted_dir(registry_gguf(text)))
    if text.lower().endswith(".gguf"):
        return str(converted_dir(text))
    if text in SHIPPED_MODELS:
        path = SHIPPED_MODELS[text]
        if not (path / "config.json").exists():
            raise FileNotFoundError(
                f"shipped model {text!r} is missing its files under {path}; "
                "reinstall specframe or run scripts/train_demo_pair.py"
            )
        return str(path)
    path = Path(text).expanduser()
    if path.exists():
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"model directory {path} has no config.json")
        return str(path)
    is_hub_id = re.fullmatch(r"[\w-][\w.-]*(/[\w.-]+)?", text) is not None
    if not is_hub_id:
        raise FileNotFoundError(
            f"model path {text!r} does not exist (shipped names: {', '.join([*SHIPPED_MODELS, *REGISTRY_MODELS])})"
        )
    return text
