"""The hidden checks of the variants of Assignment 2 (``assignments/variants/ch2_markov_kernels.py``).

``hidden_checks.py`` runs the function named after the task when the course drew a variant k >= 1 of
it (``h.variant``; its parameters are ``h.params``). Like ``hidden_checks.py``, this file is public:
the inputs are drawn from the course secret, the properties checked are these.
"""

from __future__ import annotations

import math

import torch

from coursework import check, check_close, check_shape


def boltzmann_gibbs_weights(h):
    """Variant 1: the relative entropy of the reweighting; variant 2: the Gaussian posterior over keys."""
    return (_gibbs_information_gain, _gaussian_posterior_weights)[h.variant - 1](h)


def attention_kernel_matrix(h):
    """Variant 1: the kernel of the Gaussian potential; variant 2: mask, bias and temperature composed."""
    return (_gaussian_kernel_matrix, _causal_kernel_matrix)[h.variant - 1](h)


def wasserstein1_1d(h):
    """Variant 1: W1 on the line with an optimal Kantorovich potential; variant 2: W1 between products."""
    return (_kantorovich_potential_1d, _wasserstein1_product)[h.variant - 1](h)


# ---------------------------------------------------------------- Task 1


def _kl_of_masses(p, w):
    """KL(p || w) along the last dimension, summing over the atoms where p > 0 only."""
    ratio = torch.where(p > 0, torch.log(torch.where(p > 0, p, 1.0) / torch.where(p > 0, w, 1.0)), 0.0)
    return (p * ratio).sum(-1)


def _gibbs_information_gain(h):
    from attnopt.kernels import EmpiricalMeasure, boltzmann_gibbs

    f, g = h.student("gibbs_information_gain"), h.rng()
    points = torch.randn(3, 7, 2, generator=g)
    w = torch.rand(3, 7, generator=g)
    w[:, 0] = 0.0
    w = shared._normalize(w)
    log_g = 3 * torch.randn(3, 7, generator=g)
    log_g[:, 1] = float("-inf")
    with h.case("a (3, 7) batch with an atom of mass 0 and an atom where G = 0: KL of boltzmann_gibbs's masses"):
        found = f(w, log_g)
        check_shape(found, (3,), "information gain")
        p = boltzmann_gibbs(EmpiricalMeasure(points, w), log_potential=log_g).weights
        check_close(found, _kl_of_masses(p, w), "KL(Psi_G(nu) || nu)", atol=1e-12)
    with h.case("the Gibbs variational principle: E_p[log G] minus the gain is log nu(G), a (2, 4, 9) batch"):
        w2 = shared._normalize(torch.rand(2, 4, 9, generator=g) + 0.02)
        a = 2 * torch.randn(2, 4, 9, generator=g)
        p = torch.softmax(torch.log(w2) + a, -1)
        found = f(w2, a)
        check_shape(found, (2, 4), "information gain")
        check_close((p * a).sum(-1) - found, torch.logsumexp(torch.log(w2) + a, -1), "E_p[log G] - KL", atol=1e-12)
    with h.case("log G shifted by 1000 gives the same gain (no overflow)"):
        check_close(f(w, log_g + 1000.0), f(w, log_g), "information gain for log G + 1000", atol=1e-9)
    with h.case("a potential that vanishes on every atom but one: the gain is minus the log of that atom's mass"):
        j = int(torch.randint(2, 7, (1,), generator=g))
        only = torch.full((7,), float("-inf"))
        only[j] = float(torch.randn(1, generator=g))
        check_close(torch.as_tensor(f(w[0], only)).reshape(()), -torch.log(w[0, j]), "information gain", atol=1e-13)
    with h.case("a constant potential gains nothing"):
        check_close(f(w, torch.full_like(w, 2.5)), torch.zeros(3), "information gain", atol=1e-14)


