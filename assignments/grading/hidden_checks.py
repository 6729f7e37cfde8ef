"""The hidden checks of the course's assignments, drawn from the course's secret.

Each graded test cell ends with the two lines

    from coursework import hidden_checks
    hidden_checks("<task>", globals())

(released as they are: outside the course directory they only print that the hidden checks run
when the notebook is graded),

which runs the function ``<task>`` below on the student's code. Every random input is drawn from a
generator seeded by the course's secret (``ATTNOPT_COURSE_SECRET``, or the file ``course_secret`` of
the course directory, which ``tools/assignments.py`` creates and git never sees), so the numbers a
submission is checked on are not in the public repository, and differ from one course to the next.
The properties checked are public: this file is. Each check has a label that the student sees in
the feedback with the expected and the found value; the code of this file is not shown.

``tools/assignments.py`` copies this file to ``<course>/grading/`` (not into the release), and
``coursework.hidden_checks`` loads it from there while grading.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import types
from pathlib import Path

import numpy as np
import torch

from coursework import check, check_close, check_one_hot, check_shape


def _varied(assignment: str):
    """Mark the checks of a task that has variants (``assignments/variants/<assignment>.py``).

    The function below checks variant 0, the public notebook's task. A course that drew variant
    k >= 1 of it (``h.variant``, with its ``h.params``) runs instead the function of the same name in
    ``variant_checks_<assignment>.py``, which ``tools/assignments.py`` copies next to this file.
    """
    def decorate(checks):
        @functools.wraps(checks)
        def dispatch(h):
            if not h.variant:
                return checks(h)
            return getattr(_variant_checks(assignment), checks.__name__)(h)
        return dispatch
    return decorate


def _variant_checks(assignment: str) -> types.ModuleType:
    path = Path(__file__).with_name(f"variant_checks_{assignment}.py")
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing; run tools/assignments.py on the course directory")
    spec = importlib.util.spec_from_file_location(f"variant_checks_{assignment}", path)
    module = importlib.util.module_from_spec(spec)
    module.shared = types.SimpleNamespace(**globals())  # this file's helpers, for the variants' checks
    spec.loader.exec_module(module)
    return module


def _normalize(w):
    return w / w.sum(-1, keepdim=True)


def _hermite_grid(mu, cov, n=40):
    """An n x n Gauss-Hermite grid of N(mu, cov) in 2-D: (templates, weights summing to one)."""
    x, w = np.polynomial.hermite.hermgauss(n)
    nodes = math.sqrt(2) * torch.tensor(np.stack(np.meshgrid(x, x, indexing="ij"), -1).reshape(-1, 2))
    weights = torch.tensor(np.outer(w, w).reshape(-1))
    return mu + nodes @ torch.linalg.cholesky(cov).T, weights / weights.sum()


# ---------------------------------------------------------------- chapter 1: the Fenchel dual


@_varied("ch1_fenchel_dual")
def gaussian_lambda_star(h):
    from attnopt.fenchel import gaussian_dual_maximizer, solve_dual

    f, g = h.student("gaussian_lambda_star"), h.rng()
    d = 2
    A = torch.randn(d, d, generator=g)
    cov = A @ A.T + 0.5 * torch.eye(d)
    mus, bs = torch.randn(4, 5, d, generator=g), torch.randn(4, 5, d, generator=g)
    for a in (0.1, 1.0, 3.0):
        with h.case(f"a (4, 5, 2) batch with a full covariance, alpha = {a}, agrees with gaussian_dual_maximizer"):
            check_close(f(mus, bs, a, cov), gaussian_dual_maximizer(mus, bs, a, cov=cov), "lambda*")
        with h.case(f"a (4, 5, 2) batch with cov=None (the identity), alpha = {a}"):
            check_close(f(mus, bs, a), gaussian_dual_maximizer(mus, bs, a), "lambda*")
    with h.case("the discrete dual on a 40 x 40 Gauss-Hermite grid of N(mu, cov) has the same maximizer"):
        mu, b, alpha = mus[0, 0], bs[0, 0], 0.7
        templates, weights = _hermite_grid(mu, cov)
        check_close(f(mu, b, alpha, cov), solve_dual(b, templates, weights, alpha), "lambda*", atol=1e-10)


def _plain_newton_converges(b, T, u, alpha, solve_dual, n_iter=30) -> bool:
    """Whether 30 undamped Newton steps on the dual from alpha (b - T^T u) reach solve_dual's maximizer."""
    lam = alpha * (b - u @ T)
    eye = torch.eye(T.shape[-1], dtype=T.dtype)
    for _ in range(n_iter):
        p = torch.softmax(torch.log(u) + T @ lam, dim=-1)
        hess = -eye / alpha - T.T @ (torch.diag(p) - torch.outer(p, p)) @ T
        lam = lam - torch.linalg.solve(hess, b - lam / alpha - p @ T)
    return bool(torch.isfinite(lam).all()) and bool((lam - solve_dual(b, T, u, alpha)).abs().max() < 1e-10)


