"""The variants of Assignment 1 (attention as a Fenchel dual), drawn from the course secret.

Variant 0 of every task is the one in ``source/ch1_fenchel_dual/ch1_fenchel_dual.ipynb``: the
public one, whose solution anyone can read in this repository. A course never draws it
(``tools/assignments.py``): each task below lists the variants a course draws from, and each changes
what must be derived (another quantity of the Gaussian case, another dual, another preference,
another direction of sensitivity), not only a number, so that a copy of the public solution fails
its checks. ``params`` reach the hidden checks (``h.params``); ``cells`` say how the variant's
notebook differs from variant 0's: a grade id (or ``task:N`` for the text of Task N, ``intro`` for
the table) maps to the cell's new text, or to ``(old, new)`` replacements that must each match once.

Equation numbers are those of the built book (chapter 1): (1.22) the dual, (1.24) the recovery,
(1.26) the exact estimate, (1.27) the residual, (1.29) the reduced dual, (1.30) the Newton step,
(1.34) the quadratic approximation of the maximizer, (1.42) the weights, (1.45) T5's preference,
(1.48) the true preference, (1.51) the gradient of the transport conjugate, (1.52) the transport
dual, (1.54) its Hessian, (1.56) OT attention; Exercises 1.3 (a matrix-valued reliability), 1.4
(the Gaussian preference with any covariance) and 1.9 (the dual in the Gram matrix).
"""

from __future__ import annotations

HIDDEN = "# hidden checks: other inputs, drawn from the course key, when the notebook is graded\n" \
         "from coursework import hidden_checks\n\nhidden_checks(\"{task}\", globals())"


def _row(old: str, new: str) -> tuple[str, str]:
    """A row of the intro's table: ``| N | what you write |`` changes, the points stay."""
    return old, new


# ------------------------------------------------------------------ Task 1: another closed form of the Gaussian case


GAUSSIAN_ESTIMATE = {
    "about": "the Gaussian exact estimate h = mu + Sigma lambda* (the mean of the tilt) instead of lambda*",
    "params": {"function": "gaussian_estimate"},
    "cells": {
        "intro": [_row("| 1 | $\\lambda^\\ast$ for a Gaussian preference, in closed form |",
                       "| 1 | the exact estimate $\\hat h$ for a Gaussian preference, in closed form |")],
        "task:1": """## Task 1 · The Gaussian estimate in closed form (3 points)

For a Gaussian preference $u=\\mathcal N(\\mu,\\Sigma)$ the log moment generating function is exactly
quadratic, $\\log\\mathbb E_{t\\sim u}\\,e^{\\langle t,\\lambda\\rangle}=\\langle\\lambda,\\mu\\rangle+\\tfrac12\\lambda^\\top\\Sigma\\lambda$,
so the dual (1.22) is a concave quadratic. The layer does not output $\\lambda^\\ast$ but the exact
estimate $\\hat h$ of eq. (1.26), the mean of the optimal distribution $\\tilde p$ of eq. (1.24).
Find $\\lambda^\\ast$, then show that the tilt of $\\mathcal N(\\mu,\\Sigma)$ by $\\lambda^\\ast$ is again a
Gaussian (complete the square in the exponent) and read off its mean; check your formula against
the posterior-mean form of Exercise 1.4. Implement `gaussian_estimate(mu, b, alpha, cov=None)`:

* `mu`, `b`: tensors of shape `(..., d)` (any leading batch dimensions);
* `alpha`: a positive number;
* `cov`: a symmetric positive-definite `(d, d)` matrix, or `None` for the identity.

It returns $\\hat h$ with shape `(..., d)`. Solve a linear system (`torch.linalg.solve`) rather
than forming an inverse.""",
        "gaussian_lambda_star": '''def gaussian_estimate(mu, b, alpha, cov=None):
    """The exact estimate, the mean of the optimal distribution, for the preference N(mu, cov)."""
    ### BEGIN SOLUTION
    z = b - mu
    if cov is None:
        return mu + alpha / (1 + alpha) * z
    eye = torch.eye(z.shape[-1], dtype=z.dtype)
    rhs = z.unsqueeze(-1)
    lam = alpha * torch.linalg.solve((eye + alpha * cov).expand(*rhs.shape[:-2], -1, -1), rhs).squeeze(-1)
    # the tilt of N(mu, cov) by lam is N(mu + cov lam, cov): its mean is the estimate (cov is symmetric)
    return mu + lam @ cov
    ### END SOLUTION''',
        "test_gaussian_lambda_star": '''# Task 1: your estimate is the mean of the optimal distribution (1.24), computed here by quadrature on a grid,
# with lambda* found by Newton steps on the dual (1.22).
from coursework import check_close, check_shape, own

f = own(gaussian_estimate, globals())  # your function, run with attnopt unavailable
g = torch.Generator().manual_seed(1)
d, alpha = 2, 0.7
mu, b = torch.randn(d, generator=g), torch.randn(d, generator=g)
A = torch.randn(d, d, generator=g)
cov = A @ A.T + 0.5 * torch.eye(d)
side = torch.linspace(-18.0, 18.0, 91)
grid = torch.cartesian_prod(side, side)  # 91 x 91 points 0.4 apart, far wider than every density below


def dual_maximizer(mu, b, cov):
    """Newton's method on the dual (1.22) for u = N(mu, cov), with the log-mgf of Task 1 and autograd's derivatives."""
    def dual(lam):
        return lam @ b - lam @ lam / (2 * alpha) - (lam @ mu + 0.5 * lam @ cov @ lam)

    lam = torch.zeros(d)
    for _ in range(3):
        hessian = torch.autograd.functional.hessian(dual, lam)
        lam = lam - torch.linalg.solve(hessian, torch.autograd.functional.jacobian(dual, lam))
    return lam


def tilted_mean(mu, cov, lam):
    """The mean of the density proportional to u(t) exp<t, lam>, u = N(mu, cov), by the trapezoidal rule on the grid."""
    centred = grid - mu
    log_density = -0.5 * ((centred @ torch.linalg.inv(cov)) * centred).sum(-1) + grid @ lam
    return torch.softmax(log_density, dim=0) @ grid  # the spacing and the normalizing constants cancel


def estimate(mu, b, cov):
    return tilted_mean(mu, cov, dual_maximizer(mu, b, cov))


h = f(mu, b, alpha, cov)
check_shape(h, (d,), "the estimate for d = 2")
lam = dual_maximizer(mu, b, cov)
check_close(h, tilted_mean(mu, cov, lam), "the estimate with a full covariance, against the tilted mean by quadrature",
            atol=1e-12,
            hint="yours is lambda*, the dual maximizer: the estimate is the mean of the tilted preference"
            if torch.allclose(h, lam, atol=1e-10) else
            "yours is mu + lambda*: the tilt does move the mean of N(mu, Sigma), but not by lambda* itself"
            if torch.allclose(h, mu + lam, atol=1e-10) else
            "complete the square in the exponent of the tilted density: which Gaussian is it?")
check_close(f(mu, b, alpha), estimate(mu, b, torch.eye(d)), "the estimate with cov=None", atol=1e-12)
mus, bs = torch.randn(4, 5, d, generator=g), torch.randn(4, 5, d, generator=g)
expected = torch.stack([estimate(m, o, torch.eye(d)) for m, o in zip(mus.reshape(-1, d), bs.reshape(-1, d))])
check_close(f(mus, bs, alpha), expected.reshape(4, 5, d), "the estimate for a (4, 5, 2) batch", atol=1e-12)
check_close(f(mus[0], bs[0], alpha, cov), torch.stack([estimate(m, o, cov) for m, o in zip(mus[0], bs[0])]),
            "the estimate for a (5, 2) batch with a full covariance", atol=1e-12)
''' + HIDDEN.format(task="gaussian_lambda_star"),
    },
}

