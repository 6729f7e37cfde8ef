r"""The engine of :func:`attnopt.course.vqa.attention_map` and :func:`attnopt.course.vqa.attention_precision`: a
head's attention drawn on a grid over the image, and the share of it on a mask.

A grid cell :math:`(i,j)` of the feature map sits at :math:`t=(i,j)/(G-1)`, and a pixel at
unit-square position :math:`u` (row, column) at :math:`t=(uG-\tfrac12)/(G-1)` (the coordinates of
:mod:`attnopt.course.vqa`).

References:
    Farinhas (2021), eqs. (3.12) and (3.14) (the densities drawn).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

#: Floor added to the covariances when a density is evaluated on pixels (a softmax on one cell has
#: covariance 0, a point mass with no values to plot).
MAP_FLOOR = 1e-6


def on_image(attention, resolution: int) -> torch.Tensor:
    """``(B, resolution, resolution)`` distribution of an :class:`~attnopt.course.vqa.AttentionOutput` over
    the cells of a ``resolution``-grid of the image (a checked ``resolution``)."""
    G = attention.grid
    if attention.density is None:  # discrete: the softmax weights, upsampled and renormalized
        w = attention.weights
        if resolution != G:
            w = F.interpolate(w.unsqueeze(1), size=(resolution, resolution), mode="nearest").squeeze(1)
        return w / w.sum((-2, -1), keepdim=True)
    density = attention.density
    dev, dt = density.means.device, density.means.dtype
    u = (torch.arange(resolution, device=dev, dtype=dt) + 0.5) / resolution
    t1 = (u * G - 0.5) / (G - 1)  # image unit coordinate -> grid location coordinate
    points = torch.stack(torch.meshgrid(t1, t1, indexing="ij"), -1).reshape(-1, 2)  # (P, 2) (row, col)
    floor = MAP_FLOOR * torch.eye(2, device=dev, dtype=dt)
    floored = density._replace(covariances=density.covariances + floor)
    m = floored.pdf(points).reshape(-1, resolution, resolution)
    total = m.sum((-2, -1), keepdim=True)
    return m / total.clamp_min(torch.finfo(m.dtype).tiny)


def share_on_mask(a: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """``(...)`` share of the checked ``(..., H, W)`` attention ``a`` on the 0/1 mask ``m``
    ``(..., H', W')``, resized to ``(H, W)`` by max-pooling (a multiple) or nearest upsampling."""
    if m.shape[-2:] != a.shape[-2:]:
        H, W = a.shape[-2:]
        lead = m.shape[:-2]
        m2 = m.reshape(-1, 1, *m.shape[-2:])
        if m.shape[-2] % H == 0 and m.shape[-1] % W == 0:
            m2 = F.adaptive_max_pool2d(m2, (H, W))
        else:
            m2 = F.interpolate(m2, size=(H, W), mode="nearest")
        m = m2.reshape(*lead, H, W)
    total = a.sum((-2, -1))
    return (a * m).sum((-2, -1)) / total.clamp_min(torch.finfo(a.dtype).tiny)