def _evidence_where_newton_converges(draw, T, u, alpha, solve_dual):
    for _ in range(100):  # one draw in a thousand is redrawn: 100 tries never run out
        b = draw()
        if _plain_newton_converges(b, T, u, alpha, solve_dual):
            return b
    raise RuntimeError("100 evidences drawn, and undamped Newton diverged on each")


@_varied("ch1_fenchel_dual")
def newton_dual(h):
    from attnopt.fenchel import solve_dual

    f, g = h.student("newton_dual"), h.rng()
    n, d = 8, 3
    T = torch.randn(n, d, generator=g)
    u = _normalize(torch.rand(n, generator=g))
    # The task promises that plain Newton from alpha z is enough here. Undamped Newton is not globally
    # convergent: for this draw it diverges about once in a thousand keys (and on 5 % of them at
    # alpha = 1.5), so an evidence on which it diverges is drawn again.
    u_masked = u.clone()
    u_masked[:3] = 0.0
    u_masked = _normalize(u_masked)
    b2 = _evidence_where_newton_converges(lambda: u_masked @ T + torch.randn(d, generator=g), T, u_masked, 0.8, solve_dual)
    with h.case("a preference with three zeros (masked templates), alpha = 0.8, agrees with solve_dual"):
        check_close(f(b2, T, u_masked, 0.8), solve_dual(b2, T, u_masked, 0.8), "lambda*", atol=1e-9)
    b3 = _evidence_where_newton_converges(lambda: u @ T + 0.5 * torch.randn(d, generator=g), T, u, 1.0, solve_dual)
    with h.case("another evidence, alpha = 1.0, agrees with solve_dual"):
        check_close(f(b3, T, u, 1.0), solve_dual(b3, T, u, 1.0), "lambda*", atol=1e-9)
    with h.case("small alpha: |lambda* - alpha z| / |alpha z| shrinks like alpha (alpha = 0.1, 0.01, 0.001)"):
        z = torch.randn(d, generator=g)
        devs = torch.tensor([((f(u @ T + z, T, u, a) - a * z).norm() / (a * z).norm()).item() for a in (1e-1, 1e-2, 1e-3)])
        check(bool(devs[0] > devs[1] > devs[2]) and devs[2] < 5e-3, "relative deviations",
              "decreasing, the last below 0.005", devs)


@_varied("ch1_fenchel_dual")
def dual_sensitivity(h):
    from attnopt.fenchel import solve_dual

    f, g = h.student("dual_sensitivity"), h.rng()
    n, d, step = 10, 3, 1e-5
    T = torch.randn(n, d, generator=g)
    u = _normalize(torch.rand(n, generator=g) + 0.05)
    u_masked = u.clone()
    u_masked[[0, 5]] = 0.0
    u_masked = _normalize(u_masked)
    for alpha, pref, which in ((0.3, u, "full support"), (1.5, u, "full support"), (0.9, u_masked, "two masked templates")):
        b = pref @ T + torch.randn(d, generator=g)
        with h.case(f"{which}, alpha = {alpha}: agrees with central differences of solve_dual"):
            up, down = solve_dual(b, T, pref, alpha + step), solve_dual(b, T, pref, alpha - step)
            weights = lambda lam: torch.softmax(torch.log(pref) + T @ lam, dim=-1)
            dlam, dp = f(solve_dual(b, T, pref, alpha), T, pref, alpha)
            check_close(dlam, (up - down) / (2 * step), "d lambda*/d alpha", atol=1e-6)
            check_close(dp, (weights(up) - weights(down)) / (2 * step), "dp/d alpha", atol=1e-6)
            check(bool(torch.all(dp[pref == 0] == 0)), "dp/d alpha at the masked templates", "exactly 0", dp[pref == 0])
    with h.case("a 40 x 40 Gauss-Hermite grid of N(mu, cov): the Gaussian closed form (I + alpha cov)^-2 z"):
        A = torch.randn(2, 2, generator=g)
        cov = A @ A.T + 0.5 * torch.eye(2)
        mu, z, alpha = torch.randn(2, generator=g), torch.randn(2, generator=g), 0.7
        templates, grid_u = _hermite_grid(mu, cov)
        lam = solve_dual(mu + z, templates, grid_u, alpha)
        inv = torch.linalg.inv(torch.eye(2) + alpha * cov)
        check_close(f(lam, templates, grid_u, alpha)[0], inv @ inv @ z, "d lambda*/d alpha", atol=1e-9)
    with h.case("alpha = 1e-6: the slope is the evidence z (the small-alpha approximation is tangent)"):
        z = torch.randn(d, generator=g)
        b = u @ T + z
        dlam, _ = f(solve_dual(b, T, u, 1e-6), T, u, 1e-6)
        check_close(dlam, z, "d lambda*/d alpha", atol=1e-4)


