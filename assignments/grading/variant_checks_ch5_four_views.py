"""The hidden checks of the variants of Assignment 5 (``assignments/variants/ch5_four_views.py``).

``hidden_checks.py`` runs the function named after the task when the course drew a variant k >= 1 of
it (``h.variant``; its parameters are ``h.params``). Like ``hidden_checks.py``, this file is public:
the inputs are drawn from the course secret, the properties checked are these.
"""

from __future__ import annotations

import math

import torch

from coursework import check, check_close, check_one_hot, check_shape


def gibbs(h):
    """Variant 1: the Gibbs minimizer with an entropy bonus; variant 2: without the mass constraint."""
    return (_gibbs_extra_entropy, _unbalanced_gibbs)[h.variant - 1](h)


def to_fenchel(h):
    """Variant 1: the dictionary for the Gaussian potential; variant 2: for a potential with a bias."""
    return (_dictionary_gaussian, _dictionary_bias)[h.variant - 1](h)


def grid_softmax(h):
    """Variant 1: discrete softmax on an uneven grid; variant 2: discrete sparsemax at temperature 1/h."""
    return (_grid_softmax_uneven, _grid_sparsemax)[h.variant - 1](h)


# ---------------------------------------------------------------- Task 1


def _gibbs_extra_entropy(h):
    from attnopt.transforms import one_sided_eot

    f, g = h.student("gibbs_extra_entropy"), h.rng()
    m = 7
    u = shared._normalize(torch.rand(m, generator=g) + 0.05)
    u_masked = u.clone()
    u_masked[[1, 5]] = 0.0
    u_masked = shared._normalize(u_masked)
    C = torch.randn(3, 4, m, generator=g)
    for eps, delta, prior, which in ((0.4, 0.3, u, "full support"), (1.5, 2.0, u_masked, "two masked keys"),
                                     (0.2, 5.0, u, "full support")):
        with h.case(f"a (3, 4, 7) batch, eps = {eps}, delta = {delta}, {which}: the plan is one_sided_eot's for the "
                    "costs C - eps log u with the entropy at eps + delta, and the value its objective"):
            p, value = f(C, eps, prior, delta)
            check_shape(value, (3, 4), "value")
            shifted = torch.where(prior > 0, C - eps * torch.log(torch.where(prior > 0, prior, 1.0)), float("inf"))
            plan = one_sided_eot(shifted, eps=eps + delta)
            check_close(p, plan, "p*", atol=1e-10)
            logs = torch.where(plan > 0, plan * torch.log(torch.where(plan > 0, plan, 1.0)), 0.0)
            kl = torch.where(plan > 0, plan * torch.log(torch.where(plan > 0, plan / torch.where(prior > 0, prior, 1.0), 1.0)), 0.0)
            objective = (torch.where(plan > 0, plan * C, 0.0) + eps * kl + delta * logs).sum(-1)
            check_close(value, objective, "value", atol=1e-10)
    with h.case("delta = 0 gives the Gibbs measure of Lemma 5.1 and the value -eps log Z"):
        p, value = f(C, 0.6, u, 0.0)
        check_close(p, torch.softmax(torch.log(u) - C / 0.6, -1), "p*", atol=1e-12)
        check_close(value, -0.6 * torch.logsumexp(torch.log(u) - C / 0.6, -1), "value", atol=1e-12)
    with h.case("a large bonus flattens the prior: delta = 1e6 gives weights within 1e-5 of uniform"):
        p, _ = f(C[0, 0], 0.5, u, 1e6)
        check_close(p, torch.full((m,), 1 / m), "p*", atol=1e-5)
    with h.case("costs shifted by 1000 (eps + delta) do not overflow"):
        p0, v0 = f(C, 0.3, u_masked, 0.2)
        p1, v1 = f(C - 1000 * 0.5, 0.3, u_masked, 0.2)
        check_close(p1, p0, "p* for the shifted costs", atol=1e-12)
        check_close(v1 - v0, torch.full((3, 4), -1000 * 0.5), "value(C - 1000 (eps + delta)) - value(C)", atol=1e-9)


