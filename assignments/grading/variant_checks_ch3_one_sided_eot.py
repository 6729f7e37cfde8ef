"""The hidden checks of the variants of Assignment 3 (``assignments/variants/ch3_one_sided_eot.py``).

``hidden_checks.py`` runs the function named after the task when the course drew a variant k >= 1 of
it (``h.variant``; its parameters are ``h.params``). Like ``hidden_checks.py``, this file is public:
the inputs are drawn from the course secret, the properties checked are these.
"""

from __future__ import annotations

import math

import torch

from coursework import check, check_close, check_shape


def sparsemax_backward(h):
    """Variants 1 and 2: the backward pass of alpha-entmax for alpha = h.params["alpha"]."""
    return _entmax_backward(h, h.params["alpha"])


def softmax_backward(h):
    """Variant 1: the backward pass of log-softmax; variant 2: of the attention output p @ values."""
    return (_log_softmax_backward, _output_backward)[h.variant - 1](h)


def lse_hessian(h):
    """Variant 1: the Hessian of the transport value in the costs; variant 2: of sparsemax's potential."""
    return (_value_hessian, _sparsemax_potential_hessian)[h.variant - 1](h)


def eot_value(h):
    """Variant 1: the value with a prior (Proposition 3.7); variant 2: the value of sparse transport."""
    return (_eot_value_prior, _sparse_eot_value)[h.variant - 1](h)


def entmax_temperature_derivatives(h):
    """Variant 1: how alpha-entmax moves with alpha at a fixed tau; variant 2: the threshold and the output in tau."""
    return (_entmax_alpha_derivatives, _entmax_threshold_output_derivatives)[h.variant - 1](h)


def _entmax_backward(h, alpha):
    from attnopt.transforms import entmax

    f, g = h.student("entmax_backward"), h.rng()
    for scale, tau in ((0.3, 1.0), (2.0, 0.5), (5.0, 2.0)):
        with h.case(f"a (5, 3, 12) batch of scores of scale {scale}, tau = {tau}, agrees with autograd through "
                    f"{alpha:.4g}-entmax"):
            s = (scale * torch.randn(5, 3, 12, generator=g)).requires_grad_(True)
            p = entmax(s / tau, alpha)
            upstream = torch.randn(5, 3, 12, generator=g)
            (expected,) = torch.autograd.grad((p * upstream).sum(), s)
            check_close(f(p.detach(), upstream, tau), expected, "d loss / d scores", atol=1e-11)
    with h.case("keys of weight 0 get a gradient of exactly 0"):
        s = 8 * torch.randn(6, 12, generator=g)
        p = entmax(s, alpha)
        found = f(p, torch.randn(6, 12, generator=g), 1.0)
        check(bool(torch.all(found[p == 0] == 0)), "d loss / d scores off the support", "exactly 0", found[p == 0].abs().max())
    with h.case("a single key gets zero gradient"):
        check_close(f(torch.ones(2, 1), torch.randn(2, 1, generator=g), 1.0), torch.zeros(2, 1), "d loss / d scores")


def _log_softmax_backward(h):
    f, g = h.student("log_softmax_backward"), h.rng()
    for tau in (0.3, 1.0, 2.5):
        with h.case(f"a (4, 6) batch, tau = {tau}, agrees with autograd through log_softmax"):
            s = torch.randn(4, 6, generator=g, requires_grad=True)
            u = torch.randn(4, 6, generator=g)
            (expected,) = torch.autograd.grad((torch.log_softmax(s / tau, -1) * u).sum(), s)
            check_close(f(torch.softmax(s / tau, -1).detach(), u, tau), expected, "d loss / d scores", atol=1e-13)
    with h.case("a non-linear loss of the log-probabilities, (2, 3, 8) batch, tau = 0.8, agrees with autograd"):
        s = torch.randn(2, 3, 8, generator=g, requires_grad=True)
        ell = torch.log_softmax(s / 0.8, -1)
        ell_leaf = ell.detach().requires_grad_(True)
        loss = lambda x: (torch.cos(x) * torch.arange(8.0)).sum()
        (grad_s,) = torch.autograd.grad(loss(ell), s)
        (grad_ell,) = torch.autograd.grad(loss(ell_leaf), ell_leaf)
        check_close(f(torch.softmax(s / 0.8, -1).detach(), grad_ell, 0.8), grad_s, "d loss / d scores", atol=1e-12)


