"""SAM-Decoding's static automaton over a corpus, built once and loaded by the ``sam`` drafter.

``specframe datastore build CORPUS... --kind sam --tokenizer MODEL --out DIR`` tokenizes the corpus
as a REST datastore does (:func:`specframe.drafters.datastore.documents`) and writes:

- ``sam.json``: the tokenizer, vocabulary size, separator, token, document and state counts;
- ``sam.npz``: the automaton (:class:`~specframe.drafters.sam_automaton.FrozenAutomaton`): per state
  its suffix link, length, first end position and end-position count, its transitions in CSR form
  (offsets, tokens, targets), and the corpus string.

The corpus string is the documents one after another, each followed by the separator unless it
already ends with it, as the authors' ``StaticSAM.add_batch_tokens`` appends ``eos``: the
tokenizer's end-of-sequence token, or -1 where it has none (a draft stops at a -1, and no
generated token is negative, so no match crosses one).

Size: a suffix automaton has at most ``2L - 1`` states and ``3L - 4`` transitions for ``L`` tokens;
about 40 bytes per corpus token on disk, several times that once loaded into Python lists (the
lookup walks them token by token, where a numpy scalar read per step would cost more).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from .datastore import DatastoreError
from .sam_automaton import Automaton, Cursor, FrozenAutomaton, add_tokens, freeze

FORMAT = 1
#: The separator where the tokenizer has no end-of-sequence token.
NO_EOS = -1
#: The arrays of ``sam.npz``, in :class:`FrozenAutomaton`'s field order.
ARRAYS = ("link", "length", "min_endpos", "count", "offsets", "edge_tokens", "edge_targets", "tokens")


def build_automaton(documents: Iterable[list[int]], separator: int) -> FrozenAutomaton:
    """The static automaton of ``documents``, each followed by ``separator`` unless it ends with it."""
    sam, cursor = Automaton(), Cursor()
    for doc in documents:
        if not doc:
            continue
        add_tokens(sam, cursor, list(doc) if doc[-1] == separator else [*doc, separator])
    return freeze(sam)


def build(texts: Iterable[str], encode: Callable[[str], list[int]], out: str | Path, tokenizer: str,
          vocab_size: int, separator: int = NO_EOS, progress: Callable[[int], None] | None = None) -> dict:
    """Tokenize ``texts`` with ``encode``, build their automaton and write it to ``out``; returns
    the metadata (``sam.json``'s, plus the build time)."""
    start = time.perf_counter()
    docs, count = [], 0
    for text in texts:
        ids = [int(t) for t in encode(text)]
        if ids:
            if max(ids) >= vocab_size:
                raise DatastoreError(f"a token id is >= the tokenizer's vocabulary size {vocab_size}")
            docs.append(ids)
            count += len(ids)
            if progress is not None:
                progress(count)
    if not docs:
        raise DatastoreError("the corpus holds no text: pass text, JSONL or folders of them")
    sam = build_automaton(docs, separator)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    arrays = {name: np.asarray(getattr(sam, name), dtype=np.int64) for name in ARRAYS}
    np.savez(out / "sam.npz", **arrays)
    meta = {"format": FORMAT, "kind": "sam", "tokenizer": tokenizer, "vocab_size": int(vocab_size),
            "separator": int(separator), "tokens": count, "documents": len(docs), "states": len(sam.link),
            "bytes": int((out / "sam.npz").stat().st_size)}
    # Only what the content decides goes to the file: a rebuild gives the same folder.
    (out / "sam.json").write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    return {**meta, "build_seconds": round(time.perf_counter() - start, 3)}


def load(path: str | Path, vocab_size: int) -> FrozenAutomaton:
    """The static automaton at ``path``, refused when its tokenizer's vocabulary is not the target's."""
    folder = Path(path)
    meta_file = folder / "sam.json"
    if not meta_file.is_file():
        raise DatastoreError(f"{folder} is no SAM datastore (no sam.json): build one with "
                             "`specframe datastore build CORPUS --kind sam --tokenizer MODEL --out DIR`")
    meta = json.loads(meta_file.read_text(encoding="utf-8"))
    if meta.get("format") != FORMAT:
        raise DatastoreError(f"{folder}: SAM datastore format {meta.get('format')!r}, this specframe reads "
                             f"{FORMAT}: build it again")
    if int(meta["vocab_size"]) > vocab_size:
        raise DatastoreError(f"SAM datastore {folder} was built with a tokenizer of {meta['vocab_size']} tokens "
                             f"({meta.get('tokenizer')}), the target has {vocab_size}: build it with the "
                             "target's tokenizer")
    with np.load(folder / "sam.npz") as arrays:
        return FrozenAutomaton(*(arrays[name].tolist() for name in ARRAYS))


def describe(meta: dict[str, Any]) -> str:
    """One line of a SAM datastore's size and build time."""
    return (f"{meta['tokens']:,} tokens in {meta['documents']:,} documents, {meta['states']:,} states, "
            f"{meta['bytes'] / 2**20:.1f} MiB, built in {meta['build_seconds']:.1f} s")


def eos_of(tokenizer: str) -> int:
    """The end-of-sequence id of ``tokenizer`` (a model name or path), :data:`NO_EOS` for the
    ``bytes`` test tokenizers or one without such a token."""
    if tokenizer == "bytes" or tokenizer.startswith("bytes:"):
        return NO_EOS
    from specframe.models.tokenizer import load_tokenizer

    eos = getattr(load_tokenizer(tokenizer), "eos_token_id", None)
    return NO_EOS if eos is None else int(eos)
