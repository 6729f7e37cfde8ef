r"""A synthetic visual-question-answering task and small VQA models with swappable output attention.

Chapter 6 of Farinhas's continuous-attention thesis compares the *output attention* of a VQA model
(the step that pools a :math:`14\times14` grid of image features into one vector) across discrete
softmax, 2D continuous softmax, 2D continuous sparsemax and multimodal (mixture) continuous attention
(Tables 6.2--6.4, Figs. 6.4--6.11).  VQA-v2 and a pretrained ResNet are far too heavy for a course
book, so this module provides a *synthetic* stand-in with the same structure:

* :func:`make_batch` / :class:`SyntheticVQA` -- scenes of 2--6 coloured shapes rasterized on an RGB
  canvas, with questions of the three VQA answer types (``"yes/no"``, ``"number"``, ``"other"``),
  answers over a shared answer vocabulary, and for every question the ground-truth mask of the
  objects it is about (at canvas and at grid resolution);
* :class:`VQAModel` -- a small CNN producing a :math:`14\times14` feature grid, a GRU question
  encoder, an additive score per cell and one of the heads ``"discrete"``,
  ``"continuous_softmax"``, ``"continuous_sparsemax"``, ``"mixture"`` and ``"mixture_selected"``
  (the last two through :mod:`attnopt.mixture`, when it is importable);
* :func:`attention_map`, :func:`attention_precision`, :func:`train`, :func:`evaluate`.

Coordinates.  Grid cell :math:`(i,j)` (row :math:`i`, column :math:`j`) sits at location
:math:`t=(i,j)/(G-1)\in[0,1]^2` (``continuous.grid_locations(G)``, row-major), so the first
coordinate of a density's :math:`\mu` is the *row* (downwards) and the second the *column*.  A
canvas pixel at unit-square position :math:`u\in[0,1]^2` (row, column) is at
:math:`t=(uG-\tfrac12)/(G-1)`.  Scene objects store their centres as ``(x, y)`` = (column, row)
in the unit square.
"""

from __future__ import annotations

import importlib
import math
import sys
import time
from dataclasses import dataclass, fields, replace
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ._validation import (
    as_float_tensor,
    broadcast_shapes,
    check_bool,
    check_choice,
    check_device,
    check_finite,
    check_int,
    check_nonnegative,
    check_number,
    check_same_device,
    check_shape_match,
    require,
)
from .continuous import (
    ContinuousAttention,
    GaussianRBF,
    continuous_density,
    continuous_softmax,
    continuous_sparsemax,
    grid_locations,
    moment_match,
    padding_locations,
)

__all__ = [
    "ANSWERS",
    "ANSWER_TYPES",
    "COLOURS",
    "FAMILIES",
    "HEADS",
    "MAX_QUESTION_LENGTH",
    "SHAPES",
    "SIZES",
    "VOCAB",
    "AttentionOutput",
    "SyntheticVQA",
    "VQABatch",
    "VQAModel",
    "VQAOutput",
    "answer_text",
    "attention_map",
    "attention_precision",
    "decode",
    "evaluate",
    "make_batch",
    "mixture_available",
    "train",
]

# --------------------------------------------------------------------------------------------
# vocabularies
# --------------------------------------------------------------------------------------------

#: Colour names and their RGB values (in [0, 1]).
COLOURS: tuple[str, ...] = ("red", "green", "blue", "yellow", "purple", "cyan")
_RGB = (
    (0.90, 0.10, 0.10),
    (0.10, 0.75, 0.20),
    (0.15, 0.30, 0.95),
    (0.95, 0.90, 0.10),
    (0.60, 0.20, 0.80),
    (0.10, 0.85, 0.90),
)
_BACKGROUND = (0.15, 0.15, 0.15)
#: Shape names.
SHAPES: tuple[str, ...] = ("circle", "square", "triangle")
_PLURAL = ("circles", "squares", "triangles")
#: Size names and their radii in the unit square (circle radius; squares and triangles are scaled alike).
SIZES: tuple[str, ...] = ("small", "large")
_RADII = (0.065, 0.10)
_BOUND = 1.25  # bounding-circle radius / radius, for every shape
_MARGIN = 0.02  # minimal gap between bounding circles

#: Answer types, as in VQA-v2.
ANSWER_TYPES: tuple[str, ...] = ("yes/no", "number", "other")
#: The answer vocabulary shared by every question (yes/no, counts 1..6, colours, shapes).
ANSWERS: tuple[str, ...] = ("no", "yes", "1", "2", "3", "4", "5", "6") + COLOURS + SHAPES
_ANSWER_TYPE_OF = torch.tensor([0, 0] + [1] * 6 + [2] * (len(COLOURS) + len(SHAPES)))
_A_NO, _A_YES, _A_ONE = 0, 1, 2
_A_COLOUR = 8
_A_SHAPE = 8 + len(COLOURS)

#: The question families, each as a pair (name, answer type).
FAMILIES: tuple[tuple[str, str], ...] = (
    ("colour_of_shape", "other"),  # what colour is the <shape> ?
    ("shape_of_colour", "other"),  # what shape is the <colour> object ?
    ("count_colour", "number"),  # how many <colour> objects are there ?
    ("count_shape", "number"),  # how many <shape>s are there ?
    ("exists", "yes/no"),  # is there a <colour> <shape> ?
    ("left_of", "yes/no"),  # is the <c1> <s1> left of the <c2> <s2> ?
)
_FAMILY_PROBS = (0.2, 0.2, 0.1, 0.1, 0.2, 0.2)

#: Question-token vocabulary; id 0 is padding.
VOCAB: tuple[str, ...] = (
    "<pad>", "what", "colour", "shape", "is", "the", "object", "objects", "how", "many", "are",
    "there", "a", "left", "of", "?",
) + COLOURS + SHAPES + _PLURAL
_TOK = {w: i for i, w in enumerate(VOCAB)}
MAX_QUESTION_LENGTH = 10

#: Output-attention heads of :class:`VQAModel`.
HEADS: tuple[str, ...] = ("discrete", "continuous_softmax", "continuous_sparsemax", "mixture", "mixture_selected")


def decode(tokens) -> str | list[str]:
    """Question text of a token-id sequence ``(T,)`` (or a list of texts for ``(n, T)``); padding is dropped.

    Args:
        tokens: integer ids into :data:`VOCAB` (a tensor or a nested list), shape ``(T,)`` or ``(n, T)``.

    Returns:
        The text (``""`` for no token), or a list of ``n`` texts.

    Raises:
        TypeError: ``tokens`` not integer ids.
        ValueError: another shape, or an id outside ``[0, len(VOCAB))``.

    Example:
        >>> decode([4, 11, 12, 16, 22, 15, 0, 0])
        'is there a red circle ?'
    """
    try:
        t = torch.as_tensor(tokens)
    except (TypeError, ValueError, RuntimeError) as err:
        raise TypeError(f"tokens must be a tensor or a nested list of token ids; got {type(tokens).__name__}") from err
    if t.numel() == 0:
        t = t.long()
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise TypeError(f"tokens must hold integer token ids; got dtype {t.dtype}")
    if t.ndim not in (1, 2):
        raise ValueError(f"tokens must have shape (T,) or (n, T); got {tuple(t.shape)}")
    ids = t.reshape(-1).tolist()  # decoding reads the ids anyway
    bad = [i for i in ids if not 0 <= i < len(VOCAB)]
    if bad:
        raise ValueError(f"tokens must be ids in [0, {len(VOCAB)}) (indices into VOCAB); got {bad[0]}")
    if t.ndim == 2:
        return [" ".join(VOCAB[i] for i in row if i != 0) for row in t.tolist()]
    return " ".join(VOCAB[i] for i in ids if i != 0)