@_varied("ch1_fenchel_dual")
def attention_weights(h):
    from attnopt.fenchel import generalized_attention

    f, g = h.student("attention_weights"), h.rng()
    B, H, n_q, n, d = 2, 3, 5, 7, 4
    q, k = torch.randn(B, H, n_q, d, generator=g), torch.randn(B, H, n, d, generator=g)
    u_rand = _normalize(torch.rand(B, H, n_q, n, generator=g))
    for a in (0.3, 1.0, 2.5):
        with h.case(f"a random preference of shape (2, 3, 5, 7), alpha = {a}, agrees with generalized_attention"):
            check_close(f(q, k, u_rand, alpha=a), generalized_attention(q, k, u_rand, alpha=a)[1], "weights")
    with h.case("only the product alpha z enters the weights"):
        check_close(f(2 * q, k, u_rand, alpha=0.25), f(q, k, u_rand, alpha=0.5), "weights with (2 z, alpha / 2)")
    with h.case("a preference of shape (7,) broadcasts to the weights"):
        u1 = _normalize(torch.rand(n, generator=g))
        check_close(f(q, k, u1, alpha=0.8), generalized_attention(q, k, u1, alpha=0.8)[1], "weights")


@_varied("ch1_fenchel_dual")
def t5_preference(h):
    from attnopt.fenchel import t5_preference as lib

    f, g = h.student("t5_preference"), h.rng()
    n_q, n = 6, 9
    bias = 2 * torch.randn(n_q, n, generator=g)
    mask = torch.rand(n_q, n, generator=g) < 0.7
    mask[:, -1] = True
    with h.case("agrees with attnopt's t5_preference"):
        check_close(f(bias, mask), lib(bias, mask), "u", atol=1e-14)
    with h.case("a bias of 700 does not overflow"):
        check_close(f(bias + 700.0, mask), lib(bias, mask), "u for bias + 700")
    with h.case("a (2, 4, 6, 9) batch of biases with a (6, 9) mask"):
        batched = f(bias.expand(2, 4, n_q, n), mask)
        check_close(batched, lib(bias, mask).expand(2, 4, n_q, n), "u")


# ---------------------------------------------------------------- chapter 2: Markov kernels


@_varied("ch2_markov_kernels")
def boltzmann_gibbs_weights(h):
    from attnopt.kernels import EmpiricalMeasure, boltzmann_gibbs

    f, g = h.student("boltzmann_gibbs_weights"), h.rng()
    points = torch.randn(3, 7, 2, generator=g)
    w_b = torch.rand(3, 7, generator=g)
    w_b[:, 0] = 0.0
    w_b = _normalize(w_b)
    log_g_b = 3 * torch.randn(3, 7, generator=g)
    log_g_b[:, 1] = float("-inf")
    ours = None
    with h.case("a (3, 7) batch with an atom of mass 0 and an atom where G = 0 agrees with boltzmann_gibbs"):
        ours = f(w_b, log_g_b)
        check_close(ours, boltzmann_gibbs(EmpiricalMeasure(points, w_b), log_potential=log_g_b).weights, "weights", atol=1e-14)
    with h.case("reweighting twice is reweighting once by the product of the potentials"):
        log_h = torch.randn(3, 7, generator=g)
        check_close(f(f(w_b, log_g_b), log_h), f(w_b, log_g_b + log_h), "twice reweighted", atol=1e-14)


@_varied("ch2_markov_kernels")
def attention_kernel_matrix(h):
    from attnopt.kernels import attention_kernel

    f, g = h.student("attention_kernel_matrix"), h.rng()
    B, M, N, d = 3, 5, 8, 4
    q, k, v = torch.randn(B, M, d, generator=g), torch.randn(B, N, d, generator=g), torch.randn(B, N, 2, generator=g)
    w = torch.rand(B, N, generator=g)
    w[:, 3] = 0.0
    w = _normalize(w)
    with h.case("key weights with a zero, scale 0.7, agree with attention_kernel"):
        check_close(f(q, k, w, scale=0.7), attention_kernel(q, k, v, key_weights=w, scale=0.7)[1], "P", atol=1e-14)
    with h.case("uniform key weights and the default scale agree with attention_kernel"):
        check_close(f(q, k), attention_kernel(q, k, v)[1], "P", atol=1e-14)
    with h.case("composing two attention kernels gives rows that sum to one"):
        P2 = f(k, torch.randn(B, 6, d, generator=g))
        check_close((f(q, k) @ P2).sum(-1), torch.ones(B, M), "row sums of P P2", atol=1e-14)


@_varied("ch2_markov_kernels")
def wasserstein1_1d(h):
    import ot

    from attnopt.kernels import EmpiricalMeasure
    from attnopt.regularity import wasserstein1

    f, g = h.student("wasserstein1_1d"), h.rng()
    x, a = torch.randn(7, generator=g), _normalize(torch.rand(7, generator=g))
    y, b = 2 * torch.randn(11, generator=g) + 0.5, _normalize(torch.rand(11, generator=g))
    with h.case("agrees with attnopt's wasserstein1"):
        lib = wasserstein1(EmpiricalMeasure(x[:, None], a), EmpiricalMeasure(y[:, None], b))
        check_close(f(x, a, y, b), lib.reshape(()), "W1")
    with h.case("agrees with the linear program with cost |x_i - y_j| (POT's exact solver)"):
        cost = (x[:, None] - y[None, :]).abs().numpy()
        check_close(f(x, a, y, b), torch.tensor(ot.emd2(a.numpy(), b.numpy(), cost)), "W1", atol=1e-10)
    with h.case("symmetric in the two measures"):
        check_close(f(y, b, x, a), f(x, a, y, b), "W1(nu, mu)")
    with h.case("zero between a measure and the same measure listed in another order"):
        perm = torch.randperm(7, generator=g)
        check_close(f(x, a, x[perm], a[perm]), torch.tensor(0.0), "W1", atol=1e-14)