def _unbalanced_gibbs(h):
    from attnopt.transforms import one_sided_eot

    f, g = h.student("unbalanced_gibbs"), h.rng()
    m = 7
    u = shared._normalize(torch.rand(m, generator=g) + 0.05)
    u_masked = u.clone()
    u_masked[[0, 3]] = 0.0
    u_masked = shared._normalize(u_masked)
    C = torch.randn(3, 4, m, generator=g)
    C[1, :, 5] = float("inf")
    for eps, prior, which in ((0.3, u, "full support"), (1.2, u_masked, "two masked keys"), (4.0, u_masked, "two masked keys")):
        with h.case(f"a (3, 4, 7) batch with a forbidden key, eps = {eps}, {which}: the plan is exp(-F / eps) times "
                    "one_sided_eot's plan, F the value on the simplex, and the value eps (1 - its mass)"):
            p, value = f(C, eps, prior)
            check_shape(value, (3, 4), "value")
            plan = one_sided_eot(C, eps=eps, regularizer="kl", prior=prior)
            safe = torch.where(plan > 0, plan, 1.0)
            ratio = torch.where(plan > 0, safe / torch.where(prior > 0, prior, 1.0), 1.0)
            F = (torch.where(plan > 0, safe * C, 0.0) + eps * plan * torch.log(ratio)).sum(-1)  # on the simplex
            mass = torch.exp(-F / eps)
            check_close(p, mass.unsqueeze(-1) * plan, "p*", atol=1e-10, rtol=1e-10)  # a mass of up to about 1e5
            check_close(value, eps * (1 - mass), "value", atol=1e-10, rtol=1e-10)
            closed = torch.isinf(C) | (prior == 0)
            check(bool(torch.all(p[closed] == 0)), "the weights of the masked and the forbidden keys", "exactly 0",
                  f"{int((p[closed] != 0).sum())} of them not 0")
    with h.case("the value is below the objective at 500 random p >= 0 (eps = 0.8)"):
        c = torch.randn(m, generator=g)
        p, value = f(c, 0.8, u)
        others = torch.distributions.Dirichlet(torch.ones(m)).sample((500,)) * 4 * torch.rand(500, 1, generator=g)
        objective = others @ c + 0.8 * (others * torch.log(others / u) - others + u).sum(-1)
        check(bool(torch.all(value <= objective + 1e-12)), "value", f"at most {objective.min().item():.6g}", value)
    with h.case("costs of size 1000 eps: a plan of mass about 0 and the value eps, without nan"):
        c = torch.randn(m, generator=g) + 1000 * 0.5
        p, value = f(c, 0.5, u_masked)
        check_close(value, torch.tensor(0.5), "value", atol=1e-12)
        check_close(p, torch.zeros(m), "p*", atol=1e-12)


# ---------------------------------------------------------------- Task 2


def _dictionary_gaussian(h):
    from attnopt.fenchel import generalized_attention
    from attnopt.kernels import attention_kernel
    from attnopt.transforms import one_sided_eot

    to_f, to_e, g = h.student("to_fenchel"), h.student("to_eot"), h.rng()
    M, N, d = 5, 8, 3
    q, k = torch.randn(M, d, generator=g), torch.randn(N, d, generator=g)
    w = torch.rand(N, generator=g)
    w[2] = 0.0
    w = shared._normalize(w)
    for scale in (0.2, 1.0, 3.0):
        with h.case(f"a masked key, scale {scale}: the three views agree and the masked key gets weight 0"):
            _, P_kernel = attention_kernel(q, k, key_weights=w, similarity="gaussian", scale=scale)
            _, P_fenchel = generalized_attention(**to_f(q, k, w, scale))
            P_eot = one_sided_eot(**to_e(q, k, w, scale), regularizer="kl")
            check_close(P_fenchel, P_kernel, "Fenchel weights", atol=1e-11)
            check_close(P_eot, P_kernel, "transport weights", atol=1e-11)
    with h.case("queries and keys shifted by one random vector of size 40: the weights do not move"):
        offset = torch.randn(d, generator=g)
        offset = 40 * offset / offset.norm()
        _, P_kernel = attention_kernel(q, k, key_weights=w, similarity="gaussian", scale=0.7)
        _, P_fenchel = generalized_attention(**to_f(q + offset, k + offset, w, 0.7))
        P_eot = one_sided_eot(**to_e(q + offset, k + offset, w, 0.7), regularizer="kl")
        check_close(P_fenchel, P_kernel, "Fenchel weights", atol=1e-10)
        check_close(P_eot, P_kernel, "transport weights", atol=1e-10)
    with h.case("the output of the values is the same in the three views (12 keys, uniform weights)"):
        k2, v = torch.randn(12, d, generator=g), torch.randn(12, 2, generator=g)
        uniform = torch.full((12,), 1 / 12)
        y_kernel, _ = attention_kernel(q, k2, v, similarity="gaussian", scale=0.5)
        check_close(generalized_attention(**to_f(q, k2, uniform, 0.5))[1] @ v, y_kernel, "Fenchel output", atol=1e-11)
        check_close(one_sided_eot(**to_e(q, k2, uniform, 0.5), regularizer="kl") @ v, y_kernel, "transport output", atol=1e-11)


