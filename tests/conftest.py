"""Shared test set-up: Hypothesis profiles and one torch thread.

The tests run tiny models, for which a second thread costs more in synchronisation than it
gains (5-100x slower on a loaded 2-core machine); one thread also keeps timings stable.
"""

import torch

from specframe.testing.profiles import register_profiles

torch.set_num_threads(1)
register_profiles()
