"""The variants of Assignment 5 (one mechanism, four views), drawn from the course secret.

Variant 0 of every task is the one in ``source/ch5_four_views/ch5_four_views.ipynb``: the public
one, whose solution anyone can read in this repository. A course never draws it
(``tools/assignments.py``): each task below lists the variants a course draws from, and each changes
what must be derived (another problem solved by the Gibbs identity, another potential or bias to
translate between the views, another base measure or regularizer on the grid), not only a number,
so that a copy of the public solution fails its checks. ``params`` reach the hidden checks
(``h.params``); ``cells`` say how the variant's notebook differs from variant 0's: a grade id (or
``task:N`` for the text of Task N, ``intro`` for the table) maps to the cell's new text, or to
``(old, new)`` replacements that must each match once.
"""

from __future__ import annotations

HIDDEN = "# hidden checks: other inputs, drawn from the course key, when the notebook is graded\n" \
         "from coursework import hidden_checks\n\nhidden_checks(\"{task}\", globals())"


def _row(old: str, new: str) -> tuple[str, str]:
    """A row of the intro's table: ``| N | what you write |`` changes, the points stay."""
    return old, new


# ------------------------------------------------------------------ Task 1: another problem with a Gibbs identity


ENTROPY_BONUS = {
    "about": "the Gibbs minimizer with an entropy bonus, min <C, p> + eps KL(p || u) - delta H(p): "
             "temperature eps + delta, base measure u^(eps / (eps + delta))",
    "params": {"function": "gibbs_extra_entropy"},
    "cells": {
        "intro": [_row("| 1 | the Gibbs minimizer and its log-partition function |",
                       "| 1 | the Gibbs minimizer with an entropy bonus, and its value |")],
        "task:1": """## Task 1 · The Gibbs minimizer with an entropy bonus (2 points)

Add an entropy bonus to the problem of Lemma 5.1: for $\\delta\\ge0$,

$$
\\min_{p\\in\\Delta^{m-1}}\\;\\langle C,p\\rangle+\\varepsilon\\operatorname{KL}(p\\Vert u)-\\delta H(p).
$$

Write the objective, as in the proof of the Gibbs identity (5.3), as a multiple of
$\\operatorname{KL}(p\\Vert p^\\ast)$ plus a constant, for a Gibbs measure $p^\\ast$ with another temperature
and another base measure: which are they, what is the optimal value, and what happens to the prior
as $\\delta$ grows?

Implement `gibbs_extra_entropy(cost, eps, u, delta)`: for costs of shape `(..., m)`, numbers
`eps > 0` and `delta >= 0` and a base measure `u` broadcastable to `cost` (non-negative, summing to
one), return `(p_star, value)` with shapes `(..., m)` and `(...)`: the minimizer and the optimal
value. A key with $u_j=0$ stays masked (weight $0$, and no `nan`); stay in log space: costs of size
$10^3(\\varepsilon+\\delta)$ must not overflow.""",
        "gibbs": '''def gibbs_extra_entropy(cost, eps, u, delta):
    """The minimizer and the value of <C, p> + eps KL(p || u) - delta H(p) over the simplex."""
    ### BEGIN SOLUTION
    # the objective is sum_j p_j (C_j - eps log u_j + (eps + delta) log p_j): a Gibbs problem at the
    # temperature eps + delta with the base measure proportional to u^(eps / (eps + delta))
    temperature = eps + delta
    logits = eps / temperature * torch.log(u) - cost / temperature
    log_Z = torch.logsumexp(logits, dim=-1)
    return torch.exp(logits - log_Z.unsqueeze(-1)), -temperature * log_Z
    ### END SOLUTION''',
        "test_gibbs": '''# Task 1: the optimality conditions on the simplex, the value is the minimum and its gradient the plan;
# delta = 0 is Lemma 5.1; a masked key; no overflow; batches.
from coursework import check, check_close, check_shape, own

f = own(gibbs_extra_entropy, globals())
g = torch.Generator().manual_seed(1)
m, eps, delta = 6, 0.7, 0.4
C = torch.randn(m, generator=g)
u = torch.rand(m, generator=g)
u = u / u.sum()
p_star, value = f(C, eps, u, delta)
check_shape(p_star, (m,), "p*")
check_shape(value, (), "the value")
objective = lambda p: p @ C + eps * (p * torch.log(p / u)).sum(-1) + delta * (p * torch.log(p)).sum(-1)
check_close(p_star.sum(), torch.tensor(1.0), "the total mass of p*")
# on the simplex, with p* > 0: the gradient of the objective (by autograd) is one number for every key
p_leaf = p_star.detach().clone().requires_grad_(True)
(stationary,) = torch.autograd.grad(objective(p_leaf), p_leaf)
lemma = torch.softmax(torch.log(u) - C / eps, dim=-1)
check_close(stationary - stationary.mean(), torch.zeros(m), "the gradient of the objective at p* minus its mean "
            "(stationarity on the simplex)",
            hint="yours is the Gibbs measure of Lemma 5.1: the bonus changes the temperature and the base measure"
            if torch.allclose(p_star, lemma, atol=1e-12) else
            "collect the terms in log p_j and those in log u_j, and write the objective as a multiple of a KL divergence"
            " plus a constant, as in the proof of (5.3)")
check_close(value, objective(p_star), "the value against the objective at p*")
others = torch.distributions.Dirichlet(torch.ones(m)).sample((200,))
check(torch.all(value <= objective(others) + 1e-13), "the value",
      f"at most the objective at 200 random points, whose smallest is {objective(others).min().item():.6g}", value)
C_leaf = C.clone().requires_grad_(True)
(grad,) = torch.autograd.grad(f(C_leaf, eps, u, delta)[1], C_leaf)
check_close(grad, p_star, "the gradient of the value in the costs (the plan, by the envelope theorem)")
check_close(f(C, eps, u, 0.0)[0], lemma, "p* for delta = 0 (the Gibbs measure of Lemma 5.1)")
u_masked = u.clone()
u_masked[2] = 0.0
u_masked = u_masked / u_masked.sum()
p_masked, value_masked = f(C, eps, u_masked, delta)
check(bool(p_masked[2] == 0) and bool(torch.isfinite(value_masked)), "a key with u_j = 0",
      "weight exactly 0 and a finite value", f"weight {p_masked[2].item():.3g}, value {value_masked.item():.6g}",
      hint="the logarithm of u_j = 0 is -inf: keep that key out of the sum, with weight 0")
p_big, value_big = f(C - 1000 * (eps + delta), eps, u, delta)
check_close(p_big, p_star, "p* for the costs C - 1000 (eps + delta) (no overflow)",
            hint="stay in log space: shift the exponents by their largest value before exponentiating")
check_close(value_big - value, torch.tensor(-1000 * (eps + delta)), "the value for C - 1000 (eps + delta), minus the value", atol=1e-9)
check_shape(f(C.expand(3, 4, m), eps, u, delta)[1], (3, 4), "the value for a (3, 4, 6) batch of costs")
''' + HIDDEN.format(task="gibbs"),
    },
}


