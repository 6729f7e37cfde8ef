r"""The engine of :func:`attnopt.transforms.sinkhorn_attention`: stabilized Sinkhorn iterations and their gradients.

The two-sided entropic transport plan :math:`P=\operatorname{diag}(e^f)\,e^M\operatorname{diag}(e^g)`,
:math:`M=s/\varepsilon`, is computed by Sinkhorn iterations in the log domain, with the scalings
absorbed into the potentials :math:`f,g` every few iterations (:func:`sinkhorn_plan`).  Either a
fixed number of them (no host synchronisation, no data-dependent branch), or until the column
marginal error of the plan is below a tolerance, tested every ``CHECK_EVERY`` iterations (one host
read per test).  Its gradient is either the exact gradient of the iterations, run backwards by hand
(:class:`SinkhornUnrolledFunction`), or the implicit gradient at the fixed point
(:class:`SinkhornImplicitFunction`).  Without a gradient to compute, :func:`sinkhorn_attention`
calls :func:`sinkhorn_plan` directly, which keeps no kernel but the current one.

References:
    Cuturi (2013), *Sinkhorn Distances: Lightspeed Computation of Optimal Transport*, Alg. 1.
    Peyré and Cuturi (2019), *Computational Optimal Transport*, Secs. 4.2 (Sinkhorn's algorithm) and
    4.4 (log-domain computations).  Schmitzer (2019), *Stabilized Sparse Scaling Algorithms for
    Entropy Regularized Transport Problems* (absorbing the scalings into the potentials).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch.autograd import Function
from .._numerics import differentiable_once
from ._thresholds import safe_max

#: Iterations between two tests of the marginal error in the tolerance mode (each test is one host
#: read on a GPU, and one extra product with the kernel).
CHECK_EVERY = 10


class SinkhornResult(NamedTuple):
    r"""What :func:`attnopt.transforms.sinkhorn_attention` returns with ``return_info=True``.

    Attributes:
        weights: the attention weights :math:`W`, shaped like the scores, in their dtype.
        marginal_error: ``(...)``, the column marginal error of the returned plan
            :math:`P_{ij}=a_iW_{ij}`, :math:`\sum_j |\sum_i P_{ij} - b_j|` (its rows are exact), in
            the working dtype (float32 for half-precision scores).
        n_iter: the number of Sinkhorn iterations run (the same for the whole batch).
    """

    weights: torch.Tensor
    marginal_error: torch.Tensor
    n_iter: int


def column_error(plan: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    r"""The column marginal error :math:`\sum_j |\sum_i P_{ij} - b_j|` of each plan, ``(...)``."""
    return (plan.sum(dim=-2) - b).abs().sum(dim=-1)


def masked_log(x: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
    # log of a scaling that is 0 on dead rows/columns: use 1 there (their kernel entries are
    # already 0), so that no log(0) enters the graph.
    return torch.log(torch.where(live, x, torch.ones_like(x)))


def sinkhorn_plan(M, a, b, n_iter, absorb_every, f0=None, record=None, tol=None, info=None):
    r"""Log-stabilized Sinkhorn iterations for :math:`P = \mathrm{diag}(e^f) e^{M} \mathrm{diag}(e^g)`.

    The potentials :math:`f, g` live in the log domain.  Every ``absorb_every`` iterations the
    current scalings are absorbed into them and the kernel :math:`\tilde K = e^{M+f\oplus g}` (whose
    entries are at most about 1, being an approximate plan) is re-exponentiated; in between, the
    updates :math:`v = b / \tilde K^\top u`, :math:`u = a/\tilde K v` are matrix-vector products.
    With ``absorb_every=1`` this is the plain log-domain (log-sum-exp) iteration.  Each iteration
    ends with the row update, so rows match ``a`` exactly.

    With ``tol=None`` exactly ``n_iter`` iterations run, on a schedule that depends only on the
    iteration counter: no host synchronization, no data-dependent branch.  With a number ``tol``,
    after every ``CHECK_EVERY``-th iteration the column error :func:`column_error` of the current
    plan (largest over the batch) is read and the iterations stop once it is at most ``tol``; at
    most ``n_iter`` run.  ``f0`` is the initial row potential (default :math:`-\max_j M_{ij}`);
    ``record``, a list, receives per segment the kernel and the iterates that
    :class:`SinkhornUnrolledFunction` needs to run them backwards (without it only the current
    kernel is alive); ``info``, a list, receives the number of iterations run.
    """
    tiny = torch.finfo(M.dtype).tiny
    row_live, col_live = a > 0, b > 0
    f = -safe_max(M).squeeze(-1) if f0 is None else f0
    g = torch.zeros_like(b)
    u = torch.ones_like(a)
    v = torch.ones_like(b)
    kernel = None
    done = 0
    for t in range(n_iter):
        if t % absorb_every == 0:
            if kernel is not None:
                f = f + masked_log(u, row_live)
                g = g + masked_log(v, col_live)
                u, v = torch.ones_like(a), torch.ones_like(b)
            kernel = torch.exp(M + f.unsqueeze(-1) + g.unsqueeze(-2))
            if record is not None:
                record.append((kernel, []))
        u_prev = u
        col = torch.matmul(u.unsqueeze(-2), kernel).squeeze(-2)
        v = torch.where(col_live, b / col.clamp(min=tiny), torch.zeros_like(b))
        row = torch.matmul(kernel, v.unsqueeze(-1)).squeeze(-1)
        u = torch.where(row_live, a / row.clamp(min=tiny), torch.zeros_like(a))
        if record is not None:
            record[-1][1].append((u_prev, col, v, row, u))
        done = t + 1
        if tol is not None and done % CHECK_EVERY == 0 and done < n_iter:
            cols = torch.matmul(u.unsqueeze(-2), kernel).squeeze(-2) * v  # the plan's column sums
            if float((cols - b).abs().sum(dim=-1).max()) <= tol:  # the one host read of a test
                break
    if info is not None:
        info.append(done)
    return u.unsqueeze(-1) * kernel * v.unsqueeze(-2)


class SinkhornUnrolledFunction(Function):
    r"""The plan of :func:`sinkhorn_plan` with its unrolled gradient, run backwards by hand.

    The gradient is exactly autograd's through the iterations, but cheaper: each iteration only
    touches vectors (``u``, ``v`` and their adjoints, through products with the saved kernel), and
    the kernel's adjoint :math:`\bar K=\sum_t \bar r_t v_t^\top + u_{t-1}\bar c_t^\top` of a segment
    is formed at once as one batched matrix product, instead of two rank-one matrices per
    iteration.  Reverse of one iteration (:math:`c=K^\top u_{t-1}`, :math:`v=b/c`, :math:`r=Kv`,
    :math:`u=a/r`): :math:`\bar r=-\bar u\,u/r`, :math:`\bar v\mathrel{+}=K^\top\bar r`,
    :math:`\bar c=-\bar v\,v/c`, :math:`\bar u_{t-1}=K\bar c`; at a segment's start
    :math:`K=e^{M+f\oplus g}` gives :math:`\bar M=\bar K\odot K` and the potentials' adjoints, which
    flow to the previous segment's last :math:`u, v` through :math:`f\mathrel{+}=\log u`,
    :math:`g\mathrel{+}=\log v`.
    """

    @staticmethod
    def forward(ctx, M, f0, a, b, n_iter, absorb_every, tol, info):
        record = []
        plan = sinkhorn_plan(M, a, b, n_iter, absorb_every, f0=f0, record=record, tol=tol, info=info)
        kernels = [k for k, _ in record]
        ctx.steps = [steps for _, steps in record]  # vectors only: small
        ctx.save_for_backward(a, b, *kernels)
        ctx.graph_inputs = (M, f0)  # where a second derivative is refused (differentiable_once)
        return plan

    @staticmethod
    @differentiable_once
    def backward(ctx, grad_plan):
        a, b, *kernels = ctx.saved_tensors
        tiny = torch.finfo(a.dtype).tiny
        row_live, col_live = a > 0, b > 0
        zero_a, zero_b = torch.zeros_like(a), torch.zeros_like(b)
        # P = u K v: adjoints of the last u and v, and the last kernel's first term.
        _, _, v, _, u = ctx.steps[-1][-1]
        GK = grad_plan * kernels[-1]
        du = torch.matmul(GK, v.unsqueeze(-1)).squeeze(-1)
        dv = torch.matmul(u.unsqueeze(-2), GK).squeeze(-2)
        dK = GK.copy_(grad_plan).mul_(u.unsqueeze(-1)).mul_(v.unsqueeze(-2))  # reuse GK's memory
        grad_M = df = dg = None
        for s in range(len(kernels) - 1, -1, -1):
            K, left, right = kernels[s], [], []  # this segment's dK = sum of left_i right_i^T
            for u_prev, col, v_t, row, u_t in reversed(ctx.steps[s]):
                # Where the forward clamped a sum that underflowed (v = b / max(c, tiny)), the clamp's
                # derivative is 0: without this the adjoint would be inf and meet K = 0 as NaN.
                drow = torch.where(row_live & (row >= tiny), -du * u_t / row.clamp(min=tiny), zero_a)
                dv = dv + torch.matmul(drow.unsqueeze(-2), K).squeeze(-2)
                dcol = torch.where(col_live & (col >= tiny), -dv * v_t / col.clamp(min=tiny), zero_b)
                du = torch.matmul(K, dcol.unsqueeze(-1)).squeeze(-1)  # the adjoint of u_prev
                left += [drow, u_prev]
                right += [v_t, dcol]
                dv = zero_b  # an earlier v is used by its own row update only
            seg = torch.matmul(torch.stack(left, dim=-1), torch.stack(right, dim=-2))
            dZ = seg if dK is None else dK.add_(seg)
            # K = exp(Z), Z = M + f (+) g.  Where K underflowed to 0 the chain is 0 times an adjoint that
            # may have overflowed (u, v near 1 / tiny): the derivative of the computed K is exactly 0.
            dZ = dZ.mul_(K).masked_fill_(K == 0, 0.0)
            dK = None
            grad_M = dZ if grad_M is None else grad_M.add_(dZ)
            # f_s = f_(s-1) + log u_last: the potentials' adjoints accumulate down the segments.
            df = dZ.sum(dim=-1) if df is None else df + dZ.sum(dim=-1)
            dg = dZ.sum(dim=-2) if dg is None else dg + dZ.sum(dim=-2)
            if s > 0:
                _, _, v_last, _, u_last = ctx.steps[s - 1][-1]
                du = torch.where(row_live, df / torch.where(row_live, u_last, torch.ones_like(u_last)), zero_a)
                dv = torch.where(col_live, dg / torch.where(col_live, v_last, torch.ones_like(v_last)), zero_b)
        return grad_M, df, None, None, None, None, None, None


def rows_to_attention(plan: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    live = a > 0
    inv = torch.where(live, 1 / torch.where(live, a, torch.ones_like(a)), torch.zeros_like(a))
    return plan * inv.unsqueeze(-1)


class SinkhornImplicitFunction(Function):
    """The attention :math:`W=P/a` of :func:`sinkhorn_plan` with the implicit gradient at its fixed point.

    Differentiable once: the backward pass treats the saved plan as a constant, so a second
    derivative through it would be wrong: it raises ``RuntimeError`` (:func:`differentiable_once`).
    """

    @staticmethod
    def forward(ctx, M, a, b, n_iter, absorb_every, tol, info):
        plan = sinkhorn_plan(M, a, b, n_iter, absorb_every, tol=tol, info=info)
        ctx.save_for_backward(plan, a, b)
        ctx.graph_inputs = (M,)
        return rows_to_attention(plan, a)

    @staticmethod
    @differentiable_once
    def backward(ctx, grad_out):
        # Implicit differentiation of the marginal constraints P 1 = a, P^T 1 = b at the fixed
        # point P = exp(M + f (+) g).  With G = dL/dP, r = (G*P) 1, c = (G*P)^T 1, the adjoint
        # (x, y) solves [diag a, P; P^T, diag b] [x; y] = [r; c] and dL/dM = P * (G - x 1^T - 1 y^T).
        plan, a, b = ctx.saved_tensors
        G = rows_to_attention(grad_out, a)  # d(P/a)/dP scales each row by 1/a
        GP = G * plan
        r, c = GP.sum(dim=-1), GP.sum(dim=-2)
        row_live, col_live = a > 0, b > 0
        a_safe = torch.where(row_live, a, torch.ones_like(a))
        # Schur complement on y: (diag b - P^T diag(1/a) P) y = c - P^T (r / a); its null vector
        # (the live columns' indicator) is pinned by adding w w^T, w = 1_live / m_live, to it.
        scaled = plan / a_safe.unsqueeze(-1)
        schur = torch.diag_embed(b) - plan.transpose(-1, -2) @ scaled
        w = col_live.to(plan.dtype)
        w = w / w.sum(dim=-1, keepdim=True).clamp(min=1)
        schur = schur + w.unsqueeze(-1) * w.unsqueeze(-2) + torch.diag_embed((~col_live).to(plan.dtype))
        rhs = c - (plan.transpose(-1, -2) @ (r / a_safe).unsqueeze(-1)).squeeze(-1)
        # solve_ex: the pinned Schur complement is nonsingular, and solve() would read its error flag
        y = torch.linalg.solve_ex(schur, rhs.unsqueeze(-1))[0].squeeze(-1)
        x = torch.where(row_live, (r - (plan @ y.unsqueeze(-1)).squeeze(-1)) / a_safe, torch.zeros_like(a))
        grad_M = plan * (G - x.unsqueeze(-1) - y.unsqueeze(-2))
        return grad_M, None, None, None, None, None, None
