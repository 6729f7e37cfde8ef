"""Claims of the chapter 3 notebooks (one-sided and two-sided entropic transport), checked on the
numbers each notebook recorded.  Each assert quotes the sentence of the rendered page it checks."""

import math
import re

from page_solutions import run_solution


def test_ch3_sdpa_is_eot(results):
    r = results("ch3_sdpa_is_eot")
    assert r["scale"] == "book"
    # "The generic solver and PyTorch agree to a few units of 1e-16 at every temperature"
    assert r["sdpa_eot_max_error"] < 1e-13
    assert len(r["sdpa_eot_error_by_tau"]) >= 5 and max(r["sdpa_eot_error_by_tau"].values()) < 1e-13
    assert r["library_softmax_max_error"] < 1e-15
    # "for any other allocation p the excess objective is exactly tau KL(p || p*)"
    assert r["gibbs_identity_error"] < 1e-12 and r["gibbs_min_excess"] > 0
    # "The entropy increases at every one of the 199 steps of the grid; it is close to 0 at the
    #  coldest temperature and within a few thousandths of log m at the hottest."
    assert r["entropy_min_increment"] > 0
    assert r["entropy_cold"] < 1e-2 and 0 <= r["entropy_hot_gap"] < 5e-3
    # "Every closed form agrees with the generic solver to better than 1e-12 ... by default it
    #  bisects until the threshold is known to working precision" (entmax a=3.0 at its default)
    errors = r["closed_vs_eot"]
    assert all(v < 1e-12 for k, v in errors.items() if k != "entmax a=3.0, tol=1e-6"), errors
    assert errors["entmax a=3.0"] < 1e-12
    # "asked only for lambda to 1e-6 (tol=1e-6), the measured error is far above round-off
    #  (above 1e-10) but below sqrt(1e-6) = 1e-3"
    assert 1e-10 < errors["entmax a=3.0, tol=1e-6"] < 1e-3
    # "The identities between the members of the family ... hold to round-off too."
    assert all(v < 1e-12 for v in r["cross_checks"].values())
    # "softmax (blue) is the only transform that gives every key a positive weight"; "The Tsallis
    #  family (orange) zeroes out more keys as alpha grows"; the prior softmax never zeroes a key
    sup = r["support_one_vector"]
    assert sup["softmax"] == 8 and sup["prior softmax"] == 8
    tsallis = [sup["entmax a=1.25"], sup["1.5-entmax"], sup["sparsemax"], sup["entmax a=3.0"]]
    assert all(x < 8 for x in tsallis) and all(x >= y for x, y in zip(tsallis, tsallis[1:])) and tsallis[0] > tsallis[-1]
    # figure "ch3-regularizers-weights" (alt text): "alpha-entmax 1.25 keeps 7 keys, 1.5-entmax 4,
    #  sparsemax 2 and alpha-entmax 3 one"
    assert tsallis == [7, 4, 2, 1]
    # figure "ch3-objective-simplex": "the softmax (white star), where the generic solver also lands"
    assert r["objective_minimizer_error"] < 1e-12
    # "Softmax maps the whole grid into the open interior of the triangle"; "the share of the grid
    #  that lands on the boundary grows with alpha"
    frac = r["simplex_boundary_fraction"]
    assert frac["softmax"] == 0.0 and r["simplex_vertex_fraction"]["softmax"] == 0.0
    assert frac["1.5-entmax"] < frac["sparsemax"] < frac[r"$\alpha$-entmax, $\alpha=3$"]
    # "On all 400 temperatures the measured support equals the predicted staircase ... (no
    #  mismatch), and it never decreases as tau grows."
    assert set(r["support_mismatches"]) == {"1.25", "1.5", "2.0"}
    assert all(v == 0 for v in r["support_mismatches"].values())
    assert all(step >= 0 for step in r["support_min_step"].values())
    assert r["softmax_min_support"] == r["n_keys_support"]
    # "Sparsemax is exactly one-hot for tau up to the gap ... and it keeps every key exactly when
    #  tau > m (mean(s) - min s)"
    assert r["sparsemax_min_support_below_gap"] == r["sparsemax_max_support_below_gap"] == 1
    assert r["sparsemax_min_support_above"] == r["n_keys_support"] > r["sparsemax_max_support_below"]
    # "All four computations agree to round-off, and future keys get weight exactly 0"
    assert len(r["alibi_errors"]) == 4 and max(r["alibi_errors"].values()) < 1e-12
    assert r["alibi_future_weight"] == 0.0
    # "The mean look-back distance under the attention weights ... is shortest for the steepest head"
    lookback = r["alibi_mean_lookback"]
    assert lookback[0] == min(lookback)