UNBALANCED = {
    "about": "the Gibbs identity without the mass constraint (generalized KL over p >= 0): p* = u exp(-C / eps), "
             "value eps (1 - Z)",
    "params": {"function": "unbalanced_gibbs"},
    "cells": {
        "intro": [_row("| 1 | the Gibbs minimizer and its log-partition function |",
                       "| 1 | the Gibbs minimizer without the mass constraint, and its value |")],
        "task:1": """## Task 1 · The Gibbs minimizer without the mass constraint (2 points)

Drop the constraint $\\sum_jp_j=1$: let $p$ range over all non-negative vectors, and measure how far
it is from $u$ by the generalized divergence
$\\widetilde{\\operatorname{KL}}(p\\Vert u)=\\sum_j\\big(p_j\\log(p_j/u_j)-p_j+u_j\\big)$, which is
$\\operatorname{KL}$ on the simplex and non-negative for every $p\\ge0$. Prove the counterpart of the
Gibbs identity (5.3) for

$$
\\min_{p\\in\\mathbb R^m_{\\ge0}}\\;\\langle C,p\\rangle+\\varepsilon\\widetilde{\\operatorname{KL}}(p\\Vert u):
$$

find the minimizer $p^\\ast$ and the optimal value in terms of $Z$ of Lemma 5.1, the mass of
$p^\\ast$, and how $p^\\ast$ is related to the minimizer of Lemma 5.1.

Implement `unbalanced_gibbs(cost, eps, u)`: for costs of shape `(..., m)` (`+inf` allowed: a
forbidden key), a number `eps > 0` and a base measure `u` broadcastable to `cost` (non-negative,
summing to one), return `(p_star, value)` with shapes `(..., m)` and `(...)`. A key with $u_j=0$ or
an infinite cost gets weight $0$ and adds nothing to the value (no `nan`).""",
        "gibbs": '''def unbalanced_gibbs(cost, eps, u):
    """The minimizer and the value of <C, p> + eps KL~(p || u) over p >= 0 (no mass constraint)."""
    ### BEGIN SOLUTION
    # stationarity C_j + eps log(p_j / u_j) = 0 has no multiplier now: p*_j = u_j exp(-C_j / eps), and
    # <C, p> + eps KL~(p || u) = eps KL~(p || p*) + eps (1 - Z) with Z = sum_j p*_j, the mass of p*
    p_star = torch.exp(torch.log(u) - cost / eps)
    return p_star, eps * (1 - p_star.sum(-1))
    ### END SOLUTION''',
        "test_gibbs": '''# Task 1: stationarity without a multiplier, the value is the minimum over p >= 0 and its gradient the plan;
# masked and forbidden keys; large costs; batches.
from coursework import check, check_close, check_shape, own

f = own(unbalanced_gibbs, globals())
g = torch.Generator().manual_seed(1)
m, eps = 6, 0.7
C = torch.randn(m, generator=g)
u = torch.rand(m, generator=g)
u = u / u.sum()
p_star, value = f(C, eps, u)
check_shape(p_star, (m,), "p*")
check_shape(value, (), "the value")
objective = lambda p: p @ C + eps * (p * torch.log(p / u) - p + u).sum(-1)
# without a constraint the partial derivatives of the objective (by autograd) vanish at p* > 0
p_leaf = p_star.detach().clone().requires_grad_(True)
(stationary,) = torch.autograd.grad(objective(p_leaf), p_leaf)
check_close(stationary, torch.zeros(m), "the gradient of the objective at p* (stationarity over p >= 0)",
            hint="yours sums to one: without the constraint there is no multiplier to fix the mass"
            if abs(p_star.sum().item() - 1) < 1e-12 else "set the partial derivatives of the objective to zero")
check_close(value, objective(p_star), "the value against the objective at p*",
            hint="that is -eps log Z, the value on the simplex: evaluate the objective at the new p*"
            if abs(value.item() + eps * math.log((u * torch.exp(-C / eps)).sum().item())) < 1e-12 else "")
others = torch.distributions.Dirichlet(torch.ones(m)).sample((200,)) * 3 * torch.rand(200, 1, generator=g)
check(torch.all(value <= objective(others) + 1e-13), "the value",
      f"at most the objective at 200 random p >= 0, whose smallest is {objective(others).min().item():.6g}", value)
C_leaf = C.clone().requires_grad_(True)
(grad,) = torch.autograd.grad(f(C_leaf, eps, u)[1], C_leaf)
check_close(grad, p_star, "the gradient of the value in the costs (the plan, by the envelope theorem)")
u_masked = u.clone()
u_masked[2] = 0.0
u_masked = u_masked / u_masked.sum()
C_forbidden = C.clone()
C_forbidden[4] = float("inf")
p_masked, value_masked = f(C_forbidden, eps, u_masked)
check(bool(p_masked[2] == 0 and p_masked[4] == 0) and bool(torch.isfinite(value_masked)),
      "a key with u_j = 0 and a key with cost +inf", "weights exactly 0 and a finite value",
      f"weights {p_masked[2].item():.3g} and {p_masked[4].item():.3g}, value {value_masked.item():.6g}",
      hint="0 * log 0 and 0 * inf are nan: write the value so that such a key contributes nothing")
p_big, value_big = f(C + 1000 * eps, eps, u)
check_close(value_big, torch.tensor(eps), "the value for the costs C + 1000 eps (a plan of mass about 0)", atol=1e-12)
check_shape(f(C.expand(3, 4, m), eps, u)[1], (3, 4), "the value for a (3, 4, 6) batch of costs")
''' + HIDDEN.format(task="gibbs"),
    },
}


# ------------------------------------------------------------------ Task 2: another kernel-view problem to translate


GAUSSIAN_POTENTIAL = {
    "about": "the dictionary for the Gaussian potential a(q, k) = -s |q - k|^2: -s |k|^2 moves into the preference, "
             "alpha = 2 s; the squared distance is the cost",
    "params": {"similarity": "gaussian"},
    "cells": {
        "intro": [_row("| 2 | the dictionary: one query through the Markov-kernel, Fenchel and transport views |",
                       "| 2 | the dictionary for a Gaussian potential: one query through the three views |")],
        "task:2": """## Task 2 · One query, three views, with a Gaussian potential (3 points)

A Markov-kernel problem (chapter 2) is given by queries $q_i$ (`(M, d)`), keys $k_j$ (`(N, d)`), the
key measure's weights $w$ (`(N,)`, zeros allowed: masked keys) and, this time, the Gaussian
potential $a(q,k)=-s\\lVert q-k\\rVert^2$ with $s$ = `scale` (the potential (2.36) of Theorem 2.3, at
scale $s$): the kernel is `attnopt.kernels.attention_kernel(q, k, key_weights=w,
similarity="gaussian", scale=s)`. Translate it into the other two views with the dictionary (5.4),
(5.5). The Fenchel view's scores $\\alpha\\langle t_j,z\\rangle$ are linear in the evidence, so not all
of the potential fits into them: say which part of it must move, and where it goes.

* `to_fenchel(queries, keys, key_weights, scale)` returns a `dict` of the keyword arguments
  `z`, `templates`, `u`, `alpha` of `attnopt.fenchel.generalized_attention(z, templates, u, alpha)`
  (`u` must be a probability vector);
* `to_eot(queries, keys, key_weights, scale)` returns a `dict` of the keyword arguments `cost`,
  `eps`, `prior` of `attnopt.transforms.one_sided_eot(cost, eps, regularizer="kl", prior=prior)`.

Queries and keys far from the origin (all shifted by one vector of size $40$) must work too. The
test runs the library's three views on your arguments and checks that the three weight matrices
agree (more than one translation is correct).""",
        "to_fenchel": '''def to_fenchel(queries, keys, key_weights, scale):
    """Arguments of generalized_attention that give the Gaussian-potential kernel's weights."""
    ### BEGIN SOLUTION
    # -s |q - k_j|^2 = 2 s <q, k_j> - s |k_j|^2 - s |q|^2: the last term cancels in the normalization,
    # the middle one depends on the key only and becomes part of the preference (a log-prior)
    log_u = torch.log(key_weights) - scale * (keys * keys).sum(-1)
    return {"z": queries, "templates": keys, "u": torch.softmax(log_u, dim=-1), "alpha": 2 * scale}
    ### END SOLUTION


def to_eot(queries, keys, key_weights, scale):
    """Arguments of one_sided_eot(..., regularizer="kl") that give the Gaussian-potential kernel's weights."""
    ### BEGIN SOLUTION
    squared_distance = ((queries.unsqueeze(-2) - keys.unsqueeze(-3)) ** 2).sum(-1)
    return {"cost": squared_distance, "eps": 1 / scale, "prior": key_weights}
    ### END SOLUTION''',
        "test_dictionary": '''# Task 2: the Gaussian-potential kernel, generalized attention and KL-regularized one-sided transport agree,
# also far from the origin.
from attnopt.fenchel import generalized_attention
from attnopt.kernels import attention_kernel
from attnopt.transforms import one_sided_eot
from coursework import check, check_close, check_shape, own

g = torch.Generator().manual_seed(2)
M, N, d, scale = 5, 8, 4, 0.6
q, k = torch.randn(M, d, generator=g), torch.randn(N, d, generator=g)
w = torch.rand(N, generator=g)
w = w / w.sum()
_, P_kernel = attention_kernel(q, k, key_weights=w, similarity="gaussian", scale=scale)
_, P_dot = attention_kernel(q, k, key_weights=w, scale=scale)
_, P_fenchel = generalized_attention(**own(to_fenchel, globals())(q, k, w, scale))
P_eot = one_sided_eot(**own(to_eot, globals())(q, k, w, scale), regularizer="kl")
check_shape(P_fenchel, (M, N), "generalized_attention's weights on your arguments")
check_close(P_fenchel, P_kernel, "generalized_attention's weights on your arguments, against the Gaussian kernel's",
            hint="yours are the weights of the dot-product potential: expand the squared distance"
            if torch.allclose(P_fenchel, P_dot, atol=1e-12) else
            "not all of the potential is a score alpha <t_j, z>: find the part that is not, and the argument of"
            " generalized_attention that can carry it (the dictionary (5.4))")
check_close(P_eot, P_kernel, "one_sided_eot's plan on your arguments, against the Gaussian kernel's",
            hint="yours is the plan of the dot-product potential: which cost gives the scores -s |q - k|^2?"
            if torch.allclose(P_eot, P_dot, atol=1e-12) else "the dictionary (5.5) reads a = -C / eps")
offset = torch.full((d,), 20.0)  # a vector of size 40
_, P_far = attention_kernel(q + offset, k + offset, key_weights=w, similarity="gaussian", scale=scale)
far = own(to_fenchel, globals())(q + offset, k + offset, w, scale)
check(bool(torch.isfinite(torch.as_tensor(far["u"])).all()), "your preference u for queries and keys shifted by one vector"
      " of size 40", "finite numbers", far["u"],
      hint="far from the origin your unnormalized preference underflows to 0, and 0 / 0 is nan: normalize in log space")
_, P_fenchel_far = generalized_attention(**far)
check_close(P_fenchel_far, P_far, "generalized_attention's weights for queries and keys shifted by one vector of size 40",
            atol=1e-11)
check_close(P_far, P_kernel, "the kernel's weights shifted by one vector (they do not move)", atol=1e-11)
''' + HIDDEN.format(task="to_fenchel"),
    },
}

