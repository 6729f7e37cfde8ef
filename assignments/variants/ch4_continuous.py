"""The variants of Assignment 4 (continuous and multimodal attention), drawn from the course secret.

Variant 0 of every task is the one in ``source/ch4_continuous/ch4_continuous.ipynb``: the public
one, whose solution anyone can read in this repository. A course never draws it
(``tools/assignments.py``): each task below lists the variants a course draws from, and each changes
what must be derived (another block of the Jacobian, another moment of the support, another member
of the entmax family, another M-step), not only a number, so that a copy of the public solution
fails its checks. ``params`` reach the hidden checks (``h.params``); ``cells`` say how the variant's
notebook differs from variant 0's: a grade id (or ``task:N`` for the text of Task N, ``intro`` for
the table) maps to the cell's new text, or to ``(old, new)`` replacements that must each match once.

Tasks 3 and 7 of the public notebook call the student's ``tp_threshold`` of Task 2, and a course
draws the variant of each task independently: so every variant of Task 2 keeps ``tp_threshold``
(the threshold of Lemma 4.3, eq. (4.25), which the introduction states) and varies the two
functions built on it.
"""

from __future__ import annotations

HIDDEN = "# hidden checks: other inputs, drawn from the course key, when the notebook is graded\n" \
         "from coursework import hidden_checks\n\nhidden_checks(\"{task}\", globals())"


def _row(old: str, new: str) -> tuple[str, str]:
    """A row of the intro's table: ``| N | what you write |`` changes, the points stay."""
    return old, new


# ------------------------------------------------------------------ Task 1: continuous softmax, its derivatives


SOFTMAX_JACOBIAN = {
    "about": "the Jacobian of 1D continuous softmax in the canonical parameters, cov_p(psi_j, t) and cov_p(psi_j, t^2)",
    "params": {"function": "continuous_softmax_1d_jacobian"},
    "cells": {
        "intro": [_row("| 1 | continuous softmax with Gaussian RBFs, in closed form |",
                       "| 1 | the Jacobian of continuous softmax with Gaussian RBFs, in closed form |")],
        "task:1": """## Task 1 · The Jacobian of continuous softmax in closed form (3 points)

Training a continuous attention head needs the derivative of $r_j=\\mathbb E_p[\\psi_j(t)]$ in the
canonical parameter $\\theta=(\\mu/\\sigma^2,-1/(2\\sigma^2))$ of $p=\\mathcal N(\\mu,\\sigma^2)$, whose features
are $\\phi(t)=(t,t^2)$. For $\\alpha=1$, Proposition 4.4 (eq. (4.17)) says that this Jacobian is an
ordinary covariance: its row $j$ is $\\big(\\operatorname{cov}_p(\\psi_j,t),\\ \\operatorname{cov}_p(\\psi_j,t^2)\\big)$.
Using the product of Gaussians of Lemma 4.1 (eqs. (4.19)–(4.20)), derive both entries in closed form
in $D=1$, in terms of $r_j$, the mean $\\tilde\\mu_j$ and the variance $\\tilde\\sigma_j^2$ of the product
(compare with eqs. (4.22)–(4.23)). Say what sign $\\operatorname{cov}_p(\\psi_j,t)$ has when the centre
$c_j$ lies to the right of $\\mu$, and why.

Implement `continuous_softmax_1d_jacobian(mu, sigma2, centers, widths)`: `mu` and `sigma2` (the
variance) of shape `(...)`, `centers` and `widths` (the standard deviations $\\sigma_j$) of shape `(N,)`;
return the pair `(cov_p(psi, t), cov_p(psi, t^2))`, each of shape `(..., N)`, with no integration and
no Python loop over the basis functions.""",
        "continuous_softmax_1d": '''def continuous_softmax_1d_jacobian(mu, sigma2, centers, widths):
    """(cov_p(psi_j, t), cov_p(psi_j, t^2)) for p = N(mu, sigma2) and psi_j = N(t; c_j, w_j^2)."""
    ### BEGIN SOLUTION
    mu, sigma2 = mu[..., None], sigma2[..., None]
    var = sigma2 + widths**2
    r = torch.exp(-0.5 * (mu - centers) ** 2 / var) / torch.sqrt(2 * math.pi * var)  # the scale s~_j
    var_product = sigma2 * widths**2 / var                                          # sigma~_j^2
    mean_product = (widths**2 * mu + sigma2 * centers) / var                        # mu~_j
    # E_p[t psi_j] = r mu~ and E_p[t^2 psi_j] = r (sigma~^2 + mu~^2); E_p[t] = mu, E_p[t^2] = sigma^2 + mu^2
    return r * (mean_product - mu), r * (var_product + mean_product**2 - sigma2 - mu**2)
    ### END SOLUTION''',
        "test_continuous_softmax_1d": '''# Task 1: both covariances against numerical integration (scipy.integrate.quad), against central
# differences of r in the canonical parameters, and batches.
from coursework import check_close, check_shape, own

f = own(continuous_softmax_1d_jacobian, globals())
centers = torch.tensor([-0.5, 0.1, 0.9])
widths = torch.tensor([0.2, 0.35, 0.1])
mu, sigma2 = torch.tensor(0.3), torch.tensor(0.15)
J_t, J_tt = f(mu, sigma2, centers, widths)
check_shape(J_t, (3,), "cov_p(psi_j, t) for one Gaussian and 3 basis functions")
check_shape(J_tt, (3,), "cov_p(psi_j, t^2) for one Gaussian and 3 basis functions")
expect = lambda g: scipy.integrate.quad(lambda t: normal_pdf(t, 0.3, 0.15) * g(t), -np.inf, np.inf, epsabs=1e-14, epsrel=1e-12)[0]
cov_t, cov_tt, plain_t, plain_tt = [], [], [], []
for j in range(3):
    c, s = centers[j].item(), widths[j].item()
    r_j = expect(lambda t: normal_pdf(t, c, s**2))
    plain_t.append(expect(lambda t: t * normal_pdf(t, c, s**2)))
    plain_tt.append(expect(lambda t: t**2 * normal_pdf(t, c, s**2)))
    cov_t.append(plain_t[-1] - 0.3 * r_j)
    cov_tt.append(plain_tt[-1] - (0.15 + 0.3**2) * r_j)
check_close(J_t, torch.tensor(cov_t), "cov_p(psi_j, t) against scipy.integrate.quad", atol=1e-10,
            hint="yours is E_p[t psi_j]: a covariance also subtracts E_p[t] E_p[psi_j]"
            if torch.allclose(J_t, torch.tensor(plain_t), atol=1e-8) else
            "E_p[t psi_j] is a first moment of the scaled Gaussian of Lemma 4.1, eqs. (4.19)-(4.20): check its scale and its mean")
check_close(J_tt, torch.tensor(cov_tt), "cov_p(psi_j, t^2) against scipy.integrate.quad", atol=1e-10,
            hint="yours is E_p[t^2 psi_j]: a covariance also subtracts E_p[t^2] E_p[psi_j]"
            if torch.allclose(J_tt, torch.tensor(plain_tt), atol=1e-8) else
            "a second moment is not a variance: check both second moments, of the product Gaussian and of p")


def r_of_theta(theta1, theta2):  # r as a function of the canonical parameters, eq. (4.21)
    m, v = -theta1 / (2 * theta2), -1 / (2 * theta2)
    return normal_pdf(centers.numpy(), m, v + widths.numpy() ** 2)


theta1, theta2, step = 0.3 / 0.15, -1 / (2 * 0.15), 1e-6
fd_t = (r_of_theta(theta1 + step, theta2) - r_of_theta(theta1 - step, theta2)) / (2 * step)
fd_tt = (r_of_theta(theta1, theta2 + step) - r_of_theta(theta1, theta2 - step)) / (2 * step)
check_close(J_t, torch.tensor(fd_t), "cov_p(psi_j, t) against central differences of r in theta_1", atol=1e-7)
check_close(J_tt, torch.tensor(fd_tt), "cov_p(psi_j, t^2) against central differences of r in theta_2", atol=1e-7)
batch = f(mu.expand(4, 5), sigma2.expand(4, 5), centers, widths)
check_shape(batch[0], (4, 5, 3), "cov_p(psi_j, t) for a (4, 5) batch of Gaussians")
check_shape(batch[1], (4, 5, 3), "cov_p(psi_j, t^2) for a (4, 5) batch of Gaussians")
''' + HIDDEN.format(task="continuous_softmax_1d"),
    },
}

