"""Parity of the ``suffix`` drafter with SuffixDecoding's reference, arctic-inference 0.3.0 (the
code vLLM's ``suffix`` method runs): the reference is the oracle.

One decoder answers prompts in order through the public API (``SpecDecoder.generate`` with an
``on_step`` callback); a reference ``SuffixDecodingCache`` is fed the same history, as vLLM's
proposer feeds it (``start_request`` with the prompt, ``add_active_response`` with each step's
committed tokens, cut where the output is cut), and is asked for its draft at each step's
context. Every step, at the defaults (vLLM's):

- the drafter's own draft (:meth:`SuffixDrafter.draft`) is the reference's, token for token,
  with the same probabilities, score and match length;
- the chain the ``chain`` policy drafts is the reference's draft up to the order of equally
  likely candidates: where they part, the two tokens occur equally often after the same
  context in the tree the reference drafted from (counted here by brute force over the
  sequences that tree holds), and the shared part carries the reference's probabilities;
- a tree policy's top path (each node's most probable child, from the root) starts as the
  reference's draft, within its budget, under the same tie allowance.

Below the drafter, specframe's suffix tree gives the reference tree's path drafts exactly (ties
included) after random appends, removals and undone appends, at random options.

Skipped, naming the package, where arctic-inference is not installed (``scripts/install_parity.sh``
installs it); a failure instead under ``SPECFRAME_REQUIRE_PARITY=1``, as CI runs it.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import pytest
import torch

import specframe
from specframe.drafters.suffix_tree import SuffixTree
from specframe.testing import parity
from specframe.testing.harness import greedy_reference
from specframe.testing.models import tiny_model

reference = parity.reference("arctic_inference.suffix_decoding", "arctic-inference (SuffixDecoding's reference)")

DEPTH = 24  # vLLM's suffix_decoding_max_tree_depth, and the number of tokens it drafts by default
MAX_NEW = 40


@dataclass
class Tally:
    """How the steps compared."""

    steps: int = 0
    drafted: int = 0  # steps where the reference drafted something
    equal: int = 0  # the chain is the reference's draft
    tied: int = 0  # they part at two equally likely candidates
    notes: list[str] = field(default_factory=list)


def workload(n: int, vocab: int, seed: int) -> list[list[int]]:
    """Prompts that share a stem and differ in their tails (so the global tree has something to
    offer), as a repetitive workload's requests do."""
    rng = random.Random(seed)
    stem = [rng.randrange(vocab) for _ in range(12)]
    return [stem[: rng.randint(3, 12)] + [rng.randrange(vocab) for _ in range(rng.randint(1, 6))] for _ in range(n)]


def occurrences(seqs: list[list[int]], sub: list[int]) -> int:
    """How often ``sub`` occurs in ``seqs`` (brute force)."""
    n = len(sub)
    return sum(seq[i : i + n] == sub for seq in seqs for i in range(len(seq) - n + 1))


def top_path(tree: specframe.DraftTree) -> list[int]:
    """From the root, each node's most probable child (ties to the lower id, as the rows)."""
    parents, tokens, logp = tree.parents.tolist(), tree.tokens.tolist(), tree.logp.tolist()
    node, out = 0, []
    while True:
        kids = [i for i in range(1, len(parents)) if parents[i] == node]
        if not kids:
            return out
        node = min(kids, key=lambda i: (-logp[i], tokens[i]))
        out.append(tokens[node])


def run(policy, prompts: list[list[int]], model, tally: Tally, prefix_only: bool = False) -> None:
    """Answer ``prompts`` in order with one decoder and one reference cache (module docstring)."""
    dec = specframe.SpecDecoder.build(target=model, drafter="suffix", policy=policy)
    cache = reference.SuffixDecodingCache(max_tree_depth=DEPTH, max_cached_requests=10000)
    responses: list[list[int]] = []  # what the reference's global tree holds, in order
    for req, prompt in enumerate(prompts):
        cont = greedy_reference(model, prompt, MAX_NEW + DEPTH + 1, None)
        cache.start_request(req, prompt)
        responses.append([])
        done = [0]

        def on_step(view, req=req, prompt=prompt, cont=cont, done=done):
            context = (prompt + cont[: done[0]])[-DEPTH:]
            want = cache.speculate(req, context, max_spec_tokens=DEPTH, max_spec_factor=1.0,
                                   max_spec_offset=0.0, min_token_prob=0.1)
            got = top_path(view.tree)
            local = cache._local_trees[req].speculate(context, DEPTH, 1.0, 0.0, 0.1, False)
            from_local = (list(local.token_ids), local.score) == (list(want.token_ids), want.score)
            source = [prompt + cont[: done[0]]] if from_local else responses
            compare(tally, want, got, view.tree, context, source, prefix_only, f"request {req}, step at {done[0]}")
            # What the step committed: the accepted drafts and the bonus token, cut at MAX_NEW.
            n = view.stats.accepted + 1
            new = cont[done[0] : min(done[0] + n, MAX_NEW)]
            cache.add_active_response(req, new)
            responses[-1] += new
            done[0] += n
            if done[0] < MAX_NEW:  # the next step's draft, from the same state
                mine = dec.drafter.draft()
                theirs = cache.speculate(req, (prompt + cont[: done[0]])[-DEPTH:], max_spec_tokens=DEPTH)
                assert (mine.tokens, mine.probs, mine.score, mine.match_len) == (
                    list(theirs.token_ids), list(theirs.probs), theirs.score, theirs.match_len), f"request {req}"

        out = dec.generate(torch.tensor(prompt), max_new_tokens=MAX_NEW, eos_token_id=None, on_step=on_step)
        assert out.tokens == cont[:MAX_NEW]
        cache.stop_request(req)