WEIGHTED_GAUSSIAN = {
    "about": "lambda* for a Gaussian preference with a matrix-valued reliability W (Exercise 1.3): (I + W Sigma)^-1 W z",
    "params": {"function": "gaussian_lambda_star_weighted"},
    "cells": {
        "intro": [_row("| 1 | $\\lambda^\\ast$ for a Gaussian preference, in closed form |",
                       "| 1 | $\\lambda^\\ast$ for a Gaussian preference and a matrix-valued reliability |")],
        "task:1": """## Task 1 · A matrix-valued reliability, in closed form (3 points)

Exercise 1.3 replaces the scalar reliability $\\alpha$ by a symmetric positive-definite matrix $W$:
the penalty becomes $\\frac12(b-T^\\top p)^\\top W(b-T^\\top p)$, so the evidence can be reliable in some
directions and not in others. Derive the dual $D_W$ of this problem (the conjugate of the
Mahalanobis penalty replaces the term $\\frac1{2\\alpha}\\lVert\\lambda\\rVert^2$ of eq. (1.22)); then,
for a Gaussian preference $u=\\mathcal N(\\mu,\\Sigma)$, whose log moment generating function is
$\\langle\\lambda,\\mu\\rangle+\\tfrac12\\lambda^\\top\\Sigma\\lambda$, set the gradient of $D_W$ to zero and
write $\\lambda^\\ast$ with no inverse of $W$ in it. Check that $W=\\alpha I$ gives the maximizer of
Exercise 1.4. Implement `gaussian_lambda_star_weighted(mu, b, weight, cov=None)`:

* `mu`, `b`: tensors of shape `(..., d)` (any leading batch dimensions);
* `weight`: the matrix $W$, symmetric positive-definite, shape `(d, d)`;
* `cov`: a symmetric positive-definite `(d, d)` matrix, or `None` for the identity.

It returns $\\lambda^\\ast$ with shape `(..., d)`. Solve a linear system (`torch.linalg.solve`)
rather than forming an inverse. Careful: $W$ and $\\Sigma$ need not commute.""",
        "gaussian_lambda_star": '''def gaussian_lambda_star_weighted(mu, b, weight, cov=None):
    """The maximizer of the dual with the penalty 1/2 (b - m)^T W (b - m), for the preference N(mu, cov)."""
    ### BEGIN SOLUTION
    # D_W = <lam, z> - lam^T (W^-1 + cov) lam / 2: multiply the stationarity condition by W
    z = b - mu
    eye = torch.eye(z.shape[-1], dtype=z.dtype)
    system = eye + weight if cov is None else eye + weight @ cov
    rhs = (z @ weight).unsqueeze(-1)  # W z, W being symmetric
    return torch.linalg.solve(system.expand(*rhs.shape[:-2], -1, -1), rhs).squeeze(-1)
    ### END SOLUTION''',
        "test_gaussian_lambda_star": '''# Task 1: your lambda* tilts N(mu, Sigma) to the minimizer of the problem of Exercise 1.3, found here by Newton
# steps on that problem's objective over the tilts of the preference.
from coursework import check_close, check_shape, own

f = own(gaussian_lambda_star_weighted, globals())  # your function, run with attnopt unavailable
g = torch.Generator().manual_seed(1)
d = 2
mu, b = torch.randn(d, generator=g), torch.randn(d, generator=g)
A, B = torch.randn(d, d, generator=g), torch.randn(d, d, generator=g)
cov = A @ A.T + 0.5 * torch.eye(d)
W = B @ B.T + 0.3 * torch.eye(d)


def log_mgf(lam, mu, cov):  # log E_u exp<t, lam> for u = N(mu, cov), as Task 1 states it
    return lam @ mu + 0.5 * lam @ cov @ lam


def primal(lam, mu, b, W, cov):
    """The objective of Exercise 1.3 at the tilt of u = N(mu, cov) by lam: the penalty of its mean plus its KL to u."""
    with torch.enable_grad():
        lam = lam if lam.requires_grad else lam.detach().requires_grad_(True)
        (mean,) = torch.autograd.grad(log_mgf(lam, mu, cov), lam, create_graph=True)  # the mean of the tilt
        kl = lam @ mean - log_mgf(lam, mu, cov)  # KL(tilt || u) = E_tilt <t, lam> - log E_u exp<t, lam>
        return 0.5 * (b - mean) @ W @ (b - mean) + kl


def primal_gradient(lam, mu, b, W, cov):
    return torch.autograd.functional.jacobian(lambda x: primal(x, mu, b, W, cov), lam)


def minimizer(mu, b, W, cov):  # Newton's method on the objective over the tilts, with autograd's derivatives
    lam = torch.zeros(d)
    for _ in range(3):
        hessian = torch.autograd.functional.hessian(lambda x: primal(x, mu, b, W, cov), lam)
        lam = lam - torch.linalg.solve(hessian, primal_gradient(lam, mu, b, W, cov))
    return lam


lam = f(mu, b, W, cov)
check_shape(lam, (d,), "lambda* for d = 2")
W_diagonal, cov_diagonal = torch.diag(torch.tensor([0.5, 2.0])), torch.diag(torch.tensor([1.5, 0.7]))  # they commute
right_when_commuting = torch.allclose(f(mu, b, W_diagonal, cov_diagonal), minimizer(mu, b, W_diagonal, cov_diagonal),
                                      atol=1e-10)
right_at_identity = torch.allclose(f(mu, b, torch.eye(d), cov), minimizer(mu, b, torch.eye(d), cov), atol=1e-10)
check_close(primal_gradient(lam.detach(), mu, b, W, cov), torch.zeros(d),
            "the gradient of the objective of Exercise 1.3 over the tilts, at your lambda*", atol=1e-10,
            hint="yours is right when W and Sigma commute: they need not, so check the side on which each matrix"
                 " multiplies" if right_when_commuting else
                 "yours is right for W = I only: check how W enters the conjugate of the Mahalanobis penalty"
                 if right_at_identity else
                 "write the dual D_W, then set its gradient to zero")
check_close(lam, minimizer(mu, b, W, cov), "lambda* against Newton's method on the objective of Exercise 1.3",
            atol=1e-12)
a = 0.7
check_close(f(mu, b, a * torch.eye(d)), minimizer(mu, b, a * torch.eye(d), torch.eye(d)),
            "lambda* with W = 0.7 I and cov=None", atol=1e-12)
mus, bs = torch.randn(4, 5, d, generator=g), torch.randn(4, 5, d, generator=g)
expected = torch.stack([minimizer(m, o, a * torch.eye(d), torch.eye(d))
                        for m, o in zip(mus.reshape(-1, d), bs.reshape(-1, d))])
check_close(f(mus, bs, a * torch.eye(d)), expected.reshape(4, 5, d), "lambda* for a (4, 5, 2) batch, W = 0.7 I",
            atol=1e-12)
check_close(f(mus[0], bs[0], W, cov), torch.stack([minimizer(m, o, W, cov) for m, o in zip(mus[0], bs[0])]),
            "lambda* for a (5, 2) batch with W and a full covariance", atol=1e-12)
''' + HIDDEN.format(task="gaussian_lambda_star"),
    },
}


# ------------------------------------------------------------------ Task 2: the dual maximizer in other coordinates, or of another dual


