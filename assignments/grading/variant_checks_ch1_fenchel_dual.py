"""The hidden checks of the variants of Assignment 1 (``assignments/variants/ch1_fenchel_dual.py``).

``hidden_checks.py`` runs the function named after the task when the course drew a variant k >= 1 of
it (``h.variant``; its parameters are ``h.params``). Like ``hidden_checks.py``, this file is public:
the inputs are drawn from the course secret, the properties checked are these.
"""

from __future__ import annotations

import torch

from coursework import check, check_close, check_one_hot, check_shape


def gaussian_lambda_star(h):
    """Variant 1: the Gaussian exact estimate; variant 2: lambda* with a matrix-valued reliability."""
    return (_gaussian_estimate, _gaussian_lambda_star_weighted)[h.variant - 1](h)


def newton_dual(h):
    """Variant 1: the exact weights from the Gram matrix; variant 2: the optimal-transport dual."""
    return (_newton_gram_weights, _newton_ot_dual)[h.variant - 1](h)


def attention_weights(h):
    """Variant 1: weights with the curvature-corrected query; variant 2: optimal-transport attention."""
    return (_corrected_attention_weights, _ot_attention_weights)[h.variant - 1](h)


def t5_preference(h):
    """Variant 1: the true preference of transport attention; variant 2: T5's decoder preference."""
    return (_true_preference, _causal_t5_preference)[h.variant - 1](h)


def _spd(d, g, floor=0.5):
    A = torch.randn(d, d, generator=g)
    return A @ A.T + floor * torch.eye(d)


# ---------------------------------------------------------------- Task 1


def _gaussian_estimate(h):
    from attnopt.fenchel import exact_estimate, gaussian_estimate

    f, g = h.student("gaussian_estimate"), h.rng()
    d = 2
    cov = _spd(d, g)
    mus, bs = torch.randn(4, 5, d, generator=g), torch.randn(4, 5, d, generator=g)
    for a in (0.1, 1.0, 3.0):
        with h.case(f"a (4, 5, 2) batch with a full covariance, alpha = {a}, agrees with gaussian_estimate"):
            check_close(f(mus, bs, a, cov), gaussian_estimate(mus, bs, a, cov=cov), "estimate")
        with h.case(f"a (4, 5, 2) batch with cov=None (the identity), alpha = {a}"):
            check_close(f(mus, bs, a), gaussian_estimate(mus, bs, a), "estimate")
    with h.case("the exact estimate of the discrete dual on a 40 x 40 Gauss-Hermite grid of N(mu, cov) is the same"):
        mu, b, alpha = mus[0, 0], bs[0, 0], 0.7
        templates, weights = shared._hermite_grid(mu, cov)
        check_close(f(mu, b, alpha, cov), exact_estimate(b, templates, weights, alpha), "estimate", atol=1e-10)
    with h.case("a very reliable evidence (alpha = 1e8): the estimate is the observation b"):
        check_close(f(mus[1], bs[1], 1e8, cov), bs[1], "estimate", atol=1e-6)