def answer_text(answers) -> str | list[str]:
    """Answer string(s) of answer id(s).

    Args:
        answers: an integer id into :data:`ANSWERS`, or a tensor/list of them (any shape).

    Returns:
        The answer for a single id (a 0-dim tensor or an int), else the flat list of answers.

    Raises:
        TypeError: ``answers`` not integer ids.
        ValueError: an id outside ``[0, len(ANSWERS))``.

    Example:
        >>> answer_text(1), answer_text([2, 8])
        ('yes', ['1', 'red'])
    """
    try:
        a = torch.as_tensor(answers)
    except (TypeError, ValueError, RuntimeError) as err:
        raise TypeError(f"answers must be an int, a tensor or a list of answer ids; got {type(answers).__name__}") from err
    if a.numel() == 0:
        a = a.long()
    if a.is_floating_point() or a.is_complex() or a.dtype == torch.bool:
        raise TypeError(f"answers must hold integer answer ids; got dtype {a.dtype}")
    ids = a.reshape(-1).tolist()
    bad = [i for i in ids if not 0 <= i < len(ANSWERS)]
    if bad:
        raise ValueError(f"answers must be ids in [0, {len(ANSWERS)}) (indices into ANSWERS); got {bad[0]}")
    return ANSWERS[ids[0]] if a.ndim == 0 else [ANSWERS[i] for i in ids]


# --------------------------------------------------------------------------------------------
# data
# --------------------------------------------------------------------------------------------


@dataclass
class VQABatch:
    """A batch of synthetic VQA examples (all tensors share the leading dimension ``n``).

    Attributes:
        images: ``(n, 3, H, W)`` float RGB canvases in ``[0, 1]``.
        questions: ``(n, T)`` long token ids (:data:`VOCAB`), right-padded with 0.
        question_lengths: ``(n,)`` long number of non-padding tokens.
        answers: ``(n,)`` long ids into :data:`ANSWERS`.
        answer_types: ``(n,)`` long ids into :data:`ANSWER_TYPES`.
        families: ``(n,)`` long ids into :data:`FAMILIES`.
        question_attributes: ``(n, 4)`` long ``(colour1, shape1, colour2, shape2)`` named in the
            question (-1 where not named).
        masks: ``(n, H, W)`` bool ground-truth mask of the objects the question is about.
        grid_masks: ``(n, G, G)`` bool: cells that overlap those objects.
        relevant: ``(n, K)`` bool: which object slots the question is about.
        present: ``(n, K)`` bool: which object slots hold an object (the scene table).
        colours: ``(n, K)`` long colour ids of the objects.
        shapes: ``(n, K)`` long shape ids of the objects.
        sizes: ``(n, K)`` long size ids of the objects.
        centres: ``(n, K, 2)`` float ``(x, y)`` = (column, row) in the unit square.
        radii: ``(n, K)`` float.
    """

    images: torch.Tensor
    questions: torch.Tensor
    question_lengths: torch.Tensor
    answers: torch.Tensor
    answer_types: torch.Tensor
    families: torch.Tensor
    question_attributes: torch.Tensor
    masks: torch.Tensor
    grid_masks: torch.Tensor
    relevant: torch.Tensor
    present: torch.Tensor
    colours: torch.Tensor
    shapes: torch.Tensor
    sizes: torch.Tensor
    centres: torch.Tensor
    radii: torch.Tensor

    def __len__(self) -> int:
        return self.answers.shape[0]

    def index(self, idx) -> "VQABatch":
        """The sub-batch at ``idx`` (an index tensor, a slice or a list)."""
        return VQABatch(**{f.name: getattr(self, f.name)[idx] for f in fields(self)})

    def to(self, device) -> "VQABatch":
        """A copy with every tensor on ``device``."""
        return VQABatch(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})

    def question_text(self, i: int) -> str:
        """Question ``i`` as text."""
        return decode(self.questions[i])

    def answer_text(self, i: int) -> str:
        """Answer ``i`` as text."""
        return ANSWERS[int(self.answers[i])]

    def scene_description(self, i: int) -> list[dict]:
        """Objects of scene ``i`` as dictionaries (colour, shape, size, x, y)."""
        out = []
        for k in torch.nonzero(self.present[i]).flatten().tolist():
            out.append(
                {
                    "colour": COLOURS[int(self.colours[i, k])],
                    "shape": SHAPES[int(self.shapes[i, k])],
                    "size": SIZES[int(self.sizes[i, k])],
                    "x": float(self.centres[i, k, 0]),
                    "y": float(self.centres[i, k, 1]),
                }
            )
        return out


def _sample_scenes(n, generator, min_objects, max_objects, n_candidates=64):
    """Scene tables, placed by vectorized rejection sampling (loop over the few object slots)."""
    dev = generator.device
    K = max_objects
    n_obj = torch.randint(min_objects, max_objects + 1, (n,), generator=generator, device=dev)
    colours = torch.randint(0, len(COLOURS), (n, K), generator=generator, device=dev)
    shapes = torch.randint(0, len(SHAPES), (n, K), generator=generator, device=dev)
    sizes = torch.randint(0, len(SIZES), (n, K), generator=generator, device=dev)
    radii = torch.tensor(_RADII, device=dev)[sizes]
    bound = radii * _BOUND
    cand = torch.rand(n, K, n_candidates, 2, generator=generator, device=dev)
    lo = bound[..., None, None]
    cand = lo + cand * (1 - 2 * lo)
    centres = torch.zeros(n, K, 2, device=dev)
    present = torch.zeros(n, K, dtype=torch.bool, device=dev)
    for k in range(K):  # object slots: at most a handful
        ok = torch.ones(n, n_candidates, dtype=torch.bool, device=dev)
        if k > 0:
            d = torch.linalg.vector_norm(cand[:, k, :, None, :] - centres[:, None, :k, :], dim=-1)  # (n, M, k)
            need = bound[:, k, None, None] + bound[:, None, :k] + _MARGIN
            clash = (d < need) & present[:, None, :k]
            ok = ~clash.any(-1)
        found = ok.any(-1)
        first = ok.to(torch.int8).argmax(-1)
        centres[:, k] = cand[:, k][torch.arange(n, device=dev), first]
        present[:, k] = found & (k < n_obj)
    return present, colours, shapes, sizes, centres, radii


