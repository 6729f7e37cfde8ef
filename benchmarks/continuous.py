"""2D continuous sparsemax: forward + backward, ours vs Algorithm 4 of the thesis as written.

Setting of §6.2 of the continuous-attention thesis: batch 64, N = 100 Gaussian RBFs on a 10x10 grid
of the unit square with Sigma_j = 0.001 I, attention ellipses moment-matched from discrete
attention over a 14x14 grid.  Timings in float32, accuracy in float64.

Baselines, written here from Algorithm 4 and Appendix A.2 (eqs. A.17, A.22, A.24-A.27, A.31, A.34,
A.40):

* ``alg4-angle-loop``: a Python loop over I = 100 angles ``torch.linspace(0, 2*pi, 100)`` (both
  endpoints, weight 2*pi/I each, the "1D-Naive" rule of Table 4.1), vectorized over batch and basis
  functions, in the forward pass and again in the backward pass (the backward recomputes s~(beta)
  and evaluates G, H, M);
* ``alg4-literal``: the same, but the backward loops over basis functions j and then angles, as the
  pseudo-code of Algorithm 4 does (timed once, it is slow).

Ours: :func:`attnopt.continuous.continuous_sparsemax` (periodic trapezoid rule with n nodes and no
duplicated endpoint, all angles at once; the backward reuses the moments of the forward pass).

Accuracy: relative error ||r - r_ref|| / ||r_ref|| of the forward output, with r_ref from
``scipy.integrate.dblquad`` over the supporting ellipse (float64); gradients are compared with our
own output at 8192 nodes.

Run:  python benchmarks/continuous.py  [--threads K] [--literal] [--top K]
"""

from __future__ import annotations

import argparse
import math
import platform
import time

import numpy as np
import torch
from scipy import integrate
from torch.utils import benchmark

from attnopt.continuous import (
    DEFAULT_N_QUADRATURE,
    GaussianRBF,
    continuous_sparsemax,
    grid_locations,
    moment_match,
)


# ------------------------------------------------------------------------------------------------
# Baseline: Algorithm 4 as written in the thesis
# ------------------------------------------------------------------------------------------------


def _npdf(x):
    return torch.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


def _sqrtm(S):
    ev, Q = torch.linalg.eigh(S)
    return Q @ torch.diag_embed(ev.sqrt()) @ Q.transpose(-1, -2)


def _alg4_setup(mu, Sigma, centers, cov):
    lam = -(math.pi * torch.linalg.det(Sigma).sqrt()) ** -0.5  # (A.14)          (B,)
    S_half = _sqrtm(Sigma)
    S_mhalf = torch.linalg.inv(S_half)
    k = (-2 * lam) ** -0.5
    mu_t = k[:, None, None] * (S_mhalf[:, None] @ (centers[None] - mu[:, None]).unsqueeze(-1)).squeeze(-1)  # (B,N,2)
    Sig_t = (k**2)[:, None, None, None] * (S_mhalf[:, None] @ cov[None] @ S_mhalf[:, None])  # (B,N,2,2)
    Sig_t_inv = torch.linalg.inv(Sig_t)
    det_t = torch.linalg.det(Sig_t)
    return lam, S_half, mu_t, Sig_t_inv, det_t


def _alg4_angle(beta, mu_t, Sig_t_inv, det_t):
    """s~(beta), sigma, r0 of eq. (A.17) for one angle (vectorized over batch and basis)."""
    a = torch.stack([torch.cos(beta), torch.sin(beta)]).to(mu_t.dtype)
    Pa = Sig_t_inv @ a  # (B,N,2)
    sigma2 = 1.0 / (Pa @ a)
    r0 = sigma2 * (Pa * mu_t).sum(-1)
    Pm = (Sig_t_inv @ mu_t.unsqueeze(-1)).squeeze(-1)
    quad = (mu_t * Pm).sum(-1) - sigma2 * (Pa * mu_t).sum(-1) ** 2  # mu~^T P mu~ with P of (A.17)
    sigma = sigma2.sqrt()
    s_t = sigma / (math.sqrt(2 * math.pi) * det_t.sqrt()) * torch.exp(-0.5 * quad)
    return a, s_t, sigma, r0


def alg4_forward(mu, Sigma, centers, cov, I=100):
    lam, _, mu_t, Sig_t_inv, det_t = _alg4_setup(mu, Sigma, centers, cov)
    r = torch.zeros(mu_t.shape[:-1], dtype=mu.dtype)
    for beta in torch.linspace(0, 2 * math.pi, I, dtype=torch.float64):
        _, s_t, sigma, r0 = _alg4_angle(beta, mu_t, Sig_t_inv, det_t)
        hi, lo = (1 - r0) / sigma, -r0 / sigma
        erfd = torch.erf(hi / math.sqrt(2)) - torch.erf(lo / math.sqrt(2))
        F = (
            (2 * sigma**3 + r0**2 * sigma + r0 * sigma) * _npdf(hi)
            - (2 * sigma**3 + r0**2 * sigma - sigma) * _npdf(lo)
            - (r0**3 + (3 * sigma**2 - 1) * r0) / 2 * erfd
        )  # (A.22)
        r = r - 2 * math.pi * lam[:, None] * s_t * F / I
    return r