SOFTMAX_BACKWARD = {
    "about": "the backward pass of 1D continuous softmax to its mean and variance, given dL/dr",
    "params": {"function": "continuous_softmax_1d_backward"},
    "cells": {
        "intro": [_row("| 1 | continuous softmax with Gaussian RBFs, in closed form |",
                       "| 1 | the backward pass of continuous softmax with Gaussian RBFs, in closed form |")],
        "task:1": """## Task 1 · The backward pass of continuous softmax in closed form (3 points)

With $p=\\mathcal N(\\mu,\\sigma^2)$ and Gaussian RBFs $\\psi_j(t)=\\mathcal N(t;c_j,\\sigma_j^2)$, the forward pass is
$r_j=\\mathcal N(\\mu;c_j,\\sigma^2+\\sigma_j^2)$, eq. (4.21). A layer downstream hands back the signal
$g_j=\\partial L/\\partial r_j$ (for a context $c=Br$, $g=B^\\top\\partial L/\\partial c$, eq. (4.18)).
Derive $\\partial r_j/\\partial\\mu$ and $\\partial r_j/\\partial\\sigma^2$ in closed form (check the first
against Remark 4.3), and from them $\\partial L/\\partial\\mu$ and $\\partial L/\\partial\\sigma^2$. For which
distances $\\lvert\\mu-c_j\\rvert$ does widening the attention density increase $r_j$?

Implement `continuous_softmax_1d_backward(mu, sigma2, centers, widths, grad_r)`: `mu` and `sigma2`
(the variance) of shape `(...)`, `centers` and `widths` (the standard deviations $\\sigma_j$) of shape
`(N,)`, `grad_r` of shape `(..., N)`; return the pair `(dL/dmu, dL/dsigma2)`, each of shape `(...)`,
with no Python loop over the basis functions (and no autograd inside your function).""",
        "continuous_softmax_1d": '''def continuous_softmax_1d_backward(mu, sigma2, centers, widths, grad_r):
    """(dL/dmu, dL/dsigma2) for r_j = N(mu; c_j, sigma2 + w_j^2), given grad_r = dL/dr."""
    ### BEGIN SOLUTION
    diff = mu[..., None] - centers
    var = sigma2[..., None] + widths**2
    r = torch.exp(-0.5 * diff**2 / var) / torch.sqrt(2 * math.pi * var)
    dr_dmu = -r * diff / var                             # Remark 4.3 in one dimension
    dr_dsigma2 = r * (diff**2 / var - 1) / (2 * var)     # the variance enters the exponent and the normalizer
    return (grad_r * dr_dmu).sum(-1), (grad_r * dr_dsigma2).sum(-1)
    ### END SOLUTION''',
        "test_continuous_softmax_1d": '''# Task 1: against autograd through the closed form (4.21), and against central differences of
# numerical integrals (scipy.integrate.quad); batches.
from coursework import check_close, check_shape, own

f = own(continuous_softmax_1d_backward, globals())
g = torch.Generator().manual_seed(1)
centers = torch.tensor([-0.5, 0.1, 0.9])
widths = torch.tensor([0.2, 0.35, 0.1])
mu = (0.6 * torch.rand(4, 5, generator=g)).requires_grad_(True)
sigma2 = (0.02 + 0.2 * torch.rand(4, 5, generator=g)).requires_grad_(True)
grad_r = torch.randn(4, 5, 3, generator=g)
var = sigma2[..., None] + widths**2
r = torch.exp(-0.5 * (mu[..., None] - centers) ** 2 / var) / torch.sqrt(2 * math.pi * var)
d_mu, d_sigma2 = torch.autograd.grad((r * grad_r).sum(), (mu, sigma2))
# autograd again with the normalizer of eq. (4.21) held fixed, to recognize a frequent slip
var = sigma2[..., None] + widths**2
frozen = torch.exp(-0.5 * (mu[..., None] - centers) ** 2 / var) / torch.sqrt(2 * math.pi * var.detach())
exponent_only = torch.autograd.grad((frozen * grad_r).sum(), sigma2)[0]
mu, sigma2 = mu.detach(), sigma2.detach()
found_mu, found_sigma2 = f(mu, sigma2, centers, widths, grad_r)
check_shape(found_mu, (4, 5), "dL/dmu for a (4, 5) batch")
check_shape(found_sigma2, (4, 5), "dL/dsigma2 for a (4, 5) batch")
check_close(found_mu, d_mu, "dL/dmu against autograd", atol=1e-12,
            hint="yours is minus autograd's: r_j grows as the mean moves towards c_j"
            if torch.allclose(found_mu, -d_mu, atol=1e-10) else "differentiate the exponent of eq. (4.21) in mu")
check_close(found_sigma2, d_sigma2, "dL/dsigma2 against autograd", atol=1e-12,
            hint="sigma^2 appears twice in eq. (4.21), in the exponent and in the normalizer 1 / sqrt(2 pi (sigma^2 + sigma_j^2))"
            if torch.allclose(found_sigma2, exponent_only, atol=1e-10) else
            "r_j depends on sigma^2 only through the variance sigma^2 + sigma_j^2: differentiate a Gaussian density in its variance")
# the same derivatives from numerical integrals of p psi_j, by central differences in mu and in sigma^2
m0, v0, step = 0.3, 0.15, 1e-5
quad_r = lambda m, v: np.array([scipy.integrate.quad(lambda t: normal_pdf(t, m, v) * normal_pdf(t, c, s**2), -np.inf, np.inf,
                                                     epsabs=1e-14, epsrel=1e-13)[0] for c, s in zip(centers.tolist(), widths.tolist())])
u = torch.tensor([0.7, -1.2, 0.4])
fd_mu = float(u.numpy() @ (quad_r(m0 + step, v0) - quad_r(m0 - step, v0))) / (2 * step)
fd_sigma2 = float(u.numpy() @ (quad_r(m0, v0 + step) - quad_r(m0, v0 - step))) / (2 * step)
one = f(torch.tensor(m0), torch.tensor(v0), centers, widths, u)
check_close(torch.stack([torch.as_tensor(x).reshape(()) for x in one]), torch.tensor([fd_mu, fd_sigma2]),
            "(dL/dmu, dL/dsigma2) against central differences of scipy.integrate.quad", atol=1e-6)
''' + HIDDEN.format(task="continuous_softmax_1d"),
    },
}


# ------------------------------------------------------------------ Task 2: the truncated paraboloid, another moment


# Task 5 (b), graded by hand, names the function of the public Task 2 that these variants replace
_TASK5 = [("Why is the scale $\\Sigma$ returned by\n`tp_scale_from_covariance` not the covariance",
           "Why is the scale $\\Sigma$ that Corollary 4.1 matches to a\ncovariance not that covariance")]

_TP_THRESHOLD = '''def tp_threshold(Sigma):
    """lambda < 0 normalizing [-lambda - (t - mu)^T Sigma^-1 (t - mu) / 2]_+ in D dimensions."""
    ### BEGIN SOLUTION
    D = Sigma.shape[-1]
    log_det = torch.linalg.slogdet(2 * math.pi * Sigma).logabsdet
    return -torch.exp((math.lgamma(D / 2 + 2) - 0.5 * log_det) * 2 / (D + 2))
    ### END SOLUTION
'''

_TP_TEST_HEAD = '''from coursework import check, check_close, check_shape, own

f_lam, {unpack} = (own(fn, globals()) for fn in (tp_threshold, {functions}))
g = torch.Generator().manual_seed(2)
for D in (1, 2, 3):
    A = torch.randn(D, D, generator=g)
    Sigma = A @ A.T + 0.3 * torch.eye(D)
    lam = f_lam(Sigma)
    check_shape(lam, (), f"lambda for a {{D}} x {{D}} scale")
    check(lam < 0, f"lambda for D = {{D}}", "< 0", lam)
    # substitute t = mu + Sigma^(1/2) x: p = [-lambda - |x|^2 / 2]_+, dt = |Sigma|^(1/2) dx, polar coordinates in x
    sphere = 2 * math.pi ** (D / 2) / math.gamma(D / 2)
    R = math.sqrt(-2 * lam.item())
    jac = math.sqrt(torch.linalg.det(Sigma).item())
    radial = lambda r, k: (-lam.item() - r**2 / 2) * r ** (D - 1 + k)
    mass = jac * sphere * scipy.integrate.quad(radial, 0, R, args=(0,), epsabs=1e-14)[0]
    check_close(torch.tensor(mass), torch.tensor(1.0), f"the mass of the density for D = {{D}}", hint="see eq. (4.25)")
'''

