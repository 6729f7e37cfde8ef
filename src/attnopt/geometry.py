r"""The backward pass of softmax attention as a policy gradient, and its information geometry.

Seed 003 (the one-sided EOT paper's summary) reads the scores :math:`s` as the natural parameters
of the policy :math:`p = \operatorname{softmax}(s/\tau)` and an upstream signal :math:`u` (a reward,
or the gradient :math:`\partial\ell/\partial p` that backpropagation delivers) as the return of
each key.  With :math:`L(s) = \mathbb E_{p}[u] = \langle p, u\rangle`:

.. math::

    \frac{\partial L}{\partial s_j} = \frac{1}{\tau}\, p_j\,\big(u_j - \mathbb E_p[u]\big)
    \qquad\text{(advantage form, variance-reduced baseline } \mathbb E_p[u]\text{)},

    \Phi(s) = \tau \log\sum_j e^{s_j/\tau}, \qquad \nabla\Phi = p, \qquad
    \nabla^2\Phi = \tfrac1\tau\big(\mathrm{diag}(p) - pp^\top\big) = \tfrac1\tau F(p),

where :math:`\Phi` is the log-sum-exp potential (the convex conjugate of the entropic regularizer,
i.e. the dual of the forward problem) and :math:`F(p)` the Fisher information of the categorical
distribution in its natural parameters.  Everything is batched over leading dimensions.
"""

from __future__ import annotations

import torch

from ._validation import as_float_tensor, check_dim, check_finite, check_positive, check_probability_vector

__all__ = [
    "advantage_gradient",
    "fisher_information",
    "log_sum_exp_potential",
    "natural_gradient",
    "reinforce_estimate",
]


def _policy_and_reward(p, reward, dim: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    p = as_float_tensor(p, "p", min_ndim=1)
    d = check_dim(dim, p.ndim)
    check_probability_vector(p, "p", dim=d)
    u = as_float_tensor(reward, "reward", like=p)
    check_finite(u, "reward")
    try:
        torch.broadcast_shapes(p.shape, u.shape)
    except RuntimeError as err:
        raise ValueError(f"reward of shape {tuple(u.shape)} does not broadcast to p of shape {tuple(p.shape)}") from err
    return p, u, d


def advantage_gradient(p: torch.Tensor, reward: torch.Tensor, tau: float = 1.0, dim: int = -1) -> torch.Tensor:
    r"""Gradient of the expected reward with respect to the scores, in advantage form.

    .. math::

        \frac{\partial}{\partial s_j}\,\mathbb E_{p}[u] = \frac{1}{\tau}\,p_j\big(u_j-\mathbb E_p[u]\big),
        \qquad p=\operatorname{softmax}(s/\tau),

    the advantage-based policy gradient of seed 003.  Sign convention: this is the *ascent*
    direction for :math:`L=\mathbb E_p[u]`.  In backpropagation through softmax with loss
    :math:`\ell`, put :math:`u = \partial\ell/\partial p` and the result is :math:`\partial\ell/\partial s`
    (a descent step subtracts it).

    Args:
        p: ``(..., n)`` probabilities along ``dim``.
        reward: :math:`u`, broadcastable to ``p``.
        tau: temperature :math:`\tau>0` of the softmax that produced ``p``.
        dim: dimension of the keys.

    Returns:
        The gradient, broadcast shape of ``p`` and ``reward``.
    """
    p, u, d = _policy_and_reward(p, reward, dim)
    tau = check_positive(tau, "tau")
    baseline = (p * u).sum(dim=d, keepdim=True)
    return p * (u - baseline) / tau


def natural_gradient(p: torch.Tensor, reward: torch.Tensor, tau: float = 1.0, dim: int = -1) -> torch.Tensor:
    r"""Natural gradient of :math:`\mathbb E_p[u]` in score coordinates: :math:`\tau\,(u - \mathbb E_p[u])`.

    The Fisher metric of :math:`p=\operatorname{softmax}(s/\tau)` in the coordinates :math:`s` is
    :math:`F(p)/\tau^2` (:func:`fisher_information`), and the Euclidean gradient is
    :math:`F(p)\,u/\tau` (:func:`advantage_gradient`), so

    .. math::

        (F/\tau^2)^{+}\,F u/\tau = \tau\,\Pi\,u = \tau\big(u - \mathbb E_p[u]\,\mathbf 1\big)

    up to the direction :math:`\mathbf 1` that does not move :math:`p` (we return the
    representative centred under :math:`p`): the advantage itself, unweighted by :math:`p` (the
    "geometry dictates the gradient" reading of seed 003).

    Args:
        p, reward, tau, dim: as in :func:`advantage_gradient`.

    Returns:
        :math:`\tau(u-\mathbb E_p[u])`, broadcast shape of ``p`` and ``reward``.
    """
    p, u, d = _policy_and_reward(p, reward, dim)
    tau = check_positive(tau, "tau")
    return tau * (u - (p * u).sum(dim=d, keepdim=True))


def fisher_information(p: torch.Tensor, dim: int = -1) -> torch.Tensor:
    r"""Fisher information of a categorical distribution in natural parameters, :math:`\mathrm{diag}(p)-pp^\top`.

    .. math::

        F(p) = \mathbb E_{j\sim p}\big[(e_j-p)(e_j-p)^\top\big] = \mathrm{diag}(p) - p p^\top ,

    the matrix seed 003 identifies with the Hessian of the log-sum-exp potential (times
    :math:`\tau`) and with the softmax Jacobian (times :math:`1/\tau`).

    Args:
        p: probabilities along ``dim``.
        dim: dimension of the categories (moved last in the result).

    Returns:
        ``(..., n, n)``, where ``...`` are the other dimensions of ``p``.
    """
    p = as_float_tensor(p, "p", min_ndim=1)
    d = check_dim(dim, p.ndim)
    check_probability_vector(p, "p", dim=d)
    p = p.movedim(d, -1)
    return torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)