def _gaussian_posterior_weights(h):
    from attnopt.kernels import gaussian_potential_attention

    f, g = h.student("gaussian_posterior_weights"), h.rng()
    B, N, T, d = 3, 8, 6, 2
    prior = torch.rand(B, N, generator=g) + 0.05
    prior[:, 3] = 0.0
    prior = shared._normalize(prior)
    keys = torch.randn(B, N, d, generator=g)
    sigma = 0.4 + float(torch.rand(1, generator=g))
    queries = keys[:, :1] + sigma * torch.randn(B, T, d, generator=g)
    with h.case(f"a (3, 8) batch, {T} queries, sigma = {sigma:.3f}, a key of prior mass 0: Gaussian-potential "
                "attention at the mean query with the scale T / (2 sigma^2)"):
        found = f(prior, keys, queries, sigma)
        check_shape(found, (B, N), "posterior")
        lib = gaussian_potential_attention(queries.mean(-2, keepdim=True), keys, key_weights=prior,
                                           scale=T / (2 * sigma**2))[1].squeeze(-2)
        check_close(found, lib, "posterior", atol=1e-12)
        check(bool(torch.all(found[:, 3] == 0)), "the posterior of the key with prior mass 0", "exactly 0", found[:, 3].abs().max())
    with h.case("Bayes' rule query by query: the posterior after all queries is the posterior after the last one,"
                " with the posterior after the others as its prior"):
        first = f(prior, keys, queries[:, :-1], sigma)
        check_close(f(first, keys, queries[:, -1:], sigma), f(prior, keys, queries, sigma), "posterior", atol=1e-12)
    with h.case("keys and queries translated by 300 together: the same posterior (no underflow)"):
        check_close(f(prior, keys + 300.0, queries + 300.0, sigma), f(prior, keys, queries, sigma), "posterior", atol=1e-9)
    with h.case("queries 50 away from every key, sigma = 0.2: finite masses summing to one"):
        far = f(prior, keys, queries + 50.0, 0.2)
        check(bool(torch.isfinite(far).all()), "posterior", "finite", far.abs().max())
        check_close(far.sum(-1), torch.ones(B), "total mass", atol=1e-12)


# ---------------------------------------------------------------- Task 2


def _gaussian_kernel_matrix(h):
    from attnopt.kernels import gaussian_potential_attention

    f, g = h.student("gaussian_kernel_matrix"), h.rng()
    B, M, N, d = 3, 5, 8, 4
    q, k = torch.randn(B, M, d, generator=g), torch.randn(B, N, d, generator=g)
    w = torch.rand(B, N, generator=g)
    w[:, 3] = 0.0
    w = shared._normalize(w)
    s = 0.2 + float(torch.rand(1, generator=g))
    with h.case(f"key weights with a zero, scale {s:.3f}, agree with gaussian_potential_attention"):
        P = f(q, k, w, scale=s)
        check_shape(P, (B, M, N), "P")
        check_close(P, gaussian_potential_attention(q, k, key_weights=w, scale=s)[1], "P", atol=1e-13)
        check(bool(torch.all(P[..., 3] == 0)), "P for the key of weight 0", "exactly 0", P[..., 3].abs().max())
    with h.case("uniform key weights and the default scale 1 agree with gaussian_potential_attention"):
        check_close(f(q, k), gaussian_potential_attention(q, k)[1], "P", atol=1e-13)
    with h.case("a (2, 3, 6, 2) batch of queries and keys with key norms of very different sizes"):
        q2 = torch.randn(2, 3, 6, 2, generator=g)
        k2 = torch.randn(2, 3, 7, 2, generator=g) * torch.linspace(0.1, 3, 7)[:, None]
        check_close(f(q2, k2, scale=0.5), gaussian_potential_attention(q2, k2, scale=0.5)[1], "P", atol=1e-13)
    with h.case("queries and keys translated by 200 together: the same kernel"):
        check_close(f(q + 200.0, k + 200.0, w, scale=s), f(q, k, w, scale=s), "P", atol=1e-8)
    with h.case("queries of norm about 300: finite rows summing to one"):
        far = f(300 * q, k, w, scale=s)
        check(bool(torch.isfinite(far).all()), "P", "finite", far.abs().max())
        check_close(far.sum(-1), torch.ones(B, M), "row sums", atol=1e-12)


