"""Policy ``static``: a fixed tree of rank paths (EAGLE-1 / Medusa style choice trees).

A rank path ``[i0, i1, ...]`` means "the i0-th ranked child of the root, then its i1-th ranked
child, ...". The tree's shape never changes; its tokens are the drafter's ranked children.
"""

from __future__ import annotations

from dataclasses import dataclass

from specframe.building import RankPath, build_from_rank_paths, validate_rank_paths
from specframe.interfaces import DraftSession, TreePolicy
from specframe.options import require
from specframe.search_space import tunable
from specframe.tree import DraftTree

#: EAGLE-1's ``mc_sim_7b_63`` (SafeAILab/EAGLE, eagle/model/choices.py): 25 drafted nodes,
#: depth 5, 4/8/8/3/2 nodes per level.
MC_SIM_7B_63: tuple[RankPath, ...] = (
    (0,), (1,), (2,), (3,),
    (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0), (2, 1), (3, 0),
    (0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 1, 0), (0, 1, 1), (0, 2, 0), (0, 2, 1), (1, 0, 0),
    (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 0, 2),
    (0, 0, 0, 0, 0), (0, 0, 0, 0, 1),
)

#: Medusa's ``mc_sim_7b_63`` (FasterDecoding/Medusa, medusa/model/medusa_choices.py), which Hydra
#: drafts by default too (zankner/Hydra, hydra/model/hydra_choices.py): 63 drafted nodes, depth 4,
#: 10/28/23/2 nodes per level.
MEDUSA_MC_SIM_7B_63: tuple[RankPath, ...] = (
    (0,), (0, 0), (1,), (0, 1), (2,), (0, 0, 0), (1, 0), (0, 2), (3,), (0, 3), (4,), (0, 4), (2, 0), (0, 5),
    (0, 0, 1), (5,), (0, 6), (6,), (0, 7), (0, 1, 0), (1, 1), (7,), (0, 8), (0, 0, 2), (3, 0), (0, 9), (8,),
    (9,), (1, 0, 0), (0, 2, 0), (1, 2), (0, 0, 3), (4, 0), (2, 1), (0, 0, 4), (0, 0, 5), (0, 0, 0, 0),
    (0, 1, 1), (0, 0, 6), (0, 3, 0), (5, 0), (1, 3), (0, 0, 7), (0, 0, 8), (0, 0, 9), (6, 0), (0, 4, 0),
    (1, 4), (7, 0), (0, 1, 2), (2, 0, 0), (3, 1), (2, 2), (8, 0), (0, 5, 0), (1, 5), (1, 0, 1), (0, 2, 1),
    (9, 0), (0, 6, 0), (0, 0, 0, 1), (1, 6), (0, 7, 0),
)

#: Named trees accepted by the ``choices`` option.
PRESETS: dict[str, tuple[RankPath, ...]] = {"mc_sim_7b_63": MC_SIM_7B_63, "medusa_mc_sim_7b_63": MEDUSA_MC_SIM_7B_63}


@dataclass
class StaticOptions:
    """Options of the ``static`` policy.

    Attributes:
        choices: the tree as a list of rank paths (every proper prefix must be listed too), or
            the name of a preset (``mc_sim_7b_63``, the default: EAGLE-1's 25-node tree;
            ``medusa_mc_sim_7b_63``: Medusa's and Hydra's 63-node tree).
            The tree size is ``len(choices) + 1`` (the root counts); a smaller engine budget
            keeps the first paths in (length, path) order.
    """

    # The presets are the space: a list of rank paths is a tree to design, not a number to tune.
    choices: tuple | str = tunable("mc_sim_7b_63", choices=tuple(sorted(PRESETS)))

    def __post_init__(self) -> None:
        if isinstance(self.choices, str):
            require(self.choices in PRESETS, "choices",
                    f"names an unknown preset {self.choices!r}; presets: {sorted(PRESETS)}")
            self.paths = PRESETS[self.choices]
        else:
            self.paths = validate_rank_paths(self.choices, "choices")


class StaticPolicy(TreePolicy):
    """Drafts the same rank-path tree every step: one forward per level."""

    name = "static"
    Options = StaticOptions

    @property
    def max_budget(self) -> int:
        """The configured tree's size, root included (the shape fixes it: no budget option)."""
        return len(self.options.paths) + 1

    def fixed_shape(self) -> tuple[tuple[int, ...], ...]:
        """The configured rank paths: every step drafts them."""
        return tuple(tuple(p) for p in self.options.paths)

    def build(self, session: DraftSession, budget: int) -> DraftTree:
        """Fill the rank paths with the drafter's ranked children."""
        return build_from_rank_paths(session, self.options.paths, int(budget))
