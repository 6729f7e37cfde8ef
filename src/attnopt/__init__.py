"""attnopt — attention as optimization.

The library under the course book *Attention as Optimization*.  Its folders are the book's views
and the course around them:

- ``attnopt.fenchel``: attention as the approximate solution of a Fenchel dual (chapter 1);
- ``attnopt.kernels``: attention as a Markov kernel on measures, with ``attnopt.kernels.regularity``
  (chapter 2);
- ``attnopt.transforms``: softmax, sparsemax, entmax and Sinkhorn as one-sided (and two-sided)
  entropic transport, with ``attnopt.transforms.geometry`` and ``attnopt.transforms.attention``
  (chapter 3);
- ``attnopt.continuous``: continuous and multimodal attention, with its value functions, the
  attention layer and mixtures (chapter 4);
- ``attnopt.course``: the course's tooling (explorers, widgets, page explorers, notebook helpers,
  plotting, the pretrained model, the VQA experiment); no view imports it;
- ``attnopt._validation``, ``attnopt._numerics``, ``attnopt._optional``: the shared core.

Each view's package is its public API; private engines (``_name.py``) sit beside it.  The shorter
import paths of the book and of earlier releases (``attnopt.geometry``, ``attnopt.widgets``, ...)
name the same module objects (see ``ALIASES``).
"""

import importlib
import importlib.abc
import importlib.util
import sys

from ._numerics import ConvergenceWarning
from ._validation import checks, get_checks, set_checks
from .transforms.attention import attention_scores, attention_weights, scaled_dot_product_attention

__version__ = "0.2.0"

#: Short import paths and the module each one names.  ``import attnopt.geometry`` returns the module
#: ``attnopt.transforms.geometry`` itself (not a copy), so patching either name patches both.
ALIASES = {
    "attnopt.attention": "attnopt.transforms.attention",
    "attnopt.geometry": "attnopt.transforms.geometry",
    "attnopt.regularity": "attnopt.kernels.regularity",
    "attnopt.value_functions": "attnopt.continuous.value_functions",
    "attnopt.continuous_attention": "attnopt.continuous.attention",
    "attnopt.mixture": "attnopt.continuous.mixture",
    **{f"attnopt.{name}": f"attnopt.course.{name}" for name in (
        "book", "explore", "page_explorer", "plotting", "pretrained", "vqa", "vqa_data", "widgets")},
}


class _AliasLoader(importlib.abc.Loader):
    """Loads an alias as the module it names: imports the target and hands back that object."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec):
        module = importlib.import_module(self.target)
        self._target_spec = module.__spec__
        return module

    def exec_module(self, module) -> None:
        # The import system stamped the alias's spec on the target; give the module its own back,
        # so that reloading or inspecting it sees where it really lives.
        module.__spec__ = self._target_spec


class _AliasFinder(importlib.abc.MetaPathFinder):
    """Finds the short import paths of ``ALIASES`` (lazily: the course's tooling, with Matplotlib
    and widgets, is imported only when a notebook asks for it)."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in ALIASES:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(ALIASES[fullname]))


if not any(isinstance(finder, _AliasFinder) for finder in sys.meta_path):
    sys.meta_path.insert(0, _AliasFinder())

__all__ = [
    "ConvergenceWarning",
    "attention_scores",
    "attention_weights",
    "checks",
    "get_checks",
    "scaled_dot_product_attention",
    "set_checks",
    "__version__",
]
