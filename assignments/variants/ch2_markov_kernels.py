"""The variants of Assignment 2 (attention as a Markov kernel), drawn from the course secret.

Variant 0 of every task is the one in ``source/ch2_markov_kernels/ch2_markov_kernels.ipynb``: the
public one, whose solution anyone can read in this repository. A course never draws it
(``tools/assignments.py``): each task below lists the variants a course draws from, and each changes
what must be derived (another quantity of the same reweighting, another potential, another form of
the distance, another constraint), not only a number, so that a copy of the public solution fails its
checks. ``params`` reach the hidden checks (``h.params``); ``cells`` say how the variant's notebook
differs from variant 0's: a grade id (or ``task:N`` for the text of Task N, ``intro`` for the
table) maps to the cell's new text, or to ``(old, new)`` replacements that must each match once.
Equations are cited by the numbers they carry in the built book: (2.4) and (2.5) the Boltzmann–Gibbs
transformation, (2.7) a row of the softmatch kernel, (2.17) the relative entropy, (2.18) the
maximum-entropy problem, (2.20) the Gibbs variational principle, (2.23) and (2.24) the primal and
dual forms of W1, (2.36) the Gaussian potential.
"""

from __future__ import annotations

HIDDEN = "# hidden checks: other inputs, drawn from the course key, when the notebook is graded\n" \
         "from coursework import hidden_checks\n\nhidden_checks(\"{task}\", globals())"


def _row(old: str, new: str) -> tuple[str, str]:
    """A row of the intro's table: ``| N | what you write |`` changes, the points stay."""
    return old, new


ROW_1 = "| 1 | the Boltzmann–Gibbs reweighting, in log space |"
ROW_2 = "| 2 | the attention kernel: a row-stochastic matrix; SDPA as a special case |"
ROW_3 = "| 3 | the Wasserstein distance $W_1$ between two measures on the line |"


# ------------------------------------------------------------------ Task 1: another quantity of the reweighting


INFORMATION_GAIN = {
    "about": "the relative entropy KL(Psi_G(nu) || nu) = E_p[log G] - log nu(G) of the reweighting, instead of its masses",
    "params": {"function": "gibbs_information_gain"},
    "cells": {
        "intro": [_row(ROW_1, "| 1 | the information gained by a Boltzmann–Gibbs reweighting, in log space |")],
        "task:1": """## Task 1 · The information gained by a reweighting (3 points)

The Boltzmann–Gibbs transformation (2.4) keeps the atoms of $\\nu=\\sum_jw_j\\delta_{k_j}$ and moves its
mass; the relative entropy (2.17) measures how far. Let $p$ be the masses of $\\Psi_G(\\nu)$, eq. (2.5).
Derive $\\operatorname{KL}(\\Psi_G(\\nu)\\,\\Vert\\,\\nu)$ in terms of $p$, $\\log G$ and the normalizing
constant $\\nu(G)=\\sum_jw_jG_j$ only (no ratio $p_j/w_j$ left), and read your formula off the Gibbs
variational principle (Proposition 2.3): which measure attains the maximum in (2.20), and what is
left of the maximum once the expected log-potential is taken away? Say why the result is unchanged
when a constant is added to $\\log G$.

Implement `gibbs_information_gain(weights, log_potential)`: the masses $w$ of a discrete measure
(shape `(..., N)`, non-negative, summing to one) and $\\log G$ at its atoms (same shape; `-inf` means
$G=0$); return $\\operatorname{KL}(\\Psi_G(\\nu)\\Vert\\nu)$ along the last dimension, shape `(...)`. Work
in log space: a log-potential of 1000 must not overflow, and an atom that $\\Psi_G(\\nu)$ gives mass
$0$ (because $w_j=0$ or $G_j=0$) must contribute exactly nothing.""",
        "boltzmann_gibbs_weights": '''def gibbs_information_gain(weights, log_potential):
    """KL(Psi_G(nu) || nu) for nu = sum_j w_j delta_j, computed in log space along the last dimension."""
    ### BEGIN SOLUTION
    logits = torch.log(weights) + log_potential
    log_normalizer = torch.logsumexp(logits, dim=-1, keepdim=True)  # log nu(G)
    p = torch.exp(logits - log_normalizer)
    # on the support of p, log(p_j / w_j) = log G_j - log nu(G); off it p_j = 0 and 0 log 0 = 0
    log_ratio = torch.where(p > 0, log_potential - log_normalizer, 0.0)
    return (p * log_ratio).sum(-1)
    ### END SOLUTION''',
        "test_boltzmann_gibbs_weights": '''# Task 1: a worked example, no overflow, atoms of mass 0, and SciPy's relative entropy.
from coursework import check, check_close, check_shape, own

f = own(gibbs_information_gain, globals())
w = torch.tensor([0.5, 0.25, 0.25])
found = f(w, torch.log(torch.tensor([1.0, 1.0, 4.0])))
check_shape(found, (), "the information gain for 3 atoms")
p = torch.tensor([2.0, 1.0, 4.0]) / 7
reverse = (w * torch.log(w / p)).sum()
check_close(found, (p * torch.log(p / w)).sum(), "w = (1/2, 1/4, 1/4), G = (1, 1, 4), so p = (2, 1, 4) / 7", atol=1e-15,
            hint="yours is KL(nu || Psi_G(nu)), the divergence the other way round" if abs(found - reverse) < 1e-12 else
            "the relative entropy (2.17) of p against w: write the ratio p_j / w_j on the support of p through"
            " eq. (2.5)")
huge = f(torch.tensor([0.5, 0.5]), torch.tensor([1000.0, 1001.0]))
p_huge = torch.tensor([1.0, math.e]) / (1 + math.e)
check_close(huge, (p_huge * torch.log(2 * p_huge)).sum(), "log G = (1000, 1001) (no overflow)", atol=1e-12,
            hint="work in log space: the normalizing constant nu(G) overflows, its logarithm does not")
zero = f(torch.tensor([0.0, 0.5, 0.5]), torch.tensor([5.0, 0.0, float("-inf")]))
check_close(zero, torch.tensor(math.log(2)), "w = (0, 1/2, 1/2), log G = (5, 0, -inf): all the mass on the second atom",
            atol=1e-15, hint="0 log 0 = 0: an atom of mass 0 under Psi_G(nu) contributes nothing, even where log w_j"
            " or log G_j is -inf")

# against scipy.stats.entropy on a batch, and unchanged by a constant added to log G
g = torch.Generator().manual_seed(1)
w = torch.rand(4, 6, generator=g) + 0.05
w = w / w.sum(-1, keepdim=True)
log_g = 2 * torch.randn(4, 6, generator=g)
p = w * torch.exp(log_g)
p = p / p.sum(-1, keepdim=True)
found = f(w, log_g)
check_shape(found, (4,), "the information gain for a (4, 6) batch")
check_close(found, torch.tensor(scipy.stats.entropy(p.numpy(), w.numpy(), axis=-1)),
            "KL(Psi_G(nu) || nu) against scipy.stats.entropy, a (4, 6) batch", atol=1e-13)
check_close(f(w, log_g + 3.0), found, "the information gain for log G + 3 (a constant added to the log-potential)",
            atol=1e-13)
''' + HIDDEN.format(task="boltzmann_gibbs_weights"),
    },
}