@_varied("ch2_markov_kernels")
def max_entropy_tilt(h):
    from attnopt.kernels import EmpiricalMeasure, maximum_entropy_tilt

    f, g = h.student("max_entropy_tilt"), h.rng()
    n = 9
    w, s = _normalize(torch.rand(n, generator=g)), torch.randn(n, generator=g)
    atoms = torch.randn(n, 2, generator=g)
    for name, target in (("near the smallest value", float(s.min()) + 0.05), ("near the largest value", float(s.max()) - 0.05)):
        with h.case(f"a target {name} of the statistic agrees with maximum_entropy_tilt"):
            p, lam = f(w, s, target)
            mu_lib, lam_lib = maximum_entropy_tilt(EmpiricalMeasure(atoms, w), s[:, None], torch.tensor([target]))
            check_close(p, mu_lib.weights, "p", atol=1e-9)
            check_close(torch.as_tensor(lam, dtype=torch.float64).reshape(()), lam_lib.reshape(()), "lambda", atol=1e-7)
    with h.case("the target equal to the mean under w needs no tilt"):
        p0, lam0 = f(w, s, float(w @ s))
        check_close(torch.as_tensor(lam0, dtype=torch.float64).reshape(()), torch.tensor(0.0), "lambda", atol=1e-9)
        check_close(p0, w, "p", atol=1e-10)


@_varied("ch2_markov_kernels")
def tilt_cost(h):
    from attnopt.kernels import EmpiricalMeasure, maximum_entropy_tilt

    f, g = h.student("tilt_cost"), h.rng()
    n, step = 11, 1e-4
    s, atoms = torch.randn(n, generator=g), torch.randn(n, 2, generator=g)
    w = torch.rand(n, generator=g) + 0.05
    w[[2, 7]] = 0.0
    w = _normalize(w)

    def tilt_at(target):  # (KL(p_f || w), the multiplier) from the library's solver
        tilted, multiplier = maximum_entropy_tilt(EmpiricalMeasure(atoms, w), s[:, None], torch.tensor([target]))
        kept = tilted.weights > 0
        p = tilted.weights[kept]
        return (p * torch.log(p / w[kept])).sum(), multiplier.reshape(())

    for lam in (float(2 * torch.rand(1, generator=g) - 1), 1.7):
        with h.case(f"two atoms of mass 0, lam = {lam:.3f}: K and K' against the KL of maximum_entropy_tilt, K'' against its multiplier"):
            target, K, dK, d2K = (torch.as_tensor(v).reshape(()) for v in f(w, s, lam))
            t = float(target)
            (kl, _), (kl_up, lam_up), (kl_down, lam_down) = (tilt_at(x) for x in (t, t + step, t - step))
            check_close(target, (torch.softmax(torch.log(w) + lam * s, -1) * s).sum(), "the target f", atol=1e-12)
            check_close(K, kl, "K(f)", atol=1e-8)
            check_close(dK, (kl_up - kl_down) / (2 * step), "K'(f)", atol=1e-5)
            # K'' as the rate of the solver's multiplier: a second difference of K would divide the
            # solver's rounding by step^2 (off by 0.02 on three secrets in a thousand)
            check_close(d2K, (lam_up - lam_down) / (2 * step), "K''(f)", atol=1e-5, rtol=1e-5)
    with h.case("lam = 0 is no tilt: f is the mean under w, K = K' = 0 and K'' = 1 / Var_w(s)"):
        target, K, dK, d2K = (torch.as_tensor(v).reshape(()) for v in f(w, s, 0.0))
        mean = w @ s
        check_close(target, mean, "f", atol=1e-13)
        check_close(K, torch.tensor(0.0), "K", atol=1e-13)
        check_close(dK, torch.tensor(0.0), "K'", atol=1e-13)
        check_close(d2K, 1 / (w @ (s - mean) ** 2), "K''", atol=1e-10)
    with h.case("lam = -500, the smallest value of s 1 below the others: K is minus the log of its mass"):
        lowest = int(torch.where(w > 0, s, float("inf")).argmin())
        s_gap = s.clone()
        s_gap[lowest] = s[w > 0].min() - 1.0  # a gap of 1: the other atoms keep a mass below e^-500
        K = torch.as_tensor(f(w, s_gap, -500.0)[1]).reshape(())
        check_close(K, -torch.log(w[lowest]), "K", atol=1e-9)


# ---------------------------------------------------------------- chapter 3: one-sided transport