GRAM_NEWTON = {
    "about": "the exact weights by Newton's method on the reduced dual (1.29) in the Gram matrix, from G, s and u only",
    "params": {"function": "newton_gram_weights"},
    "cells": {
        "intro": [_row("| 2 | $\\lambda^\\ast$ for a discrete preference, by Newton's method |",
                       "| 2 | the exact weights from the Gram matrix, by Newton's method |")],
        "task:2": """## Task 2 · The exact weights from the Gram matrix, by Newton's method (3 points)

With many more dimensions than templates, the dual is better solved in $\\mathbb R^n$ than in
$\\mathbb R^d$. Writing $\\lambda=\\alpha z+T^\\top c$ turns the dual into the reduced dual $\\Phi(c)$ of
eq. (1.29), which sees the templates only through their Gram matrix $G=TT^\\top$ and the scores
$s=Tz$ (Exercise 1.9). With $p(c)=\\operatorname{softmax}(\\log u+\\alpha s+Gc)$, derive
$\\nabla\\Phi(c)$ and $\\nabla^2\\Phi(c)$, and show that the Newton step can be taken as eq. (1.30),
$\\Delta c=-\\alpha(I_n+\\alpha SG)^{-1}r$ with $S=\\operatorname{diag}p-pp^\\top$ and $r=c/\\alpha+p-u$,
even when $G$ is singular (more templates than dimensions); say why $I_n+\\alpha SG$ is invertible.

Implement `newton_gram_weights(scores, gram, u, alpha, n_iter=30)` for one problem: `scores` $s$ has
shape `(n,)`, `gram` $G$ `(n, n)`, `u` `(n,)` (non-negative, summing to one, **zeros allowed**: a zero
masks its template). Start at $c=0$ (that is, $\\lambda_0=\\alpha z$), take plain Newton steps (the
inputs of these tests, visible and hidden, are ones where they converge), stop early once
$\\lVert r\\rVert_\\infty<10^{-13}$, and return the exact weights $\\tilde p=p(c^\\ast)$ of eq. (1.24),
shape `(n,)`: unlike $c^\\ast$, they are unique.""",
        "newton_dual": '''def newton_gram_weights(scores, gram, u, alpha, n_iter=30):
    """The exact weights p(c*) of the reduced dual Phi, from the scores s = T z and the Gram matrix G = T T^T."""
    ### BEGIN SOLUTION
    log_u = torch.log(u)  # log 0 = -inf: a masked template gets weight 0
    c = torch.zeros_like(u)
    eye = torch.eye(u.shape[-1], dtype=u.dtype)
    for _ in range(n_iter):
        p = torch.softmax(log_u + alpha * scores + gram @ c, dim=-1)
        residual = c / alpha + p - u  # grad Phi = -G r
        if residual.abs().max() < 1e-13:
            break
        S = torch.diag(p) - torch.outer(p, p)
        c = c - alpha * torch.linalg.solve(eye + alpha * S @ gram, residual)
    return torch.softmax(log_u + alpha * scores + gram @ c, dim=-1)
    ### END SOLUTION''',
        "test_newton_dual": '''# Task 2: your weights are those of the dual maximizer (solve_dual), with 8 templates in 64 dimensions and
# with 10 templates in 3 (a singular Gram matrix), also with masked templates (zeros in u).
from attnopt.fenchel import solve_dual
from coursework import check, check_close, check_shape, own

f = own(newton_gram_weights, globals())
g = torch.Generator().manual_seed(2)
alpha = 0.8
for n, d in ((8, 64), (10, 3)):
    T = torch.randn(n, d, generator=g) / d ** 0.25
    z = torch.randn(d, generator=g)
    u = torch.rand(n, generator=g)
    u = u / u.sum()
    exact = torch.softmax(torch.log(u) + T @ solve_dual(u @ T + z, T, u, alpha), dim=-1)
    p = f(T @ z, T @ T.T, u, alpha)
    check_shape(p, (n,), f"the weights for {n} templates in {d} dimensions")
    check_close(p.sum(), torch.tensor(1.0), "the sum of your weights", atol=1e-12,
                hint="return the weights p(c*), not the coefficients c*")
    generalized = torch.softmax(torch.log(u) + alpha * T @ z, dim=-1)
    check_close(p, exact, f"the weights for {n} templates in {d} dimensions, against solve_dual's maximizer", atol=1e-10,
                hint="yours are the weights of generalized attention, c = 0: take the Newton steps"
                if torch.allclose(p, generalized, atol=1e-12) else
                "check the sign of the step and the factor alpha of eq. (1.30), and that each step recomputes p and r")
u_masked = u.clone()
u_masked[:2] = 0.0  # two masked templates: log 0 = -inf must give them weight 0
u_masked = u_masked / u_masked.sum()
p = f(T @ z, T @ T.T, u_masked, alpha)
check(torch.all(p[:2] == 0), "the weights of the masked templates", "exactly 0", p[:2],
      hint="a zero of u must give its template weight exactly 0 (log 0 = -inf)")
exact = torch.softmax(torch.log(u_masked) + T @ solve_dual(u_masked @ T + z, T, u_masked, alpha), dim=-1)
check_close(p, exact, "the weights with two masked templates, against solve_dual's maximizer", atol=1e-10)
''' + HIDDEN.format(task="newton_dual"),
    },
}

OT_NEWTON = {
    "about": "lambda* of the transport-regularized dual (1.52) by Newton's method, with the Hessian (1.54)",
    "params": {"function": "newton_ot_dual"},
    "cells": {
        "intro": [_row("| 2 | $\\lambda^\\ast$ for a discrete preference, by Newton's method |",
                       "| 2 | $\\lambda^\\ast$ of the optimal-transport dual, by Newton's method |")],
        "task:2": """## Task 2 · The optimal-transport dual by Newton's method (3 points)

Replacing the KL divergence by the entropic transport cost $\\mathcal W_\\gamma(p,u;C)$ gives the dual
$D_\\gamma$ of eq. (1.52), whose log-sum-exp term is a $u$-weighted sum of one log-sum-exp per
preferred template $t_j$. Let $q_j(\\lambda)$ be the Gibbs distribution
$q_j(\\lambda)_i\\propto\\exp\\big((\\langle t_i,\\lambda\\rangle-C_{ij})/\\gamma\\big)$ over the receiving
templates $i$, and $p(\\lambda)=\\sum_ju_jq_j(\\lambda)$ (eq. (1.51) at the scores $T\\lambda$). Derive

$$
\\nabla D_\\gamma(\\lambda)=b-\\frac{\\lambda}{\\alpha}-T^\\top p(\\lambda),\\qquad
\\nabla^2D_\\gamma(\\lambda)=-\\frac{I}{\\alpha}-\\frac1\\gamma\\sum_ju_j\\operatorname{Cov}_{q_j(\\lambda)}(t),
$$

the second from eq. (1.54), and say why $-D_\\gamma$ is $\\frac1\\alpha$-strongly convex. Implement
`newton_ot_dual(b, templates, u, cost, alpha, gamma, n_iter=30)` for one problem: `b` has shape
`(d,)`, `templates` `(n, d)`, `u` `(n,)` (non-negative, summing to one, zeros allowed: a template
with $u_j=0$ sends nothing, but may still receive weight), `cost` $C$ `(n, n)` with
`cost[i, j]` $=C_{ij}$, the price of moving mass from $t_j$ to $t_i$ (finite, not necessarily
symmetric). Start at $\\lambda_0=\\alpha(b-T^\\top\\tilde u)$, with $\\tilde u=p(0)$ the true preference
of eq. (1.48), take plain Newton steps (the inputs of these tests are ones where they converge) and
stop early once $\\lVert\\nabla D_\\gamma\\rVert_\\infty<10^{-13}$. Return $\\lambda^\\ast$, shape `(d,)`.""",
        "newton_dual": '''def newton_ot_dual(b, templates, u, cost, alpha, gamma, n_iter=30):
    """The maximizer of the transport-regularized dual D_gamma, cost[i, j] the price from t_j to t_i."""
    ### BEGIN SOLUTION
    T = templates
    eye = torch.eye(T.shape[-1], dtype=T.dtype)

    def gibbs(lam):  # q[i, j]: the Gibbs distribution of column j over the receiving templates i
        return torch.softmax(((T @ lam)[:, None] - cost) / gamma, dim=0)

    lam = alpha * (b - (gibbs(torch.zeros_like(b)) @ u) @ T)  # alpha z, z measured from the true preference
    for _ in range(n_iter):
        q = gibbs(lam)
        p = q @ u
        grad = b - lam / alpha - p @ T
        if grad.abs().max() < 1e-13:
            break
        means = q.T @ T  # row j: the mean template under q_j
        cov = T.T @ (p[:, None] * T) - means.T @ (u[:, None] * means)  # sum_j u_j Cov_{q_j}(t)
        lam = lam - torch.linalg.solve(-eye / alpha - cov / gamma, grad)
    return lam
    ### END SOLUTION''',
        "test_newton_dual": '''# Task 2: your lambda* is a stationary point of the transport dual, also with templates that send nothing (u_j = 0).
from attnopt.fenchel import solve_ot_dual, true_preference as library_true_preference
from coursework import check_close, check_shape, own

f = own(newton_ot_dual, globals())
g = torch.Generator().manual_seed(2)
n, d, alpha, gamma = 8, 3, 0.8, 0.7
T = torch.randn(n, d, generator=g)
C = torch.cdist(T, T) + 0.3 * torch.rand(n, n, generator=g) * (1 - torch.eye(n))  # not symmetric
u = torch.rand(n, generator=g)
u = u / u.sum()


def dual_gradient(lam, b, u):
    lam = lam.detach().requires_grad_(True)
    lse = torch.logsumexp(((T @ lam)[:, None] - C) / gamma, dim=0)  # one log-sum-exp per sending template j
    D = lam @ b - lam @ lam / (2 * alpha) - gamma * (torch.where(u > 0, u, 0.0) * lse).sum()
    return torch.autograd.grad(D, lam)[0]


for which, pref in (("a preference of full support", u), ("three templates that send nothing", None)):
    if pref is None:
        pref = u.clone()
        pref[:3] = 0.0
        pref = pref / pref.sum()
    b = library_true_preference(pref, C, gamma) @ T + 0.5 * torch.randn(d, generator=g)  # near the true preference's mean
    lam = f(b, T, pref, C, alpha, gamma)
    check_shape(lam, (d,), "lambda*")
    by_rows = torch.softmax(((T @ lam)[:, None] - C) / gamma, dim=1) @ pref  # each row of the cost normalized instead
    rows = (b - lam / alpha - by_rows @ T).abs().max() < 1e-9
    check_close(dual_gradient(lam, b, pref), torch.zeros(d), f"the dual's gradient at your lambda*, {which}", atol=1e-9,
                hint="q_j is a distribution over the receiving templates i, for each sending template j: normalize"
                     " each column of the cost matrix, not each row" if rows else
                     "the Newton steps did not reach the maximizer: check the gradient, the Hessian of eq. (1.54)"
                     " with its factor 1/gamma, and the number of steps")
    check_close(lam, solve_ot_dual(b, T, pref, C, alpha, gamma), f"lambda*, {which}, against solve_ot_dual", atol=1e-9,
                hint="check your Hessian against eq. (1.54), its sign and its factor 1/gamma included")
''' + HIDDEN.format(task="newton_dual"),
    },
}


