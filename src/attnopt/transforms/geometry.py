r"""The backward pass of softmax attention as a policy gradient, and its information geometry (chapter 3).

Litman (2025) reads the scores :math:`s` as the natural parameters
of the policy :math:`p = \operatorname{softmax}(s/\tau)` and an upstream signal :math:`u` (a reward,
or the gradient :math:`\partial\ell/\partial p` that backpropagation delivers) as the return of
each key.  With :math:`L(s) = \mathbb E_{p}[u] = \langle p, u\rangle`, in advantage form (the
baseline :math:`\mathbb E_p[u]` removes variance):

.. math::

    \frac{\partial L}{\partial s_j} = \frac{1}{\tau}\, p_j\,\big(u_j - \mathbb E_p[u]\big),

    \Phi(s) = \tau \log\sum_j e^{s_j/\tau}, \qquad \nabla\Phi = p,

    \nabla^2\Phi = \tfrac1\tau\big(\mathrm{diag}(p) - pp^\top\big) = \tfrac1\tau F(p),

where :math:`\Phi` is the log-sum-exp potential (the convex conjugate of the entropic regularizer,
i.e. the dual of the forward problem) and :math:`F(p)` the Fisher information of the categorical
distribution in its natural parameters.  Everything is batched over leading dimensions.

References:
    Litman (2025), *Scaled-Dot-Product Attention as One-Sided Entropic Optimal Transport*,
    arXiv:2508.08369, its backward-pass and information-geometry results (stated by content: we do
    not cite its numbering).  Williams (1992), *Simple Statistical Gradient-Following Algorithms for
    Connectionist Reinforcement Learning* (REINFORCE, with a baseline).  Amari (1998),
    *Natural Gradient Works Efficiently in Learning*.
"""

from __future__ import annotations

import math

import torch

from .._validation import (
    all_finite,
    as_float_tensor,
    broadcast_shapes,
    check_bool,
    check_dim,
    check_finite,
    check_int,
    check_positive,
    check_probability_vector,
    check_same_device,
    check_same_dtype,
    require,
)

__all__ = [
    "advantage_gradient",
    "fisher_information",
    "log_sum_exp_potential",
    "natural_gradient",
    "reinforce_estimate",
]


