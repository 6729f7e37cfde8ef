"""The hidden checks of the variants of Assignment 4 (``assignments/variants/ch4_continuous.py``).

``hidden_checks.py`` runs the function named after the task when the course drew a variant k >= 1 of
it (``h.variant``; its parameters are ``h.params``). Like ``hidden_checks.py``, this file is public:
the inputs are drawn from the course secret, the properties checked are these.
"""

from __future__ import annotations

import math

import torch

from coursework import check, check_close, check_shape


def continuous_softmax_1d(h):
    """Variant 1: the Jacobian of 1D continuous softmax in theta; variant 2: its backward pass to (mu, sigma^2)."""
    return (_softmax_jacobian, _softmax_backward)[h.variant - 1](h)


def tp_threshold(h):
    """Variant 1: the covariance of the support and its inverse; variant 2: the support's matrix and its inverse."""
    return (_support_covariance, _support_matrix)[h.variant - 1](h)


def continuous_sparsemax_1d(h):
    """Variant 1: the Jacobian of 1D continuous sparsemax in theta; variant 2: 1D continuous 1.5-entmax."""
    return (_sparsemax_jacobian, _entmax15)[h.variant - 1](h)


# ---------------------------------------------------------------- Task 1


def _theta_jacobian(forward, mu, sigma2, n):
    """d r / d theta for theta = (mu / sigma2, -1 / (2 sigma2)), by autograd through ``forward(mu, sigma2)``
    (elementwise over the leading shape of mu and sigma2): two tensors of shape mu.shape + (n,)."""
    theta1 = (mu / sigma2).requires_grad_(True)
    theta2 = (-0.5 / sigma2).requires_grad_(True)
    r = forward(-theta1 / (2 * theta2), -0.5 / theta2)
    rows = [torch.autograd.grad(r[..., j].sum(), (theta1, theta2), retain_graph=True) for j in range(n)]
    return torch.stack([a for a, _ in rows], -1), torch.stack([b for _, b in rows], -1)


def _softmax_jacobian(h):
    from attnopt.continuous import continuous_softmax
    from attnopt.value_functions import GaussianRBF

    f, g = h.student("continuous_softmax_1d_jacobian"), h.rng()
    centers, widths = torch.linspace(0, 1, 7), torch.linspace(0.05, 0.2, 7)
    basis = GaussianRBF(centers, widths)
    forward = lambda m, v: continuous_softmax(m[..., None], v[..., None, None], basis)
    mus = torch.rand(4, 5, generator=g)
    sigma2s = 0.01 + 0.2 * torch.rand(4, 5, generator=g)
    with h.case("a (4, 5) batch of Gaussians, 7 basis functions: the derivatives of continuous_softmax in theta (autograd)"):
        expected_t, expected_tt = _theta_jacobian(forward, mus, sigma2s, 7)
        J_t, J_tt = f(mus, sigma2s, centers, widths)
        check_shape(J_t, (4, 5, 7), "cov_p(psi_j, t)")
        check_shape(J_tt, (4, 5, 7), "cov_p(psi_j, t^2)")
        check_close(J_t, expected_t, "cov_p(psi_j, t)", atol=1e-10)
        check_close(J_tt, expected_tt, "cov_p(psi_j, t^2)", atol=1e-10)
    with h.case("basis functions of width 1e-4 sample the density: cov_p(psi_j, t) = p(c_j) (c_j - mu), "
                "cov_p(psi_j, t^2) = p(c_j) (c_j^2 - sigma^2 - mu^2)"):
        mu, s2 = float(torch.rand(1, generator=g)), 0.05 + 0.1 * float(torch.rand(1, generator=g))
        c = torch.linspace(0, 1, 5)
        p_c = torch.exp(-0.5 * (c - mu) ** 2 / s2) / math.sqrt(2 * math.pi * s2)
        J_t, J_tt = f(torch.tensor(mu), torch.tensor(s2), c, torch.full((5,), 1e-4))
        check_close(J_t, p_c * (c - mu), "cov_p(psi_j, t)", atol=1e-6)
        check_close(J_tt, p_c * (c**2 - s2 - mu**2), "cov_p(psi_j, t^2)", atol=1e-6)
    with h.case("a mean 1000 away from every basis function: both covariances are 0, not nan"):
        J_t, J_tt = f(torch.tensor([1000.0, -1000.0]), torch.tensor([0.1, 0.02]), centers, widths)
        check_close(J_t, torch.zeros(2, 7), "cov_p(psi_j, t)", atol=1e-14)
        check_close(J_tt, torch.zeros(2, 7), "cov_p(psi_j, t^2)", atol=1e-14)


