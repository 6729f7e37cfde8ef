"""The assignments' checks, run in this process on chosen answers (no nbgrader, a few seconds each).

A task is run as a student's notebook runs it: the setup cell, the solution cells of the instructor's
version with one of them replaced by the answer under test, then the task's test cell, whose hidden
checks run against a staged course directory (``ATTNOPT_COURSE_DIR``) with a secret of this run.
Each known wrong-but-plausible answer must fail a *visible* check with a message that says what was
expected, what was found and how to fix it; "write it yourself" must be enforced by behaviour:
a docstring may name the library, an alias may not call it.
"""

from __future__ import annotations

import importlib.util
import json
import secrets
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "assignments" / "grading"))
_spec = importlib.util.spec_from_file_location("assignments_tool", ROOT / "tools" / "assignments.py")
tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tool)

import coursework  # noqa: E402  (assignments/grading/coursework.py)

_spec = importlib.util.spec_from_file_location("sweep_tool", ROOT / "tools" / "sweep_hidden_checks.py")
sweep_tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sweep_tool)


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    course = tmp_path_factory.mktemp("checks-course")
    tool.stage(course, "public")  # the notebooks of this repository, variant 0 of every task (test_variants.py: the others)
    return course


@pytest.fixture
def graded(course, monkeypatch):
    """Hidden checks on: the staged course and a fresh secret."""
    monkeypatch.setenv("ATTNOPT_COURSE_DIR", str(course))
    monkeypatch.setenv("ATTNOPT_COURSE_SECRET", secrets.token_hex(8))


def cells(name):
    nb = json.loads((ROOT / "assignments" / "source" / name / f"{name}.ipynb").read_text())
    return [c for c in nb["cells"] if c["cell_type"] == "code"]


def grade_id(cell):
    return cell["metadata"].get("nbgrader", {}).get("grade_id")


def run_task(name: str, test_id: str, answer: str | None = None, prelude: str = "") -> dict:
    """Run the notebook ``name`` up to the test cell ``test_id``, with ``answer`` in place of the
    solution cell that defines the same function; return the namespace (raises what the test raises)."""
    namespace: dict = {"__name__": "__main__"}
    code_cells = cells(name)
    replaced = False
    for cell in code_cells:
        source = "".join(cell["source"])
        if answer is not None and cell["metadata"].get("nbgrader", {}).get("solution"):
            defined = {line.split("(")[0][4:] for line in source.splitlines() if line.startswith("def ")}
            if any(f"def {fn}(" in answer for fn in defined):
                source, replaced = textwrap.dedent(answer), True
        if grade_id(cell) == "setup":
            source += "\n" + prelude
        exec(compile(source, f"<{grade_id(cell)}>", "exec"), namespace)
        if grade_id(cell) == test_id:
            break
    else:
        raise KeyError(test_id)
    assert answer is None or replaced, "the answer replaced no solution cell"
    return namespace


HIDDEN_TASKS = [sweep_tool.HIDDEN_CALL.search("".join(c["source"]))[1] for name in tool.assignment_names()
                for c in cells(name) if grade_id(c) and grade_id(c).startswith("test_")]
TESTS = [(name, grade_id(c)) for name in tool.assignment_names() for c in cells(name)
         if grade_id(c) and grade_id(c).startswith("test_")]


@pytest.mark.parametrize("name,test_id", TESTS)
def test_solutions_pass_visible_and_hidden_checks(graded, name, test_id, capsys):
    run_task(name, test_id)
    out = capsys.readouterr().out
    assert "hidden check 1 (" in out and "passed" in out and "hidden check" in out.splitlines()[-1], out


def test_solutions_pass_their_hidden_checks_under_every_secret_of_a_sweep():
    """A correct solution passes its hidden checks whatever the course secret: here under 20 fixed
    secrets per task (``tools/sweep_hidden_checks.py --secrets 1000`` runs more; it found a mean that
    two correct EM steps computed 1e-10 apart and an undamped Newton that diverged, each on about
    one secret in 200 and one in 400, before their inputs were fixed)."""
    failures = sweep_tool.sweep(20)
    assert sorted(failures) == sorted(HIDDEN_TASKS), sorted(failures)
    failed = {task: f for task, f in failures.items() if f}
    assert not failed, "\n\n".join(f"{task}: {len(f)} of 20 secrets failed; {f[0][0]}:\n{f[0][1]}" for task, f in failed.items())


