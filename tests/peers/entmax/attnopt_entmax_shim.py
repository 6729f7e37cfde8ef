"""entmax 1.3's public API, computed by attnopt.transforms: what the vendored tests import.

Every mapping calls ``attnopt.transforms.<name>`` through the module at call time, so replacing
that attribute (as ``test_routing.py`` does to break it on purpose) changes what the vendored tests
see.  entmax's ``k`` (a partial-sort hint that does not change the result) and ``n_iter`` (its
bisection budget) are accepted and ignored: attnopt's defaults are what is tested.  The
Fenchel-Young losses are entmax's own classes with the projection replaced by attnopt's (the loss
value and its gradient ``p* - onehot`` are entmax's code; they are right only if ``p*`` is).
What attnopt does not offer (normmax, budget, a tensor of alphas, alpha < 1, a gradient with
respect to alpha, entmax's private top-k internals) is re-exported from entmax unchanged and the
tests that use it are skipped in ``conftest.py``.
"""

from __future__ import annotations

import torch
from entmax import losses as _L
from entmax.activations import _entmax_threshold_and_support, _sparsemax_threshold_and_support  # noqa: F401 (skipped tests)
from entmax.root_finding import budget_bisect, normmax_bisect  # noqa: F401 (skipped tests)

from attnopt import transforms as T

NormmaxBisectLoss = _L.NormmaxBisectLoss


def _float_alpha(alpha) -> float:
    if isinstance(alpha, torch.Tensor):
        if alpha.numel() != 1 or alpha.requires_grad:
            raise NotImplementedError("attnopt.transforms.entmax takes one float alpha and gives no gradient with respect to it")
        alpha = alpha.item()
    return float(alpha)


# -------- the mappings -------------------------------------------------------------------------


def sparsemax(X, dim=-1, k=None):
    return T.sparsemax(X, dim=dim)


def entmax15(X, dim=-1, k=None):
    return T.entmax15(X, dim=dim)


def entmax_bisect(X, alpha=1.5, dim=-1, n_iter=50, ensure_sum_one=True):
    return T.entmax(X, _float_alpha(alpha), dim=dim)


def sparsemax_bisect(X, dim=-1, n_iter=50, ensure_sum_one=True):
    return T.entmax(X, 2.0, dim=dim)


class Sparsemax(torch.nn.Module):
    def __init__(self, dim=-1, k=None):
        super().__init__()
        self.dim = dim

    def forward(self, X):
        return sparsemax(X, dim=self.dim)


class Entmax15(torch.nn.Module):
    def __init__(self, dim=-1, k=None):
        super().__init__()
        self.dim = dim

    def forward(self, X):
        return entmax15(X, dim=self.dim)


class SparsemaxBisect(torch.nn.Module):
    def __init__(self, dim=-1, n_iter=None):
        super().__init__()
        self.dim = dim

    def forward(self, X):
        return sparsemax_bisect(X, dim=self.dim)


class EntmaxBisect(torch.nn.Module):
    def __init__(self, alpha=1.5, dim=-1, n_iter=50):
        super().__init__()
        self.alpha, self.dim = alpha, dim

    def forward(self, X):
        return entmax_bisect(X, self.alpha, dim=self.dim)


# -------- the Fenchel-Young losses: entmax's, with attnopt's projection ------------------------


class _SparsemaxLossFunction(_L.SparsemaxLossFunction):
    @classmethod
    def project(cls, X, alpha, k):
        return sparsemax(X, dim=-1, k=k)


class _SparsemaxBisectLossFunction(_L.SparsemaxBisectLossFunction):
    @classmethod
    def project(cls, X, alpha, n_iter):
        return sparsemax_bisect(X, n_iter=n_iter)


class _Entmax15LossFunction(_L.Entmax15LossFunction):
    @classmethod
    def project(cls, X, alpha, k=None):
        return entmax15(X, dim=-1, k=k)


class _EntmaxBisectLossFunction(_L.EntmaxBisectLossFunction):
    @classmethod
    def project(cls, X, alpha, n_iter):
        return entmax_bisect(X, alpha=alpha, n_iter=n_iter)


class SparsemaxLoss(_L.SparsemaxLoss):
    def loss(self, X, target):
        return _SparsemaxLossFunction.apply(X, target, self.k)


class SparsemaxBisectLoss(_L.SparsemaxBisectLoss):
    def loss(self, X, target):
        return _SparsemaxBisectLossFunction.apply(X, target, self.n_iter)


class Entmax15Loss(_L.Entmax15Loss):
    def loss(self, X, target):
        return _Entmax15LossFunction.apply(X, target, self.k)


class EntmaxBisectLoss(_L.EntmaxBisectLoss):
    def loss(self, X, target):
        return _EntmaxBisectLossFunction.apply(X, target, self.alpha, self.n_iter)
