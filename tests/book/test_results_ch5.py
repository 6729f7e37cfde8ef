"""Claims of the chapter 5 page and its notebook (one mechanism, four views), checked on the numbers
the notebook recorded.  Each assert quotes the sentence of the rendered page it checks."""

from page_solutions import exercises_page, python_blocks


def test_ch5_four_views(results):
    r = results("ch5_four_views")
    assert r["scale"] == "book"
    # "In the notebook, over 64 random instances with 10 keys, ..."
    assert r["n_batch"] == 64 and r["m"] == 10
    errors = r["agreement_errors"]
    # "all are below 1e-12: the four derivations describe one computation"
    assert len(errors) == 9 and all(v < 1e-12 for v in errors.values()), errors
    # "the three discrete views return the SDPA weights to the last bit of float64 (over a batch
    # of 64 queries, weights and outputs, the largest difference is 4e-16)"
    discrete = [
        "ch1 generalized attention", "ch1 weights", "ch2 attention kernel", "ch2 weights",
        "ch3 one-sided EOT", "ch3 weights",
    ]
    assert f"{max(errors[k] for k in discrete):.0e}" == "4e-16", errors
    # "KL-to-u transport = generalized attention with preference u"
    assert errors["ch1 (u) vs ch3 (KL to u) weights"] < 1e-12
    # "The notebook puts 4001 keys on [-1.5, 2.5] and finds agreement to 4e-15"
    assert f"{errors['ch4 Gaussian: discrete grid vs continuous softmax']:.0e}" == "4e-15"
    # "moment_match recovers (mu, sigma^2) from the discrete weights to round-off"
    assert errors["ch4 Gaussian: moment match"] < 1e-12
    # "sparsemax keeps on average 2.9 keys and 1.5-entmax 5.7, where the softmax keeps all 10"
    s = r["mean_support"]
    assert s["softmax"] == r["m"] == 10
    assert abs(s["sparsemax"] - 2.9) < 0.05 and abs(s["entmax15"] - 5.7) < 0.05, s
    # "Sparsemax agrees with the generic transport solver ... (largest difference below 1e-15)"
    assert r["sparse_vs_eot"] < 1e-15
    # "an absent synonym of the best key receives weight 0.14 under OT and exactly 0 under KL"
    assert r["kl_synonym_weight"] == 0.0
    assert abs(r["ot_synonym_weight"] - 0.14) < 0.005 and r["ot_tv"] > 0.05
    # "As alpha -> 0 the OT weights tend to the true preference ... which we check at alpha = 1e-6"
    assert r["ot_small_alpha_error"] < 1e-5
    # "the continuous and discrete outputs differ by more than their own size (relative
    # difference 1.16), although the value function fits the values to 2e-4"
    assert abs(r["cont_vs_disc_rel"] - 1.16) < 0.005 and r["cont_vs_disc_rel"] > 1
    assert f"{r['value_fit_rel']:.0e}" == "2e-04"
    # "the Gaussian spreads mass over locations the discrete weights ignore"
    assert r["density_tv"] > 0.1


# ---------------------------------------------------------------------------------------------
# Exercises for Chapter 5: the numbers the solutions quote, recorded by the notebook's hidden
# cells (same seeds and instances as the solutions' code), and the solutions' code itself.
# ---------------------------------------------------------------------------------------------

ROUND_OFF = 1e-12