def _dictionary_bias(h):
    from attnopt.fenchel import generalized_attention
    from attnopt.kernels import attention_kernel
    from attnopt.transforms import one_sided_eot

    to_f, to_e, g = h.student("to_fenchel"), h.student("to_eot"), h.rng()
    M, N, d = 6, 9, 4
    q, k = torch.randn(M, d, generator=g), torch.randn(N, d, generator=g)
    w = torch.rand(N, generator=g)
    w[4] = 0.0
    w = shared._normalize(w)
    distance = (torch.arange(M)[:, None] - torch.arange(N)[None, :]).abs().to(torch.float64)
    for scale, bias, which in ((0.5, 3 * torch.randn(M, N, generator=g), "a random bias"),
                               (2.0, -0.7 * distance, "an ALiBi bias -0.7 |i - j|"),
                               (0.3, 1000 + torch.randn(M, N, generator=g), "a bias of size 1000")):
        with h.case(f"a masked key, scale {scale}, {which}: the three views agree"):
            _, P_kernel = attention_kernel(q, k, key_weights=w, similarity=lambda a, b: scale * a @ b.mT + bias)
            _, P_fenchel = generalized_attention(**to_f(q, k, w, bias, scale))
            P_eot = one_sided_eot(**to_e(q, k, w, bias, scale), regularizer="kl")
            check_close(P_fenchel, P_kernel, "Fenchel weights", atol=1e-10)
            check_close(P_eot, P_kernel, "transport weights", atol=1e-10)
            check(bool(torch.all(P_fenchel[:, 4] == 0)), "the Fenchel weights of the masked key", "exactly 0",
                  P_fenchel[:, 4].abs().max())
    with h.case("a bias constant along each row changes nothing: uniform weights and scale 1/sqrt(d) give SDPA"):
        import torch.nn.functional as F

        v = torch.randn(N, 3, generator=g)
        uniform = torch.full((N,), 1 / N)
        row_bias = torch.randn(M, 1, generator=g).expand(M, N)
        sdpa = F.scaled_dot_product_attention(q, k, v)
        check_close(generalized_attention(**to_f(q, k, uniform, row_bias, 0.5))[1] @ v, sdpa, "Fenchel output", atol=1e-12)
        check_close(one_sided_eot(**to_e(q, k, uniform, row_bias, 0.5), regularizer="kl") @ v, sdpa, "transport output",
                    atol=1e-12)


# ---------------------------------------------------------------- Task 3


def _trapezoid_moments(theta, t):
    """Mean and variance of the density proportional to exp(theta_1 t + theta_2 t^2), by the trapezoid rule on t."""
    f = theta[0] * t + theta[1] * t**2
    density = torch.exp(f - f.max())
    mass = torch.trapezoid(density, t)
    mean = torch.trapezoid(t * density, t) / mass
    return mean, torch.trapezoid((t - mean) ** 2 * density, t) / mass