def _alg4_GHM(a, s_t, sigma, r0, k, S_half, mu):
    """s~ G, s~ H, s~ M for one angle; shapes (B,N,2), (B,N), (B,N,2,2)."""
    hi, lo = (1 - r0) / sigma, -r0 / sigma
    erfd = torch.erf(hi / math.sqrt(2)) - torch.erf(lo / math.sqrt(2))
    Na, Nb = _npdf(lo), _npdf(hi)
    ka = k[:, None] * (S_half @ a)  # (B,2): (-2 lambda)^{1/2} Sigma^{1/2} a
    ka_ = ka[:, None, :]
    mu_ = mu[:, None, :]
    sg, r0_ = sigma[..., None], r0[..., None]
    G = (ka_ * sg * r0_ + mu_ * sg) * Na[..., None] - (ka_ * sg * (1 + r0_) + mu_ * sg) * Nb[..., None] + 0.5 * (
        ka_ * (sg**2 + r0_**2) + mu_ * r0_
    ) * erfd[..., None]  # (A.31)
    H = sigma * (Na - Nb) + r0 / 2 * erfd  # (A.34)
    Am = (ka[:, :, None] * ka[:, None, :])[:, None]  # (A.36)
    Bm = (ka[:, :, None] * mu[:, None, :] + mu[:, :, None] * ka[:, None, :])[:, None]  # (A.37)
    Cm = (mu[:, :, None] * mu[:, None, :])[:, None]  # (A.38)
    s4, r4 = sigma[..., None, None], r0[..., None, None]
    At, Bt = s4**3 * Am, s4**2 * (3 * r4 * Am + Bm)
    Ct, Dt = s4 * (3 * r4**2 * Am + 2 * r4 * Bm + Cm), r4**3 * Am + r4**2 * Bm + r4 * Cm  # (A.41)
    lo4, hi4 = lo[..., None, None], hi[..., None, None]
    M = (
        ((2 + lo4**2) * At + lo4 * Bt + Ct) * Na[..., None, None]
        - ((2 + hi4**2) * At + hi4 * Bt + Ct) * Nb[..., None, None]
        + 0.5 * (Bt + Dt) * erfd[..., None, None]
    )  # (A.40)
    return s_t[..., None] * G, s_t * H, s_t[..., None, None] * M


def _chain(grad_r, intN, intT, intTT, lam, mu, Sigma):
    area = math.pi / torch.linalg.det(torch.linalg.inv(Sigma) / (-2 * lam)[:, None, None]).sqrt()  # (A.27)
    J1 = intT - mu[:, None] * intN[..., None]  # (A.24), (A.26)
    mm = mu[:, :, None] * mu[:, None, :] + Sigma / area[:, None, None]
    J2 = intTT - mm[:, None] * intN[..., None, None]  # (A.25), (A.26)
    g1 = torch.einsum("bn,bnd->bd", grad_r, J1)
    g2 = torch.einsum("bn,bnde->bde", grad_r, J2)
    Si = torch.linalg.inv(Sigma)
    gm = (Si @ g1[..., None])[..., 0]
    gS = -gm[:, :, None] * (Si @ mu[..., None])[:, None, :, 0] + 0.5 * Si @ g2 @ Si
    return gm, 0.5 * (gS + gS.transpose(-1, -2))


def alg4_backward(grad_r, mu, Sigma, centers, cov, I=100):
    lam, S_half, mu_t, Sig_t_inv, det_t = _alg4_setup(mu, Sigma, centers, cov)
    k = (-2 * lam).sqrt()
    intN = torch.zeros(mu_t.shape[:-1], dtype=mu.dtype)
    intT = torch.zeros(mu_t.shape, dtype=mu.dtype)
    intTT = torch.zeros(mu_t.shape + (2,), dtype=mu.dtype)
    for beta in torch.linspace(0, 2 * math.pi, I, dtype=torch.float64):
        a, s_t, sigma, r0 = _alg4_angle(beta, mu_t, Sig_t_inv, det_t)
        sG, sH, sM = _alg4_GHM(a, s_t, sigma, r0, k, S_half, mu)
        w = 2 * math.pi / I
        intN, intT, intTT = intN + w * sH, intT + w * sG, intTT + w * sM
    return _chain(grad_r, intN, intT, intTT, lam, mu, Sigma)