def _gaussian_lambda_star_weighted(h):
    from attnopt.fenchel import gaussian_dual_maximizer, solve_dual

    f, g = h.student("gaussian_lambda_star_weighted"), h.rng()
    d = 3
    cov = _spd(d, g)
    mus, bs = torch.randn(4, 5, d, generator=g), torch.randn(4, 5, d, generator=g)
    for scale in (0.1, 1.0, 3.0):
        W = scale * _spd(d, g, floor=0.2)
        closed = torch.linalg.inv(torch.linalg.inv(W) + cov)  # lambda* = (W^-1 + Sigma)^-1 z
        with h.case(f"a (4, 5, 3) batch, a full covariance and a weight W of scale {scale}: (W^-1 + Sigma)^-1 z"):
            check_close(f(mus, bs, W, cov), (bs - mus) @ closed.T, "lambda*", atol=1e-11)
        with h.case(f"a (4, 5, 3) batch with cov=None, W of scale {scale}: (W^-1 + I)^-1 z"):
            check_close(f(mus, bs, W), (bs - mus) @ torch.linalg.inv(torch.linalg.inv(W) + torch.eye(d)).T,
                        "lambda*", atol=1e-11)
    with h.case("W = 0.4 I agrees with gaussian_dual_maximizer (alpha = 0.4)"):
        check_close(f(mus, bs, 0.4 * torch.eye(d), cov), gaussian_dual_maximizer(mus, bs, 0.4, cov=cov), "lambda*")
    with h.case("a 40 x 40 Gauss-Hermite grid of N(mu, cov) in 2-D: lambda* = R eta*, with eta* the maximizer of the "
                "scalar dual (alpha = 1) for the templates R^T t and the observation R^T b, W = R R^T"):
        cov2, W2 = _spd(2, g), _spd(2, g, floor=0.3)
        mu, b = torch.randn(2, generator=g), torch.randn(2, generator=g)
        templates, weights = shared._hermite_grid(mu, cov2)
        R = torch.linalg.cholesky(W2)
        eta = solve_dual(b @ R, templates @ R, weights, 1.0)
        check_close(f(mu, b, W2, cov2), R @ eta, "lambda*", atol=1e-10)


# ---------------------------------------------------------------- Task 2


def _newton_gram_weights(h):
    from attnopt.fenchel import solve_dual

    f, g = h.student("newton_gram_weights"), h.rng()
    exact = lambda b, T, u, a: torch.softmax(torch.log(u) + T @ solve_dual(b, T, u, a), dim=-1)
    for n, d, alpha in ((8, 64, 0.8), (12, 3, 1.0)):
        T = torch.randn(n, d, generator=g) / d ** 0.25
        u = shared._normalize(torch.rand(n, generator=g))
        u[:3] = 0.0
        u = shared._normalize(u)
        b = shared._evidence_where_newton_converges(lambda: u @ T + torch.randn(d, generator=g), T, u, alpha, solve_dual)
        z = b - u @ T
        with h.case(f"{n} templates in {d} dimensions, three masked, alpha = {alpha}: the weights of solve_dual's maximizer"):
            p = f(T @ z, T @ T.T, u, alpha)
            check_shape(p, (n,), "weights")
            check_close(p, exact(b, T, u, alpha), "weights", atol=1e-10)
            check(bool(torch.all(p[:3] == 0)), "the weights of the masked templates", "exactly 0", p[:3])
    with h.case("a repeated template (a singular Gram matrix), alpha = 0.5: the weights of solve_dual's maximizer"):
        T = torch.randn(6, 4, generator=g)
        T[5] = T[2]
        u = shared._normalize(torch.rand(6, generator=g) + 0.1)
        b = shared._evidence_where_newton_converges(lambda: u @ T + 0.5 * torch.randn(4, generator=g), T, u, 0.5, solve_dual)
        check_close(f(T @ (b - u @ T), T @ T.T, u, 0.5), exact(b, T, u, 0.5), "weights", atol=1e-10)
    with h.case("small alpha: the weights approach generalized attention's, the gap shrinking like alpha^2"):
        T = torch.randn(8, 3, generator=g)
        u = shared._normalize(torch.rand(8, generator=g) + 0.1)
        z = torch.randn(3, generator=g)
        gaps = torch.tensor([(f(T @ z, T @ T.T, u, a) - torch.softmax(torch.log(u) + a * T @ z, -1)).abs().max().item()
                             for a in (1e-1, 1e-2)])
        check(bool(gaps[1] < 0.03 * gaps[0]), "gaps at alpha = 0.1 and 0.01", "the second below 3 % of the first", gaps)