GAUSSIAN_POSTERIOR = {
    "about": "the posterior over keys after T Gaussian observations (Bayes' rule, T reweightings composed)",
    "params": {"function": "gaussian_posterior_weights"},
    "cells": {
        "intro": [_row(ROW_1, "| 1 | Bayes' rule as a Boltzmann–Gibbs reweighting, in log space |")],
        "task:1": """## Task 1 · Bayes' rule as a reweighting (3 points)

Remark 2.1 reads the Boltzmann–Gibbs transformation (2.4) as Bayes' rule. Let the prior over the keys
be $\\nu=\\sum_jw_j\\delta_{k_j}$ with $k_j\\in\\mathbb R^d$, and suppose that, given the key $k$, the
queries $q_1,\\dots,q_T$ are independent draws of $\\mathcal N(k,\\sigma^2I)$. Write the posterior over
the keys after all $T$ queries as a single reweighting $\\Psi_G(\\nu)$: derive its log-potential
$\\log G(k)$, using the composition rule $\\Psi_g\\circ\\Psi_h=\\Psi_{gh}$ (one reweighting per query)
and scale invariance to drop every term that does not depend on $k$. Show that the posterior depends
on the queries only through their number $T$ and their mean $\\bar q$; what does it tend to as
$T\\to\\infty$?

Implement `gaussian_posterior_weights(prior, keys, queries, sigma)`: the prior masses $w$ (shape
`(..., N)`, non-negative, summing to one), the keys `(..., N, d)`, the queries `(..., T, d)` and
$\\sigma>0$; return the posterior masses, shape `(..., N)`. Work in log space: queries far from every
key must not give $0/0$, and a key of prior mass $0$ must keep posterior mass exactly $0$.""",
        "boltzmann_gibbs_weights": '''def gaussian_posterior_weights(prior, keys, queries, sigma):
    """Posterior masses of the keys after the queries, each N(key, sigma^2 I) given the key."""
    ### BEGIN SOLUTION
    # each query reweights by exp(-|q_t - k|^2 / (2 sigma^2)); the potentials multiply, and
    # sum_t |q_t - k|^2 = T |k - q_mean|^2 + (terms without k, removed by the normalization)
    T = queries.shape[-2]
    mean = queries.mean(-2, keepdim=True)  # (..., 1, d)
    log_potential = -T * ((keys - mean) ** 2).sum(-1) / (2 * sigma**2)
    return torch.softmax(torch.log(prior) + log_potential, dim=-1)
    ### END SOLUTION''',
        "test_boltzmann_gibbs_weights": '''# Task 1: a worked example, Bayes' rule one query at a time with SciPy's densities, far queries, zeros.
from coursework import check, check_close, check_shape, own

f = own(gaussian_posterior_weights, globals())
keys = torch.tensor([[0.0], [2.0]])
half = torch.tensor([0.5, 0.5])
check_close(f(half, keys, torch.tensor([[1.0]]), 1.0), half, "one query halfway between two keys", atol=1e-15)
check_close(f(half, keys, torch.tensor([[2.0]]), 1.0), torch.tensor([math.exp(-2), 1.0]) / (1 + math.exp(-2)),
            "one query on the second key, sigma = 1", atol=1e-15,
            hint="the exponent of the Gaussian density is |q - k|^2 / (2 sigma^2)")

g = torch.Generator().manual_seed(1)
N, T, d, sigma = 6, 5, 2, 0.8
prior = torch.rand(N, generator=g) + 0.05
prior = prior / prior.sum()
keys = torch.randn(N, d, generator=g)
queries = keys[2] + sigma * torch.randn(T, d, generator=g)
posterior = prior.numpy().copy()
for q in queries.numpy():  # Bayes' rule once per query
    posterior = posterior * scipy.stats.multivariate_normal(mean=q, cov=sigma**2).pdf(keys.numpy())
    posterior = posterior / posterior.sum()
found = f(prior, keys, queries, sigma)
check_shape(found, (N,), "the posterior for 6 keys")
single = f(prior, keys, queries.mean(0, keepdim=True), sigma)  # yours for one query at the mean of the T queries
check_close(found, torch.tensor(posterior), f"the posterior after {T} queries against Bayes' rule one query at a time",
            atol=1e-13, hint="yours treats the mean of the queries as a single observation: each of the T queries"
            " reweights the keys, and the potentials multiply" if torch.allclose(found, single, atol=1e-12) else
            "the queries are independent given the key: the log-likelihoods add up")
centre = queries.mean(0)
other = centre + (queries - centre).flip(0).flip(-1)  # other T queries with the same mean
check_close(f(prior, keys, other, sigma), found, f"the posterior for other {T} queries with the same mean", atol=1e-13,
            hint="the posterior depends on the queries only through their number and their mean")
far = f(prior, keys, queries + 60.0, 0.3)
check(bool(torch.isfinite(far).all()) and abs(float(far.sum()) - 1) < 1e-12, "the posterior for queries far from"
      " every key (sigma = 0.3)", "finite masses summing to 1", far,
      hint="work in log space: each density underflows to 0 this far from the keys, their ratios do not")
masked = prior.clone()
masked[2] = 0.0
masked = masked / masked.sum()
check(bool(f(masked, keys, queries, sigma)[2] == 0), "the posterior of a key with prior mass 0", "exactly 0",
      f(masked, keys, queries, sigma)[2])
''' + HIDDEN.format(task="boltzmann_gibbs_weights"),
    },
}


# ------------------------------------------------------------------ Task 2: another kernel


GAUSSIAN_KERNEL = {
    "about": "the kernel of the Gaussian potential exp(-s |q - k|^2): dot-product scores 2s <q, k> with a key bias -s |k|^2",
    "params": {"function": "gaussian_kernel_matrix"},
    "cells": {
        "intro": [_row(ROW_2, "| 2 | the attention kernel of the Gaussian potential: a row-stochastic matrix |")],
        "task:2": """## Task 2 · The kernel of the Gaussian potential (3 points)

Replace the dot product by the Gaussian potential (2.36), with a scale $s>0$:
$G(q,k)=e^{-s\\lVert q-k\\rVert_2^2}$, the potential for which attention is Lipschitz on all of
$\\mathbb R^d$ (Theorem 2.3). Row $i$ of the softmatch kernel, eq. (2.7), with key measure
$\\nu=\\sum_jw_j\\delta_{k_j}$, is then $P_{ij}\\propto w_je^{-s\\lVert q_i-k_j\\rVert_2^2}$. Expand the
square and say which of its terms survive the normalization of a row: show that $P$ is dot-product
attention with the scale $2s$ and an additive bias that depends on the key alone, and give the bias.
When do the two kernels coincide (compare Remark 2.1)?

Implement `gaussian_kernel_matrix(queries, keys, key_weights=None, scale=1.0)`: queries of shape
`(..., M, d)`, keys `(..., N, d)`, key weights $w$ `(..., N)` (or `None` for uniform $1/N$) and
$s$ = `scale`; return the `(..., M, N)` matrix $P$. Queries far from every key (a norm of 100) must
not give a row $0/0$, and a key of weight $0$ must get exactly $0$.""",
        "attention_kernel_matrix": '''def gaussian_kernel_matrix(queries, keys, key_weights=None, scale=1.0):
    """Row-stochastic matrix P_ij proportional to w_j exp(-scale |q_i - k_j|^2)."""
    ### BEGIN SOLUTION
    # -s |q - k|^2 = 2s <q, k> - s |k|^2 - s |q|^2, and the last term is the same along a row
    scores = 2 * scale * queries @ keys.transpose(-1, -2) - scale * (keys * keys).sum(-1).unsqueeze(-2)
    if key_weights is not None:
        scores = scores + torch.log(key_weights).unsqueeze(-2)
    return torch.softmax(scores, dim=-1)
    ### END SOLUTION''',
        "test_attention_kernel_matrix": '''# Task 2: a Markov kernel, the Gaussian potential from its definition, dot-product scores plus a bias of the key
# alone, far queries.
from coursework import check, check_close, check_shape, own

f = own(gaussian_kernel_matrix, globals())
g = torch.Generator().manual_seed(2)
B, M, N, d = 3, 5, 8, 4
q, k = torch.randn(B, M, d, generator=g), torch.randn(B, N, d, generator=g)
P = f(q, k)
check_shape(P, (B, M, N), "P for queries (3, 5, 4) and keys (3, 8, 4)")
check(torch.all(P >= 0), "entries of P", ">= 0", P.min())
check_close(P.sum(-1), torch.ones(B, M), "row sums of P", atol=1e-14)
G = torch.exp(-((q.unsqueeze(-2) - k.unsqueeze(-3)) ** 2).sum(-1))
dot = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d), dim=-1)
no_bias = torch.softmax(2 * q @ k.transpose(-1, -2), dim=-1)
check_close(P, G / G.sum(-1, keepdim=True), "P against the Gaussian potential, s = 1", atol=1e-14,
            hint="yours is the dot-product kernel: the potential here is exp(-s |q - k|^2)"
            if torch.allclose(P, dot, atol=1e-12) else
            "yours drops a term of the expanded square that the normalization of a row does not remove"
            if torch.allclose(P, no_bias, atol=1e-12) else
            "expand |q - k|^2 into three terms, and check the factor of the cross term")
# key weights with a zero, scale 0.7: against the definition P_ij proportional to w_j exp(-s |q_i - k_j|^2), and
# scores 2s <q_i, k_j> plus a bias that depends on the key alone
w = torch.rand(B, N, generator=g)
w[:, 3] = 0.0
w = w / w.sum(-1, keepdim=True)
s = 0.7
P_w = f(q, k, w, scale=s)
check(torch.all(P_w[..., 3] == 0), "P for a key of weight 0", "exactly 0", P_w[..., 3].abs().max())
unnormalized = w.unsqueeze(-2) * torch.exp(-s * ((q.unsqueeze(-2) - k.unsqueeze(-3)) ** 2).sum(-1))
check_close(P_w, unnormalized / unnormalized.sum(-1, keepdim=True), "P with key weights, s = 0.7, against the"
            " Gaussian potential", atol=1e-14, hint="row i is proportional to w_j G(q_i, k_j), eq. (2.7): check where"
            " the scale s and the key weights enter")
kept = w[0] > 0
bias = torch.log(P_w[..., kept]) - 2 * s * q @ k[..., kept, :].transpose(-1, -2)  # (B, M, N - 1)
bias = bias - bias[..., :1]  # fixes the free constant of each row
check_close(bias, bias[..., :1, :].expand_as(bias), "log P_ij - 2s <q_i, k_j> for s = 0.7 (the same for every query"
            " i, up to a constant per row)", atol=1e-11,
            hint="what is left of the scores after 2s <q_i, k_j> may depend on the key, not on the query")
far = f(100 * q, k, w, scale=s)
check(bool(torch.isfinite(far).all()), "P for queries of norm about 100", "finite entries", far.abs().max(),
      hint="every potential underflows to 0 for such queries: normalize the scores of a row before exponentiating")
check_close(far.sum(-1), torch.ones(B, M), "row sums of P for queries of norm about 100", atol=1e-14)
log_potential = -s * ((100 * q.unsqueeze(-2) - k.unsqueeze(-3)) ** 2).sum(-1)
check_close(far, torch.softmax(torch.log(w).unsqueeze(-2) + log_potential, dim=-1), "P for queries of norm about 100"
            " against the Gaussian potential, normalized in log space", atol=1e-9)
''' + HIDDEN.format(task="attention_kernel_matrix"),
    },
}

