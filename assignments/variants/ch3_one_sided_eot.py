"""The variants of Assignment 3 (one-sided entropic transport), drawn from the course secret.

Variant 0 of every task is the one in ``source/ch3_one_sided_eot/ch3_one_sided_eot.ipynb``: the
public one, whose solution anyone can read in this repository. A course never draws it
(``tools/assignments.py``): each task below lists the variants a course draws from, and each changes
what must be derived (another member of the regularizer family, another quantity through the same
chain rule, another potential), not only a number, so that a copy of the public solution fails its
checks. ``params`` reach the hidden checks (``h.params``); ``cells`` say how the variant's notebook
differs from variant 0's: a grade id (or ``task:N`` for the text of Task N, ``intro`` for the
table) maps to the cell's new text, or to ``(old, new)`` replacements that must each match once.
"""

from __future__ import annotations

HIDDEN = "# hidden checks: other inputs, drawn from the course key, when the notebook is graded\n" \
         "from coursework import hidden_checks\n\nhidden_checks(\"{task}\", globals())"


def _row(old: str, new: str) -> tuple[str, str]:
    """A row of the intro's table: ``| N | what you write |`` changes, the points stay."""
    return old, new


# ------------------------------------------------------------------ Task 1: another member of the entmax family


def _entmax_backward(alpha: float, label: str, power: str, alpha_code: str) -> dict:
    return {
        "about": f"the backward pass of {label}-entmax instead of sparsemax (w = p^(2 - alpha) on the support)",
        "params": {"function": "entmax_backward", "alpha": alpha},
        "cells": {
            "intro": [_row("| 1 | the backward pass of sparsemax |",
                           f"| 1 | the backward pass of $\\alpha$-entmax, $\\alpha={label}$ |")],
            "task:1": f"""## Task 1 · The backward pass of $\\alpha$-entmax, $\\alpha={label}$ (3 points)

$\\alpha$-entmax, eq. (3.18), gives weights that, like sparsemax's, can be exactly zero; in this task
$\\alpha={label}$. Let $p=\\operatorname{{entmax}}_\\alpha(s/\\tau)$ with support $S=\\{{j:p_j>0\\}}$, and let a loss
$L$ depend on $p$ with upstream signal $u_j=\\partial L/\\partial p_j$, eq. (3.27). Where the support does
not change under small perturbations of $s$, differentiate the optimality condition of eq. (3.18) on
$S$ (and $p_j=0$ off it), using that $\\sum_{{j\\in S}}p_j=1$ fixes how the threshold moves, and derive
$\\partial L/\\partial s_j$ in terms of $p$, $u$ and $\\tau$ only (no threshold left). Compare it with
the advantage form (3.28) of softmax: what plays the role of $p_j$, and which mean of $u$ is the
baseline?

Implement `entmax_backward(p, upstream, tau=1.0)` for $\\alpha={label}$: given the weights $p$ (shape
`(..., m)`, zeros allowed), $u$ of the same shape and the temperature, return
$\\partial L/\\partial s$, shape `(..., m)`, without a Python loop over the rows. The test compares it
with autograd through `attnopt`'s `entmax`.""",
            "sparsemax_backward": f'''def entmax_backward(p, upstream, tau=1.0):
    """d loss / d scores for p = entmax_alpha(scores / tau) with alpha = {label}, given u = d loss / d p."""
    ### BEGIN SOLUTION
    # on the support p_j^(alpha - 1) = (alpha - 1) s_j / tau - threshold, so dp_j = w_j (ds_j / tau - c)
    # with w_j = p_j^(2 - alpha); the weights summing to one fix c as the w-weighted mean
    w = torch.where(p > 0, p ** ({power}), 0.0)
    baseline = (w * upstream).sum(-1, keepdim=True) / w.sum(-1, keepdim=True)
    return w * (upstream - baseline) / tau
    ### END SOLUTION''',
            "test_sparsemax_backward": f'''# Task 1: against autograd through alpha-entmax (attnopt's, alpha = {label}); zero off the support.
from attnopt.transforms import entmax
from coursework import check, check_close, check_shape, own

f = own(entmax_backward, globals())
g = torch.Generator().manual_seed(1)
tau, alpha = 0.6, {alpha_code}
s = (2 * torch.randn(4, 6, 9, generator=g)).requires_grad_(True)
p = entmax(s / tau, alpha)
u = torch.randn(4, 6, 9, generator=g)
(expected,) = torch.autograd.grad((p * u).sum(), s)
p = p.detach()
found = f(p, u, tau)
check_shape(found, (4, 6, 9), "d loss / d scores")
check(torch.all(found[p == 0] == 0), "the gradient of keys with weight 0", "exactly 0", found[p == 0].abs().max(),
      hint="off the support p_j = 0 whatever s_j is (in torch 0 ** 0 is 1)")
support = (p > 0).to(p.dtype)
sparsemax_form = support * (u - (support * u).sum(-1, keepdim=True) / support.sum(-1, keepdim=True)) / tau
ratio = (f(p, u, 1.0) * expected).sum() / (expected * expected).sum()
check_close(found, expected, f"d loss / d scores with alpha = {label}, tau = {{tau}}",
            hint=f"your answer for tau = 1 is {{ratio.item():.3g}} times this one: did you forget the factor 1/tau?"
            if abs(ratio.item() - tau) < 1e-6 else
            "yours is the backward pass of sparsemax (alpha = 2): differentiate the optimality condition of eq. (3.18)"
            " for alpha = {label}, where the power alpha - 1 of p_j is not 1" if torch.allclose(found, sparsemax_form, atol=1e-12) else
            "yours is minus autograd's: raising s_j raises p_j on the support" if torch.allclose(found, -expected, atol=1e-12)
            else "differentiate the optimality condition of eq. (3.18) on the support; the weights summing to one fix"
            " how the threshold moves")
# a shift of the upstream signal does not change the gradient, as for softmax
check_close(f(p, u + 5.0, tau), found, "the gradient for u + 5")
# nor does a shift of the scores change the weights: no gradient along (1, ..., 1)
check_close(found.sum(-1), torch.zeros(4, 6), "the sum of the gradient over the keys", atol=1e-13,
            hint="adding one constant to every score changes no weight of entmax")
''' + HIDDEN.format(task="sparsemax_backward"),
        },
    }


# ------------------------------------------------------------------ Task 2: the same chain rule, another quantity