def _plain_ot_newton_converges(b, T, u, C, alpha, gamma, solve_ot_dual, n_iter=30) -> bool:
    """Whether 30 undamped Newton steps on the transport dual from alpha z reach solve_ot_dual's maximizer."""
    gibbs = lambda lam: torch.softmax(((T @ lam)[:, None] - C) / gamma, dim=0)
    lam = alpha * (b - (gibbs(torch.zeros_like(b)) @ u) @ T)
    eye = torch.eye(T.shape[-1], dtype=T.dtype)
    for _ in range(n_iter):
        q = gibbs(lam)
        p = q @ u
        means = q.T @ T
        cov = T.T @ (p[:, None] * T) - means.T @ (u[:, None] * means)
        lam = lam - torch.linalg.solve(-eye / alpha - cov / gamma, b - lam / alpha - p @ T)
    return bool(torch.isfinite(lam).all()) and bool((lam - solve_ot_dual(b, T, u, C, alpha, gamma)).abs().max() < 1e-10)


def _newton_ot_dual(h):
    from attnopt.fenchel import solve_ot_dual, true_preference

    f, g = h.student("newton_ot_dual"), h.rng()
    n, d = 8, 3
    T = torch.randn(n, d, generator=g)
    C = torch.cdist(T, T) + 0.5 * torch.rand(n, n, generator=g) * (1 - torch.eye(n))
    u = shared._normalize(torch.rand(n, generator=g) + 0.05)
    u_masked = u.clone()
    u_masked[[1, 4, 6]] = 0.0
    u_masked = shared._normalize(u_masked)
    for pref, alpha, gamma, which in ((u, 1.0, 2.0, "full support"), (u_masked, 0.8, 0.5, "three templates that send nothing"),
                                      (u, 0.3, 0.2, "full support")):
        mean = true_preference(pref, C, gamma) @ T
        for _ in range(100):  # undamped Newton may diverge on a rare evidence: it is drawn again
            b = mean + torch.randn(d, generator=g)
            if _plain_ot_newton_converges(b, T, pref, C, alpha, gamma, solve_ot_dual):
                break
        with h.case(f"{which}, an asymmetric cost, alpha = {alpha}, gamma = {gamma}: agrees with solve_ot_dual"):
            lam = f(b, T, pref, C, alpha, gamma)
            check_shape(lam, (d,), "lambda*")
            check_close(lam, solve_ot_dual(b, T, pref, C, alpha, gamma), "lambda*", atol=1e-9)
    with h.case("small alpha (1e-3): lambda* is alpha z to within alpha^2 L_gamma |z|, with z measured from the true preference"):
        z = torch.randn(d, generator=g)
        b = true_preference(u, C, 1.0) @ T + z
        lam = f(b, T, u, C, 1e-3, 1.0)
        bound = 1e-6 * torch.cdist(T, T).max() ** 2 / 4 * z.norm()
        check(bool((lam - 1e-3 * z).norm() <= bound), "|lambda* - alpha z|", f"at most {bound.item():.3g}",
              (lam - 1e-3 * z).norm())


# ---------------------------------------------------------------- Task 3


def _corrected_reference(z, keys, u, alpha):
    """softmax(log u + K alpha (I + alpha Cov_u(K))^-1 z), query by query, for (n_q, d) queries and (n, d) keys."""
    out = torch.empty(z.shape[0], keys.shape[0], dtype=z.dtype)
    for j in range(z.shape[0]):
        cov = torch.cov(keys.T, correction=0, aweights=u[j])
        lam = alpha * torch.linalg.inv(torch.eye(keys.shape[1]) + alpha * cov) @ z[j]
        out[j] = torch.softmax(torch.log(u[j]) + keys @ lam, dim=-1)
    return out