POSITION_BIAS = {
    "about": "the dictionary with a relative-position bias b_ij added to the potential: a per-query preference "
             "(T5, Proposition 1.7) in the Fenchel view, a shifted cost or a per-query prior in transport",
    "params": {"bias": True},
    "cells": {
        "intro": [_row("| 2 | the dictionary: one query through the Markov-kernel, Fenchel and transport views |",
                       "| 2 | the dictionary with a position bias: one query through the three views |")],
        "task:2": """## Task 2 · One query, three views, with a position bias (3 points)

A Markov-kernel problem (chapter 2) is given by queries $q_i$ (`(M, d)`), keys $k_j$ (`(N, d)`), the
key measure's weights $w$ (`(N,)`, zeros allowed: masked keys) and, this time, a potential with a
bias, $a(q_i,k_j)=s\\langle q_i,k_j\\rangle+b_{ij}$, with $s$ = `scale` and a bias matrix $b$ (`(M, N)`,
finite), as a relative-position bias is: the kernel is `attnopt.kernels.attention_kernel(q, k,
key_weights=w, similarity=lambda q, k: s * q @ k.T + b)`. Translate it into the other two views with
the dictionary (5.4), (5.5): where does the bias go in the Fenchel view (compare T5's attention,
Proposition 1.7), and where in the transport view (give two places)?

* `to_fenchel(queries, keys, key_weights, bias, scale)` returns a `dict` of the keyword arguments
  `z`, `templates`, `u`, `alpha` of `attnopt.fenchel.generalized_attention(z, templates, u, alpha)`
  (`u` may have one row per query, shape `(M, N)`; each row must be a probability vector);
* `to_eot(queries, keys, key_weights, bias, scale)` returns a `dict` of the keyword arguments `cost`,
  `eps`, `prior` of `attnopt.transforms.one_sided_eot(cost, eps, regularizer="kl", prior=prior)`.

Biases of size $1000$ must work (no overflow). The test runs the library's three views on your
arguments and checks that the three weight matrices agree (more than one translation is correct).""",
        "to_fenchel": '''def to_fenchel(queries, keys, key_weights, bias, scale):
    """Arguments of generalized_attention that give the weights of the kernel with a biased potential."""
    ### BEGIN SOLUTION
    # the bias depends on (i, j), not on the evidence: it is a log-preference, one row per query (T5)
    u = torch.softmax(torch.log(key_weights) + bias, dim=-1)
    return {"z": queries, "templates": keys, "u": u, "alpha": scale}
    ### END SOLUTION


def to_eot(queries, keys, key_weights, bias, scale):
    """Arguments of one_sided_eot(..., regularizer="kl") that give the weights of the kernel with a biased potential."""
    ### BEGIN SOLUTION
    # a = -C / eps with eps = 1 / s: the bias lowers the cost by b / s (or, equally, multiplies the prior by e^b)
    return {"cost": -queries @ keys.T - bias / scale, "eps": 1 / scale, "prior": key_weights}
    ### END SOLUTION''',
        "test_dictionary": '''# Task 2: the kernel with a biased potential, generalized attention and KL-regularized one-sided transport
# agree, also for a bias of size 1000.
from attnopt.fenchel import generalized_attention
from attnopt.kernels import attention_kernel
from attnopt.transforms import one_sided_eot
from coursework import check, check_close, check_shape, own

g = torch.Generator().manual_seed(2)
M, N, d, scale = 5, 8, 4, 0.6
q, k = torch.randn(M, d, generator=g), torch.randn(N, d, generator=g)
w = torch.rand(N, generator=g)
w = w / w.sum()
bias = 2 * torch.randn(M, N, generator=g)
_, P_kernel = attention_kernel(q, k, key_weights=w, similarity=lambda a, b: scale * a @ b.mT + bias)
_, P_dot = attention_kernel(q, k, key_weights=w, scale=scale)
_, P_fenchel = generalized_attention(**own(to_fenchel, globals())(q, k, w, bias, scale))
P_eot = one_sided_eot(**own(to_eot, globals())(q, k, w, bias, scale), regularizer="kl")
check_shape(P_fenchel, (M, N), "generalized_attention's weights on your arguments")
check_close(P_fenchel, P_kernel, "generalized_attention's weights on your arguments, against the kernel's",
            hint="yours ignore the bias" if torch.allclose(P_fenchel, P_dot, atol=1e-12) else
            "the bias does not scale with the evidence: see how T5's attention, Proposition 1.7, carries it")
check_close(P_eot, P_kernel, "one_sided_eot's plan on your arguments, against the kernel's",
            hint="yours ignores the bias" if torch.allclose(P_eot, P_dot, atol=1e-12) else
            "the dictionary (5.5) reads a = -C / eps: mind the factor eps on the bias")
big_f = own(to_fenchel, globals())(q, k, w, bias + 1000.0, scale)
big_e = own(to_eot, globals())(q, k, w, bias + 1000.0, scale)
check(all(bool(torch.isfinite(torch.as_tensor(x)).all()) for x in (big_f["u"], big_e["prior"])) and
      not bool(torch.isnan(torch.as_tensor(big_e["cost"])).any()), "your arguments for the bias + 1000",
      "no inf or nan in u and in the prior, no nan in the cost", "some", hint="exp(1000) overflows: normalize in log space")
_, P_fenchel_big = generalized_attention(**big_f)
check_close(P_fenchel_big, P_kernel, "generalized_attention's weights for the bias + 1000 (the same weights)", atol=1e-11)
check_close(one_sided_eot(**big_e, regularizer="kl"), P_kernel, "one_sided_eot's plan for the bias + 1000 (the same weights)",
            atol=1e-11)
''' + HIDDEN.format(task="to_fenchel"),
    },
}


# ------------------------------------------------------------------ Task 3: another base measure or regularizer on the grid


