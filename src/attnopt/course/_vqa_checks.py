"""Argument checks of :mod:`attnopt.course.vqa` and :mod:`attnopt.course.vqa_data` (token and answer ids, images,
grid features, questions, seeds, optimization settings, model options, ground-truth masks), each
built from the checks of :mod:`attnopt._validation`, so that the public functions of the experiment
start with a line or two of checks.
"""

from __future__ import annotations

import torch

from .._validation import (
    as_float_tensor,
    broadcast_shapes,
    check_bool,
    check_choice,
    check_finite,
    check_int,
    check_nonnegative,
    check_number,
    check_same_device,
    check_shape_match,
    require,
)
from ._vqa_scenes import MAX_QUESTION_LENGTH, VOCAB


def int_ids(values, name: str, what: str) -> torch.Tensor:
    """``values`` as a tensor of integer ids (``what`` names them in the messages)."""
    try:
        t = torch.as_tensor(values)
    except (TypeError, ValueError, RuntimeError) as err:
        raise TypeError(f"{name} must be a tensor or a nested list of {what}; got {type(values).__name__}") from err
    if t.numel() == 0:
        t = t.long()
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer {what}; got dtype {t.dtype}")
    return t


def seed_arg(seed) -> int:
    """The checked seed of a :class:`torch.Generator`: an int in ``[-2**63, 2**64 - 1]``."""
    return check_int(seed, "seed", -(2**63), 2**64 - 1)


def instance_arg(value, kind: type, name: str) -> None:
    """Check that ``value`` is a ``kind`` (a :class:`~attnopt.course.vqa.GridEncoder` or
    :class:`~attnopt.course.vqa.VQAModel`); ``name`` is the argument."""
    if not isinstance(value, kind):
        raise TypeError(f"{name} must be a {kind.__name__}; got {type(value).__name__}")


def optimization_args(epochs, batch_size, lr, seed, progress) -> tuple[int, int, float, int]:
    """The checked ``(epochs, batch_size, lr, seed)`` of a training loop (``progress`` a bool)."""
    epochs, batch_size = check_int(epochs, "epochs"), check_int(batch_size, "batch_size")
    lr = check_number(lr, "lr", low=0.0, low_open=True)
    seed = seed_arg(seed)
    check_bool(progress, "progress")
    return epochs, batch_size, lr, seed


def callback_arg(callback, name: str) -> None:
    """Check that ``callback`` is callable or ``None``."""
    if callback is not None and not callable(callback):
        raise TypeError(f"{name} must be callable or None; got {type(callback).__name__}")


def images_arg(images, device_marker: torch.Tensor) -> torch.Tensor:
    """The checked ``(B, 3, H, W)`` finite images of an encoder's forward pass, on its device."""
    images = as_float_tensor(images, "images", min_ndim=4)
    if images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"images must have shape (B, 3, H, W); got {tuple(images.shape)}")
    check_same_device(images, "images", device_marker, "the encoder")
    check_finite(images, "images")
    return images


def features_arg(features, n_scenes: int, grid: int, feature_dim: int, name: str = "features") -> torch.Tensor:
    """The checked ``(S, G*G, feature_dim)`` frozen features of ``S = n_scenes`` scenes."""
    features = as_float_tensor(features, name, min_ndim=3)
    L = grid * grid
    if features.ndim != 3 or features.shape[0] != n_scenes or features.shape[1:] != (L, feature_dim):
        raise ValueError(f"{name} must have shape (S, {L}, {feature_dim}) with S = {n_scenes} scenes; "
                         f"got {tuple(features.shape)}")
    return features


def model_inputs(features, questions, grid: int, feature_dim: int, device_marker: torch.Tensor):
    """The checked ``(B, G*G, feature_dim)`` features and ``(B, T)`` questions of a model's forward pass."""
    features = as_float_tensor(features, "features", min_ndim=3)
    L = grid * grid
    if features.ndim != 3 or features.shape[1:] != (L, feature_dim):
        raise ValueError(f"features must have shape (B, {L}, {feature_dim}); got {tuple(features.shape)}")
    check_same_device(features, "features", device_marker, "the model")
    check_finite(features, "features")
    if not isinstance(questions, torch.Tensor) or questions.is_floating_point() or questions.is_complex() \
            or questions.dtype == torch.bool:
        what = f"dtype {questions.dtype}" if isinstance(questions, torch.Tensor) else type(questions).__name__
        raise TypeError(f"questions must be a tensor of integer token ids; got {what}")
    if questions.ndim != 2 or not 1 <= questions.shape[1] <= MAX_QUESTION_LENGTH:
        raise ValueError(f"questions must have shape (B, T) with 1 <= T <= {MAX_QUESTION_LENGTH}; "
                         f"got {tuple(questions.shape)}")
    check_shape_match(questions, "questions", features, "features", [(0, 0)])
    check_same_device(questions, "questions", device_marker, "the model")
    require(((questions >= 0) & (questions < len(VOCAB))).all(), f"questions must hold ids in [0, {len(VOCAB)}) (VOCAB)")
    return features, questions


