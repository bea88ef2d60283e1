"""REST's datastore (He et al., arXiv 2311.08252): a token corpus and its suffix array, memory-mapped.

``specframe datastore build CORPUS... --tokenizer MODEL --out DIR`` tokenizes text files, JSONL
files (their ``text`` field, else every string of ``turns``) or folders of them, and writes:

- ``tokens.npy``: int32, the corpus *reversed*, documents separated by ``-1``;
- ``sa.npy``: int32 (int64 past 2^31 tokens), the suffix array of ``tokens.npy`` sorted by its
  first ``depth`` tokens (rounded up to a power of two; ties in position order);
- ``datastore.json``: the tokenizer, vocabulary size, token and document counts, ``depth``.

Size: 8 bytes per corpus token (4 + 4), plus one per document.

Why reversed: the drafter asks for the longest *suffix* of its context that the corpus holds. In
the reversed corpus that suffix, reversed, is a *prefix*, and the suffixes sharing a longer
prefix form a sub-range of the shorter prefix's range; so :meth:`Datastore.longest` narrows one
range token by token (a binary search per matched token) instead of searching each length
afresh. The continuation of a match at reversed position p is the token before it, ``tokens[p
- 1]`` (none at a document's start).

The index is cut at ``depth`` tokens (the longest match a drafter asks for; the ``suffix``
drafter's ``max_match``), so building it takes ``ceil(log2 depth) + 1`` stable sorts (prefix
doubling) whatever the corpus repeats.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np

FORMAT = 1
SEPARATOR = -1
#: What ``datastore build --kind`` writes: REST's suffix array, or SAM-Decoding's static automaton
#: (:mod:`specframe.drafters.sam_store`).
KINDS = ("rest", "sam")
#: Continuations counted per lookup at most (the first ones in suffix-array order): REST draws its
#: candidates from a bounded sample of the matches too; the cost of a lookup stays bounded.
MAX_OCCURRENCES = 4096
TEXT_SUFFIXES = (".txt", ".md", ".py", ".rst", ".json", ".jsonl", ".csv", ".html", ".tex")


class DatastoreError(ValueError):
    """A datastore that cannot be built or read; the message names the file and the fix."""


# ---------------------------------------------------------------------- building
def suffix_array(tokens: np.ndarray, depth: int) -> np.ndarray:
    """Positions of ``tokens`` sorted by their next ``depth`` tokens rounded up to a power of two
    (a shorter rest sorts first; ties keep position order), by prefix doubling. Any order that
    refines the order by ``depth`` tokens serves the lookup: the suffixes sharing a prefix of at
    most ``depth`` tokens stay one range, sorted by their next token."""
    n = len(tokens)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    rank = np.unique(tokens, return_inverse=True)[1].astype(np.int64)
    order = np.argsort(rank, kind="stable")
    span = 1
    while span < depth and span < n:
        second = np.zeros(n, dtype=np.int64)
        second[: n - span] = rank[span:] + 1  # 0: past the end, before every token
        key = rank * (n + 1) + second
        order = np.argsort(key, kind="stable")
        ordered = key[order]
        rank = np.empty(n, dtype=np.int64)
        rank[order] = np.concatenate([[0], np.cumsum(ordered[1:] != ordered[:-1])])
        span *= 2
    return order


def row_text(row: Any) -> str:
    """One JSONL row's document: its ``text``; else its ``messages`` / ``conversations``
    (each turn's ``content`` or ``value``) joined; else its ``turns`` then its ``answer`` /
    ``answers`` joined (Spec-Bench questions, the target's own chat data)."""
    if not isinstance(row, dict):
        return ""
    if isinstance(row.get("text"), str):
        return row["text"]
    for key in ("messages", "conversations"):
        if isinstance(row.get(key), list):
            return "\n".join(str(t.get("content", t.get("value", ""))) for t in row[key] if isinstance(t, dict))
    answers = row.get("answers", [row["answer"]] if "answer" in row else [])
    return "\n".join(t for t in [*row.get("turns", []), *answers] if isinstance(t, str))


def documents(paths: Iterable[str | Path]) -> Iterator[str]:
    """The texts of ``paths``: a file is one document (a JSONL file one per line, see
    :func:`row_text`); a folder holds every text file under it, in name order."""
    for path in map(Path, paths):
        if path.is_dir():
            yield from documents(sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES))
        elif path.suffix == ".jsonl":
            for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
                if line.strip():
                    yield row_text(json.loads(line))
        elif path.is_file():
            yield path.read_text(encoding="utf-8", errors="replace")
        else:
            raise DatastoreError(f"corpus {path} does not exist")


def build(texts: Iterable[str], encode: Callable[[str], list[int]], out: str | Path, tokenizer: str,
          vocab_size: int, depth: int = 16, progress: Callable[[int], None] | None = None) -> dict:
    """Tokenize ``texts`` with ``encode`` and write the datastore to ``out``; returns its metadata."""
    start = time.perf_counter()
    parts, docs, count = [], 0, 0
    for text in texts:
        ids = encode(text)
        if ids:
            parts.append(np.asarray(ids, dtype=np.int64))
            docs += 1
            count += len(ids)
            if progress is not None:
                progress(count)
    if not parts:
        raise DatastoreError("the corpus holds no text: pass text, JSONL or folders of them")
    if max(int(p.max()) for p in parts) >= vocab_size:
        raise DatastoreError(f"a token id is >= the tokenizer's vocabulary size {vocab_size}")
    joined = np.concatenate([np.concatenate([p, [SEPARATOR]]) for p in parts])[:-1]
    reversed_tokens = joined[::-1].copy()
    order = suffix_array(reversed_tokens, depth)
    index_type = np.int32 if len(joined) < 2**31 else np.int64
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    np.save(out / "tokens.npy", reversed_tokens.astype(np.int32))
    np.save(out / "sa.npy", order.astype(index_type))
    meta = {"format": FORMAT, "tokenizer": tokenizer, "vocab_size": int(vocab_size), "tokens": count,
            "documents": docs, "depth": int(depth),
            "bytes": int((out / "tokens.npy").stat().st_size + (out / "sa.npy").stat().st_size)}
    # Only what the content decides goes to the file: the same corpus rebuilt gives the same
    # folder, byte for byte (a run ties its answers to that digest).
    (out / "datastore.json").write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    return {**meta, "build_seconds": round(time.perf_counter() - start, 3)}


# ---------------------------------------------------------------------- lookup
class Datastore:
    """A built datastore, memory-mapped; :meth:`longest` answers as the suffix drafter's indexes do."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        meta_file = self.path / "datastore.json"
        if not meta_file.is_file():
            raise DatastoreError(f"{self.path} is no datastore (no datastore.json): build one with "
                                 "`specframe datastore build CORPUS --tokenizer MODEL --out DIR`")
        self.meta = json.loads(meta_file.read_text(encoding="utf-8"))
        if self.meta.get("format") != FORMAT:
            raise DatastoreError(f"{self.path}: datastore format {self.meta.get('format')!r}, this specframe "
                                 f"reads {FORMAT}: build it again")
        # Memory-mapped: the pages load as lookups touch them, and processes share them.
        self.tokens = np.asarray(np.load(self.path / "tokens.npy", mmap_mode="r"))
        self.order = np.asarray(np.load(self.path / "sa.npy", mmap_mode="r"))
        self.depth = int(self.meta["depth"])
        self.vocab_size = int(self.meta["vocab_size"])
        # The first narrowing spans the whole array: answer it from a table (token -> its range).
        first = self.tokens[self.order] if len(self.order) else np.zeros(0, dtype=np.int32)
        self._first = np.searchsorted(first, np.arange(self.vocab_size + 1), side="left")

    def _at(self, i: int, offset: int) -> int:
        """Token ``offset`` of the suffix at sorted place ``i`` (-2: past the corpus's end)."""
        p = int(self.order[i]) + offset
        return int(self.tokens[p]) if p < len(self.tokens) else -2

    def _narrow(self, lo: int, hi: int, offset: int, token: int) -> tuple[int, int]:
        """The sub-range of ``[lo, hi)`` whose suffixes hold ``token`` at ``offset``."""
        a, b = lo, hi
        while a < b:  # first place with a token >= the query's
            mid = (a + b) // 2
            if self._at(mid, offset) < token:
                a = mid + 1
            else:
                b = mid
        c, b = a, hi
        while c < b:  # first place with a token > the query's
            mid = (c + b) // 2
            if self._at(mid, offset) <= token:
                c = mid + 1
            else:
                b = mid
        return a, c

    def longest(self, query: list[int], min_match: int = 1) -> tuple[int, dict[int, int]]:
        """``(m, counts)``: the longest suffix of ``query`` (at most :attr:`depth` tokens, at
        least ``min_match``) the corpus holds with a continuation, and the counts of the tokens
        that followed it (over at most :data:`MAX_OCCURRENCES` occurrences); ``(0, {})`` if none."""
        lo, hi, ranges = 0, len(self.order), []
        for m, token in enumerate(reversed(query[-self.depth :])):
            token = int(token)
            if m == 0:
                inside = 0 <= token < self.vocab_size
                lo, hi = (int(self._first[token]), int(self._first[token + 1])) if inside else (0, 0)
            else:
                lo, hi = self._narrow(lo, hi, m, token)
            if lo >= hi:
                break
            ranges.append((lo, hi))
        for m in range(len(ranges), max(min_match, 1) - 1, -1):
            counts = self._continuations(*ranges[m - 1])
            if counts:
                return m, counts
        return 0, {}

    def _continuations(self, lo: int, hi: int) -> dict[int, int]:
        """Counts of the tokens that followed the matches at sorted places ``[lo, hi)``."""
        places = self.order[lo : min(hi, lo + MAX_OCCURRENCES)].astype(np.int64) - 1
        nxt = self.tokens[places[places >= 0]]
        nxt = nxt[nxt >= 0]
        if not len(nxt):
            return {}
        ids, counts = np.unique(nxt, return_counts=True)
        return {int(t): int(c) for t, c in zip(ids, counts)}


def load(path: str | Path, vocab_size: int) -> Datastore:
    """The datastore at ``path``, refused when its tokenizer's vocabulary is not the target's."""
    store = Datastore(path)
    if store.vocab_size > vocab_size:
        raise DatastoreError(f"datastore {path} was built with a tokenizer of {store.vocab_size} tokens "
                             f"({store.meta.get('tokenizer')}), the target has {vocab_size}: build it with the "
                             "target's tokenizer")
    return store


def describe(meta: dict[str, Any]) -> str:
    """One line of a datastore's size and build time."""
    return (f"{meta['tokens']:,} tokens in {meta['documents']:,} documents, {meta['bytes'] / 2**20:.1f} MiB "
            f"({meta['bytes'] / max(1, meta['tokens']):.1f} bytes/token), index depth {meta['depth']}, "
            f"built in {meta['build_seconds']:.1f} s")


# ---------------------------------------------------------------------- command line
def _tokenizer(name: str) -> tuple[Callable[[str], list[int]], int]:
    """``(encode, vocabulary size)`` of a model's tokenizer (a shipped or registry name, a
    path), or of ``bytes[:V]`` (bytes mod V, as random test models take)."""
    if name == "bytes" or name.startswith("bytes:"):
        vocab = int(name.partition(":")[2] or 256)
        return (lambda text: [b % vocab for b in text.encode("utf-8")]), vocab
    from specframe.models.tokenizer import load_tokenizer

    tok = load_tokenizer(name)
    return (lambda text: tok(text, add_special_tokens=False)["input_ids"]), len(tok)


def datastore_command() -> Any:
    """The ``specframe datastore`` group (``build``)."""
    import click

    @click.group("datastore")
    def group() -> None:
        """Datastores: a corpus and its suffix array (``--kind rest``, for the ``suffix`` drafter's
        ``datastore`` option) or its suffix automaton (``--kind sam``, for the ``sam`` drafter's);
        docs/drafters.md."""

    @group.command("build")
    @click.argument("corpus", nargs=-1, required=True, type=click.Path(exists=True))
    @click.option("--tokenizer", required=True, help="the target model (shipped or registry name, or path) whose "
                  "tokenizer encodes the corpus; 'bytes:V' for byte-level test models")
    @click.option("--out", required=True, type=click.Path(file_okay=False), help="the datastore folder to write")
    @click.option("--kind", type=click.Choice(KINDS), default="rest", show_default=True,
                  help="'rest': a suffix array (the suffix drafter's datastore); 'sam': a static suffix "
                  "automaton (the sam drafter's datastore)")
    @click.option("--depth", default=16, show_default=True, help="longest match indexed (the drafter's max_match; "
                  "--kind rest)")
    def build_command(corpus: tuple[str, ...], tokenizer: str, out: str, kind: str, depth: int) -> None:
        """Tokenize CORPUS (text or JSONL files, or folders of them) and write its index."""
        from rich.progress import Progress

        from . import sam_store

        encode, vocab = _tokenizer(tokenizer)
        with Progress(transient=True) as bar:
            task = bar.add_task("tokenizing", total=None)

            def progress(n: int) -> None:
                bar.update(task, completed=n, description=f"tokenizing: {n:,} tokens")

            if kind == "sam":
                meta = sam_store.build(documents(corpus), encode, out, tokenizer, vocab,
                                       sam_store.eos_of(tokenizer), progress=progress)
            else:
                meta = build(documents(corpus), encode, out, tokenizer, vocab, depth, progress=progress)
        click.echo(f"{out}: {(sam_store.describe if kind == 'sam' else describe)(meta)}")

    return group
