"""Claims of chapter 1's notebooks and pages (attention as a Fenchel dual), checked against the
notebooks' recorded numbers.

Each assert quotes the sentence of the notebook (or of the page, named) it checks. The numbers come from
_build/.../results/<stem>.json, written by the notebooks at scale="book". The asserts are on the raw
quantities the notebooks record (the smallest margin, the largest step), never on a verdict the notebook
computed. The last test runs the code of the solutions on the exercises page, whose outputs the
solutions describe.
"""

import contextlib
import io
import math
import re
from pathlib import Path

EXERCISES = Path(__file__).resolve().parents[2] / "book" / "ch1" / "exercises.md"


def test_ch1_gaussian_fig3(results):
    r = results("ch1_gaussian_fig3")
    assert r["scale"] == "book"
    # convex_conjugates.md: "computes the supremum numerically for 99 values of y (it matches f* to
    # within 1e-12) and checks the identity (ch1-fy-gap-kl) on 10,000 random pairs (to within 1e-13)"
    assert r["conjugate_points"] == 99 and r["conjugate_error"] < 1e-12
    assert r["fy_pairs"] == 10_000 and r["fy_identity_err"] < 1e-13
    # notebook: the Fenchel-Young gap is "never negative, and zero exactly at p = q"
    assert r["fy_gap_min"] >= 0 and r["fy_at_softmax"] < 1e-13
    # "the numerically solved lambda* and h agree with the closed forms to better than 1e-9"
    for key in ("gauss_lambda_err_identity", "gauss_h_err_identity", "gauss_lambda_err_correlated",
                "gauss_h_err_correlated", "gauss_lambda_err_by_hand"):
        assert r[key] < 1e-9, key
    # "(in practice around 1e-13)"
    assert max(r[k] for k in r if k.startswith("gauss_")) < 1e-12
    # "at the computed lambda* the dual value must equal the primal value (strong duality), and
    # no other lambda -- in particular not alpha z -- may give a larger dual value"
    assert r["duality_gap_max"] < 1e-12 and r["dual_excess_min"] > 0
    ratio = {a: g / s for a, g, s in zip(r["fig3_alphas"], r["fig3_gap"], r["fig3_shift"])}
    # "below 0.05 at alpha = 0.1, below 0.2 at alpha = 0.5 and about 0.3 at alpha = 1";
    # small_alpha.md: "under 4 % ... at alpha = 0.1 and under 20 % at alpha = 0.5, but about 30 %"
    assert ratio[0.1] < 0.04 and ratio[0.5] < 0.2 and 0.25 <= ratio[1.0] <= 0.35
    # "the two squares coincide for small alpha and separate as alpha grows"
    assert all(a < b for a, b in zip(r["fig3_gap"], r["fig3_gap"][1:]))
    # "both move from mu towards mu + z as the evidence becomes more reliable"
    assert all(a < b for a, b in zip(r["fig3_shift"], r["fig3_shift"][1:]))
    # "The gap falls on a line of slope 2 ... we claim |slope - 2| < 0.15", "the relative deviation on a line of slope 1"
    assert abs(r["slope_gap"] - 2) < 0.15
    assert abs(r["slope_rho"] - 1) < 0.1
    # "both below their bounds over the whole range"; "The bounds are loose by a constant factor"
    assert r["gap_bound_ratio"] <= 1 and r["rho_bound_ratio"] <= 1
    assert r["gap_bound_ratio"] < 0.9 and r["rho_bound_ratio"] < 0.9
    # the duality figure: "the two meet at the black line, P(p~) = D(lambda*)"
    assert r["picture_duality_gap"] < 1e-12
    # the design figure: the estimate "ends at the template nearest to b"
    assert math.dist(r["path_end"], r["nearest_vertex"]) < 0.01
    # the paths figure: "they travel almost the same curve, but at equal alpha generalized
    # attention is further along it": its distance from mu minus the exact estimate's, at every alpha
    assert r["path_ahead_margin_min"] >= 0 and r["path_ahead_margin_max"] > 0.01
    assert r["path_off_curve_max"] < 0.1 * r["path_gap_max"]


