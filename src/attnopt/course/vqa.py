r"""Small visual-question-answering models with swappable output attention.

Chapter 6 of Farinhas (2021) compares the *output attention* of a VQA model (the step that pools a
:math:`14\times14` grid of image features into one vector) across discrete softmax, 2D continuous
softmax, 2D continuous sparsemax and multimodal (mixture) continuous attention (Tables 6.2--6.4,
Figs. 6.4--6.11).  VQA-v2 and its pretrained networks are far too heavy for a course, so this module
provides small models for the synthetic stand-in of :mod:`attnopt.course.vqa_data`, which has what VQA-v2
lacks, ground-truth masks:

* :class:`~attnopt.course.vqa_features.GridEncoder`, :func:`~attnopt.course.vqa_features.pretrain_encoder`,
  :func:`~attnopt.course.vqa_features.encode` (in :mod:`attnopt.course.vqa_features`, and
  importable from here) -- a small CNN trained once to say,
  for each cell of a :math:`G\times G` grid, which colour and which shape cover it; its frozen
  per-cell description (13 numbers, :data:`~attnopt.course.vqa_features.FEATURES`) plays the part of the frozen grid features
  every head of Farinhas (2021) shares;
* :class:`VQAModel` -- a question encoder, a bilinear score per cell and one of the :data:`HEADS`,
  each a thin adapter over :class:`attnopt.continuous.attention.ContinuousAttention` or
  :class:`attnopt.continuous.mixture.MultimodalContinuousAttention`; :func:`swap_head` reuses a trained model
  with another head (test-time selection of the number of components, §6.3.1);
* :func:`train`, :func:`evaluate`, :func:`attention_map`, :func:`attention_precision`,
  :func:`selection_sweep` (the penalty of criterion (5.20) swept on the model's own weights).

Coordinates.  Grid cell :math:`(i,j)` (row :math:`i`, column :math:`j`) sits at location
:math:`t=(i,j)/(G-1)\in[0,1]^2` (``value_functions.grid_locations(G)``, row-major), so the first
coordinate of a density's :math:`\mu` is the *row* (downwards) and the second the *column*.  A
canvas pixel at unit-square position :math:`u\in[0,1]^2` (row, column) is at
:math:`t=(uG-\tfrac12)/(G-1)`.  Scene objects store their centres as ``(x, y)`` = (column, row)
in the unit square.

References:
    Farinhas, A. (2021). *Visual Attention with Sparse and Continuous Transformations*, chapter 6.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from . import _vqa_checks as checks
from . import _vqa_heads as heads
from . import _vqa_maps as maps
from . import _vqa_training as training
from .._validation import check_int, check_number, check_same_device
from ..continuous.attention import ContinuousDensity
from ..continuous.value_functions import GaussianRBF, grid_locations
from .vqa_data import ANSWERS, VOCAB, SyntheticVQA, VQABatch, _as_batch
# the frozen-feature encoder: its own module, importable from here as before
from .vqa_features import FEATURES, GridEncoder, encode, pretrain_encoder  # noqa: F401

__all__ = [
    "HEADS",
    "AttentionOutput",
    "VQAModel",
    "VQAOutput",
    "attention_map",
    "attention_precision",
    "evaluate",
    "selection_sweep",
    "swap_head",
    "train",
    "train_seeds",
]

#: Output-attention heads of :class:`VQAModel`.
HEADS: tuple[str, ...] = ("discrete", "continuous_softmax", "continuous_sparsemax", "mixture", "mixture_selected")


# --------------------------------------------------------------------------------------------
# the model and its heads
# --------------------------------------------------------------------------------------------


@dataclass
class AttentionOutput:
    r"""What an output-attention head attended to, for plotting and evaluation.

    Attributes:
        kind: the head name (one of :data:`HEADS`).
        weights: ``(B, G, G)`` the discrete softmax of the cell scores (for the ``"discrete"``
            head this *is* the attention; for the others it is what moment matching or EM fits).
        density: ``None`` (discrete) or the head's
            :class:`~attnopt.continuous.attention.ContinuousDensity` (means as (row, column) in grid
            coordinates; unused mixture components have mixing weight 0).
        grid: the grid side :math:`G`.
    """

    kind: str
    weights: torch.Tensor
    density: ContinuousDensity | None = None
    grid: int = 14

    @property
    def n_components(self) -> torch.Tensor | None:
        """``(B,)`` number of components with positive weight (``None`` for discrete attention)."""
        return None if self.density is None else self.density.n_components

    def detach(self) -> "AttentionOutput":
        """A copy with every tensor detached."""
        density = None if self.density is None else self.density._replace(
            mixing=self.density.mixing.detach(), means=self.density.means.detach(),
            covariances=self.density.covariances.detach())
        return replace(self, weights=self.weights.detach(), density=density)


@dataclass
class VQAOutput:
    """Output of :class:`VQAModel`: answer ``logits (B, len(ANSWERS))`` and the :class:`AttentionOutput`."""

    logits: torch.Tensor
    attention: AttentionOutput


class VQAModel(nn.Module):
    r"""A small VQA model on frozen grid features whose output attention is one of :data:`HEADS`.

    Question: the sum :math:`e` of its word embeddings (the templates need no word order), and
    :math:`q=\operatorname{MLP}(e)`.  Scores: :math:`s_l=h_l^\top We`, bilinear in the features
    :math:`h_l` of cell :math:`l` and the question.  The head pools the features into a context
    :math:`c`: ``"discrete"`` :math:`c=\sum_l\operatorname{softmax}(s)_lh_l`; the continuous heads
    :math:`c=B\,\mathbb E_p[\psi(t)]` with :math:`p` moment-matched to the softmax (a Gaussian or
    a truncated paraboloid, :class:`~attnopt.continuous.attention.ContinuousAttention`, §6.2.2 of Farinhas,
    2021) or a Gaussian mixture fitted to it by weighted EM
    (:class:`~attnopt.continuous.mixture.MultimodalContinuousAttention`: ``"mixture"`` with ``n_components``
    components, 2 EM iterations from the upper/lower halves, as the 2-MCA of Farinhas (2021);
    ``"mixture_selected"`` with :math:`K^\star\le` ``n_components`` chosen per example by (5.20),
    3 random initializations and 20 iterations per :math:`K`, its test-MCA).  Answer logits: an MLP
    of :math:`[\operatorname{relu}(W_c\bar c)\odot\operatorname{relu}(W_q q),\ q]`, :math:`\bar c` the
    context after batch norm.

    Args:
        head: one of :data:`HEADS`.
        feature_dim: dimension of the features (13 for :class:`~attnopt.course.vqa_features.GridEncoder`).
        grid: side :math:`G` of the feature grid.
        hidden: question and fusion width.
        embedding_dim: word-embedding width (embeddings start small, :math:`\mathcal N(0, 0.1^2)`,
            so that the words the templates share do not dominate the first scores).
        n_basis_per_axis, basis_sigma: the RBF basis of the continuous heads (``10`` and
            ``0.001 ** 0.5``: the :math:`N=100` basis of Table 6.1).
        penalty: ridge penalty (0.01).
        uniform_mix: weight :math:`\epsilon` of the uniform distribution mixed into the softmax
            before moment matching or EM (0: none).
        n_quadrature: angular nodes for 2D continuous sparsemax (``None``: the adaptive rule).
        n_components: :math:`K` for ``"mixture"`` (:math:`K_{\max}` for ``"mixture_selected"``).
        mixture_kwargs: extra keyword arguments for
            :class:`~attnopt.continuous.mixture.MultimodalContinuousAttention` (``n_iter``, ``init``,
            ``selection_penalty``, ``n_init``, ``cov_floor``, ``differentiate_em``).

    Raises:
        ValueError: an unknown ``head``, sizes below 1 (``grid`` below 2), a non-positive
            ``basis_sigma``, a negative ``penalty``, ``uniform_mix`` outside ``[0, 1]``.
        TypeError: non-integer sizes, ``mixture_kwargs`` not a dict or with a key the mixture
            module does not take.

    Example:
        >>> model = VQAModel("continuous_sparsemax")
        >>> features = torch.rand(2, 196, 13)
        >>> questions = torch.tensor([[1, 2, 3, 4, 15, 5, 14]] * 2)
        >>> out = model(features, questions)
        >>> out.logits.shape, out.attention.density.family
        (torch.Size([2, 11]), 'truncated_paraboloid')
    """

    def __init__(
        self,
        head: str = "discrete",
        *,
        feature_dim: int = len(FEATURES),
        grid: int = 14,
        hidden: int = 64,
        embedding_dim: int = 32,
        n_basis_per_axis: int = 10,
        basis_sigma: float = 0.001**0.5,
        penalty: float = 0.01,
        uniform_mix: float = 0.0,
        n_quadrature: int | None = None,
        n_components: int = 2,
        mixture_kwargs: dict[str, Any] | None = None,
    ):
        super().__init__()
        self.config = dict(feature_dim=feature_dim, grid=grid, hidden=hidden, embedding_dim=embedding_dim,
                           n_basis_per_axis=n_basis_per_axis, basis_sigma=basis_sigma, penalty=penalty,
                           uniform_mix=uniform_mix, n_quadrature=n_quadrature, n_components=n_components,
                           mixture_kwargs=mixture_kwargs)
        checks.model_config(head, HEADS, self.config, heads.MIXTURE_KWARGS)
        self.head_name, self.grid, self.feature_dim = head, grid, feature_dim
        self.embed = nn.Embedding(len(VOCAB), embedding_dim, padding_idx=0)
        nn.init.normal_(self.embed.weight, 0.0, 0.1)
        with torch.no_grad():
            self.embed.weight[0].zero_()
        self.question = nn.Sequential(nn.Linear(embedding_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden))
        self.query = nn.Linear(embedding_dim, feature_dim)
        basis = GaussianRBF.grid(n_basis_per_axis, basis_sigma, dim=2)
        self.attention = heads.make_head(head, grid, basis, penalty, uniform_mix, n_quadrature, n_components,
                                         mixture_kwargs)
        self.context_norm = nn.BatchNorm1d(feature_dim)
        self.fuse_c = nn.Linear(feature_dim, hidden)
        self.fuse_q = nn.Linear(hidden, hidden)
        self.classifier = nn.Sequential(nn.Linear(2 * hidden, hidden), nn.ReLU(), nn.Linear(hidden, len(ANSWERS)))
        self.register_buffer("device_marker", torch.zeros(()), persistent=False)

    def encode_question(self, questions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(query, q)``: the ``(B, feature_dim)`` vector the cell features are scored against, and ``(B, hidden)``."""
        e = self.embed(questions).sum(-2)
        return self.query(e), self.question(e)

    def classify(self, context: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """Answer logits ``(B, len(ANSWERS))`` from a context ``(B, feature_dim)`` and ``q`` (:meth:`encode_question`)."""
        c = self.context_norm(context)
        return self.classifier(torch.cat([F.relu(self.fuse_c(c)) * F.relu(self.fuse_q(q)), q], -1))

    def forward(self, features: torch.Tensor, questions: torch.Tensor) -> VQAOutput:
        """Answer logits and attention for a batch (see :class:`VQAOutput`).

        Args:
            features: ``(B, G*G, feature_dim)`` finite grid features (:func:`~attnopt.course.vqa_features.encode`).
            questions: ``(B, T)`` integer token ids in ``[0, len(VOCAB))``, ``T <= MAX_QUESTION_LENGTH``.
                Both on the model's device.

        Raises:
            TypeError: non-float ``features``, non-integer ``questions``.
            ValueError: shapes other than these, another device, NaN or infinite features, ids out
                of range.
        """
        features, questions = checks.model_inputs(features, questions, self.grid, self.feature_dim, self.device_marker)
        query, q = self.encode_question(questions)
        scores = torch.einsum("bld,bd->bl", features, query.to(features.dtype))
        weights = torch.softmax(scores, -1)
        if self.attention is None:
            context, density = torch.einsum("bl,bld->bd", weights, features), None
        else:
            context, density = self.attention(scores, features, return_density=True)
        attention = AttentionOutput(self.head_name, weights.unflatten(-1, (self.grid, self.grid)), density, self.grid)
        return VQAOutput(self.classify(context, q), attention)


def swap_head(model: VQAModel, head: str, **head_kwargs) -> VQAModel:
    """A copy of a trained ``model`` with another head (every other weight kept; the copy is not trained).

    Farinhas (2021, §6.3.1) evaluates a model trained with 2D continuous softmax with a mixture
    whose number of components is chosen per example at test time ("test-MCA"):
    ``swap_head(model, "mixture_selected")``.

    Args:
        model: a :class:`VQAModel`.
        head: one of :data:`HEADS`.
        **head_kwargs: constructor arguments of :class:`VQAModel` to change (``n_components``,
            ``mixture_kwargs``, ``uniform_mix``, ...; the sizes stay those of ``model``).

    Returns:
        A new :class:`VQAModel` on ``model``'s device, in eval mode.

    Raises:
        TypeError: ``model`` not a :class:`VQAModel`; a keyword it does not take.
        ValueError: as :class:`VQAModel`.

    Example:
        >>> model = VQAModel("continuous_softmax")
        >>> test_mca = swap_head(model, "mixture_selected", n_components=3)
        >>> test_mca.head_name, test_mca.attention.max_components
        ('mixture_selected', 3)
    """
    checks.instance_arg(model, VQAModel, "model")
    checks.head_options(head_kwargs, model.config)
    new = VQAModel(head, **{**model.config, **head_kwargs}).to(model.device_marker.device)
    heads.load_body(new, model)
    return new.eval()


# --------------------------------------------------------------------------------------------
# attention maps and precision
# --------------------------------------------------------------------------------------------

def attention_map(output: VQAOutput | AttentionOutput, resolution: int | None = None) -> torch.Tensor:
    r"""The attention as a probability distribution over a ``resolution``:math:`^2` grid of the image.

    Discrete attention: the softmax weights (``resolution == G``), or their nearest-neighbour
    upsampling renormalized.  Continuous heads: the density :math:`p(t)=\sum_k\pi_kp_k(t)`
    (Gaussian, eq. (3.12) of Farinhas, 2021, or truncated paraboloid, eq. (3.14)) evaluated at the
    cell centres of a ``resolution``-grid over the image and normalized to sum to one over those
    cells -- the density restricted to the image.  A truncated paraboloid is exactly zero outside
    its ellipse.  Covariances get :math:`10^{-6}I` added first, so that a softmax peaked on one
    cell (covariance 0) draws as a tiny blob rather than failing.

    Args:
        output: a :class:`VQAOutput` or :class:`AttentionOutput`.
        resolution: side of the output grid (default: the feature grid :math:`G`).

    Returns:
        ``(B, resolution, resolution)`` non-negative tensor summing to one per example (all zeros
        only in the degenerate case of a sparse support that contains no cell centre).

    Raises:
        TypeError: ``output`` of another type, ``resolution`` not an int.
        ValueError: ``resolution < 1``.

    Example:
        >>> model = VQAModel("continuous_softmax")
        >>> out = model(torch.rand(2, 196, 13), torch.tensor([[1, 2, 3]] * 2))
        >>> attention_map(out, 56).shape
        torch.Size([2, 56, 56])
    """
    att = output.attention if isinstance(output, VQAOutput) else output
    if not isinstance(att, AttentionOutput):
        raise TypeError(f"output must be a VQAOutput or AttentionOutput; got {type(output).__name__}")
    res = att.grid if resolution is None else check_int(resolution, "resolution")
    return maps.on_image(att, res)


def attention_precision(attention_map: torch.Tensor, gt_mask: torch.Tensor) -> torch.Tensor:
    r"""Share of the attention mass on the ground-truth objects, :math:`\sum_{c\in M}a_c/\sum_c a_c`.

    Args:
        attention_map: ``(..., H, W)`` non-negative attention (need not be normalized).
        gt_mask: ``(..., H', W')`` mask (bool, or float read as ``!= 0``) of the relevant cells;
            if its resolution differs from the map's it is resized by max-pooling (a map cell
            counts as relevant when it overlaps a relevant mask cell) or nearest upsampling.

    Returns:
        ``(...)`` precisions in :math:`[0,1]`; 0 for a map with no mass; empty for an empty batch.

    Raises:
        TypeError: ``attention_map`` not a float tensor, ``gt_mask`` not a tensor or array of
            bools or numbers.
        ValueError: NaN, infinite or negative attention, NaN or infinite mask entries, an empty
            grid, leading dimensions that do not broadcast.

    Example:
        >>> mask = torch.zeros(4, 4, dtype=torch.bool)
        >>> mask[:2] = True
        >>> attention_precision(torch.ones(4, 4), mask).item()
        0.5
    """
    return maps.share_on_mask(*checks.precision_args(attention_map, gt_mask))


# --------------------------------------------------------------------------------------------
# training and evaluation
# --------------------------------------------------------------------------------------------


def _questions(model, data, features) -> tuple[VQABatch, torch.Tensor]:
    """The checked ``model``, questions and frozen ``features`` of :func:`train`, :func:`evaluate` and
    :func:`selection_sweep`."""
    checks.instance_arg(model, VQAModel, "model")
    data = _as_batch(data)
    return data, checks.features_arg(features, data.n_scenes, model.grid, model.feature_dim)


def train(
    model: VQAModel,
    data: SyntheticVQA | VQABatch,
    features: torch.Tensor,
    *,
    epochs: int = 3,
    batch_size: int = 128,
    lr: float = 3e-3,
    weight_decay: float = 0.0,
    seed: int = 0,
    progress: bool = False,
    attention_supervision: float = 0.0,
    on_epoch: Callable[[int, VQAModel], Any] | None = None,
) -> dict[str, list]:
    r"""Train ``model`` on the answers (cross-entropy), with Adam(W) and a one-cycle learning rate.

    Args:
        model: a :class:`VQAModel` (trained in place on its device, left in eval mode).
        data: the questions.
        features: ``(S, G*G, feature_dim)`` frozen features of ``data``'s scenes (:func:`~attnopt.course.vqa_features.encode`).
        epochs, batch_size, lr, weight_decay: optimization settings.
        seed: seeds the shuffling (a :class:`torch.Generator`) and ``torch.manual_seed``.
        progress: show a progress bar (tqdm's text bar, on stderr).
        attention_supervision: weight :math:`\beta\ge0` of an auxiliary loss
            :math:`-\beta\log\sum_{c\in M}a_c` on the head's *own* attention :math:`a`
            (:func:`attention_map` at the grid's resolution: the softmax for discrete attention,
            the density at the cell centres for the others) with the ground-truth grid mask
            :math:`M`.  Not part of the training in Farinhas (2021) (0 by default).
        on_epoch: called as ``on_epoch(epoch, model)`` after each epoch (``epoch`` from 1), with
            the model in eval mode and no gradient (e.g. to :func:`evaluate` it on held-out data
            and follow the learning curve); what it returns is kept.

    Returns:
        ``{"loss", "accuracy", "epoch_time", "on_epoch"}``: per epoch, the mean training loss,
        the training accuracy, the seconds (not counting ``on_epoch``) and what ``on_epoch``
        returned (``None`` without it).

    Raises:
        TypeError: ``model`` not a :class:`VQAModel`, data of another type, non-integer
            ``epochs``/``batch_size``/``seed``, ``progress`` not a bool, ``on_epoch`` not
            callable.
        ValueError: empty data, ``features`` of another shape or device, ``epochs`` or
            ``batch_size`` below 1, ``lr <= 0``, negative ``weight_decay`` or
            ``attention_supervision``, a ``seed`` outside ``[-2**63, 2**64 - 1]``.

    Example:
        >>> from attnopt.vqa_data import make_batch
        >>> data = make_batch(4, questions_per_scene=4)
        >>> features = encode(GridEncoder(), data)
        >>> history = train(VQAModel(), data, features, epochs=2, batch_size=8)
        >>> len(history["loss"])
        2
    """
    data, features = _questions(model, data, features)
    epochs, batch_size, lr, seed = checks.optimization_args(epochs, batch_size, lr, seed, progress)
    weight_decay = check_number(weight_decay, "weight_decay", low=0.0)
    beta = check_number(attention_supervision, "attention_supervision", low=0.0)
    check_same_device(features, "features", model.device_marker, "the model")
    checks.callback_arg(on_epoch, "on_epoch")
    supervision = training.mask_supervision(data, beta)  # -beta log(the attention on the relevant cells)
    return training.train_epochs(model, data, features, epochs, batch_size, lr, weight_decay, seed, progress,
                                 supervision, on_epoch)


def train_seeds(
    models: Sequence[VQAModel],
    data: SyntheticVQA | VQABatch,
    features: torch.Tensor,
    *,
    seeds: Sequence[int],
    epochs: int = 3,
    batch_size: int = 128,
    lr: float = 3e-3,
    weight_decay: float = 0.0,
    progress: bool = False,
    on_epoch: Callable[[int, VQAModel], Any] | None = None,
) -> list[dict[str, list]]:
    r"""Train several models of one head, ``models[i]`` as :func:`train` would with ``seed=seeds[i]``,
    in one loop that calls the head once per step for all of them.

    A comparison over seeds trains the same head from several initializations on the same data.
    Trained one after another, each step calls the head once per model; here the head pools the
    stacked rows of every model in one call (the heads have no parameters and treat each row on its
    own), while each model keeps its own shuffling, optimizer state and batch-norm statistics.  The
    result is that of :func:`train` for each model up to rounding, at a fraction of the CPU time
    (the head's many small operators are called once per step instead of once per model).

    Args:
        models: :class:`VQAModel` s with the same head and configuration, on one device (trained in
            place, left in eval mode).
        data, features: as in :func:`train`.
        seeds: one seed per model (its shuffling; the global generator gets ``seeds[0]``).
        epochs, batch_size, lr, weight_decay, progress: as in :func:`train`.
        on_epoch: called as ``on_epoch(epoch, model)`` for every model after each epoch, as in
            :func:`train`.

    Returns:
        One history per model, as :func:`train` returns it (``epoch_time``: the loop's seconds per
        epoch divided among the models).

    Raises:
        TypeError: a model that is not a :class:`VQAModel`, ``seeds`` of another type, the arguments
            :func:`train` rejects.
        ValueError: no model, models with different heads or configurations, as many seeds as
            models not given, a model used twice, and what :func:`train` rejects.

    Example:
        >>> from attnopt.vqa_data import make_batch
        >>> data = make_batch(4, questions_per_scene=4)
        >>> features = encode(GridEncoder(), data)
        >>> models = [VQAModel(), VQAModel()]
        >>> histories = train_seeds(models, data, features, seeds=[0, 1],
        ...                         epochs=2, batch_size=8)
        >>> [len(h["loss"]) for h in histories]
        [2, 2]
    """
    models = checks.model_list(models, VQAModel)
    seeds = checks.seed_list(seeds, len(models))
    data, features = _questions(models[0], data, features)
    epochs, batch_size, lr, _ = checks.optimization_args(epochs, batch_size, lr, seeds[0], progress)
    weight_decay = check_number(weight_decay, "weight_decay", low=0.0)
    for model in models:
        check_same_device(features, "features", model.device_marker, "the model")
    checks.callback_arg(on_epoch, "on_epoch")
    return training.train_jointly(models, data, features, epochs, batch_size, lr, weight_decay, seeds, progress,
                                  on_epoch)


@torch.no_grad()
def evaluate(model: VQAModel, data: SyntheticVQA | VQABatch, features: torch.Tensor, *,
             batch_size: int = 500) -> dict[str, float]:
    """Accuracy overall, by answer type and by question family, and the mean attention precision.

    Args:
        model: a :class:`VQAModel` (evaluated in eval mode).
        data: the questions.
        features: ``(S, G*G, feature_dim)`` frozen features of ``data``'s scenes.
        batch_size: questions per forward pass.

    Returns:
        ``{"overall", "yes/no", "number", "other", "shape", "left", "same_shape", "count",
        "attention_precision", "n"}``: accuracies in [0, 1] (``nan`` for a type absent from
        ``data``), the mean share of the attention (:func:`attention_map` at the grid's
        resolution) on the cells of the relevant objects, and the number of questions.

    Raises:
        TypeError: ``model`` not a :class:`VQAModel`, ``data`` of another type, ``batch_size``
            not an int.
        ValueError: empty ``data``, ``features`` of another shape, ``batch_size < 1``.

    Example:
        >>> from attnopt.vqa_data import make_batch
        >>> data = make_batch(2, questions_per_scene=3)
        >>> result = evaluate(VQAModel(), data, encode(GridEncoder(), data))
        >>> result["n"], 0 <= result["overall"] <= 1
        (6, True)
    """
    data, features = _questions(model, data, features)
    batch_size = check_int(batch_size, "batch_size")
    dev = model.device_marker.device
    correct, precision = [], []
    with training.eval_mode(model):
        for s in range(0, len(data), batch_size):
            b = data.index(slice(s, s + batch_size))
            out = model(training.gather_scenes(features, b.scene).to(dev), b.questions.to(dev))
            correct.append((out.logits.argmax(-1) == b.answers.to(dev)).cpu())
            precision.append(attention_precision(attention_map(out), b.grid_masks.to(dev)).cpu())
    return training.summary(torch.cat(correct).float(), data.answer_types.cpu(), data.families.cpu(), torch.cat(precision))


@torch.no_grad()
def selection_sweep(
    model: VQAModel,
    data: SyntheticVQA | VQABatch,
    features: torch.Tensor,
    penalties: Sequence[float],
    *,
    max_components: int | None = None,
    n_init: int = 3,
    n_iter: int = 20,
    seed: int = 0,
    batch_size: int = 500,
) -> dict[float, dict]:
    r"""Test-time selection of the number of components for several penalties :math:`\lambda` of (5.20).

    For every question the model's own discrete weights are fitted once by
    :func:`attnopt.continuous.mixture.select_components` (:math:`K=1,\dots,K_{\max}`, ``n_init`` random
    initializations per :math:`K>1`); each penalty then picks :math:`K^\star` among the same fits
    (:meth:`attnopt.continuous.mixture.MixtureSelection.with_penalty`), and the model answers with the context
    of that mixture (eq. (5.5)), as test-MCA does in §6.3.1 of Farinhas (2021).  The classifier is
    the model's: use a model trained with continuous softmax (or :func:`swap_head` of one).

    Args:
        model: a :class:`VQAModel` with a continuous head (its basis, ridge operator and
            covariance floor are used; ``"mixture"``/``"mixture_selected"`` heads give
            :math:`K_{\max}`, ``n_iter`` and ``cov_floor`` defaults).
        data, features: the questions and their scenes' features.
        penalties: the values of :math:`\lambda\ge0` (per component, in units of
            :math:`-2\ell_w` with weights normalized to sum to one).
        max_components: :math:`K_{\max}` (default: the model's ``n_components``).
        n_init, n_iter: initializations per :math:`K>1` and EM iterations per fit.
        seed: seeds the random initializations.
        batch_size: questions per fit.

    Returns:
        A dict from each penalty to a dict with ``"k_star_shares"`` (the shares of
        :math:`K^\star=1,\dots,K_{\max}`, a list), the accuracies ``"overall"``, ``"yes/no"``,
        ``"number"``, ``"other"`` and per question family, and the number of questions ``"n"``.

    Raises:
        TypeError: ``model`` not a :class:`VQAModel`, ``penalties`` not a sequence of numbers,
            non-integer counts.
        ValueError: a discrete head, a negative penalty, empty ``penalties`` or a penalty given
            twice, counts below 1, ``features`` of another shape.

    Example:
        >>> from attnopt.vqa_data import make_batch
        >>> data = make_batch(2, questions_per_scene=3)
        >>> model = VQAModel("continuous_softmax")
        >>> features = encode(GridEncoder(), data)
        >>> sweep = selection_sweep(model, data, features, [0.1, 10.0],
        ...                         max_components=2, n_iter=3)
        >>> sweep[10.0]["k_star_shares"]
        [1.0, 0.0]
    """
    data, features = _questions(model, data, features)
    if model.attention is None:
        raise ValueError("model must have a continuous head (its basis and ridge operator); got 'discrete'")
    penalties = checks.penalties_arg(penalties)
    k_max = check_int(model.config["n_components"] if max_components is None else max_components, "max_components")
    n_init, n_iter = check_int(n_init, "n_init"), check_int(n_iter, "n_iter")
    seed = checks.seed_arg(seed)
    batch_size = check_int(batch_size, "batch_size")
    cov_floor = getattr(model.attention, "cov_floor", heads.cell_variance(model.grid))
    return training.sweep_penalties(model, data, features, penalties, k_max, n_init, n_iter, cov_floor, seed,
                                    batch_size)