SUPPORT_COVARIANCE = {
    "about": "the covariance of the uniform density on the support (the escort of order 0) and its inverse map",
    "params": {"functions": ["tp_threshold", "tp_support_covariance", "tp_scale_from_support_covariance"]},
    "cells": {
        "intro": [_row("| 2 | the truncated paraboloid in $D$ dimensions: threshold, covariance, and the scale that matches a covariance |",
                       "| 2 | the truncated paraboloid in $D$ dimensions: threshold, the covariance of its support, and the scale that matches it |")],
        "task:5": _TASK5,
        "task:2": """## Task 2 · The support of the truncated paraboloid in $D$ dimensions (3 points)

With location $\\mu$ and scale $\\Sigma$ (a symmetric positive-definite $D\\times D$ matrix) the density is
$p(t)=\\big[-\\lambda-\\frac12(t-\\mu)^\\top\\Sigma^{-1}(t-\\mu)\\big]_+$, with support the ellipsoid $E$. The
Jacobian of continuous sparsemax (Proposition 4.4 with $\\beta=0$, eq. (4.16)) and the gradient of its
normalizer (Proposition 4.2) see $p$ only through the *uniform* density on $E$, the escort
$\\tilde p^0$ of eq. (4.8). Implement three functions of batched tensors, for any $D$:

* `tp_threshold(Sigma)`: for `Sigma` of shape `(..., D, D)`, the $\\lambda<0$ of shape `(...)` that makes
  $p$ integrate to one (Lemma 4.3, eq. (4.25)); Tasks 3 and 7 may call it;
* `tp_support_covariance(Sigma)`: the covariance of the uniform density on $E$, shape `(..., D, D)`
  (derive it with Lemma 4.2, eq. (4.24), and compare with Proposition 4.5);
* `tp_scale_from_support_covariance(cov)`: the inverse map, the $\\Sigma$ whose support has a uniform
  density of covariance `cov`. Look for $\\Sigma=c\\cdot\\mathrm{cov}$, solve for the number $c$ as in
  the proof of Corollary 4.1, and say how $c$ differs from the factor of eq. (4.29).

Use `torch.linalg.det` (or `slogdet`) and `math.lgamma`/`math.gamma`. The test integrates numerically,
in polar coordinates, for $D=1,2,3$.""",
        "tp_threshold": _TP_THRESHOLD + '''

def tp_support_covariance(Sigma):
    """Covariance of the uniform density on the support of the truncated paraboloid with scale Sigma."""
    ### BEGIN SOLUTION
    D = Sigma.shape[-1]
    return -2 * tp_threshold(Sigma)[..., None, None] * Sigma / (D + 2)  # R^2 Sigma / (D + 2), R^2 = -2 lambda
    ### END SOLUTION


def tp_scale_from_support_covariance(cov):
    """The scale Sigma whose support carries a uniform density of covariance cov."""
    ### BEGIN SOLUTION
    # the support covariance is c_D |Sigma|^(-1/(D+2)) Sigma with c_D = 2 kappa^(2/(D+2)) / (D+2),
    # kappa = Gamma(D/2 + 2) / (2 pi)^(D/2); as in Corollary 4.1, Sigma = c_D^(-(D+2)/2) |cov|^(1/2) cov
    D = cov.shape[-1]
    log_kappa = math.lgamma(D / 2 + 2) - D / 2 * math.log(2 * math.pi)
    log_c = math.log(2 / (D + 2)) + 2 / (D + 2) * log_kappa
    log_factor = -(D + 2) / 2 * log_c + 0.5 * torch.linalg.slogdet(cov).logabsdet
    return torch.exp(log_factor)[..., None, None] * cov
    ### END SOLUTION''',
        "test_truncated_parabola": '''# Task 2: the density integrates to one (radial quadrature), and the uniform density on its support has
# the covariance that a cubature over the ellipsoid finds (D = 1, 2, 3); the inverse map.
''' + _TP_TEST_HEAD.format(unpack="f_cov, f_inv", functions="tp_support_covariance, tp_scale_from_support_covariance") + '''    # a cubature over the support E = {t : p(t) > 0} itself (mu = 0), in spherical coordinates t = r u: directions u
    # on the unit sphere (D = 1: +-1; D = 2: the trapezoidal rule in the angle; D = 3: Gauss-Legendre in u_3 times the
    # trapezoidal rule in the azimuth), and Gauss-Legendre in r up to where the bracket of p vanishes
    phi = 2 * np.pi * np.arange(400) / 400
    if D == 1:
        u, w_u = np.array([[1.0], [-1.0]]), np.ones(2)
    elif D == 2:
        u, w_u = np.stack([np.cos(phi), np.sin(phi)], 1), np.full(400, 2 * np.pi / 400)
    else:
        z, w_z = np.polynomial.legendre.leggauss(200)
        ring = np.sqrt(1 - z**2)[:, None]
        u = np.stack([ring * np.cos(phi), ring * np.sin(phi), np.broadcast_to(z[:, None], (200, 400))], -1).reshape(-1, 3)
        w_u = (w_z[:, None] * np.full(400, 2 * np.pi / 400)).reshape(-1)
    Sigma_inv = np.linalg.inv(Sigma.numpy())
    edge = np.sqrt(-2 * lam.item() / ((u @ Sigma_inv) * u).sum(1))  # the radius at which p vanishes, per direction
    x, w_x = np.polynomial.legendre.leggauss(8)
    r = edge[:, None] * (x + 1) / 2
    w = w_u[:, None] * edge[:, None] / 2 * w_x * r ** (D - 1)  # dt = r^(D-1) dr du
    t = r[..., None] * u[:, None, :]
    p_t = -lam.item() - 0.5 * ((t @ Sigma_inv) * t).sum(-1)
    uniform_cov = torch.tensor(np.einsum("kn,kna,knb->ab", w, t, t) / w.sum())
    density_cov = torch.tensor(np.einsum("kn,kna,knb->ab", w * p_t, t, t))
    check_close(f_cov(Sigma), uniform_cov, f"the covariance of the uniform density on the support for D = {D}, against a cubature",
                hint="yours is the covariance of the density p itself, eq. (4.27): here every point of the support"
                     " counts equally" if torch.allclose(f_cov(Sigma), density_cov, atol=1e-10) else
                     "after the change of variables of the proof of Lemma 4.3, the second formula of Lemma 4.2, eq. (4.24),"
                     " applies; the uniform density is normalized by the volume of the support")
covs = torch.stack([torch.tensor([[0.02, 0.01], [0.01, 0.05]]), torch.tensor([[1.0, -0.3], [-0.3, 0.5]])])
check_close(f_cov(f_inv(covs)), covs, "tp_support_covariance(tp_scale_from_support_covariance(cov)) for two 2 x 2 covariances",
            hint="the threshold depends on Sigma too: take determinants of both sides first, as in the proof of Corollary 4.1")
variances = torch.tensor([1e-3, 0.05, 1.0])[:, None, None]
check_close(f_cov(f_inv(variances)), variances, "tp_support_covariance(tp_scale_from_support_covariance(var)) for three 1 x 1 variances")
''' + HIDDEN.format(task="tp_threshold"),
    },
}

SUPPORT_MATRIX = {
    "about": "the ellipsoid of the support, {t : (t - mu)^T M^-1 (t - mu) <= 1}, and the scale with a given support",
    "params": {"functions": ["tp_threshold", "tp_support_matrix", "tp_scale_from_support"]},
    "cells": {
        "intro": [_row("| 2 | the truncated paraboloid in $D$ dimensions: threshold, covariance, and the scale that matches a covariance |",
                       "| 2 | the truncated paraboloid in $D$ dimensions: threshold, its support, and the scale with a given support |")],
        "task:5": _TASK5,
        "task:2": """## Task 2 · The truncated paraboloid with a given support (3 points)

With location $\\mu$ and scale $\\Sigma$ (a symmetric positive-definite $D\\times D$ matrix) the density is
$p(t)=\\big[-\\lambda-\\frac12(t-\\mu)^\\top\\Sigma^{-1}(t-\\mu)\\big]_+$. Its support is an ellipsoid
$E=\\{t:(t-\\mu)^\\top M^{-1}(t-\\mu)\\le1\\}$ for a symmetric positive-definite matrix $M$. An attention
map is sometimes specified by the region it must cover (a bounding box, an object's ellipse), so
we need the way back from $M$ to $\\Sigma$. Implement three functions of batched tensors, for any $D$:

* `tp_threshold(Sigma)`: for `Sigma` of shape `(..., D, D)`, the $\\lambda<0$ of shape `(...)` that makes
  $p$ integrate to one (Lemma 4.3, eq. (4.25)); Tasks 3 and 7 may call it;
* `tp_support_matrix(Sigma)`: the matrix $M$ of the support, shape `(..., D, D)`;
* `tp_scale_from_support(M)`: the inverse map, the $\\Sigma$ whose density has support $E$. Look for
  $\\Sigma=M/R^2$ with $R^2=-2\\lambda(\\Sigma)$, and solve for the number $R^2$ in terms of $\\lvert M\\rvert$
  (a fixed-point equation that eq. (4.25) makes explicit). Check your answer in $D=1$ against the
  half-width $a=(3\\sigma^2/2)^{1/3}$ of the truncated parabola.

Use `torch.linalg.det` (or `slogdet`) and `math.lgamma`/`math.gamma`. The test integrates the density
numerically, in polar coordinates, for $D=1,2,3$, and evaluates it on the boundary of $E$.""",
        "tp_threshold": _TP_THRESHOLD + '''

def tp_support_matrix(Sigma):
    """The matrix M of the support {t : (t - mu)^T M^-1 (t - mu) <= 1} of the truncated paraboloid."""
    ### BEGIN SOLUTION
    return -2 * tp_threshold(Sigma)[..., None, None] * Sigma  # R^2 Sigma with R^2 = -2 lambda
    ### END SOLUTION


def tp_scale_from_support(M):
    """The scale Sigma whose truncated paraboloid has the support {t : (t - mu)^T M^-1 (t - mu) <= 1}."""
    ### BEGIN SOLUTION
    # Sigma = M / R^2 and R^2 = 2 kappa^(2/(D+2)) |Sigma|^(-1/(D+2)), kappa = Gamma(D/2 + 2) / (2 pi)^(D/2),
    # give (R^2)^(2/(D+2)) = 2 kappa^(2/(D+2)) |M|^(-1/(D+2)), that is R^2 = 2^((D+2)/2) kappa |M|^(-1/2)
    D = M.shape[-1]
    log_kappa = math.lgamma(D / 2 + 2) - D / 2 * math.log(2 * math.pi)
    log_R2 = (D + 2) / 2 * math.log(2) + log_kappa - 0.5 * torch.linalg.slogdet(M).logabsdet
    return torch.exp(-log_R2)[..., None, None] * M
    ### END SOLUTION''',
        "test_truncated_parabola": '''# Task 2: the density integrates to one and vanishes exactly on the boundary of the stated ellipsoid
# (radial quadrature, D = 1, 2, 3); the inverse map, and the covariance of Theorem 4.1.
''' + _TP_TEST_HEAD.format(unpack="f_supp, f_inv", functions="tp_support_matrix, tp_scale_from_support") + '''    M = f_supp(Sigma)
    check_shape(M, (D, D), f"the support matrix for a {D} x {D} scale")
    u = torch.nn.functional.normalize(torch.randn(5, D, generator=g), dim=-1)
    boundary = u @ torch.linalg.cholesky(M).T  # points t - mu with (t - mu)^T M^-1 (t - mu) = 1
    p_boundary = -lam - 0.5 * ((boundary @ torch.linalg.inv(Sigma)) * boundary).sum(-1)
    check_close(p_boundary, torch.zeros(5), f"-lambda - (t - mu)^T Sigma^-1 (t - mu) / 2 on the boundary of M's ellipsoid, D = {D}",
                atol=1e-12, hint="the support is where the bracket of p is positive, so the bracket vanishes on its boundary:"
                " compare the bracket with the ellipsoid yours describes")
ellipses = torch.stack([torch.tensor([[0.02, 0.01], [0.01, 0.05]]), torch.tensor([[1.0, -0.3], [-0.3, 0.5]])])
check_close(f_supp(f_inv(ellipses)), ellipses, "tp_support_matrix(tp_scale_from_support(M)) for two 2 x 2 matrices",
            hint="lambda depends on Sigma too: with Sigma = M / R^2, eq. (4.25) gives an equation for R^2 alone")
half_widths = torch.tensor([0.05, 0.3, 2.0])
check_close(f_inv(half_widths[:, None, None] ** 2).reshape(3), 2 * half_widths**3 / 3,
            "the scale sigma^2 = 2 a^3 / 3 of the truncated parabolas on [mu - a, mu + a], a = 0.05, 0.3, 2")
''' + HIDDEN.format(task="tp_threshold"),
    },
}