def _output_backward(h):
    f, g = h.student("output_backward"), h.rng()
    for tau, d in ((0.3, 2), (1.0, 5), (2.5, 1)):
        with h.case(f"a (2, 4, 6) batch with values of dimension {d}, tau = {tau}, agrees with autograd"):
            s = torch.randn(2, 4, 6, generator=g, requires_grad=True)
            values = torch.randn(2, 4, 6, d, generator=g)
            grad_output = torch.randn(2, 4, d, generator=g)
            p = torch.softmax(s / tau, -1)
            (expected,) = torch.autograd.grad(((p.unsqueeze(-1) * values).sum(-2) * grad_output).sum(), s)
            check_close(f(p.detach(), values, grad_output, tau), expected, "d loss / d scores", atol=1e-13)
    with h.case("a non-linear loss of the output, 9 keys, tau = 1.3, agrees with autograd"):
        s = torch.randn(3, 9, generator=g, requires_grad=True)
        values = torch.randn(3, 9, 4, generator=g)
        p = torch.softmax(s / 1.3, -1)
        out = (p.unsqueeze(-1) * values).sum(-2)
        out_leaf = out.detach().requires_grad_(True)
        loss = lambda o: torch.sin(o).pow(2).sum()
        (grad_s,) = torch.autograd.grad(loss(out), s)
        (grad_o,) = torch.autograd.grad(loss(out_leaf), out_leaf)
        check_close(f(p.detach(), values, grad_o, 1.3), grad_s, "d loss / d scores", atol=1e-13)


def _value_hessian(h):
    from attnopt.geometry import fisher_information

    f, g = h.student("value_hessian"), h.rng()
    C = torch.randn(3, 4, 5, generator=g)
    with h.case("a (3, 4, 5) batch, eps = 2, is minus the Fisher information of the plan over eps"):
        check_close(f(C, 2.0), -fisher_information(torch.softmax(-C / 2.0, -1)) / 2.0, "Hessian", atol=1e-14)
    with h.case("the Hessian is the derivative of the plan softmax(-C / eps), by autograd (eps = 0.7)"):
        c = torch.randn(6, generator=g)
        jac = torch.autograd.functional.jacobian(lambda x: torch.softmax(-x / 0.7, -1), c)
        check_close(f(c, 0.7), jac, "Hessian", atol=1e-13)
    with h.case("costs of size 1000 do not overflow"):
        c = -1000 + torch.randn(4, generator=g)
        check_close(f(c, 0.5), -fisher_information(torch.softmax(-c / 0.5, -1)) / 0.5, "Hessian", atol=1e-12)


def _sparsemax_potential_hessian(h):
    from attnopt.transforms import sparsemax

    f, g = h.student("sparsemax_potential_hessian"), h.rng()
    for scale, tau in ((0.3, 1.0), (3.0, 0.5), (6.0, 2.0)):
        with h.case(f"a (2, 3, 9) batch of scores of scale {scale}, tau = {tau}, is the Jacobian of sparsemax"):
            s = scale * torch.randn(2, 3, 9, generator=g)
            jac = torch.autograd.functional.jacobian(lambda x: sparsemax(x / tau), s)  # (2, 3, 9, 2, 3, 9)
            rows = torch.stack([jac[i, j, :, i, j, :] for i in range(2) for j in range(3)]).reshape(2, 3, 9, 9)
            check_close(f(s, tau), rows, "Hessian", atol=1e-13)
    with h.case("a single key in the support: the Hessian is 0"):
        s = torch.tensor([5.0, -3.0, -4.0, -6.0])
        check_close(f(s, 1.0), torch.zeros(4, 4), "Hessian", atol=1e-14)
    with h.case("scores of size 1000 give the same Hessian as the scores minus 1000"):
        s = torch.randn(5, generator=g)
        check_close(f(s + 1000, 0.4), f(s, 0.4), "Hessian", atol=1e-10)