def _softmax_backward(h):
    from attnopt.continuous import continuous_softmax
    from attnopt.value_functions import GaussianRBF

    f, g = h.student("continuous_softmax_1d_backward"), h.rng()
    centers, widths = torch.linspace(0, 1, 7), torch.linspace(0.05, 0.2, 7)
    basis = GaussianRBF(centers, widths)
    with h.case("a (4, 5) batch of Gaussians, 7 basis functions: autograd through continuous_softmax"):
        mus = torch.rand(4, 5, generator=g).requires_grad_(True)
        sigma2s = (0.01 + 0.2 * torch.rand(4, 5, generator=g)).requires_grad_(True)
        grad_r = torch.randn(4, 5, 7, generator=g)
        r = continuous_softmax(mus[..., None], sigma2s[..., None, None], basis)
        d_mu, d_sigma2 = torch.autograd.grad((r * grad_r).sum(), (mus, sigma2s))
        found_mu, found_sigma2 = f(mus.detach(), sigma2s.detach(), centers, widths, grad_r)
        check_shape(found_mu, (4, 5), "dL/dmu")
        check_shape(found_sigma2, (4, 5), "dL/dsigma2")
        check_close(found_mu, d_mu, "dL/dmu", atol=1e-10)
        check_close(found_sigma2, d_sigma2, "dL/dsigma2", atol=1e-10)
    with h.case("a non-linear loss of the context c = B r, (3,) batch, d = 4: autograd through continuous_softmax"):
        mus = torch.rand(3, generator=g).requires_grad_(True)
        sigma2s = (0.02 + 0.1 * torch.rand(3, generator=g)).requires_grad_(True)
        B = torch.randn(4, 7, generator=g)
        r = continuous_softmax(mus[..., None], sigma2s[..., None, None], basis)
        r_leaf = r.detach().requires_grad_(True)
        loss = lambda q: torch.sin(q @ B.T).pow(2).sum()
        d_mu, d_sigma2 = torch.autograd.grad(loss(r), (mus, sigma2s))
        (grad_r,) = torch.autograd.grad(loss(r_leaf), r_leaf)
        found_mu, found_sigma2 = f(mus.detach(), sigma2s.detach(), centers, widths, grad_r)
        check_close(found_mu, d_mu, "dL/dmu", atol=1e-10)
        check_close(found_sigma2, d_sigma2, "dL/dsigma2", atol=1e-10)
    with h.case("a mean 1000 away from every basis function: both derivatives are 0, not nan"):
        found = f(torch.tensor([1000.0, -1000.0]), torch.tensor([0.1, 0.02]), centers, widths, torch.randn(2, 7, generator=g))
        check_close(torch.stack(found), torch.zeros(2, 2), "(dL/dmu, dL/dsigma2)", atol=1e-14)


# ---------------------------------------------------------------- Task 2


def _spd(g, shape, D, ridge=0.2):
    A = torch.randn(*shape, D, D, generator=g)
    return A @ A.transpose(-1, -2) + ridge * torch.eye(D)


def _grid_moments(g, family="truncated_paraboloid"):
    """Weights on a 12 x 12 grid, their covariance, and the scale attnopt's moment_match gives them."""
    from attnopt.continuous import moment_match

    x = torch.linspace(0, 1, 12)
    locations = torch.stack(torch.meshgrid(x, x, indexing="ij"), -1).reshape(-1, 2)
    w = torch.softmax(3 * torch.randn(3, 144, generator=g), dim=-1)
    mu, Sigma = moment_match(w, locations, family=family)
    centered = locations - mu[:, None, :]
    return torch.einsum("bl,bla,blc->bac", w, centered, centered), Sigma