CAUSAL_KERNEL = {
    "about": "the kernel of a causal mask, a relative-position bias and a temperature: three reweightings composed",
    "params": {"function": "causal_kernel_matrix"},
    "cells": {
        "intro": [_row(ROW_2, "| 2 | a kernel composed of three reweightings: mask, bias and temperature |")],
        "task:2": """## Task 2 · A kernel composed of three reweightings (3 points)

A causal mask, a relative-position bias and a temperature are each a Boltzmann–Gibbs transformation
of the key measure (Exercise 2.2). Take self-attention over $N$ tokens, with queries $q_i$ and keys
$k_j$, $i,j=1,\\dots,N$: query $i$ sees only the keys $j\\le i$, a bias $b_{ij}$ is added to its scores,
and the scores $\\langle q_i,k_j\\rangle$ (not the bias) are divided by a temperature $\\tau>0$. Write
row $i$ of the kernel as three reweightings of $m(K)$ applied in turn, by the indicator of
$\\{j\\le i\\}$, by $e^{b_{ij}}$ and by $G_i(k_j)^{1/\\tau}$ with $G_i(k)=e^{\\langle q_i,k\\rangle}$, and use
the composition rule of the Boltzmann–Gibbs transformation (2.4) to write it as one reweighting:
with which potential? Why does the order of the three steps not matter, and why is the mask not a
score of $-\\infty$ that a bias could compensate?

Implement `causal_kernel_matrix(queries, keys, bias, tau=1.0)`: queries and keys of shape
`(..., N, d)`, the bias of shape `(N, N)` (the same for every leading index) and $\\tau$; return the
`(..., N, N)` matrix $P$, row $i$ for query $i$. Entries above the diagonal must be exactly $0$, and a
bias of 1000 must not overflow.""",
        "attention_kernel_matrix": '''def causal_kernel_matrix(queries, keys, bias, tau=1.0):
    """Row-stochastic P_ij proportional to 1[j <= i] exp(b_ij) exp(<q_i, k_j> / tau)."""
    ### BEGIN SOLUTION
    # the potentials of the three reweightings multiply: 1[j <= i] e^(b_ij) e^(<q_i, k_j> / tau)
    n = queries.shape[-2]
    scores = queries @ keys.transpose(-1, -2) / tau + bias
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    return torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
    ### END SOLUTION''',
        "test_attention_kernel_matrix": '''# Task 2: a Markov kernel with exact zeros above the diagonal; against the three reweightings applied in turn.
from coursework import check, check_close, check_one_hot, check_shape, own

f = own(causal_kernel_matrix, globals())
g = torch.Generator().manual_seed(2)
B, N, d, tau = 3, 7, 4, 0.6
q, k = torch.randn(B, N, d, generator=g), torch.randn(B, N, d, generator=g)
bias = torch.randn(N, N, generator=g)
P = f(q, k, bias, tau)
check_shape(P, (B, N, N), "P for queries and keys (3, 7, 4)")
check(torch.all(P >= 0), "entries of P", ">= 0", P.min())
check_close(P.sum(-1), torch.ones(B, N), "row sums of P", atol=1e-14)
check(bool(torch.all(P.triu(1) == 0)), "P above the diagonal (a query never sees a later key)", "exactly 0",
      P.triu(1).abs().max(), hint="row i is query i: it sees the keys j <= i, the lower triangle")
check_one_hot(P[:, 0, 0], torch.ones(B), "the weight of the first query on the first key, the only one it sees")


def reweight(masses, potential):  # the Boltzmann-Gibbs transformation (2.4) of each row of masses
    tilted = masses * potential
    return tilted / tilted.sum(-1, keepdim=True)


def in_turn(bias_potential):  # row i: m(K) reweighted by the mask, then by the bias, then by G_i^(1/tau)
    masses = reweight(torch.full((B, N, N), 1.0 / N), torch.ones(N, N).tril())
    masses = reweight(masses, bias_potential)
    return reweight(masses, torch.exp(q @ k.transpose(-1, -2)) ** (1 / tau))


expected = in_turn(torch.exp(bias))
also_bias = in_turn(torch.exp(bias) ** (1 / tau))
check_close(P, expected, f"P against the mask, the bias and the temperature applied in turn, tau = {tau}", atol=1e-13,
            hint="the temperature divides the scores, not the bias" if torch.allclose(P, also_bias, atol=1e-12)
            else "compose the three reweightings of the task with the composition rule of the Boltzmann-Gibbs"
            " transformation (2.4): each of the three potentials must be there, the temperature on the scores alone")
big = bias.clone()
big[4, 1] = 1000.0
P_big = f(q, k, big, tau)
check(bool(torch.isfinite(P_big).all()), "P with a bias of 1000", "finite entries", P_big.abs().max(),
      hint="add the bias to the scores, in log space, before normalizing")
check_close(P_big[:, 4, 1], torch.ones(B), "the weight of query 5 on key 2 when its bias is 1000", atol=1e-14)
''' + HIDDEN.format(task="attention_kernel_matrix"),
    },
}


# ------------------------------------------------------------------ Task 3: another form of the distance


