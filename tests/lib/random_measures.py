"""Random probability weights for the tests of chapter 2's modules (kernels, regularity)."""

import torch

F64 = torch.float64


def generator(seed: int) -> torch.Generator:
    """A CPU generator seeded with ``seed``."""
    return torch.Generator().manual_seed(seed)


def simplex(shape, gen: torch.Generator, zeros: bool = False) -> torch.Tensor:
    """Random masses in float64 summing to one along the last axis (a zero first mass with ``zeros``)."""
    w = torch.rand(*shape, generator=gen, dtype=F64) + 0.05
    if zeros:
        w[..., 0] = 0.0
    return w / w.sum(-1, keepdim=True)