UNEVEN_GRID = {
    "about": "discrete softmax on an uneven grid: the base measure must be the quadrature weights of the cells",
    "params": {"function": "grid_softmax_uneven"},
    "cells": {
        "intro": [_row("| 3 | a discrete softmax on a grid that becomes continuous softmax |",
                       "| 3 | a discrete softmax on an uneven grid that becomes continuous softmax |")],
        "task:3": """## Task 3 · Continuous softmax on an uneven grid (2 points)

Continuous softmax with the Gaussian family has the score $f_\\theta(t)=\\theta_1t+\\theta_2t^2$
($\\theta_2<0$) and the density $p(t)\\propto e^{f_\\theta(t)}$, the Gaussian with mean
$-\\theta_1/(2\\theta_2)$ and variance $-1/(2\\theta_2)$. Proposition 5.2 puts one key at each point of an
*evenly spaced* grid. On a grid $t_1<\\dots<t_L$ whose points are not evenly spaced (denser where
they are needed), the plain softmax of the scores $f_\\theta(t_l)$ gives each point the same base
weight, and so over-weights the region where the points are dense. Continuous softmax is the Gibbs
measure of Lebesgue measure (the counting measure gives the discrete one, as the book remarks after
Proposition 5.2): which base measure $u_l$ on the grid, in the dictionary (5.4), makes the discrete
Gibbs measure approximate it, and why?

Implement `grid_softmax_uneven(theta, t)`: for `theta` of shape `(2,)` and a sorted 1-D grid `t`
(uneven, at least two points), return `(p, mean, var)`: the weights of that discrete Gibbs measure
on the grid and their mean and variance. Stay in log space. The test checks that on a fine, wide,
uneven grid these are the Gaussian's (to the accuracy of a quadrature rule on the same points), and that the discrete attention $\\sum_lp_l\\psi(t_l)$ equals
continuous softmax.""",
        "grid_softmax": '''def grid_softmax_uneven(theta, t):
    """The discrete Gibbs measure on the uneven grid t that approximates continuous softmax, its mean and variance."""
    ### BEGIN SOLUTION
    # the base measure is the length of the cell around each point (the trapezoid rule's weights)
    gaps = t[1:] - t[:-1]
    cells = torch.zeros_like(t)
    cells[1:] += gaps / 2
    cells[:-1] += gaps / 2
    p = torch.softmax(torch.log(cells) + theta[0] * t + theta[1] * t**2, dim=-1)
    mean = p @ t
    return p, mean, p @ (t - mean) ** 2
    ### END SOLUTION''',
        "test_grid_softmax": '''# Task 3: on a fine uneven grid the discrete Gibbs measure has the Gaussian's moments and gives continuous softmax.
from attnopt.continuous import continuous_softmax
from attnopt.value_functions import GaussianRBF
from coursework import check_close, check_shape, own

f = own(grid_softmax_uneven, globals())
mu0, sigma0 = 0.4, 0.15
theta = torch.tensor([mu0 / sigma0**2, -1 / (2 * sigma0**2)])
t = -1.5 + 4 * torch.linspace(0, 1, 4001) ** 3  # points dense near -1.5, sparse near 2.5
p, mean, var = f(theta, t)
check_shape(p, (4001,), "p on a grid of 4001 points")
check_close(p.sum(), torch.tensor(1.0), "the total mass of p")
plain = torch.softmax(theta[0] * t + theta[1] * t**2, dim=-1)
check_close(torch.as_tensor(mean), torch.tensor(mu0), "the mean on the uneven grid", atol=1e-8,
            hint="yours is the plain discrete softmax, whose base measure counts points: on an uneven grid it"
            " over-weights the region where the points are dense" if torch.allclose(p, plain, atol=1e-12) else
            "the discrete Gibbs measure must approximate a density: which weights make a sum over these points"
            " approximate an integral against Lebesgue measure?")
check_close(torch.as_tensor(var), torch.tensor(sigma0**2), "the variance on the uneven grid", atol=1e-8,
            hint="the variance is sum_l p_l (t_l - mean)^2")
basis = GaussianRBF(torch.linspace(0, 1, 16), 0.08)
r_discrete = p @ basis(t[:, None])
r_continuous = continuous_softmax(torch.tensor([mu0]), torch.tensor([[sigma0**2]]), basis)
check_close(r_discrete, r_continuous, "discrete attention on the uneven grid against continuous softmax", atol=1e-8)
even = torch.linspace(-1.5, 2.5, 4001)
check_close(f(theta, even)[0], torch.softmax(theta[0] * even + theta[1] * even**2, dim=-1),
            "p on an even grid (the plain softmax of Proposition 5.2)", atol=1e-12)
''' + HIDDEN.format(task="grid_softmax"),
    },
}

SPARSE_GRID = {
    "about": "continuous sparsemax on an even grid: sparsemax at temperature 1/h, h the step; the moments are "
             "the truncated parabola's",
    "params": {"function": "grid_sparsemax"},
    "cells": {
        "intro": [_row("| 3 | a discrete softmax on a grid that becomes continuous softmax |",
                       "| 3 | a discrete sparsemax on a grid that becomes continuous sparsemax |")],
        "task:3": """## Task 3 · Continuous sparsemax as a limit of discrete sparsemax (2 points)

Continuous sparsemax (the Tsallis regularizer with $\\alpha=2$ of chapter 4) with the score
$f_\\theta(t)=\\theta_1t+\\theta_2t^2$ ($\\theta_2<0$) gives the truncated parabola
$p(t)=[f_\\theta(t)-\\lambda]_+$, eq. (4.11), with $\\lambda$ fixed by $\\int p=1$. Proposition 5.2 says that the
discrete *softmax* of the scores $f_\\theta(t_l)$ on an even grid of step $h$ tends to continuous
softmax, for every $h$. The discrete *sparsemax* of the same scores does not tend to continuous
sparsemax: discretize the objective $\\mathbb E_p[f_\\theta]-\\frac12\\int p^2$ of eq. (4.1) with the
weights $q_l\\approx h\\,p(t_l)$ and find at which temperature the discrete sparsemax must be taken
(a temperature that depends on $h$). Also find the mean and the variance of the truncated parabola
in terms of $\\theta$ (its half-width $a$ follows from $\\int p=1$).

Implement `grid_sparsemax(theta, t)`: for `theta` of shape `(2,)` and an evenly spaced 1-D grid `t`,
return `(q, mean, var)`: the discrete sparsemax on the grid at that temperature and the mean and
variance of $q$. Compute the sparsemax yourself (by sorting, eq. (3.17)). The test checks that on a
fine, wide grid the moments are the truncated parabola's, and that the discrete attention
$\\sum_lq_l\\psi(t_l)$ equals continuous sparsemax.""",
        "grid_softmax": '''def grid_sparsemax(theta, t):
    """The discrete sparsemax on the even grid t that approximates continuous sparsemax, its mean and variance."""
    ### BEGIN SOLUTION
    # sum_l q_l f(t_l) - 1/(2h) sum_l q_l^2 = (1/h) (<q, h f> - |q|^2 / 2): sparsemax of h f, temperature 1/h
    h = t[1] - t[0]
    z, _ = torch.sort(h * (theta[0] * t + theta[1] * t**2), descending=True)
    k = torch.arange(1, z.shape[-1] + 1, dtype=z.dtype)
    cumsum = torch.cumsum(z, dim=-1)
    k_star = (1 + k * z > cumsum).sum()
    threshold = (cumsum[k_star - 1] - 1) / k_star
    q = torch.clamp(h * (theta[0] * t + theta[1] * t**2) - threshold, min=0)
    mean = q @ t
    return q, mean, q @ (t - mean) ** 2
    ### END SOLUTION''',
        "test_grid_softmax": '''# Task 3: on a fine grid the discrete sparsemax at the right temperature has the truncated parabola's moments
# and gives continuous sparsemax.
from attnopt.continuous import continuous_density, continuous_sparsemax
from attnopt.value_functions import GaussianRBF
from coursework import check, check_close, check_shape, own

f = own(grid_sparsemax, globals())
mu0, scale = 0.4, 0.02  # f(t) = -(t - mu0)^2 / (2 scale) + a constant
theta = torch.tensor([mu0 / scale, -1 / (2 * scale)])
t = torch.linspace(-1.5, 2.5, 4001)
q, mean, var = f(theta, t)
check_shape(q, (4001,), "q on a grid of 4001 points")
check(torch.all(q >= 0), "the weights on the grid", ">= 0", q.min())
# the truncated parabola [f - lambda]_+ from attnopt, integrated by a Riemann sum on a much finer grid
fine = torch.linspace(-1.5, 2.5, 400001)
h_fine = (fine[1] - fine[0]).item()
density = continuous_density(fine[:, None], torch.tensor([mu0]), torch.tensor([[scale]]), family="truncated_paraboloid")
width = int((density > 0).sum()) * h_fine
mean_ref = (fine * density).sum() * h_fine
var_ref = ((fine - mean_ref) ** 2 * density).sum() * h_fine
support = int((q > 0).sum())
check(abs(support * (t[1] - t[0]).item() - width) < 0.01, "the width of the support of q",
      f"about {width:.4f}, the truncated parabola's", f"{support} points, {support * (t[1] - t[0]).item():.4f}",
      hint="too narrow: the temperature is too low (at temperature 1 the discrete sparsemax collapses onto the mode as"
      " the grid is refined); the squared norm of q does not discretize like the integral of p^2" if support * (t[1] - t[0]).item() < width / 2 else
      "discretize both terms of the objective with q_l = h p(t_l)")
check_close(q.sum(), torch.tensor(1.0), "the total mass of q", atol=1e-10)
check_close(torch.as_tensor(mean), mean_ref, "the mean on the grid, against the truncated parabola's", atol=1e-6)
check_close(torch.as_tensor(var), var_ref, "the variance on the grid, against the truncated parabola's (by quadrature)",
            atol=1e-6, hint="the variance is sum_l q_l (t_l - mean)^2")
basis = GaussianRBF(torch.linspace(0, 1, 16), 0.08)
r_discrete = q @ basis(t[:, None])
r_continuous = continuous_sparsemax(torch.tensor([mu0]), torch.tensor([[scale]]), basis)
check_close(r_discrete, r_continuous, "discrete attention on the grid against continuous sparsemax", atol=1e-5)
''' + HIDDEN.format(task="grid_softmax"),
    },
}


# ------------------------------------------------------------------ Task 4: another regularizer with exact zeros, by bisection