def _grid_softmax_uneven(h):
    from attnopt.continuous import continuous_softmax
    from attnopt.value_functions import GaussianRBF

    f, g = h.student("grid_softmax_uneven"), h.rng()
    mu0, var0 = float(torch.rand(1, generator=g)) - 0.5, 0.02 + 0.05 * float(torch.rand(1, generator=g))
    theta = torch.tensor([mu0 / var0, -1 / (2 * var0)])
    x = torch.sort(torch.rand(3999, generator=g)).values
    t = torch.cat([torch.tensor([-3.0]), -3 + 6 * x**2, torch.tensor([3.0])])  # random points, dense near -3
    with h.case(f"a Gaussian with mean {mu0:.3f} and variance {var0:.3f} on 4001 random points of [-3, 3], denser near -3:"
                " the moments of the trapezoid rule on the same points"):
        p, mean, var = f(theta, t)
        check_shape(p, (4001,), "p")
        ref_mean, ref_var = _trapezoid_moments(theta, t)
        check_close(torch.as_tensor(mean).reshape(()), ref_mean, "mean", atol=1e-10)
        check_close(torch.as_tensor(var).reshape(()), ref_var, "variance", atol=1e-10)
    with h.case("a smooth uneven grid of 3001 points: the Gaussian's moments, and continuous softmax"):
        t2 = -3 + 6 * torch.linspace(0, 1, 3001) ** 1.5
        p, mean, var = f(theta, t2)
        check_close(torch.as_tensor(mean).reshape(()), torch.tensor(mu0), "mean", atol=1e-8)
        check_close(torch.as_tensor(var).reshape(()), torch.tensor(var0), "variance", atol=1e-8)
        basis = GaussianRBF(torch.linspace(-1, 1, 9), 0.1)
        r = continuous_softmax(torch.tensor([mu0]), torch.tensor([[var0]]), basis)
        check_close(p @ basis(t2[:, None]), r, "discrete attention", atol=1e-8)
    with h.case("scores of size 1000 on the grid do not overflow"):
        shifted = theta.clone()
        t3 = -3 + 6 * torch.linspace(0, 1, 801) ** 2
        p_low = f(theta, t3)[0]
        shifted_t = t3 + 40.0  # the same Gaussian moved by 40: scores of size (40 / var0) * 40
        shifted[0] = (mu0 + 40.0) / var0
        p_high = f(shifted, shifted_t)[0]
        check_close(p_high, p_low, "p for the grid and the Gaussian moved by 40", atol=1e-9)


def _grid_sparsemax(h):
    from attnopt.continuous import continuous_sparsemax
    from attnopt.transforms import sparsemax
    from attnopt.value_functions import GaussianRBF

    f, g = h.student("grid_sparsemax"), h.rng()
    for L in (801, 6001):
        mu0, scale = float(torch.rand(1, generator=g)) - 0.5, 0.01 + 0.05 * float(torch.rand(1, generator=g))
        theta = torch.tensor([mu0 / scale, -1 / (2 * scale)])
        t = torch.linspace(-3, 3, L)
        with h.case(f"a truncated parabola with centre {mu0:.3f} and scale {scale:.3f} on {L} points of [-3, 3]: "
                    "sparsemax of the scores times the step"):
            q, mean, var = f(theta, t)
            expected = sparsemax((t[1] - t[0]) * (theta[0] * t + theta[1] * t**2))
            check_close(q, expected, "q", atol=1e-12)
            check_close(torch.as_tensor(mean).reshape(()), expected @ t, "mean", atol=1e-12)
            check_close(torch.as_tensor(var).reshape(()), expected @ (t - expected @ t) ** 2, "variance", atol=1e-12)
        if L == 6001:
            with h.case("on 6001 points: the truncated parabola's moments, and continuous sparsemax"):
                a = (1.5 * scale) ** (1 / 3)
                check_close(torch.as_tensor(mean).reshape(()), torch.tensor(mu0), "mean", atol=1e-5)
                check_close(torch.as_tensor(var).reshape(()), torch.tensor(a * a / 5), "variance", atol=1e-5)
                basis = GaussianRBF(torch.linspace(-1, 1, 9), 0.1)
                r = continuous_sparsemax(torch.tensor([mu0]), torch.tensor([[scale]]), basis)
                check_close(q @ basis(t[:, None]), r, "discrete attention", atol=1e-5)
    with h.case("a grid of three points around a narrow parabola: all the mass on the middle point"):
        q, mean, var = f(torch.tensor([0.0, -50.0]), torch.tensor([-1.0, 0.0, 1.0]))
        check_one_hot(q, torch.tensor([0.0, 1.0, 0.0]), "q")
        check_close(torch.as_tensor(var).reshape(()), torch.tensor(0.0), "variance", atol=0.0)


# ---------------------------------------------------------------- Task 4


def sparse_eot(h):
    """Variant 1: the shifted entropy (p + c) log(p + c) by bisection; variant 2: 1.5-entmax by bisection."""
    return (_shifted_entropy_eot, _entmax15_eot)[h.variant - 1](h)