def test_hidden_checks_do_nothing_for_a_student(monkeypatch, capsys):
    monkeypatch.delenv("ATTNOPT_COURSE_DIR", raising=False)
    run_task("ch3_one_sided_eot", "test_softmax_backward")
    assert "run when your notebook is graded" in capsys.readouterr().out


def test_hidden_inputs_come_from_the_secret(course, monkeypatch):
    monkeypatch.setenv("ATTNOPT_COURSE_DIR", str(course))
    draws = []
    for secret in ("first course", "first course", "second course"):
        monkeypatch.setenv("ATTNOPT_COURSE_SECRET", secret)
        draws.append(coursework._Hidden("eot_value", {}, coursework.course_secret()).rng().initial_seed())
    assert draws[0] == draws[1] != draws[2]


def failure(name, test_id, answer, prelude=""):
    with pytest.raises(AssertionError) as error:
        run_task(name, test_id, answer, prelude)
    return str(error.value)


# ------------------------------------------------------------------ "write it yourself", by behaviour


def test_a_docstring_that_names_the_library_gets_full_marks(graded, capsys):
    run_task("ch3_one_sided_eot", "test_lse_hessian", '''
        def lse_hessian(scores, tau=1.0):
            """Like attnopt.geometry.fisher_information(p) / tau, but written with torch (see attnopt)."""
            p = torch.softmax(scores / tau, dim=-1)  # attnopt would do the same
            return (torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)) / tau
    ''')
    assert "failed" not in capsys.readouterr().out


def test_the_library_under_any_name_raises_library_blocked():
    for prelude, body in (
        ("from attnopt.geometry import fisher_information as fi", "fi(p)"),
        ("import attnopt.geometry as g0", "g0.fisher_information(p)"),
        ("import attnopt", "attnopt.geometry.fisher_information(p)"),
        ("", "__import__('attnopt.geometry').geometry.fisher_information(p)"),
        ("from attnopt import geometry", "geometry.fisher_information(p)"),
    ):
        answer = f'''
            def lse_hessian(scores, tau=1.0, helper=None):
                p = torch.softmax(scores / tau, dim=-1)
                return {body} / tau
        '''
        with pytest.raises((coursework.LibraryBlocked, ImportError)) as error:
            run_task("ch3_one_sided_eot", "test_lse_hessian", answer, prelude)
        assert "write it yourself" in str(error.value), (prelude, body, str(error.value))


def test_the_library_works_again_after_the_check():
    import torch

    from attnopt.geometry import fisher_information
    from attnopt.value_functions import GaussianRBF

    with coursework.without_attnopt({}):
        with pytest.raises(coursework.LibraryBlocked):
            fisher_information(torch.full((3,), 1 / 3))
        with pytest.raises(coursework.LibraryBlocked):
            GaussianRBF(torch.zeros(2), 0.1)
    p = torch.tensor([0.5, 0.5])
    assert torch.equal(fisher_information(p), torch.diag(p) - torch.outer(p, p))
    assert GaussianRBF(torch.zeros(2), 0.1)(torch.zeros(1, 1)).shape[-1] == 2


def test_the_scan_of_the_library_follows_a_reload_and_a_new_name():
    """without_attnopt keeps its scan of the library's functions between calls (a test cell calls the
    student's function many times); a module reloaded (new function objects under the old names) or
    a library function bound under a new top-level name must be blocked all the same."""
    import importlib

    import torch

    import attnopt.transforms.geometry as geometry

    p = torch.full((3,), 1 / 3)
    with coursework.without_attnopt({}):  # the scan is made and kept
        pass
    old = geometry.fisher_information
    importlib.reload(geometry)
    try:
        assert geometry.fisher_information is not old
        with coursework.without_attnopt({}):
            for fn in (geometry.fisher_information, old):
                with pytest.raises(coursework.LibraryBlocked):
                    fn(p)

        def made_later(x):  # a function of the library's made after the scan, under a new name
            return x

        made_later.__module__ = geometry.__name__
        geometry.made_later = made_later
        with coursework.without_attnopt({}):
            with pytest.raises(coursework.LibraryBlocked):
                made_later(p)
        assert made_later(p) is p and torch.allclose(geometry.fisher_information(p).sum(), torch.tensor(0.0), atol=1e-7)
    finally:
        vars(geometry).pop("made_later", None)