KANTOROVICH_POTENTIAL = {
    "about": "W1 on the line with an optimal 1-Lipschitz potential of the Kantorovich formula, its dual certificate",
    "params": {"function": "kantorovich_potential_1d"},
    "cells": {
        "intro": [_row(ROW_3, "| 3 | $W_1$ on the line and an optimal Kantorovich potential, its certificate |")],
        "task:3": """## Task 3 · An optimal potential for $W_1$ on the line (3 points)

For measures $\\mu=\\sum_ia_i\\delta_{x_i}$ and $\\nu=\\sum_jb_j\\delta_{y_j}$ on $\\mathbb R$,
$W_1(\\mu,\\nu)=\\int\\lvert F_\\mu(t)-F_\\nu(t)\\rvert\\,\\mathrm dt$, with $F$ the distribution functions, and by
the Kantorovich–Rubinstein formula (2.24) it is also a supremum over 1-Lipschitz functions. Find a
function that attains it. Integrate by parts to write $\\mu(f)-\\nu(f)$ for a Lipschitz $f$ as an
integral of $f'$ against $F_\\nu-F_\\mu$, deduce that $\\mu(f)-\\nu(f)\\le W_1(\\mu,\\nu)$ for every
1-Lipschitz $f$, and give an $f$, with slope $\\pm1$ between consecutive points of the merged
support, for which equality holds. Is it unique?

Implement `kantorovich_potential_1d(x, a, y, b)` for 1-D tensors (`x`, `a` of one length, `y`, `b` of
another; the points need not be sorted): return `(w1, f_x, f_y)`, the distance as a 0-d tensor and the
values of your optimal $f$ at the points `x` and at the points `y`, in their given order. The test
checks that $f$ is 1-Lipschitz on all these points and that $\\mu(f)-\\nu(f)=W_1(\\mu,\\nu)$.""",
        "wasserstein1_1d": '''def kantorovich_potential_1d(x, a, y, b):
    """W1 between sum_i a_i delta_{x_i} and sum_j b_j delta_{y_j}, and an optimal 1-Lipschitz f at x and y."""
    ### BEGIN SOLUTION
    points = torch.cat([x, y])
    order = torch.argsort(points)
    cdf_difference = torch.cumsum(torch.cat([a, -b])[order], dim=0)[:-1]  # F_mu - F_nu between the points
    gaps = torch.diff(points[order])
    # mu(f) - nu(f) = integral of f' (F_nu - F_mu): take f' = -sign(F_mu - F_nu), f = 0 at the leftmost point
    slopes = -torch.sign(cdf_difference)
    f_sorted = torch.cat([torch.zeros(1, dtype=points.dtype), torch.cumsum(slopes * gaps, dim=0)])
    f = torch.empty_like(f_sorted)
    f[order] = f_sorted
    return (cdf_difference.abs() * gaps).sum(), f[: len(x)], f[len(x):]
    ### END SOLUTION''',
        "test_wasserstein1_1d": '''# Task 3: Dirac masses, SciPy's wasserstein_distance, and the potential: 1-Lipschitz and attaining W1.
from coursework import check, check_close, check_shape, own

f = own(kantorovich_potential_1d, globals())
one = torch.ones(1)
w1, fx, fy = f(torch.tensor([0.3]), one, torch.tensor([-1.2]), one)
check_close(torch.as_tensor(w1).reshape(()), torch.tensor(1.5), "W1 between Diracs at 0.3 and -1.2", atol=1e-14)
check_close(fx - fy, torch.tensor([1.5]), "f(0.3) - f(-1.2) for the Diracs", atol=1e-14,
            hint="yours falls by 1.5 from -1.2 to 0.3: check the sign of the slope, and that each value of f is put"
            " back at its own point" if abs(float((fx - fy)[0]) + 1.5) < 1e-12 else "f must rise by 1.5 from -1.2 to 0.3")
g = torch.Generator().manual_seed(3)
x = torch.randn(7, generator=g)
a = torch.rand(7, generator=g)
a = a / a.sum()
y = 2 * torch.randn(11, generator=g) + 0.5
b = torch.rand(11, generator=g)
b = b / b.sum()
w1, fx, fy = f(x, a, y, b)
check_shape(fx, (7,), "f at the 7 points of mu")
check_shape(fy, (11,), "f at the 11 points of nu")
expected = torch.tensor(scipy.stats.wasserstein_distance(x.numpy(), y.numpy(), a.numpy(), b.numpy()))
check_close(torch.as_tensor(w1).reshape(()), expected, "W1 against scipy.stats.wasserstein_distance")
value = a @ fx - b @ fy
check_close(value, expected, "mu(f) - nu(f) for your potential (it must attain W1)", atol=1e-12,
            hint="yours gives minus W1: the slope of your f has the wrong sign on every interval"
            if abs(value + expected) < 1e-10 else "on some interval between consecutive points your slope has the"
            " wrong sign or is not +-1: integrate by parts, as the task says, and compare mu(f) - nu(f) with W1"
            " interval by interval")
points, values = torch.cat([x, y]), torch.cat([fx, fy])
excess = ((values[:, None] - values[None, :]).abs() - (points[:, None] - points[None, :]).abs()).max()
check(bool(excess <= 1e-12), "the largest |f(s) - f(t)| - |s - t| over all pairs of points", "<= 0", excess,
      hint="f must be 1-Lipschitz: build it on the sorted points, then put each value back at its own point")
''' + HIDDEN.format(task="wasserstein1_1d"),
    },
}

PRODUCT_W1 = {
    "about": "W1 with the l1 cost between product measures on R^d: the sum of the W1 of the marginals",
    "params": {"function": "wasserstein1_product"},
    "cells": {
        "intro": [_row(ROW_3, "| 3 | the Wasserstein distance $W_1$ between product measures on $\\mathbb R^d$ |")],
        "task:3": """## Task 3 · The Wasserstein distance between product measures (3 points)

The chapter measures distances on $E\\subseteq\\mathbb R^d$ with the $\\ell_1$ norm, and $W_1$ is the
transport problem (2.23) with the cost $\\lVert x-y\\rVert_1=\\sum_i\\lvert x_i-y_i\\rvert$. Let
$\\mu=\\mu_1\\otimes\\dots\\otimes\\mu_d$ and $\\nu=\\nu_1\\otimes\\dots\\otimes\\nu_d$ be products of measures on
the line, $\\mu_i=\\sum_ka_{ik}\\delta_{x_{ik}}$ and $\\nu_i=\\sum_lb_{il}\\delta_{y_{il}}$. Show that
$W_1(\\mu,\\nu)=\\sum_iW_1(\\mu_i,\\nu_i)$: a lower bound from the marginals of any coupling of $\\mu$ and
$\\nu$ (does it need the product structure?), an upper bound from a coupling that you build from optimal
couplings of the marginals. Each term is then a distance on the line,
$W_1(\\mu_i,\\nu_i)=\\int\\lvert F_{\\mu_i}-F_{\\nu_i}\\rvert\\,\\mathrm dt$.

Implement `wasserstein1_product(x, a, y, b)`: `x` and `a` of shape `(d, n)` (row $i$: the points and
masses of $\\mu_i$), `y` and `b` of shape `(d, m)`, the points in any order; return $W_1(\\mu,\\nu)$ as a
0-d tensor, exactly, with no Python loop over the coordinates. The test compares it with the linear
program (2.23) on the $n^d\\times m^d$ atoms of the two products.""",
        "wasserstein1_1d": '''def wasserstein1_product(x, a, y, b):
    """W1 with the l1 cost between the products of the rows of (x, a) and of (y, b)."""
    ### BEGIN SOLUTION
    # the l1 cost splits over the coordinates, and so does W1: one distance on the line per row
    points = torch.cat([x, y], dim=-1)
    signed = torch.cat([a, -b], dim=-1)
    order = torch.argsort(points, dim=-1)
    cdf_difference = torch.cumsum(torch.gather(signed, -1, order), dim=-1)[..., :-1]
    gaps = torch.diff(torch.gather(points, -1, order), dim=-1)
    return (cdf_difference.abs() * gaps).sum()
    ### END SOLUTION''',
        "test_wasserstein1_1d": '''# Task 3: Dirac masses, a translation, and the linear program on the atoms of the products (SciPy's linprog).
import itertools

from scipy.optimize import linprog

from coursework import check_close, own

f = own(wasserstein1_product, globals())
one = torch.ones(2, 1)
check_close(torch.as_tensor(f(torch.tensor([[0.3], [1.0]]), one, torch.tensor([[-1.2], [0.5]]), one)).reshape(()),
            torch.tensor(2.0), "W1 between Diracs at (0.3, 1) and (-1.2, 0.5), the l1 distance", atol=1e-14,
            hint="the ground cost is the l1 distance: the coordinates add up")
g = torch.Generator().manual_seed(3)
x = torch.randn(2, 4, generator=g)
a = torch.rand(2, 4, generator=g)
a = a / a.sum(-1, keepdim=True)
shift = torch.tensor([[0.8], [-0.5]])
check_close(torch.as_tensor(f(x, a, x + shift, a)).reshape(()), torch.tensor(1.3),
            "W1 between a product and its translate by (0.8, -0.5)", atol=1e-13)


def product(points, masses):  # the atoms and masses of the product of the rows
    atoms = torch.tensor(list(itertools.product(*points.tolist())))
    weights = torch.tensor([math.prod(c) for c in itertools.product(*masses.tolist())])
    return atoms, weights


for d, n, m in ((2, 4, 5), (3, 3, 2)):
    x, y = torch.randn(d, n, generator=g), 2 * torch.randn(d, m, generator=g) + 0.5
    a, b = torch.rand(d, n, generator=g) + 0.1, torch.rand(d, m, generator=g) + 0.1
    a, b = a / a.sum(-1, keepdim=True), b / b.sum(-1, keepdim=True)
    (X, A), (Y, Bw) = product(x, a), product(y, b)
    cost = (X[:, None, :] - Y[None, :, :]).abs().sum(-1).numpy()
    rows, cols = len(A), len(Bw)
    constraints = np.vstack([np.kron(np.eye(rows), np.ones(cols)), np.kron(np.ones(rows), np.eye(cols))])
    lp = linprog(cost.ravel(), A_eq=constraints, b_eq=np.concatenate([A.numpy(), Bw.numpy()]), bounds=(0, None))
    check_close(torch.as_tensor(f(x, a, y, b)).reshape(()), torch.tensor(lp.fun),
                f"W1 in d = {d} against the linear program on {rows} x {cols} atoms", atol=1e-8,
                hint="each coordinate is a distance on the line: sort the points of each row on their own")
''' + HIDDEN.format(task="wasserstein1_1d"),
    },
}