def test_ch5_exercise_numbers(results):
    x = results("ch5_four_views")["exercises"]
    # 5.1 "all at the level of float64 round-off"
    assert all(v < ROUND_OFF for v in x["dual"].values()), x["dual"]
    # 5.2 "The kernel's rows and the generic solver agree to 1e-16; the Sinkhorn plan ... has an
    # objective larger by 0.0424, which is its KL divergence to Gamma to all printed digits; and
    # the column sums of Gamma are 0.11 away from w in total variation."
    plan = x["plan"]
    assert plan["rows_vs_eot"] < ROUND_OFF
    assert f"{plan['objective_gap']:.4f}" == f"{plan['kl']:.4f}" == "0.0424"
    assert abs(plan["objective_gap"] - plan["kl"]) < ROUND_OFF
    assert f"{plan['marginal_tv']:.2f}" == "0.11"
    # 5.3 "The weights agree to 3e-17, the multipliers to 2e-16, and the Pythagorean identity
    # holds to 3e-17"
    assert all(v < ROUND_OFF for v in x["tilt"].values()), x["tilt"]
    # 5.4 "agree to 6e-17, the two limits of part 2 hold to 1e-16 and exactly, and ... the OT and
    # KL weights are 0.08 apart in total variation"
    ot = x["ot"]
    assert ot["ot_vs_plan"] < ROUND_OFF and ot["free_vs_softmax"] < ROUND_OFF
    assert ot["stuck_vs_u"] == 0.0
    assert f"{ot['ot_vs_kl_tv']:.2f}" == "0.08"
    # 5.5 "the largest Jacobian found has norm 0.41, below the Fisher bound 0.75 of these keys and
    # 2.00 of the box, while the kernel view's bound is 3494 (874 with the sharp tau(Pi) = 1)"
    f = x["fisher"]
    assert f["gradient"] < ROUND_OFF and f["jacobian"] < ROUND_OFF
    assert f"{f['largest']:.2f}" == "0.41" and f["largest"] <= f["fisher_bound"]
    assert f"{f['fisher_bound']:.2f}" == "0.75" and f"{f['fisher_bound_box']:.2f}" == "2.00"
    assert f"{f['kernel_bound']:.0f}" == "3494" and f"{f['kernel_bound'] / 4:.0f}" == "874"
    # 5.6 "the error ratio is 0.225, which is alpha times the largest covariance eigenvalue
    # (0.225), well below the bound 0.778; and the first step ... is 7% away from lambda*"
    c = x["contraction"]
    assert c["first_step"] < ROUND_OFF
    assert f"{c['last_ratio']:.3f}" == f"{c['rate']:.3f}" == "0.225"
    assert f"{c['bound']:.3f}" == "0.778" and c["rate"] < c["bound"] < 1
    assert f"{100 * c['alpha_z_error']:.0f}" == "7"
    # 5.7 "the error falls from 7e-3 to 3e-6, with a fitted order of 2.3 ... the support holds
    # 5, 8, 13, 21, 33, 53 keys (ratios close to 1.59; the formula predicts 5.3 for the coarsest
    # grid), and the error grows towards ||r - psi(mu)|| = 1.75"
    g = x["grid"]
    assert f"{g['errors'][0]:.0e}" == "7e-03" and f"{g['errors'][-1]:.0e}" == "3e-06"
    assert f"{g['order']:.1f}" == "2.3"
    assert g["supports"] == [5, 8, 13, 21, 33, 53]
    assert all(abs(b / a - 2 ** (2 / 3)) < 0.1 for a, b in zip(g["supports"][2:], g["supports"][3:]))
    assert f"{2 * (3 * 0.02 / 2) ** (1 / 3) * 0.04 ** (-2 / 3):.1f}" == "5.3"
    assert f"{g['collapse']:.2f}" == "1.75"
    assert all(a < b < g["collapse"] for a, b in zip(g["errors_raw"], g["errors_raw"][1:]))
    # 5.8 "(a), (c) and (d) keep all 10 keys; (b) and (e) keep 3, (f) keeps 2; and (g) keeps 6, 8
    # and 10 keys for c = 0.1, 0.01, 0.001 ... agrees with the closed form to 3e-17"
    s = x["sparsity"]
    assert s["supports"] == {"a": 10, "b": 3, "c": 10, "d": 10, "e": 3, "f": 2,
                             "g 0.1": 6, "g 0.01": 8, "g 0.001": 10}, s
    assert s["closed_form"] < ROUND_OFF
    # 5.9 "The closed form agrees with the library's W1 ... to 2e-6 (the discretization), and over
    # 2000 random pairs the largest ratio ... is 0.87, below 1"
    w = x["wasserstein"]
    assert f"{w['w1_grid']:.0e}" == "2e-06"
    assert f"{w['largest_ratio']:.2f}" == "0.87" and w["largest_ratio"] < 1


# What each printed line of the solutions' code reports: (group, key or keys) of the recorded numbers.
PRINTED = {
    "multiplier, numerical vs closed form": ("dual", "multiplier"),
    "weights, from the dual vs one_sided_eot": ("dual", "dual_vs_eot"),
    "weights, one_sided_eot vs softmax(-C/eps)": ("dual", "eot_vs_softmax"),
    "duality gap": ("dual", "duality_gap"),
    "kernel rows vs one-sided transport": ("plan", "rows_vs_eot"),
    "objective gap": ("plan", ["objective_gap", "kl"]),
    "second marginal of the plan vs w (total variation)": ("plan", "marginal_tv"),
    "weights, Fenchel vs maximum entropy": ("tilt", "weights"),
    "multipliers, Fenchel vs maximum entropy": ("tilt", "multipliers"),
    "Pythagoras, |KL(other||u) - KL(other||p) - KL(p||u)|": ("tilt", "pythagoras"),
    "OT attention vs the one-sided plan": ("ot", "ot_vs_plan"),
    "M = 0 vs softmax(s / gamma)": ("ot", "free_vs_softmax"),
    "M = inf off the diagonal vs u": ("ot", "stuck_vs_u"),
    "total variation, OT vs KL weights": ("ot", "ot_vs_kl_tv"),
    "evidence gradient, autograd vs advantage form": ("fisher", "gradient"),
    "Jacobian vs alpha V^T F(p) K": ("fisher", "jacobian"),
    "largest Jacobian found": ("fisher", "largest"),
    "Fisher bound alpha diam^2 / 4": ("fisher", "fisher_bound"),
    "Fisher bound on the box, alpha R^2 d": ("fisher", "fisher_bound_box"),
    "kernel-view bound": ("fisher", ["kernel_bound", "kernel_bound/4"]),
    "first step vs alpha z": ("contraction", "first_step"),
    "error ratio, last step": ("contraction", "last_ratio"),
    "alpha times the largest covariance eigenvalue": ("contraction", "rate"),
    "the bound alpha diam^2 / 4": ("contraction", "bound"),
    "relative error of alpha z": ("contraction", "alpha_z_error"),
    "errors, temperature 1/h": ("grid", "errors"),
    "order of convergence (log-log slope)": ("grid", "order"),
    "errors, temperature 1": ("grid", "errors_raw"),
    "keys in the support, temperature 1": ("grid", "supports"),
    "|r - psi(mu)|": ("grid", "collapse"),
    "(a) p log p": ("sparsity", "supports.a"),
    "(b) p^2 / 2": ("sparsity", "supports.b"),
    "(c) -log p": ("sparsity", "supports.c"),
    "(d) p log p + p^2 / 2": ("sparsity", "supports.d"),
    "(e) exp(p)": ("sparsity", "supports.e"),
    "(f) p^4 / 4": ("sparsity", "supports.f"),
    "(g) c = 0.1": ("sparsity", "supports.g 0.1"),
    "(g) c = 0.01": ("sparsity", "supports.g 0.01"),
    "(g) c = 0.001": ("sparsity", "supports.g 0.001"),
    "(g), c = 0.001, vs (1 + m c) softmax(s) - c": ("sparsity", "closed_form"),
    "W1, closed form vs wasserstein1 on a grid": ("wasserstein", "w1_grid"),
    "largest |r - r'| / (Lip W1) over 2000 pairs": ("wasserstein", "largest_ratio"),
}