LOG_SOFTMAX_BACKWARD = {
    "about": "the backward pass of log-softmax (the loss sees log p, as a policy gradient does) instead of softmax",
    "params": {"function": "log_softmax_backward"},
    "cells": {
        "intro": [_row("| 2 | the backward pass of softmax in advantage form |",
                       "| 2 | the backward pass of log-softmax, and its baseline |")],
        "task:2": """## Task 2 · The backward pass of the log-probabilities (3 points)

Theorem 3.6 differentiates a loss of the weights $p=\\operatorname{softmax}(s/\\tau)$. A policy-gradient
estimator differentiates the log-probabilities instead: let $\\ell_j=\\log p_j$ and let a loss $L$
depend on $\\ell$, with upstream signal $u_j=\\partial L/\\partial\\ell_j$. Derive
$\\partial L/\\partial s_j$ in terms of $p$, $u$ and $\\tau$, and compare it with eq. (3.28): which
quantity is the baseline now, and how much of it does key $j$ carry? Say why the gradient's entries
sum to zero.

Implement `log_softmax_backward(p, upstream, tau=1.0)`: given the weights $p$ (not their logarithms)
and $u$, both of shape `(..., m)`, return $\\partial L/\\partial s$ along the last dimension (any
leading dimensions).""",
        "softmax_backward": '''def log_softmax_backward(p, upstream, tau=1.0):
    """d loss / d scores for log p = log_softmax(scores / tau), given u = d loss / d log p."""
    ### BEGIN SOLUTION
    # d log p_k / d s_j = (delta_jk - p_j) / tau: every key pays p_j times the total signal
    return (upstream - p * upstream.sum(-1, keepdim=True)) / tau
    ### END SOLUTION''',
        "test_softmax_backward": '''# Task 2: what autograd computes through torch.log_softmax.
from coursework import check_close, check_shape, own

f = own(log_softmax_backward, globals())
g = torch.Generator().manual_seed(2)
tau = 0.7
s = torch.randn(5, 7, generator=g, requires_grad=True)
u = torch.randn(5, 7, generator=g)
(autograd,) = torch.autograd.grad((torch.log_softmax(s / tau, dim=-1) * u).sum(), s)
p = torch.softmax(s / tau, dim=-1).detach()
ours = f(p, u, tau)
check_shape(ours, (5, 7), "d loss / d scores")
advantage = p * (u - (p * u).sum(-1, keepdim=True)) / tau
check_close(ours, autograd, f"d loss / d scores with tau = {tau}, against autograd through log_softmax", atol=1e-14,
            hint="yours is tau times autograd's: the chain rule through s / tau brings a factor 1/tau"
            if torch.allclose(ours, tau * autograd, atol=1e-12) else
            "yours is the backward pass of softmax, eq. (3.28), with u taken as d loss / d p: here u is the signal"
            " on log p" if torch.allclose(ours, advantage, atol=1e-12) else
            "yours is minus autograd's" if torch.allclose(ours, -autograd, atol=1e-12) else
            "differentiate log p_k in every score s_j: the normalizer of softmax depends on all of them")
# the entries of the gradient sum to zero in every row (the task asks you to say why)
check_close(ours.sum(-1), torch.zeros(5), "the sum of the gradient over the keys", atol=1e-13)
''' + HIDDEN.format(task="softmax_backward"),
    },
}

OUTPUT_BACKWARD = {
    "about": "the backward pass from the attention output o = sum_j p_j v_j (the reward of key j is <v_j, dL/do>)",
    "params": {"function": "output_backward"},
    "cells": {
        "intro": [_row("| 2 | the backward pass of softmax in advantage form |",
                       "| 2 | the backward pass from the attention output to the scores |")],
        "task:2": """## Task 2 · From the attention output back to the scores (3 points)

An attention layer does not hand its weights to the loss but their average of the values,
$o=\\sum_jp_jv_j$ with $p=\\operatorname{softmax}(s/\\tau)$ and $v_j\\in\\mathbb R^d$. Let a loss $L$ depend on
$o$, with upstream signal $g=\\partial L/\\partial o\\in\\mathbb R^d$. Derive $\\partial L/\\partial s_j$ in
terms of $p$, the values, $g$ and $\\tau$, and write it in the advantage form of Theorem 3.6: what is
the "reward" of key $j$, and what is the baseline? Say why adding one vector $c$ to every value
changes nothing.

Implement `output_backward(p, values, grad_output, tau=1.0)`: $p$ of shape `(..., m)`, the values of
shape `(..., m, d)`, $g$ of shape `(..., d)`; return $\\partial L/\\partial s$, shape `(..., m)`, with
no Python loop over the keys or the rows.""",
        "softmax_backward": '''def output_backward(p, values, grad_output, tau=1.0):
    """d loss / d scores for o = sum_j p_j v_j, p = softmax(scores / tau), given g = d loss / d o."""
    ### BEGIN SOLUTION
    reward = (values * grad_output.unsqueeze(-2)).sum(-1)  # <v_j, g>: what a unit of weight on key j is worth
    return p * (reward - (p * reward).sum(-1, keepdim=True)) / tau
    ### END SOLUTION''',
        "test_softmax_backward": '''# Task 2: what autograd computes through softmax and the weighted sum of the values.
from coursework import check_close, check_shape, own

f = own(output_backward, globals())
g = torch.Generator().manual_seed(2)
tau = 0.7
s = torch.randn(5, 7, generator=g, requires_grad=True)
values = torch.randn(5, 7, 3, generator=g)
grad_output = torch.randn(5, 3, generator=g)
p = torch.softmax(s / tau, dim=-1)
output = (p.unsqueeze(-1) * values).sum(-2)
(autograd,) = torch.autograd.grad((output * grad_output).sum(), s)
p = p.detach()
ours = f(p, values, grad_output, tau)
check_shape(ours, (5, 7), "d loss / d scores")
check_close(ours, autograd, f"d loss / d scores with tau = {tau}, against autograd", atol=1e-14,
            hint="yours is tau times autograd's: the chain rule through s / tau brings a factor 1/tau"
            if torch.allclose(ours, tau * autograd, atol=1e-12) else
            "yours is minus autograd's: check the sign of each factor of the chain rule"
            if torch.allclose(ours, -autograd, atol=1e-12) else
            "first find d o / d p_j, then use the advantage form of Theorem 3.6 with that reward")
# one vector added to every value changes nothing (the task asks you to say why)
shift = torch.randn(5, 1, 3, generator=g)
check_close(f(p, values + shift, grad_output, tau), ours, "the gradient with every value shifted by one vector", atol=1e-13)
# adding one constant to every score changes no weight, hence no output
check_close(ours.sum(-1), torch.zeros(5), "the sum of the gradient over the keys", atol=1e-13)
''' + HIDDEN.format(task="softmax_backward"),
    },
}


# ------------------------------------------------------------------ Task 3: the Hessian of another potential


VALUE_HESSIAN = {
    "about": "the Hessian of the transport value in the costs, -(diag p - p p^T)/eps (concave), instead of the potential's",
    "params": {"function": "value_hessian"},
    "cells": {
        "intro": [_row("| 3 | the Hessian of the log-sum-exp potential (the Fisher information) |",
                       "| 3 | the Hessian of the value of the transport problem in the costs |")],
        "task:3": """## Task 3 · The curvature of the value of the transport problem (2 points)

Let $V(C)=\\min_{p\\in\\Delta^{m-1}}\\langle C,p\\rangle-\\varepsilon H(p)$ be the value of the one-sided
entropic problem as a function of the costs $C\\in\\mathbb R^m$, with optimal plan
$p^\\ast=\\operatorname{softmax}(-C/\\varepsilon)$ (Theorem 3.1). Derive the Hessian
$\\nabla^2V(C)$ (start from the gradient of $V$, by the envelope theorem, not from a formula for
$V$), show that $V$ is concave, and give the null vector of the Hessian and its meaning. Relate the
Hessian to the Fisher information of Theorem 3.5.

Implement `value_hessian(cost, eps)`: for costs of shape `(..., m)` return the Hessian, shape
`(..., m, m)`.""",
        "lse_hessian": '''def value_hessian(cost, eps):
    """Hessian in the costs of min over the simplex of <C, p> - eps H(p), along the last dimension."""
    ### BEGIN SOLUTION
    p = torch.softmax(-cost / eps, dim=-1)  # the gradient of the value, the optimal plan
    return -(torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)) / eps
    ### END SOLUTION''',
        "test_lse_hessian": '''# Task 3: against autograd's Hessian of <C, p*> - eps H(p*); negative semi-definite with the null vector 1; batches.
from coursework import check, check_close, check_shape, own

f = own(value_hessian, globals())
g = torch.Generator().manual_seed(3)
eps = 0.5
C = torch.randn(6, generator=g)
H = f(C, eps)
check_shape(H, (6, 6), "the Hessian for 6 costs")


def value(c):  # the objective at its minimizer: an identity in C, so autograd differentiates the value
    q = torch.softmax(-c / eps, dim=0)
    return (c * q).sum() + eps * (q * torch.log(q)).sum()


H_autograd = torch.autograd.functional.hessian(value, C)
check_close(H, H_autograd, f"the Hessian with eps = {eps}, against autograd", atol=1e-13,
            hint="yours is minus autograd's: check the sign at each step, from the value to its gradient to the Hessian"
            if torch.allclose(H, -H_autograd, atol=1e-12) else
            "check the factor 1/eps" if torch.allclose(H, eps * H_autograd, atol=1e-12) else
            "start from the gradient of the value by the envelope theorem, with the minimizer of Theorem 3.1, and"
            " differentiate it once more")
check_close(H @ torch.ones(6), torch.zeros(6), "H 1", atol=1e-14)
check(torch.linalg.eigvalsh(H).max() < 1e-14, "the largest eigenvalue of H", "<= 0", torch.linalg.eigvalsh(H).max())
check_shape(f(torch.randn(3, 4, 6, generator=g), eps), (3, 4, 6, 6), "the Hessian for (3, 4, 6) costs")
''' + HIDDEN.format(task="lse_hessian"),
    },
}

