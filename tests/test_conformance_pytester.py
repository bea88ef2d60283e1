"""The conformance suite catches broken plugins, and says which property they break.

Each test writes throw-away plugins (two policies, a drafter, two verifiers) and a conformance test module, runs pytest on it in a child
process (pytester) and asserts which suite tests fail, pass or are reported as declared
deviations.
"""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

BROKEN_PLUGINS = '''
"""Deliberately broken plugins, registered without an entry point."""

from dataclasses import dataclass

import torch

import specframe
from specframe.interfaces import Drafter, TreePolicy, Verifier
from specframe.testing.reference import Verdict


@dataclass
class BrokenOptions(specframe.BudgetOptions):
    budget: int = 16


class OverBudgetPolicy(TreePolicy):
    """A greedy chain with one node too many: `budget` drafted nodes plus the root."""

    name = "broken-overbudget"
    Options = BrokenOptions

    def build(self, session, budget):
        tree, node = session.new_tree(), 0
        for _ in range(budget):
            logp = session.expand(tree, [node])[0]
            token = int(logp.argmax())
            tree = tree.add_nodes(torch.tensor([node]), torch.tensor([token]), tree.logp[node:node + 1] + logp[token])
            node = len(tree) - 1
        return tree


class TieUnsafePolicy(TreePolicy):
    """Top-3 children over three layers, then the best `budget` nodes by score with ties going
    to the LATER node: a child that ties its parent can be kept without it."""

    name = "broken-tie-unsafe"
    Options = BrokenOptions

    def build(self, session, budget):
        tree, frontier = session.new_tree(), [0]
        for _ in range(3):
            logp = session.expand(tree, frontier)
            top = torch.topk(logp, min(3, logp.shape[-1]), dim=-1)
            keep = torch.isfinite(top.values).flatten()
            parents = torch.tensor(frontier).repeat_interleave(top.values.shape[1])[keep]
            start = len(tree)
            tree = tree.add_nodes(parents, top.indices.flatten()[keep], tree.logp[parents] + top.values.flatten()[keep])
            frontier = list(range(start, len(tree)))
        order = torch.sort(tree.logp[1:].flip(0), descending=True, stable=True).indices
        best = (len(tree) - 1 - order)[: budget - 1]   # node ids, ties -> later node
        return tree.select(torch.cat([torch.tensor([0]), best]))


class FirstChildVerifier(Verifier):
    """Accepts the first child at every level without looking at the target."""

    name = "broken-first-child"

    def verify(self, tree, target_logits, generator=None):
        path = [0]
        while True:
            kids = (tree.parents == path[-1]).nonzero().flatten()
            if not len(kids):
                break
            path.append(int(kids[0]))
        return Verdict(torch.tensor(path), int(target_logits[path[-1]].argmax())).leaf(tree)


@dataclass
class TemperatureOptions:
    temperature: float = 1.0


class IgnoresTemperatureVerifier(Verifier):
    """Lossless sampling (y ~ p at each node; follow y if it is a child, else y is the bonus),
    except that it samples at temperature 1 whatever its `temperature` option says."""

    name = "broken-ignores-temperature"
    Options = TemperatureOptions
    sampling = True

    def verify(self, tree, target_logits, generator=None):
        probs = torch.softmax(target_logits.double(), dim=-1)
        path = [0]
        while True:
            y = int(torch.multinomial(probs[path[-1]], 1, generator=generator))
            kids = ((tree.parents == path[-1]) & (tree.tokens == y)).nonzero().flatten()
            if not len(kids):
                return Verdict(torch.tensor(path), y).leaf(tree)
            path.append(int(kids[0]))


class LeakyDrafter(Drafter):
    """Ignores tree attention: every node's row depends on the whole tree (here its size),
    not only on the node's own path, as if the mask let siblings see each other."""

    name = "broken-leaky"

    def expand(self, tree, nodes):
        gen = torch.Generator().manual_seed(len(tree))
        row = torch.log_softmax(torch.randn(self.vocab_size, generator=gen, dtype=torch.float64), dim=-1)
        return row.expand(len(nodes), -1).clone()


@specframe.hookimpl
def register_drafters(register):
    register(LeakyDrafter)


@specframe.hookimpl
def register_tree_policies(register):
    register(OverBudgetPolicy)
    register(TieUnsafePolicy)


@specframe.hookimpl
def register_verifiers(register):
    register(FirstChildVerifier)
    register(IgnoresTemperatureVerifier)


specframe.register_plugin(__import__(__name__), dist="broken-plugins")
'''

SUITE = '''
import broken_plugins  # noqa: F401  (registers the broken plugins)
from specframe.testing.conformance import DrafterConformance, TreePolicyConformance, VerifierConformance


class TestOverBudget(TreePolicyConformance):
    plugin = "broken-overbudget"


class TestTieUnsafe(TreePolicyConformance):
    plugin = "broken-tie-unsafe"


class TestLeaky(DrafterConformance):
    plugin = "broken-leaky"


class TestFirstChild(VerifierConformance):
    plugin = "broken-first-child"


class TestIgnoresTemperature(VerifierConformance):
    plugin = ("broken-ignores-temperature", {"temperature": 0.5})
    expected_failures = {"test_greedy_output_equals_generate": "samples at every setting: no greedy configuration"}
'''


