r"""The output-attention heads of :class:`attnopt.course.vqa.VQAModel`: which library module each head of
:data:`attnopt.course.vqa.HEADS` is, with which settings, and how :func:`attnopt.course.vqa.swap_head` moves the
rest of a trained model onto a new head.

References:
    Farinhas (2021), §6.2.2 (continuous heads on a padded grid) and §6.3 (the 2-MCA and test-MCA
    heads).
"""

from __future__ import annotations

from torch import nn

from ..continuous.attention import ContinuousAttention
from ..continuous.mixture import MultimodalContinuousAttention
from ..continuous.value_functions import GaussianRBF, grid_locations, padding_locations

#: The keyword arguments of :class:`attnopt.continuous.mixture.MultimodalContinuousAttention` a
#: :class:`~attnopt.course.vqa.VQAModel` passes on through ``mixture_kwargs``.
MIXTURE_KWARGS = ("cov_floor", "differentiate_em", "init", "n_init", "n_iter", "selection_penalty")


def cell_variance(grid: int) -> float:
    """:math:`h^2/12`, the variance of a grid cell of side :math:`h=1/(G-1)`: the covariance floor of
    the mixture heads (a component narrower than a cell would fit a single row of cells, see
    :func:`~attnopt.continuous.mixture.select_components`)."""
    return 1.0 / (12 * (grid - 1) ** 2)


def make_head(kind: str, grid: int, basis: GaussianRBF, penalty: float, uniform_mix: float,
              n_quadrature: int | None, n_components: int, mixture_kwargs: dict | None) -> nn.Module | None:
    r"""The library module behind a head (``None`` for discrete attention), on the locations of a
    ``grid``:math:`\times`\ ``grid`` feature map; the arguments are those of the model, checked."""
    locations = grid_locations(grid)
    if kind in ("continuous_softmax", "continuous_sparsemax"):
        family = "gaussian" if kind == "continuous_softmax" else "truncated_paraboloid"
        return ContinuousAttention(basis, locations, family=family, penalty=penalty, padding=True,
                                   uniform_mix=uniform_mix, n_quadrature=n_quadrature)
    if kind in ("mixture", "mixture_selected"):
        kw = {"cov_floor": cell_variance(grid), "n_iter": 2 if kind == "mixture" else 20,
              "init": "regions", **(mixture_kwargs or {})}
        k = "auto" if kind == "mixture_selected" else n_components
        return MultimodalContinuousAttention(basis, locations, k, max_components=n_components,
                                             penalty=penalty, padding=padding_locations(grid),
                                             uniform_mix=uniform_mix, **kw)
    return None


def load_body(new: nn.Module, trained: nn.Module) -> None:
    """Load every weight of ``trained`` but those of its head (``attention.*``) into ``new``."""
    body = {k: v for k, v in trained.state_dict().items() if not k.startswith("attention.")}
    new.load_state_dict(body, strict=False)