def _support_covariance(h):
    from attnopt.continuous import truncated_paraboloid_threshold

    f_lam, f_cov, f_inv = (h.student(n) for n in h.params["functions"])
    g = h.rng()
    for D in (1, 2, 3, 4):
        Sigma = _spd(g, (4,), D)
        lam = truncated_paraboloid_threshold(Sigma)
        with h.case(f"a (4, {D}, {D}) batch of scales: the threshold agrees with truncated_paraboloid_threshold"):
            check_close(f_lam(Sigma), lam, "lambda", atol=1e-13)
        with h.case(f"a (4, {D}, {D}) batch of scales: the support covariance is R^2 Sigma / (D + 2), R^2 = -2 lambda"):
            check_close(f_cov(Sigma), -2 * lam[..., None, None] * Sigma / (D + 2), "covariance of the support", atol=1e-12)
        with h.case(f"D = {D}: the support covariance of the scale found for a covariance is that covariance"):
            cov = _spd(g, (3,), D, ridge=0.05)
            check_close(f_cov(f_inv(cov)), cov, "covariance of the support", atol=1e-12)
    with h.case("the scale whose support has covariance (D + 4) / (D + 2) times that of grid weights is moment_match's"):
        cov, Sigma_lib = _grid_moments(g)
        check_close(f_inv(cov * 6 / 4), Sigma_lib, "scale", atol=1e-10)
    with h.case("D = 3, covariances of size 1e-4 and 100 do not overflow"):
        cov = _spd(g, (), 3, ridge=0.5)
        for c in (1e-4, 100.0):
            check_close(f_cov(f_inv(c * cov)) / c, cov, f"covariance of the support of the scale for {c:g} cov, over {c:g}", atol=1e-10)


def _support_matrix(h):
    from attnopt.continuous import truncated_paraboloid_threshold

    f_lam, f_supp, f_inv = (h.student(n) for n in h.params["functions"])
    g = h.rng()
    for D in (1, 2, 3, 4):
        Sigma = _spd(g, (4,), D)
        lam = truncated_paraboloid_threshold(Sigma)
        with h.case(f"a (4, {D}, {D}) batch of scales: the threshold agrees with truncated_paraboloid_threshold"):
            check_close(f_lam(Sigma), lam, "lambda", atol=1e-13)
        with h.case(f"a (4, {D}, {D}) batch of scales: the support matrix is -2 lambda Sigma"):
            check_close(f_supp(Sigma), -2 * lam[..., None, None] * Sigma, "support matrix", atol=1e-12)
        with h.case(f"D = {D}: the support of the scale found for a matrix M is M"):
            M = _spd(g, (3,), D, ridge=0.05)
            check_close(f_supp(f_inv(M)), M, "support matrix", atol=1e-12)
    with h.case("D = 2, a disk of radius rho = 0.3: the scale is pi rho^4 / 4 times the identity"):
        check_close(f_inv(0.09 * torch.eye(2)), math.pi * 0.3**4 / 4 * torch.eye(2), "scale", atol=1e-14)
    with h.case("the scale whose support is (D + 4) times the covariance of grid weights is moment_match's (Theorem 4.1)"):
        cov, Sigma_lib = _grid_moments(g)
        check_close(f_inv(6 * cov), Sigma_lib, "scale", atol=1e-10)
    with h.case("D = 1, intervals of half-widths 1e-3 and 100: the scale is 2 a^3 / 3"):
        a = torch.tensor([1e-3, 100.0])
        check_close(f_inv(a[:, None, None] ** 2).reshape(2) / (2 * a**3 / 3), torch.ones(2), "scale over 2 a^3 / 3", atol=1e-12)


# ---------------------------------------------------------------- Task 3