def _causal_kernel_matrix(h):
    f, g = h.student("causal_kernel_matrix"), h.rng()
    N, d = 9, 3
    q, k = torch.randn(2, 3, N, d, generator=g), torch.randn(2, 3, N, d, generator=g)
    bias = torch.randn(N, N, generator=g)
    causal = torch.ones(N, N, dtype=torch.bool).tril()
    for tau in (0.3, 1.0, 2.5):
        with h.case(f"a (2, 3, 9, 3) batch, tau = {tau}: the product of the three potentials"):
            P = f(q, k, bias, tau)
            check_shape(P, (2, 3, N, N), "P")
            potential = torch.where(causal, torch.exp(bias + q @ k.transpose(-1, -2) / tau), 0.0)
            check_close(P, potential / potential.sum(-1, keepdim=True), "P", atol=1e-13)
            check(bool(torch.all(P[..., ~causal] == 0)), "P above the diagonal", "exactly 0", P[..., ~causal].abs().max())
    with h.case("the composition rule: the kernel for the bias b1 + b2 is that for b1 reweighted by e^b2"):
        b2 = torch.randn(N, N, generator=g)
        reweighted = f(q, k, bias, 0.7) * torch.exp(b2)
        check_close(f(q, k, bias + b2, 0.7), reweighted / reweighted.sum(-1, keepdim=True), "P", atol=1e-13)
    with h.case("a bias of 1000 on one allowed key of every row: all the weight goes there, without overflow"):
        big = bias.clone()
        cols = torch.randint(0, N, (N,), generator=g) % (torch.arange(N) + 1)
        big[torch.arange(N), cols] = 1000.0
        P = f(q, k, big, 1.0)
        check_close(P[..., torch.arange(N), cols], torch.ones(2, 3, N), "the weight on the key of bias 1000", atol=1e-12)


# ---------------------------------------------------------------- Task 3


def _kantorovich_potential_1d(h):
    import ot

    f, g = h.student("kantorovich_potential_1d"), h.rng()

    def certify(x, a, y, b, what):
        w1, fx, fy = f(x, a, y, b)
        cost = (x[:, None] - y[None, :]).abs().numpy()
        lp = torch.tensor(ot.emd2(a.numpy(), b.numpy(), cost))
        check_close(torch.as_tensor(w1).reshape(()), lp, f"W1 {what}", atol=1e-10)
        check_close(a @ fx - b @ fy, lp, f"mu(f) - nu(f) {what}", atol=1e-10)
        points, values = torch.cat([x, y]), torch.cat([fx, fy])
        excess = ((values[:, None] - values[None, :]).abs() - (points[:, None] - points[None, :]).abs()).max()
        check(bool(excess <= 1e-10), f"max |f(s) - f(t)| - |s - t| {what}", "<= 0", excess)

    x, a = torch.randn(7, generator=g), shared._normalize(torch.rand(7, generator=g))
    y, b = 2 * torch.randn(11, generator=g) + 0.5, shared._normalize(torch.rand(11, generator=g))
    with h.case("7 and 11 atoms: W1 is POT's exact value, and the potential is 1-Lipschitz and attains it"):
        certify(x, a, y, b, "(7 and 11 atoms)")
    with h.case("the two measures swapped"):
        certify(y, b, x, a, "(swapped)")
    with h.case("measures that share four atoms, with different masses there"):
        shared_points = torch.randn(4, generator=g)
        x2 = torch.cat([shared_points, torch.randn(3, generator=g)])
        y2 = torch.cat([shared_points, torch.randn(5, generator=g)])
        certify(x2, shared._normalize(torch.rand(7, generator=g)), y2, shared._normalize(torch.rand(9, generator=g)),
                "(four shared atoms)")
    with h.case("one measure far to the right of the other (a shift of 50): f rises with slope 1 throughout"):
        certify(x, a, y + 50.0, b, "(a shift of 50)")


