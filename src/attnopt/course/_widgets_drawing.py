"""What the ``draw_*`` functions of :mod:`attnopt.course.widgets` share: tensors as NumPy arrays, and the
convex hull that :func:`attnopt.course.widgets.draw_preference` shades under the templates.

References:
    Andrew (1979), *Another efficient algorithm for convex hulls in two dimensions* (the monotone
    chain).
"""

from __future__ import annotations

import numpy as np
import torch


def to_numpy(x) -> np.ndarray:
    """A tensor (detached, on the CPU) or anything array-like as a NumPy array."""
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def _turn(o, a, b) -> float:
    """The z-component of (a - o) x (b - o): > 0 for a left turn."""
    return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])


def convex_hull(points: np.ndarray) -> np.ndarray:
    """Vertices of the convex hull of 2-D points, counter-clockwise (Andrew's monotone chain)."""
    pts = sorted(map(tuple, points))
    if len(pts) < 3:
        return np.array(pts)

    def half(seq):
        out = []
        for p in seq:
            while len(out) >= 2 and _turn(out[-2], out[-1], p) <= 0:
                out.pop()
            out.append(p)
        return out

    lower, upper = half(pts), half(reversed(pts))
    return np.array(lower[:-1] + upper[:-1])
