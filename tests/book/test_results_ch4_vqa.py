"""Claims of the chapter 4 notebook on VQA attention maps (notebooks/ch4_vqa_attention_maps.ipynb)
and of the page book/ch4/vqa_setting.md that quotes it: each sentence is asserted against the
numbers the notebook recorded."""

HEADS = ("discrete", "continuous_softmax", "continuous_sparsemax", "mixture", "mixture_selected")
SINGLE = ("continuous_softmax", "continuous_sparsemax", "mixture_selected")
FAMILIES = ("shape", "left", "same_shape", "count")


def test_record_contract(results):
    r = results("ch4_vqa_attention_maps")
    assert r["scale"] == "book"
    # "mean ± standard deviation over the seeds": at least three at the book scale
    assert r["n_seeds"] >= 3
    # "No row used attention supervision"; "Every head is trained on answers alone"
    assert r["attention_supervision"] == 0
    for h in HEADS:
        for key in ("overall_mean", "overall_std", "yes_no_mean", "precision_mean"):
            assert 0 <= r[f"{h}_{key}"] <= 1, (h, key)
    for shares in r["k_star_shares"].values():
        assert len(shares) == 3 and abs(sum(shares) - 1) < 1e-6


def test_accuracy_claims(results):
    r = results("ch4_vqa_attention_maps")
    # "The question prior stays below 55% on every answer type"
    for t in ("yes_no", "number", "other"):
        assert r[f"question_prior_{t}"] < 0.55, t
    # "every head, the test-time mixture included, is more than 25 points above it overall"
    for h in HEADS:
        assert r[f"{h}_overall_mean"] > r["question_prior_overall"] + 0.25, h
    # "Discrete softmax ... above 95% overall, on yes/no and on every question family"
    assert r["discrete_overall_mean"] > 0.95 and r["discrete_yes_no_mean"] > 0.95
    for f in FAMILIES:
        assert r[f"discrete_{f}_min_seed"] > 0.95, f  # every seed, so the mean too
    # "Continuous softmax, continuous sparsemax and the test-time mixture answer shape and left
    # questions above 95% of the time, but same-shape questions at chance (within 5 points of 50%)"
    for h in SINGLE:
        assert r[f"{h}_shape_min_seed"] > 0.95 and r[f"{h}_left_min_seed"] > 0.95, h
        assert abs(r[f"{h}_same_shape_mean"] - 0.5) < 0.05, h
    # "The 2-component mixture is the best continuous head overall (above 85%)"
    for h in SINGLE:
        assert r["mixture_overall_mean"] > r[f"{h}_overall_mean"], h
    assert r["mixture_overall_mean"] > 0.85
    # "answers same-shape questions well above chance (above 65% on average), but with a large
    # spread over the seeds (a standard deviation above 5 points)"
    assert r["mixture_same_shape_mean"] > 0.65 and r["mixture_same_shape_std"] > 0.05
    # "Its yes/no accuracy stays below the 90% that discrete attention exceeds easily"
    assert r["mixture_yes_no_mean"] < 0.90 < r["discrete_yes_no_mean"]
    # "continuous sparsemax counts better than continuous softmax, by more than 10 points"
    assert r["continuous_sparsemax_number_mean"] > r["continuous_softmax_number_mean"] + 0.10


def test_precision_claims(results):
    r = results("ch4_vqa_attention_maps")
    # "Every head puts more of its attention on the relevant objects than uniform attention does,
    # but even the discrete head ... puts less than a quarter of its mass there"
    for h in HEADS:
        assert r[f"{h}_precision_mean"] > r["uniform_precision"], h
    assert r["discrete_precision_mean"] < 0.25
    # "The test-time mixture ... answers as well as it, within 2 points ... while its attention is
    # more precise (more than twice as much mass on the relevant objects)"
    assert abs(r["mixture_selected_overall_mean"] - r["continuous_softmax_overall_mean"]) < 0.02
    assert r["mixture_selected_precision_mean"] > 2 * r["continuous_softmax_precision_mean"]


def test_selection_sweep_claims(results):
    r = results("ch4_vqa_attention_maps")
    shares = {float(p): s for p, s in r["k_star_shares"].items()}
    penalties = sorted(shares)
    # "with κ = 0 almost every question keeps three components (above 90%), with κ = 1 almost none
    # does (below 5%) and over a third keep a single one"
    assert shares[0.0][2] > 0.90
    assert shares[1.0][2] < 0.05 and shares[1.0][0] > 1 / 3
    # "the share of K* = 1 grows with κ"
    ones = [shares[p][0] for p in penalties]
    assert all(a <= b for a, b in zip(ones, ones[1:]))
    # "it stays within one point of its value at κ = 0 for every penalty, and same-shape questions
    # stay near chance"
    overall = {float(p): v for p, v in r["sweep_overall"].items()}
    assert all(abs(overall[p] - overall[0.0]) < 0.01 for p in penalties)
    assert all(abs(v - 0.5) < 0.05 for v in r["sweep_same_shape"].values())


def test_page_claims(results):
    """The paragraph of book/ch4/vqa_setting.md on the synthetic task."""
    r = results("ch4_vqa_attention_maps")
    # "repeated over three seeds"
    assert r["n_seeds"] == 3
    # "every single-ellipse head ... answers at chance, while discrete attention answers almost all
    # of them and the two-component mixture recovers part of the gap"
    for h in SINGLE:
        assert abs(r[f"{h}_same_shape_mean"] - 0.5) < 0.05, h
    assert r["discrete_same_shape_mean"] > 0.95
    assert max(r[f"{h}_same_shape_mean"] for h in SINGLE) < r["mixture_same_shape_mean"] < r["discrete_same_shape_mean"]
    # "choosing the number of components at test time leaves the accuracy of the continuous-softmax
    # model it starts from unchanged"
    assert abs(r["mixture_selected_overall_mean"] - r["continuous_softmax_overall_mean"]) < 0.02
    # "the share of single-component examples grows with the penalty"
    shares = {float(p): s for p, s in r["k_star_shares"].items()}
    ones = [shares[p][0] for p in sorted(shares)]
    assert all(a <= b for a, b in zip(ones, ones[1:])) and ones[-1] > ones[0]
    # "discrete attention answers nearly every question with less than a quarter of its mass on the
    # relevant objects"
    assert r["discrete_overall_mean"] > 0.95 and r["discrete_precision_mean"] < 0.25


def test_page_claim_on_the_multimodal_notebook(results):
    """vqa_setting.md: "on synthetic weights with a known number of blobs (ch4_multimodal) it finds
    that number for fewer than half of the maps"."""
    match = results("ch4_multimodal")["match_true"]  # percentages, one per penalty
    assert all(v < 50 for v in match.values()), match
