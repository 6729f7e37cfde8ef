"""Small helpers every notebook of the course uses: device choice, seeding, recording results.

A notebook records its key numbers with :func:`record`; the course's tests read them back and
check them against the claims the book makes, so a figure and the sentence under it cannot drift
apart silently.
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
from pathlib import Path

import numpy as np
import torch

from ._validation import check_choice, check_device, check_int

__all__ = ["RESULTS_ENV", "SEED_RANGE", "check_scale", "in_colab", "pick_device", "record", "seed_everything"]

#: Environment variable naming the folder :func:`record` writes to (set by the book's runner).
RESULTS_ENV = "ATTNOPT_RESULTS_DIR"

SCALES = ("book", "full")


def in_colab() -> bool:
    """True when running inside Google Colab."""
    return "google.colab" in sys.modules


def pick_device(device: str | torch.device = "auto") -> torch.device:
    """Resolve a notebook's ``device`` parameter: ``"auto"`` means CUDA when available, else CPU.

    Args:
        device: ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"mps"`` or a ``torch.device``.

    Returns:
        The ``torch.device``, checked to exist on this machine.

    Raises:
        TypeError: ``device`` neither a string nor a ``torch.device``.
        ValueError: a string torch does not know (the message lists the accepted ones), or an
            accelerator (CUDA, MPS) that this machine does not have.

    Example:
        >>> pick_device("cpu")
        device(type='cpu')
    """
    return check_device(device, "device", auto=True)


def check_scale(scale: str) -> str:
    """Validate a notebook's ``scale`` parameter (``"book"`` for CPU figures, ``"full"`` for a GPU).

    Raises:
        TypeError: ``scale`` not a string.
        ValueError: ``scale`` not one of ``("book", "full")``.
    """
    return check_choice(scale, "scale", SCALES)


#: The range of seeds that seed_everything accepts, that of ``torch.manual_seed``.
SEED_RANGE = (-(2**63), 2**64 - 1)


def seed_everything(seed: int) -> torch.Generator:
    """Seed Python, NumPy and PyTorch; return a fresh CPU ``torch.Generator`` seeded with ``seed``.

    NumPy, whose seeds are below :math:`2^{32}`, gets ``seed % 2**32``.

    Args:
        seed: an int in ``[-2**63, 2**64 - 1]`` (:data:`SEED_RANGE`, the range of
            ``torch.manual_seed``; a negative seed is mapped by torch to ``2**64 - 1 + seed``).

    Returns:
        A ``torch.Generator`` on the CPU.

    Raises:
        TypeError: ``seed`` not an int (a bool or a float included).
        ValueError: ``seed`` outside :data:`SEED_RANGE`; it is refused rather than reduced, so
            that two different seeds never give the same stream silently.

    Example:
        >>> g = seed_everything(0)
        >>> torch.rand(1, generator=g).item() == torch.rand(1, generator=seed_everything(0)).item()
        True
    """
    seed = check_int(seed, "seed", minimum=None)
    if not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
        raise ValueError(f"seed must be an int in [-2**63, 2**64 - 1] (the range of torch.manual_seed); got {seed}")
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def _plain(value):
    """Convert tensors/arrays/NumPy scalars to JSON-serialisable Python values."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        return _plain(value.item() if value.numel() == 1 else value.tolist())
    if isinstance(value, np.ndarray):
        return _plain(value.tolist())
    if isinstance(value, np.generic):
        return _plain(value.item())
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def record(name: str, **numbers) -> Path:
    """Write a notebook's key numbers to ``$ATTNOPT_RESULTS_DIR/<name>.json`` (default ``./results``).

    Numbers recorded by earlier calls with the same ``name`` in the same run are kept and updated,
    so a notebook may record as it goes.  Tensors and NumPy values are written as numbers or
    lists; NaN and infinities (of any origin) as the strings ``"nan"``, ``"inf"``, ``"-inf"``.

    Args:
        name: a plain file stem such as the notebook's name (no path separator, not ``.``/``..``).
        **numbers: values made of numbers, strings, bools, ``None``, tensors, NumPy values, lists
            and dicts.

    Returns:
        The path written.

    Raises:
        TypeError: ``name`` not a string, or a value that cannot be written as JSON (named by its
            keyword); nothing is written then.
        ValueError: an empty ``name`` or one with a path separator; an existing results file that
            is not valid JSON.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a string (a plain file stem such as the notebook's name); got {type(name).__name__}")
    if not name or "/" in name or "\\" in name or name in (".", ".."):
        raise ValueError(f"name must be a plain file stem such as the notebook's name; got {name!r}")
    plain = {}
    for key, value in numbers.items():
        plain[key] = _plain(value)
        try:
            json.dumps(plain[key])
        except (TypeError, ValueError) as err:
            raise TypeError(f"{key}={type(value).__name__} cannot be recorded: record numbers, strings, "
                            f"tensors, arrays, lists or dicts of them ({err})") from err
    folder = Path(os.environ.get(RESULTS_ENV, "results"))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    try:
        data = json.loads(path.read_text()) if path.exists() else {}
    except json.JSONDecodeError as err:
        raise ValueError(f"cannot update {path}: it is not valid JSON ({err}); delete it") from err
    data.update(plain)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return path