def model_config(head, heads: tuple[str, ...], config: dict, mixture_options: tuple[str, ...]) -> None:
    """Check the constructor arguments of :class:`~attnopt.course.vqa.VQAModel`: ``head`` one of ``heads``,
    and ``config``, the dict of the others (``mixture_kwargs`` with keys among ``mixture_options``)."""
    check_choice(head, "head", heads)
    check_int(config["grid"], "grid", minimum=2)
    for name in ("feature_dim", "hidden", "embedding_dim", "n_basis_per_axis", "n_components"):
        check_int(config[name], name)
    check_number(config["basis_sigma"], "basis_sigma", low=0.0, low_open=True)
    check_number(config["penalty"], "penalty", low=0.0)
    check_number(config["uniform_mix"], "uniform_mix", low=0.0, high=1.0)
    mixture_kwargs_arg(config["mixture_kwargs"], mixture_options)


def head_options(options: dict, config: dict) -> None:
    """Check that the keywords ``options`` of :func:`~attnopt.course.vqa.swap_head` are among those of a
    model's ``config`` that a new head may change (not its sizes)."""
    allowed = sorted(set(config) - {"feature_dim", "grid", "hidden", "embedding_dim"})
    bad = sorted(set(options) - set(allowed))
    if bad:
        raise TypeError(f"swap_head takes head options {allowed}; got {bad}")


def mixture_kwargs_arg(mixture_kwargs, allowed: tuple[str, ...]) -> None:
    """Check that ``mixture_kwargs`` is ``None`` or a dict whose keys are among ``allowed``."""
    if mixture_kwargs is not None:
        if not isinstance(mixture_kwargs, dict):
            raise TypeError(f"mixture_kwargs must be a dict or None; got {type(mixture_kwargs).__name__}")
        unknown = sorted(set(mixture_kwargs) - set(allowed))
        if unknown:
            raise TypeError(f"mixture_kwargs has keys {unknown} that MultimodalContinuousAttention does not take "
                            f"here; it takes {allowed}")


def penalties_arg(penalties) -> list[float]:
    """The checked penalties of a selection sweep: a non-empty sequence of numbers ``>= 0``."""
    if isinstance(penalties, (str, bytes)) or not hasattr(penalties, "__iter__"):
        raise TypeError(f"penalties must be a sequence of numbers; got {type(penalties).__name__}")
    penalties = [check_number(p, "penalties", low=0.0) for p in penalties]
    if not penalties:
        raise ValueError("penalties must hold at least one value")
    if len(set(penalties)) < len(penalties):
        # the sweep reports one result per penalty, keyed by its value
        raise ValueError(f"penalties must be distinct; got {penalties}")
    return penalties


def precision_args(attention_map, gt_mask) -> tuple[torch.Tensor, torch.Tensor]:
    """The checked ``(..., H, W)`` attention map and ``(..., H', W')`` mask (as 0/1 in the map's dtype)."""
    a = as_float_tensor(attention_map, "attention_map", min_ndim=2)
    if a.shape[-2] < 1 or a.shape[-1] < 1:
        raise ValueError(f"attention_map must have shape (..., H, W) with H, W >= 1; got {tuple(a.shape)}")
    check_finite(a, "attention_map")
    check_nonnegative(a, "attention_map")
    try:
        m = torch.as_tensor(gt_mask, device=a.device)
    except (TypeError, ValueError, RuntimeError) as err:
        raise TypeError(f"gt_mask must be a tensor of bools or numbers; got {type(gt_mask).__name__}") from err
    if m.is_complex():
        raise TypeError(f"gt_mask must hold bools or real numbers; got dtype {m.dtype}")
    if m.ndim < 2 or m.shape[-2] < 1 or m.shape[-1] < 1:
        raise ValueError(f"gt_mask must have shape (..., H', W') with H', W' >= 1; got shape {tuple(m.shape)}")
    check_finite(m, "gt_mask")
    broadcast_shapes(**{"attention_map (leading dims)": a.shape[:-2], "gt_mask (leading dims)": m.shape[:-2]})
    return a, (m != 0).to(a.dtype)


def model_list(models, model_type) -> list:
    """The checked models of :func:`~attnopt.course.vqa.train_seeds`: a non-empty sequence of distinct
    ``model_type`` instances with one head and one configuration."""
    if isinstance(models, torch.nn.Module) or not isinstance(models, (list, tuple)):
        raise TypeError(f"models must be a list or tuple of VQAModel; got {type(models).__name__}")
    if not models:
        raise ValueError("models must hold at least one model")
    for i, model in enumerate(models):
        instance_arg(model, model_type, f"models[{i}]")
    if len({id(model) for model in models}) != len(models):
        raise ValueError("models must be distinct (the same model twice would take two steps at once)")
    first = models[0]
    for i, model in enumerate(models[1:], start=1):
        if model.head_name != first.head_name or model.config != first.config:
            raise ValueError(f"models[{i}] has another head or configuration than models[0] "
                             f"({model.head_name!r} and {first.head_name!r}): they share one head")
        if model.device_marker.device != first.device_marker.device:
            raise ValueError(f"models[{i}] is on {model.device_marker.device}, models[0] on {first.device_marker.device}")
    return list(models)


def seed_list(seeds, n: int) -> list[int]:
    """The checked seeds of :func:`~attnopt.course.vqa.train_seeds`: ``n`` of them."""
    if isinstance(seeds, (str, bytes)) or not isinstance(seeds, (list, tuple, range)):
        raise TypeError(f"seeds must be a list of ints; got {type(seeds).__name__}")
    if len(seeds) != n:
        raise ValueError(f"seeds must give one seed per model: {n} models, {len(seeds)} seeds")
    return [seed_arg(seed) for seed in seeds]