# ------------------------------------------------------------------ Task 3: another closed-form layer


CORRECTED_ATTENTION = {
    "about": "the weights with the query alpha (I + alpha Sigma_u)^-1 z of eq. (1.34) instead of alpha z",
    "params": {"function": "corrected_attention_weights"},
    "cells": {
        "intro": [_row("| 3 | generalized attention weights; SDPA with and without a boolean mask |",
                       "| 3 | attention weights with the curvature-corrected query of eq. (1.34) |")],
        "task:3": """## Task 3 · Attention with a curvature-corrected query (2 points)

Generalized attention substitutes $\\alpha z$ for $\\lambda^\\ast$. The step before it in the
heuristic derivation keeps the quadratic term of the cumulant expansion and gives the better
query $\\lambda_2=\\alpha(I_d+\\alpha\\Sigma_u)^{-1}z$ of eq. (1.34), where
$\\Sigma_u=\\operatorname{Cov}_{i\\sim u}(k_i)$ is the covariance of the keys under the preference. Show
that $\\lambda_2=\\alpha z-\\alpha^2\\Sigma_uz+O(\\alpha^3)$ agrees with $\\lambda^\\ast$ to second order
(eq. (1.41)), and implement `corrected_attention_weights(z, keys, u=None, alpha=1.0)`, the weights
$p=\\operatorname{softmax}(\\log u+K\\lambda_2)$ of eq. (1.42) with $\\lambda_2$ in place of $\\alpha z$:

* queries `z` of shape `(..., n_q, d)` and keys `(..., n, d)`;
* `u` broadcastable to the weights' shape `(..., n_q, n)` (each query may have its own preference,
  hence its own $\\Sigma_u$ and its own $\\lambda_2$), or `None` for the uniform preference;
* zeros of `u` must give weights that are exactly zero (and do not enter $\\Sigma_u$).

Return the weights, shape `(..., n_q, n)`, with no Python loop over the queries.""",
        "attention_weights": '''def corrected_attention_weights(z, keys, u=None, alpha=1.0):
    """softmax(log u + <k_i, lambda_2>) with lambda_2 = alpha (I + alpha Cov_u(k))^-1 z, for each query."""
    ### BEGIN SOLUTION
    n = keys.shape[-2]
    if u is None:
        u = torch.full((n,), 1.0 / n, dtype=keys.dtype)
    u = u.expand(torch.broadcast_shapes(u.shape, z.shape[:-1] + (n,), keys.shape[:-2] + (1, n)))
    mean = u @ keys  # (..., n_q, d): the keys' mean under each query's preference
    cov = torch.einsum("...qi,...ia,...ib->...qab", u, keys, keys) - mean.unsqueeze(-1) * mean.unsqueeze(-2)
    eye = torch.eye(keys.shape[-1], dtype=keys.dtype)
    lam = alpha * torch.linalg.solve(eye + alpha * cov, z.expand(mean.shape).unsqueeze(-1)).squeeze(-1)
    return torch.softmax(torch.log(u) + lam @ keys.transpose(-1, -2), dim=-1)
    ### END SOLUTION''',
        "test_attention_weights": '''# Task 3: against the covariance of the keys computed query by query; masked keys; closer to the exact weights.
from attnopt.fenchel import solve_dual
from coursework import check, check_close, check_shape, own

f = own(corrected_attention_weights, globals())
g = torch.Generator().manual_seed(3)
n_q, n, d, alpha = 5, 7, 4, 0.5
q = torch.randn(2, n_q, d, generator=g)
k = torch.randn(2, n, d, generator=g)
u = torch.rand(2, n_q, n, generator=g)
u = u / u.sum(-1, keepdim=True)
p = f(q, k, u, alpha)
check_shape(p, (2, n_q, n), "weights for queries (2, 5, 4) and keys (2, 7, 4)")
expected = torch.empty(2, n_q, n)
for i in range(2):
    for j in range(n_q):
        cov = torch.cov(k[i].T, correction=0, aweights=u[i, j])  # the keys' covariance under u[i, j]
        lam = alpha * torch.linalg.inv(torch.eye(d) + alpha * cov) @ q[i, j]
        expected[i, j] = torch.softmax(torch.log(u[i, j]) + k[i] @ lam, dim=-1)
plain = torch.softmax(torch.log(u) + alpha * q @ k.transpose(-1, -2), dim=-1)
check_close(p, expected, f"the weights with alpha = {alpha}, against the covariance query by query", atol=1e-12,
            hint="yours are the weights of generalized attention, with the query alpha z"
            if torch.allclose(p, plain, atol=1e-12) else
            "Sigma_u is a covariance: the second moment of the keys under u minus the outer product of their mean")
mask = torch.rand(n_q, n, generator=g) < 0.6
mask[:, 0] = True
u_mask = mask / mask.sum(-1, keepdim=True)
p_masked = f(q, k, u_mask, alpha)
check(torch.all(p_masked[..., ~mask] == 0), "weights of masked keys", "exactly 0", p_masked[..., ~mask].abs().max(),
      hint="add log u to the scores: log 0 = -inf")
# one query: the corrected weights are closer than generalized attention's to the exact ones
T, z, pref = k[0], q[0, 0], u[0, 0]
exact = torch.softmax(torch.log(pref) + T @ solve_dual(pref @ T + z, T, pref, 0.1), dim=-1)
gap_corrected = (f(z[None], T, pref, 0.1)[0] - exact).abs().max()
gap_plain = (torch.softmax(torch.log(pref) + 0.1 * T @ z, dim=-1) - exact).abs().max()
check(gap_corrected < 0.1 * gap_plain, "the distance to the exact weights at alpha = 0.1",
      f"below a tenth of generalized attention's, {gap_plain.item():.3g}", gap_corrected)
''' + HIDDEN.format(task="attention_weights"),
    },
}

