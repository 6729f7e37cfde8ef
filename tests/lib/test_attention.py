"""attnopt.attention against PyTorch's fused kernel, plus the validation and notebook helpers."""

import json
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import attnopt
from attnopt import book
from attnopt._validation import as_float_tensor, check_dim, check_positive, check_probability_vector

DTYPES_TOL = [(torch.float32, 1e-6), (torch.float64, 1e-12)]


def qkv(*shape, dtype=torch.float64, seed=0, n_keys=None, dv=None):
    g = torch.Generator().manual_seed(seed)
    *lead, n, d = shape
    m = n if n_keys is None else n_keys
    q = torch.randn(*lead, n, d, generator=g, dtype=dtype)
    k = torch.randn(*lead, m, d, generator=g, dtype=dtype)
    v = torch.randn(*lead, m, dv or d, generator=g, dtype=dtype)
    return q, k, v


@pytest.mark.parametrize("dtype,tol", DTYPES_TOL)
def test_matches_torch_sdpa_without_mask(dtype, tol):
    q, k, v = qkv(2, 3, 9, 8, dtype=dtype, n_keys=11, dv=5)
    out, p = attnopt.scaled_dot_product_attention(q, k, v)
    assert (out - F.scaled_dot_product_attention(q, k, v)).abs().max() <= tol
    assert torch.allclose(p.sum(-1), torch.ones((), dtype=dtype), atol=tol)


@pytest.mark.parametrize("dtype,tol", DTYPES_TOL)
def test_matches_torch_sdpa_with_mask_and_bias(dtype, tol):
    q, k, v = qkv(2, 4, 7, 6, dtype=dtype)
    g = torch.Generator().manual_seed(1)
    mask = torch.rand(2, 1, 7, 7, generator=g) > 0.4
    mask[..., 0] = True
    out, p = attnopt.scaled_dot_product_attention(q, k, v, mask=mask)
    assert (out - F.scaled_dot_product_attention(q, k, v, attn_mask=mask)).abs().max() <= tol
    assert p.masked_select(~mask.expand_as(p)).abs().max() == 0
    bias = torch.randn(7, 7, generator=g, dtype=dtype)
    out, _ = attnopt.scaled_dot_product_attention(q, k, v, bias=bias)
    assert (out - F.scaled_dot_product_attention(q, k, v, attn_mask=bias)).abs().max() <= tol


def test_custom_scale_matches_torch():
    q, k, v = qkv(3, 5, 4)
    out, _ = attnopt.scaled_dot_product_attention(q, k, v, scale=0.3)
    assert torch.allclose(out, F.scaled_dot_product_attention(q, k, v, scale=0.3), atol=1e-12)


def test_definition_by_hand():
    """One query, two keys: the weights are a logistic function of the score difference."""
    q = torch.tensor([[1.0, 2.0]], dtype=torch.float64)
    k = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    v = torch.tensor([[10.0], [20.0]], dtype=torch.float64)
    out, p = attnopt.scaled_dot_product_attention(q, k, v)
    s1, s2 = 1 / math.sqrt(2), 2 / math.sqrt(2)
    p1 = 1 / (1 + math.exp(s2 - s1))
    assert p[0, 0].item() == pytest.approx(p1, abs=1e-15)
    assert out.item() == pytest.approx(10 * p1 + 20 * (1 - p1), abs=1e-12)


def test_fully_masked_query_gives_zeros_not_nan():
    q, k, v = qkv(3, 2)
    mask = torch.ones(3, 3, dtype=torch.bool)
    mask[1] = False
    q.requires_grad_(True)
    out, p = attnopt.scaled_dot_product_attention(q, k, v, mask=mask)
    assert torch.all(p[1] == 0) and torch.all(out[1] == 0)
    out.sum().backward()
    assert torch.isfinite(q.grad).all()
    # The same through a bias of -inf (no boolean mask involved).
    bias = torch.zeros(3, 3, dtype=torch.float64).masked_fill(~mask, float("-inf"))
    s = torch.zeros(3, 3, dtype=torch.float64, requires_grad=True)
    p = attnopt.attention_weights(s + bias)
    p.sum().backward()
    assert torch.all(p[1] == 0) and torch.isfinite(s.grad).all()


def test_gradcheck():
    q, k, v = (t.requires_grad_(True) for t in qkv(2, 3, 3))
    bias = torch.randn(3, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda q, k, v, b: attnopt.scaled_dot_product_attention(q, k, v, bias=b)[0], (q, k, v, bias))