def test_a_one_hot_plan_may_round_its_one_but_not_its_zeros():
    """check_one_hot, for the one-hot plans of the sparse tasks (and a causal first row): a solution
    that normalizes by a division gives 1 - 2.2e-16 for the one, and is right (an independent
    solution of Assignment 5's Task 4 lost its 3 points to a check that asked for 1 to the last bit,
    2026-12-06); a weight of 1e-300 where the task asks for an exact zero is wrong."""
    import torch

    expected = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    coursework.check_one_hot(torch.tensor([1.0 - 2.0**-52, 0.0, 0.0, 0.0], dtype=torch.float64), expected, "plan")
    coursework.check_one_hot(torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float32), expected, "plan")
    with pytest.raises(AssertionError, match="exactly 0"):
        coursework.check_one_hot(torch.tensor([1.0, 1e-300, 0.0, 0.0], dtype=torch.float64), expected, "plan")
    with pytest.raises(AssertionError, match="largest difference"):
        coursework.check_one_hot(torch.tensor([0.999, 0.001, 0.0, 0.0]), expected, "plan")
    with pytest.raises(AssertionError, match="shape"):
        coursework.check_one_hot(torch.tensor([1.0, 0.0, 0.0]), expected, "plan")
    with pytest.raises(AssertionError, match="nan"):
        coursework.check_one_hot(torch.tensor([float("nan"), 0.0, 0.0, 0.0]), expected, "plan")


# ------------------------------------------------------------------ wrong answers, caught visibly


def test_forgotten_one_over_tau_in_the_softmax_backward():
    message = failure("ch3_one_sided_eot", "test_softmax_backward", """
        def softmax_backward(p, upstream, tau=1.0):
            return p * (upstream - (p * upstream).sum(-1, keepdim=True))
    """)
    assert "expected" in message and "found" in message and "factor 1/tau" in message, message


def test_forgotten_one_over_tau_in_the_sparsemax_backward():
    message = failure("ch3_one_sided_eot", "test_sparsemax_backward", """
        def sparsemax_backward(p, upstream, tau=1.0):
            support = (p > 0).to(p.dtype)
            mean = (support * upstream).sum(-1, keepdim=True) / support.sum(-1, keepdim=True)
            return support * (upstream - mean)
    """)
    assert "forget the factor 1/tau" in message, message


def test_softmax_baseline_in_the_sparsemax_backward():
    message = failure("ch3_one_sided_eot", "test_sparsemax_backward", """
        def sparsemax_backward(p, upstream, tau=1.0):
            return p * (upstream - (p * upstream).sum(-1, keepdim=True)) / tau
    """)
    assert "plain mean of u over the support" in message or "weight 0" in message, message


def test_nan_gradient_at_a_forbidden_key():
    """The value is right (the inf * 0 term is masked out), its gradient is nan at the forbidden key."""
    message = failure("ch3_one_sided_eot", "test_eot_value", """
        def eot_value(cost, eps):
            p = torch.softmax(-cost / eps, dim=-1)
            finite = torch.isfinite(cost)
            terms = torch.where(finite, p * cost + eps * p * torch.log(p), torch.zeros_like(p))
            return terms.sum(-1)
    """)
    assert "forbidden key" in message and "nan" in message and "closed form" in message, message
    # the hint points the way without handing over the code (issue 28)
    assert "torch." not in message and "logsumexp" not in message, message


def test_nan_value_at_a_forbidden_key():
    message = failure("ch3_one_sided_eot", "test_eot_value", """
        def eot_value(cost, eps):
            p = torch.softmax(-cost / eps, dim=-1)
            return (p * cost).sum(-1) + eps * (p * torch.log(p)).sum(-1)
    """)
    assert "a finite number" in message and "nan" in message and "closed form" in message, message
    assert "torch." not in message and "logsumexp" not in message, message  # a way, not the code


def test_a_sign_error_in_the_softmax_backward_is_named():
    message = failure("ch3_one_sided_eot", "test_softmax_backward", """
        def softmax_backward(p, upstream, tau=1.0):
            return p * ((p * upstream).sum(-1, keepdim=True) - upstream) / tau
    """)
    assert "minus autograd's" in message and "baseline" in message, message


