"""torch.ops.lunajit.linear_attention through lunajit.linear_attention: every
family, causal and not, fp32 and fp64, against plain.py (docs/MATH.md written
out in plain PyTorch); gradients with torch.autograd.gradcheck in fp64; the
host kernel path forward and backward; layouts; ABI of the loaded library."""
import json
import re

import pytest
import torch

import lunajit
import plain

D = 8    # head_dim
DV = 6   # value_dim (!= head_dim on purpose)

# Small members of every family and the luna variants (MATH.md section 2).
SPECS = {
    "luna": {"family": "luna", "luna": {"projections": 3, "channels": 2, "mlp_width": 5}},
    "luna_per_channel_gelu": {"family": "luna", "luna": {"projections": 2, "channels": 3, "mlp_width": 4,
                                                         "shared_channels": False, "activation": "gelu",
                                                         "output_activation": "softplus"}},
    "luna_envelope": {"family": "luna", "luna": {"projections": 2, "channels": 2, "mlp_width": 3, "envelope": True}},
    "luna_bank_coef": {"family": "luna", "luna": {"projections": 3, "channels": 8, "variant": "bank_coef"}},
    "luna_rff": {"family": "luna", "luna": {"projections": 4, "channels": 2, "variant": "rff"}, "normalize": False},
    "performer": {"family": "performer", "performer": {"features": 6}},
    "rff": {"family": "rff", "rff": {"features": 5}},
    "elu": {"family": "elu"},
    "relu": {"family": "relu"},
    "t2r": {"family": "t2r", "t2r": {"features": 6}},
    "hedgehog": {"family": "hedgehog", "hedgehog": {"features": 5}},
    "cosformer": {"family": "cosformer"},
    "slay": {"family": "slay", "slay": {"anchors": 2, "nodes": 2, "prf_features": 3}},
}


def spec_of(name, causal, dtype="fp32", d=D, dv=DV):
    s = dict(SPECS[name])
    return lunajit.make_spec(s, head_dim=d, value_dim=dv, causal=causal, dtype=dtype)


def inputs(b, n, h, d, dv, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, n, h, d, generator=g, dtype=torch.float64)
    k = torch.randn(b, n, h, d, generator=g, dtype=torch.float64)
    v = torch.randn(b, n, h, dv, generator=g, dtype=torch.float64)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def params_of(spec, heads, seed=3):
    p = lunajit.init_feature_params(spec, heads, seed)
    return p if p.numel() else None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("name", sorted(SPECS))
def test_matches_plain_pytorch(name, causal, dtype):
    spec = spec_of(name, causal)
    q, k, v = inputs(2, 13, 2, D, DV, dtype)
    p = params_of(spec, 2)
    # chunk 4 < seq 13: the causal ATen path runs several chunks and a partial one.
    o = lunajit.linear_attention(q, k, v, spec=spec, params=p, chunk=4)
    assert o.dtype == dtype and o.shape == (2, 13, 2, DV)
    ref = plain.linear_attention(q.double(), k.double(), v.double(), None if p is None else p.double(), spec)
    err = (o.double() - ref).abs().max().item()
    scale = max(1.0, ref.abs().max().item())
    # fp64: both sides compute in double, differing only in summation order.
    # fp32: the op computes phi, S and z in fp32 (MATH.md); with <= 48 features
    # and 13 tokens the rounding stays well under 1e-5 relative (u = 6e-8).
    tol = 1e-10 if dtype == torch.float64 else 2e-5
    assert err <= tol * scale, "%s causal=%s %s: max abs error %.3e (scale %.3g)" % (name, causal, dtype, err, scale)


GRAD_FAMILIES = ["luna", "luna_per_channel_gelu", "luna_envelope", "luna_bank_coef", "elu", "t2r", "hedgehog",
                 "cosformer", "slay"]