@settings(max_examples=25, deadline=None)
@given(batch=st.integers(1, 3), n=st.integers(1, 6), m=st.integers(1, 6), d=st.integers(1, 5), seed=st.integers(0, 10_000))
def test_batched_equals_looped(batch, n, m, d, seed):
    q, k, v = qkv(batch, n, d, n_keys=m, seed=seed)
    out, _ = attnopt.scaled_dot_product_attention(q, k, v)
    for b in range(batch):
        out_b, _ = attnopt.scaled_dot_product_attention(q[b], k[b], v[b])
        assert torch.allclose(out[b], out_b, atol=1e-12)


@pytest.mark.parametrize(
    "kwargs,exc,words",
    [
        (dict(query=torch.ones(3, 4, dtype=torch.long)), TypeError, "query"),
        (dict(key=torch.ones(3, 5)), ValueError, "key"),
        (dict(value=torch.ones(2, 4)), ValueError, "value"),
        (dict(scale=-1.0), ValueError, "scale"),
        (dict(mask=torch.ones(3, 3)), TypeError, "mask"),
        (dict(query=torch.ones(4)), ValueError, "query"),
    ],
)
def test_bad_input_names_the_argument(kwargs, exc, words):
    args = dict(query=torch.ones(3, 4), key=torch.ones(3, 4), value=torch.ones(3, 2))
    args.update(kwargs)
    q, k, v = args.pop("query"), args.pop("key"), args.pop("value")
    with pytest.raises(exc, match=words):
        attnopt.scaled_dot_product_attention(q, k, v, **args)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    q, k, v = qkv(2, 4, 16, 8, dtype=torch.float32)
    out_cpu, _ = attnopt.scaled_dot_product_attention(q, k, v)
    out_gpu, _ = attnopt.scaled_dot_product_attention(q.cuda(), k.cuda(), v.cuda())
    assert out_gpu.device.type == "cuda"
    assert torch.allclose(out_gpu.cpu(), out_cpu, atol=1e-5)


# --- validation helpers ------------------------------------------------------------------------

def test_validation_helpers():
    assert as_float_tensor([1, 2], "x").dtype == torch.get_default_dtype()
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        as_float_tensor("abc", "x")
    with pytest.raises(ValueError, match="alpha must be a finite number > 0"):
        check_positive(0.0, "alpha")
    with pytest.raises(ValueError, match="alpha"):
        check_positive(float("nan"), "alpha")
    assert check_positive(0, "eps", allow_zero=True) == 0.0
    assert check_dim(-1, 3) == 2
    with pytest.raises(ValueError, match="dim=3 is out of range"):
        check_dim(3, 3)
    with pytest.raises(ValueError, match="u must be non-negative"):
        check_probability_vector(torch.tensor([1.5, -0.5]), "u")
    with pytest.raises(ValueError, match="u must sum to 1"):
        check_probability_vector(torch.tensor([0.5, 0.6]), "u")
    check_probability_vector(torch.tensor([0.25, 0.75]), "u")


# --- notebook helpers --------------------------------------------------------------------------

def test_record_writes_and_merges_json(tmp_path, monkeypatch):
    monkeypatch.setenv(book.RESULTS_ENV, str(tmp_path))
    book.record("demo", err=torch.tensor(1e-7), values=torch.arange(3))
    path = book.record("demo", n=5)
    assert json.loads(path.read_text()) == {"err": pytest.approx(1e-7), "values": [0, 1, 2], "n": 5}
    with pytest.raises(ValueError, match="name"):
        book.record("a/b", x=1)


def test_pick_device_and_scale():
    assert book.pick_device("cpu").type == "cpu"
    assert book.pick_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="scale"):
        book.check_scale("huge")
    with pytest.raises(TypeError, match="seed"):
        book.seed_everything(1.5)
    g1, g2 = book.seed_everything(3), book.seed_everything(3)
    assert torch.equal(torch.rand(4, generator=g1), torch.rand(4, generator=g2))


def test_plotting_heatmap_rejects_bad_shape():
    import matplotlib

    matplotlib.use("Agg")
    from attnopt import plotting

    plotting.use_book_style()
    assert matplotlib.rcParams["savefig.facecolor"] == "white"  # legible in the dark theme
    ax = plotting.attention_heatmap(torch.softmax(torch.randn(3, 4), -1), row_labels=list("abc"), annotate=True)
    assert len(ax.images) == 1
    with pytest.raises(ValueError, match="weights must be a non-empty 2-D"):
        plotting.attention_heatmap(torch.ones(2, 2, 2))
