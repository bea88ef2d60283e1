"""widetree passes specframe's conformance suite (run: pytest tests/)."""

from specframe.testing.conformance import TreePolicyConformance


class TestWideTree(TreePolicyConformance):
    """Default options."""

    plugin = "widetree"


class TestNarrowWideTree(TreePolicyConformance):
    """A narrow beam under a small budget."""

    plugin = ("widetree", {"budget": 16, "width": 2})