# ------------------------------------------------------------------ Task 4: another constraint


ROW_4 = "| 4 | the maximum-entropy tilt that matches a moment |"

MOMENTS_TILT = {
    "about": "the maximum-entropy tilt that matches several moments at once: Newton's method on the convex dual in R^l",
    "params": {"function": "max_entropy_tilt_moments"},
    "cells": {
        "intro": [_row(ROW_4, "| 4 | the maximum-entropy tilt that matches several moments at once |")],
        "task:4": """## Task 4 · Maximum entropy with several moments (3 points)

Theorem 2.1 allows a vector statistic. Among the probability vectors $p$ on the atoms of
$\\nu=\\sum_jw_j\\delta_{k_j}$ with prescribed means $\\sum_jp_js_j=f\\in\\mathbb R^l$ of $l$ statistics at once
($s_j\\in\\mathbb R^l$), the one closest to $\\nu$ in relative entropy is the tilt
$p_j\\propto w_je^{\\langle\\lambda,s_j\\rangle}$ with $\\lambda\\in\\mathbb R^l$, and a bisection on one number no
longer finds $\\lambda$. Derive the gradient and the Hessian of the convex dual
$D(\\lambda)=\\log\\sum_jw_je^{\\langle\\lambda,s_j\\rangle}-\\langle\\lambda,f\\rangle$ (the paragraph after Theorem 2.1),
say why $D$ is strictly convex when the statistics are affinely independent on the support of $w$,
and minimize it by Newton's method, with a backtracking line search (halve the step until the dual
decreases enough) so that the iteration converges from $\\lambda=0$ whatever the target.

Implement `max_entropy_tilt_moments(weights, stats, target)`: 1-D `weights` of length $n$ (zeros
allowed), `stats` of shape `(n, l)` (row $j$ is $s_j$) and `target` of shape `(l,)` in the interior of
the convex hull of the rows of `stats`; return `(p, lam)`, `lam` of shape `(l,)`, with every mean of
`stats` under `p` equal to its target to $10^{-10}$.""",
        "max_entropy_tilt": '''def max_entropy_tilt_moments(weights, stats, target):
    """The tilt p proportional to w exp(<lam, s_j>) whose means of the rows s_j equal target; returns (p, lam)."""
    ### BEGIN SOLUTION
    log_w = torch.log(weights)

    def dual(lam):  # convex, gradient E_p[s] - f, Hessian Cov_p(s)
        return torch.logsumexp(log_w + stats @ lam, dim=-1) - lam @ target

    lam = torch.zeros(stats.shape[-1], dtype=stats.dtype)
    for _ in range(100):
        p = torch.softmax(log_w + stats @ lam, dim=-1)
        mean = p @ stats
        grad = mean - target
        if grad.abs().max() < 1e-13:
            break
        centred = stats - mean
        step = torch.linalg.solve(centred.T @ (p.unsqueeze(-1) * centred), grad)
        t, current = 1.0, dual(lam)
        slack = 1e-14 * (1 + abs(float(current)))  # near the optimum the decrease is below rounding
        while t > 1e-10 and dual(lam - t * step) > current + slack - 1e-4 * t * (grad @ step):
            t /= 2
        lam = lam - t * step
    return torch.softmax(log_w + stats @ lam, dim=-1), lam
    ### END SOLUTION''',
        "test_max_entropy_tilt": '''# Task 4: the moments are matched, p is a tilt of w, the multiplier is the one that made the target, and no
# other p with the same moments is closer to w; also a target near the boundary of the hull.
from coursework import check, check_close, check_shape, own

f = own(max_entropy_tilt_moments, globals())
g = torch.Generator().manual_seed(4)
n, l = 9, 2
w = torch.rand(n, generator=g)
w = w / w.sum()
s = torch.randn(n, l, generator=g)
for lam_true in (torch.tensor([0.8, -0.5]), torch.tensor([6.0, -4.0])):
    tilt = torch.softmax(torch.log(w) + s @ lam_true, dim=-1)
    target = tilt @ s
    p, lam = f(w, s, target)
    check_shape(lam, (l,), "the multiplier for 2 statistics")
    check_close(p @ s, target, f"the means of the two statistics under p (the target of lam = {lam_true.tolist()})",
                atol=1e-10, hint="a full Newton step can overshoot: halve it until the dual decreases"
                if not bool(torch.isfinite(p).all()) else "Newton's method stops where the gradient of D vanishes:"
                " differentiate D as the task defines it, and check the sign of the step")
    check_close(lam, lam_true, f"the multiplier (the tilt was made with lam = {lam_true.tolist()})", atol=1e-7,
                hint="yours is minus the multiplier: the tilt is w exp(+<lam, s_j>)" if torch.allclose(lam, -lam_true, atol=1e-6)
                else "D is strictly convex here, so its minimizer is unique: check the Hessian you derived, and iterate"
                " until the gradient of D is far below the tolerance")
    check_close(p.sum(), torch.tensor(1.0), "the total mass of p")
log_ratio = torch.log(p / w) - s @ lam  # constant for a tilt
check_close(log_ratio, log_ratio.mean().expand(n), "log(p / w) - <lam, s_j> (a tilt makes it constant)", atol=1e-8)
# perturb p along directions that keep the total mass and both moments: the KL to w can only grow
A = torch.cat([torch.ones(1, n), s.T])
basis = torch.linalg.svd(A, full_matrices=True).Vh[3:]  # null space of A
kl = lambda q: float((q * torch.log(q / w)).sum())
for _ in range(50):
    q = p + 0.3 * float(p.min()) * torch.nn.functional.normalize(torch.randn(n - 3, generator=g), dim=0) @ basis
    check(q.min() > 0 and kl(q) >= kl(p) - 1e-12, "KL(q || w) for a q with the same moments", f">= KL(p || w) = {kl(p):.10g}", kl(q))
''' + HIDDEN.format(task="max_entropy_tilt"),
    },
}