SPARSEMAX_HESSIAN = {
    "about": "the Hessian of sparsemax's potential, (diag 1_S - 1_S 1_S^T/|S|)/tau, instead of log-sum-exp's",
    "params": {"function": "sparsemax_potential_hessian"},
    "cells": {
        "intro": [_row("| 3 | the Hessian of the log-sum-exp potential (the Fisher information) |",
                       "| 3 | the Hessian of sparsemax's potential |")],
        "task:3": """## Task 3 · The curvature of sparsemax's potential (2 points)

Log-sum-exp is the potential of softmax: its gradient is softmax, its Hessian the Fisher information
over $\\tau$ (Theorem 3.5). Sparsemax has a potential too,
$\\Phi_\\tau(s)=\\max_{p\\in\\Delta^{m-1}}\\langle s,p\\rangle-\\tfrac\\tau2\\lVert p\\rVert^2$, whose
gradient is $\\operatorname{sparsemax}(s/\\tau)$ (the same conjugacy argument as for log-sum-exp).
Derive $\\nabla^2\\Phi_\\tau(s)$ where the support $S$ of $\\operatorname{sparsemax}(s/\\tau)$ does not
change near $s$; show that it is positive semi-definite, give its null vectors, and say which matrix
plays the role of $\\operatorname{diag}(p)-pp^\\top$.

Implement `sparsemax_potential_hessian(scores, tau=1.0)`: for scores of shape `(..., m)` return the
Hessian, shape `(..., m, m)`, with no Python loop over the rows (you will need the support of
sparsemax: compute it from the scores, eq. (3.17)).""",
        "lse_hessian": '''def sparsemax_potential_hessian(scores, tau=1.0):
    """Hessian of max over the simplex of <s, p> - tau/2 |p|^2, along the last dimension."""
    ### BEGIN SOLUTION
    z, _ = torch.sort(scores / tau, dim=-1, descending=True)
    k = torch.arange(1, scores.shape[-1] + 1, dtype=scores.dtype)
    cumsum = torch.cumsum(z, dim=-1)
    k_star = (1 + k * z > cumsum).sum(dim=-1, keepdim=True)
    threshold = (torch.gather(cumsum, -1, k_star - 1) - 1) / k_star.to(scores.dtype)
    support = (scores / tau > threshold).to(scores.dtype)
    # the gradient is sparsemax, p_j = s_j / tau - threshold on S: its Jacobian is the projection
    # onto {sum = 0} inside the coordinates of S
    outer = support.unsqueeze(-1) * support.unsqueeze(-2) / support.sum(-1)[..., None, None]
    return (torch.diag_embed(support) - outer) / tau
    ### END SOLUTION''',
        "test_lse_hessian": '''# Task 3: the Jacobian of sparsemax (the potential's gradient) by autograd; PSD with null vectors; batches.
from attnopt.transforms import sparsemax
from coursework import check, check_close, check_shape, own

f = own(sparsemax_potential_hessian, globals())
g = torch.Generator().manual_seed(3)
tau = 0.5
s = 2 * torch.randn(7, generator=g)
H = f(s, tau)
check_shape(H, (7, 7), "the Hessian for 7 scores")
H_autograd = torch.autograd.functional.jacobian(lambda x: sparsemax(x / tau), s)
p = sparsemax(s / tau)
softmax_like = (torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)) / tau
check_close(H, H_autograd, f"the Hessian with tau = {tau}, against autograd through sparsemax", atol=1e-13,
            hint="check the factor 1/tau" if torch.allclose(H, tau * H_autograd, atol=1e-12) else
            "yours is softmax's Fisher form with sparsemax's weights: differentiate p_j = s_j / tau - threshold on"
            " the support, where the threshold moves too" if torch.allclose(H, softmax_like, atol=1e-12) else
            "the gradient of the potential is sparsemax(s / tau); differentiate it on its support")
check_close(H @ torch.ones(7), torch.zeros(7), "H 1", atol=1e-14)
check(torch.all(H[p == 0] == 0), "the rows of H for keys of weight 0", "exactly 0", H[p == 0].abs().max())
check(torch.linalg.eigvalsh(H).min() > -1e-14, "the smallest eigenvalue of H", ">= 0", torch.linalg.eigvalsh(H).min())
check_shape(f(torch.randn(3, 4, 7, generator=g), tau), (3, 4, 7, 7), "the Hessian for (3, 4, 7) scores")
''' + HIDDEN.format(task="lse_hessian"),
    },
}


# ------------------------------------------------------------------ Task 4: the value under another regularizer


