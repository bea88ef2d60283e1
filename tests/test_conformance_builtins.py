"""specframe's own plugins pass the conformance suite through the same path as a third party's.

One generated class per built-in plugin (exactly what ``specframe conformance --dist specframe``
runs), plus extra configurations that exercise other code paths of the same plugins.
"""

from specframe.testing.conformance import (
    DrafterConformance, TreePolicyConformance, VerifierConformance, conformance_classes,
)

# Every registered policy, drafter and verifier of the `specframe` distribution.
globals().update(conformance_classes(dist="specframe", module=__name__))


class TestPolicy_chain_sampled(TreePolicyConformance):
    """The chain drawing its tokens from the draft (i.i.d. drafting with draft_probs)."""

    plugin = ("chain", {"gamma": 5, "sample": True})


class TestPolicy_chain_heuristic(TreePolicyConformance):
    """HF's heuristic gamma schedule with the confidence stop (adaptive state across steps)."""

    plugin = ("chain", {"schedule": "heuristic", "confidence_stop": True})
    strict_ranks = True


class TestPolicy_talon_two_topk_layers(TreePolicyConformance):
    """TALON with two Top-K layers and a loose gate."""

    plugin = ("talon", {"budget": 40, "mu": 0.1, "top_k": 4, "init_layers": 2})
    strict_ranks = True


class TestDrafter_ngram_decayed(DrafterConformance):
    """Prompt lookup with recency weighting and short n-grams."""

    plugin = ("ngram", {"max_ngram": 2, "decay": 0.9})


class TestVerifier_sampling_warped(VerifierConformance):
    """Sampling with temperature and nucleus warping (reference: transformers' warpers)."""

    plugin = ("sampling", {"temperature": 0.7, "top_p": 0.9, "top_k": 6})
    greedy_plugin = ("sampling", {"top_k": 1})


class TestPolicy_talon_auto(TreePolicyConformance):
    """TALON with the size chosen from the cost curve and mu from the bandit (issue 16)."""

    plugin = ("talon", {"budget": "auto", "mu": "auto"})
    strict_ranks = True


class TestPolicy_chain_auto(TreePolicyConformance):
    """The chain with gamma chosen from the cost curve and the acceptance history."""

    plugin = ("chain", {"gamma": "auto"})
    strict_ranks = True


class TestPolicy_eagle_auto(TreePolicyConformance):
    """EAGLE's tree with an auto budget (total_token=-1 in spirit)."""

    plugin = ("eagle", {"budget": "auto"})
    strict_ranks = True


class TestPolicy_opt_tree_auto(TreePolicyConformance):
    """OPT-Tree with an auto budget."""

    plugin = ("opt-tree", {"budget": "auto"})
    strict_ranks = True