def _corrected_attention_weights(h):
    f, g = h.student("corrected_attention_weights"), h.rng()
    B, H, n_q, n, d = 2, 3, 5, 7, 4
    q, k = torch.randn(B, H, n_q, d, generator=g), torch.randn(B, H, n, d, generator=g)
    u = shared._normalize(torch.rand(B, H, n_q, n, generator=g))
    u[..., 2] = 0.0
    u = shared._normalize(u)
    for a in (0.3, 1.0, 2.5):
        with h.case(f"a preference of shape (2, 3, 5, 7) with a masked key, alpha = {a}, against the covariance query by query"):
            p = f(q, k, u, alpha=a)
            check_shape(p, (B, H, n_q, n), "weights")
            expected = torch.stack([torch.stack([_corrected_reference(q[i, j], k[i, j], u[i, j], a) for j in range(H)])
                                    for i in range(B)])
            check_close(p, expected, "weights", atol=1e-11)
            check(bool(torch.all(p[..., 2] == 0)), "the weights of the masked key", "exactly 0", p[..., 2])
    with h.case("u=None is the uniform preference, and a preference of shape (7,) broadcasts"):
        uniform = torch.full((n,), 1 / n)
        check_close(f(q, k, None, alpha=0.8), f(q, k, uniform, alpha=0.8), "weights with u=None", atol=1e-13)
        check_close(f(q, k, uniform, alpha=0.8)[1, 2], _corrected_reference(q[1, 2], k[1, 2], uniform.expand(n_q, n), 0.8),
                    "weights", atol=1e-11)
    with h.case("keys shifted by one vector give the same weights (the covariance is centred)"):
        shift = 3 * torch.randn(d, generator=g)
        check_close(f(q, k + shift, u, alpha=0.7), f(q, k, u, alpha=0.7), "weights with shifted keys", atol=1e-10)


def _ot_attention_weights(h):
    from attnopt.fenchel import ot_attention, true_preference

    f, g = h.student("ot_attention_weights"), h.rng()
    B, n_q, n, d = 2, 5, 6, 3
    q, k = torch.randn(B, n_q, d, generator=g), torch.randn(B, n, d, generator=g)
    C = torch.cdist(k[0], k[0]) + 0.5 * torch.rand(n, n, generator=g) * (1 - torch.eye(n))
    C[1, 4] = C[3, 0] = float("inf")
    u = shared._normalize(torch.rand(B, n_q, n, generator=g))
    u[..., 5] = 0.0
    u = shared._normalize(u)
    for a, gamma in ((0.3, 1.0), (1.0, 0.2), (2.5, 3.0)):
        with h.case(f"a (2, 5, 6) preference, an asymmetric cost with two infinite entries, alpha = {a}, gamma = {gamma}, "
                    "agrees with ot_attention"):
            p = f(q, k, u, C, alpha=a, gamma=gamma)
            check_shape(p, (B, n_q, n), "weights")
            check_close(p, ot_attention(q, k, u, C, alpha=a, gamma=gamma)[1], "weights", atol=1e-12)
    with h.case("alpha -> 0 (1e-9): the weights are the true preference"):
        u1 = shared._normalize(torch.rand(n, generator=g))
        check_close(f(q, k, u1, C, alpha=1e-9, gamma=0.5), true_preference(u1, C, 0.5).expand(B, n_q, n), "weights",
                    atol=1e-8)
    with h.case("scores of several hundred (queries times 200) do not overflow"):
        check_close(f(200 * q, k, u, C, alpha=1.0, gamma=0.5), ot_attention(200 * q, k, u, C, alpha=1.0, gamma=0.5)[1],
                    "weights", atol=1e-10)


# ---------------------------------------------------------------- Task 4


def _true_preference(h):
    from attnopt.fenchel import true_preference

    f, g = h.student("true_preference"), h.rng()
    n = 9
    T = torch.randn(n, 2, generator=g)
    C = torch.cdist(T, T) + 0.5 * torch.rand(n, n, generator=g) * (1 - torch.eye(n))
    C[0, 5] = C[7, 2] = float("inf")
    u = shared._normalize(torch.rand(3, 4, n, generator=g))
    u[..., 3] = 0.0
    u = shared._normalize(u)
    for gamma in (0.05, 0.5, 5.0):
        with h.case(f"a (3, 4, 9) batch, an asymmetric cost with two infinite entries, gamma = {gamma}, agrees with "
                    "true_preference"):
            check_close(f(u, C, gamma), true_preference(u, C, gamma), "true preference", atol=1e-14)
    with h.case("gamma = 1e-3 with costs of order one: no overflow, and the true preference is u"):
        found = f(u[0, 0], C + 1.0 - torch.eye(n), 1e-3)
        check_close(found, u[0, 0], "true preference", atol=1e-12)
    with h.case("costs shifted by 1000 gamma (gamma = 0.02) give the same true preference"):
        check_close(f(u, C + 20.0, 0.02), true_preference(u, C, 0.02), "true preference", atol=1e-13)
    with h.case("the identity cost matrix (zero on the diagonal, +inf elsewhere) keeps the preference where it is"):
        inf_off = torch.full((n, n), float("inf")).fill_diagonal_(0.0)
        check_close(f(u, inf_off, 0.7), u, "true preference", atol=1e-15)