SHIFTED_ENTROPY = {
    "about": "the one-sided problem with the shifted entropy omega(p) = (p + c) log(p + c), by bisection: "
             "p_j = [exp((lambda - C_j) / eps - 1) - c]_+",
    "params": {"function": "shifted_entropy_eot"},
    "cells": {
        "intro": [_row("| 4 | the $\\ell_2$-regularized transport problem by bisection: where the views differ |",
                       "| 4 | transport with a shifted entropy by bisection: where the views differ |")],
        "task:4": """## Task 4 · Where the views differ: a shifted entropy (3 points)

Replace the entropy of chapter 3 by the separable regularizer $\\Omega(p)=\\sum_j\\omega(p_j)$ with
$\\omega(p)=(p+c)\\log(p+c)$ for a constant $c>0$:
$\\min_{p\\in\\Delta}\\langle C,p\\rangle+\\varepsilon\\,\\Omega(p)$. From the optimality conditions of
this problem (the threshold form of Theorem 3.2), find $p_j$ in terms of the multiplier
$\\lambda$ of $\\sum_jp_j=1$; say why the sum increases with $\\lambda$, and find an interval of
$\\lambda$ that must hold the solution, in terms of $\\min_jC_j$, $\\varepsilon$ and $c$ (look at the
cheapest key). Which keys get exactly zero weight, and why can the entropy ($c=0$) give none?

Implement `shifted_entropy_eot(cost, eps, c, n_iter=100)` by bisection on $\\lambda$ (no sorting),
along the last dimension of `cost` (any leading dimensions, no Python loop over rows; `+inf` forbids a
key). The test compares it with `attnopt`'s generic solver `one_sided_eot` for this $\\omega$, and
checks that, unlike the entropic view, it has exact zeros.""",
        "sparse_eot": '''def shifted_entropy_eot(cost, eps, c, n_iter=100):
    """argmin over the simplex of <C, p> + eps sum_j (p_j + c) log(p_j + c), by bisection on the multiplier."""
    ### BEGIN SOLUTION
    # stationarity C_j + eps (1 + log(p_j + c)) = lambda on the support: p_j = [exp((lambda - C_j)/eps - 1) - c]_+
    weights = lambda lam: torch.clamp(torch.exp((lam - cost) / eps - 1) - c, min=0)
    smallest = cost.min(dim=-1, keepdim=True).values
    lo = smallest + eps * (1 + math.log(c))       # the cheapest key has weight 0: the sum is 0
    hi = smallest + eps * (1 + math.log(1 + c))   # the cheapest key alone has weight 1: the sum is >= 1
    for _ in range(n_iter):
        mid = 0.5 * (lo + hi)
        short = weights(mid).sum(-1, keepdim=True) < 1
        lo = torch.where(short, mid, lo)
        hi = torch.where(short, hi, mid)
    p = weights(0.5 * (lo + hi))
    return p / p.sum(-1, keepdim=True)
    ### END SOLUTION''',
        "test_sparse_eot": '''# Task 4: the plan of the shifted entropy is one_sided_eot's for this omega; exact zeros, unlike softmax;
# a plan with every key in the support is stationary; a forbidden key.
from attnopt.transforms import one_sided_eot
from coursework import check, check_close, check_shape, own

f = own(shifted_entropy_eot, globals())
g = torch.Generator().manual_seed(4)
scores = 2 * torch.randn(5, 10, generator=g)
eps, c = 0.9, 0.05
p = f(-scores, eps, c)
check_shape(p, (5, 10), "the plan")
check(torch.all(p >= 0), "entries of the plan", ">= 0", p.min(), hint="a weight is the positive part of its formula")
check_close(p.sum(-1), torch.ones(5), "row sums of the plan",
            hint="does your interval for lambda hold the solution? look at the weight of the cheapest key at each end")
reference = one_sided_eot(-scores, eps=eps, regularizer=lambda x: 1 + torch.log(x + c))  # omega'(p) = 1 + log(p + c)
entropic = torch.softmax(scores / eps, dim=-1)
check_close(p, reference, "the plan against one_sided_eot with omega(p) = (p + c) log(p + c)", atol=1e-10,
            hint="yours is the entropic plan: the shift c changes the stationarity condition"
            if torch.allclose(p, entropic, atol=1e-8) else
            "write the stationarity condition C_j + eps omega'(p_j) = lambda on the support and solve it for p_j")
check(bool((p == 0).any()), "the number of exact zeros", "at least one", "none",
      hint="clamp at 0: a key whose formula is negative gets weight 0")
# with eps large enough every key is in the support, and there the gradient of the objective (by autograd)
# is one number for every key of a row
C = torch.randn(4, 6, generator=g)
p_full = f(C, 20.0, 0.01)
check(bool(torch.all(p_full > 0)), "the plan for eps = 20, c = 0.01", "every weight > 0", p_full.min())
check_close(p_full, one_sided_eot(C, eps=20.0, regularizer=lambda x: 1 + torch.log(x + 0.01)),
            "the plan with full support (eps = 20, c = 0.01), against one_sided_eot", atol=1e-12)
p_leaf = p_full.detach().clone().requires_grad_(True)
(gradient,) = torch.autograd.grad((p_leaf * C).sum() + 20.0 * ((p_leaf + 0.01) * torch.log(p_leaf + 0.01)).sum(), p_leaf)
check_close(gradient - gradient.mean(-1, keepdim=True), torch.zeros(4, 6),
            "the gradient of the objective at the plan minus its row mean (stationarity, eps = 20, c = 0.01)", atol=1e-11)
forbidden = torch.tensor([0.3, float("inf"), -0.2, 1.0])
check_close(f(forbidden, 0.5, 0.1), one_sided_eot(forbidden, eps=0.5, regularizer=lambda x: 1 + torch.log(x + 0.1)),
            "the plan with a forbidden key (cost +inf)", atol=1e-10)
''' + HIDDEN.format(task="sparse_eot"),
    },
}

ENTMAX15 = {
    "about": "the one-sided problem with the Tsallis regularizer of 1.5-entmax, by bisection: "
             "p_j = [(lambda - C_j) / (2 eps) + 2/3]_+^2",
    "params": {"function": "entmax15_eot"},
    "cells": {
        "intro": [_row("| 4 | the $\\ell_2$-regularized transport problem by bisection: where the views differ |",
                       "| 4 | the 1.5-entmax transport problem by bisection: where the views differ |")],
        "task:4": """## Task 4 · Where the views differ: 1.5-entmax (3 points)

Replace the entropy of chapter 3 by the Tsallis regularizer of $\\alpha$-entmax with $\\alpha=3/2$,
$\\Omega(p)=\\sum_j\\frac{p_j^\\alpha-p_j}{\\alpha(\\alpha-1)}$:
$\\min_{p\\in\\Delta}\\langle C,p\\rangle+\\varepsilon\\,\\Omega(p)$, whose solution is
$\\operatorname{entmax}_{3/2}(-C/\\varepsilon)$, eq. (3.18). From the optimality conditions (the threshold
form of Theorem 3.2), find $p_j$ in terms of the multiplier $\\lambda$ of $\\sum_jp_j=1$; say why the
sum increases with $\\lambda$, and find an interval of $\\lambda$ that must hold the solution, in terms
of $\\min_jC_j$ and $\\varepsilon$ (look at the cheapest key). How far above the cheapest cost must a
cost be for its key to get weight $0$ when the cheapest key takes all the mass?

Implement `entmax15_eot(cost, eps, n_iter=100)` by bisection on $\\lambda$ (no sorting, no closed
form), along the last dimension of `cost` (any leading dimensions, no Python loop over rows; `+inf`
forbids a key). The test checks that it is 1.5-entmax of the scores $-C/\\varepsilon$, and that it
differs from the entropic view exactly where the theory says: it has exact zeros.""",
        "sparse_eot": '''def entmax15_eot(cost, eps, n_iter=100):
    """argmin over the simplex of <C, p> + eps sum_j (p_j^1.5 - p_j) / 0.75, by bisection on the multiplier."""
    ### BEGIN SOLUTION
    # omega'(p) = 2 sqrt(p) - 4/3, so stationarity gives sqrt(p_j) = [(lambda - C_j) / (2 eps) + 2/3]_+
    weights = lambda lam: torch.clamp((lam - cost) / (2 * eps) + 2 / 3, min=0) ** 2
    smallest = cost.min(dim=-1, keepdim=True).values
    lo = smallest - 4 * eps / 3   # the cheapest key has weight 0: the sum is 0
    hi = smallest + 2 * eps / 3   # the cheapest key alone has weight 1: the sum is >= 1
    for _ in range(n_iter):
        mid = 0.5 * (lo + hi)
        short = weights(mid).sum(-1, keepdim=True) < 1
        lo = torch.where(short, mid, lo)
        hi = torch.where(short, hi, mid)
    p = weights(0.5 * (lo + hi))
    return p / p.sum(-1, keepdim=True)
    ### END SOLUTION''',
        "test_sparse_eot": '''# Task 4: the 1.5-entmax transport plan is entmax of the scores, and unlike softmax it has exact zeros.
from attnopt.transforms import entmax, sparsemax
from coursework import check, check_close, check_shape, own

f = own(entmax15_eot, globals())
g = torch.Generator().manual_seed(4)
scores = 2 * torch.randn(5, 10, generator=g)
eps = 0.9
p = f(-scores, eps)
check_shape(p, (5, 10), "the plan")
check(torch.all(p >= 0), "entries of the plan", ">= 0", p.min())
check_close(p.sum(-1), torch.ones(5), "row sums of the plan",
            hint="does your interval for lambda hold the solution? look at the weight of the cheapest key at each end")
expected = entmax(scores / eps, 1.5)
check_close(p, expected, "the plan against entmax(scores / eps, 1.5)", atol=1e-10,
            hint="yours is sparsemax's plan (alpha = 2): the Tsallis regularizer with alpha = 3/2 has another omega'"
            if torch.allclose(p, sparsemax(scores / eps), atol=1e-8) else
            "yours is the entropic plan" if torch.allclose(p, torch.softmax(scores / eps, dim=-1), atol=1e-8) else
            "solve the stationarity condition C_j + eps omega'(p_j) = lambda for p_j on the support; mind the factors of alpha")
check(bool((p == 0).any()), "the number of exact zeros", "at least one", "none",
      hint="a key below the threshold gets weight exactly 0 (the threshold form of Theorem 3.2): where the stationarity"
      " condition has no solution p_j >= 0, the weight is 0")
forbidden = torch.tensor([0.3, float("inf"), -0.2, 1.0])
check_close(f(forbidden, 0.5), entmax(-forbidden / 0.5, 1.5), "the plan with a forbidden key (cost +inf)", atol=1e-10)
''' + HIDDEN.format(task="sparse_eot"),
    },
}


