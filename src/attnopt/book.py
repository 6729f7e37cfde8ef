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

__all__ = ["RESULTS_ENV", "check_scale", "in_colab", "pick_device", "record", "seed_everything"]

#: Environment variable naming the folder :func:`record` writes to (set by the book's runner).
RESULTS_ENV = "ATTNOPT_RESULTS_DIR"

SCALES = ("book", "full")


def in_colab() -> bool:
    """True when running inside Google Colab."""
    return "google.colab" in sys.modules


def pick_device(device: str = "auto") -> torch.device:
    """Resolve a notebook's ``device`` parameter: ``"auto"`` means CUDA when available, else CPU."""
    if not isinstance(device, str):
        raise TypeError(f"device must be a string such as 'auto', 'cpu' or 'cuda'; got {type(device).__name__}")
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} was asked for but CUDA is not available; use 'auto' or 'cpu'")
    return dev


def check_scale(scale: str) -> str:
    """Validate a notebook's ``scale`` parameter (``"book"`` for CPU figures, ``"full"`` for a GPU)."""
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}; got {scale!r}")
    return scale


def seed_everything(seed: int) -> torch.Generator:
    """Seed Python, NumPy and PyTorch; return a fresh CPU ``torch.Generator`` seeded with ``seed``."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int; got {type(seed).__name__}")
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def _plain(value):
    """Convert tensors/arrays/NumPy scalars to JSON-serialisable Python values."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        return value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
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
    so a notebook may record as it goes.  Returns the path written.
    """
    if not name or not isinstance(name, str) or "/" in name:
        raise ValueError(f"name must be a plain file stem such as the notebook's name; got {name!r}")
    folder = Path(os.environ.get(RESULTS_ENV, "results"))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data.update(_plain(numbers))
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return path