def test_ch1_special_cases(results):
    r = results("ch1_special_cases")
    assert r["scale"] == "book"
    # "The printed errors are of the order of the float32 rounding unit (below 1e-6) and of 1e-15 in float64"
    for key in ("uniform", "uniform_h", "mask", "t5"):
        assert r[f"{key}_float32"] <= 1e-6, key
        assert r[f"{key}_float64"] <= 1e-13, key
    # "Masked keys get weight exactly zero" (closed form) and "the exact weights are zero wherever u is"
    assert r["masked_weight_max_float32"] == 0.0 and r["masked_weight_max_float64"] == 0.0
    assert r["exact_masked_max"] == 0.0
    # "All three curves have slope 1 to within 0.01 for alpha <= 1e-3"
    assert len(r["limit_slopes"]) == 3
    assert all(abs(s - 1) < 0.01 for s in r["limit_slopes"])
    # "sit on their dotted first-order lines (relative difference below 1e-4 at alpha = 1e-6)"
    assert all(e < 1e-4 for e in r["limit_first_order_rel_err"])


def test_ch1_fig4_pretrained(results):
    r = results("ch1_fig4_pretrained")
    assert r["scale"] == "book" and r["model_name"] == "all-MiniLM-L6-v2"
    # "6 layers, 12 heads ... on 32 English sentences"; "every query token of every sentence"
    assert (r["n_layers"], r["n_heads"]) == (6, 12) and r["n_sentences"] == 32
    assert r["n_problems"] >= 6 * 12 * 30 * 5
    # "The rebuilt weights match the model's attention probabilities to about 1e-6"
    assert 1e-7 < r["reconstruction_error"] <= 5e-6
    # stationarity of the solved duals
    assert r["max_grad"] <= 1e-8
    # "every layer's mean relative deviation below 0.1"; "nine queries in ten have rho < 0.15"
    assert len(r["layer_mean"]) == 6 and max(r["layer_mean"]) < 0.1
    assert r["rho_p90"] < 0.15
    assert all(m <= p for m, p in zip(r["layer_median"], r["layer_p90"]))
    # "layer 1 has the smallest mean, layer 6 the largest"
    assert min(range(6), key=lambda l: r["layer_mean"][l]) == 0
    assert max(range(6), key=lambda l: r["layer_mean"][l]) == 5
    # "it is not uniform over heads": a 6 x 12 heatmap whose means differ
    heads = [x for row in r["head_mean"] for x in row]
    assert len(r["head_mean"]) == 6 and len(heads) == 72 and max(heads) > 2 * min(heads)
    # notebook, small_alpha.md, attention_special_cases.md, exercises.md, index.md: "delta^2/4 is at
    # least 1.9 for every sentence and layer" (alpha = 1), although the templates are divided by sqrt(d')
    assert 1.9 <= r["bound_min"] < 1.95
    # "the correlation between log rho and log rho_2 is above 0.6 and the median of rho/rho_2 lies between 0.6 and 1.2"
    assert r["rho2_log_corr"] > 0.6
    assert 0.6 < r["rho_over_rho2_median"] < 1.2
    # the scatter's alt text: "along the dashed diagonal from about 0.015 to 0.3, mostly a little below it"
    assert 0.01 <= min(r["rho_min"], r["rho2_min"]) < 0.02 and 0.25 < max(r["rho_max"], r["rho2_max"]) < 0.35
    assert r["rho_over_rho2_median"] < 1
    # the histograms' alt text: "on a shared axis from 0 to about 0.2"
    assert 0.18 < r["rho_max"] < 0.22
    # the heatmap: "by a factor of about four (from 0.03 to 0.11)"; its alt text: "layer 1 ... from .03 to
    # .07; the lower rows ... from .05 to .11"
    heads_by_layer = r["head_mean"]
    assert 0.025 <= min(heads_by_layer[0]) and max(heads_by_layer[0]) < 0.075
    lower = [x for row in heads_by_layer[1:] for x in row]
    assert 0.045 <= min(lower) and max(lower) < 0.115
    assert 3.5 < max(heads) / min(heads) < 4.5
    # "a relative deviation of 5-10 %"
    assert 0.05 <= r["rho_mean"] <= 0.1
    # small_alpha.md: "from about 0.05 in the first [layer] to 0.08 in the last"
    assert 0.045 <= r["layer_mean"][0] < 0.055 and 0.075 <= r["layer_mean"][-1] < 0.085
    # "The T5 code path, checked offline" (random weights): "the rebuilt weights match the model's to
    # float32 rounding in all three kinds of attention, the decoder gives no preference to a future key,
    # and cross-attention's preference is uniform on the encoder's words, while the encoder's and the
    # decoder's depart from uniform through their position bias (a little)"
    assert r["t5_parts"] == ["encoder", "decoder", "cross"]
    assert max(r["t5_random_error"]) <= 1e-6
    error, future, off_uniform = (dict(zip(r["t5_parts"], r[k])) for k in
                                  ("t5_random_error", "t5_random_future", "t5_random_off_uniform"))
    assert future["decoder"] == 0.0 and future["encoder"] > 0 and future["cross"] > 0
    assert off_uniform["cross"] <= 1e-7
    assert 1e-3 < off_uniform["encoder"] < 0.2 and 1e-3 < off_uniform["decoder"] < 0.2