RUN_BLOCKS = r"""
import contextlib, io, json, sys
blocks, outputs = json.load(sys.stdin), []
for block in blocks:
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        exec(compile(block, "<solution>", "exec"), {"__name__": "__main__"})
    outputs.append(buffer.getvalue())
print(json.dumps(outputs))
"""


def unit_in_last_place(token: str) -> float:
    mantissa, _, exponent = token.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    return 10.0 ** (int(exponent or 0) - decimals)


def test_ch5_exercise_solutions_run_and_print_the_recorded_numbers(results, tmp_path):
    """The code of every solution runs, and each number it prints is the notebook's, to the
    digits printed (round-off-level numbers: both below 1e-12)."""
    import json
    import re
    import subprocess
    import sys

    blocks = python_blocks(exercises_page(5))
    assert len(blocks) == 9, f"expected one code block per exercise, found {len(blocks)}"
    run = subprocess.run([sys.executable, "-c", RUN_BLOCKS], input=json.dumps(blocks), capture_output=True,
                         text=True, cwd=tmp_path, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    recorded = results("ch5_four_views")["exercises"]
    seen = set()
    for output in json.loads(run.stdout):
        for line in output.strip().splitlines():
            label, _, rest = line.partition(": ")
            assert label in PRINTED, f"a solution prints a line the test does not know: {line!r}"
            seen.add(label)
            group, keys = PRINTED[label]
            expected = []
            for key in keys if isinstance(keys, list) else [keys]:
                name, _, sub = key.partition(".")
                value = recorded[group][name.removesuffix("/4")]
                value = value[sub] if sub else value
                expected += value if isinstance(value, list) else [value / 4 if name.endswith("/4") else value]
            tokens = re.findall(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?", rest)[: len(expected)]
            assert len(tokens) == len(expected), line
            for token, value in zip(tokens, expected):
                if abs(value) < ROUND_OFF:
                    assert abs(float(token)) < ROUND_OFF, line
                else:
                    assert abs(float(token) - value) <= 0.5 * unit_in_last_place(token) * (1 + 1e-9), (line, value)
    assert seen == set(PRINTED), set(PRINTED) - seen


def test_capstone_rubric_adds_up_and_the_guide_uses_it():
    """The capstone's rubric: five criteria whose points add to 100, levels in decreasing order,
    and the instructor's guide's grading table quotes the same criteria with the same points."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    capstone = (root / "book" / "ch5" / "capstone.md").read_text()
    rubric = capstone[capstone.index("## Rubric"):]
    rows = [line for line in rubric.splitlines() if line.startswith("| **")]
    assert len(rows) == 5, rows
    table = {}
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        name, top = re.fullmatch(r"\*\*(.+)\*\* \((\d+)\)", cells[0]).groups()
        levels = [int(re.search(r"\((\d+)\)$", cell).group(1)) for cell in cells[1:]]
        assert levels[0] == int(top) and levels[-1] == 0 and levels == sorted(levels, reverse=True), row
        table[name.lower()] = levels
    assert sum(levels[0] for levels in table.values()) == 100
    guide = (root / "book" / "instructors.md").read_text()
    section = guide[guide.index("## Setting and grading the capstone project"):]
    section = section[: section.index("\n## ", 1)]
    quoted = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 5 and cells[1].isdigit():
            quoted[cells[0]] = [int(c) for c in cells[1:]]
    assert quoted == {name: [levels[0], *levels[:3]] for name, levels in table.items()}, quoted
    assert "{doc}`ch5/capstone`" in section and "100" in section