PRIOR_VALUE = {
    "about": "the value with a KL prior, min <C, p> + eps KL(p || pi), instead of the entropy",
    "params": {"function": "eot_value_prior"},
    "cells": {
        "intro": [_row("| 4 | the value of the entropic problem, whose gradient is the transport plan |",
                       "| 4 | the value of the problem with a prior, whose gradient is the transport plan |")],
        "task:4": """## Task 4 · The value of the transport problem with a prior (2 points)

Replace the entropy by the divergence from a prior $\\pi$ on the keys ($\\pi_j\\ge0$, $\\sum_j\\pi_j=1$),
the member of the regularizer family that gives softmax with a prior (Proposition 3.7). Implement
`eot_value_prior(cost, eps, prior)`: the optimal value
$\\min_{p\\in\\Delta^{m-1}}\\langle C,p\\rangle+\\varepsilon\\operatorname{KL}(p\\,\\Vert\\,\\pi)$ along the
last dimension, in closed form (derive it from the minimizer). A key is forbidden either by a cost of
`+inf` or by a prior weight of `0`: the value must stay finite and the key must get zero weight.
Write it with differentiable torch operations: by the envelope theorem the gradient of the value
with respect to the costs is the optimal plan, zero at a forbidden key, and the test checks both.""",
        "eot_value": '''def eot_value_prior(cost, eps, prior):
    """min over the simplex of <C, p> + eps KL(p || prior), along the last dimension."""
    ### BEGIN SOLUTION
    # the minimizer is p_j = prior_j exp(-C_j / eps) / Z, and the value is -eps log Z
    return -eps * torch.logsumexp(-cost / eps + torch.log(prior), dim=-1)
    ### END SOLUTION''',
        "test_eot_value": '''# Task 4: the value at the optimum, below every other point of the simplex; its gradient is the plan,
# also with a forbidden key (cost +inf, or prior weight 0). The optimum comes from attnopt's generic solver,
# which bisects on the optimality conditions (it never calls a closed form).
from attnopt.transforms import one_sided_eot
from coursework import check, check_close, check_shape, own

f = own(eot_value_prior, globals())
g = torch.Generator().manual_seed(4)
eps = 0.8
C = torch.randn(5, generator=g)
prior = torch.rand(5, generator=g) + 0.1
prior = prior / prior.sum()
p_star = one_sided_eot(C, eps, "kl", prior=prior)
kl = lambda p: (p * torch.log(p / prior)).sum(-1)
value = f(C, eps, prior)
check_shape(value, (), "the value for 5 costs")
check_close(value, C @ p_star + eps * kl(p_star), "the value <C, p*> + eps KL(p* || prior)", atol=1e-13,
            hint="with a uniform prior this is the entropic value plus a constant: which constant?")
others = torch.distributions.Dirichlet(torch.ones(5)).sample((500,))
check(torch.all(value <= others @ C + eps * kl(others) + 1e-13), "the value",
      f"at most the objective at 500 random points, whose smallest is {(others @ C + eps * kl(others)).min().item():.6g}", value)
C_leaf = C.clone().requires_grad_(True)
(grad,) = torch.autograd.grad(f(C_leaf, eps, prior), C_leaf)
check_close(grad, p_star, "the gradient of the value (the plan p*)", atol=1e-14)
for what, cost, weights in (("a cost +inf", torch.tensor([0.3, float("inf"), -0.2, 1.0]), torch.full((4,), 0.25)),
                            ("a prior weight 0", torch.tensor([0.3, 0.5, -0.2, 1.0]), torch.tensor([0.4, 0.0, 0.3, 0.3]))):
    check(torch.isfinite(f(cost, eps, weights)), f"the value with a forbidden key ({what})", "a finite number",
          f(cost, eps, weights), hint="0 * log 0 = nan in torch: derive the value in closed form from the minimizer,"
          " an expression in which a forbidden key contributes nothing")
    leaf = cost.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(f(leaf, eps, weights), leaf)
    check_close(grad, one_sided_eot(cost, eps, "kl", prior=weights), f"the gradient with a forbidden key ({what})", atol=1e-14)
''' + HIDDEN.format(task="eot_value"),
    },
}

SPARSE_VALUE = {
    "about": "the value with the quadratic regularizer, min <C, p> + eps/2 |p|^2 = threshold - eps/2 |p*|^2",
    "params": {"function": "sparse_eot_value"},
    "cells": {
        "intro": [_row("| 4 | the value of the entropic problem, whose gradient is the transport plan |",
                       "| 4 | the value of the quadratic problem, whose gradient is the sparse plan |")],
        "task:4": """## Task 4 · The value of the sparse transport problem (2 points)

Replace the entropy by the quadratic regularizer, whose plan is sparsemax (Theorem 3.3). Implement
`sparse_eot_value(cost, eps)`: the optimal value
$\\min_{p\\in\\Delta^{m-1}}\\langle C,p\\rangle+\\tfrac\\varepsilon2\\lVert p\\rVert^2$ along the last dimension.
Derive it in closed form in terms of the threshold of the optimal plan and the plan's squared norm
(the optimality conditions on the support say what $C_j$ is there); the plan itself you compute
from the costs by sorting, eq. (3.17). A cost of `+inf` forbids a key: the value must stay finite and
the key must get zero weight. Write it with differentiable torch operations: by the envelope theorem
the gradient of the value with respect to the costs is the optimal plan, zero at every key outside
its support, and the test checks both.""",
        "eot_value": '''def sparse_eot_value(cost, eps):
    """min over the simplex of <C, p> + eps/2 |p|^2, along the last dimension."""
    ### BEGIN SOLUTION
    z, _ = torch.sort(-cost / eps, dim=-1, descending=True)  # a forbidden key (-inf) sorts last
    k = torch.arange(1, cost.shape[-1] + 1, dtype=cost.dtype)
    cumsum = torch.cumsum(z, dim=-1)
    k_star = (1 + k * z > cumsum).sum(dim=-1, keepdim=True)
    threshold = (torch.gather(cumsum, -1, k_star - 1) - 1) / k_star.to(cost.dtype)
    p = torch.clamp(-cost / eps - threshold, min=0)
    # on the support C_j = lam - eps p_j with lam = -eps threshold, so <C, p> = lam - eps |p|^2
    return -eps * threshold.squeeze(-1) - eps / 2 * (p * p).sum(-1)
    ### END SOLUTION''',
        "test_eot_value": '''# Task 4: the value at the optimum, below every other point of the simplex; its gradient is the plan,
# also with a forbidden key (cost +inf).
from attnopt.transforms import sparsemax
from coursework import check, check_close, check_shape, own

f = own(sparse_eot_value, globals())
g = torch.Generator().manual_seed(4)
eps = 0.8
C = torch.randn(6, generator=g)
p_star = sparsemax(-C / eps)
value = f(C, eps)
check_shape(value, (), "the value for 6 costs")
check_close(value, C @ p_star + eps / 2 * (p_star * p_star).sum(), "the value <C, p*> + eps/2 |p*|^2", atol=1e-13,
            hint="on the support the optimality condition gives C_j in terms of the threshold and p_j")
others = torch.distributions.Dirichlet(torch.ones(6)).sample((500,))
objective = others @ C + eps / 2 * (others * others).sum(-1)
check(torch.all(value <= objective + 1e-13), "the value",
      f"at most the objective at 500 random points, whose smallest is {objective.min().item():.6g}", value)
C_leaf = C.clone().requires_grad_(True)
(grad,) = torch.autograd.grad(f(C_leaf, eps), C_leaf)
check_close(grad, p_star, "the gradient of the value (the plan p*)", atol=1e-14)
forbidden = torch.tensor([0.3, float("inf"), -0.2, 1.0, 0.1])
check(torch.isfinite(f(forbidden, eps)), "the value with a forbidden key (cost +inf)", "a finite number", f(forbidden, eps),
      hint="p_j C_j = 0 * inf = nan at a forbidden key: write the value through the threshold and |p*|^2, to which"
           " a forbidden key contributes nothing")
leaf = forbidden.clone().requires_grad_(True)
(grad,) = torch.autograd.grad(f(leaf, eps), leaf)
check_close(grad, sparsemax(-forbidden / eps), "the gradient with a forbidden key (cost +inf)", atol=1e-14)
''' + HIDDEN.format(task="eot_value"),
    },
}


# ------------------------------------------------------------------ Task 5: exact zeros of another regularizer


PRIOR_ZEROS = {
    "about": "which keys softmax with a prior gives exactly zero weight, and what that means for a mask",
    "params": {},
    "cells": {
        "task:5": """## Task 5 · Zeros from a prior (2 points, graded by hand)

Using the optimality (KKT) conditions of $\\min_{p\\in\\Delta}\\langle C,p\\rangle+\\varepsilon\\operatorname{KL}(p\\,\\Vert\\,\\pi)$,
explain in a few sentences which keys get exactly zero weight and why no other key does, however
large its cost, and contrast this with sparsemax. Then say what this means for the backward pass of
Task 2 at such a key, and for a causal mask written as a prior.""",
        "written_exact_zeros": """With a multiplier $\\lambda$ for $\\sum_jp_j=1$ and $\\mu_j\\ge0$ for $p_j\\ge0$, stationarity reads
$C_j+\\varepsilon(1+\\log(p_j/\\pi_j))=\\lambda+\\mu_j$ with $\\mu_jp_j=0$. For $\\pi_j>0$ the derivative
$\\varepsilon(1+\\log(p_j/\\pi_j))\\to-\\infty$ as $p_j\\to0$, so $p_j=0$ cannot satisfy it with a finite
cost: $p_j=\\pi_je^{(\\lambda-C_j)/\\varepsilon-1}>0$, small for a large cost but never zero. For $\\pi_j=0$
any $p_j>0$ makes the divergence infinite, so $p_j=0$ exactly. The zeros are therefore fixed by the
prior, not by the scores: unlike sparsemax, whose zeros are the keys below a threshold that moves with
the scores, no score can open or close a key. A key of weight zero gets zero gradient (the advantage
form carries the factor $p_j=0$), so a zero prior weight, a causal mask, stays closed during training;
every key with $\\pi_j>0$ keeps a positive weight and a nonzero gradient.""",
    },
}

