"""The two trees of the ``suffix`` drafter and their life cycle, as SuffixDecoding's reference
keeps them (arctic-inference 0.3.0, ``SuffixDecodingCache``; vLLM's ``suffix`` method drives it).

- The request's tree holds the prompt and the response so far.
- The global tree holds the responses of the cached requests, the active one included: each
  committed token joins it at once, so a response can draft from its own earlier text there
  too, and every request after it sees it.
- A request takes its slot in the global tree when it starts. Past ``max_cached_requests``
  slots the oldest response is evicted (first in, first out; never the one just started).

:meth:`SuffixCache.speculate` drafts from each tree (:meth:`SuffixTree.speculate`) and keeps the
one with the higher score; on a tie the request's.
"""

from __future__ import annotations

from collections import deque

from .suffix_tree import Draft, SuffixTree


class SuffixCache:
    """The request's tree and the global tree of one drafter (module docstring)."""

    def __init__(self, max_depth: int, max_cached_requests: int) -> None:
        self.max_depth = max_depth
        # 0: no global tree (the reference's convention); otherwise the number of slots.
        self.max_cached_requests = max_cached_requests
        self.global_tree = SuffixTree(max_depth)
        self.request_tree = SuffixTree(max_depth)
        self.cached: deque[int] = deque()  # the responses in the global tree, oldest first
        self._next_id = 0

    @property
    def active_id(self) -> int | None:
        """The global tree's id of the active response (None without a global tree)."""
        return self.cached[-1] if self.max_cached_requests and self.cached else None

    def start(self, prompt: list[int]) -> None:
        """A new request: a fresh request tree holding ``prompt``, and a slot for its response
        in the global tree (evicting the oldest responses past the bound)."""
        self.request_tree = SuffixTree(self.max_depth)
        self.request_tree.extend(0, prompt)
        if not self.max_cached_requests:
            return
        self.cached.append(self._next_id)
        self._next_id += 1
        while len(self.cached) > self.max_cached_requests:
            old = self.cached.popleft()
            if old in self.global_tree.seqs:
                self.global_tree.remove(old)

    def add(self, tokens: list[int]) -> None:
        """Append committed ``tokens`` to the request and to its response in the global tree."""
        self.request_tree.extend(0, tokens)
        if self.active_id is not None:
            # Undoable: the engine's last commit may run past the output's cut (replace_response).
            self.global_tree.extend(self.active_id, tokens, undoable=True)

    def replace_response(self, output: list[int]) -> None:
        """Make the active response in the global tree exactly ``output``: the engine commits
        a last step's tokens past a cut at ``max_new_tokens`` or EOS, which the reference's
        caller never hands it. That last commit is taken back and its kept part added again,
        which leaves the tree as if only ``output`` had been added, sibling order included."""
        active = self.active_id
        held = self.global_tree.seqs.get(active, []) if active is not None else output
        if held == output:
            return
        tree = self.global_tree
        if held[: len(output)] == output and len(held) - len(output) <= tree.undoable(active):
            taken = tree.undo()
            tree.extend(active, taken[: len(output) - len(tree.seqs.get(active, []))])
            return
        if active in tree.seqs:  # any other change: the counts are exact, the order of ties may differ
            tree.remove(active)
        tree.extend(active, output)

    def responses(self) -> list[list[int]]:
        """The responses in the global tree, oldest first."""
        return [list(self.global_tree.seqs[i]) for i in self.cached if i in self.global_tree.seqs]

    def speculate(self, context: list[int], max_spec_tokens: int, max_spec_factor: float,
                  max_spec_offset: float, min_token_prob: float) -> tuple[Draft, SuffixTree]:
        """The reference's draft after ``context`` (cut to its last ``max_depth`` tokens) and
        the tree it came from."""
        context = context[-self.max_depth :]
        args = (max_spec_tokens, max_spec_factor, max_spec_offset, min_token_prob)
        mine = self.request_tree.speculate(context, *args)
        if not self.max_cached_requests:
            return mine, self.request_tree
        other = self.global_tree.speculate(context, *args)
        return (mine, self.request_tree) if mine.score >= other.score else (other, self.global_tree)