def _rasterize(present, shapes, centres, radii, relevant, colours, size):
    """Paint the objects on ``(n, 3, size, size)`` canvases and return them with ``(n, size, size)`` masks.

    Vectorized over scenes, objects and pixels: every object is rasterized in a square patch
    around its centre (large enough for the largest object) and scattered into the canvas; the
    objects do not overlap, so adding their patches paints them.
    """
    dev, dt = centres.device, centres.dtype
    n, K = present.shape
    P = min(size, int(math.ceil(2 * max(_RADII) * _BOUND * size)) + 2)
    ar = torch.arange(P, device=dev)
    origin = (centres * size - P / 2).floor().long().clamp(0, size - P)  # (n, K, 2): (col, row) of the corner
    cols = origin[..., 0, None] + ar  # (n, K, P)
    rows = origin[..., 1, None] + ar
    dx = ((cols.to(dt) + 0.5) / size - centres[..., 0, None]).unsqueeze(-2)  # (n, K, 1, P)
    dy = ((rows.to(dt) + 0.5) / size - centres[..., 1, None]).unsqueeze(-1)  # (n, K, P, 1)
    r = radii[..., None, None]
    circle = dx * dx + dy * dy <= r * r
    square = torch.maximum(dx.abs(), dy.abs()) <= 0.85 * r
    # triangle with its apex up: rows from -r (apex) to 0.75 r (base), half-width growing to r
    triangle = (dy >= -r) & (dy <= 0.75 * r) & (dx.abs() <= (dy + r) / 1.75)
    s = shapes[..., None, None]
    occ = torch.where(s == 0, circle, torch.where(s == 1, square, triangle)) & present[..., None, None]
    flat = (rows.unsqueeze(-1) * size + cols.unsqueeze(-2)).reshape(n, 1, K * P * P)  # (n, 1, K P P)
    rgb = torch.tensor(_RGB, device=dev, dtype=dt)
    bg = torch.tensor(_BACKGROUND, device=dev, dtype=dt)
    paint = occ.unsqueeze(2).to(dt) * (rgb[colours] - bg)[..., None, None]  # (n, K, 3, P, P)
    paint = paint.transpose(1, 2).reshape(n, 3, K * P * P)
    images = bg[:, None].expand(n, 3, size * size).clone().scatter_add_(-1, flat.expand(n, 3, -1), paint)
    rel = (occ & relevant[..., None, None]).to(dt).reshape(n, 1, K * P * P)
    masks = torch.zeros(n, 1, size * size, device=dev, dtype=dt).scatter_add_(-1, flat, rel) > 0
    return images.reshape(n, 3, size, size), masks.reshape(n, size, size)


def _choose(u: float, options: Sequence):
    return options[min(int(u * len(options)), len(options) - 1)]


def _make_question(objs, u):
    """One question about a scene ``objs`` = [(slot, colour, shape, x)], from uniforms ``u``.

    Returns ``(family, tokens, answer, relevant_slots, attributes)``.
    """
    cum, f = 0.0, len(_FAMILY_PROBS) - 1
    for j, p in enumerate(_FAMILY_PROBS):
        cum += p
        if u[0] < cum:
            f = j
            break
    colour_count, shape_count, pair_count = {}, {}, {}
    for _, c, s, _ in objs:
        colour_count[c] = colour_count.get(c, 0) + 1
        shape_count[s] = shape_count.get(s, 0) + 1
        pair_count[(c, s)] = pair_count.get((c, s), 0) + 1
    for attempt in range(len(FAMILIES)):  # fall back to the next family when infeasible
        fam = (f + attempt) % len(FAMILIES)
        if fam == 0:
            cands = [o for o in objs if shape_count[o[2]] == 1]
            if cands:
                k, c, s, _ = _choose(u[1], cands)
                toks = ["what", "colour", "is", "the", SHAPES[s], "?"]
                return fam, toks, _A_COLOUR + c, [k], (-1, s, -1, -1)
        elif fam == 1:
            cands = [o for o in objs if colour_count[o[1]] == 1]
            if cands:
                k, c, s, _ = _choose(u[1], cands)
                toks = ["what", "shape", "is", "the", COLOURS[c], "object", "?"]
                return fam, toks, _A_SHAPE + s, [k], (c, -1, -1, -1)
        elif fam == 2:
            _, c, _, _ = _choose(u[1], objs)  # size-biased: larger counts are more frequent
            rel = [o[0] for o in objs if o[1] == c]
            toks = ["how", "many", COLOURS[c], "objects", "are", "there", "?"]
            return fam, toks, _A_ONE + len(rel) - 1, rel, (c, -1, -1, -1)
        elif fam == 3:
            _, _, s, _ = _choose(u[1], objs)
            rel = [o[0] for o in objs if o[2] == s]
            toks = ["how", "many", _PLURAL[s], "are", "there", "?"]
            return fam, toks, _A_ONE + len(rel) - 1, rel, (-1, s, -1, -1)
        elif fam == 4:
            _, c, s, _ = _choose(u[1], objs)
            if u[2] < 0.5:  # yes: name an object of the scene
                rel = [o[0] for o in objs if o[1] == c and o[2] == s]
                ans = _A_YES
            else:  # no: change the shape (keep the colour) or the colour (keep the shape)
                new_s = [t for t in range(len(SHAPES)) if (c, t) not in pair_count]
                new_c = [t for t in range(len(COLOURS)) if (t, s) not in pair_count]
                if new_s and (u[3] < 0.5 or not new_c):
                    s = _choose(u[4], new_s)
                    rel = [o[0] for o in objs if o[1] == c]
                else:
                    c = _choose(u[4], new_c)
                    rel = [o[0] for o in objs if o[2] == s]
                ans = _A_NO
            toks = ["is", "there", "a", COLOURS[c], SHAPES[s], "?"]
            return fam, toks, ans, rel, (c, s, -1, -1)
        else:
            uniq = [o for o in objs if pair_count[(o[1], o[2])] == 1]
            pairs = [(a, b) for i, a in enumerate(uniq) for b in uniq[i + 1 :] if abs(a[3] - b[3]) > 0.05]
            if pairs:
                a, b = _choose(u[1], pairs)
                if a[3] > b[3]:
                    a, b = b, a  # now a is left of b
                ans = _A_YES
                if u[2] >= 0.5:
                    a, b, ans = b, a, _A_NO
                toks = ["is", "the", COLOURS[a[1]], SHAPES[a[2]], "left", "of", "the", COLOURS[b[1]], SHAPES[b[2]], "?"]
                return fam, toks, ans, [a[0], b[0]], (a[1], a[2], b[1], b[2])
    raise AssertionError("unreachable: the 'exists' family is always feasible")


