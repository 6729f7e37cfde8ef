"""entmax 1.3's own tests run against attnopt.transforms (through ``attnopt_entmax_shim``).

The tests of what attnopt does not offer are skipped here, each with its reason, so that the
vendored files stay entmax's text (only their imports changed).
"""

import pytest

NORMMAX = "normmax (alpha-normmax) is not in attnopt"
BUDGET = "budget-constrained sparsemax (budget_bisect) is not in attnopt"
TENSOR_ALPHA = ("a tensor of alphas with requires_grad, some below 1: attnopt.transforms.entmax takes one float "
                "alpha >= 1 and gives no gradient with respect to it (its gradcheck over alpha is in tests/lib/test_transforms.py)")
TOPK = "entmax's private top-k threshold internals (attnopt sorts or solves the whole row; no partial-sort k)"

SKIPS = {
    "test_normmax": NORMMAX,
    "test_normmax_grad": NORMMAX,
    "test_normmax_grad_multiple_alphas": NORMMAX,
    "test_budget": BUDGET,
    "test_budget_grad": BUDGET,
    "test_budget_grad_multiple_k": NORMMAX + " (this test calls normmax_bisect, despite its name)",
    "test_entmax_grad": TENSOR_ALPHA,
    "test_entmax_correct_multiple_alphas": TENSOR_ALPHA,
    "test_entmax_grad_multiple_alphas": TENSOR_ALPHA,
    "test_arbitrary_dimension": TENSOR_ALPHA,
    "test_arbitrary_dimension_grad": TENSOR_ALPHA,
    "test_entmax_topk": TOPK,
    "test_sparsemax_topk": TOPK,
}


def pytest_collection_modifyitems(config, items):
    here = str(config.rootpath / "tests" / "peers" / "entmax")
    for item in items:
        if not str(item.path).startswith(here):
            continue
        name = item.originalname
        reason = SKIPS.get(name)
        loss = getattr(item, "callspec", None) and item.callspec.params.get("Loss")
        if loss is not None and getattr(loss, "__name__", "") == "NormmaxBisectLoss":
            reason = NORMMAX
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))