# ------------------------------------------------------------------ Task 3: continuous sparsemax, another quantity


SPARSEMAX_JACOBIAN = {
    "about": "the Jacobian of 1D continuous sparsemax, cov_{p,0}(psi_j, t) and cov_{p,0}(psi_j, t^2), integrals over the support",
    "params": {"function": "continuous_sparsemax_1d_jacobian"},
    "cells": {
        "intro": [_row("| 3 | continuous sparsemax with Gaussian RBFs |",
                       "| 3 | the Jacobian of continuous sparsemax with Gaussian RBFs |")],
        "task:3": """## Task 3 · The Jacobian of continuous sparsemax (3 points)

For the truncated parabola $p$ with location $\\mu$ and scale $\\sigma^2$, the canonical parameter is
$\\theta=(\\mu/\\sigma^2,-1/(2\\sigma^2))$ and the features are $\\phi(t)=(t,t^2)$. For $\\alpha=2$ the Jacobian
of $r_j=\\mathbb E_p[\\psi_j(t)]$ in $\\theta$ is the $0$-covariance of eq. (4.16) (Proposition 4.4): with
the support $E=[\\mu-a,\\mu+a]$, $a=\\sqrt{-2\\lambda\\sigma^2}$ (Proposition 4.5), its row $j$ is

$$
\\operatorname{cov}_{p,0}(\\psi_j,\\phi)=\\int_E\\psi_j\\,\\phi\\,dt-\\frac1{\\lvert E\\rvert}\\int_E\\psi_j\\,dt\\int_E\\phi\\,dt .
$$

Work out both entries, $\\operatorname{cov}_{p,0}(\\psi_j,t)$ and $\\operatorname{cov}_{p,0}(\\psi_j,t^2)$, as integrals
of the basis function over the support (the values of $p$ inside $E$ do not enter), and implement
`continuous_sparsemax_1d_jacobian(mu, sigma2, centers, widths)`: `mu` and `sigma2` numbers or 0-d
tensors, `centers` and `widths` (the standard deviations $\\sigma_j$) of shape `(N,)`; return the pair
`(cov_0(psi, t), cov_0(psi, t^2))`, each of shape `(N,)`. Use the moments of a truncated Gaussian
($\\Phi$ is `torch.special.ndtr`) for a closed form, or a Gauss–Legendre rule on the support with 200
nodes (`np.polynomial.legendre.leggauss(200)`). You may call your `tp_threshold` (with a `1 x 1`
scale). The test also differentiates numerical integrals of continuous sparsemax in $\\theta$.""",
        "continuous_sparsemax_1d": '''def continuous_sparsemax_1d_jacobian(mu, sigma2, centers, widths):
    """(cov_{p,0}(psi_j, t), cov_{p,0}(psi_j, t^2)) for the truncated parabola with location mu and scale sigma2."""
    ### BEGIN SOLUTION
    mu, sigma2 = torch.as_tensor(mu), torch.as_tensor(sigma2)
    A = -tp_threshold(sigma2.reshape(1, 1))
    a = torch.sqrt(2 * A * sigma2)  # the support is [mu - a, mu + a], of length 2a
    # integrals over [mu - a, mu + a] of X ~ N(c, s^2): moments of a truncated Gaussian
    c, s = centers, widths
    lo, hi = (mu - a - c) / s, (mu + a - c) / s
    phi = lambda x: torch.exp(-0.5 * x**2) / math.sqrt(2 * math.pi)
    Z = torch.special.ndtr(hi) - torch.special.ndtr(lo)        # int_E psi_j
    m1 = s * (phi(lo) - phi(hi))                               # int_E (t - c) psi_j
    m2 = s**2 * (Z + lo * phi(lo) - hi * phi(hi))              # int_E (t - c)^2 psi_j
    d = c - mu
    first = m1 + d * Z                                         # int_E (t - mu) psi_j
    second = m2 + 2 * d * m1 + d**2 * Z                        # int_E (t - mu)^2 psi_j
    # the uniform density on E has mean mu and E[(t - mu)^2] = a^2 / 3; t^2 = (t - mu)^2 + 2 mu (t - mu) + mu^2
    return first, second + 2 * mu * first - a**2 / 3 * Z
    ### END SOLUTION''',
        "test_continuous_sparsemax_1d": '''# Task 3: against numerical integration over the support, against central differences of numerical
# integrals of continuous sparsemax in theta, and for basis functions inside and outside the support.
from coursework import check_close, check_shape, own

f = own(continuous_sparsemax_1d_jacobian, globals())
centers = torch.tensor([-0.5, 0.1, 0.4, 0.9])
widths = torch.tensor([0.2, 0.35, 0.05, 0.1])
mu, s2 = 0.3, 0.08
J_t, J_tt = f(mu, s2, centers, widths)
check_shape(J_t, (4,), "cov_0(psi_j, t) for 4 basis functions")
check_shape(J_tt, (4,), "cov_0(psi_j, t^2) for 4 basis functions")
threshold = lambda v: -((math.gamma(2.5) / math.sqrt(2 * math.pi * v)) ** (2 / 3))  # eq. (4.25) with D = 1
lam = threshold(s2)
half_width = math.sqrt(-2 * lam * s2)
over_E = lambda g, m=mu, a=half_width: scipy.integrate.quad(g, m - a, m + a, epsabs=1e-14, epsrel=1e-12, limit=200)[0]
cov_t, cov_tt, under_p = [], [], []
for j in range(4):
    c, s = centers[j].item(), widths[j].item()
    psi = lambda t: normal_pdf(t, c, s**2)
    mass = over_E(psi)
    cov_t.append(over_E(lambda t: t * psi(t)) - mass * over_E(lambda t: t) / (2 * half_width))
    cov_tt.append(over_E(lambda t: t**2 * psi(t)) - mass * over_E(lambda t: t**2) / (2 * half_width))
    p = lambda t: -lam - (t - mu) ** 2 / (2 * s2)
    under_p.append(over_E(lambda t: p(t) * (t - mu) * psi(t)))
check_close(J_t, torch.tensor(cov_t), "cov_0(psi_j, t) against scipy.integrate.quad over the support", atol=1e-10,
            hint="for alpha = 2 the escort of order 0 is uniform on the support: p itself does not weight the integrals"
            if torch.allclose(J_t, torch.tensor(under_p), atol=1e-8) else
            "check the second term of the 0-covariance: the integral of t over the support, divided by its length |E|")
check_close(J_tt, torch.tensor(cov_tt), "cov_0(psi_j, t^2) against scipy.integrate.quad over the support", atol=1e-10,
            hint="check the second term of the 0-covariance: the integral of t^2 over the support [mu - a, mu + a],"
                 " divided by its length |E|")


def r_of_theta(theta1, theta2):  # continuous sparsemax by quadrature, as a function of the canonical parameters
    m, v = -theta1 / (2 * theta2), -1 / (2 * theta2)
    A, a = -threshold(v), math.sqrt(-2 * threshold(v) * v)
    return np.array([over_E(lambda t: (A - (t - m) ** 2 / (2 * v)) * normal_pdf(t, c, s**2), m, a)
                     for c, s in zip(centers.tolist(), widths.tolist())])


theta1, theta2, step = mu / s2, -1 / (2 * s2), 1e-5
fd_t = (r_of_theta(theta1 + step, theta2) - r_of_theta(theta1 - step, theta2)) / (2 * step)
fd_tt = (r_of_theta(theta1, theta2 + step) - r_of_theta(theta1, theta2 - step)) / (2 * step)
check_close(J_t, torch.tensor(fd_t), "cov_0(psi_j, t) against central differences of r in theta_1", atol=1e-6)
check_close(J_tt, torch.tensor(fd_tt), "cov_0(psi_j, t^2) against central differences of r in theta_2", atol=1e-6)
# a narrow basis function (width 0.01) well inside the support, by quadrature over it; one far outside sees nothing
narrow = f(mu, s2, torch.tensor([0.35, mu + 2 * half_width]), torch.tensor([0.01, 0.01]))
peak = lambda g: scipy.integrate.quad(lambda t: g(t) * normal_pdf(t, 0.35, 0.01**2), mu - half_width, mu + half_width,
                                      points=[0.35], epsabs=1e-14, epsrel=1e-12, limit=200)[0]
narrow_t = peak(lambda t: t) - peak(lambda t: 1.0) * over_E(lambda t: t) / (2 * half_width)
narrow_tt = peak(lambda t: t**2) - peak(lambda t: 1.0) * over_E(lambda t: t**2) / (2 * half_width)
check_close(torch.stack(narrow), torch.tensor([[narrow_t, 0.0], [narrow_tt, 0.0]]),
            "(cov_0(psi, t), cov_0(psi, t^2)) for basis functions of width 0.01 at 0.35 (inside) and mu + 2a (outside)",
            atol=1e-10, hint="with Gauss-Legendre, use 200 nodes on the support")
''' + HIDDEN.format(task="continuous_sparsemax_1d"),
    },
}

