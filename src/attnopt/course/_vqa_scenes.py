r"""The engine of :func:`attnopt.course.vqa_data.make_batch`: the synthetic scenes, the questions about them,
their rendering on a canvas and the share of each grid cell covered by each colour and shape.

The scenes are in the spirit of Sort-of-CLEVR (Santoro et al., 2017); the vocabularies below are
the language the generator speaks, and :mod:`attnopt.course.vqa_data` exports the public ones.

References:
    Santoro, A. et al. (2017). *A Simple Neural Network Module for Relational Reasoning* (the
    Sort-of-CLEVR task).
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import torch
import torch.nn.functional as F

# --------------------------------------------------------------------------------------------
# vocabularies (exported by attnopt.vqa_data, which documents them) and the geometry of the objects
# --------------------------------------------------------------------------------------------

COLOURS: tuple[str, ...] = ("red", "green", "blue", "yellow", "purple", "cyan")
RGB = (
    (0.90, 0.10, 0.10),
    (0.10, 0.75, 0.20),
    (0.15, 0.30, 0.95),
    (0.95, 0.90, 0.10),
    (0.60, 0.20, 0.80),
    (0.10, 0.85, 0.90),
)
BACKGROUND = (0.15, 0.15, 0.15)
SHAPES: tuple[str, ...] = ("circle", "square", "triangle")
PLURAL = ("circles", "squares", "triangles")
RADIUS = 0.085  # every object: circle radius in the unit square (squares and triangles alike)
BOUND = 1.25  # bounding-circle radius / radius, for every shape
MARGIN = 0.02  # minimal gap between bounding circles
LEFT_MARGIN = 0.05  # "left" questions only about objects at least this far from the middle

ANSWER_TYPES: tuple[str, ...] = ("yes/no", "number", "other")
ANSWERS: tuple[str, ...] = ("no", "yes", "1", "2", "3", "4", "5", "6") + SHAPES
ANSWER_TYPE_OF = (0, 0) + (1,) * 6 + (2,) * len(SHAPES)  # the answer type of each answer
A_NO, A_YES, A_ONE, A_SHAPE = 0, 1, 2, 8  # answer ids: "no", "yes", "1", the first shape

FAMILIES: tuple[tuple[str, str, str], ...] = (
    ("shape", "other", "what shape is the <c> object ?"),
    ("left", "yes/no", "is the <c> object on the left ?"),
    ("same_shape", "yes/no", "is the <c> object the same shape as the <c> object ?"),
    ("count", "number", "how many <s>s are there ?"),
)
FAMILY_PROBS = (0.3, 0.2, 0.3, 0.2)

VOCAB: tuple[str, ...] = (
    "<pad>", "what", "shape", "is", "the", "object", "on", "left", "same", "as", "how", "many", "are",
    "there", "?",
) + COLOURS + SHAPES + PLURAL
TOKEN_ID = {w: i for i, w in enumerate(VOCAB)}
MAX_QUESTION_LENGTH = 12


class SceneTables(NamedTuple):
    """The objects of ``S`` scenes, in ``K`` slots."""

    present: torch.Tensor  # (S, K) bool: which slots hold an object
    colours: torch.Tensor  # (S, K) long colour ids, distinct within a scene
    shapes: torch.Tensor  # (S, K) long shape ids
    centres: torch.Tensor  # (S, K, 2) float (x, y) = (column, row) in the unit square


class Rendering(NamedTuple):
    """The scenes drawn on canvases, and the grid cells each object overlaps."""

    images: torch.Tensor  # (S, 3, H, W) float RGB in [0, 1]
    labels: torch.Tensor  # (S, H, W) int8: the slot painted on each pixel, -1 for background
    object_cells: torch.Tensor  # (S, K, G, G) bool


def sample_scenes(n, generator, min_objects, max_objects, n_candidates=64) -> SceneTables:
    """Scene tables: distinct colours, placed by vectorized rejection sampling (a loop over the slots)."""
    dev = generator.device
    K = max_objects
    n_obj = torch.randint(min_objects, max_objects + 1, (n,), generator=generator, device=dev)
    colours = torch.argsort(torch.rand(n, len(COLOURS), generator=generator, device=dev), -1)[:, :K]
    shapes = torch.randint(0, len(SHAPES), (n, K), generator=generator, device=dev)
    bound = RADIUS * BOUND
    cand = bound + torch.rand(n, K, n_candidates, 2, generator=generator, device=dev) * (1 - 2 * bound)
    centres = torch.zeros(n, K, 2, device=dev)
    present = torch.zeros(n, K, dtype=torch.bool, device=dev)
    for k in range(K):  # object slots: at most six
        ok = torch.ones(n, n_candidates, dtype=torch.bool, device=dev)
        if k > 0:
            d = torch.linalg.vector_norm(cand[:, k, :, None, :] - centres[:, None, :k, :], dim=-1)  # (n, M, k)
            ok = ~((d < 2 * bound + MARGIN) & present[:, None, :k]).any(-1)
        first = ok.to(torch.int8).argmax(-1)
        centres[:, k] = cand[:, k][torch.arange(n, device=dev), first]
        present[:, k] = ok.any(-1) & (k < n_obj)
    return SceneTables(present, colours, shapes, centres)


def rasterize(scenes: SceneTables, size: int):
    """``(S, 3, size, size)`` canvases and ``(S, size, size)`` int8 slot labels (objects do not overlap)."""
    present, colours, shapes, centres = scenes
    dev = centres.device
    u = (torch.arange(size, device=dev) + 0.5) / size
    dx = u.view(1, 1, 1, -1) - centres[..., 0, None, None]  # (S, K, 1, W)
    dy = u.view(1, 1, -1, 1) - centres[..., 1, None, None]  # (S, K, H, 1)
    r = RADIUS
    circle = dx * dx + dy * dy <= r * r
    square = torch.maximum(dx.abs(), dy.abs()) <= 0.85 * r
    # a triangle with its apex up: rows from -r (apex) to 0.75 r (base), half-width growing to r
    triangle = (dy >= -r) & (dy <= 0.75 * r) & (dx.abs() <= (dy + r) / 1.75)
    s = shapes[..., None, None]
    occ = torch.where(s == 0, circle, torch.where(s == 1, square, triangle)) & present[..., None, None]
    labels = torch.where(occ.any(1), occ.to(torch.int8).argmax(1).to(torch.int8), torch.tensor(-1, dtype=torch.int8, device=dev))
    rgb = torch.tensor(RGB, device=dev)[colours]  # (S, K, 3)
    bg = torch.tensor(BACKGROUND, device=dev)
    images = bg[:, None, None] + torch.einsum("skhw,skc->schw", occ.float(), rgb - bg)
    return images, labels


def choose(u: float, options: Sequence):
    return options[min(int(u * len(options)), len(options) - 1)]


def make_question(family, objs, u):
    """One question of ``family`` about ``objs`` = [(slot, colour, shape, x)], from uniforms ``u``,
    as ``(tokens, answer, relevant_slots)``, or ``None`` if the scene cannot have one."""
    if family == 0:  # what shape is the <c> object ?
        k, c, s, _ = choose(u[0], objs)
        return ["what", "shape", "is", "the", COLOURS[c], "object", "?"], A_SHAPE + s, [k]
    if family == 1:  # is the <c> object on the left ?
        clear = [o for o in objs if abs(o[3] - 0.5) > LEFT_MARGIN]
        if not clear:
            return None
        k, c, _, x = choose(u[0], clear)
        return ["is", "the", COLOURS[c], "object", "on", "the", "left", "?"], A_YES if x < 0.5 else A_NO, [k]
    if family == 2:  # is the <c1> object the same shape as the <c2> object ?  (yes/no balanced)
        pairs = [(a, b) for i, a in enumerate(objs) for b in objs[i + 1:]]
        if not pairs:
            return None
        same = [p for p in pairs if p[0][2] == p[1][2]]
        different = [p for p in pairs if p[0][2] != p[1][2]]
        a, b = choose(u[0], same if (u[1] < 0.5 and same) or not different else different)
        if u[2] < 0.5:
            a, b = b, a
        toks = ["is", "the", COLOURS[a[1]], "object", "the", "same", "shape", "as", "the", COLOURS[b[1]], "object", "?"]
        return toks, A_YES if a[2] == b[2] else A_NO, [a[0], b[0]]
    _, _, s, _ = choose(u[0], objs)  # how many <s>s are there ?  (size-biased: the shape of an object)
    rel = [o[0] for o in objs if o[2] == s]
    return ["how", "many", PLURAL[s], "are", "there", "?"], A_ONE + len(rel) - 1, rel


def questions(scenes: SceneTables, q_per_scene, generator) -> dict[str, torch.Tensor]:
    """Questions about every scene (a little Python per question over at most six objects): token
    ids ``"questions"``, ``"answers"``, ``"families"`` and the ``"relevant"`` objects of each."""
    present, colours, shapes, centres = scenes
    n = present.shape[0]
    total = n * q_per_scene
    dev = generator.device
    draws = torch.multinomial(torch.tensor(FAMILY_PROBS, device=dev), total, replacement=True, generator=generator)
    u = torch.rand(total, 3, generator=generator, device=dev).tolist()
    fam_l = draws.tolist()
    pres, col, shp, x = present.tolist(), colours.tolist(), shapes.tolist(), centres[..., 0].tolist()
    K = present.shape[1]
    out = {"questions": [], "answers": [], "families": [], "relevant": []}
    for i in range(total):
        s = i // q_per_scene
        objs = [(k, col[s][k], shp[s][k], x[s][k]) for k in range(K) if pres[s][k]]
        for attempt in range(len(FAMILIES)):  # an infeasible family falls back to the next one
            family = (fam_l[i] + attempt) % len(FAMILIES)
            made = make_question(family, objs, u[i])
            if made is not None:
                break
        toks, answer, rel = made
        out["questions"].append([TOKEN_ID[w] for w in toks] + [0] * (MAX_QUESTION_LENGTH - len(toks)))
        out["answers"].append(answer)
        out["families"].append(family)
        out["relevant"].append([k in rel for k in range(K)])
    return {k: torch.tensor(v, dtype=torch.bool if k == "relevant" else torch.long, device=dev) for k, v in out.items()}



def render(scenes: SceneTables, canvas: int, grid: int, chunk: int, noise: float, generator) -> Rendering:
    """The scenes on ``canvas``-pixel canvases (``chunk`` scenes at once, to bound the
    ``(chunk, K, H, W)`` masks), with Gaussian pixel noise of standard deviation ``noise``."""
    images, labels = [], []
    for s in range(0, scenes.present.shape[0], chunk):
        im, lab = rasterize(SceneTables(*(table[s:s + chunk] for table in scenes)), canvas)
        images.append(im)
        labels.append(lab)
    images, labels = torch.cat(images), torch.cat(labels)
    if noise > 0:
        images = (images + noise * torch.randn(images.shape, generator=generator, device=images.device)).clamp(0, 1)
    slots = torch.arange(scenes.present.shape[1], device=labels.device, dtype=labels.dtype)
    pixels = (labels.unsqueeze(1) == slots.view(1, -1, 1, 1)).float()  # (S, K, H, W)
    return Rendering(images, labels, F.max_pool2d(pixels, canvas // grid) > 0)



def cell_targets(data, scenes, G: int):
    """Share of each cell's pixels with each colour (or none) and each shape (or none), for the
    scenes ``scenes`` of ``data`` (a :class:`~attnopt.course.vqa_data.VQABatch`): the targets of
    :func:`~attnopt.course.vqa.pretrain_encoder`."""
    labels = data.labels[scenes].long()  # (b, H, W)
    on = labels >= 0
    k = labels.clamp_min(0).flatten(1)
    colour = torch.where(on, torch.gather(data.colours[scenes], 1, k).view_as(labels), len(COLOURS))
    shape = torch.where(on, torch.gather(data.shapes[scenes], 1, k).view_as(labels), len(SHAPES))
    cell = labels.shape[-1] // G
    share = lambda c, m: F.avg_pool2d(F.one_hot(c, m).permute(0, 3, 1, 2).float(), cell)
    return share(colour, len(COLOURS) + 1), share(shape, len(SHAPES) + 1)