def test_a_sign_error_in_the_sparsemax_backward_is_named():
    message = failure("ch3_one_sided_eot", "test_sparsemax_backward", """
        def sparsemax_backward(p, upstream, tau=1.0):
            support = (p > 0).to(p.dtype)
            mean = (support * upstream).sum(-1, keepdim=True) / support.sum(-1, keepdim=True)
            return support * (mean - upstream) / tau
    """)
    assert "minus autograd's" in message and "1/tau" not in message, message


def hint_texts(source: str) -> list[str]:
    """The string constants of every ``hint=`` argument of a test cell (f-strings without their
    replacement fields; both arms of a conditional)."""
    import ast

    texts = []
    for node in ast.walk(ast.parse(source)):
        for keyword in getattr(node, "keywords", []):
            if keyword.arg == "hint":
                texts += [c.value for c in ast.walk(keyword.value)
                          if isinstance(c, ast.Constant) and isinstance(c.value, str)]
    return texts


def test_no_hint_hands_over_code():
    """Hints point the way (a quantity, a theorem, a factor) without the code (issue 28)."""
    code = ("torch.", "np.", "logsumexp", "einsum", ".sum(", "softmax(")
    found = {(name, grade_id(c)): text for name in tool.assignment_names() for c in cells(name)
             if grade_id(c) and grade_id(c).startswith("test_")
             for text in hint_texts("".join(c["source"])) if any(k in text for k in code)}
    assert not found, found
    assert "the baseline is E_p[u] = sum_j p_j u_j" in hint_texts("".join(
        next(c for c in cells("ch3_one_sided_eot") if grade_id(c) == "test_softmax_backward")["source"]))
    # the same holds for the test cells of every variant a course may draw
    variant_tests = [(name, cell_id, v, source) for name in tool.assignment_names()
                     for variants in tool.task_variants(name).values() for v, variant in enumerate(variants, 1)
                     for cell_id, source in variant["cells"].items()
                     if cell_id.startswith("test_") and isinstance(source, str)]
    in_variants = {(name, cell_id, v): text for name, cell_id, v, source in variant_tests
                   for text in hint_texts(source) if any(k in text for k in code)}
    assert not in_variants, in_variants
    scanned = [source for *_, source in variant_tests if hint_texts(source)]
    assert len(scanned) > 20, "the scan of the variants' test cells found almost no hint: it would prove nothing"


def test_unnormalized_mixing_weights():
    message = failure("ch4_continuous", "test_weighted_em_step", """
        def weighted_em_step(points, weights, means, covs, mixing):
            D = points.shape[-1]
            diff = points[:, None, :] - means[None]
            maha = (diff * torch.linalg.solve(covs, diff.unsqueeze(-1)).squeeze(-1)).sum(-1)
            log_normal = -0.5 * (maha + torch.logdet(covs) + D * math.log(2 * math.pi))
            resp = torch.softmax(torch.log(mixing) + log_normal, dim=-1)
            wr = weights[:, None] * resp
            Nk = wr.sum(0)
            new_means = wr.T @ points / Nk[:, None]
            centered = points[:, None, :] - new_means[None]
            new_covs = torch.einsum("lk,lka,lkb->kab", wr, centered, centered) / Nk[:, None, None]
            return new_means, new_covs, Nk
    """)
    assert "sum of the mixing weights" in message and "divide by the total weight" in message, message


def test_gauss_legendre_with_200_nodes_passes_task_3(graded, capsys):
    """The hint of chapter 4, Task 3 works: a Gauss-Legendre rule with 200 nodes passes every check."""
    run_task("ch4_continuous", "test_continuous_sparsemax_1d", """
        def continuous_sparsemax_1d(mu, sigma2, centers, widths):
            mu, sigma2 = float(mu), float(sigma2)
            A = -float(tp_threshold(torch.tensor([[sigma2]])))
            a = math.sqrt(2 * A * sigma2)
            x, w = np.polynomial.legendre.leggauss(200)
            t = torch.tensor(mu + a * x)
            p = A - (t - mu) ** 2 / (2 * sigma2)
            basis = torch.exp(-0.5 * ((t[:, None] - centers) / widths) ** 2) / (widths * math.sqrt(2 * math.pi))
            return a * (torch.tensor(w) * p) @ basis
    """)
    assert "failed" not in capsys.readouterr().out