def _causal_t5_preference(h):
    from attnopt.fenchel import t5_preference as lib

    f, g = h.student("causal_t5_preference"), h.rng()
    n = 9
    beta = 2 * torch.randn(2, 4, n, generator=g)
    padding = torch.rand(2, 1, n, generator=g) < 0.7
    padding[..., 0] = True
    offset = torch.arange(n)[:, None] - torch.arange(n)[None, :]
    bias = beta[..., offset.clamp(min=0)]
    mask = (offset >= 0) & padding.unsqueeze(-2)
    with h.case("a (2, 4, 9) table of biases with a (2, 1, 9) padding agrees with attnopt's t5_preference with the "
                "causal mask"):
        u = f(beta, padding)
        check_shape(u, (2, 4, n, n), "u")
        check_close(u, lib(bias, mask), "u", atol=1e-14)
    with h.case("a table of 700 does not overflow"):
        check_close(f(beta + 700.0, padding), lib(bias, mask), "u for the biases + 700")
    with h.case("no padding: the first query attends to itself only, and the last to every key"):
        u = f(beta[0, 0], torch.ones(n, dtype=torch.bool))
        check_one_hot(u[0], torch.eye(n)[0], "the first row of u")
        check_close(u[-1], torch.softmax(beta[0, 0].flip(-1), -1), "the last row of u", atol=1e-14)


# ---------------------------------------------------------------- Task 7


def dual_sensitivity(h):
    """Variant 1: the Jacobians in the observation b; variant 2: the derivatives along a change of the bias."""
    return (_evidence_sensitivity, _bias_sensitivity)[h.variant - 1](h)


def _sensitivity_problems(g):
    """Templates, a preference of full support and one with two masked templates, as in hidden_checks.py."""
    n, d = 10, 3
    T = torch.randn(n, d, generator=g)
    u = shared._normalize(torch.rand(n, generator=g) + 0.05)
    u_masked = u.clone()
    u_masked[[0, 5]] = 0.0
    return T, u, shared._normalize(u_masked)


def _evidence_sensitivity(h):
    from attnopt.fenchel import exact_estimate, solve_dual

    f, g = h.student("evidence_sensitivity"), h.rng()
    T, u, u_masked = _sensitivity_problems(g)
    d, step = T.shape[1], 1e-5
    for alpha, pref, which in ((0.3, u, "full support"), (1.5, u, "full support"), (0.9, u_masked, "two masked templates")):
        b = pref @ T + torch.randn(d, generator=g)
        with h.case(f"{which}, alpha = {alpha}: agrees with central differences of solve_dual and exact_estimate in b"):
            moved = [(b + step * e, b - step * e) for e in torch.eye(d)]
            fd_lam = torch.stack([(solve_dual(p, T, pref, alpha) - solve_dual(m, T, pref, alpha)) / (2 * step)
                                  for p, m in moved], -1)
            fd_h = torch.stack([(exact_estimate(p, T, pref, alpha) - exact_estimate(m, T, pref, alpha)) / (2 * step)
                                for p, m in moved], -1)
            dlam, dh = f(solve_dual(b, T, pref, alpha), T, pref, alpha)
            check_close(dlam, fd_lam, "d lambda*/d b", atol=1e-6)
            check_close(dh, fd_h, "d h/d b", atol=1e-6)
    with h.case("a 40 x 40 Gauss-Hermite grid of N(mu, cov): the Gaussian closed forms alpha (I + alpha cov)^-1 and "
                "alpha cov (I + alpha cov)^-1"):
        cov = _spd(2, g)
        mu, z, alpha = torch.randn(2, generator=g), torch.randn(2, generator=g), 0.7
        templates, grid_u = shared._hermite_grid(mu, cov)
        inv = torch.linalg.inv(torch.eye(2) + alpha * cov)
        dlam, dh = f(solve_dual(mu + z, templates, grid_u, alpha), templates, grid_u, alpha)
        check_close(dlam, alpha * inv, "d lambda*/d b", atol=1e-9)
        check_close(dh, alpha * cov @ inv, "d h/d b", atol=1e-9)
    with h.case("alpha = 1e-6: d lambda*/d b is alpha I (the small-alpha query is tangent), and d h/d b is alpha Sigma_u"):
        b = u @ T + torch.randn(d, generator=g)
        dlam, dh = f(solve_dual(b, T, u, 1e-6), T, u, 1e-6)
        sigma_u = T.T @ (torch.diag(u) - torch.outer(u, u)) @ T
        check_close(dlam / 1e-6, torch.eye(d), "d lambda*/d b divided by alpha", atol=1e-4)
        check_close(dh / 1e-6, sigma_u, "d h/d b divided by alpha", atol=1e-4)