def _eot_value_prior(h):
    from attnopt.transforms import one_sided_eot

    f, g = h.student("eot_value_prior"), h.rng()
    C = torch.randn(3, 6, generator=g)
    C[:, 2] = float("inf")
    prior = torch.rand(3, 6, generator=g) + 0.05
    prior[:, 4] = 0.0
    prior = prior / prior.sum(-1, keepdim=True)
    with h.case("a (3, 6) batch with a cost +inf and a prior weight 0: the gradient is one_sided_eot's plan, zero at both"):
        leaf = C.clone().requires_grad_(True)
        v = f(leaf, 0.3, prior)
        check_shape(v, (3,), "value")
        (grad,) = torch.autograd.grad(v.sum(), leaf)
        check_close(grad, one_sided_eot(C, eps=0.3, regularizer="kl", prior=prior), "gradient", atol=1e-10)
    with h.case("as eps -> 0 the value tends to the smallest cost among the keys the prior allows (eps = 1e-4)"):
        allowed = torch.where(prior > 0, C, torch.full_like(C, float("inf")))
        check_close(f(C, 1e-4, prior), allowed.min(-1).values, "value", atol=1e-2)
    with h.case("a uniform prior gives the entropic value plus eps log m"):
        c = torch.randn(7, generator=g)
        entropic = -0.6 * torch.logsumexp(-c / 0.6, -1)
        check_close(f(c, 0.6, torch.full((7,), 1 / 7)), entropic + 0.6 * math.log(7), "value", atol=1e-12)
    with h.case("costs of size 1000 eps do not overflow"):
        c = torch.randn(4, generator=g)
        pi = torch.tensor([0.1, 0.2, 0.3, 0.4])
        check_close(f(c + 1000 * 0.2, 0.2, pi), f(c, 0.2, pi) + 1000 * 0.2, "value of C + 1000 eps", atol=1e-9)


def _sparse_eot_value(h):
    from attnopt.transforms import one_sided_eot

    f, g = h.student("sparse_eot_value"), h.rng()
    C = torch.randn(3, 7, generator=g)
    C[:, 3] = float("inf")
    with h.case("a (3, 7) batch with a forbidden key: the gradient is one_sided_eot's sparse plan, zero at the key"):
        leaf = C.clone().requires_grad_(True)
        v = f(leaf, 0.4)
        check_shape(v, (3,), "value")
        (grad,) = torch.autograd.grad(v.sum(), leaf)
        check_close(grad, one_sided_eot(C, eps=0.4, regularizer="sparsemax"), "gradient", atol=1e-10)
    with h.case("the value is the objective at the plan, <C, p> + eps/2 |p|^2 (eps = 1.5)"):
        c = 2 * torch.randn(4, 9, generator=g)
        plan = one_sided_eot(c, eps=1.5, regularizer="sparsemax")
        check_close(f(c, 1.5), (c * plan).sum(-1) + 0.75 * (plan * plan).sum(-1), "value", atol=1e-10)
    with h.case("a key far cheaper than the others takes all the mass: the value is its cost plus eps/2"):
        c = torch.tensor([-5.0, 3.0, 4.0, 2.5])
        check_close(f(c, 0.5), torch.tensor(-5.0 + 0.25), "value", atol=1e-12)
    with h.case("costs of size 1000 do not overflow"):
        c = torch.randn(5, generator=g)
        check_close(f(c + 1000.0, 0.3), f(c, 0.3) + 1000.0, "value of C + 1000", atol=1e-9)


def _alpha_rates(s, tau, alpha):
    """d/dalpha of p = entmax_alpha(s / tau), of <s, p> and of H_alpha(p), by forward-mode autograd through one
    Newton step of the threshold equation sum_j [(alpha - 1) z_j - lam]_+^(1/(alpha - 1)) = 1, started at the
    threshold of attnopt's entmax: at the root the step's derivative in alpha is the implicit one."""
    from attnopt.transforms import entmax

    z = s / tau
    p0 = entmax(z, alpha)
    top = p0.argmax(-1, keepdim=True)
    lam0 = (alpha - 1) * z.gather(-1, top) - p0.gather(-1, top) ** (alpha - 1)
    r0 = (alpha - 1) * z - lam0
    slope = -torch.where(r0 > 0, r0.clamp(min=0) ** ((2 - alpha) / (alpha - 1)), 0.0).sum(-1, keepdim=True) / (alpha - 1)

    def rates(a):
        def weights(lam):
            r = (a - 1) * z - lam
            on = r > 0
            return torch.where(on, torch.where(on, r, 1.0) ** (1 / (a - 1)), 0.0)

        p = weights(lam0 - (weights(lam0).sum(-1, keepdim=True) - 1) / slope)
        return p, (p * torch.where(p > 0, s, 0.0)).sum(-1), (p - p**a).sum(-1) / (a * (a - 1))

    return torch.autograd.functional.jvp(rates, torch.tensor(alpha), torch.ones(()))[1]