KL_BUDGET_TILT = {
    "about": "the largest mean of s within a budget of relative entropy, KL(p || w) <= kappa: a tilt with lam > 0 found from kappa",
    "params": {"function": "kl_budget_tilt"},
    "cells": {
        "intro": [_row(ROW_4, "| 4 | the tilt with the largest mean within a budget of relative entropy |")],
        "task:4": """## Task 4 · The largest mean within a budget of relative entropy (3 points)

Turn the maximum-entropy problem (2.18) around: instead of prescribing the mean and paying for it in
relative entropy, fix the budget. Among the probability vectors $p$ on the atoms of
$\\nu=\\sum_jw_j\\delta_{k_j}$ with $\\operatorname{KL}(p\\Vert w)\\le\\kappa$, find the one with the largest mean
$\\sum_jp_js_j$ of a statistic $s$. With a multiplier for the budget, show that the maximizer is an
exponential tilt $p_j\\propto w_je^{\\lambda s_j}$ with $\\lambda>0$ (the Gibbs variational principle
(2.20) with the potential $e^{\\lambda s}$ does most of the work) and that the whole budget is spent.
Then show that along the tilts $\\operatorname{KL}(p_\\lambda\\Vert w)=\\lambda A'(\\lambda)-A(\\lambda)$, with
$A(\\lambda)=\\log\\sum_jw_je^{\\lambda s_j}$, and that it increases with $\\lambda>0$ (its derivative is
$\\lambda\\operatorname{Var}_{p_\\lambda}(s)$), so that $\\lambda$ can be found by bisection. Which budgets
can be spent, and what is the answer for a larger one?

Implement `kl_budget_tilt(weights, stat, budget)` for 1-D `weights` (zeros allowed) and `stat` and a
number $\\kappa$ = `budget` with $0<\\kappa<-\\log w(M)$, where $M$ is the set of atoms of positive mass at
which $s$ is largest; return `(p, lam)` with $\\operatorname{KL}(p\\Vert w)=\\kappa$ to $10^{-10}$.""",
        "max_entropy_tilt": '''def kl_budget_tilt(weights, stat, budget):
    """The tilt p proportional to w exp(lam * s), lam > 0, with KL(p || w) = budget; returns (p, lam)."""
    ### BEGIN SOLUTION
    log_w = torch.log(weights)

    def tilt(lam):
        return torch.softmax(log_w + lam * stat, dim=-1)

    def kl(lam):  # KL(p_lam || w) = lam E_p[s] - A(lam), increasing for lam > 0
        return float(lam * (tilt(lam) @ stat) - torch.logsumexp(log_w + lam * stat, dim=-1))

    lo, hi = 0.0, 1.0
    while kl(hi) < budget:
        lo, hi = hi, 2 * hi
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if kl(mid) < budget:
            lo = mid
        else:
            hi = mid
    lam = 0.5 * (lo + hi)
    return tilt(lam), torch.tensor(lam)
    ### END SOLUTION''',
        "test_max_entropy_tilt": '''# Task 4: the budget is spent, p is a tilt of w with lam > 0, its multiplier is maximum_entropy_tilt's for
# its own mean, and no p within the budget has a larger mean.
from attnopt.kernels import EmpiricalMeasure, maximum_entropy_tilt
from coursework import check, check_close, own

f = own(kl_budget_tilt, globals())
g = torch.Generator().manual_seed(4)
n, budget = 9, 0.3
w = torch.rand(n, generator=g) + 0.05
w[5] = 0.0  # an atom of mass 0
w = w / w.sum()
s = torch.randn(n, generator=g)
kept = w > 0


def kl(q):  # KL(q || w) along the last dimension, over the atoms of w
    return (q[..., kept] * torch.log(q[..., kept] / w[kept])).sum(-1)


p, lam = f(w, s, budget)
check(float(lam) > 0, "the multiplier", "> 0", lam, hint="a negative multiplier tilts towards the smallest values of s"
      if float(lam) < 0 else "is the relative entropy along your tilts a number? 0 log 0 = 0 at an atom of mass 0")
check_close(kl(p), torch.tensor(budget), f"KL(p || w) for the budget {budget}", atol=1e-10,
            hint="the whole budget is spent: a tilt with a smaller KL has room for a larger mean"
            if float(kl(p)) < budget else "the relative entropy of your tilt overshoots the budget: compare your"
            " expression for it along the tilts with the definition (2.17), and bisect until it matches to 1e-10")
check(bool(p[5] == 0), "the mass of p at an atom of mass 0", "exactly 0", p[5])
log_ratio = torch.log(p[kept] / w[kept]) - float(lam) * s[kept]  # constant for a tilt
check_close(log_ratio, log_ratio.mean().expand(int(kept.sum())), "log(p / w) - lam s (a tilt makes it constant)", atol=1e-9)
atoms = torch.randn(n, 2, generator=g)
lam_lib = maximum_entropy_tilt(EmpiricalMeasure(atoms, w), s[:, None], (p @ s).reshape(1))[1]
check_close(torch.as_tensor(lam, dtype=torch.float64).reshape(()), lam_lib.reshape(()),
            "the multiplier against maximum_entropy_tilt's for the mean of s under p", atol=1e-7)
# competitors: (1 - t) w + t d for random d on the atoms of w, with t chosen so that the budget is spent
d = torch.distributions.Dirichlet(torch.ones(int(kept.sum()))).sample((300,))
d = torch.zeros(300, n).masked_scatter(kept.expand(300, n), d)
lo, hi = torch.zeros(300, 1), torch.ones(300, 1)
for _ in range(60):
    mid = (lo + hi) / 2
    over = (kl((1 - mid) * w + mid * d) > budget).unsqueeze(-1)
    lo, hi = torch.where(over, lo, mid), torch.where(over, mid, hi)
others = (1 - lo) * w + lo * d
check(bool(torch.all(others @ s <= p @ s + 1e-12)), "the mean of s under p",
      f"at least the largest over 300 others within the budget, {(others @ s).max().item():.10g}", p @ s)
''' + HIDDEN.format(task="max_entropy_tilt"),
    },
}


# ------------------------------------------------------------------ Tasks 6 and 7: the price of another constraint


ROW_6 = "| 6 | a derivation: the price of a moment constraint |"
ROW_7 = "| 7 | the price of Task 6 in code |"