# ------------------------------------------------------------------ Tasks 6 and 7: the value of another regularizer


_ROW6 = "| 6 | a derivation: how the optimal value moves with the temperature |"
_ROW7 = "| 7 | the value's temperature derivatives of Task 6 in code |"

SPARSE_VALUE_DERIVATIVES = {
    "about": "the temperature derivatives of the l2-regularized value: F' = |p*|^2 / 2, F'' = (1/|S| - |p*|^2) / eps "
             "(Task 6's derivation and Task 7's code)",
    "params": {"function": "sparse_value_derivatives"},
    "cells": {
        "intro": [_row(_ROW6, "| 6 | a derivation: how the value of sparse transport moves with the temperature |"),
                  _row(_ROW7, "| 7 | the temperature derivatives of Task 6 in code |")],
        "task:6": """## Task 6 · How the value of sparse transport moves with the temperature: a derivation (2 points, graded by hand)

Let $F(\\varepsilon)=\\min_{p\\in\\Delta^{m-1}}\\langle C,p\\rangle+\\frac\\varepsilon2\\lVert p\\rVert^2$ for fixed costs $C$
(some of them may be $+\\infty$: forbidden keys), the $\\ell_2$-regularized problem, whose plan
$p^\\ast_\\varepsilon=\\operatorname{sparsemax}(-C/\\varepsilon)$ has a support $S_\\varepsilon$ (Theorem 3.3); how $F$
depends on $\\varepsilon$ is not in the book.

* **(a)** Show that $F'(\\varepsilon)=\\frac12\\lVert p^\\ast_\\varepsilon\\rVert^2$, in two ways: by writing $F$ in terms
  of the multiplier $\\lambda$ of $\\sum_jp_j=1$ and differentiating, and by an argument that never
  differentiates $p^\\ast_\\varepsilon$.
* **(b)** Where $S_\\varepsilon$ does not change near $\\varepsilon$, find $F''(\\varepsilon)$ in terms of
  $\\lVert p^\\ast_\\varepsilon\\rVert^2$ and $|S_\\varepsilon|$, and conclude that $F$ is concave. When is $F''=0$? What
  happens to $F'$ and to $F''$ at an $\\varepsilon$ where a key enters the support?
* **(c)** Find the limits of $F'(\\varepsilon)$ as $\\varepsilon\\to\\infty$ and as $\\varepsilon\\to0$, the latter when the
  smallest cost is attained at a single key. Compare with the entropic value
  $-\\varepsilon\\log\\sum_je^{-C_j/\\varepsilon}$ of the uniform base measure, whose derivative is the divergence
  $\\operatorname{KL}(p^\\ast_\\varepsilon\\Vert u)$, $0$ as $\\varepsilon\\to\\infty$: what does the quadratic
  regularizer charge the plan at each end?

*Where to start:* on the support the optimality conditions (3.16), (3.17) say what $C_j$ is. Write
your derivation in the cell below (Markdown and LaTeX); Task 7 turns it into code.""",
        "written_value_derivatives": """Let $S$ be the support of $p^\\ast=p^\\ast_\\varepsilon$, $k=|S|$, and $\\lambda$ the multiplier: on $S$,
$C_j+\\varepsilon p^\\ast_j=\\lambda$, and $p^\\ast_j=0$ off $S$ (forbidden keys are never in $S$).

**(a)** $\\langle C,p^\\ast\\rangle=\\sum_{j\\in S}(\\lambda-\\varepsilon p^\\ast_j)p^\\ast_j=\\lambda-\\varepsilon\\lVert p^\\ast\\rVert^2$, so
$F=\\lambda-\\frac\\varepsilon2\\lVert p^\\ast\\rVert^2$. Differentiating (where $S$ is fixed), with $\\sum_{j\\in S}\\dot p_j=0$ and
$\\dot\\lambda=p^\\ast_j+\\varepsilon\\dot p_j$ for $j\\in S$ (from $C_j+\\varepsilon p^\\ast_j=\\lambda$):
$F'=\\dot\\lambda-\\frac12\\lVert p^\\ast\\rVert^2-\\varepsilon\\langle p^\\ast,\\dot p\\rangle$; summing $\\dot\\lambda p^\\ast_j=(p^\\ast_j)^2+\\varepsilon p^\\ast_j\\dot p_j$
over $S$ gives $\\dot\\lambda=\\lVert p^\\ast\\rVert^2+\\varepsilon\\langle p^\\ast,\\dot p\\rangle$, hence $F'=\\frac12\\lVert p^\\ast\\rVert^2$.
*Envelope argument:* $F$ is a minimum over $p$ of functions $\\varepsilon\\mapsto\\langle C,p\\rangle+\\frac\\varepsilon2\\lVert p\\rVert^2$,
affine in $\\varepsilon$, attained at a unique minimizer that is continuous in $\\varepsilon$; by Danskin's theorem
$F'$ is the partial derivative at the minimizer, $\\frac12\\lVert p^\\ast_\\varepsilon\\rVert^2$ (this holds for every
$\\varepsilon$, also where the support changes). A minimum of affine functions is concave.

**(b)** Summing $\\dot\\lambda=p^\\ast_j+\\varepsilon\\dot p_j$ over $S$ gives $k\\dot\\lambda=1$, so
$\\dot p_j=(1/k-p^\\ast_j)/\\varepsilon$ on $S$ and
$F''=\\langle p^\\ast,\\dot p\\rangle=\\frac1\\varepsilon\\big(\\tfrac1k-\\lVert p^\\ast\\rVert^2\\big)\\le0$, since
$1=(\\sum_{j\\in S}p^\\ast_j)^2\\le k\\lVert p^\\ast\\rVert^2$ (Cauchy–Schwarz). $F''=0$ exactly when $p^\\ast$ is uniform on $S$,
that is, when the costs are equal on $S$. Where a key enters the support it enters with weight $0$,
so $\\lVert p^\\ast\\rVert^2$ and $F'$ are continuous, but $k$ jumps by one: $F''$ jumps there ($F$ is $C^1$,
piecewise $C^2$, and concave throughout).

**(c)** As $\\varepsilon\\to\\infty$ the plan becomes uniform on the allowed keys (once $\\varepsilon$ exceeds
$m'$ times the largest excess of an allowed cost over their mean, $m'$ their number, all of them are in $S$ and $p^\\ast_j=1/m'+(\\bar C-C_j)/\\varepsilon$):
$F'\\to\\frac1{2m'}$. As $\\varepsilon\\to0$ the plan is the one-hot vector of the cheapest key (for
$\\varepsilon$ below the gap between the two smallest costs): $F'=\\frac12$ exactly there. Unlike the entropic
value, whose derivative is a divergence from the base measure that vanishes at the uniform plan, the
quadratic regularizer charges every plan at least $\\frac1{2m'}$: its minimum over the simplex is at the
uniform plan but is not zero, and at the hard-attention end it charges its maximum, $\\frac12$, where the
entropic value charges $\\log m$ (the surprise of one key under the uniform measure).""",
        "task:7": """## Task 7 · The temperature derivatives of the sparse value in code (3 points)

Implement `sparse_value_derivatives(cost, eps)` from your Task 6: for costs of shape `(..., m)`
(`+inf` allowed: a forbidden key, at least one finite cost per row) and a number `eps > 0`, return
`(F, dF, d2F)`, each of shape `(...)`: $F(\\varepsilon)$, $F'(\\varepsilon)$ and $F''(\\varepsilon)$ in closed form
(no finite differences, no autograd; $F''$ where the support does not change). Compute the plan
yourself (by sorting, eq. (3.17), or by bisection on the multiplier), along the last dimension with
no Python loop over rows, and let a forbidden key contribute nothing (no `nan`). The test compares
your functions with central finite differences of $F$.""",
        "value_derivatives": '''def sparse_value_derivatives(cost, eps):
    """F(eps) = min_p <C, p> + eps/2 |p|^2 over the simplex and its first two derivatives in eps."""
    ### BEGIN SOLUTION
    z, _ = torch.sort(-cost / eps, dim=-1, descending=True)  # a forbidden key (-inf) sorts last
    k = torch.arange(1, cost.shape[-1] + 1, dtype=cost.dtype)
    cumsum = torch.cumsum(z, dim=-1)
    k_star = (1 + k * z > cumsum).sum(dim=-1, keepdim=True)
    threshold = (torch.gather(cumsum, -1, k_star - 1) - 1) / k_star.to(cost.dtype)
    p = torch.clamp(-cost / eps - threshold, min=0)
    squared = (p * p).sum(-1)
    # on the support C_j = lam - eps p_j with lam = -eps threshold: F = lam - eps/2 |p|^2
    value = -eps * threshold.squeeze(-1) - eps / 2 * squared
    return value, squared / 2, (1 / k_star.squeeze(-1).to(cost.dtype) - squared) / eps
    ### END SOLUTION''',
        "test_value_derivatives": '''# Task 7: against central differences of F computed with attnopt's sparsemax, with a forbidden key; no overflow;
# concave.
from attnopt.transforms import sparsemax
from coursework import check, check_close, check_shape, own

f = own(sparse_value_derivatives, globals())
g = torch.Generator().manual_seed(7)
C = torch.randn(3, 6, generator=g)
eps, step = 0.6, 1e-4


def value(e, cost):  # F at the plan sparsemax(-C / eps), a forbidden key left out
    p = sparsemax(-cost / e)
    return torch.where(p > 0, p * cost, 0.0).sum(-1) + e / 2 * (p * p).sum(-1)


for forbidden in (False, True):
    cost = C.clone()
    if forbidden:
        cost[:, 2] = float("inf")
    which = "with a forbidden key" if forbidden else "every key allowed"
    F_, dF, d2F = f(cost, eps)
    check_shape(dF, (3,), f"F'(eps) for (3, 6) costs, {which}")
    check_shape(d2F, (3,), f"F''(eps) for (3, 6) costs, {which}")
    check_close(F_, value(eps, cost), f"F(eps), {which}",
                hint="0 * inf is nan at a forbidden key: leave such a key out of every sum" if not torch.isfinite(F_).all()
                else "F is the objective at the plan")
    check_close(dF, (value(eps + step, cost) - value(eps - step, cost)) / (2 * step),
                f"F'(eps), {which}, against central differences", atol=1e-7,
                hint="the envelope theorem: differentiate the objective in eps at a fixed plan")
    check_close(d2F, (value(eps + step, cost) - 2 * value(eps, cost) + value(eps - step, cost)) / step**2,
                f"F''(eps), {which}, against central differences", atol=1e-5,
                hint="the plan moves with eps, and so does the multiplier: differentiate the optimality conditions on the support")
    check(bool(torch.all(d2F <= 0)), f"the sign of F'', {which}", "F'' <= 0 (F is concave)", d2F.max())
shifted = f(C + 1000.0, eps)
check_close(shifted[0] - f(C, eps)[0], torch.full((3,), 1000.0), "F(C + 1000) - F(C)", atol=1e-9)
check_close(shifted[1], f(C, eps)[1], "F'(eps) for the costs C + 1000", atol=1e-9)
check_close(f(torch.full((2, 5), 0.3), eps)[2], torch.zeros(2), "F'' for equal costs (a uniform plan)", atol=1e-12)
''' + HIDDEN.format(task="value_derivatives"),
    },
}