def alg4_backward_literal(grad_r, mu, Sigma, centers, cov, I=100):
    """The loop nest of Algorithm 4's Backward: for j, for beta."""
    lam, S_half, mu_t, Sig_t_inv, det_t = _alg4_setup(mu, Sigma, centers, cov)
    k = (-2 * lam).sqrt()
    cols_N, cols_T, cols_TT = [], [], []
    for j in range(centers.shape[0]):
        iN = torch.zeros(mu.shape[0], 1, dtype=mu.dtype)
        iT = torch.zeros(mu.shape[0], 1, 2, dtype=mu.dtype)
        iTT = torch.zeros(mu.shape[0], 1, 2, 2, dtype=mu.dtype)
        for beta in torch.linspace(0, 2 * math.pi, I, dtype=torch.float64):
            a, s_t, sigma, r0 = _alg4_angle(beta, mu_t[:, j : j + 1], Sig_t_inv[:, j : j + 1], det_t[:, j : j + 1])
            sG, sH, sM = _alg4_GHM(a, s_t, sigma, r0, k, S_half, mu)
            w = 2 * math.pi / I
            iN, iT, iTT = iN + w * sH, iT + w * sG, iTT + w * sM
        cols_N.append(iN), cols_T.append(iT), cols_TT.append(iTT)
    return _chain(grad_r, torch.cat(cols_N, 1), torch.cat(cols_T, 1), torch.cat(cols_TT, 1), lam, mu, Sigma)


# ------------------------------------------------------------------------------------------------
# Reference: dblquad over the ellipse
# ------------------------------------------------------------------------------------------------


def dblquad_reference(mu, Sigma, centers, cov, keep):
    mu, Sigma = mu.double().numpy(), Sigma.double().numpy()
    C, V = centers.double().numpy(), cov.double().numpy()
    Si = np.linalg.inv(Sigma)
    minus_lam = (math.pi * math.sqrt(np.linalg.det(Sigma))) ** -0.5
    R2 = 2 * minus_lam
    wx = math.sqrt(R2 * Sigma[0, 0])

    def ybounds(x):
        dx = x - mu[0]
        a, b, c = Si[1, 1], 2 * Si[0, 1] * dx, Si[0, 0] * dx * dx - R2
        disc = math.sqrt(max(b * b - 4 * a * c, 0.0))
        return mu[1] + (-b - disc) / (2 * a), mu[1] + (-b + disc) / (2 * a)

    out = []
    for j in keep.tolist():
        Vi = np.linalg.inv(V[j])
        norm = 1 / (2 * math.pi * math.sqrt(np.linalg.det(V[j])))

        def f(y, x):
            d = np.array([x - mu[0], y - mu[1]])
            e = np.array([x - C[j, 0], y - C[j, 1]])
            return max(minus_lam - 0.5 * d @ Si @ d, 0.0) * norm * math.exp(-0.5 * e @ Vi @ e)

        v, _ = integrate.dblquad(
            f, mu[0] - wx, mu[0] + wx, lambda x: ybounds(x)[0], lambda x: ybounds(x)[1], epsabs=1e-14, epsrel=1e-12
        )
        out.append(v)
    return torch.tensor(out, dtype=torch.float64)


# ------------------------------------------------------------------------------------------------