def _entmax_alpha_derivatives(h):
    from attnopt.transforms import entmax

    f, g = h.student("entmax_alpha_derivatives"), h.rng()
    for alpha, scale in ((1.25, 1.0), (1.5, 3.0), (2.0, 2.0)):
        s = scale * torch.randn(3, 5, 11, generator=g)
        tau = 0.3 + 1.5 * float(torch.rand(1, generator=g))
        with h.case(f"a (3, 5, 11) batch of scores of scale {scale}, alpha = {alpha}, tau = {tau:.3f}, agrees with "
                    "autograd in alpha through the threshold equation of entmax"):
            dp, d_mean, d_entropy = f(entmax(s / tau, alpha), s, tau, alpha)
            expected = _alpha_rates(s, tau, alpha)
            check_close(dp, expected[0], "dp/dalpha", atol=1e-10)
            check_close(d_mean, expected[1], "d<s, p>/dalpha", atol=1e-10)
            check_close(d_entropy, expected[2], "dH/dalpha", atol=1e-10)
    alpha = 1.1 + 0.9 * float(torch.rand(1, generator=g))
    with h.case(f"masked keys (score -inf) change nothing: the rows without them give the same rates (alpha = {alpha:.3f})"):
        s = 2 * torch.randn(4, 10, generator=g)
        masked = s.clone()
        masked[:, 7:] = -float("inf")
        dp, d_mean, d_entropy = f(entmax(masked / 0.7, alpha), masked, 0.7, alpha)
        kept = f(entmax(s[:, :7] / 0.7, alpha), s[:, :7], 0.7, alpha)
        check_close(dp, torch.cat([kept[0], torch.zeros(4, 3)], -1), "dp/dalpha", atol=1e-12)
        check_close(d_mean, kept[1], "d<s, p>/dalpha", atol=1e-12)
        check_close(d_entropy, kept[2], "dH/dalpha", atol=1e-12)
    with h.case("alpha = 2 with most keys outside the support: their derivative is exactly 0"):
        s = 8 * torch.randn(6, 12, generator=g)
        p = entmax(s, 2.0)
        dp = f(p, s, 1.0, 2.0)[0]
        check(bool(torch.all(dp[p == 0] == 0)), "dp/dalpha off the support", "exactly 0", dp[p == 0].abs().max())
    alpha = 1.1 + 0.9 * float(torch.rand(1, generator=g))
    with h.case(f"a (50, 8) batch: the expected score never falls and the entropy never rises with alpha (alpha = {alpha:.3f})"):
        s = 3 * torch.randn(50, 8, generator=g)
        _, d_mean, d_entropy = f(entmax(s / 1.3, alpha), s, 1.3, alpha)
        check(bool(torch.all(d_mean >= -1e-12)), "the smallest d<s, p>/dalpha", ">= 0", d_mean.min())
        check(bool(torch.all(d_entropy <= 1e-12)), "the largest dH/dalpha", "<= 0", d_entropy.max())
    with h.case("equal scores on the support do not move (alpha = 1.5), whatever their size"):
        s = torch.tensor([[0.3, 0.3, 0.3, -40.0], [1000.0, 1000.0, -30.0, -30.0]])
        dp, d_mean, _ = f(entmax(s, 1.5), s, 1.0, 1.5)
        check_close(dp, torch.zeros(2, 4), "dp/dalpha", atol=1e-12)
        check_close(d_mean, torch.zeros(2), "d<s, p>/dalpha", atol=1e-9)
    with h.case("scores shifted by 1000 give the same rates (alpha = 1.7, tau = 0.45)"):
        s = torch.randn(4, 8, generator=g)
        base = f(entmax(s / 0.45, 1.7), s, 0.45, 1.7)
        shifted = f(entmax((s + 1000) / 0.45, 1.7), s + 1000, 0.45, 1.7)
        for what, x, y in zip(("dp/dalpha", "d<s, p>/dalpha", "dH/dalpha"), shifted, base):
            check_close(x, y, what, atol=1e-8)