def _shifted_entropy_eot(h):
    from attnopt.transforms import one_sided_eot

    f, g = h.student("shifted_entropy_eot"), h.rng()
    C = torch.randn(2, 3, 7, generator=g)
    C[1, :, 2] = float("inf")
    for e, c in ((0.05, 0.1), (1.0, 0.02), (20.0, 0.5)):
        with h.case(f"a (2, 3, 7) batch with a forbidden key, eps = {e}, c = {c}, agrees with one_sided_eot for "
                    "omega(p) = (p + c) log(p + c)"):
            reference = one_sided_eot(C, eps=e, regularizer=lambda x: 1 + torch.log(x + c))
            check_close(f(C, e, c), reference, "plan", atol=1e-10)
    with h.case("a gap of eps log((1 + c) / c) or more between the two smallest costs gives a one-hot plan"):
        c = 0.2
        gap = 0.5 * math.log(1.2 / 0.2)
        check_one_hot(f(torch.tensor([0.0, gap + 0.01, gap + 1.0, 5.0]), 0.5, c), torch.tensor([1.0, 0.0, 0.0, 0.0]), "plan")
    with h.case("a large eps (100) gives every key a weight, (1 + m c) softmax(-C / eps) - c"):
        c_ = C[0]
        p = f(c_, 100.0, 0.05)
        check_close(p, 1.35 * torch.softmax(-c_ / 100.0, -1) - 0.05, "plan", atol=1e-12)
    with h.case("costs shifted by 1000 give the same plan"):
        check_close(f(C + 1000.0, 0.7, 0.1), f(C, 0.7, 0.1), "plan of C + 1000", atol=1e-10)


def _entmax15_eot(h):
    from attnopt.transforms import entmax, one_sided_eot

    f, g = h.student("entmax15_eot"), h.rng()
    C = torch.randn(2, 3, 7, generator=g)
    C[0, :, 4] = float("inf")
    for e in (0.05, 1.0, 20.0):
        with h.case(f"a (2, 3, 7) batch with a forbidden key, eps = {e}, agrees with entmax(-C / eps, 1.5) and one_sided_eot"):
            p = f(C, e)
            check_close(p, entmax(-C / e, 1.5), "plan", atol=1e-10)
            check_close(p, one_sided_eot(C, eps=e, regularizer="tsallis", alpha=1.5), "plan", atol=1e-9)
    with h.case("a gap of 2 eps or more between the two smallest costs gives a one-hot plan"):
        check_one_hot(f(torch.tensor([0.0, 2.05, 2.5, 3.0]), 1.0), torch.tensor([1.0, 0.0, 0.0, 0.0]), "plan")
    with h.case("a gap just below 2 eps leaves the second key a small weight"):
        p = f(torch.tensor([0.0, 1.9, 2.5, 3.0]), 1.0)
        check(bool(p[1] > 0), "the weight of the second key", "> 0", p[1])
        check_close(p, entmax(-torch.tensor([0.0, 1.9, 2.5, 3.0]), 1.5), "plan", atol=1e-10)
    with h.case("a large eps (100) gives a plan without zeros"):
        p = f(C[1], 100.0)
        check(torch.all(p > 0), "smallest weight", "> 0", p.min())
    with h.case("costs shifted by 1000 give the same plan"):
        check_close(f(C + 1000.0, 0.7), f(C, 0.7), "plan of C + 1000", atol=1e-10)


# ---------------------------------------------------------------- Task 7


def value_derivatives(h):
    """Variant 1: the temperature derivatives of the l2-regularized value; variant 2: of the 1.5-entmax value."""
    return (_sparse_value_derivatives, _entmax15_value_derivatives)[h.variant - 1](h)


def _regularized_value(cost, eps, plan, omega):
    """<C, p> + eps Omega(p) at the library's plan, forbidden keys left out; and the plan."""
    p = plan(cost, eps)
    return torch.where(p > 0, p * cost, 0.0).sum(-1) + eps * omega(p).sum(-1), p