def test_a_wrong_variance_fails_with_numbers():
    message = failure("ch4_continuous", "test_truncated_parabola", """
        def tp_threshold(Sigma):
            D = Sigma.shape[-1]
            return -(math.gamma(D / 2 + 2) / torch.sqrt(torch.linalg.det(2 * math.pi * Sigma))) ** (2 / (D + 2))

        def tp_covariance(Sigma):
            return -tp_threshold(Sigma)[..., None, None] * Sigma / 2.5  # D = 1 only

        def tp_scale_from_covariance(cov):
            return cov
    """)
    assert "the covariance for D = 2" in message and "expected" in message and "found" in message, message


# ------------------------------------------------------------------ the derivation tasks (issue 28 item 5)




def test_a_power_of_zero_off_the_support_is_caught():
    """In torch 0 ** 0 is 1: p ** (2 - alpha) without the support gives keys of weight 0 a rate at alpha = 2."""
    message = failure("ch3_one_sided_eot", "test_entmax_temperature", """
        def entmax_temperature_derivatives(p, scores, tau, alpha):
            w = p ** (2 - alpha)
            centred = scores - (w * scores).sum(-1, keepdim=True) / w.sum(-1, keepdim=True)
            spread = (w * centred**2).sum(-1)
            return -w * centred / tau**2, -spread / tau**2, spread / tau**3
    """)
    assert "alpha = 2.0" in message and "exactly 0" in message and "is 1 at p = 0" in message, message


def test_softmax_rates_for_entmax_fail_against_finite_differences():
    """Eq. (3.12) copied for entmax (p in place of p^(2 - alpha)) sums to zero but is not the rate."""
    message = failure("ch3_one_sided_eot", "test_entmax_temperature", """
        def entmax_temperature_derivatives(p, scores, tau, alpha):
            centred = scores - (p * scores).sum(-1, keepdim=True)
            spread = (p * centred**2).sum(-1)
            return -p * centred / tau**2, -spread / tau**2, spread / tau**3
    """)
    assert "alpha = 1.5, against central differences" in message and "optimality condition (3.18)" in message, message


def test_a_rate_for_one_batch_dimension_only_is_caught_by_the_hidden_checks(graded):
    """Reducing over dimension 1 passes the visible (4, 9) test and fails the hidden (3, 5, 11) batches."""
    solution = "".join(next(c for c in cells("ch3_one_sided_eot") if grade_id(c) == "entmax_temperature_derivatives")["source"])
    reduce = "(w * scores).sum(-1, keepdim=True) / w.sum(-1, keepdim=True)"
    assert reduce in solution
    wrong = solution.replace(reduce, reduce.replace("(-1,", "(1,"))
    message = failure("ch3_one_sided_eot", "test_entmax_temperature", wrong)
    assert "hidden check 1 (a (3, 5, 11) batch" in message, message


def test_a_naive_kl_is_nan_at_a_masked_key():
    message = failure("ch5_four_views", "test_value_derivatives", """
        def value_derivatives(cost, eps, u):
            logits = torch.log(u) - cost / eps
            log_Z = torch.logsumexp(logits, dim=-1)
            p = torch.exp(logits - log_Z.unsqueeze(-1))
            mean = (p * cost).sum(-1)
            var = (p * (cost - mean.unsqueeze(-1)) ** 2).sum(-1)
            return -eps * log_Z, (p * torch.log(p / u)).sum(-1), -var / eps**3
    """)
    assert "u with a zero (a masked key)" in message and "0 log 0 = 0" in message, message


def test_a_wrong_power_of_eps_in_the_second_derivative_is_caught():
    message = failure("ch5_four_views", "test_value_derivatives", """
        def value_derivatives(cost, eps, u):
            logits = torch.log(u) - cost / eps
            log_Z = torch.logsumexp(logits, dim=-1)
            p = torch.softmax(logits, dim=-1)
            mean = (p * cost).sum(-1)
            var = (p * (cost - mean.unsqueeze(-1)) ** 2).sum(-1)
            return -eps * log_Z, -mean / eps - log_Z, -var / eps**2
    """)
    assert "F''(eps), u of full support, against central differences" in message and "p* moves with eps" in message, message