def _entmax_threshold_output_derivatives(h):
    from attnopt.transforms import entmax

    f, g = h.student("entmax_threshold_output_derivatives"), h.rng()
    jvp = torch.autograd.functional.jvp
    for alpha, scale, d in ((1.25, 1.0, 4), (1.5, 3.0, 1), (2.0, 2.0, 3)):
        s = scale * torch.randn(3, 5, 11, generator=g)
        values = torch.randn(3, 5, 11, d, generator=g)
        tau = 0.3 + 1.5 * float(torch.rand(1, generator=g))
        with h.case(f"a (3, 5, 11) batch of scores of scale {scale}, values of dimension {d}, alpha = {alpha}, "
                    f"tau = {tau:.3f}, agrees with autograd through entmax"):
            top = entmax(s / tau, alpha).argmax(-1, keepdim=True)
            at, one = torch.tensor(tau), torch.ones(())
            threshold = lambda t: ((alpha - 1) * s.gather(-1, top) / t - entmax(s / t, alpha).gather(-1, top) ** (alpha - 1)).squeeze(-1)
            output = lambda t: (entmax(s / t, alpha).unsqueeze(-1) * values).sum(-2)
            d_threshold, d_output = f(entmax(s / tau, alpha), s, values, tau, alpha)
            check_shape(d_threshold, (3, 5), "d threshold/dtau")
            check_close(d_threshold, jvp(threshold, at, one)[1], "d threshold/dtau", atol=1e-10)
            check_close(d_output, jvp(output, at, one)[1], "d output/dtau", atol=1e-10)
    alpha = 1.1 + 0.9 * float(torch.rand(1, generator=g))
    with h.case(f"masked keys (score -inf) change nothing: the rows without them give the same rates (alpha = {alpha:.3f})"):
        s = 2 * torch.randn(4, 10, generator=g)
        values = torch.randn(4, 10, 2, generator=g)
        masked = s.clone()
        masked[:, 7:] = -float("inf")
        found = f(entmax(masked / 0.7, alpha), masked, values, 0.7, alpha)
        kept = f(entmax(s[:, :7] / 0.7, alpha), s[:, :7], values[:, :7], 0.7, alpha)
        check_close(found[0], kept[0], "d threshold/dtau", atol=1e-12)
        check_close(found[1], kept[1], "d output/dtau", atol=1e-12)
    with h.case("alpha = 2: the threshold moves at minus the plain mean score of the support over tau^2, eq. (3.17)"):
        s = 4 * torch.randn(6, 12, generator=g)
        p = entmax(s / 0.6, 2.0)
        support = (p > 0).to(s.dtype)
        mean = (support * s).sum(-1) / support.sum(-1)
        check_close(f(p, s, torch.randn(6, 12, 2, generator=g), 0.6, 2.0)[0], -mean / 0.36, "d threshold/dtau", atol=1e-10)
    with h.case("a single key in the support: the output does not move, the threshold follows that key's score"):
        s = torch.tensor([[5.0, -30.0, -30.0, -30.0], [-40.0, 2.0, -35.0, -38.0]])
        d_threshold, d_output = f(entmax(s, 1.5), s, torch.randn(2, 4, 3, generator=g), 1.0, 1.5)
        check_close(d_output, torch.zeros(2, 3), "d output/dtau", atol=1e-14)
        check_close(d_threshold, -0.5 * torch.tensor([5.0, 2.0]), "d threshold/dtau", atol=1e-13)
    alpha = 1.1 + 0.9 * float(torch.rand(1, generator=g))
    with h.case(f"scores shifted by 1000 and values shifted by one vector (alpha = {alpha:.3f}, tau = 0.45): the output's "
                "rate is unchanged, the threshold's falls by (alpha - 1) 1000 / tau^2"):
        s = torch.randn(4, 8, generator=g)
        values = torch.randn(4, 8, 3, generator=g)
        base = f(entmax(s / 0.45, alpha), s, values, 0.45, alpha)
        shifted = f(entmax((s + 1000) / 0.45, alpha), s + 1000, values + torch.randn(4, 1, 3, generator=g), 0.45, alpha)
        check_close(shifted[1], base[1], "d output/dtau", atol=1e-9)
        check_close(shifted[0], base[0] - (alpha - 1) * 1000 / 0.45**2, "d threshold/dtau", atol=1e-8)
