"""Claims of the chapter 5 page and its notebook (one mechanism, four views), checked on the numbers
the notebook recorded.  Each assert quotes the sentence of the rendered page it checks."""


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