MOMENTS_COST = {
    "about": "the price of l moments: K(f) = <lam, f> - A(lam), its gradient lam and Hessian Cov_p(s)^(-1) (Task 6 changes with it)",
    "params": {"function": "tilt_cost_moments"},
    "cells": {
        "intro": [_row(ROW_6, "| 6 | a derivation: the price of several moment constraints |"),
                  _row(ROW_7, "| 7 | the price of Task 6 in code: its gradient and Hessian |")],
        "task:6": """## Task 6 · The price of several moments: a derivation (2 points, graded by hand)

Task 4 prescribes one mean; prescribe $l$ of them. For statistics $s_j\\in\\mathbb R^l$ at the atoms, let
$K(f)=\\min\\{\\operatorname{KL}(p\\Vert w):\\sum_jp_js_j=f\\}$ for $f$ in the interior of the convex hull of the
$s_j$ on the support of $w$ (zeros of $w$ allowed, the $s_j$ affinely independent there), and
$A(\\lambda)=\\log\\sum_jw_je^{\\langle\\lambda,s_j\\rangle}$ for $\\lambda\\in\\mathbb R^l$.

* **(a)** Show that $K(f)=\\langle\\lambda,f\\rangle-A(\\lambda)$, with $\\lambda=\\lambda(f)$ the multiplier of the
  tilt $p_f$ (Theorem 2.1 with a vector statistic).
* **(b)** Show that $\\nabla K(f)=\\lambda(f)$ and $\\nabla^2K(f)=\\operatorname{Cov}_{p_f}(s)^{-1}$, the inverse of the
  covariance matrix of $s$ under the tilt: $K$ is convex. Which function is $K$ the convex conjugate of?
* **(c)** Near the mean $f_0=\\sum_jw_js_j$, how does $K$ grow (to second order)? In which direction of
  $f-f_0$ is a move cheapest, and in which dearest?

*Where to start:* write the tilt's log-weights $\\log(p_j/w_j)$ through $\\lambda$ and $A$, and
differentiate the moment condition $\\nabla A(\\lambda(f))=f$ in $f$ (it is an equation between
vectors, so its derivative is one between matrices). Write your derivation in the cell below
(Markdown and LaTeX); Task 7 turns it into code.""",
        "written_tilt_cost": """**(a)** The minimizer is the tilt $p_j=w_je^{\\langle\\lambda,s_j\\rangle-A(\\lambda)}$ (Theorem 2.1), and
$\\nabla A(\\lambda)=\\sum_jp_js_j=f$. On the support of $w$, $\\log(p_j/w_j)=\\langle\\lambda,s_j\\rangle-A(\\lambda)$; off it
$p_j=0$ and the term is $0\\log0=0$. So $K(f)=\\sum_jp_j(\\langle\\lambda,s_j\\rangle-A)=\\langle\\lambda,f\\rangle-A(\\lambda)$.

**(b)** By the chain rule, with $J=\\partial\\lambda/\\partial f$ the Jacobian of the multiplier,
$\\nabla K(f)=\\lambda+J^\\top\\big(f-\\nabla A(\\lambda)\\big)=\\lambda(f)$: the derivative of the multiplier drops out
(the envelope theorem). Differentiating $\\nabla A(\\lambda(f))=f$ gives $\\nabla^2A(\\lambda)\\,J=I$, and
$\\nabla^2A(\\lambda)=\\operatorname{Cov}_{p_f}(s)$, positive definite because the $s_j$ are affinely independent
on the support of $w$, where $p_f$ is positive. So $\\nabla^2K(f)=J=\\operatorname{Cov}_{p_f}(s)^{-1}\\succ0$ and $K$
is convex. $K(f)=\\sup_\\lambda\\{\\langle\\lambda,f\\rangle-A(\\lambda)\\}$ is the convex conjugate of the log moment
generating function $A$ of $s$ under $w$; the supremum is attained where $\\nabla A(\\lambda)=f$.

**(c)** At $f_0$, $\\lambda=0$, $K=0$, $\\nabla K=0$ and $\\nabla^2K=\\Sigma_w^{-1}$ with $\\Sigma_w=\\operatorname{Cov}_w(s)$, so
$K(f)=\\tfrac12(f-f_0)^\\top\\Sigma_w^{-1}(f-f_0)+O(\\lVert f-f_0\\rVert^3)$, half the squared Mahalanobis distance
of $f$ from $f_0$. For a move of a given length $\\delta$ the cost is about $\\delta^2/(2\\sigma^2)$ with $\\sigma^2$
the variance of $s$ in the direction of the move: cheapest along the eigenvector of the largest
eigenvalue of $\\Sigma_w$ (the direction in which the statistics already vary most), dearest along that of
the smallest.""",
        "task:7": """## Task 7 · The price of several moments in code (3 points)

Implement `tilt_cost_moments(weights, stats, lam)` from your Task 6, parametrized by the multiplier
rather than the target (so that it needs no solver): for 1-D `weights` of length $n$ (non-negative,
summing to one, zeros allowed), `stats` of shape `(n, l)` and `lam` of shape `(l,)`, return
`(target, K, grad, hess)`: the means $f$ of the statistics under the tilt with multiplier `lam`
(shape `(l,)`), $K(f)$ (a 0-d tensor), $\\nabla K(f)$ (shape `(l,)`) and $\\nabla^2K(f)$ (shape
`(l, l)`), in closed form. Stay in log space (`stats @ lam` of a few hundred must not overflow). The
test compares your functions with the KL divergence and the multiplier of `attnopt`'s
`maximum_entropy_tilt` at nearby targets, by central differences.""",
        "tilt_cost": '''def tilt_cost_moments(weights, stats, lam):
    """The means f reached by the tilt with multiplier lam, and K(f), its gradient and its Hessian."""
    ### BEGIN SOLUTION
    logits = torch.log(weights) + stats @ lam
    A = torch.logsumexp(logits, dim=-1)
    p = torch.exp(logits - A)
    target = p @ stats
    centred = stats - target
    cov = centred.T @ (p.unsqueeze(-1) * centred)
    return target, lam @ target - A, lam.clone(), torch.linalg.inv(cov)
    ### END SOLUTION''',
        "test_tilt_cost": '''# Task 7: K against the KL divergence of maximum_entropy_tilt, its gradient against central differences of
# that KL, and the gradient and the Hessian against autograd along the path of tilts.
from torch.autograd.functional import jacobian

from attnopt.kernels import EmpiricalMeasure, maximum_entropy_tilt
from coursework import check, check_close, check_shape, own

f = own(tilt_cost_moments, globals())
g = torch.Generator().manual_seed(6)
n, l, step = 9, 2, 1e-4
s = torch.randn(n, l, generator=g)
atoms = torch.randn(n, 2, generator=g)
w = torch.rand(n, generator=g) + 0.1
w[3] = 0.0  # an atom of mass 0
w = w / w.sum()
kept = w > 0


def tilt_at(target):  # KL(p_f || w) of the minimizer, from the library's solver
    p = maximum_entropy_tilt(EmpiricalMeasure(atoms, w), s, target)[0].weights
    return (p[kept] * torch.log(p[kept] / w[kept])).sum()


def path(lam):  # (KL(p || w), the means of s under p) for the tilt p with multiplier lam, from the definitions
    p = torch.softmax(torch.log(w) + s @ lam, dim=-1)
    return (p[kept] * torch.log(p[kept] / w[kept])).sum(), p @ s


def gradient_of_K(lam):  # K(means(lam)) = KL(lam): the chain rule, solved for the gradient of K at means(lam)
    d_kl = jacobian(lambda x: path(x)[0], lam, create_graph=True)
    d_means = jacobian(lambda x: path(x)[1], lam, create_graph=True)  # [a, b]: d mean_a / d lam_b
    return torch.linalg.solve(d_means.T, d_kl)


for lam in (torch.tensor([-0.8, 0.3]), torch.tensor([0.6, 1.1])):
    target, K, grad, hess = f(w, s, lam)
    check_shape(target, (l,), "the target f")
    check_shape(hess, (l, l), "the Hessian of K")
    check_close(target, path(lam)[1], f"the target f for lam = {lam.tolist()}, the means of s under the tilt",
                atol=1e-12)
    check_close(torch.as_tensor(K).reshape(()), tilt_at(target), f"K(f) for lam = {lam.tolist()}, the KL of the tilt",
                atol=1e-9, hint="at an atom of mass 0 the tilt has mass 0 too, and 0 log 0 = 0")
    e = torch.eye(l)
    finite_grad = torch.stack([(tilt_at(target + step * e[i]) - tilt_at(target - step * e[i])) / (2 * step)
                               for i in range(l)])
    check_close(torch.as_tensor(grad).reshape(l), finite_grad, f"the gradient of K for lam = {lam.tolist()}, against"
                " central differences", atol=1e-6)
    auto_grad = gradient_of_K(lam)
    check_close(torch.as_tensor(grad).reshape(l), auto_grad.detach(), f"the gradient of K for lam = {lam.tolist()},"
                " against autograd along the tilts", atol=1e-10)
    # the Hessian: d(gradient of K)/d lam = Hessian @ d means / d lam
    d_means = jacobian(lambda x: path(x)[1], lam)
    auto_hess = torch.linalg.solve(d_means.T, jacobian(gradient_of_K, lam).T).T
    check_close(hess, auto_hess, f"the Hessian of K for lam = {lam.tolist()}, against autograd along the tilts",
                atol=1e-9, rtol=1e-9, hint="yours is the inverse of the Hessian of K: check which way round the"
                " derivative of the moment condition relates the target and the multiplier"
                if torch.allclose(torch.as_tensor(hess) @ auto_hess, e, atol=1e-8) else
                "the multiplier moves with the target: differentiate the moment condition, a matrix equation")
# statistics shifted by one vector c with <lam, c> = 740: exp(740) overflows, and nothing but f may change
lam = torch.tensor([0.6, 1.1])
c = torch.tensor([500.0, 400.0])
target, K, grad, hess = f(w, s, lam)
target_c, K_c, grad_c, hess_c = f(w, s + c, lam)
check(bool(torch.isfinite(torch.as_tensor(K_c))), "K for statistics shifted by (500, 400)", "a finite number", K_c,
      hint="stay in log space: shift the exponents by their largest value before exponentiating")
check_close(torch.as_tensor(K_c).reshape(()), torch.as_tensor(K).reshape(()), "K for statistics shifted by (500, 400)",
            atol=1e-9)
check_close(target_c, target + c, "the target for statistics shifted by (500, 400)", atol=1e-9)
check_close(hess_c, hess, "the Hessian for statistics shifted by (500, 400)", atol=1e-6, rtol=1e-8)
''' + HIDDEN.format(task="tilt_cost"),
    },
}

