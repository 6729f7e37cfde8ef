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
            "yours is the backward pass of sparsemax (alpha = 2): for alpha < 2 the keys of the support do not"
            " count equally, neither in the gradient nor in the baseline" if torch.allclose(found, sparsemax_form, atol=1e-12) else
            "yours is minus autograd's: raising s_j raises p_j on the support" if torch.allclose(found, -expected, atol=1e-12)
            else "differentiate p_j^(alpha - 1) on the support, eq. (3.18); the baseline is a weighted mean of u over the support")
# a shift of the upstream signal does not change the gradient, as for softmax
check_close(f(p, u + 5.0, tau), found, "the gradient for u + 5")
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
            "yours is the backward pass of softmax, eq. (3.28): here the loss sees log p, whose derivative in p_j"
            " is 1/p_j" if torch.allclose(ours, advantage, atol=1e-12) else
            "yours is minus autograd's" if torch.allclose(ours, -autograd, atol=1e-12) else
            "differentiate log p_k = s_k / tau - log sum_j exp(s_j / tau) in s_j")
# adding one constant to every score changes no log-probability
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
            "yours is minus autograd's: a key whose value points along dL/do gains weight when its score rises"
            if torch.allclose(ours, -autograd, atol=1e-12) else
            "first find d o / d p_j, then use the advantage form of Theorem 3.6 with that reward")
# one vector added to every value moves o by that vector whatever p is: no gradient reaches the scores
shift = torch.randn(5, 1, 3, generator=g)
check_close(f(p, values + shift, grad_output, tau), ours, "the gradient with every value shifted by one vector", atol=1e-13)
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
            hint="yours is minus autograd's: the value is a minimum of functions linear in C, so it is concave"
            if torch.allclose(H, -H_autograd, atol=1e-12) else
            "check the factor 1/eps" if torch.allclose(H, eps * H_autograd, atol=1e-12) else
            "the gradient of the value is the plan softmax(-C / eps); differentiate it once more")
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
# also with a forbidden key (cost +inf, or prior weight 0).
from coursework import check, check_close, check_shape, own

f = own(eot_value_prior, globals())
g = torch.Generator().manual_seed(4)
eps = 0.8
C = torch.randn(5, generator=g)
prior = torch.rand(5, generator=g) + 0.1
prior = prior / prior.sum()
p_star = prior * torch.exp(-C / eps)
p_star = p_star / p_star.sum()
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
    plan = weights * torch.exp(-(cost - cost[torch.isfinite(cost)].min()) / eps)
    check_close(grad, plan / plan.sum(), f"the gradient with a forbidden key ({what})", atol=1e-14)
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
    "about": "for which alpha the Tsallis regularizer gives exact zeros, through omega'(0)",
    "params": {},
    "cells": {
        "task:5": """## Task 5 · Exact zeros across the entmax family (2 points, graded by hand)

Using the optimality (KKT) conditions of $\\min_{p\\in\\Delta}\\langle C,p\\rangle+\\varepsilon\\Omega(p)$ with
the Tsallis regularizer $\\Omega(p)=\\sum_j\\frac{p_j^\\alpha-p_j}{\\alpha(\\alpha-1)}$ of $\\alpha$-entmax, explain in
a few sentences for which $\\alpha\\ge1$ a key can get exactly zero weight (softmax is the limit
$\\alpha\\to1$), and give the cost above which a key gets weight zero in terms of the multiplier of
$\\sum_jp_j=1$. Then say what this means for the backward pass at a key of weight zero.""",
        "written_exact_zeros": """With a multiplier $\\lambda$ for $\\sum_jp_j=1$ and $\\mu_j\\ge0$ for $p_j\\ge0$, stationarity reads
$C_j+\\varepsilon\\,\\omega'(p_j)=\\lambda+\\mu_j$ with $\\mu_jp_j=0$, where
$\\omega'(p)=\\frac{\\alpha p^{\\alpha-1}-1}{\\alpha(\\alpha-1)}$. For $\\alpha>1$, $\\omega'$ is increasing and finite
at $0$, $\\omega'(0)=-\\frac1{\\alpha(\\alpha-1)}$, so $p_j=0$ is optimal exactly when
$C_j-\\frac{\\varepsilon}{\\alpha(\\alpha-1)}\\ge\\lambda$, i.e. for every key whose cost is at least
$\\lambda+\\frac{\\varepsilon}{\\alpha(\\alpha-1)}$: every $\\alpha>1$ can give exact zeros. As $\\alpha\\to1$ the
threshold $\\frac{\\varepsilon}{\\alpha(\\alpha-1)}\\to\\infty$ and $\\omega'(p)\\to1+\\log p$, which tends to $-\\infty$
at $0$: softmax never gives a zero. A key of weight zero gets zero gradient: the Jacobian of entmax
carries the factor $p_j^{2-\\alpha}$, which is $0$ off the support, so the model receives no signal to
raise that key until its score crosses the threshold.""",
    },
}


VARIANTS = {
    "sparsemax_backward": [_entmax_backward(1.5, "1.5", "2 - 1.5", "1.5"), _entmax_backward(4 / 3, "4/3", "2 - 4 / 3", "4 / 3")],
    "softmax_backward": [LOG_SOFTMAX_BACKWARD, OUTPUT_BACKWARD],
    "lse_hessian": [VALUE_HESSIAN, SPARSEMAX_HESSIAN],
    "eot_value": [PRIOR_VALUE, SPARSE_VALUE],
    "written_exact_zeros": [PRIOR_ZEROS, TSALLIS_ZEROS],
}
