"""Hardware-aware tree sizing: the toolkit behind ``budget = "auto"``, ``gamma = "auto"`` and
``mu = "auto"``, public so that any tree policy can be auto-sized as the built-ins are.

One concern per module: :mod:`.calibration` (acceptance learned online), :mod:`.cost` (the cost
model), :mod:`.prune` (the host-side tree and the cut to a top-n), :mod:`.growth` (build cap,
growth check, dry spells, root width), :mod:`.sizer` (:class:`AutoSizer`, which joins them),
:mod:`.bandit` (the gate chooser) and :mod:`.policy` (the public route: :class:`AutoSizedPolicy`).
docs/auto-sizing.md explains the model and the route.
"""

from specframe.sizing.bandit import MuBandit
from specframe.sizing.calibration import Calibration, RankAcceptance, cell_of, deeper, depth_class
from specframe.sizing.cost import CostModel
from specframe.sizing.growth import Growth, GrowthControl, stop_growing
from specframe.sizing.policy import AUTO, AutoBudgetOptions, AutoSizedPolicy, auto_top_k, check_size_option
from specframe.sizing.prune import HostTree, closed, subtree
from specframe.sizing.sizer import AutoSizer

__all__ = [
    "AUTO", "AutoBudgetOptions", "AutoSizedPolicy", "AutoSizer", "Calibration", "CostModel", "Growth",
    "GrowthControl", "HostTree", "MuBandit", "RankAcceptance", "auto_top_k", "cell_of", "check_size_option",
    "closed", "deeper", "depth_class", "stop_growing", "subtree",
]
