r"""The frozen grid features of the VQA experiment: a small CNN trained once, then frozen.

Every head of Farinhas (2021, chapter 6) pools the same frozen :math:`14\times14` grid of image
features.  Here a small CNN, :class:`GridEncoder`, is trained once (:func:`pretrain_encoder`) to say,
for each cell of a :math:`G\times G` grid, which colour and which shape cover it, and its per-cell
description (:data:`FEATURES`, 13 numbers) is computed once for every scene (:func:`encode`) and
shared by the heads of :mod:`attnopt.course.vqa`, which also exports these names.

References:
    Farinhas, A. (2021). *Visual Attention with Sparse and Continuous Transformations*, chapter 6.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import _vqa_checks as checks
from . import _vqa_training as training
from .._validation import check_int, check_number
from ..continuous.value_functions import grid_locations
from .vqa_data import COLOURS, SHAPES, SyntheticVQA, VQABatch, _as_batch

__all__ = ["FEATURES", "GridEncoder", "encode", "pretrain_encoder"]

#: What the frozen grid features of a cell hold (see :class:`GridEncoder`), in this order. The
#: probabilities that its pixels have each colour (or none) and belong to each shape (or none), and
#: its coordinates.
FEATURES: tuple[str, ...] = COLOURS + ("no colour",) + SHAPES + ("no shape", "row", "column")


class GridEncoder(nn.Module):
    r"""A small CNN that describes each cell of a :math:`G\times G` grid of the image in 13 numbers.

    Four 3\ :math:`\times`\ 3 convolutions with batch norm (two with stride 2: a 56-pixel canvas
    gives a 14\ :math:`\times`\ 14 map, each cell seeing 23 pixels around it) and two 1\ :math:`\times`\ 1
    classifiers: the colour under the cell (6 colours or none) and the shape (3 shapes or none).
    :func:`pretrain_encoder` trains them on the coverage of each cell (a task without questions,
    as an ImageNet classifier is trained without them); the features of a cell (:data:`FEATURES`)
    are the two predicted distributions and the cell's coordinates.  Every head of a comparison
    then pools the same frozen features, as the models of Farinhas (2021) pool the same features of
    a frozen pretrained network.

    Args:
        grid: side :math:`G` of the output grid.
        channels: width of the first convolution (the others have twice as many).

    Raises:
        TypeError: non-integer sizes.
        ValueError: ``grid`` below 2, ``channels`` below 1.

    Example:
        >>> encoder = GridEncoder()
        >>> encoder(torch.rand(2, 3, 56, 56)).shape  # (batch, cells, features)
        torch.Size([2, 196, 13])
    """

    def __init__(self, grid: int = 14, channels: int = 16):
        super().__init__()
        self.grid = check_int(grid, "grid", minimum=2)
        c = check_int(channels, "channels")
        block = lambda cin, cout, stride: [nn.Conv2d(cin, cout, 3, stride, 1), nn.BatchNorm2d(cout), nn.ReLU()]
        self.body = nn.Sequential(*block(3, c, 2), *block(c, 2 * c, 2), *block(2 * c, 2 * c, 1), *block(2 * c, 2 * c, 1))
        self.colour = nn.Conv2d(2 * c, len(COLOURS) + 1, 1)
        self.shape = nn.Conv2d(2 * c, len(SHAPES) + 1, 1)
        self.register_buffer("coords", grid_locations(self.grid))  # (L, 2): (row, col) in [0, 1]

    def logits(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(colour, shape)`` logits per cell, ``(B, 7, G, G)`` and ``(B, 4, G, G)``."""
        h = F.adaptive_avg_pool2d(self.body(checks.images_arg(images, self.coords)), self.grid)
        return self.colour(h), self.shape(h)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """``(B, 3, H, W)`` images -> ``(B, G*G, 13)`` features (row-major cells, :data:`FEATURES`)."""
        colour, shape = self.logits(images)
        probs = torch.cat([torch.softmax(colour, 1), torch.softmax(shape, 1)], 1).flatten(2).transpose(1, 2)
        return torch.cat([probs, self.coords.to(probs).expand(probs.shape[0], -1, -1)], -1)