def _policy_and_reward(p, reward, dim: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``p`` and ``reward`` checked and broadcast to one shape, and ``dim`` as an index into it."""
    p = as_float_tensor(p, "p", min_ndim=1)
    d = check_dim(dim, p.ndim)
    u = as_float_tensor(reward, "reward", like=p)
    check_same_dtype(u, "reward", p, "p")
    check_same_device(u, "reward", p, "p")
    shape = broadcast_shapes(p=p.shape, reward=u.shape)
    check_probability_vector(p, "p", dim=d)
    check_finite(u, "reward")
    return p.expand(shape), u.expand(shape), d + len(shape) - p.ndim


def _scaled_reward(p: torch.Tensor, u: torch.Tensor, d: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    r"""``u / c``, its mean under ``p``, and ``c``: the largest :math:`|u_j|` of each row (1 for a zero row).

    Every formula here is linear in :math:`u`, so it is evaluated on :math:`u/c\in[-1,1]` and
    multiplied by :math:`c` last: :math:`u_j-\mathbb E_p[u]` would overflow for rewards of opposite
    signs near the largest float, even where the answer is representable.
    """
    if u.numel() == 0:
        c = torch.ones((), dtype=u.dtype, device=u.device)
    else:
        c = u.detach().abs().amax(dim=d, keepdim=True)
        c = torch.where(c > 0, c, torch.ones_like(c))
    v = u / c
    return v, (p * v).sum(dim=d, keepdim=True), c


def advantage_gradient(p: torch.Tensor, reward: torch.Tensor, tau: float = 1.0, dim: int = -1) -> torch.Tensor:
    r"""Gradient of the expected reward with respect to the scores, in advantage form.

    .. math::

        \frac{\partial}{\partial s_j}\,\mathbb E_{p}[u] = \frac{1}{\tau}\,p_j\big(u_j-\mathbb E_p[u]\big),
        \qquad p=\operatorname{softmax}(s/\tau),

    the advantage-based policy gradient of Litman (2025).  Sign convention: this is the *ascent*
    direction for :math:`L=\mathbb E_p[u]`.  In backpropagation through softmax with loss
    :math:`\ell`, put :math:`u = \partial\ell/\partial p` and the result is :math:`\partial\ell/\partial s`
    (a descent step subtracts it).

    Args:
        p: ``(..., n)`` probabilities along ``dim``.
        reward: :math:`u`, broadcastable to ``p``.
        tau: temperature :math:`\tau>0` of the softmax that produced ``p``.
        dim: dimension of the keys.

    Returns:
        The gradient, broadcast shape of ``p`` and ``reward`` (empty for empty inputs, e.g. no key).

    Raises:
        ValueError: ``p`` negative, NaN or not summing to one along ``dim``; NaN or infinite
            rewards; shapes that do not broadcast; ``tau`` not a finite number > 0; ``dim`` out of
            range; tensors on different devices; a gradient beyond the dtype's range (a tiny
            ``tau``).
        TypeError: non-float or mixed-dtype tensors, ``tau`` not a real number, ``dim`` not an int.

    Examples:
        All of the reward on the first of three keys:

        >>> p, u = torch.tensor([0.5, 0.25, 0.25]), torch.tensor([1.0, 0.0, 0.0])
        >>> advantage_gradient(p, u)
        tensor([ 0.2500, -0.1250, -0.1250])

    References:
        Litman (2025), *Scaled-Dot-Product Attention as One-Sided Entropic Optimal Transport*, the
        backward-pass theorem.
    """
    p, u, d = _policy_and_reward(p, reward, dim)
    tau = check_positive(tau, "tau")
    v, baseline, c = _scaled_reward(p, u, d)
    # |p_j (v_j - E_p[v])| <= 2 p_j (1 - p_j) <= 1/2: the product with c cannot overflow, only the division
    out = (p * (v - baseline) * c) / tau
    fix = "" if out.dtype == torch.float64 else "; pass float64 tensors"
    require(all_finite(out), f"the advantage gradient overflows {out.dtype} (tau too small for reward){fix}")
    return out


def natural_gradient(p: torch.Tensor, reward: torch.Tensor, tau: float = 1.0, dim: int = -1) -> torch.Tensor:
    r"""Natural gradient of :math:`\mathbb E_p[u]` in score coordinates: :math:`\tau\,(u - \mathbb E_p[u])`.

    The Fisher metric of :math:`p=\operatorname{softmax}(s/\tau)` in the coordinates :math:`s` is
    :math:`F(p)/\tau^2` (:func:`fisher_information`), and the Euclidean gradient is
    :math:`F(p)\,u/\tau` (:func:`advantage_gradient`), so

    .. math::

        (F/\tau^2)^{+}\,F u/\tau = \tau\,\Pi\,u = \tau\big(u - \mathbb E_p[u]\,\mathbf 1\big)

    up to the direction :math:`\mathbf 1` that does not move :math:`p` (we return the
    representative centred under :math:`p`): the advantage itself, unweighted by :math:`p` (the
    "geometry dictates the gradient" reading of Litman (2025)).

    Args:
        p, reward, tau, dim: as in :func:`advantage_gradient`.

    Returns:
        :math:`\tau(u-\mathbb E_p[u])`, broadcast shape of ``p`` and ``reward``.

    Raises:
        ValueError, TypeError: as :func:`advantage_gradient` (the result overflows for a large ``tau``).

    Examples:
        The advantage itself, not weighted by :math:`p`:

        >>> p, u = torch.tensor([0.5, 0.25, 0.25]), torch.tensor([1.0, 0.0, 0.0])
        >>> natural_gradient(p, u)
        tensor([ 0.5000, -0.5000, -0.5000])

    References:
        Litman (2025), *Scaled-Dot-Product Attention as One-Sided Entropic Optimal Transport*, the
        information-geometry result.  Amari (1998), *Natural Gradient Works Efficiently in Learning*.
    """
    p, u, d = _policy_and_reward(p, reward, dim)
    tau = check_positive(tau, "tau")
    v, baseline, c = _scaled_reward(p, u, d)
    # |v - E_p[v]| <= 2: the factor that shrinks comes first, so no product overflows unless the result does
    out = (v - baseline) * c * tau if tau >= 1.0 else (v - baseline) * tau * c
    fix = "" if out.dtype == torch.float64 else "; pass float64 tensors"
    require(all_finite(out), f"the natural gradient overflows {out.dtype} (tau too large for reward){fix}")
    return out


def fisher_information(p: torch.Tensor, dim: int = -1) -> torch.Tensor:
    r"""Fisher information of a categorical distribution in natural parameters, :math:`\mathrm{diag}(p)-pp^\top`.

    .. math::

        F(p) = \mathbb E_{j\sim p}\big[(e_j-p)(e_j-p)^\top\big] = \mathrm{diag}(p) - p p^\top ,

    the matrix Litman (2025) identifies with the Hessian of the log-sum-exp potential (times
    :math:`\tau`) and with the softmax Jacobian (times :math:`1/\tau`).

    Args:
        p: probabilities along ``dim``.
        dim: dimension of the categories (moved last in the result).

    Returns:
        ``(..., n, n)``, where ``...`` are the other dimensions of ``p``.

    Raises:
        ValueError: ``p`` negative, NaN or not summing to one along ``dim``; ``dim`` out of range.
        TypeError: ``p`` not floating, ``dim`` not an int.

    Examples:
        It is the Jacobian of softmax (here at :math:`\tau=1`):

        >>> s = torch.tensor([0.3, -1.0, 2.0])
        >>> softmax = lambda x: torch.softmax(x, dim=-1)
        >>> jacobian = torch.autograd.functional.jacobian(softmax, s)
        >>> torch.allclose(fisher_information(torch.softmax(s, -1)), jacobian)
        True

    References:
        Litman (2025), *Scaled-Dot-Product Attention as One-Sided Entropic Optimal Transport*, the
        Hessian-Fisher identity.  Amari (1998), *Natural Gradient Works Efficiently in Learning*.
    """
    p = as_float_tensor(p, "p", min_ndim=1)
    d = check_dim(dim, p.ndim)
    check_probability_vector(p, "p", dim=d)
    p = p.movedim(d, -1)
    return torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)


def log_sum_exp_potential(scores: torch.Tensor, tau: float = 1.0, dim: int = -1) -> torch.Tensor:
    r"""The log-sum-exp potential :math:`\Phi(s) = \tau\log\sum_j e^{s_j/\tau}`.

    .. math::

        \Phi(s) = \max_{p\in\Delta}\;\langle s,p\rangle + \tau H(p),

        \nabla\Phi(s) = \operatorname{softmax}(s/\tau), \qquad
        \nabla^2\Phi(s) = \tfrac1\tau\big(\mathrm{diag}(p)-pp^\top\big),

    the dual representation of the forward problem in Litman (2025) (the value of the one-sided EOT
    problem with the sign flipped).  A row of all ``-inf`` scores gives :math:`-\infty`.

    Args:
        scores: any shape.
        tau: temperature :math:`\tau>0`.
        dim: dimension that is reduced.

    Computed as :math:`m+\tau\log\sum_j e^{(s_j-m)/\tau}` with :math:`m=\max_j s_j`, the shift
    coming before the division by :math:`\tau` (which a small :math:`\tau` would overflow), so the
    value is finite for every finite row.  A row of all ``-inf`` scores, or of no score (``n = 0``, an
    empty sum), gives :math:`-\infty` with a zero gradient (the zero row that softmax gives it).

    Returns:
        ``scores`` with ``dim`` reduced, in ``scores``' dtype (computed in float32 for half inputs).

    Raises:
        ValueError: NaN or ``+inf`` scores, ``tau`` not a finite number > 0, ``dim`` out of range,
            a value beyond the dtype's range (a row within :math:`\tau\log n` of the largest float).
        TypeError: ``scores`` not floating, ``tau`` not a real number, ``dim`` not an int.

    Examples:
        :math:`\Phi` tends to the largest score as :math:`\tau\to0`:

        >>> s = torch.tensor([1.0, 3.0])
        >>> log_sum_exp_potential(s), log_sum_exp_potential(s, tau=0.01)
        (tensor(3.1269), tensor(3.))

    References:
        Litman (2025), *Scaled-Dot-Product Attention as One-Sided Entropic Optimal Transport*, the
        dual (log-sum-exp) representation of the forward problem.
    """
    x = as_float_tensor(scores, "scores", min_ndim=1)
    d = check_dim(dim, x.ndim)
    tau = check_positive(tau, "tau")
    check_finite(x, "scores", allow_neg_inf=True)
    work = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    if work.shape[d] == 0:  # the log of an empty sum
        return (work.sum(dim=d) - math.inf).to(x.dtype)
    top = work.detach().amax(dim=d, keepdim=True)
    empty = top == -math.inf  # rows of all -inf
    top = torch.where(empty, torch.zeros_like(top), top)
    # a tau that rounds to 0 in the working dtype would make 0 / 0 at the maximum: divide by its smallest
    # normal number instead, which gives the tau -> 0 limit (the maximum) to within its resolution
    div = max(tau, torch.finfo(work.dtype).tiny)
    # sum_j e^{(s_j - m)/tau} is >= 1 (the maximum contributes 1), or 0 for an empty row, whose log is then
    # taken of 1 instead: -inf is put in by where, and no 0 * inf reaches the gradient
    total = torch.exp((work - top) / div).sum(dim=d, keepdim=True)
    log_total = torch.log(torch.where(empty, torch.ones_like(total), total))
    value = torch.where(empty, -math.inf, top + div * log_total).squeeze(d).to(x.dtype)
    require((value < math.inf).all(), f"log_sum_exp_potential overflows {x.dtype}: scores too close to its largest value")
    return value


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

        \begin{gathered}
        \hat g = \frac1K\sum_{k=1}^K \big(u_{j_k} - b\big)\,\frac{e_{j_k}-p}{\tau},\qquad
        j_k\sim p,\\
        b = \mathbb E_p[u] \text{ (baseline) or } 0 ,
        \end{gathered}

    using :math:`\nabla_s\log p_j = (e_j-p)/\tau`.  Both choices of :math:`b` are unbiased; the
    baseline is the variance reduction that Litman (2025) says backpropagation performs exactly.

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
        The estimate(s); an empty batch gives an empty result.

    Raises:
        ValueError: as :func:`advantage_gradient`; ``n_samples < 1``; distributions over no key
            (``n = 0``, nothing to sample) in a non-empty batch.
        TypeError: as :func:`advantage_gradient`; ``n_samples`` not an int, ``baseline`` or
            ``reduce`` not a bool, ``generator`` not a ``torch.Generator``.

    Examples:
        Averaged over many samples, the estimate is the exact gradient:

        >>> p, u = torch.tensor([0.5, 0.25, 0.25]), torch.tensor([1.0, 0.0, 0.0])
        >>> gen = torch.Generator().manual_seed(0)
        >>> g = reinforce_estimate(p, u, n_samples=100_000, generator=gen)
        >>> torch.allclose(g, advantage_gradient(p, u), atol=0.01)
        True

    References:
        Williams (1992), *Simple Statistical Gradient-Following Algorithms for Connectionist
        Reinforcement Learning* (REINFORCE, with a baseline).  Litman (2025), the backward-pass
        theorem.
    """
    p, u, d = _policy_and_reward(p, reward, -1)
    tau = check_positive(tau, "tau")
    n_samples = check_int(n_samples, "n_samples", 1)
    baseline = check_bool(baseline, "baseline")
    reduce = check_bool(reduce, "reduce")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None; got {type(generator).__name__}")
    shape = p.shape
    n = shape[-1]
    if p.numel() == 0:
        if n == 0 and math.prod(shape[:-1]) > 0:
            raise ValueError(f"p has no key to sample (shape {tuple(shape)} with n = 0): a distribution over no key has no sample")
        return p.new_zeros(shape) if reduce else p.new_zeros((n_samples, *shape))
    v, mean_v, c = _scaled_reward(p, u, d)  # v = u / c in [-1, 1]: the estimate is c times that of v
    flat_p = p.reshape(-1, n)
    idx = torch.multinomial(flat_p, n_samples, replacement=True, generator=generator)  # (B, K)
    flat_v = v.reshape(-1, n)
    b = mean_v.reshape(-1, 1) if baseline else torch.zeros_like(flat_v[:, :1])
    weight = (flat_v.gather(-1, idx) - b).transpose(0, 1)  # (K, B), at most 2 in size
    onehot = torch.nn.functional.one_hot(idx.transpose(0, 1), n).to(p.dtype)  # (K, B, n)
    est = weight.unsqueeze(-1) * (onehot - flat_p)
    flat_c = c.expand(shape[:-1] + (1,)).reshape(-1, 1)
    est = est * flat_c / tau if tau <= 1.0 else est / tau * flat_c  # no product overflows unless the result does
    est = est.reshape(n_samples, *shape)
    fix = "" if est.dtype == torch.float64 else "; pass float64 tensors"
    require(all_finite(est), f"the REINFORCE estimate overflows {est.dtype} (tau too small for reward){fix}")
    return est.mean(dim=0) if reduce else est