OT_ATTENTION = {
    "about": "the OT-based attention weights (1.56): a u-weighted mixture of one Gibbs distribution per preferred key",
    "params": {"function": "ot_attention_weights"},
    "cells": {
        "intro": [_row("| 3 | generalized attention weights; SDPA with and without a boolean mask |",
                       "| 3 | the weights of optimal-transport attention |")],
        "task:3": """## Task 3 · The weights of optimal-transport attention (2 points)

With the entropic transport cost in place of the KL divergence, the small-$\\alpha$ approximation
$\\lambda^\\ast\\approx\\alpha z$ in the recovery formula (1.53) gives the OT-based attention weights
of eq. (1.56): each preferred key $k_j$ spreads its preference $u_j$ over all keys by a Gibbs
distribution that combines the scores $\\alpha\\langle k_i,z\\rangle$ with the cost $C_{ij}$ of moving
mass from $k_j$ to $k_i$, at temperature $\\gamma$. Say why a key with $u_i=0$ can now receive
weight, and what the weights become as $\\alpha\\to0$ (eq. (1.48)).

Implement `ot_attention_weights(z, keys, u, cost, alpha=1.0, gamma=1.0)`: queries `z` of shape
`(..., n_q, d)`, keys `(..., n, d)`, `u` broadcastable to `(..., n_q, n)` (zeros allowed), `cost` of
shape `(n, n)` with `cost[i, j]` $=C_{ij}$, finite or `+inf` off the diagonal (not necessarily
symmetric). Return the weights, shape `(..., n_q, n)`, with no Python loop; scores of several
hundred must not overflow.""",
        "attention_weights": '''def ot_attention_weights(z, keys, u, cost, alpha=1.0, gamma=1.0):
    """p_i = sum_j u_j exp((alpha <k_i, z> - C_ij) / gamma) / Z_j, the weights of OT attention."""
    ### BEGIN SOLUTION
    scores = alpha * z @ keys.transpose(-1, -2)  # (..., n_q, n)
    # column j: the Gibbs distribution over the receiving keys i of the mass that key j sends
    q = torch.softmax((scores.unsqueeze(-1) - cost) / gamma, dim=-2)  # (..., n_q, n_i, n_j)
    return (q * u.unsqueeze(-2)).sum(-1)
    ### END SOLUTION''',
        "test_attention_weights": '''# Task 3: your weights are the gradient (1.51) of the transport conjugate (1.50) at the scores alpha <k_i, z>, taken
# here by autograd; zero costs forget the preference; no overflow.
from coursework import check, check_close, check_shape, own

f = own(ot_attention_weights, globals())
g = torch.Generator().manual_seed(3)
n_q, n, d, alpha, gamma = 5, 6, 4, 0.7, 0.5
q = torch.randn(2, n_q, d, generator=g)
k = torch.randn(2, n, d, generator=g)
C = torch.cdist(k[0], k[0]) + 0.5 * torch.rand(n, n, generator=g) * (1 - torch.eye(n))  # not symmetric
C[0, 3] = float("inf")  # key 3 cannot send mass to key 0
u = torch.rand(n, generator=g)
u[1] = 0.0
u = u / u.sum()
p = f(q, k, u, C, alpha, gamma)
check_shape(p, (2, n_q, n), "weights for queries (2, 5, 4) and keys (2, 6, 4)")


def transport_conjugate(s):
    """The conjugate (1.50) of W_gamma(., u; C) at the scores s[..., i] (without its constant gamma H(u)), summed
    over the leading dimensions: cost[i, j] = C_ij, the price from key j to key i."""
    return gamma * (u * torch.logsumexp((s.unsqueeze(-1) - C) / gamma, dim=-2)).sum()


scores = (alpha * q @ k.transpose(-1, -2)).requires_grad_(True)
(expected,) = torch.autograd.grad(transport_conjugate(scores), scores)
check_close(p, expected, "the weights against the gradient (1.51) of the transport conjugate", atol=1e-12,
            hint="C_ij is the price of moving mass from key j to key i: the normalizer Z_j sums over the"
                 " receiving keys i" if torch.allclose(f(q, k, u, C.T, alpha, gamma), expected, atol=1e-12) else
                 "your weights do not sum to one: the normalizer Z_j of the mass that key j sends sums over the"
                 " receiving keys i" if not torch.allclose(p.sum(-1), torch.ones(2, n_q), atol=1e-10) else
                 "each preferred key j spreads its mass u_j with its own normalizer Z_j")
check(p[..., 1].min() > 0, "the weight of the key with u = 0", "> 0 (mass flows to it)", p[..., 1].min())
check_close(p.sum(-1), torch.ones(2, n_q), "row sums of the weights")
zero_cost = torch.softmax(alpha * q @ k.transpose(-1, -2) / gamma, dim=-1)
check_close(f(q, k, u, torch.zeros(n, n), alpha, gamma), zero_cost, "the weights with zero costs (u forgotten)")
check_close(f(300 * q, k, u, C, alpha, gamma).sum(-1), torch.ones(2, n_q), "row sums for the queries times 300 (no overflow)",
            hint="normalize each Gibbs distribution in log space")
''' + HIDDEN.format(task="attention_weights"),
    },
}


# ------------------------------------------------------------------ Task 4: another preference


TRUE_PREFERENCE = {
    "about": "the true preference (1.48) of the transport-regularized problem, from u, the costs and gamma",
    "params": {"function": "true_preference"},
    "cells": {
        "intro": [_row("| 4 | T5's preference from a position bias and a mask |",
                       "| 4 | the true preference of optimal-transport attention |")],
        "task:4": """## Task 4 · The true preference (2 points)

With the entropic transport cost $\\mathcal W_\\gamma(p,u;C)$ in place of the KL divergence, the
distribution that the regularizer prefers is no longer $u$ but the true preference $\\tilde u$ of
eq. (1.48): each unit of preference at $t_j$ is spread over the templates by the Gibbs distribution
of the costs $C_{\\cdot j}$ of moving mass from $t_j$. Implement `true_preference(u, cost, gamma)` for
`u` of shape `(..., n)` (non-negative, summing to one, zeros allowed) and `cost` of shape `(n, n)`
with `cost[i, j]` $=C_{ij}$, the price from $t_j$ to $t_i$: finite on the diagonal, finite or `+inf`
elsewhere, not necessarily symmetric. Return $\\tilde u$, shape `(..., n)`. A small $\\gamma$ (costs
of several hundred times $\\gamma$) must not overflow or give `nan`.""",
        "t5_preference": '''def true_preference(u, cost, gamma):
    """The minimizer over the simplex of W_gamma(p, u; C): sum_j u_j exp(-C_ij / gamma) / Z_j."""
    ### BEGIN SOLUTION
    gibbs = torch.softmax(-cost / gamma, dim=-2)  # column j: where the mass at t_j goes
    return (gibbs * u.unsqueeze(-2)).sum(-1)
    ### END SOLUTION''',
        "test_t5_preference": '''# Task 4: your true preference is p(0), the gradient (1.51) of the transport conjugate (1.50) at zero scores, taken
# here by autograd; a probability vector; the limits gamma -> 0 (Exercise 1.7) and gamma -> infinity.
from coursework import check, check_close, check_shape, own

f = own(true_preference, globals())
g = torch.Generator().manual_seed(4)
n, gamma = 7, 0.6
T = torch.randn(n, 2, generator=g)
C = torch.cdist(T, T) + 0.5 * torch.rand(n, n, generator=g) * (1 - torch.eye(n))  # not symmetric
C[2, 5] = float("inf")  # no mass from t_5 to t_2
u = torch.rand(n, generator=g)
u[0] = 0.0
u = u / u.sum()
found = f(u, C, gamma)
check_shape(found, (n,), "the true preference")


def transport_conjugate(s, gamma):
    """The conjugate (1.50) of W_gamma(., u; C) at the scores s (without its constant gamma H(u)):
    cost[i, j] = C_ij, the price from t_j to t_i."""
    return gamma * (u * torch.logsumexp((s.unsqueeze(-1) - C) / gamma, dim=-2)).sum()


zero = torch.zeros(n, requires_grad=True)
(expected,) = torch.autograd.grad(transport_conjugate(zero, gamma), zero)
check_close(found, expected, "the true preference against the gradient (1.51) of the conjugate at zero scores", atol=1e-14,
            hint="C_ij is the price from t_j to t_i: the Gibbs distribution of column j normalizes over the"
                 " receiving templates i" if torch.allclose(f(u, C.T, gamma), expected, atol=1e-12) else
                 "your true preference does not sum to one: the Gibbs distribution of column j normalizes over the"
                 " receiving templates i" if not torch.allclose(found.sum(), torch.tensor(1.0), atol=1e-10) else
                 "each unit of preference at t_j is spread by its own Gibbs distribution")
check_close(found.sum(), torch.tensor(1.0), "the sum of the true preference")
gap = (C - torch.diag(C)[None, :]).masked_fill(torch.eye(n, dtype=torch.bool), float("inf")).min()
small = f(u, C, 0.01)
check((small - u).abs().sum() <= 2 * (n - 1) * torch.exp(-gap / 0.01), "the l1 distance to u at gamma = 0.01",
      f"at most 2 (n - 1) exp(-Delta / gamma) = {(2 * (n - 1) * torch.exp(-gap / 0.01)).item():.3g}",
      (small - u).abs().sum(), hint="normalize each Gibbs distribution in log space")
check_close(small, torch.autograd.grad(transport_conjugate(zero, 0.01), zero)[0],
            "the true preference at gamma = 0.01 against the gradient of the conjugate", atol=1e-14,
            hint="normalize each Gibbs distribution in log space")
check_close(f(u, C + 10.0, 0.01), small, "the true preference at gamma = 0.01 for the costs + 10 (no underflow)",
            atol=1e-14, hint="adding one constant to every cost changes no Gibbs distribution: normalize in log space")
check_close(f(u, C.clamp(max=5.0), 1e4), torch.full((n,), 1 / n), "the true preference at gamma = 1e4 (nearly uniform)",
            atol=1e-3)
batch = torch.rand(3, 4, n, generator=g)
batch = batch / batch.sum(-1, keepdim=True)
check_close(f(batch, C, gamma)[1, 2], f(batch[1, 2], C, gamma), "a (3, 4, 7) batch of preferences", atol=1e-15)
''' + HIDDEN.format(task="t5_preference"),
    },
}