# performer is left out: its stop-gradient stabilizers (a max over features and
# keys) are not differentiated on purpose, so finite differences see them and
# autograd does not. rff and relu: see test_gradients_match_plain below.
@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("name", GRAD_FAMILIES)
def test_gradcheck_fp64(name, causal):
    spec = spec_of(name, causal, d=4, dv=3)
    q, k, v = inputs(1, 5, 2, 4, 3, torch.float64, seed=1)
    p = params_of(spec, 2)
    learned = any(t["learned"] for t in lunajit.param_layout(spec)["tensors"])
    args = [q.requires_grad_(), k.requires_grad_(), v.requires_grad_()]
    if p is not None:
        args.append(p.double().requires_grad_(learned))

    def f(*a):
        return lunajit.linear_attention(a[0], a[1], a[2], spec=spec, params=a[3] if len(a) > 3 else None, chunk=2)

    assert torch.autograd.gradcheck(f, tuple(args), eps=1e-6, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("name", ["performer", "rff", "relu"])
def test_gradients_match_plain(name):
    # Autograd of the op against autograd of plain.py (same stop-gradients).
    spec = spec_of(name, True)
    q, k, v = inputs(1, 9, 2, D, DV, torch.float64, seed=2)
    p = params_of(spec, 2)
    ins = [t.clone().requires_grad_() for t in (q, k, v)]
    ref_ins = [t.clone().requires_grad_() for t in (q, k, v)]
    o = lunajit.linear_attention(*ins, spec=spec, params=p, chunk=4)
    r = plain.linear_attention(*ref_ins, None if p is None else p.double(), spec)
    w = torch.randn_like(r)
    g = torch.autograd.grad((o * w).sum(), ins)
    gr = torch.autograd.grad((r * w).sum(), ref_ins)
    for a, b in zip(g, gr):
        assert (a - b).abs().max().item() <= 1e-9 * max(1.0, b.abs().max().item())


def test_head_first_layout_is_a_transpose():
    spec = spec_of("luna", True)
    q, k, v = inputs(2, 7, 3, D, DV, torch.float32)
    p = params_of(spec, 3)
    o = lunajit.linear_attention(q, k, v, spec=spec, params=p)
    o_hf = lunajit.linear_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), spec=spec, params=p,
                                    head_first=True)
    assert o_hf.shape == (2, 3, 7, DV)
    assert torch.equal(o_hf.transpose(1, 2), o)


def test_spec_from_family_and_fields():
    q, k, v = inputs(1, 6, 2, D, D, torch.float32)
    o = lunajit.linear_attention(q, k, v, family="t2r", causal=True, t2r={"features": 4})
    spec = lunajit.make_spec(family="t2r", head_dim=D, value_dim=D, causal=True, dtype="fp32", t2r={"features": 4})
    ref = plain.linear_attention(q.double(), k.double(), v.double(), lunajit.init_feature_params(spec, 2).double(),
                                 spec)
    assert (o.double() - ref).abs().max().item() < 2e-5 * max(1.0, ref.abs().max().item())


def test_parameter_gradient_reaches_params():
    spec = spec_of("luna", False)
    q, k, v = inputs(1, 6, 2, D, DV, torch.float32)
    p = lunajit.init_feature_params(spec, 2).requires_grad_()
    lunajit.linear_attention(q, k, v, spec=spec, params=p).square().sum().backward()
    assert p.grad is not None and p.grad.abs().sum().item() > 0


def test_inference_mode_runs_below_autograd():
    spec = spec_of("elu", True)
    q, k, v = inputs(1, 5, 2, D, DV, torch.float32)
    want = lunajit.linear_attention(q, k, v, spec=spec)
    with torch.inference_mode():
        got = lunajit.linear_attention(q, k, v, spec=spec)
    assert torch.equal(got, want)