def make_batch(
    n: int,
    generator: torch.Generator | None = None,
    *,
    canvas: int = 56,
    grid: int = 14,
    min_objects: int = 2,
    max_objects: int = 6,
    noise: float = 0.0,
    chunk: int = 512,
) -> VQABatch:
    r"""Generate ``n`` synthetic VQA examples (scenes, questions, answers, ground-truth masks).

    Each scene holds 2--6 non-overlapping objects (a shape from :data:`SHAPES`, a colour from
    :data:`COLOURS`, a size from :data:`SIZES`) on a dark ``canvas``:math:`\times`\ ``canvas`` RGB
    canvas.  Each question comes from one of the :data:`FAMILIES` (drawn with probabilities
    0.2/0.2 "other", 0.1/0.1 "number", 0.2/0.2 "yes/no"; an infeasible family for a scene falls
    back to the next one), is answerable by construction (referents are unique where the question
    presupposes it) and the yes/no questions are balanced 50/50.  For "no" answers to *"is there a
    <colour> <shape>?"* the relevant objects are those sharing the kept attribute (the ones a
    model must inspect to answer).  The grid mask marks the :math:`G\times G` cells (each
    ``canvas / G`` pixels wide) that overlap a relevant object.

    Args:
        n: number of examples.
        generator: a seeded :class:`torch.Generator` (its device is the device of the output);
            ``None`` uses a fresh generator seeded with 0.
        canvas: side of the canvas in pixels (a multiple of ``grid``).
        grid: side of the feature grid (14 in the thesis).
        min_objects, max_objects: range of the number of objects per scene.
        noise: standard deviation of Gaussian pixel noise (0 for exact colours).
        chunk: scenes rasterized at once (bounds memory).

    Returns:
        A :class:`VQABatch`.

    Raises:
        ValueError: on non-positive sizes, ``canvas`` not a multiple of ``grid``, an object range
            outside ``1 <= min_objects <= max_objects <= 8`` or a negative ``noise``.
        TypeError: non-integer sizes or object counts, a ``generator`` that is not one.
    """
    for name, v in (("n", n), ("canvas", canvas), ("grid", grid), ("chunk", chunk)):
        check_int(v, name)
    if canvas % grid:
        raise ValueError(f"canvas must be a multiple of grid={grid}; got canvas={canvas}")
    max_objects = check_int(max_objects, "max_objects", 1, 8)
    min_objects = check_int(min_objects, "min_objects", 1, max_objects)
    noise = check_number(noise, "noise", low=0.0)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None; got {type(generator).__name__}")
    if generator is None:
        generator = torch.Generator().manual_seed(0)
    dev = generator.device
    present, colours, shapes, sizes, centres, radii = _sample_scenes(n, generator, min_objects, max_objects)
    u = torch.rand(n, 5, generator=generator, device=dev).tolist()

    # questions: a little Python per example over at most max_objects objects
    pres_l, col_l, shp_l, x_l = present.tolist(), colours.tolist(), shapes.tolist(), centres[..., 0].tolist()
    K = max_objects
    questions, lengths, answers, families, attrs, relevant = [], [], [], [], [], []
    for i in range(n):
        objs = [(k, col_l[i][k], shp_l[i][k], x_l[i][k]) for k in range(K) if pres_l[i][k]]
        fam, toks, ans, rel, at = _make_question(objs, u[i])
        ids = [_TOK[w] for w in toks]
        questions.append(ids + [0] * (MAX_QUESTION_LENGTH - len(ids)))
        lengths.append(len(ids))
        answers.append(ans)
        families.append(fam)
        attrs.append(at)
        relevant.append([k in rel for k in range(K)])
    questions, lengths, answers, families, attrs, relevant = (
        torch.tensor(t, dtype=torch.bool if t is relevant else torch.long)
        for t in (questions, lengths, answers, families, attrs, relevant)
    )
    questions, lengths, answers, families, attrs, relevant = (
        t.to(dev) for t in (questions, lengths, answers, families, attrs, relevant)
    )

    images, masks = [], []
    for s in range(0, n, chunk):  # chunks bound the (chunk, K, 3, P, P) patch tensor
        sl = slice(s, s + chunk)
        im, m = _rasterize(present[sl], shapes[sl], centres[sl], radii[sl], relevant[sl], colours[sl], canvas)
        images.append(im)
        masks.append(m)
    images, masks = torch.cat(images), torch.cat(masks)
    if noise > 0:
        images = (images + noise * torch.randn(images.shape, generator=generator, device=dev)).clamp(0, 1)
    cell = canvas // grid
    grid_masks = F.max_pool2d(masks[:, None].float(), cell)[:, 0] > 0
    return VQABatch(
        images=images,
        questions=questions,
        question_lengths=lengths,
        answers=answers,
        answer_types=_ANSWER_TYPE_OF.to(dev)[answers],
        families=families,
        question_attributes=attrs,
        masks=masks,
        grid_masks=grid_masks,
        relevant=relevant,
        present=present,
        colours=colours,
        shapes=shapes,
        sizes=sizes,
        centres=centres,
        radii=radii,
    )


class SyntheticVQA(torch.utils.data.Dataset):
    """``n_samples`` synthetic VQA examples generated once from ``seed`` (see :func:`make_batch`).

    ``dataset[i]`` is a dict of per-example tensors; ``dataset.batch(idx)`` a :class:`VQABatch`;
    ``dataset.data`` the whole :class:`VQABatch`.  Two datasets with the same arguments are equal.

    Args:
        n_samples: number of examples.
        seed: seed of the :class:`torch.Generator`.
        canvas, grid, min_objects, max_objects, noise: as in :func:`make_batch`.
        device: where the tensors live (the generator runs on CPU, so data are identical on
            every device).

    Raises:
        TypeError, ValueError: as :func:`make_batch` (``n_samples`` for ``n``); a ``seed`` that is
            not an int in ``[-2**63, 2**64 - 1]``; a ``device`` this machine does not have.
    """

    def __init__(
        self,
        n_samples: int,
        seed: int = 0,
        *,
        canvas: int = 56,
        grid: int = 14,
        min_objects: int = 2,
        max_objects: int = 6,
        noise: float = 0.0,
        device: torch.device | str | None = None,
    ):
        n_samples = check_int(n_samples, "n_samples")
        seed = check_int(seed, "seed", -(2**63), 2**64 - 1)
        if device is not None:
            device = check_device(device, "device")
        g = torch.Generator().manual_seed(seed)
        self.data = make_batch(
            n_samples, g, canvas=canvas, grid=grid, min_objects=min_objects, max_objects=max_objects, noise=noise
        )
        if device is not None:
            self.data = self.data.to(device)
        self.seed, self.canvas, self.grid = int(seed), canvas, grid

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self.data, f.name)[i] for f in fields(self.data)}

    def batch(self, idx) -> VQABatch:
        """The examples at ``idx`` as a :class:`VQABatch`."""
        return self.data.index(idx)


# --------------------------------------------------------------------------------------------
# attention heads
# --------------------------------------------------------------------------------------------


@dataclass
class AttentionOutput:
    r"""What an output-attention head attended to, for plotting and evaluation.

    Attributes:
        kind: the head name (one of :data:`HEADS`).
        scores_softmax: ``(B, G, G)`` the discrete softmax of the cell scores (for the
            ``"discrete"`` head this *is* the attention; for the others it is the input of moment
            matching / EM).
        family: ``None`` (discrete), ``"gaussian"`` or ``"truncated_paraboloid"``.
        mu: ``(B, K, 2)`` component locations (row, column) in grid coordinates, or ``None``.
        Sigma: ``(B, K, 2, 2)`` component scale matrices (covariances for Gaussians), or ``None``.
        mix: ``(B, K)`` mixture weights (zeros for unused components; ones for ``K=1``), or ``None``.
        grid: the grid side :math:`G`.
    """

    kind: str
    scores_softmax: torch.Tensor
    family: str | None = None
    mu: torch.Tensor | None = None
    Sigma: torch.Tensor | None = None
    mix: torch.Tensor | None = None
    grid: int = 14

    @property
    def n_components(self) -> torch.Tensor | None:
        """``(B,)`` number of components with positive weight (``None`` for discrete attention)."""
        return None if self.mix is None else (self.mix > 0).sum(-1)

    def detach(self) -> "AttentionOutput":
        """A copy with every tensor detached."""
        return replace(
            self, **{k: getattr(self, k).detach() for k in ("scores_softmax", "mu", "Sigma", "mix") if getattr(self, k) is not None}
        )