def log_sum_exp_potential(scores: torch.Tensor, tau: float = 1.0, dim: int = -1) -> torch.Tensor:
    r"""The log-sum-exp potential :math:`\Phi(s) = \tau\log\sum_j e^{s_j/\tau}`.

    .. math::

        \Phi(s) = \max_{p\in\Delta}\;\langle s,p\rangle + \tau H(p), \qquad
        \nabla\Phi(s) = \operatorname{softmax}(s/\tau), \qquad
        \nabla^2\Phi(s) = \tfrac1\tau\big(\mathrm{diag}(p)-pp^\top\big),

    the dual representation of the forward problem in seed 003 (the value of the one-sided EOT
    problem with the sign flipped).  A row of all ``-inf`` scores gives :math:`-\infty`.

    Args:
        scores: any shape.
        tau: temperature :math:`\tau>0`.
        dim: dimension that is reduced.

    Returns:
        ``scores`` with ``dim`` reduced, in ``scores``' dtype (computed in float32 for half inputs).
    """
    x = as_float_tensor(scores, "scores", min_ndim=1)
    check_finite(x, "scores", allow_neg_inf=True)
    d = check_dim(dim, x.ndim)
    tau = check_positive(tau, "tau")
    work = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    return (tau * torch.logsumexp(work / tau, dim=d)).to(x.dtype)


def reinforce_estimate(
    p: torch.Tensor,
    reward: torch.Tensor,
    tau: float = 1.0,
    n_samples: int = 1,
    baseline: bool = True,
    generator: torch.Generator | None = None,
    *,
    reduce: bool = True,
) -> torch.Tensor:
    r"""Monte-Carlo (REINFORCE) estimate of :func:`advantage_gradient` from sampled keys.

    .. math::

        \hat g = \frac1K\sum_{k=1}^K \big(u_{j_k} - b\big)\,\frac{e_{j_k}-p}{\tau},\qquad
        j_k\sim p,\qquad b = \mathbb E_p[u] \text{ (baseline) or } 0 ,

    using :math:`\nabla_s\log p_j = (e_j-p)/\tau`.  Both choices of :math:`b` are unbiased; the
    baseline is the variance reduction that seed 003 says backpropagation performs exactly.

    Args:
        p: ``(..., n)`` probabilities (last dimension).
        reward: :math:`u`, broadcastable to ``p``.
        tau: temperature :math:`\tau>0`.
        n_samples: number :math:`K\ge1` of sampled keys per distribution.
        baseline: subtract :math:`\mathbb E_p[u]`.
        generator: optional ``torch.Generator`` for reproducible sampling.
        reduce: average over samples (``(..., n)``); if False return every single-sample
            estimate, ``(n_samples, ..., n)``, for variance studies.

    Returns:
        The estimate(s).
    """
    p, u, _ = _policy_and_reward(p, reward, -1)
    tau = check_positive(tau, "tau")
    if isinstance(n_samples, bool) or not isinstance(n_samples, int) or n_samples < 1:
        raise ValueError(f"n_samples must be an int >= 1; got {n_samples!r}")
    shape = torch.broadcast_shapes(p.shape, u.shape)
    p = p.expand(shape)
    u = u.expand(shape)
    n = shape[-1]
    flat_p = p.reshape(-1, n)
    idx = torch.multinomial(flat_p, n_samples, replacement=True, generator=generator)  # (B, K)
    flat_u = u.reshape(-1, n)
    b = (flat_p * flat_u).sum(-1, keepdim=True) if baseline else torch.zeros_like(flat_u[:, :1])
    weight = (flat_u.gather(-1, idx) - b).transpose(0, 1)  # (K, B)
    onehot = torch.nn.functional.one_hot(idx.transpose(0, 1), n).to(p.dtype)  # (K, B, n)
    est = weight.unsqueeze(-1) * (onehot - flat_p) / tau
    est = est.reshape(n_samples, *shape)
    return est.mean(dim=0) if reduce else est