TSALLIS_ZEROS = {
    "about": "for which alpha the Tsallis regularizer gives exact zeros, through omega'(0), and where the threshold is",
    "params": {},
    "cells": {
        "task:5": """## Task 5 · Exact zeros across the entmax family (2 points, graded by hand)

Take the regularizer of $\\alpha$-entmax as the book writes it (the table of the family in section 3.3,
which gives eq. (3.18)): $\\Omega(p)=\\frac{\\sum_jp_j^\\alpha-1}{\\alpha(\\alpha-1)}$, $\\alpha>1$, a sum of
$\\omega(t)=\\frac{t^\\alpha}{\\alpha(\\alpha-1)}$ over the keys up to a constant. Using the optimality (KKT)
conditions of $\\min_{p\\in\\Delta}\\langle C,p\\rangle+\\varepsilon\\Omega(p)$, derive the weight of every key
in terms of its cost and the multiplier $\\lambda$ of $\\sum_jp_j=1$, and give the cost above which a key
gets weight exactly zero (compare Theorem 3.2). Explain why every $\\alpha>1$ can give exact zeros
while the limit $\\alpha\\to1$, softmax, cannot, and say what happens to the threshold in that limit.
Then say what this means for the backward pass at a key of weight zero.""",
        "written_exact_zeros": """With a multiplier $\\lambda$ for $\\sum_jp_j=1$ and $\\mu_j\\ge0$ for $p_j\\ge0$, stationarity reads
$C_j+\\varepsilon\\,\\omega'(p_j)=\\lambda+\\mu_j$ with $\\mu_jp_j=0$, where
$\\omega'(t)=\\frac{t^{\\alpha-1}}{\\alpha-1}$ (the constant $-\\frac1{\\alpha(\\alpha-1)}$ of $\\Omega$ has no
derivative). For $\\alpha>1$, $\\omega'$ is increasing and $\\omega'(0)=0$ is finite, so $p_j=0$ is optimal
exactly when $\\mu_j=C_j-\\lambda\\ge0$: every key whose cost is at least $\\lambda$ gets weight zero, and
the others get $p_j=\\big[(\\alpha-1)(\\lambda-C_j)/\\varepsilon\\big]^{1/(\\alpha-1)}>0$, which is eq. (3.18) for
the scores $-C/\\varepsilon$ (Theorem 3.2 with $c_j=0$). So every $\\alpha>1$ can give exact zeros. As
$\\alpha\\to1$, write $\\omega'(t)=\\frac1{\\alpha-1}+\\frac{t^{\\alpha-1}-1}{\\alpha-1}$: the first part is the same
for every key and goes into the multiplier, $\\lambda-\\frac{\\varepsilon}{\\alpha-1}$ stays finite (it tends
to the multiplier of the entropic problem minus $\\varepsilon$), so the zero threshold
$\\lambda=\\big(\\lambda-\\frac{\\varepsilon}{\\alpha-1}\\big)+\\frac{\\varepsilon}{\\alpha-1}$ runs off to $+\\infty$; the
second part tends to $\\log t$, which is $-\\infty$ at $0$: softmax never gives a zero. (Written as
$\\sum_j\\frac{p_j^\\alpha-p_j}{\\alpha(\\alpha-1)}$, the regularizer differs from the book's by the term
$-\\frac{\\sum_jp_j-1}{\\alpha(\\alpha-1)}$, linear in $p$ and zero on the simplex, which only shifts the
multiplier: there $\\omega'(0)=-\\frac1{\\alpha(\\alpha-1)}$ and the threshold reads
$\\lambda+\\frac{\\varepsilon}{\\alpha(\\alpha-1)}$; either answer is right if its convention is stated.) A key
of weight zero gets zero gradient: the Jacobian of entmax carries the factor $p_j^{2-\\alpha}$, which is
$0$ off the support, so the model receives no signal to raise that key until its cost falls below
the threshold.""",
    },
}

# ------------------------------------------------------------------ Tasks 6 and 7: other derivatives along the family