def _wasserstein1_product(h):
    import itertools

    import ot

    f, g = h.student("wasserstein1_product"), h.rng()
    for d, n, m in ((2, 5, 4), (3, 3, 3), (1, 7, 11)):
        with h.case(f"d = {d}, marginals of {n} and {m} atoms: POT's exact value on the atoms of the products"):
            x, y = torch.randn(d, n, generator=g), 2 * torch.randn(d, m, generator=g) + 0.3
            a = shared._normalize(torch.rand(d, n, generator=g) + 0.05)
            b = shared._normalize(torch.rand(d, m, generator=g) + 0.05)
            X = torch.tensor(list(itertools.product(*x.tolist())))
            Y = torch.tensor(list(itertools.product(*y.tolist())))
            A = torch.tensor([math.prod(c) for c in itertools.product(*a.tolist())])
            Bw = torch.tensor([math.prod(c) for c in itertools.product(*b.tolist())])
            cost = (X[:, None, :] - Y[None, :, :]).abs().sum(-1).numpy()
            found = torch.as_tensor(f(x, a, y, b)).reshape(())
            check_close(found, torch.tensor(ot.emd2(A.numpy(), Bw.numpy(), cost)), "W1", atol=1e-10)
    with h.case("symmetric in the two measures, and zero between a product and the same product listed in another order"):
        x, a = torch.randn(4, 6, generator=g), shared._normalize(torch.rand(4, 6, generator=g))
        y, b = torch.randn(4, 8, generator=g), shared._normalize(torch.rand(4, 8, generator=g))
        check_close(torch.as_tensor(f(y, b, x, a)).reshape(()), torch.as_tensor(f(x, a, y, b)).reshape(()), "W1(nu, mu)")
        perm = torch.randperm(6, generator=g)
        check_close(torch.as_tensor(f(x, a, x[:, perm], a[:, perm])).reshape(()), torch.tensor(0.0), "W1", atol=1e-14)
    with h.case("a translate by a vector c is at the distance |c|_1"):
        c = torch.randn(4, 1, generator=g)
        check_close(torch.as_tensor(f(x, a, x + c, a)).reshape(()), c.abs().sum(), "W1", atol=1e-12)


# ---------------------------------------------------------------- Task 4


def max_entropy_tilt(h):
    """Variant 1: the tilt that matches several moments; variant 2: the largest mean within a KL budget."""
    return (_max_entropy_tilt_moments, _kl_budget_tilt)[h.variant - 1](h)


def _max_entropy_tilt_moments(h):
    from attnopt.kernels import EmpiricalMeasure, maximum_entropy_tilt

    f, g = h.student("max_entropy_tilt_moments"), h.rng()
    n = 11
    w = torch.rand(n, generator=g) + 0.05
    w[4] = 0.0
    w = shared._normalize(w)
    atoms = torch.randn(n, 2, generator=g)
    for l, size in ((2, 0.5), (2, 5.0), (3, 2.0)):
        s = torch.randn(n, l, generator=g)
        lam_true = size * torch.nn.functional.normalize(torch.randn(l, generator=g), dim=0)
        target = torch.softmax(torch.log(w) + s @ lam_true, -1) @ s
        with h.case(f"{l} statistics, a target made by a multiplier of norm {size}, an atom of mass 0: agrees with "
                    "maximum_entropy_tilt"):
            p, lam = f(w, s, target)
            mu_lib, lam_lib = maximum_entropy_tilt(EmpiricalMeasure(atoms, w), s, target)
            check_shape(lam, (l,), "lambda")
            check_close(p @ s, target, "the means under p", atol=1e-10)
            check_close(p, mu_lib.weights, "p", atol=1e-9)
            # the multiplier is as well conditioned as the covariance of s under p: for large tilts an error of
            # 1e-10 in the moments moves it by 1e-6, so it is checked through p, and against the library loosely
            lam = torch.as_tensor(lam, dtype=torch.float64)
            check_close(torch.softmax(torch.log(w) + s @ lam, -1), p, "the tilt of w by your lambda", atol=1e-11)
            check_close(lam, lam_lib, "lambda", atol=1e-4)
            check(bool(p[4] == 0), "the mass of p at the atom of mass 0", "exactly 0", p[4])
    with h.case("the targets equal to the means under w need no tilt"):
        s = torch.randn(n, 2, generator=g)
        p0, lam0 = f(w, s, w @ s)
        check_close(torch.as_tensor(lam0, dtype=torch.float64), torch.zeros(2), "lambda", atol=1e-9)
        check_close(p0, w, "p", atol=1e-10)