def make_inputs(batch, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    loc = grid_locations(14, dtype=torch.float64)
    centre = 0.2 + 0.6 * torch.rand(batch, 2, generator=g, dtype=torch.float64)
    width = 0.05 + 0.25 * torch.rand(batch, 1, generator=g, dtype=torch.float64)
    noise = 0.5 * torch.randn(batch, 196, generator=g, dtype=torch.float64)
    scores = -((loc - centre[:, None]) ** 2).sum(-1) / (2 * width**2) + noise
    mu, Sigma = moment_match(torch.softmax(scores, -1), loc, "truncated_paraboloid")
    return mu.to(dtype), Sigma.to(dtype)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1: the CI box is shared)")
    ap.add_argument("--literal", action="store_true", help="also time Alg. 4's j-then-angle backward loop (slow)")
    ap.add_argument("--top", type=int, default=8, help="basis functions per case checked with dblquad")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    t_start = time.time()
    batch, n_side, sig = 64, 10, 0.001**0.5

    # ---- timing, float32
    basis = GaussianRBF.grid(n_side, sig, dim=2, dtype=torch.float32)
    mu, Sigma = make_inputs(batch, torch.float32)
    grad = torch.randn(batch, basis.n_basis, generator=torch.Generator().manual_seed(1))
    cen, cov = basis.centers, basis.covariance

    def ours(n):
        m, S = mu.clone().requires_grad_(), Sigma.clone().requires_grad_()
        continuous_sparsemax(m, S, basis, n_quadrature=n).backward(grad)

    def baseline():
        alg4_forward(mu, Sigma, cen, cov)
        alg4_backward(grad, mu, Sigma, cen, cov)

    def baseline_literal():
        alg4_forward(mu, Sigma, cen, cov)
        alg4_backward_literal(grad, mu, Sigma, cen, cov)

    def timeit(fn, min_run_time):
        fn()
        m = benchmark.Timer(stmt="fn()", globals={"fn": fn}).blocked_autorange(min_run_time=min_run_time)
        return m.median

    ns = sorted({64, DEFAULT_N_QUADRATURE})
    t_base = timeit(baseline, 5.0)
    t_ours = {n: timeit(lambda n=n: ours(n), 2.0) for n in ns}
    t_lit = None
    if args.literal:
        t0 = time.perf_counter()
        baseline_literal()
        t_lit = time.perf_counter() - t0

    # ---- accuracy, float64
    basis64 = GaussianRBF.grid(n_side, sig, dim=2, dtype=torch.float64)
    mu64, Sigma64 = make_inputs(batch, torch.float64)
    idx = torch.tensor([0, batch - 1])
    r_hi = continuous_sparsemax(mu64[idx], Sigma64[idx], basis64, n_quadrature=8192)
    keep = r_hi.argsort(dim=-1, descending=True)[:, : args.top]  # the entries that carry the norm
    refs = torch.stack(
        [dblquad_reference(mu64[i], Sigma64[i], basis64.centers, basis64.covariance, keep[k]) for k, i in enumerate(idx)]
    )

    def rel_r(r):
        r = torch.gather(r, 1, keep)
        return ((r - refs).norm(dim=-1) / refs.norm(dim=-1)).max().item()

    def rel(x, y):
        return ((x - y).norm(dim=-1) / y.norm(dim=-1)).max().item()

    def grads(fn):
        m, S = mu64.clone().requires_grad_(), Sigma64.clone().requires_grad_()
        fn(m, S).backward(grad.double())
        return torch.cat([m.grad.flatten(1), S.grad.flatten(1)], 1)

    g_ref = grads(lambda m, S: continuous_sparsemax(m, S, basis64, n_quadrature=8192))
    err = {}
    for n in ns:
        r = continuous_sparsemax(mu64[idx], Sigma64[idx], basis64, n_quadrature=n)
        g = grads(lambda m, S: continuous_sparsemax(m, S, basis64, n_quadrature=n))
        err[n] = (rel_r(r), rel(g, g_ref))
    r_b = alg4_forward(mu64[idx], Sigma64[idx], basis64.centers, basis64.covariance)
    gm, gS = alg4_backward(grad.double(), mu64, Sigma64, basis64.centers, basis64.covariance)
    err_b = (rel_r(r_b), rel(torch.cat([gm.flatten(1), gS.flatten(1)], 1), g_ref))
    err_hi = rel_r(r_hi)

    print(f"# 2D continuous sparsemax, batch {batch}, N = {basis.n_basis} RBFs (Sigma_j = 0.001 I), forward + backward\n")
    print(f"torch {torch.__version__}, {platform.machine()} CPU, torch threads = {torch.get_num_threads()}\n")
    print("| method | angular rule | fwd+bwd, float32 (ms) | speed-up | rel. err. r vs dblquad (f64) | rel. err. grad (f64) |")
    print("|---|---|---:|---:|---:|---:|")
    print(f"| Alg. 4, loop over angles | linspace(0, 2pi, 100), both endpoints | {t_base * 1e3:.1f} | 1.0x | {err_b[0]:.1e} | {err_b[1]:.1e} |")
    if t_lit is not None:
        print(f"| Alg. 4, backward loops j then angles | same | {t_lit * 1e3:.0f} (1 run) | {t_base / t_lit:.2f}x | {err_b[0]:.1e} | {err_b[1]:.1e} |")
    for n, t in t_ours.items():
        tag = " (default n)" if n == DEFAULT_N_QUADRATURE else ""
        print(f"| ours{tag} | periodic trapezoid, n = {n} | {t * 1e3:.1f} | {t_base / t:.1f}x | {err[n][0]:.1e} | {err[n][1]:.1e} |")
    print(f"\nSpeed-up = time(Alg. 4 angle loop) / time(method), medians of torch.utils.benchmark.Timer.")
    print(f"rel. err. r: max over 2 batch elements of ||r - r_dblquad|| / ||r_dblquad|| on the {args.top} largest entries "
          f"(dblquad epsrel 1e-12; ours at n = 8192 vs dblquad: {err_hi:.1e}); grad: max over the batch of "
          "||g - g_ref|| / ||g_ref||, g_ref = ours at n = 8192.")
    print(f"script time {time.time() - t_start:.0f} s")


if __name__ == "__main__":
    main()
