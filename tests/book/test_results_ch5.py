"""Claims of the chapter 5 notebook (one mechanism, four views), checked on the numbers it recorded.
Each assert quotes the sentence of the rendered page it checks."""


def test_ch5_four_views(results):
    r = results("ch5_four_views")
    assert r["scale"] == "book"
    errors = r["agreement_errors"]
    # "all are below 1e-12: the four derivations describe one computation"
    assert len(errors) == 9 and all(v < 1e-12 for v in errors.values()), errors
    # "all four views equal SDPA in float64" (ch1, ch2, ch3: outputs and weights)
    for key in ("ch1 generalized attention", "ch2 attention kernel", "ch3 one-sided EOT"):
        assert errors[key] < 1e-12, key
    # "KL-to-u transport (ch3) = generalized attention with preference u (ch1)"
    assert errors["ch1 (u) vs ch3 (KL to u) weights"] < 1e-12
    # "Gaussian continuous softmax = discrete softmax of quadratic scores on a fine grid";
    # "Moment matching the discrete weights must also return (mu, sigma^2)"
    assert errors["ch4 Gaussian: discrete grid vs continuous softmax"] < 1e-12
    assert errors["ch4 Gaussian: moment match"] < 1e-12
    # "sparsemax and 1.5-entmax zero keys out, softmax never does: mean support sparsemax < entmax < m"
    s = r["mean_support"]
    assert s["softmax"] == r["m"] and s["sparsemax"] < s["entmax15"] < r["m"]
    # sparsemax closed form agrees with the generic transport solver (quadratic regularizer)
    assert r["sparse_vs_eot"] < 1e-12
    # "a synonym in the transport cost receives weight, under KL it does not: OT weight > 0, KL weight = 0, TV > 0.05"
    assert r["kl_synonym_weight"] == 0.0 and r["ot_synonym_weight"] > 0 and r["ot_tv"] > 0.05
    # "As alpha -> 0 the OT weights tend to the true preference ... which we check at alpha = 1e-6"
    assert r["ot_small_alpha_error"] < 1e-5
    # "the Gaussian summary of random weights changes the output: relative difference > 0.1, fit error < 1e-2"
    assert r["cont_vs_disc_rel"] > 0.1 and r["value_fit_rel"] < 1e-2 and r["density_tv"] > 0.1