def _kl_budget_tilt(h):
    from attnopt.kernels import EmpiricalMeasure, maximum_entropy_tilt

    f, g = h.student("kl_budget_tilt"), h.rng()
    n = 10
    w = torch.rand(n, generator=g) + 0.05
    s = torch.randn(n, generator=g)
    order = torch.argsort(s, descending=True)
    s[order[1]] = s[order[2]] + 0.5  # a gap of 0.5 below the largest value of positive mass keeps lam moderate
    s[order[0]] = s[order[1]] + 1.0  # the largest value of s sits on an atom of mass 0: it does not count
    w[order[0]] = 0.0
    w = shared._normalize(w)
    atoms = torch.randn(n, 2, generator=g)
    spendable = float(-torch.log(w[order[1]]))

    def kl(q):
        on = q > 0
        return (q[on] * torch.log(q[on] / w[on])).sum()

    for name, budget in (("a small budget, 1e-3", 1e-3), ("a budget of 0.4 of what can be spent", 0.4 * spendable),
                         ("a budget of 0.9 of what can be spent", 0.9 * spendable)):
        with h.case(f"{name}, an atom of mass 0 where s is largest: the budget is spent, and the multiplier is "
                    "maximum_entropy_tilt's for the mean of s under p"):
            p, lam = f(w, s, budget)
            check_close(kl(p), torch.tensor(budget), "KL(p || w)", atol=1e-10)
            mu_lib, lam_lib = maximum_entropy_tilt(EmpiricalMeasure(atoms, w), s[:, None], (p @ s).reshape(1))
            check_close(p, mu_lib.weights, "p", atol=1e-9)
            check_close(torch.as_tensor(lam, dtype=torch.float64).reshape(()), lam_lib.reshape(()), "lambda",
                        atol=1e-6, rtol=1e-8)
    with h.case("a small budget kappa raises the mean by about sqrt(2 Var_w(s) kappa)"):
        kappa = 1e-8
        p, _ = f(w, s, kappa)
        mean = w @ s
        check_close(p @ s - mean, torch.sqrt(2 * (w @ (s - mean) ** 2) * kappa), "the rise of the mean", atol=1e-7)


# ---------------------------------------------------------------- Task 7


def tilt_cost(h):
    """Variant 1: the price of several moments and its derivatives; variant 2: the value of a KL budget."""
    return (_tilt_cost_moments, _budget_value)[h.variant - 1](h)


def _tilt_cost_moments(h):
    from attnopt.kernels import EmpiricalMeasure, maximum_entropy_tilt

    f, g = h.student("tilt_cost_moments"), h.rng()
    n, l, step = 11, 2, 1e-4
    s, atoms = torch.randn(n, l, generator=g), torch.randn(n, 2, generator=g)
    w = torch.rand(n, generator=g) + 0.05
    w[[2, 7]] = 0.0
    w = shared._normalize(w)

    def tilt_at(target):  # (KL(p_f || w), the multiplier) from the library's solver
        tilted, multiplier = maximum_entropy_tilt(EmpiricalMeasure(atoms, w), s, target)
        kept = tilted.weights > 0
        p = tilted.weights[kept]
        return (p * torch.log(p / w[kept])).sum(), multiplier

    for lam in (2 * torch.rand(l, generator=g) - 1, torch.tensor([1.2, -0.9])):
        with h.case(f"two atoms of mass 0, lam = {[round(x, 3) for x in lam.tolist()]}: K and its gradient against the KL "
                    "of maximum_entropy_tilt, the Hessian against its multiplier"):
            target, K, grad, hess = f(w, s, lam)
            check_shape(hess, (l, l), "the Hessian")
            p = torch.softmax(torch.log(w) + s @ lam, -1)
            check_close(target, p @ s, "the target f", atol=1e-12)
            kl, _ = tilt_at(target)
            check_close(torch.as_tensor(K).reshape(()), kl, "K(f)", atol=1e-8)
            e = torch.eye(l)

            def differences(h_):  # central differences of K and of the multiplier in each direction, step h_
                up = [tilt_at(target + h_ * e[i]) for i in range(l)]
                down = [tilt_at(target - h_ * e[i]) for i in range(l)]
                return (torch.stack([(u[0] - d[0]) / (2 * h_) for u, d in zip(up, down)]),
                        torch.stack([(u[1] - d[1]) / (2 * h_) for u, d in zip(up, down)], dim=-1))

            # Richardson's extrapolation of steps 2h and h: an error of order h^4, not h^2 (a Hessian with
            # entries of 45 had a truncation error of 3e-5 with the plain difference); what is left is the
            # solver's tolerance (1e-10 on the moments) over 2h, about 1e-6
            (g2, h2), (g1, h1) = differences(2 * step), differences(step)
            check_close(torch.as_tensor(grad).reshape(l), (4 * g1 - g2) / 3, "the gradient of K", atol=1e-5)
            check_close(hess, (4 * h1 - h2) / 3, "the Hessian of K", atol=1e-5, rtol=1e-5)
    with h.case("lam = 0 is no tilt: f is the mean under w, K = 0, its gradient 0 and its Hessian Cov_w(s)^(-1)"):
        target, K, grad, hess = f(w, s, torch.zeros(l))
        mean = w @ s
        check_close(target, mean, "f", atol=1e-13)
        check_close(torch.as_tensor(K).reshape(()), torch.tensor(0.0), "K", atol=1e-13)
        check_close(torch.as_tensor(grad).reshape(l), torch.zeros(l), "the gradient", atol=1e-13)
        centred = s - mean
        check_close(hess, torch.linalg.inv(centred.T @ (w[:, None] * centred)), "the Hessian", atol=1e-10)
    with h.case("statistics shifted by one vector c with <lam, c> = 1000: f moves by c, K and its derivatives do not"):
        lam = torch.tensor([0.7, -0.4])
        c = 1000 * lam / (lam @ lam)
        base, shifted = f(w, s, lam), f(w, s + c, lam)
        check_close(shifted[0], base[0] + c, "f", atol=1e-9)
        check_close(torch.as_tensor(shifted[1]).reshape(()), torch.as_tensor(base[1]).reshape(()), "K", atol=1e-9)
        check_close(torch.as_tensor(shifted[2]).reshape(l), torch.as_tensor(base[2]).reshape(l), "the gradient", atol=1e-12)
        check_close(shifted[3], base[3], "the Hessian", atol=1e-6, rtol=1e-8)