def _sparsemax_jacobian(h):
    from attnopt.continuous import continuous_sparsemax, truncated_paraboloid_threshold
    from attnopt.value_functions import GaussianRBF

    f, g = h.student("continuous_sparsemax_1d_jacobian"), h.rng()
    centers, widths = torch.linspace(0, 1, 9), torch.full((9,), 0.07)
    basis = GaussianRBF(centers, widths)
    forward = lambda m, v: continuous_sparsemax(m.reshape(1), v.reshape(1, 1), basis)
    for mu, s2 in ((float(torch.rand(1, generator=g)), 0.01), (0.1, 0.3), (0.95, 0.002)):
        with h.case(f"mu = {mu:.3f}, scale {s2}, nine basis functions of width 0.07: the derivatives of continuous_sparsemax "
                    "in theta (autograd)"):
            expected_t, expected_tt = _theta_jacobian(forward, torch.tensor(mu), torch.tensor(s2), 9)
            J_t, J_tt = f(mu, s2, centers, widths)
            check_shape(J_t, (9,), "cov_0(psi_j, t)")
            check_shape(J_tt, (9,), "cov_0(psi_j, t^2)")
            check_close(J_t, expected_t, "cov_0(psi_j, t)", atol=1e-9)
            check_close(J_tt, expected_tt, "cov_0(psi_j, t^2)", atol=1e-9)
    with h.case("basis functions of width 0.01 deep inside the support integrate to one over it: "
                "cov_0(psi_j, t) = c_j - mu and cov_0(psi_j, t^2) = c_j^2 + w^2 - mu^2 - a^2 / 3"):
        mu, s2 = 0.5, 0.03 + 0.05 * float(torch.rand(1, generator=g))
        a2 = -2 * float(truncated_paraboloid_threshold(torch.tensor([[s2]]))) * s2
        c = mu + 0.3 * math.sqrt(a2) * (2 * torch.rand(4, generator=g) - 1)
        J_t, J_tt = f(mu, s2, c, torch.full((4,), 0.01))
        check_close(J_t, c - mu, "cov_0(psi_j, t)", atol=1e-10)
        check_close(J_tt, c**2 + 0.01**2 - mu**2 - a2 / 3, "cov_0(psi_j, t^2)", atol=1e-10)


def _entmax15_reference(mu, s2, centers, widths):
    """r by scipy: the threshold by brentq on the mass, the integrals by quad over the support."""
    import scipy.integrate
    import scipy.optimize

    density = lambda t, b: 0.25 * max(b - (t - mu) ** 2 / (2 * s2), 0.0) ** 2
    support = lambda b: (mu - math.sqrt(2 * b * s2), mu + math.sqrt(2 * b * s2))
    mass = lambda b: scipy.integrate.quad(density, *support(b), args=(b,), epsabs=1e-15, epsrel=1e-13)[0]
    b = scipy.optimize.brentq(lambda b: mass(b) - 1, 1e-4, 1e4, xtol=1e-15, rtol=1e-15)
    normal = lambda t, c, s: math.exp(-0.5 * ((t - c) / s) ** 2) / (math.sqrt(2 * math.pi) * s)
    lo, hi = support(b)
    return torch.tensor([scipy.integrate.quad(lambda t: density(t, b) * normal(t, c, s), lo, hi,
                                              points=[min(max(c, lo), hi)], epsabs=1e-14, epsrel=1e-12, limit=200)[0]
                         for c, s in zip(centers.tolist(), widths.tolist())])


def _entmax15(h):
    f, g = h.student("continuous_entmax15_1d"), h.rng()
    centers, widths = torch.linspace(0, 1, 9), torch.full((9,), 0.07)
    for mu, s2 in ((float(torch.rand(1, generator=g)), 0.01), (0.1, 0.3), (0.95, 0.002)):
        with h.case(f"mu = {mu:.3f}, scale {s2}, nine basis functions of width 0.07: against scipy (threshold by brentq, "
                    "integrals by quad)"):
            r = f(mu, s2, centers, widths)
            check_shape(r, (9,), "r")
            check_close(r, _entmax15_reference(mu, s2, centers, widths), "r", atol=1e-10)
    with h.case("a basis function of width 10^4 sees the mass of p, which is one: r = psi(mu)"):
        mu, s2 = float(torch.rand(1, generator=g)), 0.02 + 0.1 * float(torch.rand(1, generator=g))
        r = f(mu, s2, torch.tensor([mu]), torch.tensor([1e4]))
        check_close(torch.as_tensor(r).reshape(()) * math.sqrt(2 * math.pi) * 1e4, torch.tensor(1.0),
                    "r / psi(mu) (the mass of p)", atol=1e-9)
    with h.case("a scale of 1e-4: a narrow density, with basis functions of width 0.003"):
        mu = float(torch.rand(1, generator=g))
        c = mu + 0.02 * (2 * torch.rand(5, generator=g) - 1)
        w = torch.full((5,), 0.003)
        check_close(f(mu, 1e-4, c, w), _entmax15_reference(mu, 1e-4, c, w), "r", atol=1e-8)