class _DiscreteHead(nn.Module):
    def __init__(self, grid):
        super().__init__()
        self.grid = grid

    def forward(self, scores, values):
        p = torch.softmax(scores, -1)
        ctx = torch.einsum("bl,bld->bd", p, values)
        return ctx, AttentionOutput("discrete", p.unflatten(-1, (self.grid, self.grid)), grid=self.grid)


class _ContinuousHead(nn.Module):
    """Moment matching + continuous softmax/sparsemax + ridge value function (§6.2.2)."""

    def __init__(self, kind, grid, n_basis_per_axis, basis_sigma, penalty, uniform_mix, n_quadrature):
        super().__init__()
        self.kind, self.grid, self.uniform_mix, self.n_quadrature = kind, grid, uniform_mix, n_quadrature
        self.family = "gaussian" if kind == "continuous_softmax" else "truncated_paraboloid"
        basis = GaussianRBF.grid(n_basis_per_axis, basis_sigma, dim=2)
        # the module holds the basis, the locations and the (padded) ridge operator G of eq. (3.17)
        self.attn = ContinuousAttention(
            basis, grid_locations(grid), family=self.family, penalty=penalty, padding=True, n_quadrature=n_quadrature
        )

    def forward(self, scores, values):
        p = torch.softmax(scores, -1)
        L = p.shape[-1]
        q = (1 - self.uniform_mix) * p + self.uniform_mix / L  # keeps the covariance away from 0
        mu, Sigma = moment_match(q, self.attn.locations.to(q), self.family)
        basis = self.attn.basis
        if self.family == "gaussian":
            r = continuous_softmax(mu, Sigma, basis)
        else:
            r = continuous_sparsemax(mu, Sigma, basis, self.n_quadrature)
        B = torch.einsum("bld,ln->bdn", values, self.attn.ridge_operator.to(values))
        ctx = (B @ r.unsqueeze(-1)).squeeze(-1)
        att = AttentionOutput(
            self.kind,
            p.unflatten(-1, (self.grid, self.grid)),
            family=self.family,
            mu=mu.unsqueeze(-2),
            Sigma=Sigma.unsqueeze(-3),
            mix=torch.ones_like(mu[..., :1]),
            grid=self.grid,
        )
        return ctx, att


def mixture_available() -> bool:
    """Whether :mod:`attnopt.mixture` (multimodal continuous attention) can be imported.

    Always true: the module is part of the package (kept for code written when it was optional).
    """
    try:
        importlib.import_module("attnopt.mixture")
    except ImportError:
        return False
    return True


#: The keyword arguments of :class:`attnopt.mixture.MultimodalContinuousAttention` a
#: :class:`VQAModel` passes on through ``mixture_kwargs``.
_MIXTURE_KWARGS = ("cov_floor", "differentiate_em", "init", "max_components", "n_init", "n_iter", "padding", "penalty",
                   "selection_penalty")


def _density_parts(density):
    """``(mix, mu, Sigma)`` from whatever a multimodal head returns as its density."""
    if isinstance(density, dict):
        get = density.get
        return get("weights", get("pi", get("mix"))), get("mu", get("means")), get("Sigma", get("covariances"))
    if isinstance(density, (tuple, list)) and len(density) == 3:
        return tuple(density)
    for names in (("weights", "mu", "Sigma"), ("pi", "mu", "Sigma"), ("mix", "mu", "Sigma")):
        if all(hasattr(density, a) for a in names):
            return tuple(getattr(density, a) for a in names)
    raise TypeError(f"cannot read (weights, mu, Sigma) from a multimodal density of type {type(density).__name__}")


class _MixtureHead(nn.Module):
    r"""Adapter to :class:`attnopt.mixture.MultimodalContinuousAttention` (K-MCA or test-MCA).

    ``"mixture"`` builds it with ``n_components=K`` (weighted EM with a fixed number of
    iterations, differentiated end to end); ``"mixture_selected"`` with ``n_components="auto"``
    and ``max_components=K`` (:func:`attnopt.mixture.select_components` picks :math:`K^\star` per
    example; unused components have mixing weight 0).  As in the unimodal heads the softmax is
    mixed with the uniform distribution (passed as scores :math:`\log q`, whose softmax is
    :math:`q`) and the ridge regression uses padding.  The mixture module is imported lazily, so
    :mod:`attnopt.vqa` works without it; only this class touches its API.
    """

    def __init__(self, kind, grid, n_basis_per_axis, basis_sigma, penalty, uniform_mix, n_components, mixture_kwargs):
        super().__init__()
        try:
            mixture = importlib.import_module("attnopt.mixture")
        except ImportError as err:
            raise ImportError(f"head={kind!r} needs attnopt.mixture, which is not importable: {err}") from err
        self.kind, self.grid, self.uniform_mix = kind, grid, uniform_mix
        basis = GaussianRBF.grid(n_basis_per_axis, basis_sigma, dim=2)
        kw = dict(mixture_kwargs or {})
        kw.setdefault("penalty", penalty)
        kw.setdefault("padding", padding_locations(grid, 2))
        if kind == "mixture_selected":
            kw.setdefault("max_components", n_components)
            n_components = "auto"
        self.attn = mixture.MultimodalContinuousAttention(basis, grid_locations(grid), n_components, **kw)

    def forward(self, scores, values):
        p = torch.softmax(scores, -1)
        q = (1 - self.uniform_mix) * p + self.uniform_mix / p.shape[-1]
        ctx, density = self.attn(torch.log(q), values, return_mixture=True)
        mix, mu, Sigma = _density_parts(density)
        att = AttentionOutput(
            self.kind, p.unflatten(-1, (self.grid, self.grid)), family="gaussian", mu=mu, Sigma=Sigma, mix=mix, grid=self.grid
        )
        return ctx, att


# --------------------------------------------------------------------------------------------
# the model
# --------------------------------------------------------------------------------------------


@dataclass
class VQAOutput:
    """Output of :class:`VQAModel`: answer ``logits (B, len(ANSWERS))`` and the :class:`AttentionOutput`."""

    logits: torch.Tensor
    attention: AttentionOutput