def test_ch3_backward_pass(results):
    r = results("ch3_backward_pass")
    assert r["scale"] == "book"
    # "The four quantities agree to round-off (float64), and every row of the score gradient sums to zero"
    assert len(r["advantage_errors"]) == 4 and max(r["advantage_errors"].values()) < 1e-13
    assert r["score_gradient_row_sum"] < 1e-14
    # "Both variances fall like 1/K (fitted log-log slopes within 0.1 of -1)"
    assert all(abs(sl + 1) < 0.1 for sl in r["reinforce_slopes"].values())
    # "at every K the measured variance agrees with the exact V(b)/K ... (at most 25%)"
    assert r["reinforce_theory_max_deviation"] < 0.25
    for name, var in r["reinforce_variance"].items():
        exact = r["reinforce_exact_variance"][name]
        assert all(abs(v * K / exact - 1) < 0.25 for v, K in zip(var, r["reinforce_Ks"]))
    # "the baseline lowers the variance by the factor in the table below (measured and exact ratios
    #  agree within 10%)"; figure "ch3-reinforce-variance": "by a factor of about 17"
    assert r["reinforce_measured_ratio"] > 2
    assert 15 < r["reinforce_measured_ratio"] < 19 and 15 < r["reinforce_exact_ratio"] < 19
    assert abs(r["reinforce_measured_ratio"] / r["reinforce_exact_ratio"] - 1) < 0.1
    # "at no cost in bias (the mean of all single-sample estimates is within Monte Carlo error of g)"
    n_total = r["reinforce_Ks"][-1] * r["reinforce_R"]
    for name, bias in r["reinforce_bias"].items():
        assert bias < 5 * math.sqrt(r["reinforce_exact_variance"][name] / n_total), name
    # "the 'variance-reducing' baseline multiplies the variance by about 64, as the exact formulas
    #  predict (both measured values within 5% of them)"
    ce = r["counterexample"]
    assert all(abs(v["measured"] / v["exact"] - 1) < 0.05 for v in ce.values())
    assert 55 < r["counterexample_ratio"] < 73
    # geometry.md (on the source): "the baseline multiplies the variance by 64 at epsilon = 0.1" (exact)
    assert round(ce["baseline E_p[u]"]["exact"] / ce["no baseline"]["exact"], 9) == 64
    # "The autograd Hessian, F(p)/tau, and the exact covariance of the one-hot vector agree to round-off"
    assert max(r["hessian_errors"].values()) < 1e-14
    # "the Monte-Carlo covariance agrees within a few of its own standard errors"
    assert r["fisher_mc_error_in_se"] < 5
    # geometry.md, the figure's caption: "the covariance of 200,000 sampled one-hot vectors"
    assert r["fisher_mc_samples"] == 200_000
    # "one zero eigenvalue ..., all others positive and at most 1/2, and trace 1 - |p|^2"
    eig = sorted(r["fisher_eigenvalues"])
    assert abs(eig[0]) < 1e-15 and eig[1] > 0 and eig[-1] <= 0.5
    assert r["fisher_kernel_residual"] < 1e-15 and r["fisher_trace_error"] < 1e-14
    # "From the saturated start the plain gradient ... at every step size tried, the gap has not
    #  reached 1e-6 after the full run of 200 steps. The natural gradient ... reaches the optimum to
    #  within 1e-6 at every step size, the faster the larger the step."
    steps = r["natural_steps_to_1e6"]
    etas = sorted({float(k.split("eta=")[1].split()[0]) for k in steps})
    sat = [steps[f"natural eta={e} saturated"] for e in etas]
    assert all(x is not None for x in sat) and all(x > y for x, y in zip(sat, sat[1:]))
    # figure "ch3-natural-gradient": "natural steps reach the optimum within a hundred steps from
    #  either start"
    assert all(v is not None and v < 100 for k, v in steps.items() if k.startswith("natural"))
    assert all(steps[f"plain eta={e} saturated"] is None for e in etas)
    # its alt text: "Blue curves fall steeply, below 1e-6 within 100 steps (within 10 for the largest
    # step), the two larger steps on to round-off near 1e-16"
    assert all(steps[f"natural eta={etas[-1]} {start}"] <= 10 for start in ("uniform", "saturated"))
    assert all(r["natural_final_gap"][f"natural eta={e} {start}"] < 1e-15
               for e in etas[1:] for start in ("uniform", "saturated"))
    # "From the uniform start the plain gradient does better, but the natural gradient still ends
    #  with the smaller gap at every step size."
    gap = r["natural_final_gap"]
    assert all(gap[f"plain eta={e} uniform"] < gap[f"plain eta={e} saturated"] for e in etas)
    assert all(gap[f"natural eta={e} {start}"] < gap[f"plain eta={e} {start}"]
               for e in etas for start in ("uniform", "saturated"))
    # "The natural step is a multiplicative-weights update ... (checked to round-off above)"
    assert r["multiplicative_weights_error"] < 1e-14