def _against_differences(h, f, plan, omega, name):
    """F, F' and F'' against central differences of the library's F; the differences, on the rows whose support is
    the same at eps - 2 step and eps + 2 step (F'' may jump where a key enters the support, and a difference
    across that point is off by the step times the jump); the step is 1e-4 eps, 1e-5 eps for F'."""
    g = h.rng()
    C = torch.randn(4, 5, 7, generator=g)
    C[2, :, 3] = float("inf")
    for eps in (0.1, 0.7, 5.0):
        step = 1e-4 * eps
        with h.case(f"a (4, 5, 7) batch with a forbidden key, eps = {eps}: F, F' and F'' against central differences "
                    f"of F computed with attnopt's {name}"):
            F0, _ = _regularized_value(C, eps, plan, omega)
            up, _ = _regularized_value(C, eps + step, plan, omega)
            down, _ = _regularized_value(C, eps - step, plan, omega)
            _, p_far_up = _regularized_value(C, eps + 2 * step, plan, omega)
            _, p_far_down = _regularized_value(C, eps - 2 * step, plan, omega)
            stable = ((p_far_up > 0) == (p_far_down > 0)).all(-1)
            found = f(C, eps)
            check_close(found[0], F0, "F", atol=1e-10)
            # F' by a step of 1e-5 eps: a weight of 1e-4 just inside the support makes the third derivative large
            up_near, _ = _regularized_value(C, eps + step / 10, plan, omega)
            down_near, _ = _regularized_value(C, eps - step / 10, plan, omega)
            check_close(found[1][stable], ((up_near - down_near) / (step / 5))[stable], "F' (where the support is stable)",
                        atol=2e-8)
            check_close(found[2][stable], ((up - 2 * F0 + down) / step**2)[stable], "F'' (where the support is stable)",
                        atol=1e-5 / eps**2)
    with h.case("costs shifted by 1000: F shifts by 1000, its derivatives do not move"):
        base, shifted = f(C, 0.4), f(C + 1000.0, 0.4)
        check_close(shifted[0] - base[0], torch.full((4, 5), 1000.0), "F(C + 1000) - F(C)", atol=1e-9)
        check_close(shifted[1], base[1], "F'", atol=1e-9)
        check_close(shifted[2], base[2], "F''", atol=1e-8)
    return C


def _sparse_value_derivatives(h):
    from attnopt.transforms import sparsemax

    f = h.student("sparse_value_derivatives")
    C = _against_differences(h, f, lambda c, e: sparsemax(-c / e), lambda p: p * p / 2, "sparsemax")
    with h.case("a large eps: F' tends to 1 / (2 m') over the m' allowed keys"):
        check_close(f(C[2, 0], 1e6)[1], torch.tensor(1 / 12), "F'", atol=1e-6)
    with h.case("a gap of more than eps between the two smallest costs: the plan is one-hot, F' = 1/2 and F'' = 0"):
        _, dF, d2F = f(torch.tensor([0.0, 1.5, 2.0, float("inf")]), 1.0)
        check_close(dF, torch.tensor(0.5), "F'", atol=1e-14)
        check_close(d2F, torch.tensor(0.0), "F''", atol=1e-14)
    with h.case("costs equal on the support (the others forbidden): F'' = 0"):
        flat = torch.tensor([0.8, float("inf"), 0.8, 0.8, float("inf")])
        check_close(f(flat, 0.5)[2], torch.tensor(0.0), "F''", atol=1e-12)
        check_close(f(flat, 0.5)[1], torch.tensor(1 / 6), "F'", atol=1e-12)


def _entmax15_value_derivatives(h):
    from attnopt.transforms import entmax

    f = h.student("entmax15_value_derivatives")
    C = _against_differences(h, f, lambda c, e: entmax(-c / e, 1.5), lambda p: (p**1.5 - p) / 0.75, "entmax (alpha = 1.5)")
    with h.case("a large eps: F' tends to (4/3)(m'^(-1/2) - 1) over the m' allowed keys"):
        check_close(f(C[2, 0], 1e6)[1], torch.tensor(4 / 3 * (6**-0.5 - 1)), "F'", atol=1e-6)
    with h.case("a gap of more than 2 eps between the two smallest costs: the plan is one-hot, F' = 0 = F''"):
        _, dF, d2F = f(torch.tensor([0.0, 2.5, 3.0, float("inf")]), 1.0)
        check_close(dF, torch.tensor(0.0), "F'", atol=1e-14)
        check_close(d2F, torch.tensor(0.0), "F''", atol=1e-14)
    with h.case("costs equal on the support (the others forbidden): F'' = 0"):
        flat = torch.tensor([0.8, float("inf"), 0.8, 0.8, float("inf")])
        check_close(f(flat, 0.5)[2], torch.tensor(0.0), "F''", atol=1e-12)
        check_close(f(flat, 0.5)[1], torch.tensor(4 / 3 * (3**-0.5 - 1)), "F'", atol=1e-12)