ENTMAX15 = {
    "about": "continuous 1.5-entmax in 1D: p = [(-tau - (t - mu)^2 / (2 sigma2)) / 2]_+^2, its threshold and r_j",
    "params": {"function": "continuous_entmax15_1d", "alpha": 1.5},
    "cells": {
        "intro": [_row("| 3 | continuous sparsemax with Gaussian RBFs |",
                       "| 3 | continuous 1.5-entmax with Gaussian RBFs: its threshold and its output |")],
        "task:3": """## Task 3 · Continuous 1.5-entmax (3 points)

Between continuous softmax ($\\alpha=1$) and continuous sparsemax ($\\alpha=2$) lies $\\alpha=\\frac32$. With the
quadratic score $f(t)=-\\frac{(t-\\mu)^2}{2\\sigma^2}$ in $D=1$, Proposition 4.1 gives the density

$$
p(t)=\\Big[\\tfrac12\\big(-\\tau-\\tfrac{(t-\\mu)^2}{2\\sigma^2}\\big)\\Big]_+^{2},
$$

the square of a parabola, with a threshold $\\tau<0$ fixed by $\\int p=1$. Derive $\\tau$ in closed form
as a function of $\\sigma^2$ (substitute $t=\\mu+a u$ with $a$ the half-width of the support, as in the
proof of Lemma 4.3), give the support, and say how its half-width grows with $\\sigma^2$ compared with
the truncated parabola's $a=(3\\sigma^2/2)^{1/3}$.

Implement `continuous_entmax15_1d(mu, sigma2, centers, widths)`: $r_j=\\int p(t)\\,\\mathcal N(t;c_j,\\sigma_j^2)\\,\\mathrm dt$
for location `mu` and scale `sigma2` (numbers or 0-d tensors), for every basis function; return shape
`(N,)`. The integral is over the finite support: use the moments of a truncated Gaussian up to order
four, or a Gauss–Legendre rule on the support with 400 nodes (`np.polynomial.legendre.leggauss(400)`;
the support is wider than continuous sparsemax's, and 200 nodes miss the narrow basis function of the test).
The test finds the threshold numerically and integrates with `scipy.integrate.quad`.""",
        "continuous_sparsemax_1d": '''def continuous_entmax15_1d(mu, sigma2, centers, widths):
    """r_j = E_p[N(t; c_j, w_j^2)] for continuous 1.5-entmax with location mu and scale sigma2 (D = 1)."""
    ### BEGIN SOLUTION
    mu, sigma2 = torch.as_tensor(mu), torch.as_tensor(sigma2)
    # p = [(b - (t - mu)^2 / (2 sigma2)) / 2]_+^2 with b = -tau; t = mu + sqrt(2 b sigma2) u gives the mass
    # (1/4) b^2 sqrt(2 b sigma2) int_{-1}^{1} (1 - u^2)^2 du = (4 sqrt(2) / 15) sqrt(sigma2) b^(5/2) = 1
    b = (15 / (4 * math.sqrt(2) * torch.sqrt(sigma2))) ** 0.4
    a = torch.sqrt(2 * b * sigma2)  # the support is [mu - a, mu + a]
    nodes, weights = (torch.tensor(x) for x in np.polynomial.legendre.leggauss(400))
    t = mu + a * nodes
    p = 0.25 * (b - (t - mu) ** 2 / (2 * sigma2)) ** 2
    psi = torch.exp(-0.5 * ((t[:, None] - centers) / widths) ** 2) / (math.sqrt(2 * math.pi) * widths)
    return a * (weights * p) @ psi
    ### END SOLUTION''',
        "test_continuous_sparsemax_1d": '''# Task 3: against numerical integration over the support, with the threshold found numerically
# (scipy.optimize.brentq on the mass); a narrow basis function and one outside the support.
import scipy.optimize
from coursework import check_close, check_shape, own

f = own(continuous_entmax15_1d, globals())
centers = torch.tensor([-0.5, 0.1, 0.4, 0.9])
widths = torch.tensor([0.2, 0.35, 0.05, 0.1])
mu, s2 = 0.3, 0.08
r = f(mu, s2, centers, widths)
check_shape(r, (4,), "r for 4 basis functions")
density = lambda t, b: 0.25 * max(b - (t - mu) ** 2 / (2 * s2), 0.0) ** 2
support = lambda b: (mu - math.sqrt(2 * b * s2), mu + math.sqrt(2 * b * s2))
mass = lambda b: scipy.integrate.quad(density, *support(b), args=(b,), epsabs=1e-15, epsrel=1e-13)[0]
b = scipy.optimize.brentq(lambda b: mass(b) - 1, 1e-3, 1e3, xtol=1e-15, rtol=1e-15)  # b = -tau
quad = [scipy.integrate.quad(lambda t: density(t, b) * normal_pdf(t, c, s**2), *support(b), epsabs=1e-14, epsrel=1e-12,
                             limit=200)[0] for c, s in zip(centers.tolist(), widths.tolist())]
lam = -((math.gamma(2.5) / math.sqrt(2 * math.pi * s2)) ** (2 / 3))  # continuous sparsemax's threshold, eq. (4.25)
a2 = math.sqrt(-2 * lam * s2)
sparsemax = [scipy.integrate.quad(lambda t: (-lam - (t - mu) ** 2 / (2 * s2)) * normal_pdf(t, c, s**2), mu - a2, mu + a2,
                                  epsabs=1e-14, limit=200)[0] for c, s in zip(centers.tolist(), widths.tolist())]
check_close(r, torch.tensor(quad), "r against scipy.integrate.quad over the support", atol=1e-10,
            hint="yours is continuous sparsemax (alpha = 2): for alpha = 3/2 the density is the square of a parabola"
            if torch.allclose(r, torch.tensor(sparsemax), atol=1e-8) else
            "the threshold makes p integrate to one: compare yours with the one this test finds by root-finding"
            " (substitute t = mu + a u, as in the proof of Lemma 4.3, and mind the square of the bracket)")
# a narrow basis function (width 0.01) inside the support, and one far outside it, which sees nothing
half = math.sqrt(2 * b * s2)
narrow = f(mu, s2, torch.tensor([0.35, mu + 2 * half]), torch.tensor([0.01, 0.01]))
inside = scipy.integrate.quad(lambda t: density(t, b) * normal_pdf(t, 0.35, 0.01**2), *support(b), points=[0.35], epsabs=1e-14,
                              epsrel=1e-12, limit=200)[0]
check_close(narrow, torch.tensor([inside, 0.0]), "r for basis functions of width 0.01 at 0.35 (inside) and mu + 2a (outside)",
            atol=1e-10, hint="with Gauss-Legendre, use 400 nodes on the support; the support is [mu - a, mu + a]")
''' + HIDDEN.format(task="continuous_sparsemax_1d"),
    },
}