CAUSAL_T5 = {
    "about": "T5's decoder preference from a table of backward offset biases, a causal mask and a padding mask",
    "params": {"function": "causal_t5_preference"},
    "cells": {
        "intro": [_row("| 4 | T5's preference from a position bias and a mask |",
                       "| 4 | the preference of T5's decoder from a table of offset biases |")],
        "task:4": """## Task 4 · The preference of T5's decoder (2 points)

T5's bias depends only on the offset between the query and key positions, and in the decoder's
self-attention it looks only backwards: a query at position $j$ may attend to the keys $i\\le j$
that are not padding, with the bias $\\beta_{j-i}$ of eq. (1.45). Write the preference $u_{j\\cdot}$
of every query $j$ as in eq. (1.45), with the causal mask and the padding as its zeros, and
implement `causal_t5_preference(offset_bias, padding)`:

* `offset_bias`: the table $(\\beta_0,\\dots,\\beta_{n-1})$ of shape `(..., n)` (any leading batch
  dimensions, e.g. one table per head), $\\beta_k$ the bias of a key $k$ positions back;
* `padding`: a boolean tensor broadcastable to the shape of `offset_bias`, `True` for a real word
  (that may be attended to), `False` for padding; the first word is always real.

It returns $u$ of shape `(..., n, n)`, query $j$ along the second-last dimension and key $i$ along
the last, with no Python loop. Rows sum to one; biases of a few hundred must not overflow.""",
        "t5_preference": '''def causal_t5_preference(offset_bias, padding):
    """u[..., j, i] proportional to exp(beta_(j - i)) on the real keys i <= j, 0 elsewhere."""
    ### BEGIN SOLUTION
    n = offset_bias.shape[-1]
    offset = torch.arange(n)[:, None] - torch.arange(n)[None, :]  # j - i
    bias = offset_bias[..., offset.clamp(min=0)]  # (..., n, n): beta_(j - i)
    allowed = (offset >= 0) & padding.unsqueeze(-2)
    return torch.softmax(bias.masked_fill(~allowed, float("-inf")), dim=-1)
    ### END SOLUTION''',
        "test_t5_preference": '''# Task 4: generalized attention with your preference is SDPA with the bias, the causal mask and the padding as a float mask.
from coursework import check, check_close, check_shape, own

f = own(causal_t5_preference, globals())
g = torch.Generator().manual_seed(4)
n, d = 7, 8
q, k, v = torch.randn(n, d, generator=g), torch.randn(n, d, generator=g), torch.randn(n, 3, generator=g)
beta = 2 * torch.randn(n, generator=g)
padding = torch.tensor([True, True, True, True, True, False, False])
u = f(beta, padding)
check_shape(u, (n, n), "u for a table of 7 biases")
check_close(u.sum(-1), torch.ones(n), "row sums of u")
allowed = torch.ones(n, n, dtype=torch.bool).tril() & padding
check(torch.all(u[~allowed] == 0), "u on later words and on padding", "exactly 0", u[~allowed].abs().max(),
      hint="a query may attend only to real words at or before its own position")
bias = torch.tensor([[beta[j - i].item() if i <= j else 0.0 for i in range(n)] for j in range(n)])
float_mask = bias.masked_fill(~allowed, float("-inf"))
weights = torch.softmax(torch.log(u) + q @ k.T / math.sqrt(d), dim=-1)  # generalized attention, alpha = 1/sqrt(d)
check_close(weights @ v, F.scaled_dot_product_attention(q, k, v, attn_mask=float_mask), "output against SDPA with the bias",
            hint="key i of query j carries the bias of the offset j - i, not i - j")
check_close(f(beta + 300.0, padding), u, "u for the biases + 300 (no overflow)", hint="normalize in log space")
heads = torch.randn(2, 3, n, generator=g)
check_close(f(heads, padding)[1, 2], f(heads[1, 2], padding), "a (2, 3, 7) batch of tables", atol=1e-15)
''' + HIDDEN.format(task="t5_preference"),
    },
}


VARIANTS = {
    "gaussian_lambda_star": [GAUSSIAN_ESTIMATE, WEIGHTED_GAUSSIAN],
    "newton_dual": [GRAM_NEWTON, OT_NEWTON],
    "attention_weights": [CORRECTED_ATTENTION, OT_ATTENTION],
    "t5_preference": [TRUE_PREFERENCE, CAUSAL_T5],
}


# ------------------------------------------------------------------ Tasks 6 and 7: the sensitivity in another direction


_ROW_6 = "| 6 | a derivation: how $\\lambda^\\ast$ and the weights move with $\\alpha$ |"

