"""Token text for people: what each token of a run reads as, decoded once at run time.

The records keep decoded text beside the token ids (answers' pieces, tree nodes' tokens), so
``specframe report RUN_DIR`` draws trees.html and plots/trees.png with words and no tokenizer.
Every decode of a token for display goes through :class:`TokenText`, so the tokenizer it wraps
is the only thing to change when tokenizers are loaded another way.
"""

from __future__ import annotations

import unicodedata
from typing import Any, Sequence

# Shown for whitespace and control characters, so a token's exact text can be read.
_VISIBLE = {" ": "\u2423", "\n": "\u21b5", "\t": "\u2192", "\r": "\u240d"}


class TokenText:
    """Decodes token ids of one tokenizer into display text (special tokens kept)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def token(self, token_id: int) -> str:
        """The text of one token on its own (a partial UTF-8 sequence decodes to U+FFFD)."""
        return self.tokenizer.decode([int(token_id)], skip_special_tokens=False)

    def tokens(self, ids: Sequence[int]) -> list[str]:
        """:meth:`token` of each id."""
        return [self.token(i) for i in ids]

    def pieces(self, ids: Sequence[int]) -> list[str]:
        """The text each token adds to the decoded sequence, in order: joined, they read as the
        whole decode. A token ending inside a multi-byte character adds "" and the token that
        completes it adds the character, so no piece holds a broken character. Decoding need not
        be prefix-stable (a tokenizer's clean-up may rewrite earlier text when a token joins):
        the earlier pieces are then cut back to the text both decodes share."""
        out: list[str] = []
        shown = ""
        for end in range(1, len(ids) + 1):
            text = self.tokenizer.decode([int(i) for i in ids[:end]], skip_special_tokens=False)
            if text.endswith("\ufffd") and end < len(ids):  # wait for the rest of the character
                out.append("")
                continue
            if not text.startswith(shown):
                _cut_back(out, len(_shared_prefix(shown, text)))
            out.append(text[sum(map(len, out)):])
            shown = text
        return out


def _shared_prefix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def _cut_back(pieces: list[str], length: int) -> None:
    """Shorten ``pieces`` from the end so they join to their first ``length`` characters."""
    total = sum(map(len, pieces))
    for i in range(len(pieces) - 1, -1, -1):
        if total <= length:
            return
        keep = max(0, len(pieces[i]) - (total - length))
        total -= len(pieces[i]) - keep
        pieces[i] = pieces[i][:keep]

def visible(text: str, whitespace: bool = True) -> str:
    """``text`` with spaces, newlines, tabs and other control characters drawn as visible
    marks (``␣``, ``↵``, ``→``, ``\\x07``), and an empty token as ``∅``. ``whitespace=False``
    keeps spaces, newlines and tabs as they are (running text) and marks only the rest."""
    if not text:
        return "\u2205" if whitespace else ""
    out = []
    for ch in text:
        if ch in " \n\t" and not whitespace:
            out.append(ch)
        elif ch in _VISIBLE:
            out.append(_VISIBLE[ch])
        elif ord(ch) < 32 or 0x7F <= ord(ch) < 0xA0:
            out.append(f"\\x{ord(ch):02x}")
        elif unicodedata.category(ch) in ("Cf", "Zl", "Zp"):  # bidi overrides, line separators
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return "".join(out)