# ------------------------------------------------------------------ Task 4: weighted EM for another family of mixtures


_EM_DATA = """g = torch.Generator().manual_seed(4)
L, K = 60, 3
points = torch.cat([0.1 * torch.randn(20, 2, generator=g) + c for c in (torch.tensor([0.2, 0.2]), torch.tensor([0.8, 0.3]), torch.tensor([0.5, 0.8]))])
weights = torch.rand(L, generator=g)
weights = weights / weights.sum()
means0 = torch.tensor([[0.3, 0.3], [0.6, 0.5], [0.4, 0.7]])
mixing0 = torch.full((K,), 1 / K)
"""

_EM_CHECKS = """

params = f(points, weights, *{start})
check_shape(params[0], (K, 2), "means")
check_shape(params[1], {shape}, "{what}")
check_shape(params[2], (K,), "mixing weights")
history = [weighted_log_likelihood(*{start}), weighted_log_likelihood(*params)]
for _ in range(4):
    params = f(points, weights, *params)
    history.append(weighted_log_likelihood(*params))
check(all(b >= a - 1e-12 for a, b in zip(history, history[1:])) and history[-1] > history[0] + 0.1,
      "the weighted log-likelihood over five steps", "non-decreasing and up by more than 0.1", torch.tensor(history))
# the M-step maximizes Q( . | Theta) of Proposition 4.7: at the new parameters its gradient vanishes
# (the responsibilities from scipy.stats, the log-densities from torch.distributions, the gradient by autograd)
dens = np.stack([mixing0[k].item() * scipy.stats.multivariate_normal(means0[k].numpy(), {cov_k}).pdf(points.numpy())
                 for k in range(K)], 1)
resp = torch.tensor(dens / dens.sum(1, keepdims=True))
new_means, new_{arg}, new_mixing = f(points, weights, *{start})
means_leaf, {arg}_leaf = new_means.clone().requires_grad_(True), new_{arg}.clone().requires_grad_(True)
log_normal = torch.distributions.MultivariateNormal(means_leaf, {cov_leaf}).log_prob(points[:, None, :])  # (L, K)
grad_means, grad_{arg} = torch.autograd.grad((weights[:, None] * resp * log_normal).sum(), (means_leaf, {arg}_leaf))
check_close(grad_means, torch.zeros(K, 2), "the gradient of Q in the means at your M-step", atol=1e-10,
            hint="set the gradient of Q of Proposition 4.7 in each mean to zero, and compare with eq. (4.55)")
check_close(grad_{arg}, torch.zeros_like(grad_{arg}), "the gradient of Q in {what_q} at your M-step", atol=1e-9,
            hint={hint})
counts = torch.randint(1, 4, (L,), generator=g)
step_weighted = f(points, counts.double(), *{start})
step_repeated = f(points.repeat_interleave(counts, dim=0), torch.ones(int(counts.sum())), *{start})
check_close(step_weighted[2].sum(), torch.tensor(1.0), f"the sum of the mixing weights for integer weights summing to {{int(counts.sum())}}",
            hint="the weights need not sum to one: normalize the mixing weights by the total weight")
for a, b, name in zip(step_weighted, step_repeated, ("means", "{what}", "mixing weights")):
    check_close(a, b, f"{{name}} with integer weights, against the points repeated")
"""

TIED_EM = {
    "about": "one step of weighted EM for a mixture whose components share one covariance",
    "params": {"function": "weighted_em_step_tied"},
    "cells": {
        "intro": [_row("| 4 | one step of weighted EM |", "| 4 | one step of weighted EM with a shared covariance |")],
        "task:4": """## Task 4 · Weighted EM with a shared covariance (3 points)

Multimodal continuous attention fits a mixture to locations $t_l\\in\\mathbb R^2$ weighted by the discrete
attention probabilities $w_l$, maximizing the weighted log-likelihood $\\ell_w$ of eq. (4.53). When the
attended objects have the same size and shape, a smaller model ties the covariances:
$\\sum_k\\pi_k\\mathcal N(\\mu_k,\\Sigma)$, with one $\\Sigma$ for all components. The E-step is still
eq. (4.54). Derive the weighted M-step for this model by maximizing $\\mathcal Q(\\Theta'\\mid\\Theta)$ of
Proposition 4.7 over the means, the shared $\\Sigma$ and the mixing weights: which of eqs. (4.55)–(4.56)
change, and by what is the pooled scatter divided? Does Theorem 4.3 still apply?

Implement `weighted_em_step_tied(points, weights, means, cov, mixing)` with shapes `(L, D)`, `(L,)`,
`(K, D)`, `(D, D)`, `(K,)`; return the new `(means, cov, mixing)`, with `cov` of shape `(D, D)`. The weights
need not sum to one. Compute the E-step in log space (`torch.logsumexp` or `torch.softmax`) and
without a Python loop over points or components.""",
        "weighted_em_step": '''def weighted_em_step_tied(points, weights, means, cov, mixing):
    """One EM iteration for a Gaussian mixture with one covariance shared by its components, fitted to weighted points."""
    ### BEGIN SOLUTION
    D = points.shape[-1]
    diff = points[:, None, :] - means[None]                                   # (L, K, D)
    maha = (diff * torch.linalg.solve(cov, diff.unsqueeze(-1)).squeeze(-1)).sum(-1)
    log_normal = -0.5 * (maha + torch.logdet(cov) + D * math.log(2 * math.pi))
    resp = torch.softmax(torch.log(mixing) + log_normal, dim=-1)              # (L, K)
    wr = weights[:, None] * resp
    Nk = wr.sum(0)
    new_means = wr.T @ points / Nk[:, None]
    centered = points[:, None, :] - new_means[None]
    # Q is (sum_k N_k / 2) log|Lambda| - tr(Lambda S) / 2 with S the scatter pooled over the components
    new_cov = torch.einsum("lk,lka,lkb->ab", wr, centered, centered) / weights.sum()
    return new_means, new_cov, Nk / weights.sum()
    ### END SOLUTION''',
        "test_weighted_em_step": """# Task 4: EM never decreases the weighted log-likelihood, the M-step is a stationary point of Q,
# integer weights are repeated points, and the mixing weights are a probability vector whatever the total weight.
from coursework import check, check_close, check_shape, own

f = own(weighted_em_step_tied, globals())
""" + _EM_DATA + """cov0 = 0.05 * torch.eye(2)


def weighted_log_likelihood(means, cov, mixing):
    dens = sum(mixing[k].item() * scipy.stats.multivariate_normal(means[k].numpy(), cov.numpy()).pdf(points.numpy()) for k in range(K))
    return float(weights.numpy() @ np.log(dens))
""" + _EM_CHECKS.format(start="(means0, cov0, mixing0)", shape="(2, 2)", what="the shared covariance", arg="cov",
                        cov_k="cov0.numpy()", cov_leaf="cov_leaf", what_q="the shared covariance",
                        hint='"collect every term of Q of Proposition 4.7 in which the one shared Sigma appears, from every component"') + HIDDEN.format(task="weighted_em_step"),
    },
}

SPHERICAL_EM = {
    "about": "one step of weighted EM for a mixture of isotropic Gaussians N(mu_k, s_k I)",
    "params": {"function": "weighted_em_step_spherical"},
    "cells": {
        "intro": [_row("| 4 | one step of weighted EM |", "| 4 | one step of weighted EM for isotropic components |")],
        "task:4": """## Task 4 · Weighted EM for isotropic components (3 points)

Multimodal continuous attention fits a mixture to locations $t_l\\in\\mathbb R^2$ weighted by the discrete
attention probabilities $w_l$, maximizing the weighted log-likelihood $\\ell_w$ of eq. (4.53). A mixture
with $K$ components has $K$ covariance matrices to fit; a model with fewer parameters makes every
component isotropic, $\\mathcal N(\\mu_k,s_kI)$ with a variance $s_k>0$. The E-step is still eq. (4.54).
Derive the weighted M-step for this model by maximizing $\\mathcal Q(\\Theta'\\mid\\Theta)$ of
Proposition 4.7 over the means, the variances $s_k$ and the mixing weights: how is $s_k$ related to
the matrix $\\Sigma_k$ of eq. (4.56)? How many free parameters does the model have in $D=2$, against
$6K-1$ for full covariances?

Implement `weighted_em_step_spherical(points, weights, means, variances, mixing)` with shapes `(L, D)`,
`(L,)`, `(K, D)`, `(K,)`, `(K,)`; return the new `(means, variances, mixing)`. The weights need not sum
to one. Compute the E-step in log space (`torch.logsumexp` or `torch.softmax`) and without a Python
loop over points or components.""",
        "weighted_em_step": '''def weighted_em_step_spherical(points, weights, means, variances, mixing):
    """One EM iteration for a mixture of isotropic Gaussians N(mu_k, s_k I) fitted to weighted points."""
    ### BEGIN SOLUTION
    D = points.shape[-1]
    squared = ((points[:, None, :] - means[None]) ** 2).sum(-1)              # (L, K)
    log_normal = -0.5 * (squared / variances + D * torch.log(2 * math.pi * variances))
    resp = torch.softmax(torch.log(mixing) + log_normal, dim=-1)              # (L, K)
    wr = weights[:, None] * resp
    Nk = wr.sum(0)
    new_means = wr.T @ points / Nk[:, None]
    # Q's term of component k is -(D N_k / 2) log s - (sum_l w_l gamma_lk |t_l - mu_k|^2) / (2 s)
    new_squared = ((points[:, None, :] - new_means[None]) ** 2).sum(-1)
    return new_means, (wr * new_squared).sum(0) / (D * Nk), Nk / weights.sum()
    ### END SOLUTION''',
        "test_weighted_em_step": """# Task 4: EM never decreases the weighted log-likelihood, the M-step is a stationary point of Q,
# integer weights are repeated points, and the mixing weights are a probability vector whatever the total weight.
from coursework import check, check_close, check_shape, own

f = own(weighted_em_step_spherical, globals())
""" + _EM_DATA + """variances0 = torch.full((K,), 0.05)


def weighted_log_likelihood(means, variances, mixing):
    dens = sum(mixing[k].item() * scipy.stats.multivariate_normal(means[k].numpy(), variances[k].item() * np.eye(2)).pdf(points.numpy())
               for k in range(K))
    return float(weights.numpy() @ np.log(dens))
""" + _EM_CHECKS.format(start="(means0, variances0, mixing0)", shape="(K,)", what="variances", arg="variances",
                        cov_k="variances0[k].item() * np.eye(2)", cov_leaf="variances_leaf[:, None, None] * torch.eye(2)",
                        what_q="the variances",
                        hint='"a factor is missing or extra: differentiate the log-determinant of s_k I, in D dimensions, in s_k"') + HIDDEN.format(task="weighted_em_step"),
    },
}