@_varied("ch3_one_sided_eot")
def sparsemax_backward(h):
    from attnopt.transforms import sparsemax

    f, g = h.student("sparsemax_backward"), h.rng()
    for scale, tau in ((0.3, 1.0), (2.0, 0.5), (5.0, 2.0)):
        with h.case(f"a (5, 3, 12) batch of scores of scale {scale}, tau = {tau}, agrees with autograd through sparsemax"):
            s = (scale * torch.randn(5, 3, 12, generator=g)).requires_grad_(True)
            p = sparsemax(s / tau)
            upstream = torch.randn(5, 3, 12, generator=g)
            (expected,) = torch.autograd.grad((p * upstream).sum(), s)
            check_close(f(p.detach(), upstream, tau), expected, "d loss / d scores")
    with h.case("a single key gets zero gradient"):
        check_close(f(torch.ones(2, 1), torch.randn(2, 1, generator=g), 1.0), torch.zeros(2, 1), "d loss / d scores")


@_varied("ch3_one_sided_eot")
def softmax_backward(h):
    from attnopt.geometry import advantage_gradient

    f, g = h.student("softmax_backward"), h.rng()
    for tau in (0.3, 1.0, 2.5):
        with h.case(f"a (4, 6) batch, tau = {tau}, agrees with advantage_gradient"):
            p = torch.softmax(torch.randn(4, 6, generator=g) / tau, -1)
            u = torch.randn(4, 6, generator=g)
            check_close(f(p, u, tau), advantage_gradient(p, u, tau), "d loss / d scores", atol=1e-14)
    with h.case("a non-linear loss of the attention output, (2, 4, 7) batch, tau = 1.3, agrees with autograd"):
        values = torch.randn(7, 3, generator=g)
        s2 = torch.randn(2, 4, 7, generator=g, requires_grad=True)
        p2 = torch.softmax(s2 / 1.3, dim=-1)
        p2_leaf = p2.detach().requires_grad_(True)
        loss = lambda q: torch.sin(q @ values).pow(2).sum()
        (grad_s,) = torch.autograd.grad(loss(p2), s2)
        (grad_p,) = torch.autograd.grad(loss(p2_leaf), p2_leaf)
        check_close(f(p2.detach(), grad_p, 1.3), grad_s, "d loss / d scores", atol=1e-13)


@_varied("ch3_one_sided_eot")
def lse_hessian(h):
    from attnopt.geometry import fisher_information

    f, g = h.student("lse_hessian"), h.rng()
    S = torch.randn(3, 4, 5, generator=g)
    p = torch.softmax(S / 2.0, dim=-1)
    with h.case("a (3, 4, 5) batch, tau = 2, is the Fisher information over tau"):
        check_close(f(S, 2.0), fisher_information(p) / 2.0, "Hessian", atol=1e-14)
    with h.case("the Fisher information as an expectation over the categories, term by term"):
        e = torch.eye(5)
        fisher = sum(p[..., j, None, None] * torch.einsum("...a,...b->...ab", e[j] - p, e[j] - p) for j in range(5))
        check_close(2.0 * f(S, 2.0), fisher, "tau times the Hessian", atol=1e-14)
    with h.case("scores of size 1000 do not overflow"):
        s = 1000 + torch.randn(4, generator=g)
        check_close(f(s, 0.5), fisher_information(torch.softmax(s / 0.5, -1)) / 0.5, "Hessian", atol=1e-12)


@_varied("ch3_one_sided_eot")
def eot_value(h):
    from attnopt.transforms import one_sided_eot

    f, g = h.student("eot_value"), h.rng()
    C2 = torch.randn(3, 6, generator=g)
    C2[:, 2] = float("inf")
    with h.case("a (3, 6) batch with a forbidden key: the gradient is one_sided_eot's plan, zero at the key"):
        leaf = C2.clone().requires_grad_(True)
        v2 = f(leaf, 0.3)
        check_shape(v2, (3,), "value")
        (grad2,) = torch.autograd.grad(v2.sum(), leaf)
        check_close(grad2, one_sided_eot(C2, eps=0.3), "gradient", atol=1e-12)
    with h.case("as eps -> 0 the value tends to the smallest cost (eps = 1e-4)"):
        check_close(f(C2, 1e-4), C2.min(-1).values, "value", atol=1e-3)
    with h.case("costs of size 1000 eps do not overflow"):
        C3 = torch.randn(4, generator=g)
        check_close(f(C3 + 1000 * 0.2, 0.2), f(C3, 0.2) + 1000 * 0.2, "value of C + 1000 eps", atol=1e-9)


