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