# ---------------------------------------------------------------- Task 4


def weighted_em_step(h):
    """Variant 1: a shared covariance; variant 2: isotropic components. Both against one step of attnopt's
    weighted_em started from the same (tied, or isotropic) covariances."""
    from attnopt.mixture import weighted_em

    tied = h.variant == 1
    f, g = h.student(h.params["function"]), h.rng()
    L, K = 45, 3
    points = torch.cat([0.1 * torch.randn(15, 2, generator=g) + c for c in torch.rand(3, 2, generator=g)])
    weights = 5 * torch.rand(L, generator=g)  # not summing to one
    # started near data points, as in the public variant's checks (a component far from every point is ill-conditioned)
    means0 = points[torch.randperm(L, generator=g)[:K]] + 0.05 * torch.randn(K, 2, generator=g)
    mixing0 = (torch.rand(K, generator=g) + 0.5)
    mixing0 = mixing0 / mixing0.sum()
    if tied:
        A = torch.randn(2, 2, generator=g)
        second0 = 0.02 * (A @ A.T / 2 + torch.eye(2))  # the shared covariance
        covs0 = second0.expand(K, 2, 2).clone()
    else:
        second0 = 0.02 + 0.06 * torch.rand(K, generator=g)  # the variances
        covs0 = second0[:, None, None] * torch.eye(2)
    what = "shared covariance" if tied else "variances"
    with h.case("unnormalized weights: the means and mixing weights of one step agree with attnopt's weighted_em "
                f"(one iteration, from the same covariances), and the {what} are "
                + ("the mixing-weighted average of its covariances" if tied else "the traces of its covariances over D")):
        lib = weighted_em(points, weights / weights.sum(), K, n_iter=1,
                          init={"means": means0, "covariances": covs0, "mixing": mixing0}, tol=None, cov_floor=0.0)
        means, second, mixing = f(points, weights, means0, second0, mixing0)
        check_shape(second, (2, 2) if tied else (K,), what)
        check_close(means, lib.means, "means", atol=1e-11)
        check_close(mixing, lib.mixing, "mixing weights", atol=1e-11)
        expected = (lib.mixing[:, None, None] * lib.covariances).sum(0) if tied else \
            torch.diagonal(lib.covariances, dim1=-2, dim2=-1).sum(-1) / 2
        check_close(second, expected, what, atol=1e-11)
    with h.case("scaling all weights by 7 does not change the step"):
        for a, b, name in zip(f(points, 7.0 * weights, means0, second0, mixing0), f(points, weights, means0, second0, mixing0),
                              ("means", what, "mixing weights")):
            check_close(a, b, name, atol=1e-12)
    with h.case("one component (K = 1): one step is the weighted mean and the weighted covariance (or its trace over D)"):
        w = weights / weights.sum()
        mean = w @ points
        cov = torch.einsum("l,la,lb->ab", w, points - mean, points - mean)
        start = (torch.zeros(1, 2), torch.eye(2) if tied else torch.ones(1), torch.ones(1))
        means, second, mixing = f(points, weights, *start)
        check_close(means, mean[None], "means", atol=1e-12)
        check_close(second, cov if tied else torch.trace(cov).reshape(1) / 2, what, atol=1e-12)
        check_close(mixing, torch.ones(1), "mixing weights", atol=1e-12)
    with h.case("a point 30 standard deviations from every component: the E-step in log space keeps the step finite"):
        far = torch.cat([points, points.mean(0, keepdim=True) + 30 * math.sqrt(0.08) * torch.tensor([[1.0, 1.0]])])
        step = f(far, torch.cat([weights, torch.ones(1)]), means0, second0, mixing0)
        check(all(bool(torch.isfinite(x).all()) for x in step), "the new means, " + what + " and mixing weights",
              "finite numbers", torch.cat([x.reshape(-1) for x in step]))