EVIDENCE_SENSITIVITY = {
    "about": "the Jacobians of lambda* and of the exact estimate in the observation b, alpha (I + alpha Sigma_p)^-1 and "
             "Sigma_p times it, instead of the derivatives in alpha",
    "params": {"function": "evidence_sensitivity"},
    "cells": {
        "intro": [_row(_ROW_6, "| 6 | a derivation: how $\\lambda^\\ast$ and the estimate move with the evidence |")],
        "task:6": """## Task 6 · How the estimate moves with the evidence: a derivation (2 points, graded by hand)

Generalized attention moves its query linearly with the evidence: $\\alpha z$ has the Jacobian
$\\alpha I$ in $z$. The exact estimate knows $\\lambda^\\ast(b)$ only implicitly, as the maximizer of
the dual (1.22) for the observation $b=\\mu+z$. How much do $\\lambda^\\ast$ and the exact estimate
$\\hat h=T^\\top p(\\lambda^\\ast)$ of eq. (1.26) move when the observation moves? For a discrete
preference $u$ (zeros allowed) on the templates $T$:

* **(a)** Derive the Jacobian $\\partial\\lambda^\\ast/\\partial b$ in terms of $\\alpha$ and the covariance
  $\\Sigma_p=\\operatorname{Cov}_{i\\sim p}(t_i)$ of the templates under the exact weights
  $p=p(\\lambda^\\ast)$, and say why the matrix you invert is always invertible.
* **(b)** Derive the Jacobian $\\partial\\hat h/\\partial b$; show from the residual form (1.27) that it is
  $I-\\frac1\\alpha\\,\\partial\\lambda^\\ast/\\partial b$, and that its eigenvalues lie in $[0,1)$: the
  estimate never moves further than the observation. In which directions does it not move at all?
* **(c)** Check (a) and (b) on the Gaussian preference of Task 1 (Exercise 1.4), where both are known in
  closed form, read $\\partial\\hat h/\\partial b$ there as the gain of a Bayesian update, and find the
  limits of $\\partial\\lambda^\\ast/\\partial b$ as $\\alpha\\to0$ and of $\\partial\\hat h/\\partial b$ as
  $\\alpha\\to\\infty$ when $\\Sigma$ is invertible.

*Where to start:* $\\lambda^\\ast(b)$ makes the gradient of $D$ vanish for every $b$. Write your
derivation in the cell below (Markdown and LaTeX); Task 7 turns it into code.""",
        "written_dual_sensitivity": """**(a)** For every $b$, $\\nabla D(\\lambda^\\ast)=b-\\lambda^\\ast/\\alpha-T^\\top p(\\lambda^\\ast)=0$. The Jacobian of
$\\lambda\\mapsto T^\\top p(\\lambda)$ is $T^\\top(\\operatorname{diag}p-pp^\\top)T=\\Sigma_p$. Differentiating the
stationarity condition in $b$ (implicit function theorem), $I-\\frac1\\alpha J-\\Sigma_pJ=0$ for
$J=\\partial\\lambda^\\ast/\\partial b$, so

$$
\\frac{\\partial\\lambda^\\ast}{\\partial b}=\\alpha\\big(I+\\alpha\\Sigma_p\\big)^{-1}.
$$

$I+\\alpha\\Sigma_p$ is symmetric with eigenvalues at least $1$ ($\\Sigma_p\\succeq0$, $\\alpha>0$); it is $-\\alpha$
times the Hessian of $D$, which strong concavity keeps away from singular. The Jacobian is
symmetric, with eigenvalues $\\alpha/(1+\\alpha\\sigma)\\in(0,\\alpha]$, $\\sigma$ those of $\\Sigma_p$.

**(b)** $\\hat h=T^\\top p(\\lambda^\\ast)$, so by the chain rule
$\\partial\\hat h/\\partial b=\\Sigma_p\\,\\partial\\lambda^\\ast/\\partial b=\\alpha\\Sigma_p(I+\\alpha\\Sigma_p)^{-1}$.
The residual form (1.27), $\\hat h=b-\\lambda^\\ast/\\alpha$, gives directly
$\\partial\\hat h/\\partial b=I-(I+\\alpha\\Sigma_p)^{-1}$, the same matrix. Its eigenvalues are
$\\alpha\\sigma/(1+\\alpha\\sigma)\\in[0,1)$: a move of the observation moves the estimate by less, in every
direction. It does not move at all along the null space of $\\Sigma_p$, the directions orthogonal to
the differences of the templates that $p$ charges (a masked template has $p_i=0$ and adds nothing
to $\\Sigma_p$): the estimate is a mean of these templates and cannot leave their affine hull.

**(c)** For $u=\\mathcal N(\\mu,\\Sigma)$, $\\lambda^\\ast=\\alpha(I+\\alpha\\Sigma)^{-1}(b-\\mu)$ and
$\\hat h=\\mu+\\alpha\\Sigma(I+\\alpha\\Sigma)^{-1}(b-\\mu)$, and every tilt of a Gaussian has the covariance
$\\Sigma$, so $\\Sigma_p=\\Sigma$: (a) and (b) give $\\alpha(I+\\alpha\\Sigma)^{-1}$ and $\\alpha\\Sigma(I+\\alpha\\Sigma)^{-1}$,
which are the derivatives of the closed forms. The second is the gain
$\\Sigma(\\Sigma+\\alpha^{-1}I)^{-1}$ of a Gaussian posterior mean with prior covariance $\\Sigma$ and
observation noise $\\alpha^{-1}I$. As $\\alpha\\to0$, $\\partial\\lambda^\\ast/\\partial b=\\alpha I+O(\\alpha^2)$, the
Jacobian of $\\alpha z$: the small-$\\alpha$ query is tangent to the exact one. As $\\alpha\\to\\infty$ with
$\\Sigma$ invertible, $\\partial\\hat h/\\partial b=I-(I+\\alpha\\Sigma)^{-1}\\to I$: a fully reliable observation
carries the estimate with it.""",
        "task:7": """## Task 7 · The sensitivity in code (3 points)

Implement `evidence_sensitivity(lam, templates, u, alpha)` from your Task 6: given the maximizer
`lam` $=\\lambda^\\ast$ (shape `(d,)`) of the dual for templates `(n, d)`, a preference `u` `(n,)`
(non-negative, summing to one, zeros allowed) and `alpha > 0`, return `(dlam_db, dh_db)`: the
Jacobians $\\partial\\lambda^\\ast/\\partial b$ and $\\partial\\hat h/\\partial b$, both of shape `(d, d)`
(entry `[a, c]` is the derivative of component $a$ in $b_c$), in closed form (no finite differences).
Solve a linear system rather than forming an inverse. The test compares your function with central
finite differences of `attnopt`'s `solve_dual` and `exact_estimate` in $b$.""",
        "dual_sensitivity": '''def evidence_sensitivity(lam, templates, u, alpha):
    """The Jacobians d lambda* / d b and d h / d b at the maximizer lam of the dual."""
    ### BEGIN SOLUTION
    T = templates
    p = torch.softmax(torch.log(u) + T @ lam, dim=-1)
    cov = T.T @ (torch.diag(p) - torch.outer(p, p)) @ T  # the templates' covariance under p
    eye = torch.eye(T.shape[-1], dtype=T.dtype)
    dlam = alpha * torch.linalg.solve(eye + alpha * cov, eye)
    return dlam, cov @ dlam
    ### END SOLUTION''',
        "test_dual_sensitivity": '''# Task 7: against central differences of solve_dual and exact_estimate in b, with and without masked templates.
from attnopt.fenchel import exact_estimate, solve_dual
from coursework import check_close, check_shape, own

f = own(evidence_sensitivity, globals())
g = torch.Generator().manual_seed(6)
n, d, alpha, step = 8, 3, 0.8, 1e-5
T = torch.randn(n, d, generator=g)
for masked in (False, True):
    u = torch.rand(n, generator=g) + 0.1
    if masked:
        u[:2] = 0.0
    u = u / u.sum()
    which = "two masked templates" if masked else "a preference of full support"
    b = u @ T + torch.randn(d, generator=g)
    moved = [(b + step * e, b - step * e) for e in torch.eye(d)]
    fd_lam = torch.stack([(solve_dual(up, T, u, alpha) - solve_dual(dn, T, u, alpha)) / (2 * step) for up, dn in moved], -1)
    fd_h = torch.stack([(exact_estimate(up, T, u, alpha) - exact_estimate(dn, T, u, alpha)) / (2 * step)
                        for up, dn in moved], -1)
    dlam, dh = f(solve_dual(b, T, u, alpha), T, u, alpha)
    check_shape(dlam, (d, d), f"d lambda*/d b, {which}")
    check_shape(dh, (d, d), f"d h/d b, {which}")
    check_close(dlam, fd_lam, f"d lambda*/d b, {which}, against central differences", atol=1e-7,
                hint="yours times alpha is the central differences: a factor alpha is missing"
                if torch.allclose(alpha * dlam, fd_lam, atol=1e-6)
                else "yours divided by alpha is the central differences: one factor alpha too many"
                if torch.allclose(dlam, alpha * fd_lam, atol=1e-6)
                else "differentiate the stationarity condition of the dual in b: lambda* moves, and so do the weights inside it")
    check_close(dh, fd_h, f"d h/d b, {which}, against central differences", atol=1e-7,
                hint="the estimate is the mean of the templates under p(lambda*): differentiate it through lambda*")
    check_close(dh, torch.eye(d) - dlam / alpha, f"d h/d b against I - (d lambda*/d b) / alpha, the residual form (1.27), {which}",
                atol=1e-12)
''' + HIDDEN.format(task="dual_sensitivity"),
    },
}

