"""attnopt — attention as optimization.

The library under the course book *Attention as Optimization*.  Each module is one view of the
attention mechanism as the solution of an optimization problem; see the book's API reference.
"""

from ._numerics import ConvergenceWarning
from ._validation import checks, get_checks, set_checks
from .attention import attention_scores, attention_weights, scaled_dot_product_attention

__version__ = "0.2.0"

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