def test_ch1_ot_attention(results):
    r = results("ch1_ot_attention")
    assert r["scale"] == "book"
    # "|u_tilde - u|_1 decreases monotonically with gamma and is below 1e-8 at gamma = 1e-3": the
    # largest step from one gamma to the next smaller one is negative
    assert r["tv_largest_step"] < 0
    assert float(r["tv_true_pref_gamma_min"]) < 1e-8 < r["tv_true_pref_gamma_max"]
    # "At gamma = 0.1 a sizeable share of the preference already sits on words not in the sentence"
    assert r["true_pref_outside_share"] > 0.05
    # "the exact OT solution at alpha = 1e-8 has exactly these weights, up to O(alpha)"
    assert r["limit_alpha_err"] < 1e-6
    # ot_attention.md: "the exact solution at alpha = 1e-8 has the weights u~ to within 1e-8"
    assert r["limit_alpha_err"] < 1e-8
    assert r["exact_crosscheck"] < 1e-10
    # "With zero spread the weights are exactly u_j/|G| ... and the deviation shrinks with the spread"
    assert r["block_spreads"][-1] == 0.0 and r["block_dev"][-1] <= 1e-15
    assert all(a > b for a, b in zip(r["block_dev"], r["block_dev"][1:]))
    # "Groups that contain no input word get exactly zero"
    assert r["block_outside_max"] == 0.0
    # "the gap ... falls with slope 2 in alpha and the relative deviation with slope 1 (within 0.15 and 0.1)"
    assert len(r["slope_gap"]) == len(r["ot_gammas"]) == 3
    assert all(abs(s - 2) < 0.15 for s in r["slope_gap"])
    assert all(abs(s - 1) < 0.1 for s in r["slope_rho"])
    # "both stay below the corollary's bounds (by a wide margin)"
    assert all(x <= 0.1 for x in r["gap_bound_ratio"] + r["rho_bound_ratio"])
    # "The KL attention can only reweight the five words of the sentence: every other word gets exactly zero"
    assert r["kl_outside_max"] == 0.0
    # "OT attention moves part of each word's weight to its synonyms ... almost nothing to words of other groups"
    assert all(o > 0.1 for o in r["ot_outside"])
    assert all(s > 0.99 * o for s, o in zip(r["ot_synonym"], r["ot_outside"]))
    assert all(math.isfinite(x) for x in r["ot_outside"])
    # "every group keeps almost exactly the mass the preference gave it" (KL attention does not)
    assert max(r["ot_group_mass_dev"]) < 0.01 < r["kl_group_mass_dev"]
    # ot_attention.md: "to within 0.01 in the notebook; the KL attention moves 0.27 of the weight"
    assert 0.26 <= r["kl_group_mass_dev"] < 0.28


def run_solution_code(label):
    """Run the code of the solution of exercise ``label`` on book/ch1/exercises.md; return what it prints."""
    text = EXERCISES.read_text()
    start = text.index("````{solution} " + label)
    solution = text[start:text.index("\n````\n", start)]
    (code,) = re.findall(r"```python\n(.*?)```", solution, re.S)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, f"exercises.md:{label}", "exec"), {"__name__": "__main__"})
    return out.getvalue().split("\n")


def test_ch1_exercise_solutions():
    # ch1-ex-masked-torch: "Both differences are at the level of float64 rounding, and the masked
    # weights are exactly zero"
    causal_gap, masked_max, t5_gap = (float(x) for x in run_solution_code("ch1-ex-masked-torch")[:3])
    assert causal_gap < 1e-14 and t5_gap < 1e-14 and masked_max == 0.0
    # ch1-ex-gram-dual: "The gradient of D is at rounding level for every alpha, and rho grows with alpha
    # while staying below the bound ... for these random templates rho stays well below it" (and "pure
    # Newton converges here from c = 0": the gradient would not vanish otherwise)
    rows = [re.search(r"alpha=\s*([\d.]+): \|grad D\|=(\S+)\s+rho=(\S+)\s+bound=(\S+)", line)
            for line in run_solution_code("ch1-ex-gram-dual")]
    rows = [tuple(float(x) for x in m.groups()) for m in rows if m]
    assert len(rows) == 4
    assert all(grad < 1e-12 for _, grad, _, _ in rows)
    rhos = [rho for _, _, rho, _ in rows]
    assert all(a < b for a, b in zip(rhos, rhos[1:]))
    assert all(rho < 0.1 * bound for _, _, rho, bound in rows)