def compare(tally: Tally, want, got: list[int], tree, context: list[int], source: list[list[int]],
            prefix_only: bool, where: str) -> None:
    """One step: ``got`` is the reference's draft ``want`` (or, with ``prefix_only``, its
    start), but for a part at two tokens as frequent as each other after the same context."""
    ref = list(want.token_ids)
    tally.steps += 1
    tally.drafted += bool(ref)
    shared = 0
    while shared < min(len(ref), len(got)) and ref[shared] == got[shared]:
        shared += 1
    if not prefix_only:  # a chain: node i + 1 is token i; its cumulative log-prob is the reference's
        drafted = [math.exp(v) for v in tree.logp.tolist()[1 : shared + 1]]
        assert drafted == pytest.approx(list(want.probs[:shared]), rel=1e-5), where
    if shared == len(ref) and (shared == len(got) or prefix_only):
        tally.equal += 1
        return
    if prefix_only and shared == len(got):
        tally.equal += 1  # the budget ended the path first
        return
    assert shared < len(ref) and shared < len(got), f"{where}: lengths differ: reference {ref}, specframe {got}"
    matched = context[len(context) - want.match_len :] + ref[:shared]
    theirs, mine = occurrences(source, matched + [ref[shared]]), occurrences(source, matched + [got[shared]])
    assert theirs == mine > 0, f"{where}: reference {ref}, specframe {got}: not a tie ({theirs} vs {mine})"
    tally.tied += 1


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", seed=2, vocab_size=48, dtype=torch.float64)


def test_the_chain_drafts_what_the_reference_drafts(model):
    tally = Tally()
    run(("chain", {"gamma": DEPTH}), workload(8, 48, seed=0), model, tally)
    assert tally.steps > 200 and tally.drafted > tally.steps // 2
    assert tally.equal + tally.tied == tally.steps
    print(f"suffix parity, chain: {tally}")


@pytest.mark.parametrize("policy", [("talon", {"budget": 30}), ("eagle", {"budget": 30})])
def test_a_tree_policy_starts_its_top_path_as_the_reference(model, policy):
    tally = Tally()
    run(policy, workload(4, 48, seed=1), model, tally, prefix_only=True)
    assert tally.drafted > 0 and tally.equal + tally.tied == tally.steps


@pytest.mark.parametrize("seed", range(4))
def test_the_tree_drafts_as_the_reference_tree(seed):
    """Random sequences over a small vocabulary (many ties), appended in pieces, some removed,
    some appends taken back: every draft equals the reference tree's, token, probability,
    score and match length."""
    rng = random.Random(seed)
    compared = 0
    for _ in range(60):
        depth, vocab = rng.choice([2, 3, 5, 24]), rng.choice([2, 3, 5, 10])
        theirs, ours = reference._C.SuffixTree(depth), SuffixTree(depth)
        live: set[int] = set()
        for _ in range(rng.randint(1, 12)):
            if live and rng.random() < 0.2:
                seq = rng.choice(sorted(live))
                live.discard(seq)
                theirs.remove(seq)
                ours.remove(seq)
                continue
            seq = rng.randint(0, 4)
            kept = [rng.randrange(vocab) for _ in range(rng.randint(1, 12))]
            extra = [rng.randrange(vocab) for _ in range(rng.randint(0, 3))]
            theirs.extend(seq, kept)
            ours.extend(seq, kept + extra, undoable=True)
            ours.extend(seq, ours.undo()[: len(kept)])
            live.add(seq)
            for _ in range(3):
                context = [rng.randrange(vocab) for _ in range(rng.randint(1, 10))]
                args = (rng.randint(0, 10), rng.choice([0.5, 1.0, 2.0]), rng.choice([0.0, 1.0]),
                        rng.choice([0.0, 0.1, 0.3]))
                want, got = theirs.speculate(context, *args, False), ours.speculate(context, *args)
                assert (got.tokens, got.probs, got.score, got.match_len) == (
                    list(want.token_ids), list(want.probs), want.score, want.match_len), (context, args)
                compared += 1
    assert compared > 300