def pretrain_encoder(
    encoder: GridEncoder,
    data: SyntheticVQA | VQABatch,
    *,
    epochs: int = 3,
    batch_size: int = 16,
    lr: float = 1e-2,
    object_weight: float = 4.0,
    seed: int = 0,
    progress: bool = False,
) -> dict[str, list]:
    r"""Train ``encoder`` to name the colour and the shape under each grid cell (no question involved).

    The loss of a cell is the cross-entropy of each predicted distribution against the share of
    the cell's pixels of each colour (or none) and each shape (or none), weighted by
    :math:`1+\texttt{object\_weight}\cdot(\text{share of the cell on an object})` because most
    cells are background.  Adam with a one-cycle learning rate.

    Args:
        encoder: a :class:`GridEncoder` (trained in place, left in eval mode).
        data: scenes to train on (the questions are ignored).
        epochs, batch_size, lr: optimization settings.
        object_weight: the extra weight of object cells (:math:`\ge0`).
        seed: seeds the shuffling.
        progress: show a progress bar (stderr).

    Returns:
        ``{"loss": [...]}``, the mean loss per epoch.

    Raises:
        TypeError: ``encoder`` not a :class:`GridEncoder`, ``data`` of another type, non-integer
            counts, ``progress`` not a bool.
        ValueError: ``epochs``/``batch_size`` below 1, ``lr <= 0``, negative ``object_weight``, a
            grid that does not divide the canvas.

    Example:
        >>> encoder = GridEncoder()
        >>> from attnopt.vqa_data import make_batch
        >>> data = make_batch(8, questions_per_scene=1)
        >>> history = pretrain_encoder(encoder, data, epochs=1)
        >>> len(history["loss"])
        1
    """
    checks.instance_arg(encoder, GridEncoder, "encoder")
    data = _as_batch(data)
    epochs, batch_size, lr, seed = checks.optimization_args(epochs, batch_size, lr, seed, progress)
    object_weight = check_number(object_weight, "object_weight", low=0.0)
    if data.images.shape[-1] % encoder.grid:
        raise ValueError(f"the canvas ({data.images.shape[-1]} px) must be a multiple of the encoder's grid ({encoder.grid})")
    return training.pretrain_epochs(encoder, data, epochs, batch_size, lr, object_weight, seed, progress)


@torch.no_grad()
def encode(encoder: GridEncoder, data: SyntheticVQA | VQABatch, *, batch_size: int = 256) -> torch.Tensor:
    """The frozen features of every scene of ``data``: ``(S, G*G, 13)`` (:data:`FEATURES`), no gradient.

    Args:
        encoder: a (pretrained) :class:`GridEncoder`; run in eval mode.
        data: the scenes.
        batch_size: scenes per forward pass.

    Returns:
        ``(S, L, 13)`` on the encoder's device; the features of question ``i`` are
        ``features[data.scene[i]]``.

    Raises:
        TypeError: ``encoder`` or ``data`` of another type, ``batch_size`` not an int.
        ValueError: ``batch_size < 1``, empty data.

    Example:
        >>> from attnopt.vqa_data import make_batch
        >>> encode(GridEncoder(), make_batch(3, questions_per_scene=1)).shape
        torch.Size([3, 196, 13])
    """
    checks.instance_arg(encoder, GridEncoder, "encoder")
    data = _as_batch(data)
    batch_size = check_int(batch_size, "batch_size")
    dev = encoder.coords.device
    with training.eval_mode(encoder):
        batches = range(0, data.n_scenes, batch_size)
        return torch.cat([encoder(data.images[s:s + batch_size].to(dev)) for s in batches])