def _budget_value(h):
    from attnopt.kernels import EmpiricalMeasure, maximum_entropy_tilt

    f, g = h.student("budget_value"), h.rng()
    n = 11
    s, atoms = torch.randn(n, generator=g), torch.randn(n, 2, generator=g)
    w = torch.rand(n, generator=g) + 0.05
    w[[2, 7]] = 0.0
    w = shared._normalize(w)
    kept = w > 0

    def path(lam):
        p = torch.softmax(torch.log(w) + lam * s, dim=-1)
        return (p[kept] * torch.log(p[kept] / w[kept])).sum(), p @ s

    for lam in (0.1 + 1.9 * float(torch.rand(1, generator=g)), 2.7):
        with h.case(f"two atoms of mass 0, lam = {lam:.3f}: V' is one over maximum_entropy_tilt's multiplier at V,"
                    " and V, V'' agree with autograd along the path of tilts"):
            budget, V, dV, d2V = (torch.as_tensor(x).reshape(()) for x in f(w, s, lam))
            at = torch.tensor(lam, requires_grad=True)
            kappa, mean = path(at)
            (dk,) = torch.autograd.grad(kappa, at, create_graph=True)
            (dm,) = torch.autograd.grad(mean, at, create_graph=True)
            (dslope,) = torch.autograd.grad(dm / dk, at)
            check_close(budget, kappa.detach(), "the budget", atol=1e-12)
            check_close(V, mean.detach(), "V", atol=1e-12)
            tilted, multiplier = maximum_entropy_tilt(EmpiricalMeasure(atoms, w), s[:, None], V.reshape(1))
            q = tilted.weights[kept]
            check_close((q * torch.log(q / w[kept])).sum(), budget, "the KL of the library's tilt with the mean V", atol=1e-9)
            check_close(dV, 1 / multiplier.reshape(()), "V'", atol=1e-8)
            check_close(d2V, (dslope / dk).detach(), "V''", atol=1e-8, rtol=1e-9)
    with h.case("a small multiplier, lam = 1e-3: V - f0 is about sqrt(2 Var_w(s) kappa)"):
        budget, V, _, _ = (torch.as_tensor(x).reshape(()) for x in f(w, s, 1e-3))
        mean = w @ s
        check_close(V - mean, torch.sqrt(2 * (w @ (s - mean) ** 2) * budget), "V - f0", atol=1e-5)
    with h.case("lam = 500, the largest value of s on the atoms of w 1 above the others: the budget is minus the log"
                " of its mass, V is that value"):
        j = int(s.masked_fill(~kept, float("-inf")).argmax())
        s_gap = s.clone()
        s_gap[j] = s[kept].masked_fill(torch.arange(n)[kept] == j, float("-inf")).max() + 1.0
        budget, V, dV, _ = (torch.as_tensor(x).reshape(()) for x in f(w, s_gap, 500.0))
        check_close(budget, -torch.log(w[j]), "the budget", atol=1e-9)
        check_close(V, s_gap[j], "V", atol=1e-9)
        check_close(dV, torch.tensor(1 / 500), "V'", atol=1e-14)