ENTMAX_VALUE_DERIVATIVES = {
    "about": "the temperature derivatives of the 1.5-entmax value: F' = Omega(p*), "
             "F'' = -(4 / eps) (sum_j p_j^1.5 - 1 / sum_j p_j^0.5) (Task 6's derivation and Task 7's code)",
    "params": {"function": "entmax15_value_derivatives"},
    "cells": {
        "intro": [_row(_ROW6, "| 6 | a derivation: how the value of 1.5-entmax transport moves with the temperature |"),
                  _row(_ROW7, "| 7 | the temperature derivatives of Task 6 in code |")],
        "task:6": """## Task 6 · How the value of 1.5-entmax transport moves with the temperature: a derivation (2 points, graded by hand)

Let $F(\\varepsilon)=\\min_{p\\in\\Delta^{m-1}}\\langle C,p\\rangle+\\varepsilon\\,\\Omega(p)$ for fixed costs $C$ (some of
them may be $+\\infty$: forbidden keys), with the Tsallis regularizer of 1.5-entmax,
$\\Omega(p)=\\sum_j\\omega(p_j)$, $\\omega(p)=\\frac{p^{3/2}-p}{3/4}$: its plan is
$p^\\ast_\\varepsilon=\\operatorname{entmax}_{3/2}(-C/\\varepsilon)$, eq. (3.18), with a support $S_\\varepsilon$; how $F$
depends on $\\varepsilon$ is not in the book.

* **(a)** Show that $F'(\\varepsilon)=\\Omega(p^\\ast_\\varepsilon)$, in two ways: by writing $F$ in terms of the
  multiplier $\\lambda$ of $\\sum_jp_j=1$ (the threshold form of Theorem 3.2) and differentiating, and by
  an argument that never differentiates $p^\\ast_\\varepsilon$.
* **(b)** Where $S_\\varepsilon$ does not change near $\\varepsilon$, differentiate the optimality conditions on
  the support and find $F''(\\varepsilon)$ in terms of $\\sum_{j}(p^\\ast_j)^{3/2}$ and $\\sum_{j}(p^\\ast_j)^{1/2}$;
  conclude that $F$ is concave. When is $F''=0$?
* **(c)** Find the limits of $F'(\\varepsilon)$ as $\\varepsilon\\to\\infty$ and as $\\varepsilon\\to0$, the latter when the
  smallest cost is attained at a single key. Compare with the entropic value of Lemma 5.1, whose
  derivative is the divergence $\\operatorname{KL}(p^\\ast_\\varepsilon\\Vert u)$, never negative: what is the sign
  of $F'$ here, and why?

*Where to start:* $\\omega'(p)=2\\sqrt p-\\frac43$, so on the support $C_j+\\varepsilon\\,\\omega'(p^\\ast_j)=\\lambda$ says
what $C_j$ is. Write your derivation in the cell below (Markdown and LaTeX); Task 7 turns it into code.""",
        "written_value_derivatives": """Let $S$ be the support of $p^\\ast=p^\\ast_\\varepsilon$ and $\\lambda$ the multiplier: on $S$,
$C_j+\\varepsilon(2\\sqrt{p^\\ast_j}-\\frac43)=\\lambda$, and $p^\\ast_j=0$ off $S$. Write $A=\\sum_j(p^\\ast_j)^{3/2}$ and
$B=\\sum_j(p^\\ast_j)^{1/2}$ (sums over $S$), so that $\\Omega(p^\\ast)=\\frac43(A-1)$.

**(a)** $\\langle C,p^\\ast\\rangle=\\lambda-2\\varepsilon A+\\frac43\\varepsilon$, so
$F=\\lambda-2\\varepsilon A+\\frac43\\varepsilon+\\frac43\\varepsilon(A-1)=\\lambda-\\frac23\\varepsilon A$. Where $S$ is fixed, differentiate
$C_j+\\varepsilon\\,\\omega'(p^\\ast_j)=\\lambda$: $\\dot\\lambda=\\omega'(p^\\ast_j)+\\varepsilon\\,\\omega''(p^\\ast_j)\\dot p_j$ with
$\\omega''(p)=1/\\sqrt p$, i.e. $\\dot p_j=\\sqrt{p^\\ast_j}\\,(\\dot\\lambda-\\omega'(p^\\ast_j))/\\varepsilon$. Then
$F'=\\dot\\lambda-\\frac23A-\\frac23\\varepsilon\\cdot\\frac32\\sum_j\\sqrt{p^\\ast_j}\\dot p_j=\\dot\\lambda-\\frac23A-\\sum_jp^\\ast_j(\\dot\\lambda-\\omega'(p^\\ast_j))
=\\sum_jp^\\ast_j\\omega'(p^\\ast_j)-\\frac23A=2A-\\frac43-\\frac23A=\\frac43(A-1)=\\Omega(p^\\ast)$.
*Envelope argument:* $F$ is a minimum over $p$ of functions $\\varepsilon\\mapsto\\langle C,p\\rangle+\\varepsilon\\,\\Omega(p)$,
affine in $\\varepsilon$, attained at a unique minimizer continuous in $\\varepsilon$ ($\\Omega$ is strictly convex); by
Danskin's theorem $F'=\\Omega(p^\\ast_\\varepsilon)$. A minimum of affine functions is concave.

**(b)** $\\sum_{j\\in S}\\dot p_j=0$ gives $\\dot\\lambda\\,B=\\sum_j\\sqrt{p^\\ast_j}\\,\\omega'(p^\\ast_j)=2-\\frac43B$, so
$\\dot\\lambda=\\frac2B-\\frac43$ and $\\dot\\lambda-\\omega'(p^\\ast_j)=2(\\frac1B-\\sqrt{p^\\ast_j})$. Then
$F''=\\sum_j\\omega'(p^\\ast_j)\\dot p_j=\\sum_j(\\omega'(p^\\ast_j)-\\dot\\lambda)\\dot p_j
=-\\frac4\\varepsilon\\sum_j\\sqrt{p^\\ast_j}\\big(\\sqrt{p^\\ast_j}-\\tfrac1B\\big)^2=-\\frac4\\varepsilon\\Big(A-\\frac1B\\Big)$
(the second equality uses $\\sum_j\\dot p_j=0$). It is $\\le0$ because $1=(\\sum_jp^\\ast_j)^2\\le AB$ by Cauchy–Schwarz
($p_j=p_j^{3/4}p_j^{1/4}$), with equality exactly when $p^\\ast$ is uniform on $S$, that is, when the costs are
equal on $S$: then $F''=0$. (At an $\\varepsilon$ where a key enters the support, $F''$ is continuous here,
since the entering key has $\\sqrt{p_j}=0$; only its derivative jumps.)

**(c)** As $\\varepsilon\\to\\infty$ the plan becomes uniform on the $m'$ allowed keys and
$F'\\to\\Omega(\\text{uniform})=\\frac43(m'^{-1/2}-1)$. As $\\varepsilon\\to0$ the plan is one-hot on the cheapest key
(for $\\varepsilon$ below half the gap between the two smallest costs) and $F'=\\Omega(\\delta_{j^\\ast})=0$ exactly.
So $F'\\le0$: $\\Omega$ is a negative entropy, at most $0$ on the simplex, with its maximum $0$ at the vertices,
where $\\operatorname{KL}(\\cdot\\Vert u)$ is largest. Raising the temperature lowers the value by rewarding spread
(at most $\\frac43(1-m'^{-1/2})$ per unit of $\\varepsilon$), where the entropic value with a base measure pays for
leaving it.""",
        "task:7": """## Task 7 · The temperature derivatives of the 1.5-entmax value in code (3 points)

Implement `entmax15_value_derivatives(cost, eps)` from your Task 6: for costs of shape `(..., m)`
(`+inf` allowed: a forbidden key, at least one finite cost per row) and a number `eps > 0`, return
`(F, dF, d2F)`, each of shape `(...)`: $F(\\varepsilon)$, $F'(\\varepsilon)$ and $F''(\\varepsilon)$ in closed form
(no finite differences, no autograd). Compute the plan yourself (by bisection on the multiplier, as
in Task 4, or by sorting, Proposition 3.6), along the last dimension with no Python loop over rows,
and let a forbidden key contribute nothing (no `nan`). The test compares your functions with
central finite differences of $F$.""",
        "value_derivatives": '''def entmax15_value_derivatives(cost, eps):
    """F(eps) = min_p <C, p> + eps Omega_1.5(p) over the simplex and its first two derivatives in eps."""
    ### BEGIN SOLUTION
    # the plan by bisection on the multiplier: sqrt(p_j) = [(lam - C_j) / (2 eps) + 2/3]_+
    roots = lambda lam: torch.clamp((lam - cost) / (2 * eps) + 2 / 3, min=0)
    smallest = cost.min(dim=-1, keepdim=True).values
    lo, hi = smallest - 4 * eps / 3, smallest + 2 * eps / 3
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        short = (roots(mid) ** 2).sum(-1, keepdim=True) < 1
        lo, hi = torch.where(short, mid, lo), torch.where(short, hi, mid)
    root = roots(0.5 * (lo + hi))
    root = root / (root * root).sum(-1, keepdim=True).sqrt()  # sum_j p_j = 1 to the last bit
    p = root * root
    A, B = (p * root).sum(-1), root.sum(-1)
    value = torch.where(p > 0, p * cost, 0.0).sum(-1) + eps * 4 / 3 * (A - 1)
    return value, 4 / 3 * (A - 1), -4 / eps * (A - 1 / B)
    ### END SOLUTION''',
        "test_value_derivatives": '''# Task 7: against central differences of F computed with attnopt's entmax, with a forbidden key; no overflow;
# concave, with F' <= 0.
from attnopt.transforms import entmax
from coursework import check, check_close, check_shape, own

f = own(entmax15_value_derivatives, globals())
g = torch.Generator().manual_seed(7)
C = torch.randn(3, 6, generator=g)
eps, step = 0.6, 1e-4


def value(e, cost):  # F at the plan entmax(-C / eps, 1.5), a forbidden key left out
    p = entmax(-cost / e, 1.5)
    return torch.where(p > 0, p * cost, 0.0).sum(-1) + e * (p**1.5 - p).sum(-1) / 0.75


for forbidden in (False, True):
    cost = C.clone()
    if forbidden:
        cost[:, 2] = float("inf")
    which = "with a forbidden key" if forbidden else "every key allowed"
    F_, dF, d2F = f(cost, eps)
    check_shape(dF, (3,), f"F'(eps) for (3, 6) costs, {which}")
    check_shape(d2F, (3,), f"F''(eps) for (3, 6) costs, {which}")
    check_close(F_, value(eps, cost), f"F(eps), {which}", atol=1e-10,
                hint="0 * inf is nan at a forbidden key: leave such a key out of every sum" if not torch.isfinite(F_).all()
                else "F is the objective at the plan")
    check_close(dF, (value(eps + step, cost) - value(eps - step, cost)) / (2 * step),
                f"F'(eps), {which}, against central differences", atol=1e-7,
                hint="the envelope theorem: differentiate the objective in eps at a fixed plan")
    check_close(d2F, (value(eps + step, cost) - 2 * value(eps, cost) + value(eps - step, cost)) / step**2,
                f"F''(eps), {which}, against central differences", atol=1e-5,
                hint="the plan moves with eps, and so does the multiplier: differentiate the optimality conditions on the"
                " support, where omega'' is not constant")
    check(bool(torch.all(dF <= 0) and torch.all(d2F <= 0)), f"the signs, {which}", "F' <= 0 and F'' <= 0", (dF.max(), d2F.max()))
shifted = f(C + 1000.0, eps)
check_close(shifted[0] - f(C, eps)[0], torch.full((3,), 1000.0), "F(C + 1000) - F(C)", atol=1e-9)
check_close(shifted[1], f(C, eps)[1], "F'(eps) for the costs C + 1000", atol=1e-9)
check_close(f(torch.full((2, 4), 0.3), eps)[2], torch.zeros(2), "F'' for equal costs (a uniform plan)", atol=1e-12)
''' + HIDDEN.format(task="value_derivatives"),
    },
}


VARIANTS = {
    "gibbs": [ENTROPY_BONUS, UNBALANCED],
    "to_fenchel": [GAUSSIAN_POTENTIAL, POSITION_BIAS],
    "grid_softmax": [UNEVEN_GRID, SPARSE_GRID],
    "sparse_eot": [SHIFTED_ENTROPY, ENTMAX15],
    "value_derivatives": [SPARSE_VALUE_DERIVATIVES, ENTMAX_VALUE_DERIVATIVES],
}