def _bias_sensitivity(h):
    from attnopt.fenchel import solve_dual

    f, g = h.student("bias_sensitivity"), h.rng()
    T, u, u_masked = _sensitivity_problems(g)
    n, d, step = *T.shape, 1e-5
    for alpha, pref, which in ((0.3, u, "full support"), (1.5, u, "full support"), (0.9, u_masked, "two masked templates")):
        b = pref @ T + torch.randn(d, generator=g)
        v = 2 * torch.randn(n, generator=g)
        with h.case(f"{which}, alpha = {alpha}: agrees with central differences of solve_dual along u exp(eps v)"):
            tilted = lambda eps: torch.softmax(torch.log(pref) + eps * v, dim=-1)
            weights = lambda lam, eps: torch.softmax(torch.log(tilted(eps)) + T @ lam, dim=-1)
            up, down = solve_dual(b, T, tilted(step), alpha), solve_dual(b, T, tilted(-step), alpha)
            dlam, dp = f(solve_dual(b, T, pref, alpha), T, pref, v, alpha)
            check_close(dlam, (up - down) / (2 * step), "d lambda*/d eps", atol=1e-6)
            check_close(dp, (weights(up, step) - weights(down, -step)) / (2 * step), "dp/d eps", atol=1e-6)
            check(bool(torch.all(dp[pref == 0] == 0)), "dp/d eps at the masked templates", "exactly 0", dp[pref == 0])
    with h.case("a 40 x 40 Gauss-Hermite grid of N(mu, cov) and the linear change v(t) = <w, t>: the Gaussian closed "
                "form -alpha (I + alpha cov)^-1 cov w"):
        cov = _spd(2, g)
        mu, z, w, alpha = torch.randn(2, generator=g), torch.randn(2, generator=g), torch.randn(2, generator=g), 0.7
        templates, grid_u = shared._hermite_grid(mu, cov)
        dlam, _ = f(solve_dual(mu + z, templates, grid_u, alpha), templates, grid_u, templates @ w, alpha)
        check_close(dlam, -alpha * torch.linalg.solve(torch.eye(2) + alpha * cov, cov @ w), "d lambda*/d eps", atol=1e-9)
    with h.case("alpha = 1e-6: the query barely moves, -alpha Cov_u(t, v), and the weights move by the bias alone"):
        b, v = u @ T + torch.randn(d, generator=g), torch.randn(n, generator=g)
        dlam, dp = f(solve_dual(b, T, u, 1e-6), T, u, v, 1e-6)
        check_close(dlam / 1e-6, -T.T @ (u * (v - u @ v)), "d lambda*/d eps divided by alpha", atol=1e-4)
        check_close(dp, u * (v - u @ v), "dp/d eps", atol=1e-5)
