"""widetree passes specframe's conformance suite (run: pytest tests/)."""

from specframe.testing.conformance import TreePolicyConformance


class TestWideTree(TreePolicyConformance):
    """Default options."""

    plugin = "widetree"


class TestNarrowWideTree(TreePolicyConformance):
    """A narrow beam under a small budget."""

    plugin = ("widetree", {"budget": 16, "width": 2})


class TestAutoWideTree(TreePolicyConformance):
    """Auto-sized (docs/tutorial-policy.md, section 6): lossless, valid, and the sizer's trees
    prefix-closed within max_budget."""

    plugin = ("widetree", {"budget": "auto", "max_budget": 32, "width": 4})