def outcomes_by_test(result) -> dict[str, str]:
    """``{"Class::test": "PASSED" | "FAILED" | "XFAIL" | ...}`` from a ``-rA`` summary."""
    out = {}
    for line in result.outlines:
        parts = line.split(" ", 2)
        if len(parts) >= 2 and parts[0] in ("PASSED", "FAILED", "XFAIL", "XPASS", "ERROR", "SKIPPED"):
            node = parts[1].split("::", 1)[-1]
            out[node] = parts[0]
    return out


# Failing properties would otherwise spend most of the run shrinking their examples; the
# suite inherits every setting but its example counts from the profile loaded before import.
CONFTEST = '''
from hypothesis import Phase, settings

settings.register_profile("no-shrink", phases=[Phase.explicit, Phase.reuse, Phase.generate])
settings.load_profile("no-shrink")
'''


@pytest.fixture
def run_suite(pytester):
    def run(suite: str, *args: str):
        pytester.makeconftest(CONFTEST)
        pytester.makepyfile(broken_plugins=BROKEN_PLUGINS, test_suite=suite)
        return pytester.runpytest_subprocess("-rA", "-p", "no:cacheprovider", "--conformance-examples", "6", *args)

    return run


def test_broken_plugins_fail_the_properties_they_break(run_suite):
    result = run_suite(SUITE)
    got = outcomes_by_test(result)
    text = result.stdout.str()
    expected = {
        # Over budget: the budget property fails (and the engine refuses its trees) ...
        "TestOverBudget::test_valid_tree_within_budget": "FAILED",
        "TestOverBudget::test_greedy_output_equals_generate": "FAILED",
        # ... while what it does right still passes.
        "TestOverBudget::test_deterministic_for_identical_drafter_outputs": "PASSED",
        "TestOverBudget::test_one_hot_drafter_yields_the_argmax_chain": "PASSED",
        # Not ancestor-closed under ties.
        "TestTieUnsafe::test_ancestor_closed_when_children_tie_parents": "FAILED",
        # ... but with a real draft model (no exact ties) it works, losslessly.
        "TestTieUnsafe::test_greedy_output_equals_generate": "PASSED",
        "TestTieUnsafe::test_close_draft_is_accepted": "PASSED",
        # A drafter without tree attention: only the honesty property can tell (verification
        # keeps the output lossless whatever the drafter proposes).
        "TestLeaky::test_tree_attention_is_honest": "FAILED",
        "TestLeaky::test_expand_rows_are_log_distributions": "PASSED",
        "TestLeaky::test_greedy_output_equals_generate": "PASSED",
        "TestLeaky::test_begin_forgets_earlier_generations": "PASSED",
        # A verifier that ignores the target.
        "TestFirstChild::test_verdict_is_a_root_path": "FAILED",
        "TestFirstChild::test_emitted_distribution_matches_the_target": "FAILED",
        "TestFirstChild::test_greedy_output_equals_generate": "FAILED",
        # A sampling verifier at the wrong temperature: only the distribution test can tell.
        "TestIgnoresTemperature::test_verdict_is_a_root_path": "PASSED",
        "TestIgnoresTemperature::test_emitted_distribution_matches_the_target": "FAILED",
        "TestIgnoresTemperature::test_greedy_output_equals_generate": "XFAIL",
    }
    wrong = {test: (want, got.get(test)) for test, want in expected.items() if got.get(test) != want}
    assert not wrong, f"unexpected outcomes {wrong}\n{text}"
    # The failures say what is wrong.
    assert "over the budget of" in text
    assert "not ancestor-closed" in text
    assert "the tree row differs from expanding the path as a chain" in text
    assert "is impossible under the target" in text
    assert "emitted tokens are not distributed as the target" in text and "chi-square p=" in text
    assert "declared deviation: samples at every setting" in text


def test_a_declared_deviation_that_passes_is_reported(run_suite):
    suite = SUITE.split("class TestOverBudget")[0] + '''
class TestWronglyDeclared(TreePolicyConformance):
    plugin = "broken-overbudget"
    expected_failures = {"test_deterministic_for_identical_drafter_outputs": "thought to be random"}
'''
    result = run_suite(suite, "-k", "deterministic")
    assert outcomes_by_test(result) == {"TestWronglyDeclared::test_deterministic_for_identical_drafter_outputs": "FAILED"}
    result.stdout.fnmatch_lines(["*XPASS(strict)*declared deviation: thought to be random*"])
    assert result.ret == pytest.ExitCode.TESTS_FAILED


def test_an_unknown_expected_failure_name_is_an_error(run_suite):
    suite = SUITE.split("class TestOverBudget")[0] + '''
class TestTypo(TreePolicyConformance):
    plugin = "broken-overbudget"
    expected_failures = {"test_valid_tree_within_budgt": "typo"}
'''
    result = run_suite(suite)
    assert result.ret == pytest.ExitCode.INTERRUPTED  # collection error
    assert "expected_failures names unknown test(s) ['test_valid_tree_within_budgt']" in result.stdout.str()