def test_host_kernel_path_forward_and_backward():
    # The generated kernels on the host emulator, fp32, gradients from the backward kernels.
    spec = spec_of("luna", True, d=16, dv=16)
    q, k, v = inputs(1, 40, 2, 16, 16, torch.float32, seed=5)
    p = lunajit.init_feature_params(spec, 2, 1)
    ins = [t.clone().requires_grad_() for t in (q, k, v)] + [p.clone().requires_grad_()]
    o = lunajit.linear_attention(*ins[:3], spec=spec, params=ins[3], path="host_kernels")
    ref_ins = [t.double().requires_grad_() for t in (q, k, v)] + [p.double().requires_grad_()]
    r = plain.linear_attention(*ref_ins, spec)
    w = torch.randn(r.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    g = torch.autograd.grad((o.double() * w).sum(), ins)
    gr = torch.autograd.grad((r * w).sum(), ref_ins)
    rel = lambda a, b: ((a.double() - b).norm() / b.norm()).item()  # noqa: E731
    # fp32 kernels vs a double reference: 1e-4 relative rms, the kernels' own
    # validation tolerance for fp32 (autotune/validation.h).
    assert rel(o, r) < 1e-4
    for name, a, b in zip(("dq", "dk", "dv", "dparams"), g, gr):
        assert rel(a, b) < 1e-4, name


# key_mask, grouped-query attention and cross-attention (docs/MATH.md, "Padding,
# GQA, cross-attention"). fp64 so that the equalities hold to ~1e-12.
MASKABLE = sorted(SPECS)  # cosformer and causal performer by packing (cu_seqlens)


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("name", MASKABLE)
def test_key_mask_padded_batch_equals_per_sequence_calls(name, causal):
    spec = spec_of(name, causal)
    q, k, v = inputs(3, 6, 2, D, DV, torch.float64, seed=7)
    p = params_of(spec, 2)
    keep = torch.zeros(3, 6, dtype=torch.bool)  # True = real key (fla's attention_mask)
    keep[0], keep[1, :3], keep[2, 4:] = True, True, True  # full, right-padded, left-padded
    run = lambda q, k, v, m=None: lunajit.linear_attention(q, k, v, spec=spec, params=p, chunk=4, key_mask=m)  # noqa
    o = run(q, k, v, keep)
    for b, (s, n) in enumerate([(0, 6), (0, 3), (4, 2)]):
        want = run(q[b:b + 1, s:s + n], k[b:b + 1, s:s + n], v[b:b + 1, s:s + n])
        assert (o[b:b + 1, s:s + n] - want).abs().max().item() <= 1e-12 * max(1.0, want.abs().max().item())
    # Masked keys never influence any output: other pad keys and values, bitwise the same o.
    pad = (~keep)[:, :, None, None]
    k2 = torch.where(pad, 10 * torch.randn_like(k), k)
    v2 = torch.where(pad, 10 * torch.randn_like(v), v)
    assert torch.equal(run(q, k2, v2, keep), o)


def test_key_mask_rejections():
    q, k, v = inputs(2, 5, 2, D, DV, torch.float32)
    keep = torch.ones(2, 5, dtype=torch.bool)
    with pytest.raises(RuntimeError, match="give key_mask or cu_seqlens, not both"):
        lunajit.linear_attention(q[:1], k[:1], v[:1], family="elu", key_mask=keep[:1],
                                 cu_seqlens=torch.tensor([0, 5], dtype=torch.int32))
    with pytest.raises(RuntimeError, match="key_mask must be bool"):
        lunajit.linear_attention(q, k, v, family="elu", key_mask=keep.float())


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("name", ["luna", "performer", "hedgehog", "cosformer"])
def test_grouped_query_equals_repeated_kv_heads(name, causal):
    spec = spec_of(name, causal)
    q, _, _ = inputs(2, 7, 4, D, DV, torch.float64, seed=8)
    _, k, v = inputs(2, 7, 2, D, DV, torch.float64, seed=9)
    p = params_of(spec, 4)
    ins = [t.clone().requires_grad_() for t in (q, k, v)]
    ref_ins = [t.clone().requires_grad_() for t in (q, k, v)]
    # The reference repeats the kv heads explicitly (SDPA's enable_gqa order); the C++
    # test (op_test.cpp) also holds GQA against the independent plain composition.
    o = lunajit.linear_attention(*ins, spec=spec, params=p, chunk=3)
    r = lunajit.linear_attention(ref_ins[0], ref_ins[1].repeat_interleave(2, 2), ref_ins[2].repeat_interleave(2, 2),
                                 spec=spec, params=p, chunk=3)
    assert o.shape == (2, 7, 4, DV) and torch.equal(o, r)
    w = torch.randn_like(r)
    for a, b in zip(torch.autograd.grad((o * w).sum(), ins), torch.autograd.grad((r * w).sum(), ref_ins)):
        assert a.shape == b.shape and (a - b).abs().max().item() <= 1e-9 * max(1.0, b.abs().max().item())
    with pytest.raises(RuntimeError, match="k and v have 3 heads, which does not divide q's 4 heads"):
        lunajit.linear_attention(q, k[:, :, :1].expand(-1, -1, 3, -1), v[:, :, :1].expand(-1, -1, 3, -1),
                                 spec=spec, params=p)


@pytest.mark.parametrize("name", ["luna", "performer", "rff", "hedgehog", "slay"])
def test_cross_attention_matches_plain(name):
    spec = spec_of(name, False)
    q, _, _ = inputs(2, 4, 2, D, DV, torch.float64, seed=10)
    _, k, v = inputs(2, 9, 2, D, DV, torch.float64, seed=11)
    p = params_of(spec, 2)
    o = lunajit.linear_attention(q, k, v, spec=spec, params=p)
    r = plain.linear_attention(q, k, v, None if p is None else p.double(), spec)
    assert o.shape == (2, 4, 2, DV)
    assert (o - r).abs().max().item() <= 1e-9 * max(1.0, r.abs().max().item())
    with pytest.raises(RuntimeError, match="causal attention needs seq_q == seq_k"):
        lunajit.linear_attention(q, k, v, spec=spec_of(name, True), params=p)


def test_library_matches_the_running_torch():
    # The ABI check: the C++ TORCH_VERSION the library was compiled with is the
    # version of the torch it was loaded into (Debian's python3-torch and
    # libtorch-dev come from one source package).
    info = json.loads(torch.ops.lunajit.build_info())
    base = lambda s: re.match(r"\d+\.\d+\.\d+", s).group(0)  # noqa: E731
    assert base(info["torch_version"]) == base(torch.__version__)
    assert lunajit.LIBRARY_PATH.endswith("liblunajit_torch.so")
    assert info["lunajit_version"] == lunajit.__version__


@pytest.mark.parametrize("path", ["aten", "host_kernels"])
@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("name", ["luna", "cosformer", "performer"])
def test_cu_seqlens_packed_equals_per_sequence_calls(name, causal, path):
    # fla's convention: q, k, v [1, total_tokens, heads, dim], int32 offsets; lengths 3, 0, 1, 5.
    spec = spec_of(name, causal)
    lengths = [3, 0, 1, 5]
    cu = torch.tensor([0, 3, 3, 4, 9], dtype=torch.int32)
    q, k, v = inputs(1, 9, 2, D, DV, torch.float32, seed=11)
    p = params_of(spec, 2)
    if p is not None:
        p = p.clone().requires_grad_(name == "luna")
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    dout = torch.randn(1, 9, 2, DV, generator=torch.Generator().manual_seed(12))
    o = lunajit.linear_attention(*leaves, spec=spec, params=p, path=path, cu_seqlens=cu)
    grads = torch.autograd.grad((o * dout).sum(), leaves + ([p] if name == "luna" else []))
    want_dp = 0
    for s, n in zip(cu[:-1].tolist(), lengths):
        if n == 0:
            continue
        one = [t[:, s:s + n].detach().clone().requires_grad_() for t in (q, k, v)]
        ow = lunajit.linear_attention(*one, spec=spec, params=p, path=path)
        gw = torch.autograd.grad((ow * dout[:, s:s + n]).sum(), one + ([p] if name == "luna" else []))
        assert torch.allclose(o[:, s:s + n], ow, atol=2e-5, rtol=2e-4)
        for g, w in zip(grads[:3], gw[:3]):
            assert torch.allclose(g[:, s:s + n], w, atol=2e-5, rtol=2e-4)
        if name == "luna":
            want_dp = want_dp + gw[3]
    if name == "luna":
        assert torch.allclose(grads[3], want_dp, atol=2e-5, rtol=2e-4)


def test_cu_seqlens_rejections():
    q, k, v = inputs(1, 5, 2, D, DV, torch.float32)
    run = lambda cu, **kw: lunajit.linear_attention(q, k, v, family="elu", cu_seqlens=cu, **kw)  # noqa
    with pytest.raises(RuntimeError, match="cu_seqlens must be int32"):
        run(torch.tensor([0, 5]))
    with pytest.raises(RuntimeError, match=re.escape("cu_seqlens[1] = 4, must equal the total tokens q.size(1) = 5")):
        run(torch.tensor([0, 4], dtype=torch.int32))
    with pytest.raises(ValueError, match="cu_seqlens needs head_first=False"):
        run(torch.tensor([0, 5], dtype=torch.int32), head_first=True)
