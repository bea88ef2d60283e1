"""Token text for display: pieces that join into the decoded answer, visible whitespace,
and tree labels safe from matplotlib's mathtext."""

from __future__ import annotations

from specframe.experiments.data import ByteTokenizer
from specframe.experiments.plots import node_label
from specframe.experiments.explorer.tokentext import TokenText, visible


def test_pieces_join_into_the_decode_and_never_split_a_character():
    text = TokenText(ByteTokenizer(256))
    ids = list("aé€\n".encode("utf-8"))  # 1 + 2 + 3 + 1 bytes
    pieces = text.pieces(ids)
    assert len(pieces) == len(ids)
    assert "".join(pieces) == "aé€\n"
    assert pieces == ["a", "", "é", "", "", "€", "\n"]
    assert text.tokens([0x61, 0xC3]) == ["a", "\ufffd"]  # a lone byte of a character, on its own


def test_a_truncated_character_at_the_end_still_shows():
    assert TokenText(ByteTokenizer(256)).pieces([0x61, 0xC3]) == ["a", "\ufffd"]


def test_visible_marks_whitespace_and_control_characters():
    assert visible(" a\n\tb\r") == "\u2423a\u21b5\u2192b\u240d"
    assert visible("\x07\x7f\u202e") == "\\x07\\x7f\\u202e"
    assert visible("") == "\u2205"
    # running text keeps its spaces and line breaks, and still shows the rest
    assert visible("a b\n\x1b", whitespace=False) == "a b\n\\x1b"


def test_tree_labels_use_the_text_and_escape_mathtext():
    tree = {"tokens": [5, 6, 7], "text": [" $x$", "a_very_long_token", "\n"]}
    assert node_label(tree, 0) == "\u2423\\$x\\$"
    assert node_label(tree, 1) == "a_very_lo\u2026"
    assert node_label(tree, 2) == "\u21b5"
    assert node_label({"tokens": [42]}, 0) == "42"  # records without text: the id


class _CleaningTokenizer:
    """Decodes like tokenizers with clean-up: " ?" becomes "?", rewriting the text before it."""

    PIECES = {0: "x", 1: " ", 2: "?", 3: "y"}

    def decode(self, ids, skip_special_tokens=False):
        return "".join(self.PIECES[i] for i in ids).replace(" ?", "?")


def test_pieces_join_to_the_decoded_answer_when_decoding_is_not_prefix_stable():
    ids = [0, 1, 2, 3]
    text = TokenText(_CleaningTokenizer())
    pieces = text.pieces(ids)
    assert len(pieces) == len(ids)
    assert "".join(pieces) == _CleaningTokenizer().decode(ids) == "x?y"
