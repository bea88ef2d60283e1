"""The tree explorer: trees.html, every recorded step's draft tree beside the answer it produced.

:mod:`.trees` renders the page from the answer records alone, :mod:`.page` is the page around
it (style, its one script, the content security policy), and :mod:`.tokentext` the token text
the records keep, so the report needs no tokenizer (docs/experiments.md).
"""

from __future__ import annotations

from specframe.experiments.explorer.trees import shape_extremes, write_explorer

__all__ = ["shape_extremes", "write_explorer"]