@_varied("ch3_one_sided_eot")
def entmax_temperature_derivatives(h):
    from attnopt.transforms import entmax

    f, g = h.student("entmax_temperature_derivatives"), h.rng()
    jacobian = torch.autograd.functional.jacobian
    tsallis = lambda p, alpha: (p - p**alpha).sum(-1) / (alpha * (alpha - 1))
    for alpha, scale in ((1.25, 1.0), (1.5, 3.0), (2.0, 2.0)):
        s = scale * torch.randn(3, 5, 11, generator=g)
        tau = 0.3 + 1.5 * float(torch.rand(1, generator=g))
        with h.case(f"a (3, 5, 11) batch of scores of scale {scale}, alpha = {alpha}, tau = {tau:.3f}, agrees with autograd through entmax"):
            at = torch.tensor(tau)
            dp, d_mean, d_entropy = f(entmax(s / tau, alpha), s, tau, alpha)
            check_close(dp, jacobian(lambda t: entmax(s / t, alpha), at), "dp/dtau", atol=1e-10)
            check_close(d_mean, jacobian(lambda t: (entmax(s / t, alpha) * s).sum(-1), at), "d<s, p>/dtau", atol=1e-10)
            check_close(d_entropy, jacobian(lambda t: tsallis(entmax(s / t, alpha), alpha), at), "dH/dtau", atol=1e-10)
    with h.case("alpha = 2 with most keys outside the support: their derivative is exactly 0"):
        s = 8 * torch.randn(6, 12, generator=g)
        p = entmax(s, 2.0)
        dp = f(p, s, 1.0, 2.0)[0]
        check(bool(torch.all(dp[p == 0] == 0)), "dp/dtau off the support", "exactly 0", dp[p == 0].abs().max())
    with h.case("the entropy's rate is minus the mean score's over tau (alpha = 1.7, tau = 0.45)"):
        s = torch.randn(4, 8, generator=g)
        _, d_mean, d_entropy = f(entmax(s / 0.45, 1.7), s, 0.45, 1.7)
        check_close(d_entropy, -d_mean / 0.45, "dH/dtau", atol=1e-12)
    with h.case("a single key in the support, or equal scores on it, does not move"):
        s = torch.tensor([[0.3, 0.3, 0.3, -40.0], [5.0, -30.0, -30.0, -30.0]])
        dp, d_mean, d_entropy = f(entmax(s, 1.5), s, 1.0, 1.5)
        check_close(dp, torch.zeros(2, 4), "dp/dtau", atol=1e-14)
        check_close(d_entropy, torch.zeros(2), "dH/dtau", atol=1e-14)


# ---------------------------------------------------------------- chapter 4: continuous attention


@_varied("ch4_continuous")
def continuous_softmax_1d(h):
    from attnopt.continuous import continuous_softmax
    from attnopt.value_functions import GaussianRBF

    f, g = h.student("continuous_softmax_1d"), h.rng()
    mus = torch.rand(4, 5, generator=g)
    sigma2s = 0.01 + 0.2 * torch.rand(4, 5, generator=g)
    centers, widths = torch.linspace(0, 1, 7), torch.linspace(0.05, 0.2, 7)
    with h.case("a (4, 5) batch of Gaussians, 7 basis functions, agrees with continuous_softmax"):
        lib = continuous_softmax(mus[..., None], sigma2s[..., None, None], GaussianRBF(centers, widths))
        check_close(f(mus, sigma2s, centers, widths), lib, "r")


@_varied("ch4_continuous")
def tp_threshold(h):
    from attnopt.continuous import moment_match, truncated_paraboloid_threshold

    f_lam, f_cov, f_inv = (h.student(n) for n in ("tp_threshold", "tp_covariance", "tp_scale_from_covariance"))
    g = h.rng()
    for D in (1, 2, 3):
        A = torch.randn(4, D, D, generator=g)
        Sigma = A @ A.transpose(-1, -2) + 0.2 * torch.eye(D)
        with h.case(f"a (4, {D}, {D}) batch of scales agrees with truncated_paraboloid_threshold"):
            check_close(f_lam(Sigma), truncated_paraboloid_threshold(Sigma), "lambda", atol=1e-13)
        with h.case(f"D = {D}: covariance of the scale found for a covariance is that covariance"):
            cov = f_cov(Sigma)
            check_close(f_cov(f_inv(cov)), cov, "covariance", atol=1e-12)
    with h.case("the scale matched to discrete weights on a 2-D grid is moment_match's"):
        x = torch.linspace(0, 1, 12)
        locations = torch.stack(torch.meshgrid(x, x, indexing="ij"), -1).reshape(-1, 2)
        w = torch.softmax(3 * torch.randn(3, 144, generator=g), dim=-1)
        mu_lib, Sigma_lib = moment_match(w, locations, family="truncated_paraboloid")
        centered = locations - mu_lib[:, None, :]
        cov = torch.einsum("bl,bla,blc->bac", w, centered, centered)
        check_close(f_inv(cov), Sigma_lib, "scale", atol=1e-10)


@_varied("ch4_continuous")
def continuous_sparsemax_1d(h):
    from attnopt.continuous import continuous_sparsemax
    from attnopt.value_functions import GaussianRBF

    f, g = h.student("continuous_sparsemax_1d"), h.rng()
    centers, widths = torch.linspace(0, 1, 9), torch.full((9,), 0.07)
    for mu, s2 in ((float(torch.rand(1, generator=g)), 0.01), (0.1, 0.3), (0.95, 0.002)):
        with h.case(f"mu = {mu:.3f}, scale {s2}, nine basis functions of width 0.07, agrees with continuous_sparsemax"):
            lib = continuous_sparsemax(torch.tensor([mu]), torch.tensor([[s2]]), GaussianRBF(centers, widths))
            check_close(f(mu, s2, centers, widths), lib, "r", atol=1e-10)