# ------------------------------------------------------------------ Tasks 6 and 7: another integral of the truncated paraboloid
# A variant of Task 7 carries the text and the model answer of Task 6 (graded by hand), which asks for its derivation:
# the two are drawn together.


_RIEMANN = """f = own({function}, globals())
for Sigma in (torch.tensor([[0.05]]), torch.tensor([[0.3, 0.1], [0.1, 0.2]])):
    D = Sigma.shape[-1]
    a = float(-truncated_paraboloid_threshold(Sigma))
    half = math.sqrt(2 * a * float(torch.linalg.eigvalsh(Sigma).max()))  # the support fits in [-half, half]^D
    x = torch.linspace(-half, half, 200001 if D == 1 else 1501)
    t = x[:, None] if D == 1 else torch.stack(torch.meshgrid(x, x, indexing="ij"), -1).reshape(-1, 2)
    p = torch.clamp(a - 0.5 * ((t @ torch.linalg.inv(Sigma)) * t).sum(-1), min=0)
    cell = float(x[1] - x[0]) ** D
"""

POWER_INTEGRAL = {
    "about": "int p^alpha of the truncated paraboloid for any alpha > 0 (the Tsallis alpha-negentropy at continuous sparsemax)",
    "params": {"function": "tp_power_integral"},
    "cells": {
        "intro": [_row("| 6 | a derivation: $\\int p^2$ of continuous sparsemax | 2 (graded by hand) |",
                       "| 6 | a derivation: $\\int p^\\alpha$ of continuous sparsemax, for every $\\alpha>0$ | 2 (graded by hand) |"),
                  _row("| 7 | $\\int p^2$ of Task 6 in code | 3 |", "| 7 | $\\int p^\\alpha$ of Task 6 in code | 3 |")],
        "task:6": """## Task 6 · The Tsallis entropies of continuous sparsemax: a derivation (2 points, graded by hand)

Continuous sparsemax maximizes $\\mathbb E_p[f]-\\Omega_2(p)$, but nothing stops us from measuring its
solution, the truncated paraboloid, with another member of the Tsallis family, eq. (4.4), which needs
$\\int p^\\alpha$. The chapter never evaluates these integrals.

* **(a)** Derive $\\int_{\\mathbb R^D}p(t)^\\alpha\\,dt$ in closed form for the truncated paraboloid with scale
  $\\Sigma$ in $D$ dimensions and every $\\alpha>0$, in terms of $\\alpha$, $D$ and its threshold $\\lambda$ (Lemma 4.3,
  eq. (4.25)), with Gamma functions. Check the cases $\\alpha=1$ and $\\alpha=2$.
* **(b)** How does $\\int p^\\alpha$ scale with $\\Sigma$ (replace $\\Sigma$ by $c\\Sigma$)? For which $\\alpha$ does the
  Tsallis negentropy $\\Omega_\\alpha(p)$ of eq. (4.4) grow, and for which does it shrink, as the scale grows?
* **(c)** In $D=1$ and for $\\alpha=3$, compare $\\int p^3$ of the truncated parabola and of the Gaussian with
  the same variance $v$: which is larger, by what factor, and does the factor depend on $v$?

*Where to start:* change variables to the unit ball, as in the proof of Lemma 4.3, and use polar
coordinates and a Beta integral. Write your derivation in the cell below (Markdown and LaTeX); Task 7
turns it into code.""",
        "written_tp_squared_integral": """**(a)** Let $a=-\\lambda>0$ and $t=\\mu+\\Sigma^{1/2}y$, so $dt=\\lvert\\Sigma\\rvert^{1/2}dy$ and
$p=[a-\\lVert y\\rVert^2/2]_+$. With $S_{D-1}=2\\pi^{D/2}/\\Gamma(D/2)$ the area of the unit sphere,
$I_\\alpha=\\int p^\\alpha\\,dt=\\lvert\\Sigma\\rvert^{1/2}S_{D-1}\\int_0^{\\sqrt{2a}}(a-r^2/2)^\\alpha r^{D-1}\\,dr$. Substituting
$r^2=2av$, $r^{D-1}dr=\\frac12(2a)^{D/2}v^{D/2-1}dv$ and $(a-r^2/2)^\\alpha=a^\\alpha(1-v)^\\alpha$, so
$I_\\alpha=\\lvert\\Sigma\\rvert^{1/2}S_{D-1}\\tfrac12(2a)^{D/2}a^\\alpha\\,B(D/2,\\alpha+1)$. Lemma 4.3 is $I_1=1$; dividing,
$\\int p^\\alpha=I_\\alpha/I_1=a^{\\alpha-1}\\frac{B(D/2,\\alpha+1)}{B(D/2,2)}=a^{\\alpha-1}\\frac{\\Gamma(\\alpha+1)\\Gamma(D/2+2)}{\\Gamma(D/2+\\alpha+1)}$.
For $\\alpha=1$ it is $1$; for $\\alpha=2$ it is $\\frac{2a}{D/2+2}=-\\frac{4\\lambda}{D+4}$.

**(b)** $-\\lambda\\propto\\lvert\\Sigma\\rvert^{-1/(D+2)}$ by eq. (4.25), so $\\Sigma\\mapsto c\\Sigma$ multiplies $\\int p^\\alpha$ by
$c^{-D(\\alpha-1)/(D+2)}$: it falls as the scale grows for $\\alpha>1$ and rises for $\\alpha<1$. Since
$\\Omega_\\alpha(p)=\\frac{\\int p^\\alpha-1}{\\alpha(\\alpha-1)}$ and $\\alpha(\\alpha-1)$ has the sign of $\\alpha-1$, in both cases
$\\Omega_\\alpha$ decreases (the entropy $-\\Omega_\\alpha$ increases) as the scale grows: for $\\alpha>1$ towards
$-\\frac1{\\alpha(\\alpha-1)}$, for $\\alpha<1$ without bound.

**(c)** With variance $v$, $\\Sigma=\\frac23(5v)^{3/2}$ (eq. (4.30)) and $-\\lambda=\\frac34(5v)^{-1/2}$, so
$\\int p^3=\\frac{9}{80v}\\cdot\\frac{\\Gamma(4)\\Gamma(5/2)}{\\Gamma(9/2)}=\\frac{9}{80v}\\cdot\\frac{24}{35}=\\frac{27}{350\\,v}\\approx0.0771/v$. For the
Gaussian, $\\int\\mathcal N(t;0,v)^3\\,dt=(2\\pi v)^{-3/2}\\sqrt{2\\pi v/3}=\\frac1{2\\sqrt3\\,\\pi v}\\approx0.0919/v$. The
Gaussian's is larger, by $\\frac{350}{54\\sqrt3\\,\\pi}\\approx1.19$, whatever $v$ (both scale as $v^{-1}$): at equal
variance the truncated parabola is the flatter density, and the higher the power, the more the
Gaussian's peak counts.""",
        "task:7": """## Task 7 · $\\int p^\\alpha$ in code (3 points)

Implement `tp_power_integral(Sigma, alpha)` from your Task 6: for scales of shape `(..., D, D)`
(symmetric positive definite, any $D$) and a number $\\alpha>0$, return $\\int p^\\alpha$ of the truncated
paraboloid, shape `(...)`, in closed form. You may call your `tp_threshold` of Task 2, and use
`math.lgamma`. The test integrates $p^\\alpha$ numerically on fine grids in $D=1$ and $D=2$.""",
        "tp_squared_integral": '''def tp_power_integral(Sigma, alpha):
    """The integral of p^alpha for the truncated paraboloid with scale Sigma."""
    ### BEGIN SOLUTION
    D = Sigma.shape[-1]
    log_ratio = math.lgamma(alpha + 1) + math.lgamma(D / 2 + 2) - math.lgamma(D / 2 + alpha + 1)  # B(D/2, alpha+1) / B(D/2, 2)
    return (-tp_threshold(Sigma)) ** (alpha - 1) * math.exp(log_ratio)
    ### END SOLUTION''',
        "test_tp_squared_integral": """# Task 7: against a Riemann sum of p^alpha on fine grids in D = 1 and D = 2, for three powers; batches.
from attnopt.continuous import truncated_paraboloid_threshold
from coursework import check_close, check_shape, own

""" + _RIEMANN.format(function="tp_power_integral") + """    for alpha in (0.5, 1.5, 3.0):
        riemann = (p**alpha).sum() * cell
        check_close(torch.as_tensor(f(Sigma, alpha)).reshape(()), riemann, f"the integral of p^{alpha} in D = {D}, against a Riemann sum",
                    atol=1e-4, hint="change variables to the unit ball, as in the proof of Lemma 4.3, then a Beta integral"
                    " (Task 6 (a)); your formula must give 1 at alpha = 1")
A = torch.randn(2, 3, 3, 3, generator=torch.Generator().manual_seed(6))
check_shape(f(A @ A.transpose(-1, -2) + 0.5 * torch.eye(3), 2.5), (2, 3), "the integral for a (2, 3, 3, 3) batch of scales")
""" + HIDDEN.format(task="tp_squared_integral"),
    },
}