ALPHA_DERIVATIVES = {
    "about": "how alpha-entmax, its expected score and its Tsallis entropy move with alpha at a fixed temperature",
    "params": {"function": "entmax_alpha_derivatives"},
    "cells": {
        "intro": [_row("| 6 | a derivation: how $\\alpha$-entmax moves with the temperature |",
                       "| 6 | a derivation: how $\\alpha$-entmax moves with $\\alpha$ |"),
                  _row("| 7 | the temperature derivatives of Task 6 in code |",
                       "| 7 | the derivatives in $\\alpha$ of Task 6 in code |")],
        "task:6": """## Task 6 · Moving along the entmax family: a derivation (2 points, graded by hand)

Proposition 3.4 follows softmax's weights as the temperature rises. Here the temperature stays
fixed and the member of the family moves: let $p(\\alpha)=\\operatorname{entmax}_\\alpha(z)$, eq. (3.18), for
the scores $z=s/\\tau$ with $\\tau>0$ fixed, $1<\\alpha\\le2$, and assume that the support
$S=\\{j:p_j>0\\}$ does not change near $\\alpha$.

* **(a)** Derive $dp_j/d\\alpha$ for every key, on the support and off it, in terms of $p$, $z$ and
  $\\alpha$ only (no threshold left in the answer). The Shannon entropy $H(p)$ will appear.
* **(b)** Derive $\\frac{d}{d\\alpha}\\langle s,p(\\alpha)\\rangle$ and the total derivative
  $\\frac{d}{d\\alpha}H^{\\mathrm T}_\\alpha(p(\\alpha))$ of the Tsallis entropy
  $H^{\\mathrm T}_\\alpha(p)=\\frac1{\\alpha(\\alpha-1)}\\sum_j(p_j-p_j^\\alpha)$ of section 3.3, which depends on
  $\\alpha$ twice: through the weights and through its own formula. Show that the first derivative is
  never negative and the second never positive, and say when the first vanishes.
* **(c)** Say what (a) gives at $\\alpha=2$ (sparsemax) for a key inside the support and for a key
  outside it.

*Where to start:* differentiate the optimality condition of eq. (3.18) on the support in $\\alpha$,
not a formula for $p$; the exponent $\\alpha-1$ moves too, and the weights summing to one for every
$\\alpha$ fixes how the threshold moves. For the sign in (b), write $z_j$ through
$q_j=p_j^{\\alpha-1}$. Write your derivation in the cell below (Markdown and LaTeX); Task 7 turns it
into code.""",
        "written_entmax_temperature": """On the support, eq. (3.18) with the scores $z=s/\\tau$ reads $p_j^{\\alpha-1}=(\\alpha-1)z_j-\\lambda(\\alpha)$.

**(a)** Differentiating $p_j^{\\alpha-1}=e^{(\\alpha-1)\\log p_j}$ in $\\alpha$,
$p_j^{\\alpha-1}\\log p_j+(\\alpha-1)p_j^{\\alpha-2}\\dot p_j=z_j-\\dot\\lambda$. Multiplying by $w_j=p_j^{2-\\alpha}$
(so that $w_jp_j^{\\alpha-1}=p_j$), $(\\alpha-1)\\dot p_j=w_j(z_j-\\dot\\lambda)-p_j\\log p_j$. Off the support
$p_j=0$ for all nearby $\\alpha$, so $\\dot p_j=0$ (set $w_j=0$ and $p_j\\log p_j=0$ there). Since
$\\sum_j\\dot p_j=0$, $\\dot\\lambda=\\bar z_w+H(p)/W$ with $W=\\sum_jw_j$, $\\bar z_w=\\sum_jw_jz_j/W$ and
$H(p)=-\\sum_jp_j\\log p_j$. Hence

$$
\\frac{dp_j}{d\\alpha}=\\frac1{\\alpha-1}\\Big(w_j\\,(z_j-\\bar z_w)-p_j\\log p_j-\\frac{w_j}{W}\\,H(p)\\Big),
\\qquad w_j=p_j^{2-\\alpha}\\mathbb 1[p_j>0].
$$

**(b)** Since $\\sum_j\\dot p_j=0$, $\\bar z_w$ may be subtracted from $z_j$:
$\\frac{d}{d\\alpha}\\langle s,p\\rangle=\\tau\\sum_j(z_j-\\bar z_w)\\dot p_j
=\\frac{\\tau}{\\alpha-1}\\Big(\\sum_jw_j(z_j-\\bar z_w)^2-\\sum_jp_j\\log p_j\\,(z_j-\\bar z_w)\\Big)$.
With $q_j=p_j^{\\alpha-1}\\in(0,1]$ on $S$: $z_j=(q_j+\\lambda)/(\\alpha-1)$, the $w$-mean of $q$ is
$\\bar q=\\sum_jw_jq_j/W=1/W$, $z_j-\\bar z_w=(q_j-\\bar q)/(\\alpha-1)$, $p_j=w_jq_j$ and
$\\log p_j=\\log q_j/(\\alpha-1)$, so with $\\varphi(q)=q(1-\\log q)$ (subtracting the constant $\\varphi(\\bar q)-\\bar q$,
which $\\sum_jw_j(q_j-\\bar q)=0$ allows)

$$
\\frac{d}{d\\alpha}\\langle s,p\\rangle=\\frac{\\tau}{(\\alpha-1)^3}\\sum_jw_j\\,(q_j-\\bar q)\\big(\\varphi(q_j)-\\varphi(\\bar q)\\big)\\ge0,
$$

because $\\varphi'(q)=-\\log q\\ge0$ on $(0,1]$ and $\\bar q=1/W\\le1$ ($W=\\sum_jp_j^{2-\\alpha}\\ge\\sum_jp_j=1$).
It vanishes exactly when all $q_j$ are equal on $S$, that is, when the scores are equal on the support
(a single key in the support included): raising $\\alpha$ moves weight onto the high scores. For the
entropy, $\\partial H^{\\mathrm T}_\\alpha/\\partial p_j=\\frac{1-\\alpha p_j^{\\alpha-1}}{\\alpha(\\alpha-1)}$; with
$\\sum_j\\dot p_j=0$ and the optimality condition the weights contribute
$-\\frac1{\\alpha-1}\\sum_jp_j^{\\alpha-1}\\dot p_j=-\\sum_jz_j\\dot p_j=-\\frac1\\tau\\frac{d}{d\\alpha}\\langle s,p\\rangle\\le0$,
and the formula contributes
$\\partial_\\alpha H^{\\mathrm T}_\\alpha(p)=-\\frac{\\sum_jp_j^\\alpha\\log p_j+(2\\alpha-1)H^{\\mathrm T}_\\alpha(p)}{\\alpha(\\alpha-1)}$, so

$$
\\frac{d}{d\\alpha}H^{\\mathrm T}_\\alpha(p(\\alpha))=-\\frac1\\tau\\frac{d}{d\\alpha}\\langle s,p\\rangle
-\\frac{\\sum_jp_j^\\alpha\\log p_j+(2\\alpha-1)H^{\\mathrm T}_\\alpha(p)}{\\alpha(\\alpha-1)}\\le0 .
$$

The second term is $\\le0$ too: $H^{\\mathrm T}_\\alpha(p)=\\sum_jp_j\\,\\frac1\\alpha\\,\\frac{1-e^{-(\\alpha-1)x_j}}{\\alpha-1}$ with
$x_j=-\\log p_j\\ge0$, and both $\\frac1\\alpha$ and $\\frac{1-e^{-ux}}{u}$ (the slope of a chord of the concave
$1-e^{-y}$ from $0$) are positive and decreasing in $\\alpha$.

**(c)** At $\\alpha=2$, $w=\\mathbb 1_S$ and $W=|S|$: a key in the support moves at
$(z_j-\\bar z_S)-p_j\\log p_j-H(p)/|S|$, with $\\bar z_S$ the plain mean over the support; a key outside it
does not move until the threshold reaches it (then the support changes and the formula with it).""",
        "task:7": """## Task 7 · The derivatives in $\\alpha$ in code (3 points)

Implement `entmax_alpha_derivatives(p, scores, tau, alpha)` from your Task 6: given the weights
`p = entmax_alpha(scores / tau)` (shape `(..., m)`, zeros allowed), the scores of the same shape (a
masked key has the score `-inf` and weight 0), a fixed temperature `tau > 0` and `1 < alpha <= 2`,
return `(dp, d_mean, d_entropy)`: $dp/d\\alpha$ of shape `(..., m)`, and
$\\frac{d}{d\\alpha}\\langle s,p\\rangle$ and the total derivative $\\frac{d}{d\\alpha}H^{\\mathrm T}_\\alpha(p)$ of shape
`(...)`, in closed form (no finite differences, no autograd), along the last dimension without a
Python loop over rows. Keys of weight zero, masked or not, must get a derivative of exactly zero,
and nothing may come out `nan`. The test compares your functions with central finite differences in
$\\alpha$ of `attnopt`'s `entmax`.""",
        "entmax_temperature_derivatives": '''def entmax_alpha_derivatives(p, scores, tau, alpha):
    """d p / d alpha, d <s, p> / d alpha and d H_alpha(p) / d alpha for p = entmax_alpha(scores / tau), tau fixed."""
    ### BEGIN SOLUTION
    support = p > 0
    # on the support p_j^(alpha - 1) = (alpha - 1) z_j - threshold; off it nothing moves. The masks keep
    # 0 * log 0, 0 * inf and 0 ** 0 (which torch makes nan, nan and 1) out of the sums
    w = torch.where(support, p ** (2 - alpha), 0.0)
    z = torch.where(support, scores / tau, 0.0)
    p_log_p = torch.where(support, p * torch.log(torch.where(support, p, 1.0)), 0.0)
    total = w.sum(-1, keepdim=True)
    centred = torch.where(support, z - (w * z).sum(-1, keepdim=True) / total, 0.0)
    shannon = -p_log_p.sum(-1, keepdim=True)
    dp = (w * centred - p_log_p - w / total * shannon) / (alpha - 1)
    d_mean = tau * (centred * dp).sum(-1)
    tsallis = (p - p**alpha).sum(-1) / (alpha * (alpha - 1))
    p_alpha_log_p = (torch.where(support, p ** (alpha - 1), 0.0) * p_log_p).sum(-1)
    # through the weights (the optimality condition turns it into the mean's rate), and through the formula
    d_entropy = -d_mean / tau - (p_alpha_log_p + (2 * alpha - 1) * tsallis) / (alpha * (alpha - 1))
    return dp, d_mean, d_entropy
    ### END SOLUTION''',
        "test_entmax_temperature": '''# Task 7: against central differences of entmax in alpha (tau fixed), for alpha = 1.5 and alpha = 2
# (sparsemax), with a masked key.
from attnopt.transforms import entmax
from coursework import check, check_close, check_shape, own

f = own(entmax_alpha_derivatives, globals())
g = torch.Generator().manual_seed(6)
s = 2 * torch.randn(4, 9, generator=g)
s[1, 3] = -float("inf")  # a masked key
tau, step = 0.8, 1e-6
tsallis = lambda p, alpha: (p - p**alpha).sum(-1) / (alpha * (alpha - 1))
for alpha in (1.5, 2.0):
    p = entmax(s / tau, alpha)
    up, down = entmax(s / tau, alpha + step), entmax(s / tau, alpha - step)
    finite_scores = torch.where(p > 0, s, 0.0)
    dp, d_mean, d_entropy = f(p, s, tau, alpha)
    check_shape(dp, (4, 9), f"dp/dalpha for alpha = {alpha}")
    check_shape(d_mean, (4,), f"d<s, p>/dalpha for alpha = {alpha}")
    check_shape(d_entropy, (4,), f"dH/dalpha for alpha = {alpha}")
    check(bool(torch.all(dp[p == 0] == 0)), f"dp/dalpha at the keys of weight 0 (one of them masked), alpha = {alpha}",
          "exactly 0", dp[p == 0], hint="a key outside the support keeps weight 0 while the support does not change;"
          " in torch 0 * log 0 and 0 * inf are nan and 0 ** 0 is 1: keep the keys of weight 0 out with a mask")
    check(bool(torch.isfinite(d_mean).all() and torch.isfinite(d_entropy).all()), f"d<s, p>/dalpha and dH/dalpha, alpha = {alpha}",
          "finite numbers", (d_mean, d_entropy), hint="a masked key has the score -inf: keep it out of every sum")
    check_close(dp.sum(-1), torch.zeros(4), f"the row sums of dp/dalpha, alpha = {alpha}", atol=1e-12,
                hint="the weights sum to one for every alpha, so their derivatives sum to zero: this fixes how the threshold moves")
    check_close(dp, (up - down) / (2 * step), f"dp/dalpha for alpha = {alpha}, against central differences", atol=1e-7,
                hint="differentiate the optimality condition (3.18) on the support in alpha: the exponent alpha - 1"
                " moves too, and so does the threshold")
    check_close(d_mean, ((up - down) * finite_scores).sum(-1) / (2 * step),
                f"d<s, p>/dalpha for alpha = {alpha}, against central differences", atol=1e-7)
    through_weights = (tsallis(up, alpha) - tsallis(down, alpha)) / (2 * step)
    check_close(d_entropy, (tsallis(up, alpha + step) - tsallis(down, alpha - step)) / (2 * step),
                f"dH/dalpha for alpha = {alpha}, against central differences", atol=1e-7,
                hint="yours is the rate through the weights only: the formula of the Tsallis entropy depends on alpha too"
                if torch.allclose(d_entropy, through_weights, atol=1e-7) else
                "use the optimality condition to write p_j^(alpha - 1) on the support through the scores")
    check(bool(torch.all(d_mean >= -1e-12) and torch.all(d_entropy <= 1e-12)), f"the signs for alpha = {alpha}",
          "d<s, p>/dalpha >= 0 >= dH/dalpha", (d_mean.min(), d_entropy.max()))
''' + HIDDEN.format(task="entmax_temperature_derivatives"),
    },
}

