r"""The synthetic visual-question-answering task of Chapter 4: scenes, questions, answers.

Chapter 6 of Farinhas (2021) compares the output attention of VQA models on VQA-v2, whose images
have no ground-truth masks and whose networks are far too heavy for a course.  This module
provides the synthetic stand-in that :mod:`attnopt.course.vqa` trains and evaluates its models on:

* :func:`make_batch` / :class:`SyntheticVQA` -- scenes in the spirit of the Sort-of-CLEVR task:
  4--6 objects of distinct colours and one of three shapes on a dark canvas, with questions of
  the three VQA answer types about one object (``"shape"``, ``"left"``), about two separate
  objects (``"same_shape"``) and about every object of a shape (``"count"``), and for each
  question the mask of the objects it is about; a :class:`VQABatch` holds them;
* :data:`COLOURS`, :data:`SHAPES`, :data:`FAMILIES`, :data:`VOCAB`, :data:`ANSWERS`,
  :data:`ANSWER_TYPES`, :data:`MAX_QUESTION_LENGTH` -- the language of the task, and
  :func:`decode` / :func:`answer_text` to read its token and answer ids as text.

Scene objects store their centres as ``(x, y)`` = (column, row) in the unit square; the
``object_cells`` of a batch say which cells of the :math:`G\times G` feature grid each object
overlaps.

References:
    Farinhas, A. (2021). *Visual Attention with Sparse and Continuous Transformations*, chapter 6.
    Santoro, A. et al. (2017). *A Simple Neural Network Module for Relational Reasoning* (the
    Sort-of-CLEVR task).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

from . import _vqa_checks as checks
from . import _vqa_scenes as scenes
from .._validation import check_device, check_int, check_number

__all__ = [
    "ANSWERS",
    "ANSWER_TYPES",
    "COLOURS",
    "FAMILIES",
    "MAX_QUESTION_LENGTH",
    "SHAPES",
    "VOCAB",
    "SyntheticVQA",
    "VQABatch",
    "answer_text",
    "decode",
    "make_batch",
]

# --------------------------------------------------------------------------------------------
# vocabularies
# --------------------------------------------------------------------------------------------

# The vocabularies are those the scene generator speaks (defined with it, in ``_vqa_scenes``).

#: Colour names (their RGB values are those of the canvases); the objects of a scene have distinct colours.
COLOURS: tuple[str, ...] = scenes.COLOURS
#: Shape names.
SHAPES: tuple[str, ...] = scenes.SHAPES
#: Answer types, as in VQA-v2.
ANSWER_TYPES: tuple[str, ...] = scenes.ANSWER_TYPES
#: The answer vocabulary shared by every question (``no``, ``yes``, the counts 1--6 and the shapes).
ANSWERS: tuple[str, ...] = scenes.ANSWERS
#: The question families as (name, answer type, template), where ``<c>`` is a colour and ``<s>`` a
#: shape. They are ``shape`` (other), ``left`` (yes/no), ``same_shape`` (yes/no) and ``count``
#: (number).
FAMILIES: tuple[tuple[str, str, str], ...] = scenes.FAMILIES
#: Question-token vocabulary; id 0 is padding.
VOCAB: tuple[str, ...] = scenes.VOCAB
#: The longest question, in tokens.
MAX_QUESTION_LENGTH: int = scenes.MAX_QUESTION_LENGTH


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
        >>> decode([1, 2, 3, 4, 15, 5, 14, 0, 0])
        'what shape is the red object ?'
    """
    t = checks.int_ids(tokens, "tokens", "token ids")
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
        >>> answer_text(1), answer_text([3, 8])
        ('yes', ['2', 'circle'])
    """
    a = checks.int_ids(answers, "answers", "answer ids")
    ids = a.reshape(-1).tolist()
    bad = [i for i in ids if not 0 <= i < len(ANSWERS)]
    if bad:
        raise ValueError(f"answers must be ids in [0, {len(ANSWERS)}) (indices into ANSWERS); got {bad[0]}")
    return ANSWERS[ids[0]] if a.ndim == 0 else [ANSWERS[i] for i in ids]


# --------------------------------------------------------------------------------------------
# data
# --------------------------------------------------------------------------------------------

_SCENE_FIELDS = ("images", "labels", "present", "colours", "shapes", "centres", "object_cells")


@dataclass
class VQABatch:
    """Synthetic scenes and questions about them (:func:`make_batch`).

    Scene tables have a leading dimension ``S`` (scenes), question tables ``n`` (questions); each
    question names its scene in ``scene``.  ``len(batch)`` is the number of questions.

    Attributes:
        images: ``(S, 3, H, W)`` float RGB canvases in ``[0, 1]``.
        labels: ``(S, H, W)`` int8: the object slot painted on each pixel, ``-1`` for background.
        present: ``(S, K)`` bool: which object slots hold an object.
        colours: ``(S, K)`` long colour ids (distinct within a scene).
        shapes: ``(S, K)`` long shape ids.
        centres: ``(S, K, 2)`` float ``(x, y)`` = (column, row) in the unit square.
        object_cells: ``(S, K, G, G)`` bool: the grid cells each object overlaps.
        scene: ``(n,)`` long: the scene of each question.
        questions: ``(n, T)`` long token ids (:data:`VOCAB`), right-padded with 0.
        answers: ``(n,)`` long ids into :data:`ANSWERS`.
        answer_types: ``(n,)`` long ids into :data:`ANSWER_TYPES`.
        families: ``(n,)`` long ids into :data:`FAMILIES`.
        relevant: ``(n, K)`` bool: the objects the question is about.
    """

    images: torch.Tensor
    labels: torch.Tensor
    present: torch.Tensor
    colours: torch.Tensor
    shapes: torch.Tensor
    centres: torch.Tensor
    object_cells: torch.Tensor
    scene: torch.Tensor
    questions: torch.Tensor
    answers: torch.Tensor
    answer_types: torch.Tensor
    families: torch.Tensor
    relevant: torch.Tensor

    def __len__(self) -> int:
        return self.answers.shape[0]

    @property
    def n_scenes(self) -> int:
        """The number ``S`` of scenes."""
        return self.images.shape[0]

    @property
    def grid(self) -> int:
        """The side :math:`G` of the feature grid."""
        return self.object_cells.shape[-1]

    @property
    def grid_masks(self) -> torch.Tensor:
        """``(n, G, G)`` bool: the cells that overlap an object the question is about."""
        cells = self.object_cells[self.scene] & self.relevant[..., None, None]
        return cells.any(1)

    @property
    def masks(self) -> torch.Tensor:
        """``(n, H, W)`` bool: the pixels of the objects the question is about."""
        labels = self.labels[self.scene].long()  # (n, H, W)
        on = torch.gather(self.relevant, 1, labels.clamp_min(0).flatten(1)).view_as(labels)
        return on & (labels >= 0)

    def index(self, idx) -> "VQABatch":
        """The questions at ``idx`` (an index tensor, a slice or a list), with all the scenes."""
        return replace(self, **{f.name: getattr(self, f.name)[idx] for f in fields(self) if f.name not in _SCENE_FIELDS})

    def to(self, device) -> "VQABatch":
        """A copy with every tensor on ``device``."""
        return VQABatch(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})

    def question_text(self, i: int) -> str:
        """Question ``i`` as text."""
        return decode(self.questions[i])

    def answer_text(self, i: int) -> str:
        """Answer ``i`` as text."""
        return ANSWERS[int(self.answers[i])]

    def scene_description(self, s: int) -> list[dict]:
        """Objects of scene ``s`` as dictionaries (slot, colour, shape, x, y)."""
        return [
            {"slot": k, "colour": COLOURS[int(self.colours[s, k])], "shape": SHAPES[int(self.shapes[s, k])],
             "x": float(self.centres[s, k, 0]), "y": float(self.centres[s, k, 1])}
            for k in range(self.present.shape[1]) if bool(self.present[s, k])
        ]


def make_batch(
    n_scenes: int,
    generator: torch.Generator | None = None,
    *,
    questions_per_scene: int = 10,
    canvas: int = 56,
    grid: int = 14,
    min_objects: int = 4,
    max_objects: int = 6,
    noise: float = 0.0,
    chunk: int = 256,
) -> VQABatch:
    r"""Generate ``n_scenes`` synthetic scenes and ``questions_per_scene`` questions about each.

    A scene holds ``min_objects``--``max_objects`` non-overlapping objects of distinct colours
    (:data:`COLOURS`), each a circle, square or triangle of one size, on a dark
    ``canvas``:math:`\times`\ ``canvas`` RGB canvas, as in Sort-of-CLEVR (Santoro et al., 2017).  Each
    question comes from one of the :data:`FAMILIES`, drawn with probabilities 0.3 (``"shape"``), 0.2
    (``"left"``), 0.3 (``"same_shape"``) and 0.2 (``"count"``); a family a scene cannot have falls
    back to the next one.  Questions name objects by their colour, so their referents are unique;
    ``"left"`` asks only about objects at least 0.05 from the vertical midline; ``"same_shape"``
    draws a same-shape pair or a different-shape pair with equal probability (when the scene has
    both); ``"count"`` asks about the shape of a random object (so the answer is at least 1).  The
    answer of every type is therefore close to uniform given the question text: a model must read
    the image.  The relevant objects are those the question names (for ``"count"``, every object of
    the shape).

    Args:
        n_scenes: number of scenes.
        generator: a seeded :class:`torch.Generator` (its device is the device of the output);
            ``None`` uses a fresh generator seeded with 0.
        questions_per_scene: questions about each scene (``n = n_scenes * questions_per_scene``).
        canvas: side of the canvas in pixels (a multiple of ``grid``).
        grid: side :math:`G` of the feature grid (14, as in Farinhas, 2021).
        min_objects, max_objects: range of the number of objects per scene
            (``2 <= min_objects <= max_objects <= 6``).
        noise: standard deviation of Gaussian pixel noise (0 for exact colours).
        chunk: scenes rasterized at once (bounds memory).

    Returns:
        A :class:`VQABatch`.

    Raises:
        TypeError: non-integer sizes or object counts, a ``generator`` that is not one.
        ValueError: sizes below 1, ``canvas`` not a multiple of ``grid``, an object range outside
            ``2 <= min_objects <= max_objects <= 6``, a negative ``noise``.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> data = make_batch(2, g, questions_per_scene=3)
        >>> len(data), data.n_scenes, data.images.shape
        (6, 2, torch.Size([2, 3, 56, 56]))

    References:
        Santoro et al. (2017), *A Simple Neural Network Module for Relational Reasoning* (the
        Sort-of-CLEVR task).
    """
    for name, v in (("n_scenes", n_scenes), ("questions_per_scene", questions_per_scene), ("canvas", canvas),
                    ("grid", grid), ("chunk", chunk)):
        check_int(v, name)
    if canvas % grid:
        raise ValueError(f"canvas must be a multiple of grid={grid}; got canvas={canvas}")
    max_objects = check_int(max_objects, "max_objects", 2, len(COLOURS))
    min_objects = check_int(min_objects, "min_objects", 2, max_objects)
    noise = check_number(noise, "noise", low=0.0)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None; got {type(generator).__name__}")
    if generator is None:
        generator = torch.Generator().manual_seed(0)
    tables = scenes.sample_scenes(n_scenes, generator, min_objects, max_objects)
    q = scenes.questions(tables, questions_per_scene, generator)
    images, labels, object_cells = scenes.render(tables, canvas, grid, chunk, noise, generator)
    types = torch.tensor(scenes.ANSWER_TYPE_OF, device=q["answers"].device)
    return VQABatch(
        images=images, labels=labels, present=tables.present, colours=tables.colours, shapes=tables.shapes,
        centres=tables.centres,
        object_cells=object_cells,
        scene=torch.arange(n_scenes, device=images.device).repeat_interleave(questions_per_scene),
        questions=q["questions"], answers=q["answers"], answer_types=types[q["answers"]], families=q["families"],
        relevant=q["relevant"],
    )


class SyntheticVQA(torch.utils.data.Dataset):
    """``n_scenes`` synthetic scenes and their questions, generated once from ``seed`` by :func:`make_batch`.

    ``dataset[i]`` is a dict of the tensors of question ``i`` (with its image); ``dataset.data`` the
    whole :class:`VQABatch`.  Two datasets with the same arguments are equal.

    Args:
        n_scenes: number of scenes.
        seed: seed of the :class:`torch.Generator`.
        device: where the tensors live (the generator runs on the CPU, so data are identical on
            every device).
        **options: the keyword arguments of :func:`make_batch` that shape the scenes and the
            questions (``questions_per_scene``, ``canvas``, ``grid``, ``min_objects``,
            ``max_objects``, ``noise``, ``chunk``), with its defaults.

    Raises:
        TypeError, ValueError: as :func:`make_batch` (a keyword it does not take is a
            ``TypeError``); a ``seed`` that is not an int in ``[-2**63, 2**64 - 1]``; a ``device``
            this machine does not have.

    Example:
        >>> dataset = SyntheticVQA(3, seed=1, questions_per_scene=2)
        >>> len(dataset), dataset[0]["image"].shape
        (6, torch.Size([3, 56, 56]))
    """

    def __init__(self, n_scenes: int, seed: int = 0, *, device: torch.device | str | None = None, **options):
        n_scenes = check_int(n_scenes, "n_scenes")
        seed = checks.seed_arg(seed)
        if device is not None:
            device = check_device(device, "device")
        self.data = make_batch(n_scenes, torch.Generator().manual_seed(seed), **options)
        if device is not None:
            self.data = self.data.to(device)
        self.seed, self.canvas, self.grid = int(seed), self.data.images.shape[-1], self.data.grid

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        d = self.data
        s = d.scene[i]
        return {"image": d.images[s], "question": d.questions[i], "answer": d.answers[i],
                "answer_type": d.answer_types[i], "family": d.families[i], "relevant": d.relevant[i],
                "mask": d.index([i]).masks[0]}


def _as_batch(data, name: str = "data") -> VQABatch:
    if isinstance(data, SyntheticVQA):
        data = data.data
    elif not isinstance(data, VQABatch):
        raise TypeError(f"{name} must be a SyntheticVQA or VQABatch; got {type(data).__name__}")
    if len(data) == 0:
        raise ValueError(f"{name} must hold at least one question")
    return data