ENTROPY = {
    "about": "the Shannon differential entropy -int p log p of the truncated paraboloid (a digamma difference)",
    "params": {"function": "tp_entropy"},
    "cells": {
        "intro": [_row("| 6 | a derivation: $\\int p^2$ of continuous sparsemax | 2 (graded by hand) |",
                       "| 6 | a derivation: the Shannon entropy of continuous sparsemax | 2 (graded by hand) |"),
                  _row("| 7 | $\\int p^2$ of Task 6 in code | 3 |", "| 7 | the entropy of Task 6 in code | 3 |")],
        "task:6": """## Task 6 · How uncertain is continuous sparsemax? A derivation (2 points, graded by hand)

Continuous softmax and continuous sparsemax are the maximizers of $\\mathbb E_p[f]-\\Omega_\\alpha(p)$ for
$\\alpha=1$ and $\\alpha=2$, eq. (4.1). The Gaussian's Shannon entropy $-\\int p\\log p=\\frac12\\log\\lvert2\\pi e\\Sigma\\rvert$
is classical; the chapter never computes that of the truncated paraboloid.

* **(a)** Derive the differential entropy $H(p)=-\\int_{\\mathbb R^D}p\\log p\\,dt$ of the truncated paraboloid
  with scale $\\Sigma$ in $D$ dimensions in closed form, in terms of $D$ and its threshold $\\lambda$ (Lemma 4.3,
  eq. (4.25)); the answer involves the digamma function $\\psi=\\Gamma'/\\Gamma$.
* **(b)** How does $H$ change when $\\Sigma$ is replaced by $c\\Sigma$? Compare with the Gaussian.
* **(c)** In $D=1$, compare $H$ of the truncated parabola and of the Gaussian with the same variance $v$:
  which is larger, by how much, and does the gap depend on $v$? Why could you have predicted the sign?

*Where to start:* change variables to the unit ball, as in the proof of Lemma 4.3, use polar
coordinates, and differentiate a Beta integral $B(x,y)$ in $y$. Write your derivation in the cell
below (Markdown and LaTeX); Task 7 turns it into code.""",
        "written_tp_squared_integral": """**(a)** Let $a=-\\lambda>0$ and $t=\\mu+\\Sigma^{1/2}y$, so $dt=\\lvert\\Sigma\\rvert^{1/2}dy$ and
$p=[a-\\lVert y\\rVert^2/2]_+$. With $S_{D-1}=2\\pi^{D/2}/\\Gamma(D/2)$ and the substitution $r^2=2av$,
$r^{D-1}dr=\\frac12(2a)^{D/2}v^{D/2-1}dv$, every radial integral has the common factor
$K=\\lvert\\Sigma\\rvert^{1/2}S_{D-1}\\frac12(2a)^{D/2}$: the mass is $Ka\\,B(D/2,2)=1$ (Lemma 4.3) and
$\\int p\\log p=Ka\\int_0^1(1-v)\\big(\\log a+\\log(1-v)\\big)v^{D/2-1}dv$. Since
$\\partial_yB(x,y)=\\int_0^1v^{x-1}(1-v)^{y-1}\\log(1-v)\\,dv=B(x,y)\\big(\\psi(y)-\\psi(x+y)\\big)$, with $x=D/2$, $y=2$,
$\\int p\\log p=\\log a+\\psi(2)-\\psi(D/2+2)$, and $H=-\\log(-\\lambda)+\\psi(D/2+2)-\\psi(2)$.

**(b)** By eq. (4.25), $-\\log(-\\lambda)=\\frac{1}{D+2}\\log\\lvert2\\pi\\Sigma\\rvert-\\frac{2}{D+2}\\log\\Gamma(D/2+2)$, so
$\\Sigma\\mapsto c\\Sigma$ adds $\\frac{D}{D+2}\\log c$ to $H$, against $\\frac D2\\log c$ for the Gaussian: the parabola's
entropy grows more slowly with the scale, because its covariance grows only as $c^{D/(D+2)}$ (Remark 4.4).

**(c)** With variance $v$, $-\\lambda=\\frac34(5v)^{-1/2}$ (eq. (4.30)), and $\\psi(5/2)-\\psi(2)=\\frac53-2\\log2$, so
$H=\\frac12\\log v+\\frac12\\log5+\\log\\frac43+\\frac53-2\\log2\\approx\\frac12\\log v+1.3728$; the Gaussian has
$\\frac12\\log(2\\pi ev)\\approx\\frac12\\log v+1.4189$. The Gaussian's is larger, by about $0.046$ nats, whatever
$v$ (both depend on $v$ only through $\\frac12\\log v$). The sign was predictable: among all densities with
a given variance the Gaussian has the largest entropy.""",
        "task:7": """## Task 7 · The entropy in code (3 points)

Implement `tp_entropy(Sigma)` from your Task 6: for scales of shape `(..., D, D)` (symmetric positive
definite, any $D$), return the differential entropy $-\\int p\\log p$ of the truncated paraboloid, shape
`(...)`, in closed form. You may call your `tp_threshold` of Task 2, and `torch.special.digamma` (or
the recursion $\\psi(x+1)=\\psi(x)+1/x$). The test integrates $-p\\log p$ numerically on fine grids in
$D=1$ and $D=2$.""",
        "tp_squared_integral": '''def tp_entropy(Sigma):
    """The differential entropy -int p log p of the truncated paraboloid with scale Sigma."""
    ### BEGIN SOLUTION
    D = Sigma.shape[-1]
    digamma = lambda x: torch.special.digamma(torch.tensor(float(x))).item()
    return -torch.log(-tp_threshold(Sigma)) + digamma(D / 2 + 2) - digamma(2)
    ### END SOLUTION''',
        "test_tp_squared_integral": """# Task 7: against a Riemann sum of -p log p on fine grids in D = 1 and D = 2; batches.
from attnopt.continuous import truncated_paraboloid_threshold
from coursework import check_close, check_shape, own

""" + _RIEMANN.format(function="tp_entropy") + """    riemann = -torch.special.xlogy(p, p).sum() * cell
    found = torch.as_tensor(f(Sigma)).reshape(())
    check_close(found, riemann, f"the entropy in D = {D}, against a Riemann sum", atol=1e-5,
                hint="yours is minus the entropy: -int p log p is large for a wide density"
                if abs(found.item() + riemann.item()) < 1e-4 else
                "change variables to the unit ball, as in the proof of Lemma 4.3; the log of (1 - v) in a Beta integral is a"
                " derivative of the Beta function in its second argument")
A = torch.randn(2, 3, 3, 3, generator=torch.Generator().manual_seed(6))
check_shape(f(A @ A.transpose(-1, -2) + 0.5 * torch.eye(3)), (2, 3), "the entropy for a (2, 3, 3, 3) batch of scales")
""" + HIDDEN.format(task="tp_squared_integral"),
    },
}


VARIANTS = {
    "continuous_softmax_1d": [SOFTMAX_JACOBIAN, SOFTMAX_BACKWARD],
    "tp_threshold": [SUPPORT_COVARIANCE, SUPPORT_MATRIX],
    "continuous_sparsemax_1d": [SPARSEMAX_JACOBIAN, ENTMAX15],
    "weighted_em_step": [TIED_EM, SPHERICAL_EM],
    "tp_squared_integral": [POWER_INTEGRAL, ENTROPY],
}
