"""The tokenizer of any model specframe loads, by the same names as :func:`load_causal_lm`."""

from __future__ import annotations

import os
from typing import Any

from specframe.models.assets import resolve_model_path


class TokenizerNotFoundError(FileNotFoundError):
    """The model's folder holds no tokenizer files (a head, or a checkpoint saved without one)."""


def load_tokenizer(name_or_path: str | os.PathLike) -> Any:
    """The transformers tokenizer of ``name_or_path``: a shipped name (``demo-target``,
    ``smollm2-135m-instruct``), a ``.gguf`` file (its converted folder, converting on first
    use), a local checkpoint folder or a hub id -- every name
    :func:`specframe.models.target.load_causal_lm` accepts.

    Raises :class:`TokenizerNotFoundError` naming the folder when it holds no tokenizer, and
    FileNotFoundError (from the name's resolution) when the model itself does not exist.
    """
    from transformers import AutoTokenizer

    path = resolve_model_path(name_or_path)
    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as err:
        if os.path.isdir(path):
            raise TokenizerNotFoundError(
                f"{name_or_path!r} ({path}) holds no tokenizer files (tokenizer.json, tokenizer_config.json, "
                f"or a vocabulary); load the tokenizer of the model it was trained for") from err
        raise
