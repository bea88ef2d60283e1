"""Checks that a target and a draft model can work as a pair (one shared tokenizer).

A draft proposes token ids and the target verifies them, so both must map the same ids to the
same strings: equal vocabulary sizes are not enough (two BPEs of the same size disagree on
almost every id). This compares the tokenizers saved beside the two models.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from specframe.models.assets import resolve_model_path


def _local_dir(path: str | os.PathLike) -> Path | None:
    """The model's local directory (shipped names resolved), or None for a hub id."""
    resolved = Path(resolve_model_path(path))
    return resolved if resolved.is_dir() else None


def load_tokenizer_spec(model_dir: Path) -> dict[str, Any] | None:
    """Vocabulary (token -> id, added tokens included) and BPE merges saved in ``model_dir``.

    Reads ``tokenizer.json`` when present (fast tokenizers), else ``vocab.json`` + ``merges.txt``
    (slow BPE), else asks ``AutoTokenizer`` for ``get_vocab()``. None when no tokenizer is saved.
    """
    tok_json = model_dir / "tokenizer.json"
    if tok_json.exists():
        data = json.loads(tok_json.read_text(encoding="utf-8"))
        model = data.get("model") or {}
        vocab = dict(model.get("vocab") or {}) if isinstance(model.get("vocab"), dict) else {}
        if isinstance(model.get("vocab"), list):  # Unigram: [[piece, score], ...]
            vocab = {piece: i for i, (piece, _score) in enumerate(model["vocab"])}
        for added in data.get("added_tokens") or []:
            vocab[added["content"]] = int(added["id"])
        merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
        return {"vocab": vocab, "merges": merges, "source": str(tok_json)}
    vocab_json = model_dir / "vocab.json"
    if vocab_json.exists():
        merges_txt = model_dir / "merges.txt"
        merges = []
        if merges_txt.exists():
            merges = [l for l in merges_txt.read_text(encoding="utf-8").splitlines() if l and not l.startswith("#version")]
        return {"vocab": json.loads(vocab_json.read_text(encoding="utf-8")), "merges": merges, "source": str(vocab_json)}
    if not any(model_dir.glob("tokenizer*")) and not any(model_dir.glob("*.model")):
        return None
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    return {"vocab": dict(tok.get_vocab()), "merges": [], "source": str(model_dir)}


def tokenizer_difference(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    """Human-readable first difference between two tokenizer specs, or None when they agree."""
    va, vb = a["vocab"], b["vocab"]
    if len(va) != len(vb):
        return f"vocabulary sizes differ ({len(va)} vs {len(vb)})"
    if va != vb:
        id_a = {i: t for t, i in va.items()}
        id_b = {i: t for t, i in vb.items()}
        for i in sorted(set(id_a) | set(id_b)):
            if id_a.get(i) != id_b.get(i):
                return f"token id {i} is {id_a.get(i)!r} vs {id_b.get(i)!r}"
        return "vocabularies differ"
    ma, mb = a["merges"], b["merges"]
    if ma != mb:
        if len(ma) != len(mb):
            return f"BPE merge lists differ in length ({len(ma)} vs {len(mb)})"
        i = next(i for i, (x, y) in enumerate(zip(ma, mb)) if x != y)
        return f"BPE merge {i} is {ma[i]!r} vs {mb[i]!r}"
    return None


def check_same_tokenizer(target_path: str | os.PathLike, draft_path: str | os.PathLike) -> bool:
    """Raise ValueError naming both paths when the two models' saved tokenizers differ.

    Accepts local paths and shipped names (``demo-target``). Returns True when both tokenizers
    were found and agree, False when there was nothing to compare (a hub id, or a directory
    without tokenizer files); a path that does not exist raises FileNotFoundError.
    """
    dirs = [_local_dir(target_path), _local_dir(draft_path)]
    if dirs[0] is None or dirs[1] is None:
        return False
    specs = [load_tokenizer_spec(d) for d in dirs]
    if specs[0] is None or specs[1] is None:
        return False
    diff = tokenizer_difference(specs[0], specs[1])
    if diff is not None:
        raise ValueError(
            f"target {str(target_path)!r} ({dirs[0]}) and draft {str(draft_path)!r} ({dirs[1]}) do not "
            f"share a tokenizer: {diff}. A draft must use exactly the target's tokenizer."
        )
    return True


def model_source(model: Any) -> str | None:
    """The local directory a transformers model was loaded from, or None (built in memory, hub id)."""
    name = getattr(model, "name_or_path", None) or getattr(getattr(model, "config", None), "_name_or_path", None)
    if not name or not Path(str(name)).expanduser().is_dir():
        return None
    return str(name)