@_varied("ch4_continuous")
def weighted_em_step(h):
    from attnopt.mixture import weighted_em

    f, g = h.student("weighted_em_step"), h.rng()
    L, K = 45, 3
    points = torch.cat([0.1 * torch.randn(15, 2, generator=g) + c for c in torch.rand(3, 2, generator=g)])
    weights = 5 * torch.rand(L, generator=g)  # not summing to one
    # started, as EM usually is, near data points: a component started far from every point gets a
    # tiny N_k, and its new mean is then ill-conditioned (differences of 1e-10 between two correct
    # implementations on one key in a thousand, against 5e-14 at worst over 3,000 keys here)
    means0 = points[torch.randperm(L, generator=g)[:K]] + 0.05 * torch.randn(K, 2, generator=g)
    covs0 = 0.05 * torch.eye(2).expand(K, 2, 2).clone()
    mixing0 = _normalize(torch.rand(K, generator=g) + 0.5)
    ours = None
    with h.case("unnormalized weights: one step agrees with attnopt's weighted_em (one iteration)"):
        lib = weighted_em(points, _normalize(weights), K, n_iter=1,
                          init={"means": means0, "covariances": covs0, "mixing": mixing0}, tol=None, cov_floor=0.0)
        ours = f(points, weights, means0, covs0, mixing0)
        check_close(ours[0], lib.means, "means", atol=1e-11)
        check_close(ours[1], lib.covariances, "covariances", atol=1e-11)
        check_close(ours[2], lib.mixing, "mixing weights", atol=1e-11)
    with h.case("scaling all weights by 7 does not change the step"):
        for a, b, name in zip(f(points, 7.0 * weights, means0, covs0, mixing0), f(points, weights, means0, covs0, mixing0),
                              ("means", "covariances", "mixing weights")):
            check_close(a, b, name, atol=1e-12)


@_varied("ch4_continuous")
def tp_squared_integral(h):
    import scipy.integrate

    from attnopt.continuous import truncated_paraboloid_threshold

    f, g = h.student("tp_squared_integral"), h.rng()
    for D in (1, 2, 3, 4):
        A = torch.randn(3, D, D, generator=g)
        Sigma = A @ A.transpose(-1, -2) + 0.2 * torch.eye(D)
        with h.case(f"a (3, {D}, {D}) batch of scales: a radial quadrature of p^2 (scipy.integrate.quad)"):
            expected = []
            for k in range(3):
                a = float(-truncated_paraboloid_threshold(Sigma[k]))
                sphere = 2 * math.pi ** (D / 2) / math.gamma(D / 2)
                radial = scipy.integrate.quad(lambda r: (a - r * r / 2) ** 2 * r ** (D - 1), 0, math.sqrt(2 * a), epsabs=1e-14, epsrel=1e-13)[0]
                expected.append(sphere * radial * math.sqrt(float(torch.linalg.det(Sigma[k]))))
            check_close(f(Sigma), torch.tensor(expected), "the integral of p^2", atol=1e-10)
    with h.case("D = 2: scaling the scale by c = 3 multiplies the integral by c^(-D / (D + 2))"):
        A = torch.randn(2, 2, generator=g)
        Sigma = A @ A.T + 0.3 * torch.eye(2)
        check_close(torch.as_tensor(f(3 * Sigma)).reshape(()), torch.as_tensor(f(Sigma)).reshape(()) * 3 ** (-0.5),
                    "the integral for 3 Sigma", atol=1e-13)


# ---------------------------------------------------------------- chapter 5: four views


@_varied("ch5_four_views")
def gibbs(h):
    from attnopt.transforms import one_sided_eot

    f, g = h.student("gibbs"), h.rng()
    m = 6
    u = _normalize(torch.rand(m, generator=g))
    C2 = torch.randn(3, 4, m, generator=g)
    with h.case("a (3, 4, 6) batch of costs, eps = 0.4, agrees with one_sided_eot (KL, prior u)"):
        p2, logZ2 = f(C2, 0.4, u)
        check_close(p2, one_sided_eot(C2, eps=0.4, regularizer="kl", prior=u), "p*", atol=1e-12)
        check_close(logZ2, torch.log((u * torch.exp(-C2 / 0.4)).sum(-1)), "log Z", atol=1e-12)


