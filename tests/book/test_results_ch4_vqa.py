"""Claims of the chapter 4 notebook on VQA attention maps (notebooks/ch4_vqa_attention_maps.ipynb)."""

HEADS = ("discrete", "continuous_softmax", "continuous_sparsemax", "mixture", "mixture_selected")


def test_ch4_vqa_attention_maps(results):
    r = results("ch4_vqa_attention_maps")
    assert r["scale"] == "book"
    # "We therefore train with an extra loss that the original experiments did not use ... (beta = 1)"
    assert r["attention_supervision"] == 1.0
    for h in HEADS:
        # "Every trained head answers more questions correctly than the majority answer — by more than 15 points"
        assert r[f"{h}_overall"] > r["majority_overall"] + 0.15, h
        # "... and better than its own untrained version"
        assert r[f"{h}_overall"] > r[f"untrained_{h}_overall"], h
        # "every trained head is within 5 points of the question prior"
        assert abs(r[f"{h}_overall"] - r["question_prior_overall"]) < 0.05, h
        # "no head exceeds 55% on [the yes/no questions]"
        assert r[f"{h}_yes_no"] <= 0.55, h
        # "Every trained head puts more of its attention on the relevant objects than its untrained version"
        assert r[f"{h}_precision"] > r[f"untrained_{h}_precision"], h
        # "the discrete head has the highest precision of all"
        if h != "discrete":
            assert r["discrete_precision"] > r[f"{h}_precision"], h
    # "The test-time-selected mixture ... answers about as well as the model it was copied from (within 5 points)"
    assert abs(r["mixture_selected_overall"] - r["continuous_softmax_overall"]) < 0.05
    # "both mixture heads have a higher precision than both single-ellipse heads"
    for m in ("mixture", "mixture_selected"):
        for s in ("continuous_softmax", "continuous_sparsemax"):
            assert r[f"{m}_precision"] > r[f"{s}_precision"], (m, s)
    # "more than half of the canvas gets exactly zero attention from the sparsemax head"
    assert r["sparsemax_zero_share"] > 0.5
    # "The test-time selection ... keeps two components for almost every example"
    assert r["selected_two_components_share"] > 0.9
