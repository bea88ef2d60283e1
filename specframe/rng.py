"""Random draws that follow a ``torch.Generator``'s device, shared by the sampling plugins.

Drawing where the generator lives (CPU for the global generator) and then moving the result
keeps a seeded run's random stream the same whatever device the model is on.
"""

from __future__ import annotations

import torch


def on_generator(shape: int | tuple[int, ...], generator: torch.Generator | None) -> torch.Tensor:
    """An empty float64 tensor on the generator's device, to fill in place with ``generator``."""
    return torch.empty(shape, dtype=torch.float64, device=generator.device if generator is not None else "cpu")


def uniforms(shape: int | tuple[int, ...], generator: torch.Generator | None, device: torch.device | str) -> torch.Tensor:
    """float64 uniforms in [0, 1) of ``shape``, drawn on the generator's device, moved to ``device``."""
    return on_generator(shape, generator).uniform_(generator=generator).to(device)