def test_ch3_two_sided(results):
    r = results("ch3_two_sided")
    assert r["scale"] == "book"
    # "Rows sum to 1 to round-off at every epsilon ..., columns to within 1e-9 ..., and the library
    #  and POT agree on the plan to within 1e-9."
    assert r["row_error"] < 1e-13 and r["column_error"] < 1e-9
    assert len(r["pot_error"]) >= 4 and r["pot_max_error"] < 1e-9
    # "softmax lets some keys collect far more than their share of attention (column sums well above 1)"
    assert r["softmax_column_spread"] > 0.5
    # figure "ch3-softmax-vs-sinkhorn": "the column sums of softmax ... range from 0.43 to 1.88"
    assert [round(x, 2) for x in r["softmax_column_range"]] == [0.43, 1.88]
    # the half-step of eq. (ch3-sinkhorn-log) is softmax (checked to round-off)
    assert r["half_step_error"] < 1e-14
    # "once converged both orders give the same plan to within 1e-12"
    assert r["own_vs_library"] < 1e-12
    # "the number needed to reach 1e-6 grows strictly as epsilon decreases ..., from a handful at
    #  epsilon = 1 to hundreds at epsilon = 0.1"
    its = r["iterations_to_1e6"]
    eps = sorted(its, key=float, reverse=True)
    counts = [its[e] for e in eps]
    assert all(c is not None for c in counts) and all(x < y for x, y in zip(counts, counts[1:]))
    assert its["1.0"] < 20 and its["0.1"] >= 100
    # sinkhorn.md, the figure's alt text: "The curve for epsilon 1 reaches 1e-6 within ten iterations,
    # the one for 0.1 only after several hundred"
    assert its["1.0"] <= 10 and 200 <= its["0.1"] < 1000
    # sinkhorn.md, where the default (tol = 1e-5, n_iter = 1000) converges, counted "on 40 random
    # 32x32 matrices of standard-normal scores. When epsilon is a tenth of the range or more, every
    # problem needs at most 20 iterations. At three hundredths, they need between 40 and 850, so that
    # the default solves every problem. At a hundredth, they need between 250 and 15,000, with a
    # median near 5,000: the default solves fewer than one problem in ten and warns on the others. At
    # three thousandths, more than nine in ten are still above the tolerance after 10,000 iterations."
    assert r["default_tol"] == 1e-5 and r["default_max_iter"] == 1000
    n_draws, regime = r["regime_draws"], r["regime_summary"]
    assert n_draws == 40 and set(regime) == {"1.0", "0.1", "0.03", "0.01"}
    assert all(len(counts) == n_draws for counts in r["regime_iterations"].values())
    # every count measured: none cut off at the notebook's cap
    assert r["regime_cap"] > 15_000 and all(v["cut_off"] == 0 for v in regime.values())
    assert regime["1.0"]["max"] <= 20 and regime["0.1"]["max"] <= 20
    at_003, at_001 = regime["0.03"], regime["0.01"]
    assert 40 <= at_003["min"] and at_003["max"] <= 850 and at_003["default_solves"] == n_draws
    assert 250 <= at_001["min"] and at_001["max"] <= 15_000 and 4_000 <= at_001["median"] <= 6_000
    assert 0 < at_001["default_solves"] < n_draws / 10
    small = r["regime_small"]
    assert small["ratio"] == 0.003 and small["n_iter"] == 10_000 and small["above_tol"] > 0.9 * n_draws
    # "The measured asymptotic rate matches sigma_2^2 to within 0.1% at every epsilon"
    assert r["rate_agreement"] < 1e-3
    for e in eps:
        assert abs(r["measured_rate"][e] / r["predicted_rate"][e] - 1) < 1e-3
    # "Padding keys get weight exactly 0; each padded sequence gets the weights of its unpadded
    #  version, with columns summing to n/m_valid; and masking by key_mask or by -inf scores is the same."
    assert r["padding_max_weight"] == 0.0
    assert r["padding_vs_truncated"] < 1e-12 and r["padding_column_error"] < 1e-10
    assert r["padding_mask_vs_neg_inf"] < 1e-14
    # "With few iterations the two gradients differ at the 1e-3 level or more ... and the gap shrinks
    #  together with the marginal error ..., down to below 1e-10 at convergence, where the implicit
    #  gradient also matches finite differences (to within 1e-7 ...)"
    gaps = r["gradient_gap"]
    assert gaps[0] > 1e-3 and r["implicit_vs_unrolled"] < 1e-10 and r["implicit_vs_finite_differences"] < 1e-7
    assert gaps[-1] < gaps[0] * 1e-6


