r"""The engine of the cluster count of :func:`attnopt.course.explore.particle_flow`: single linkage, no host read.

Two particles are in one cluster when a chain of particles, each closer than a radius to the next,
joins them: the clusters are the connected components of the graph "closer than the radius".  Its
transitive closure is reached by repeated squaring of the adjacency matrix, :math:`\lceil\log_2 N\rceil`
batched products whatever the data, so the count never reads the host.
"""

from __future__ import annotations

import math

import torch


def count_clusters(x: torch.Tensor, radius: torch.Tensor) -> torch.Tensor:
    """Connected components of the graph "closer than radius", by repeated squaring (no host read)."""
    n = x.shape[-2]
    linked = torch.cdist(x, x) <= radius[..., None, None]
    for _ in range(max(1, math.ceil(math.log2(max(n, 2))))):
        reach = linked.to(x.dtype)
        linked = linked | (reach @ reach > 0)
    # each particle's label is the first particle it reaches; one cluster per label
    label = linked.to(torch.int64).argmax(dim=-1)
    own = torch.arange(n, device=x.device)
    return (label == own).sum(-1)