BIAS_SENSITIVITY = {
    "about": "the derivatives of lambda* and of the weights along a change v of the log-preference (a T5 bias), "
             "-alpha (I + alpha Sigma_p)^-1 Cov_p(t, v), instead of the derivatives in alpha",
    "params": {"function": "bias_sensitivity"},
    "cells": {
        "intro": [_row(_ROW_6, "| 6 | a derivation: how $\\lambda^\\ast$ and the weights move with the preference |")],
        "task:6": """## Task 6 · How the dual maximizer moves with the preference: a derivation (2 points, graded by hand)

A T5 head learns its preference: a change $v\\in\\mathbb R^n$ of the bias moves the preference along
$u_\\varepsilon\\propto u\\,e^{\\varepsilon v}$ (eq. (1.45): the bias is $\\log u$ up to a constant). The
exact estimate knows $\\lambda^\\ast(\\varepsilon)$ only implicitly, as the maximizer of the dual (1.22)
for the preference $u_\\varepsilon$, the observation $b$ being held fixed. How fast do $\\lambda^\\ast$ and
the exact weights move with $\\varepsilon$ at $\\varepsilon=0$? For a discrete preference $u$ (zeros
allowed) on the templates $T$:

* **(a)** Derive $d\\lambda^\\ast/d\\varepsilon$ in terms of $\\alpha$, the covariance
  $\\Sigma_p=\\operatorname{Cov}_{i\\sim p}(t_i)$ of the templates under the exact weights $p=p(\\lambda^\\ast)$
  and the covariance $\\operatorname{Cov}_{i\\sim p}(t_i,v_i)$ of the templates with the bias change, and say
  why the matrix you invert is always invertible. Why does a constant $v$ change nothing?
* **(b)** Derive $dp_i/d\\varepsilon$ for every template, masked ones included: can a change of the
  bias open a masked template?
* **(c)** Check (a) on the Gaussian preference of Task 1 with the linear change $v(t)=\\langle w,t\\rangle$,
  where $\\lambda^\\ast$ is known in closed form (what is $u_\\varepsilon$ then?), and find the leading term of
  $d\\lambda^\\ast/d\\varepsilon$ as $\\alpha\\to0$.

*Where to start:* $\\lambda^\\ast(\\varepsilon)$ makes the gradient of $D$ vanish for every $\\varepsilon$,
and the weights are $p=\\operatorname{softmax}(\\log u+\\varepsilon v+T\\lambda)$. Write your derivation in the
cell below (Markdown and LaTeX); Task 7 turns it into code.""",
        "written_dual_sensitivity": """**(a)** With $p_\\varepsilon(\\lambda)=\\operatorname{softmax}(\\log u+\\varepsilon v+T\\lambda)$ (the normalization of $u_\\varepsilon$
drops out), for every $\\varepsilon$,
$\\nabla D(\\lambda^\\ast)=b-\\lambda^\\ast/\\alpha-T^\\top p_\\varepsilon(\\lambda^\\ast)=0$. The derivative of the
softmax along its argument $x$ is $S\\dot x$ with $S=\\operatorname{diag}p-pp^\\top$, and here
$\\dot x=v+T\\dot\\lambda$. Differentiating the stationarity condition in $\\varepsilon$,
$-\\dot\\lambda/\\alpha-T^\\top S(v+T\\dot\\lambda)=0$, and since $T^\\top ST=\\Sigma_p$ and
$T^\\top Sv=\\sum_ip_i(t_i-\\bar t)(v_i-\\bar v)=\\operatorname{Cov}_p(t,v)$,

$$
\\frac{d\\lambda^\\ast}{d\\varepsilon}=-\\alpha\\big(I+\\alpha\\Sigma_p\\big)^{-1}\\operatorname{Cov}_{i\\sim p}(t_i,v_i).
$$

$I+\\alpha\\Sigma_p$ is symmetric with eigenvalues at least $1$ ($\\Sigma_p\\succeq0$, $\\alpha>0$): it is $-\\alpha$
times the Hessian of $D$, which strong concavity keeps away from singular. A constant $v=c\\mathbf 1$
has $\\operatorname{Cov}_p(t,v)=0$: it changes $u_\\varepsilon$ not at all, only its normalization.

**(b)** $\\dot p=S(v+T\\dot\\lambda)$, i.e. $\\dot p_i=p_i\\big(w_i-\\sum_jp_jw_j\\big)$ with
$w_i=v_i+\\langle t_i,\\dot\\lambda\\rangle$: the direct effect of the bias, corrected by the move of the
query. A masked template ($u_i=0$) has $p_i=0$ for every $\\varepsilon$ ($0\\cdot e^{\\varepsilon v_i}=0$) and
$\\dot p_i=0$, which the same formula gives: no finite bias change opens a mask.

**(c)** For $u=\\mathcal N(\\mu,\\Sigma)$ and $v(t)=\\langle w,t\\rangle$, $u_\\varepsilon\\propto u\\,e^{\\varepsilon\\langle w,t\\rangle}$ is the
tilt $\\mathcal N(\\mu+\\varepsilon\\Sigma w,\\Sigma)$. With $b$ fixed, $\\lambda^\\ast(\\varepsilon)=\\alpha(I+\\alpha\\Sigma)^{-1}(b-\\mu-\\varepsilon\\Sigma w)$,
so $d\\lambda^\\ast/d\\varepsilon=-\\alpha(I+\\alpha\\Sigma)^{-1}\\Sigma w$. Every tilt of the Gaussian has the covariance
$\\Sigma$, so $\\Sigma_p=\\Sigma$ and $\\operatorname{Cov}_p(t,\\langle w,t\\rangle)=\\Sigma w$: (a) gives the same. Raising the
bias along $w$ moves the preference's mean towards $b$ and so shrinks the evidence $z=b-\\mu$ that the
query has to explain. As $\\alpha\\to0$, $\\lambda^\\ast\\to0$, $p\\to u$ and $I+\\alpha\\Sigma_p\\to I$, so
$d\\lambda^\\ast/d\\varepsilon=-\\alpha\\operatorname{Cov}_{i\\sim u}(t_i,v_i)+O(\\alpha^2)$: the query barely moves, and the
weights move by $S_uv$, the bias alone.""",
        "task:7": """## Task 7 · The sensitivity in code (3 points)

Implement `bias_sensitivity(lam, templates, u, direction, alpha)` from your Task 6: given the maximizer
`lam` $=\\lambda^\\ast$ (shape `(d,)`) of the dual for templates `(n, d)`, a preference `u` `(n,)`
(non-negative, summing to one, zeros allowed), the bias change $v$ = `direction` `(n,)` and
`alpha > 0`, return `(dlam, dp)`: $d\\lambda^\\ast/d\\varepsilon$, shape `(d,)`, and $dp/d\\varepsilon$, shape
`(n,)`, at $\\varepsilon=0$, in closed form (no finite differences). Solve a linear system rather than
forming an inverse. The test compares your function with central finite differences of `attnopt`'s
`solve_dual` for the preferences $u_{\\pm\\varepsilon}$.""",
        "dual_sensitivity": '''def bias_sensitivity(lam, templates, u, direction, alpha):
    """d lambda* / d eps and d p / d eps at the maximizer lam, for the preference u exp(eps v) (normalized)."""
    ### BEGIN SOLUTION
    T = templates
    p = torch.softmax(torch.log(u) + T @ lam, dim=-1)
    cov = T.T @ (torch.diag(p) - torch.outer(p, p)) @ T  # the templates' covariance under p
    pull = T.T @ (p * (direction - p @ direction))  # Cov_p(t, v)
    dlam = -alpha * torch.linalg.solve(torch.eye(T.shape[-1], dtype=T.dtype) + alpha * cov, pull)
    moved = direction + T @ dlam  # how each score moves: the bias and the query
    return dlam, p * (moved - p @ moved)
    ### END SOLUTION''',
        "test_dual_sensitivity": '''# Task 7: against central differences of solve_dual for the preferences u exp(+-eps v), with and without masked templates.
from attnopt.fenchel import solve_dual
from coursework import check, check_close, check_shape, own

f = own(bias_sensitivity, globals())
g = torch.Generator().manual_seed(6)
n, d, alpha, step = 8, 3, 0.8, 1e-5
T = torch.randn(n, d, generator=g)
v = torch.randn(n, generator=g)
for masked in (False, True):
    u = torch.rand(n, generator=g) + 0.1
    if masked:
        u[:2] = 0.0
    u = u / u.sum()
    which = "two masked templates" if masked else "a preference of full support"
    b = u @ T + torch.randn(d, generator=g)
    tilted = lambda eps: torch.softmax(torch.log(u) + eps * v, dim=-1)  # u exp(eps v), normalized
    weights = lambda lam, eps: torch.softmax(torch.log(tilted(eps)) + T @ lam, dim=-1)
    up, down = solve_dual(b, T, tilted(step), alpha), solve_dual(b, T, tilted(-step), alpha)
    dlam, dp = f(solve_dual(b, T, u, alpha), T, u, v, alpha)
    check_shape(dlam, (d,), f"d lambda*/d eps, {which}")
    check_shape(dp, (n,), f"dp/d eps, {which}")
    check_close(dlam, (up - down) / (2 * step), f"d lambda*/d eps, {which}, against central differences", atol=1e-7,
                hint="yours is minus the central differences: raising the bias of templates along the evidence leaves"
                     " less for the query to explain" if torch.allclose(-dlam, (up - down) / (2 * step), atol=1e-6) else
                     "differentiate the stationarity condition of the dual in eps: the weights move with the bias and"
                     " with lambda*")
    check_close(dp, (weights(up, step) - weights(down, -step)) / (2 * step), f"dp/d eps, {which}, against central differences",
                atol=1e-7, hint="the scores log u_i + eps v_i + <t_i, lambda*> move with the bias and with lambda*")
    if masked:
        check(torch.all(dp[:2] == 0), "dp/d eps at the masked templates", "exactly 0", dp[:2])
check_close(f(up, T, u, torch.full((n,), 2.0), alpha)[0], torch.zeros(d), "d lambda*/d eps for a constant v", atol=1e-14)
''' + HIDDEN.format(task="dual_sensitivity"),
    },
}


VARIANTS["dual_sensitivity"] = [EVIDENCE_SENSITIVITY, BIAS_SENSITIVITY]