BUDGET_VALUE = {
    "about": "the value of a KL budget, V(kappa) = max mean within KL <= kappa, the inverse of K: V' = 1/lam, V'' = -1/(lam^3 Var) (Task 6 changes with it)",
    "params": {"function": "budget_value"},
    "cells": {
        "intro": [_row(ROW_6, "| 6 | a derivation: the value of a budget of relative entropy |"),
                  _row(ROW_7, "| 7 | the value of Task 6 in code |")],
        "task:6": """## Task 6 · The value of a budget: a derivation (2 points, graded by hand)

Task 4 prescribes the mean and pays for it in relative entropy; now fix the price and ask what it
buys. Let $V(\\kappa)=\\max\\{\\sum_jp_js_j:\\operatorname{KL}(p\\Vert w)\\le\\kappa\\}$ for $0<\\kappa<-\\log w(M)$, with $M$
the atoms of positive mass at which $s$ is largest (zeros of $w$ allowed), and
$A(\\lambda)=\\log\\sum_jw_je^{\\lambda s_j}$.

* **(a)** Show that the maximizer is the tilt $p_\\lambda\\propto w\\,e^{\\lambda s}$ with the $\\lambda>0$ for which
  $\\operatorname{KL}(p_\\lambda\\Vert w)=\\lambda A'(\\lambda)-A(\\lambda)=\\kappa$, so that $V(\\kappa)=A'(\\lambda)$ (the Gibbs
  variational principle (2.20) with the potential $e^{\\lambda s}$ gives an upper bound that the tilt
  attains). How is $V$ related to $K(f)=\\min\\{\\operatorname{KL}(p\\Vert w):\\sum_jp_js_j=f\\}$?
* **(b)** Show that $V'(\\kappa)=1/\\lambda$ and $V''(\\kappa)=-1/\\big(\\lambda^3\\operatorname{Var}_{p_\\lambda}(s)\\big)$: $V$
  is increasing and concave.
* **(c)** How does $V$ grow for small $\\kappa$ (to leading order), and what does it tend to as
  $\\kappa\\to-\\log w(M)$?

*Where to start:* both $\\kappa$ and $V$ are functions of $\\lambda$ along the tilts; differentiate each
in $\\lambda$ and divide. Write your derivation in the cell below (Markdown and LaTeX); Task 7 turns it
into code.""",
        "written_tilt_cost": """**(a)** For $\\lambda>0$ and any $p$ with $\\operatorname{KL}(p\\Vert w)\\le\\kappa$, the Gibbs variational principle
with $a=\\lambda s$ gives $\\lambda\\sum_jp_js_j-\\operatorname{KL}(p\\Vert w)\\le A(\\lambda)$, so
$\\sum_jp_js_j\\le(A(\\lambda)+\\kappa)/\\lambda$, with equality only for $p=p_\\lambda$ and a budget spent exactly.
Along the tilts, $\\log(p_j/w_j)=\\lambda s_j-A(\\lambda)$ on the support of $w$ (and $0\\log0=0$ off it), so
$g(\\lambda)=\\operatorname{KL}(p_\\lambda\\Vert w)=\\lambda A'(\\lambda)-A(\\lambda)$; $g(0)=0$, $g'(\\lambda)=\\lambda A''(\\lambda)>0$, and
$g(\\lambda)\\to-\\log w(M)$ as $\\lambda\\to\\infty$. So for every $\\kappa$ in the range there is one $\\lambda>0$ with
$g(\\lambda)=\\kappa$; for it the bound is attained, $p_\\lambda$ is the maximizer and
$V(\\kappa)=(A+\\kappa)/\\lambda=A'(\\lambda)$. Since $K(A'(\\lambda))=\\lambda A'(\\lambda)-A(\\lambda)$ (Task 6 of the
public notebook), $K(V(\\kappa))=\\kappa$: $V$ is the inverse of $K$ on $[f_0,\\max_Ms)$, with $f_0=\\sum_jw_js_j$.

**(b)** $\\frac{\\mathrm d\\kappa}{\\mathrm d\\lambda}=\\lambda A''(\\lambda)$ and $\\frac{\\mathrm dV}{\\mathrm d\\lambda}=A''(\\lambda)$, so
$V'(\\kappa)=1/\\lambda>0$. Then $V''(\\kappa)=\\frac{\\mathrm d(1/\\lambda)}{\\mathrm d\\lambda}\\Big/\\frac{\\mathrm d\\kappa}{\\mathrm d\\lambda}
=-\\frac{1}{\\lambda^3A''(\\lambda)}=-\\frac1{\\lambda^3\\operatorname{Var}_{p_\\lambda}(s)}<0$ ($s$ is not constant on the
support of $w$, since the range of budgets is not empty). $V$ is increasing and concave: each further
nat of budget buys less mean.

**(c)** For small $\\lambda$, $\\kappa=\\tfrac12\\lambda^2\\operatorname{Var}_w(s)+O(\\lambda^3)$ and
$V-f_0=\\lambda\\operatorname{Var}_w(s)+O(\\lambda^2)$, so $V(\\kappa)=f_0+\\sqrt{2\\operatorname{Var}_w(s)\\,\\kappa}+O(\\kappa)$:
a square root, with infinite slope at $0$ ($V'=1/\\lambda\\to\\infty$). As $\\kappa\\to-\\log w(M)$, $\\lambda\\to\\infty$,
the tilt tends to $w$ restricted to $M$ and renormalized, and $V(\\kappa)\\to\\max_Ms$, the largest value of
$s$ on the support of $w$.""",
        "task:7": """## Task 7 · The value of a budget in code (3 points)

Implement `budget_value(weights, stat, lam)` from your Task 6, parametrized by the multiplier rather
than the budget (so that it needs no solver): for 1-D `weights` (non-negative, summing to one, zeros
allowed) and `stat` and a number `lam` $>0$, return `(budget, V, dV, d2V)`: the budget
$\\kappa=\\operatorname{KL}(p_\\lambda\\Vert w)$ that the tilt with multiplier `lam` spends, and $V(\\kappa)$,
$V'(\\kappa)$, $V''(\\kappa)$ in closed form, as 0-d tensors. Stay in log space (`lam * stat` of a few
hundred must not overflow). The test compares your functions with autograd along the path of tilts
and with `attnopt`'s `maximum_entropy_tilt`.""",
        "tilt_cost": '''def budget_value(weights, stat, lam):
    """The budget kappa spent by the tilt with multiplier lam > 0, and V(kappa), V'(kappa), V''(kappa)."""
    ### BEGIN SOLUTION
    logits = torch.log(weights) + lam * stat
    A = torch.logsumexp(logits, dim=-1)
    p = torch.exp(logits - A)
    mean = p @ stat
    var = p @ (stat - mean) ** 2
    lam = torch.as_tensor(lam, dtype=stat.dtype)
    return lam * mean - A, mean, 1 / lam, -1 / (lam**3 * var)
    ### END SOLUTION''',
        "test_tilt_cost": '''# Task 7: the budget and V, V', V'' against autograd along the path of tilts (kappa and the mean as
# functions of lam), and against maximum_entropy_tilt.
from attnopt.kernels import EmpiricalMeasure, maximum_entropy_tilt
from coursework import check, check_close, own

f = own(budget_value, globals())
g = torch.Generator().manual_seed(6)
n = 9
s = torch.randn(n, generator=g)
atoms = torch.randn(n, 2, generator=g)
w = torch.rand(n, generator=g) + 0.1
w[3] = 0.0  # an atom of mass 0
w = w / w.sum()
kept = w > 0


def path(lam):  # (kappa, mean of s) of the tilt with multiplier lam, computed directly
    p = torch.softmax(torch.log(w) + lam * s, dim=-1)
    return (p[kept] * torch.log(p[kept] / w[kept])).sum(), p @ s


for lam in (0.4, 1.5):
    budget, V, dV, d2V = (torch.as_tensor(x).reshape(()) for x in f(w, s, lam))
    at = torch.tensor(lam, requires_grad=True)
    kappa, mean = path(at)
    (dk,) = torch.autograd.grad(kappa, at, create_graph=True)
    (dm,) = torch.autograd.grad(mean, at, create_graph=True)
    slope = dm / dk  # dV / dkappa
    (dslope,) = torch.autograd.grad(slope, at)
    check_close(budget, kappa.detach(), f"the budget spent for lam = {lam}", atol=1e-12,
                hint="at an atom of mass 0 the tilt has mass 0 too, and 0 log 0 = 0")
    check_close(V, mean.detach(), f"V(kappa) for lam = {lam}, the mean of s under the tilt", atol=1e-12)
    p_lib = maximum_entropy_tilt(EmpiricalMeasure(atoms, w), s[:, None], V.reshape(1))[0].weights
    check_close((p_lib[kept] * torch.log(p_lib[kept] / w[kept])).sum(), budget,
                f"the KL of maximum_entropy_tilt's tilt with the mean V, for lam = {lam}", atol=1e-9)
    check_close(dV, slope.detach(), f"V'(kappa) for lam = {lam}, against autograd along the tilts", atol=1e-10,
                hint="yours is lam, the reciprocal of the slope asked: V' is the rate of the mean in the budget, not"
                " the other way round" if abs(float(dV) - lam) < 1e-9 else
                "differentiate the budget and the mean in lam, and divide")
    check_close(d2V, (dslope / dk).detach(), f"V''(kappa) for lam = {lam}, against autograd along the tilts", atol=1e-9,
                hint="V is concave: its second derivative is negative" if float(d2V) > 0 else
                "the multiplier moves with the budget: differentiate V' = 1/lam once more, in kappa")
budget, V, _, _ = (torch.as_tensor(x).reshape(()) for x in f(w, s, 300.0))
top = int(s.masked_fill(~kept, float("-inf")).argmax())
check(bool(torch.isfinite(budget)), "the budget for lam = 300", "a finite number", budget,
      hint="stay in log space: shift the exponents by their largest value before exponentiating")
check_close(budget, -torch.log(w[top]), "the budget for lam = 300 (the tilt sits on the largest value of s)", atol=1e-6)
check_close(V, s[top], "V for lam = 300, the largest value of s on the atoms of w", atol=1e-6)
''' + HIDDEN.format(task="tilt_cost"),
    },
}


VARIANTS = {
    "boltzmann_gibbs_weights": [INFORMATION_GAIN, GAUSSIAN_POSTERIOR],
    "attention_kernel_matrix": [GAUSSIAN_KERNEL, CAUSAL_KERNEL],
    "wasserstein1_1d": [KANTOROVICH_POTENTIAL, PRODUCT_W1],
    "max_entropy_tilt": [MOMENTS_TILT, KL_BUDGET_TILT],
    "tilt_cost": [MOMENTS_COST, BUDGET_VALUE],
}