# ---------------------------------------------------------------- Task 7


def tp_squared_integral(h):
    """Variant 1: int p^alpha for any alpha > 0; variant 2: the differential entropy -int p log p."""
    return (_power_integral, _entropy)[h.variant - 1](h)


def _radial(Sigma, g):
    """int g(p(t)) dt for the truncated paraboloid with scale Sigma (D x D), by scipy's radial quadrature."""
    import scipy.integrate

    from attnopt.continuous import truncated_paraboloid_threshold

    D = Sigma.shape[-1]
    a = float(-truncated_paraboloid_threshold(Sigma))
    sphere = 2 * math.pi ** (D / 2) / math.gamma(D / 2)
    radial = scipy.integrate.quad(lambda r: g(a - r * r / 2) * r ** (D - 1), 0, math.sqrt(2 * a), epsabs=1e-14, epsrel=1e-13,
                                  limit=200)[0]
    return sphere * radial * math.sqrt(float(torch.linalg.det(Sigma)))


def _power_integral(h):
    from attnopt.continuous import truncated_paraboloid_threshold

    f, g = h.student("tp_power_integral"), h.rng()
    for D in (1, 2, 3, 4):
        Sigma = _spd(g, (3,), D)
        alpha = 0.3 + 3 * float(torch.rand(1, generator=g))
        with h.case(f"a (3, {D}, {D}) batch of scales, alpha = {alpha:.3f}: a radial quadrature of p^alpha (scipy.integrate.quad)"):
            expected = torch.tensor([_radial(Sigma[k], lambda p: p**alpha) for k in range(3)])
            found = f(Sigma, alpha)
            check_shape(found, (3,), "the integral of p^alpha")
            check_close(found, expected, "the integral of p^alpha", atol=1e-10)
    Sigma = _spd(g, (2,), 3)
    lam = truncated_paraboloid_threshold(Sigma)
    with h.case("D = 3: alpha = 1 gives the mass, 1, and alpha = 2 gives -4 lambda / (D + 4)"):
        check_close(torch.as_tensor(f(Sigma, 1.0)), torch.ones(2), "the integral of p", atol=1e-12)
        check_close(torch.as_tensor(f(Sigma, 2.0)), -4 * lam / 7, "the integral of p^2", atol=1e-12)
    with h.case("D = 2, alpha = 2.5: scaling the scale by c = 3 multiplies the integral by c^(-D (alpha - 1) / (D + 2))"):
        S = _spd(g, (), 2, ridge=0.3)
        check_close(torch.as_tensor(f(3 * S, 2.5)).reshape(()), torch.as_tensor(f(S, 2.5)).reshape(()) * 3 ** (-0.75),
                    "the integral for 3 Sigma", atol=1e-12)


def _entropy(h):
    f, g = h.student("tp_entropy"), h.rng()
    for D in (1, 2, 3, 4):
        Sigma = _spd(g, (3,), D)
        with h.case(f"a (3, {D}, {D}) batch of scales: a radial quadrature of -p log p (scipy.integrate.quad)"):
            expected = torch.tensor([_radial(Sigma[k], lambda p: -p * math.log(p) if p > 0 else 0.0) for k in range(3)])
            found = f(Sigma)
            check_shape(found, (3,), "the entropy")
            check_close(found, expected, "the entropy", atol=1e-10)
    with h.case("D = 2: scaling the scale by c = 3 adds D / (D + 2) log c to the entropy"):
        S = _spd(g, (), 2, ridge=0.3)
        check_close(torch.as_tensor(f(3 * S)).reshape(()), torch.as_tensor(f(S)).reshape(()) + 0.5 * math.log(3),
                    "the entropy for 3 Sigma", atol=1e-12)
    with h.case("D = 1, variance v = 0.02: the Gaussian of the same variance has 0.04617 nats more (to 1e-4)"):
        v = 0.02
        found = torch.as_tensor(f(torch.tensor([[2 / 3 * (5 * v) ** 1.5]]))).reshape(())
        check_close(found, torch.tensor(0.5 * math.log(2 * math.pi * math.e * v) - 0.04617), "the entropy", atol=1e-4)