class VQAModel(nn.Module):
    r"""A small VQA model whose output attention is one of :data:`HEADS`.

    Image: three 3\ :math:`\times`\ 3 convolutions with batch norm (two with stride 2), adaptive
    average pooling to :math:`G\times G`, a 1\ :math:`\times`\ 1 convolution, the mean colour of
    each cell, batch norm, and the cell's two coordinates (so that the pooled feature can say *where* it looked), giving
    :math:`L=G^2` features :math:`h_l`.  Question: token embeddings and an MLP (or a GRU), giving
    :math:`q`.  Scores (product fusion)
    :math:`s_l = w^\top(\operatorname{relu}(W_h h_l)\odot W_q q)`; the head pools the features into a context
    :math:`c` (discrete: :math:`c=\sum_l\operatorname{softmax}(s)_l h_l`; continuous:
    :math:`c=B\,\mathbb E_p[\psi(t)]`, §6.2.2 of the thesis); the answer logits are an MLP of
    :math:`[W_c c\odot W_q' q,\ q]`.

    Args:
        head: one of :data:`HEADS`.
        grid: side :math:`G` of the feature grid.
        channels: CNN width.
        feature_dim: dimension of the CNN features (3 colour and 2 coordinate channels are appended).
        hidden: question-encoder and fusion width.
        n_basis_per_axis, basis_sigma: the RBF basis of the continuous heads
            (``10`` and ``0.001 ** 0.5``: the :math:`N=100` basis of Table 6.1).
        penalty: ridge penalty (0.01).
        uniform_mix: weight :math:`\epsilon` of the uniform distribution mixed into the softmax
            before moment matching, :math:`(1-\epsilon)p+\epsilon/L`, which keeps the fitted
            covariance positive definite when the softmax collapses on one cell.
        n_quadrature: angular nodes for 2D continuous sparsemax; ``None`` (default) is the adaptive
            rule of :func:`attnopt.continuous.continuous_sparsemax`, accurate to its tolerance in
            the forward pass and the gradient (a fixed 64 nodes is as fast on a CPU but off by up
            to 6e-3 in the gradient on elongated ellipses).
        n_components: :math:`K` for ``"mixture"`` (the maximum :math:`K_{\max}` for ``"mixture_selected"``).
        mixture_kwargs: extra keyword arguments for
            :class:`attnopt.mixture.MultimodalContinuousAttention` (``n_iter``, ``init``,
            ``selection_penalty``, ``n_init``, ``cov_floor``, ``differentiate_em``, ...).
        question_encoder: ``"mlp"`` (token embeddings concatenated over the
            ``MAX_QUESTION_LENGTH`` positions, then an MLP: cheap, and order-aware because the
            templates are) or ``"gru"`` (embedding + GRU, slower on CPU).

    Raises:
        ValueError: on an unknown ``head`` or ``question_encoder``, sizes below 1 (``grid``
            below 2), a non-positive ``basis_sigma``, a negative ``penalty``, ``uniform_mix``
            outside ``[0, 1]``.
        TypeError: non-integer sizes, ``mixture_kwargs`` not a dict or with a key
            :class:`~attnopt.mixture.MultimodalContinuousAttention` does not take.
    """

    def __init__(
        self,
        head: str = "discrete",
        *,
        grid: int = 14,
        channels: int = 16,
        feature_dim: int = 64,
        hidden: int = 128,
        n_basis_per_axis: int = 10,
        basis_sigma: float = 0.001**0.5,
        penalty: float = 0.01,
        uniform_mix: float = 0.01,
        n_quadrature: int | None = None,
        n_components: int = 2,
        mixture_kwargs: dict[str, Any] | None = None,
        question_encoder: str = "mlp",
    ):
        super().__init__()
        check_choice(head, "head", HEADS)
        check_choice(question_encoder, "question_encoder", ("mlp", "gru"))
        check_int(grid, "grid", minimum=2)
        for name, value in (("channels", channels), ("feature_dim", feature_dim), ("hidden", hidden),
                            ("n_basis_per_axis", n_basis_per_axis), ("n_components", n_components)):
            check_int(value, name)
        check_number(basis_sigma, "basis_sigma", low=0.0, low_open=True)
        check_number(penalty, "penalty", low=0.0)
        check_number(uniform_mix, "uniform_mix", low=0.0, high=1.0)
        if mixture_kwargs is not None:
            if not isinstance(mixture_kwargs, dict):
                raise TypeError(f"mixture_kwargs must be a dict or None; got {type(mixture_kwargs).__name__}")
            unknown = sorted(set(mixture_kwargs) - set(_MIXTURE_KWARGS))
            if unknown:
                raise TypeError(f"mixture_kwargs has keys {unknown} that MultimodalContinuousAttention does not take; "
                                f"it takes {_MIXTURE_KWARGS}")
        self.head_name, self.grid = head, grid
        c = channels
        self.cnn = nn.Sequential(
            nn.Conv2d(3, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU(),
            nn.Conv2d(c, 2 * c, 3, stride=2, padding=1), nn.BatchNorm2d(2 * c), nn.ReLU(),
            nn.Conv2d(2 * c, 2 * c, 3, stride=2, padding=1), nn.BatchNorm2d(2 * c), nn.ReLU(),
        )
        self.proj = nn.Conv2d(2 * c, feature_dim, 1)
        # batch norm over batch and cells makes the cell-to-cell differences O(1): without it the
        # attention scores start almost constant and the attention barely learns
        self.norm = nn.BatchNorm2d(feature_dim + 3)
        d = feature_dim + 5
        self.question_encoder = question_encoder
        self.embed = nn.Embedding(len(VOCAB), 32, padding_idx=0)
        if question_encoder == "gru":
            self.gru = nn.GRU(32, hidden, batch_first=True)
        else:
            self.q_mlp = nn.Sequential(nn.Linear(32 * MAX_QUESTION_LENGTH, hidden), nn.ReLU(), nn.Linear(hidden, hidden))
        self.att_h = nn.Linear(d, hidden)
        self.att_q = nn.Linear(hidden, hidden)
        self.att_w = nn.Linear(hidden, 1)
        self.fuse_c = nn.Linear(d, hidden)
        self.fuse_q = nn.Linear(hidden, hidden)
        self.classifier = nn.Sequential(nn.Linear(2 * hidden, hidden), nn.ReLU(), nn.Linear(hidden, len(ANSWERS)))
        self.register_buffer("coords", grid_locations(grid))  # (L, 2): (row, col) in [0, 1]
        if head == "discrete":
            self.head = _DiscreteHead(grid)
        elif head in ("continuous_softmax", "continuous_sparsemax"):
            self.head = _ContinuousHead(head, grid, n_basis_per_axis, basis_sigma, penalty, uniform_mix, n_quadrature)
        else:
            self.head = _MixtureHead(
                head, grid, n_basis_per_axis, basis_sigma, penalty, uniform_mix, n_components, mixture_kwargs
            )

    def encode_image(self, images: torch.Tensor) -> torch.Tensor:
        """``(B, 3, H, W) -> (B, L, d)`` grid features (row-major cells; mean RGB and coordinates appended)."""
        x = self.proj(F.adaptive_avg_pool2d(self.cnn(images), self.grid))
        x = self.norm(torch.cat([x, F.adaptive_avg_pool2d(images, self.grid)], 1))  # (B, f + 3, G, G)
        x = x.flatten(2).transpose(1, 2)  # (B, L, f + 3)
        coords = self.coords.to(x).expand(x.shape[0], -1, -1)
        return torch.cat([x, coords], -1)

    def encode_question(self, questions: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """``(B, T)`` token ids -> ``(B, hidden)``: MLP of the concatenated (position-aware) embeddings,
        or the GRU state after the last non-padding token."""
        if questions.shape[-1] > MAX_QUESTION_LENGTH:
            raise ValueError(f"questions must have at most {MAX_QUESTION_LENGTH} tokens; got {questions.shape[-1]}")
        e = self.embed(questions)
        if self.question_encoder == "mlp":
            e = F.pad(e, (0, 0, 0, MAX_QUESTION_LENGTH - e.shape[-2]))
            return self.q_mlp(e.flatten(-2))
        out, _ = self.gru(e)
        if lengths is None:
            lengths = (questions != 0).sum(-1)
        idx = (lengths.clamp_min(1) - 1).to(out.device)
        return out[torch.arange(out.shape[0], device=out.device), idx]

    def forward(self, images: torch.Tensor, questions: torch.Tensor, question_lengths: torch.Tensor | None = None) -> VQAOutput:
        """Answer logits and attention for a batch (see :class:`VQAOutput`).

        Args:
            images: ``(B, 3, H, W)`` finite float images.
            questions: ``(B, T)`` integer token ids in ``[0, len(VOCAB))``, ``T <= MAX_QUESTION_LENGTH``.
            question_lengths: ``None`` or ``(B,)`` integers in ``[0, T]`` (read by the GRU encoder).
                All on the model's device.

        Raises:
            TypeError: non-float ``images``, non-integer ``questions`` or ``question_lengths``.
            ValueError: shapes other than these, another device, NaN or infinite ``images``, ids
                or lengths out of range.
        """
        images = as_float_tensor(images, "images", min_ndim=4)
        if images.ndim != 4 or images.shape[1] != 3:
            raise ValueError(f"images must have shape (B, 3, H, W); got {tuple(images.shape)}")
        check_same_device(images, "images", self.coords, "the model")
        check_finite(images, "images")
        if not isinstance(questions, torch.Tensor) or questions.is_floating_point() or questions.is_complex() \
                or questions.dtype == torch.bool:
            what = f"dtype {questions.dtype}" if isinstance(questions, torch.Tensor) else type(questions).__name__
            raise TypeError(f"questions must be a tensor of integer token ids; got {what}")
        if questions.ndim != 2 or not 1 <= questions.shape[1] <= MAX_QUESTION_LENGTH:
            raise ValueError(f"questions must have shape (B, T) with 1 <= T <= {MAX_QUESTION_LENGTH}; got {tuple(questions.shape)}")
        check_shape_match(questions, "questions", images, "images", [(0, 0)])
        check_same_device(questions, "questions", self.coords, "the model")
        require(((questions >= 0) & (questions < len(VOCAB))).all(), f"questions must hold ids in [0, {len(VOCAB)}) (VOCAB)")
        if question_lengths is not None:
            if not isinstance(question_lengths, torch.Tensor) or question_lengths.is_floating_point() \
                    or question_lengths.is_complex() or question_lengths.dtype == torch.bool:
                raise TypeError("question_lengths must be None or a tensor of integer lengths")
            if question_lengths.shape != questions.shape[:1]:
                raise ValueError(f"question_lengths must have shape (B,)=({questions.shape[0]},); got {tuple(question_lengths.shape)}")
            check_same_device(question_lengths, "question_lengths", self.coords, "the model")
            require(((question_lengths >= 0) & (question_lengths <= questions.shape[1])).all(),
                    f"question_lengths must be in [0, {questions.shape[1]}] (the number of tokens)")
        h = self.encode_image(images)
        q = self.encode_question(questions, question_lengths)
        scores = self.att_w(F.relu(self.att_h(h)) * self.att_q(q).unsqueeze(1)).squeeze(-1)  # (B, L)
        ctx, att = self.head(scores, h)
        z = torch.cat([F.relu(self.fuse_c(ctx)) * F.relu(self.fuse_q(q)), q], -1)
        return VQAOutput(self.classifier(z), att)

    def forward_batch(self, batch: VQABatch) -> VQAOutput:
        """``forward`` on a :class:`VQABatch` (moved to the model's device)."""
        dev = self.coords.device
        return self(batch.images.to(dev), batch.questions.to(dev), batch.question_lengths.to(dev))


# --------------------------------------------------------------------------------------------
# attention maps and precision
# --------------------------------------------------------------------------------------------


def attention_map(output: VQAOutput | AttentionOutput, resolution: int | None = None) -> torch.Tensor:
    r"""The attention as a probability distribution over a ``resolution``:math:`^2` grid of the image.

    Discrete attention: the softmax weights (``resolution == G``), or their nearest-neighbour
    upsampling renormalized.  Continuous heads: the density
    :math:`p(t)=\sum_k\pi_k\,p_k(t)` (Gaussian, eq. (3.12), or truncated paraboloid, eq. (3.14),
    of the thesis) evaluated at the cell centres of a ``resolution``-grid over the image and
    normalized to sum to one over those cells -- i.e. the density restricted to the image.  A
    truncated paraboloid is exactly zero outside its ellipse.

    Args:
        output: a :class:`VQAOutput` or :class:`AttentionOutput`.
        resolution: side of the output grid (default: the feature grid :math:`G`).

    Returns:
        ``(B, resolution, resolution)`` non-negative tensor summing to one per example (all zeros
        only in the degenerate case of a sparse support that contains no cell centre).

    Raises:
        TypeError: ``output`` of another type, ``resolution`` not an int.
        ValueError: ``resolution < 1``.
    """
    att = output.attention if isinstance(output, VQAOutput) else output
    if not isinstance(att, AttentionOutput):
        raise TypeError(f"output must be a VQAOutput or AttentionOutput; got {type(output).__name__}")
    G = att.grid
    res = G if resolution is None else check_int(resolution, "resolution")
    if att.mu is None:
        w = att.scores_softmax
        if res != G:
            w = F.interpolate(w.unsqueeze(1), size=(res, res), mode="nearest").squeeze(1)
        return w / w.sum((-2, -1), keepdim=True)
    mu, Sigma, mix = att.mu, att.Sigma, att.mix
    u = (torch.arange(res, device=mu.device, dtype=mu.dtype) + 0.5) / res
    t1 = (u * G - 0.5) / (G - 1)  # image unit coordinate -> grid location coordinate
    tt = torch.stack(torch.meshgrid(t1, t1, indexing="ij"), -1).reshape(-1, 2)  # (P, 2) (row, col)
    used = mix > 0
    eye = torch.eye(2, device=mu.device, dtype=mu.dtype)
    # unused (zero-weight) components may carry placeholder parameters: evaluate them as N(0, I)
    Sigma_safe = torch.where(used[..., None, None], Sigma, eye)
    mu_safe = torch.where(used[..., None], mu, torch.zeros_like(mu))
    dens = continuous_density(tt[:, None, None, :], mu_safe, Sigma_safe, att.family or "gaussian")  # (P, B, K)
    dens = (dens * torch.where(used, mix, torch.zeros_like(mix))).sum(-1)  # (P, B)
    m = dens.T.reshape(-1, res, res)
    total = m.sum((-2, -1), keepdim=True)
    return m / total.clamp_min(torch.finfo(m.dtype).tiny)


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
    """
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
    m = (m != 0).to(a.dtype)
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


# --------------------------------------------------------------------------------------------
# training and evaluation
# --------------------------------------------------------------------------------------------


def _as_batch(data, name: str = "data") -> VQABatch:
    if isinstance(data, SyntheticVQA):
        data = data.data
    elif not isinstance(data, VQABatch):
        raise TypeError(f"{name} must be a SyntheticVQA or VQABatch; got {type(data).__name__}")
    if len(data) == 0:
        raise ValueError(f"{name} must hold at least one example")
    return data


class _Progress:
    """tqdm when importable, else a one-line printer."""

    def __init__(self, total, desc, enabled):
        self.bar, self.total, self.n, self.desc, self.enabled = None, total, 0, desc, enabled
        self.t0, self.last = time.time(), 0.0
        if enabled:
            try:
                from tqdm.auto import tqdm

                self.bar = tqdm(total=total, desc=desc, leave=True)
            except ImportError:
                self.bar = None

    def update(self, postfix: str):
        self.n += 1
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.set_postfix_str(postfix, refresh=False)
            self.bar.update(1)
        elif time.time() - self.last > 1.0 or self.n == self.total:
            self.last = time.time()
            print(f"\r{self.desc}: {self.n}/{self.total} {postfix} [{time.time() - self.t0:.0f}s]", end="", file=sys.stderr)

    def close(self):
        if self.bar is not None:
            self.bar.close()
        elif self.enabled:
            print(file=sys.stderr)


def train(
    model: VQAModel,
    train_data: SyntheticVQA | VQABatch,
    *,
    epochs: int = 5,
    batch_size: int = 64,
    lr: float = 2e-3,
    seed: int = 0,
    device: torch.device | str | None = None,
    progress: bool = True,
    weight_decay: float = 1e-4,
    eval_data: SyntheticVQA | VQABatch | None = None,
    attention_supervision: float = 0.0,
) -> dict[str, list]:
    r"""Train ``model`` with Adam(W) on the cross-entropy of the answers.

    Args:
        model: a :class:`VQAModel` (moved to ``device``).
        train_data: a :class:`SyntheticVQA` or :class:`VQABatch`.
        epochs, batch_size, lr, weight_decay: optimization settings.
        seed: seeds the shuffling (a :class:`torch.Generator`) and ``torch.manual_seed``.
        device: where to train (default: the model's device).
        progress: show a progress bar (tqdm if importable, else a printed line).
        eval_data: if given, :func:`evaluate` runs on it after each epoch.
        attention_supervision: weight :math:`\beta\ge0` of an auxiliary loss
            :math:`-\beta\log\sum_{l\in M}p_l` on the discrete softmax :math:`p` of the cell
            scores (the input of every head) with the ground-truth grid mask :math:`M`.  Not part
            of the thesis's training (0 by default); it makes the attention focus within a
            small CPU budget.

    The library does not touch torch's thread settings; on a small shared CPU,
    ``torch.set_num_threads(1)`` before training is often several times faster than the default.

    Returns:
        The training history as a dict with ``"loss"`` (mean per epoch), ``"accuracy"`` (train, per epoch), ``"step_loss"``,
        ``"epoch_time"`` (seconds) and, with ``eval_data``, ``"eval"`` (list of dicts).

    Raises:
        TypeError: ``model`` not a :class:`VQAModel`, data of another type, non-integer
            ``epochs``/``batch_size``/``seed``, ``progress`` not a bool.
        ValueError: empty data, ``epochs`` or ``batch_size`` below 1, ``lr <= 0``, negative
            ``weight_decay`` or ``attention_supervision``, a ``seed`` outside
            ``[-2**63, 2**64 - 1]``, a ``device`` this machine does not have.
    """
    if not isinstance(model, VQAModel):
        raise TypeError(f"model must be a VQAModel; got {type(model).__name__}")
    data = _as_batch(train_data, "train_data")
    if eval_data is not None:
        _as_batch(eval_data, "eval_data")
    check_int(epochs, "epochs")
    check_int(batch_size, "batch_size")
    check_int(seed, "seed", -(2**63), 2**64 - 1)
    check_bool(progress, "progress")
    lr = check_number(lr, "lr", low=0.0, low_open=True)
    weight_decay = check_number(weight_decay, "weight_decay", low=0.0)
    attention_supervision = check_number(attention_supervision, "attention_supervision", low=0.0)
    device = check_device(device, "device") if device is not None else model.coords.device
    model.to(device)
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    n = len(data)
    steps = math.ceil(n / batch_size)
    hist: dict[str, list] = {"loss": [], "accuracy": [], "step_loss": [], "epoch_time": []}
    if eval_data is not None:
        hist["eval"] = []
    for ep in range(epochs):
        model.train()
        t0 = time.time()
        perm = torch.randperm(n, generator=g)
        bar = _Progress(steps, f"{model.head_name} epoch {ep + 1}/{epochs}", progress)
        tot_loss, tot_correct = 0.0, 0
        for s in range(steps):
            idx = perm[s * batch_size : (s + 1) * batch_size]
            b = data.index(idx.to(data.answers.device))
            out = model.forward_batch(b)
            y = b.answers.to(device)
            loss = F.cross_entropy(out.logits, y)
            if attention_supervision > 0:
                on_mask = (out.attention.scores_softmax * b.grid_masks.to(device)).sum((-2, -1))
                loss = loss + attention_supervision * -torch.log(on_mask.clamp_min(1e-12)).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            tot_loss += loss.item() * len(idx)
            tot_correct += (out.logits.argmax(-1) == y).sum().item()
            hist["step_loss"].append(loss.item())
            bar.update(f"loss={loss.item():.3f}")
        bar.close()
        hist["loss"].append(tot_loss / n)
        hist["accuracy"].append(tot_correct / n)
        hist["epoch_time"].append(time.time() - t0)
        if eval_data is not None:
            hist["eval"].append(evaluate(model, eval_data))
    return hist


@torch.no_grad()
def evaluate(model: VQAModel, data: SyntheticVQA | VQABatch, *, batch_size: int = 256) -> dict[str, float]:
    """Accuracy overall and by answer type, and mean attention precision on the grid masks.

    Returns:
        ``{"overall", "yes/no", "number", "other", "attention_precision", "n"}`` (accuracies in
        [0, 1]; a type absent from ``data`` gets ``nan``).

    Raises:
        TypeError: ``model`` not a :class:`VQAModel`, ``data`` of another type, ``batch_size``
            not an int.
        ValueError: empty ``data``, ``batch_size < 1``.
    """
    if not isinstance(model, VQAModel):
        raise TypeError(f"model must be a VQAModel; got {type(model).__name__}")
    data = _as_batch(data)
    batch_size = check_int(batch_size, "batch_size")
    was_training = model.training
    model.eval()
    dev = model.coords.device
    correct, types, prec = [], [], []
    for s in range(0, len(data), batch_size):
        b = data.index(slice(s, s + batch_size))
        out = model.forward_batch(b)
        correct.append((out.logits.argmax(-1) == b.answers.to(dev)).cpu())
        types.append(b.answer_types.cpu())
        prec.append(attention_precision(attention_map(out), b.grid_masks.to(dev)).cpu())
    model.train(was_training)
    correct, types, prec = torch.cat(correct).float(), torch.cat(types), torch.cat(prec)
    res = {"overall": correct.mean().item()}
    for k, name in enumerate(ANSWER_TYPES):
        sel = types == k
        res[name] = correct[sel].mean().item() if sel.any() else float("nan")
    res["attention_precision"] = prec.mean().item()
    res["n"] = len(data)
    return res