THRESHOLD_OUTPUT_DERIVATIVES = {
    "about": "how the threshold of alpha-entmax and the attention output sum_j p_j v_j move with the temperature",
    "params": {"function": "entmax_threshold_output_derivatives"},
    "cells": {
        "intro": [_row("| 6 | a derivation: how $\\alpha$-entmax moves with the temperature |",
                       "| 6 | a derivation: how the threshold and the output of $\\alpha$-entmax move with the temperature |"),
                  _row("| 7 | the temperature derivatives of Task 6 in code |",
                       "| 7 | the derivatives of the threshold and the output of Task 6 in code |")],
        "task:6": """## Task 6 · The threshold and the output as the temperature moves: a derivation (2 points, graded by hand)

Proposition 3.4 follows softmax's weights as the temperature rises. An attention layer hands on not
its weights but the output $o=\\sum_jp_jv_j$, with values $v_j\\in\\mathbb R^d$, and $\\alpha$-entmax finds
its weights through a threshold. Let $p(\\tau)=\\operatorname{entmax}_\\alpha(s/\\tau)$, $1<\\alpha\\le2$, for
finite scores $s$, so that by eq. (3.18)
$p_j=\\big[(\\alpha-1)s_j/\\tau-\\lambda(\\tau)\\big]_+^{1/(\\alpha-1)}$ with the threshold $\\lambda(\\tau)$ of the
scores $s/\\tau$; assume that the support $S=\\{j:p_j>0\\}$ does not change near $\\tau$.

* **(a)** Derive $d\\lambda/d\\tau$ in terms of $p$, $s$, $\\tau$ and $\\alpha$ only (no threshold left in
  the answer). How does it change when one constant $c$ is added to every score, and why?
* **(b)** Derive $do/d\\tau$ and write it as a weighted covariance of the scores and the values.
  Show that adding one vector to every value changes nothing, and that $d=1$, $v_j=s_j$ gives a rate
  that is never positive.
* **(c)** Show that $\\alpha\\to1$ gives $do/d\\tau=-\\operatorname{Cov}_p(s,v)/\\tau^2$, the softmax rate (compare the
  proof of Proposition 3.4), and check (a) at $\\alpha=2$ against the sparsemax threshold of
  eq. (3.17), differentiated directly.

*Where to start:* differentiate the optimality condition of eq. (3.18) on the support, not a
formula for $p$; the weights summing to one for every $\\tau$ fixes how the threshold moves.
Write your derivation in the cell below (Markdown and LaTeX); Task 7 turns it into code.""",
        "written_entmax_temperature": """On the support, eq. (3.18) with scores $s/\\tau$ reads $p_j^{\\alpha-1}=(\\alpha-1)s_j/\\tau-\\lambda(\\tau)$.

**(a)** Differentiating in $\\tau$, $(\\alpha-1)p_j^{\\alpha-2}\\,\\dot p_j=-(\\alpha-1)s_j/\\tau^2-\\dot\\lambda$, so with
$w_j=p_j^{2-\\alpha}$ on $S$, $\\dot p_j=-w_j\\big(s_j/\\tau^2+\\dot\\lambda/(\\alpha-1)\\big)$. Off the support
$p_j=0$ for all nearby $\\tau$, so $\\dot p_j=0$ (set $w_j=0$ there). Since $\\sum_j\\dot p_j=0$,

$$
\\frac{d\\lambda}{d\\tau}=-\\frac{\\alpha-1}{\\tau^2}\\,\\bar s_w,\\qquad \\bar s_w=\\frac{\\sum_jw_js_j}{\\sum_jw_j},\\quad
w_j=p_j^{2-\\alpha}\\mathbb 1[p_j>0],
$$

and $\\dot p_j=-w_j(s_j-\\bar s_w)/\\tau^2$. Adding $c$ to every score leaves the weights unchanged and adds
$(\\alpha-1)c/\\tau$ to the threshold, which absorbs the shift; its rate gains $-(\\alpha-1)c/\\tau^2$, as
$\\bar s_w$ gains $c$.

**(b)** With $W=\\sum_jw_j$, $\\tilde w=w/W$ and $\\bar v_w=\\sum_j\\tilde w_jv_j$,

$$
\\frac{do}{d\\tau}=\\sum_j\\dot p_jv_j=-\\frac1{\\tau^2}\\sum_jw_j(s_j-\\bar s_w)\\,v_j
=-\\frac{W}{\\tau^2}\\sum_j\\tilde w_j(s_j-\\bar s_w)(v_j-\\bar v_w)=-\\frac{W}{\\tau^2}\\operatorname{Cov}_{\\tilde w}(s,v),
$$

since $\\sum_jw_j(s_j-\\bar s_w)=0$; the same identity removes any vector added to every value. For $d=1$,
$v_j=s_j$ the output is $\\langle s,p\\rangle$ and its rate is $-\\frac{W}{\\tau^2}\\operatorname{Var}_{\\tilde w}(s)\\le0$.

**(c)** As $\\alpha\\to1$, $w_j=p_j^{2-\\alpha}\\to p_j$, $W\\to1$, $\\tilde w=p$: $do/d\\tau\\to-\\operatorname{Cov}_p(s,v)/\\tau^2$,
which is what $\\partial p_j/\\partial\\beta=p_j(s_j-\\mathbb E_p[s])$ with $d\\beta/d\\tau=-1/\\tau^2$ gives for softmax. At
$\\alpha=2$, eq. (3.17) for the scores $s/\\tau$ gives $\\lambda=\\big(\\sum_{j\\in S}s_j/\\tau-1\\big)/|S|$, so
$d\\lambda/d\\tau=-\\bar s_S/\\tau^2$ with the plain mean $\\bar s_S$ over the support: (a) with $w=\\mathbb 1_S$ and
$\\alpha-1=1$.""",
        "task:7": """## Task 7 · The derivatives of the threshold and the output in code (3 points)

Implement `entmax_threshold_output_derivatives(p, scores, values, tau, alpha)` from your Task 6: given
the weights `p = entmax_alpha(scores / tau)` (shape `(..., m)`, zeros allowed), the scores of the same
shape (a masked key has the score `-inf` and weight 0), the values of shape `(..., m, d)`, a
temperature `tau > 0` and `1 < alpha <= 2`, return `(d_threshold, d_output)`: $d\\lambda/d\\tau$ of shape
`(...)` and $do/d\\tau$ of shape `(..., d)`, in closed form (no finite differences, no autograd), without
a Python loop over rows or keys. Keys of weight zero, masked or not, must contribute nothing, and
nothing may come out `nan`. The test compares your functions with central finite differences of
`attnopt`'s `entmax`, the threshold read off the weights at the key of largest weight.""",
        "entmax_temperature_derivatives": '''def entmax_threshold_output_derivatives(p, scores, values, tau, alpha):
    """d threshold / d tau and d output / d tau for p = entmax_alpha(scores / tau), output = sum_j p_j v_j."""
    ### BEGIN SOLUTION
    support = p > 0
    # p_j^(alpha - 1) = (alpha - 1) s_j / tau - threshold on the support: dp_j = -w_j (s_j - mean_w s) dtau / tau^2,
    # and the weights summing to one make the threshold follow the w-mean of the scores
    w = torch.where(support, p ** (2 - alpha), 0.0)
    finite = torch.where(support, scores, 0.0)  # a masked key's -inf times its zero weight would be nan
    mean = (w * finite).sum(-1, keepdim=True) / w.sum(-1, keepdim=True)
    d_threshold = -(alpha - 1) * mean.squeeze(-1) / tau**2
    dp = -w * torch.where(support, finite - mean, 0.0) / tau**2
    return d_threshold, (dp.unsqueeze(-1) * values).sum(-2)
    ### END SOLUTION''',
        "test_entmax_temperature": '''# Task 7: against central differences of entmax in tau, for alpha = 1.5 and alpha = 2 (sparsemax), with a
# masked key; the threshold is read off the weights at the key of largest weight, eq. (3.18).
from attnopt.transforms import entmax
from coursework import check, check_close, check_shape, own

f = own(entmax_threshold_output_derivatives, globals())
g = torch.Generator().manual_seed(6)
s = 2 * torch.randn(4, 9, generator=g)
s[1, 3] = -float("inf")  # a masked key
values = torch.randn(4, 9, 3, generator=g)
tau, step = 0.8, 1e-6
top = s.argmax(-1, keepdim=True)
for alpha in (1.5, 2.0):
    p = entmax(s / tau, alpha)
    threshold = lambda t: ((alpha - 1) * s.gather(-1, top) / t - entmax(s / t, alpha).gather(-1, top) ** (alpha - 1)).squeeze(-1)
    output = lambda t: (entmax(s / t, alpha).unsqueeze(-1) * values).sum(-2)
    d_threshold, d_output = f(p, s, values, tau, alpha)
    check_shape(d_threshold, (4,), f"d threshold/dtau for alpha = {alpha}")
    check_shape(d_output, (4, 3), f"d output/dtau for alpha = {alpha}")
    check(bool(torch.isfinite(d_threshold).all() and torch.isfinite(d_output).all()), f"the derivatives, alpha = {alpha}",
          "finite numbers", (d_threshold, d_output), hint="a masked key has the score -inf: keep it out of every sum")
    expected = (threshold(tau + step) - threshold(tau - step)) / (2 * step)
    check_close(d_threshold, expected, f"d threshold/dtau for alpha = {alpha}, against central differences", atol=1e-7,
                hint="the threshold of eq. (3.18) is measured in units of p^(alpha - 1): check the factor alpha - 1"
                if torch.allclose(d_threshold * (alpha - 1), expected, atol=1e-7) and alpha != 2 else
                "yours is minus the rate: at a higher temperature the scores s / tau shrink, and the threshold follows them"
                if torch.allclose(d_threshold, -expected, atol=1e-7) else
                "differentiate the optimality condition (3.18) on the support, and only there (in torch 0 ** 0 is 1: keep"
                " the keys of weight 0 out with a mask); the weights sum to one for every tau")
    check_close(d_output, (output(tau + step) - output(tau - step)) / (2 * step),
                f"d output/dtau for alpha = {alpha}, against central differences", atol=1e-7,
                hint="first dp/dtau on the support, where the threshold moves with tau too; the output then follows by linearity")
    shift = torch.randn(4, 1, 3, generator=g)
    check_close(f(p, s, values + shift, tau, alpha)[1], d_output, f"d output/dtau with every value shifted by one vector, alpha = {alpha}",
                atol=1e-12, hint="the rate of the output must not change when every value moves by one vector, Task 6 (b)")
''' + HIDDEN.format(task="entmax_temperature_derivatives"),
    },
}


VARIANTS = {
    "sparsemax_backward": [_entmax_backward(1.5, "1.5", "2 - 1.5", "1.5"), _entmax_backward(4 / 3, "4/3", "2 - 4 / 3", "4 / 3")],
    "softmax_backward": [LOG_SOFTMAX_BACKWARD, OUTPUT_BACKWARD],
    "lse_hessian": [VALUE_HESSIAN, SPARSEMAX_HESSIAN],
    "eot_value": [PRIOR_VALUE, SPARSE_VALUE],
    "written_exact_zeros": [PRIOR_ZEROS, TSALLIS_ZEROS],
    "entmax_temperature_derivatives": [ALPHA_DERIVATIVES, THRESHOLD_OUTPUT_DERIVATIVES],
}