def test_ch3_flash_kernel(results):
    """The notebook on the kernel and the page book/ch3/flash_kernel.md that quotes it."""
    r = results("ch3_flash_kernel")
    assert r["scale"] == "book"
    # "every row's threshold lies in the bracket [m_i - 1, m_i - n_i^(1 - alpha)]"
    assert r["threshold_in_bracket"] is True
    # page: "over all 8,496 rows, Newton from the left needed between 1 and 8 steps (median 4),
    # Halley's method between 1 and 5 (median 3) but overshot the root in about a tenth of the
    # rows, and bisection 45 to 50"
    assert r["rows"] == 8496
    assert r["iterations"]["Newton"] == [1, 4, 8]
    assert r["iterations"]["Halley"] == [1, 3, 5]
    assert 0.05 < r["halley_overshoot_share"] < 0.15
    assert r["iterations"]["bisection"][0] == 45 and r["iterations"]["bisection"][2] == 50
    # notebook: "Halley's in fewer" (than Newton's), "bisection in about fifty"
    assert r["iterations"]["Halley"][1] < r["iterations"]["Newton"][1] < r["iterations"]["bisection"][1]
    # page: "1.5-entmax leaves 92 % of MiniLM's allowed weights at zero, yet with tiles of 16 x 16
    # only 14 % of the allowed tiles can be skipped (57 % with 4 x 4 tiles, 2 % with 32 x 32)"
    skipped = r["skipped"]
    assert round(100 * r["zero_share"]) == 92
    assert [round(100 * skipped[f"1.5-entmax {b}"]) for b in (4, 16, 32)] == [57, 14, 2]
    # notebook: "the share of tiles that can be skipped ... falls as the tiles grow", for both maps,
    # and sparsemax (sparser) skips more than 1.5-entmax
    for name in ("1.5-entmax", "sparsemax"):
        shares = [skipped[f"{name} {b}"] for b in (4, 8, 16, 32)]
        assert all(a > b for a, b in zip(shares, shares[1:])), (name, shares)
    assert all(skipped[f"sparsemax {b}"] > skipped[f"1.5-entmax {b}"] for b in (4, 8, 16, 32))
    # "agrees with the dense path to single-precision rounding ... and skips precisely the tiles"
    assert r["forward_error"] < 1e-5 and r["backward_error"] < 1e-4
    assert r["tiles_loaded_equal_needed"] is True
    # "Its threshold passes, a handful per block of queries"
    assert 1 <= r["threshold_passes"][0] and r["threshold_passes"][1] <= 10


def test_ch3_exercise_solutions():
    """The code of the two solutions on book/ch3/exercises.md runs and prints what their text says."""
    out = dict(line.split(": ", 1) for line in run_solution(3, "ch3-ex-code-sparsemax"))
    # "the sorting implementation and the library agree to about 1e-15, and the SLSQP projection
    # agrees with both to about 1e-13 ...; every row sums to one, the KKT conditions hold, and ...
    # only about two keys per row receive positive weight"
    assert float(out["max |sort - attnopt|"]) < 1e-14
    assert 1e-15 < float(out["max |sort - QP|"]) < 1e-12
    assert out["rows sum to 1"] == "True" and out["KKT conditions hold"] == "True"
    assert round(float(out["mean support size"])) == 2
    lines = run_solution(3, "ch3-ex-code-sinkhorn")
    # "The half-step agrees with softmax to machine precision; after 200 iterations both marginal
    # errors are at the level of 1e-16"
    assert lines[0].endswith("True") and lines[2].endswith("True True")
    row_error, column_error = (float(x) for x in re.findall(r"error: (\S+)", lines[1]))
    assert row_error < 1e-15 and column_error < 1e-15
    # "the column sums of the softmax attention matrix ... range from about 0.7 to 1.5"
    sums = [float(x) for x in re.findall(r"\d\.\d+", lines[3])]
    assert len(sums) == 5 and round(min(sums), 1) == 0.7 and round(max(sums), 1) == 1.5
    # "the objective gap equals eps KL(ab^T || P*) to about 1e-15"
    gap, eps_kl = (float(x) for x in re.findall(r"(?:gap|KL): (\S+)", lines[4]))
    assert abs(gap - eps_kl) < 1e-14