def test_a_forgotten_one_over_alpha_in_the_dual_sensitivity_is_caught():
    message = failure("ch1_fenchel_dual", "test_dual_sensitivity", """
        def dual_sensitivity(lam, templates, u, alpha):
            T = templates
            p = torch.softmax(torch.log(u) + T @ lam, dim=-1)
            cov = T.T @ (torch.diag(p) - torch.outer(p, p)) @ T
            dlam = torch.linalg.solve(torch.eye(T.shape[-1]) + alpha * cov, lam)
            moved = T @ dlam
            return dlam, p * (moved - p @ moved)
    """)
    assert "d lambda*/d alpha, a preference of full support, against central differences" in message, message
    assert "stationarity condition" in message, message


def test_a_naive_kl_of_the_tilt_is_nan_at_an_atom_of_mass_zero():
    message = failure("ch2_markov_kernels", "test_tilt_cost", """
        def tilt_cost(weights, stat, lam):
            p = torch.softmax(torch.log(weights) + lam * stat, dim=-1)
            target = p @ stat
            return target, (p * torch.log(p / weights)).sum(), torch.tensor(lam), 1 / (p @ (stat - target) ** 2)
    """)
    assert "K(f) for lam = -0.8" in message and "0 log 0 = 0" in message, message


def test_the_variance_instead_of_its_inverse_is_caught():
    message = failure("ch2_markov_kernels", "test_tilt_cost", """
        def tilt_cost(weights, stat, lam):
            logits = torch.log(weights) + lam * stat
            A = torch.logsumexp(logits, dim=-1)
            p = torch.exp(logits - A)
            target = p @ stat
            return target, lam * target - A, torch.tensor(lam), p @ (stat - target) ** 2
    """)
    assert "K''(f) for lam = -0.8, against central differences" in message and "moment condition" in message, message


def test_a_wrong_beta_integral_is_caught():
    message = failure("ch4_continuous", "test_tp_squared_integral", """
        def tp_squared_integral(Sigma):
            D = Sigma.shape[-1]
            return -2 * tp_threshold(Sigma) / (D + 2)
    """)
    assert "the integral of p^2 in D = 1, against a Riemann sum" in message and "Beta integral" in message, message


def test_the_numbers_of_the_ch4_model_derivation():
    """Task 6 (c) of chapter 4 and its rubric row: at equal variance v the truncated parabola has
    int p^2 = 3 / (5 sqrt(5 v)) ~ 0.2683 / sqrt(v) and the Gaussian 1 / (2 sqrt(pi v)) ~ 0.2821 / sqrt(v),
    a ratio of 5 sqrt(5) / (6 sqrt(pi)) ~ 1.051, whatever v: here by Riemann sums of both densities."""
    import math

    import torch

    from attnopt.continuous import truncated_paraboloid_threshold

    for v in (0.01, 0.7):
        Sigma = torch.tensor([[2 / 3 * (5 * v) ** 1.5]], dtype=torch.float64)
        a = float(-truncated_paraboloid_threshold(Sigma))
        t = torch.linspace(-6 * math.sqrt(v), 6 * math.sqrt(v), 400001, dtype=torch.float64)
        dt = float(t[1] - t[0])
        parabola = torch.clamp(a - 0.5 * t**2 / Sigma[0, 0], min=0)
        gaussian = torch.exp(-0.5 * t**2 / v) / math.sqrt(2 * math.pi * v)
        assert abs(float((parabola * t**2).sum()) * dt - v) < 1e-8 * max(v, 1)  # the same variance
        tp, g = float((parabola**2).sum()) * dt, float((gaussian**2).sum()) * dt
        assert abs(tp * math.sqrt(v) - 3 / (5 * math.sqrt(5))) < 1e-7 and round(tp * math.sqrt(v), 4) == 0.2683
        assert round(g * math.sqrt(v), 4) == 0.2821
        assert abs(g / tp - 5 * math.sqrt(5) / (6 * math.sqrt(math.pi))) < 1e-6 and round(g / tp, 2) == 1.05
    guide = (ROOT / "book" / "instructors.md").read_text()
    assert "larger by $5\\sqrt5/(6\\sqrt\\pi)\\approx1.05$" in guide