@_varied("ch5_four_views")
def value_derivatives(h):
    f, g = h.student("value_derivatives"), h.rng()
    jacobian = torch.autograd.functional.jacobian

    def reference(cost, eps, u):  # F = -eps log Z and its derivatives in eps by autograd
        F = lambda e: -e * torch.logsumexp(torch.log(u) - cost / e, dim=-1)
        at = torch.tensor(eps)
        return F(at), jacobian(F, at), jacobian(lambda e: jacobian(F, e, create_graph=True), at)

    m = 7
    C = torch.randn(4, 5, m, generator=g)
    u = _normalize(torch.rand(m, generator=g) + 0.05)
    for eps in (0.05, 0.7, 20.0):
        with h.case(f"a (4, 5, 7) batch of costs, eps = {eps}, agrees with autograd's first and second derivatives"):
            for found, expected, name in zip(f(C, eps, u), reference(C, eps, u), ("F", "F'", "F''")):
                check_close(found, expected, name, atol=1e-9)
    u_masked = u.clone()
    u_masked[[1, 4]] = 0.0
    u_masked = _normalize(u_masked)
    with h.case("a base measure with two zeros (masked keys), eps = 0.4"):
        for found, expected, name in zip(f(C, 0.4, u_masked), reference(C, 0.4, u_masked), ("F", "F'", "F''")):
            check_close(found, expected, name, atol=1e-9)
    with h.case("costs shifted by 1000 eps: F shifts by 1000 eps, its derivatives do not move"):
        base, shifted = f(C, 0.3, u_masked), f(C + 1000 * 0.3, 0.3, u_masked)
        check_close(shifted[0] - base[0], torch.full((4, 5), 1000 * 0.3), "F(C + 1000 eps) - F(C)", atol=1e-9)
        check_close(shifted[1], base[1], "F'", atol=1e-8)
        check_close(shifted[2], base[2], "F''", atol=1e-8)
    with h.case("costs constant on the support of u (whatever they are off it): F is linear, F' = 0 = F''"):
        flat = torch.full((m,), 0.8)
        flat[[1, 4]] = torch.randn(2, generator=g) * 5
        _, dF, d2F = f(flat, 0.5, u_masked)
        check_close(torch.as_tensor(dF).reshape(()), torch.tensor(0.0), "F'", atol=1e-13)
        check_close(torch.as_tensor(d2F).reshape(()), torch.tensor(0.0), "F''", atol=1e-13)


@_varied("ch5_four_views")
def to_fenchel(h):
    import torch.nn.functional as F

    from attnopt.fenchel import generalized_attention
    from attnopt.kernels import attention_kernel
    from attnopt.transforms import one_sided_eot

    to_f, to_e, g = h.student("to_fenchel"), h.student("to_eot"), h.rng()
    M, N, d = 5, 8, 4
    q, k = torch.randn(M, d, generator=g), torch.randn(N, d, generator=g)
    w = _normalize(torch.rand(N, generator=g))
    w[2] = 0.0
    w = _normalize(w)
    with h.case("a masked key, scale 2: the three views agree and the masked key gets weight 0"):
        _, P_kernel = attention_kernel(q, k, key_weights=w, scale=2.0)
        _, P_fenchel = generalized_attention(**to_f(q, k, w, 2.0))
        P_eot = one_sided_eot(**to_e(q, k, w, 2.0), regularizer="kl")
        check_close(P_fenchel, P_kernel, "Fenchel weights")
        check_close(P_eot, P_kernel, "transport weights")
    with h.case("uniform weights and scale 1/sqrt(d) give SDPA in every view"):
        v = torch.randn(N, 3, generator=g)
        uniform = torch.full((N,), 1 / N)
        sdpa = F.scaled_dot_product_attention(q, k, v)
        check_close(generalized_attention(**to_f(q, k, uniform, 1 / math.sqrt(d)))[1] @ v, sdpa, "Fenchel output")
        check_close(one_sided_eot(**to_e(q, k, uniform, 1 / math.sqrt(d)), regularizer="kl") @ v, sdpa, "transport output")


@_varied("ch5_four_views")
def grid_softmax(h):
    f, g = h.student("grid_softmax"), h.rng()
    mu0, var0 = float(torch.rand(1, generator=g)) - 0.5, 0.02 + 0.05 * float(torch.rand(1, generator=g))
    theta = torch.tensor([mu0 / var0, -1 / (2 * var0)])
    with h.case(f"a Gaussian with mean {mu0:.3f} and variance {var0:.3f} on a fine grid of [-3, 3]"):
        _, mean, var = f(theta, torch.linspace(-3, 3, 6001))
        check_close(torch.as_tensor(mean).reshape(()), torch.tensor(mu0), "mean", atol=1e-10)
        check_close(torch.as_tensor(var).reshape(()), torch.tensor(var0), "variance", atol=1e-10)
    with h.case("a grid of four points is not the continuous model: its moments are off"):
        _, mean_c, var_c = f(torch.tensor([0.4 / 0.0225, -1 / 0.045]), torch.linspace(0, 1, 4))
        check(abs(float(mean_c) - 0.4) > 1e-2 and abs(float(var_c) - 0.0225) > 1e-3,
              "moments on four points", "far from (0.4, 0.0225)", f"({float(mean_c):.4g}, {float(var_c):.4g})")


@_varied("ch5_four_views")
def sparse_eot(h):
    from attnopt.transforms import one_sided_eot

    f, g = h.student("sparse_eot"), h.rng()
    C = torch.randn(2, 3, 7, generator=g)
    for e in (0.05, 1.0, 20.0):
        with h.case(f"a (2, 3, 7) batch, eps = {e}, agrees with one_sided_eot (sparsemax)"):
            check_close(f(C, e), one_sided_eot(C, eps=e, regularizer="sparsemax"), "plan", atol=1e-10)
    with h.case("a gap of at least eps between the two smallest costs gives a one-hot plan"):
        check_one_hot(f(torch.tensor([0.0, 1.5, 2.0, 3.0]), 1.0), torch.tensor([1.0, 0.0, 0.0, 0.0]), "plan")
    with h.case("a large eps (100) gives a plan without zeros"):
        p = f(C, 100.0)
        check(torch.all(p > 0), "smallest weight", "> 0", p.min())
