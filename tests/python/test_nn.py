"""lunajit.nn: the modules' parameters, the MultiheadAttention drop-in, a few
training steps, TorchScript (script and trace), safetensors checkpoints with the
spec checked, the package's safetensors reader, tune and report."""
import os

import pytest
import torch

import lunajit
import lunajit.nn as lnn
from lunajit import safetensors as st

LUNA = {"family": "luna", "luna": {"projections": 2, "channels": 2, "mlp_width": 4}}


def test_feature_map_holds_params_buffers_or_nothing():
    fm = lnn.FeatureMap(dict(LUNA, head_dim=8, value_dim=8, dtype="fp32"), heads=3, seed=4)
    assert fm.learned and isinstance(fm.params, torch.nn.Parameter)
    assert torch.equal(fm.params.detach(), lunajit.init_feature_params(fm.spec, 3, 4))
    perf = lnn.FeatureMap(None, 2, family="performer", head_dim=8, value_dim=8)
    assert not perf.learned and list(perf.parameters()) == [] and len(list(perf.buffers())) == 1
    elu = lnn.FeatureMap(None, 2, family="elu", head_dim=8, value_dim=8)
    assert elu.params is None
    x = torch.randn(1, 5, 3, 8)
    assert fm(x).shape == (1, 5, 3, 4)


def test_linear_attention_module_is_the_op():
    m = lnn.LinearAttention(dict(LUNA, head_dim=8, value_dim=8, dtype="fp32", causal=True), heads=2)
    q, k, v = torch.randn(3, 1, 6, 2, 8).unbind(0)
    want = lunajit.linear_attention(q, k, v, spec=m.feature_map.spec, params=m.feature_map.params)
    assert torch.equal(m(q, k, v), want)


@pytest.mark.parametrize("batch_first", [False, True])
def test_multihead_drop_in_shapes(batch_first):
    ref = torch.nn.MultiheadAttention(16, 4, batch_first=batch_first)
    m = lnn.MultiheadLinearAttention(16, 4, spec=LUNA, batch_first=batch_first)
    x = torch.randn(2, 7, 16) if batch_first else torch.randn(7, 2, 16)
    (o_ref, w_ref), (o, w) = ref(x, x, x), m(x, x, x, need_weights=True)
    assert o.shape == o_ref.shape and w.shape == w_ref.shape
    o0, w0 = m(x, x, x)  # need_weights defaults to False (torch's: True): O(n^2) weights only when asked
    assert w0 is None and torch.equal(o0, o)
    # Normalized rows sum to s / (s + eps), 1 up to eps = 1e-6 where phi > 0 (elu + 1).
    elu = lnn.MultiheadLinearAttention(16, 4, family="elu", batch_first=batch_first)
    rows = elu(x, x, x, need_weights=True, average_attn_weights=False)[1].sum(-1)
    assert rows.shape == (2, 4, 7) and torch.allclose(rows, torch.ones_like(rows), atol=1e-4)
    o2, w2 = m(x, x, x, need_weights=False)
    assert w2 is None and torch.equal(o2, o)
    assert m(x, x, x, need_weights=True, average_attn_weights=False)[1].shape == (2, 4, 7, 7)
    with pytest.raises(ValueError, match="key_padding_mask must be bool"):
        m(x, x, x, key_padding_mask=torch.zeros(2, 7))
    with pytest.raises(ValueError, match=r"key_padding_mask must be \[batch, seq_k\] = \[2, 7\]"):
        m(x, x, x, key_padding_mask=torch.zeros(2, 6, dtype=torch.bool))


# [seq 6, batch 3]: batch 0 full, 1 right-padded to 3 tokens, 2 left-padded to 2.
PAD_START, PAD_LEN = (0, 0, 4), (6, 3, 2)


def padding_mask():
    pad = torch.ones(3, 6, dtype=torch.bool)  # torch's meaning: True = padding
    for b in range(3):
        pad[b, PAD_START[b]:PAD_START[b] + PAD_LEN[b]] = False
    return pad


@pytest.mark.parametrize("dwc", [False, True], ids=["plain", "dwc"])
@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("family", ["luna", "performer", "hedgehog", "elu"])
def test_key_padding_mask_equals_per_sequence_calls(family, causal, dwc):
    torch.manual_seed(1)
    m = lnn.MultiheadLinearAttention(16, 2, family=family, causal=causal, dwc=dwc)
    x, pad = torch.randn(6, 3, 16), padding_mask()
    position_dependent = causal and family == "performer"  # served by packing; its weights take no mask
    if position_dependent:
        with pytest.raises(RuntimeError, match="key_mask is not supported for cosformer and causal performer"):
            m(x, x, x, key_padding_mask=pad, need_weights=True)
    y, w = m(x, x, x, key_padding_mask=pad, need_weights=not position_dependent)
    for b in range(3):
        s, n = PAD_START[b], PAD_LEN[b]
        xb = x[s:s + n, b:b + 1]
        want = m(xb, xb, xb)[0]
        assert torch.allclose(y[s:s + n, b:b + 1], want, atol=1e-5, rtol=1e-5), (b, (y[s:s + n, b:b + 1] - want).abs().max())
    if w is not None:
        assert (w * pad.unsqueeze(1)).abs().max().item() == 0.0  # pad keys get no weight
    # Other pad tokens: real tokens' outputs are bitwise the same.
    x2 = torch.where(pad.t().unsqueeze(-1), 10 * torch.randn_like(x), x)
    y2 = m(x2, x2, x2, key_padding_mask=pad)[0]
    real = ~pad.t()
    assert torch.equal(y[real], y2[real])
    # Zero-padding without the mask is not the same: phi of a pad token is not zero.
    if not causal:
        xz = x.clone()
        xz[3:, 1] = 0
        assert not torch.allclose(m(xz, xz, xz)[0][:3, 1], y[:3, 1], atol=1e-4)


def test_grouped_query_attention_module():
    torch.manual_seed(2)
    m = lnn.MultiheadLinearAttention(16, 4, spec=LUNA, causal=True, batch_first=True, num_kv_heads=2)
    assert m.k_proj.weight.shape == (8, 16) and m.v_proj.weight.shape == (8, 16)
    x = torch.randn(2, 5, 16)
    y = m(x, x, x)[0]
    q = m.q_proj(x).reshape(2, 5, 4, 4)
    k = m.k_proj(x).reshape(2, 5, 2, 4).repeat_interleave(2, 2)
    v = m.v_proj(x).reshape(2, 5, 2, 4).repeat_interleave(2, 2)
    want = m.out_proj(m.core(q, k, v).reshape(2, 5, 16))
    assert torch.allclose(y, want, atol=1e-6)
    assert m(x, x, x, need_weights=True)[1].shape == (2, 5, 5)
    with pytest.raises(ValueError, match=r"num_kv_heads \(3\) must divide num_heads \(4\)"):
        lnn.MultiheadLinearAttention(16, 4, spec=LUNA, num_kv_heads=3)


def test_cross_attention_module():
    torch.manual_seed(3)
    m = lnn.MultiheadLinearAttention(16, 2, family="hedgehog")
    query, mem = torch.randn(4, 2, 16), torch.randn(7, 2, 16)
    y, w = m(query, mem, mem, need_weights=True)
    assert y.shape == (4, 2, 16) and w.shape == (2, 4, 7)
    assert torch.allclose(w.sum(-1), torch.ones(2, 4), atol=1e-5)
    # The output is the weights applied to the projected values (a plain composition).
    vh = m.v_proj(mem).transpose(0, 1).reshape(2, 7, 2, 8).transpose(1, 2)          # (B, H, Nk, hd)
    wh = m(query, mem, mem, need_weights=True, average_attn_weights=False)[1]      # (B, H, Nq, Nk)
    want = m.out_proj((wh @ vh).transpose(1, 2).reshape(2, 4, 16)).transpose(0, 1)
    assert torch.allclose(y, want, atol=1e-5)
    causal = lnn.MultiheadLinearAttention(16, 2, family="hedgehog", causal=True)
    with pytest.raises(ValueError, match="a causal core needs key and value as long as query"):
        causal(query, mem, mem)


def test_modules_train():
    torch.manual_seed(0)
    m = lnn.MultiheadLinearAttention(16, 2, spec=LUNA, causal=True, batch_first=True, dwc=True)
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    x = torch.randn(4, 12, 16)
    target = torch.roll(x, 1, dims=1).cumsum(1) / 4  # a causal target
    p0 = m.core.feature_map.params.detach().clone()
    losses = []
    for _ in range(30):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(m(x, x, x, need_weights=False)[0], target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0], losses
    assert not torch.equal(m.core.feature_map.params.detach(), p0)  # the feature map learned too


def test_module_dtype_follows_to():
    m = lnn.MultiheadLinearAttention(16, 2, spec=LUNA, batch_first=True).to(torch.bfloat16)
    x = torch.randn(2, 6, 16, dtype=torch.bfloat16)
    y, _ = m(x, x, x, need_weights=False)
    assert y.dtype == torch.bfloat16
    y.float().square().sum().backward()
    g = m.core.feature_map.params.grad
    assert g is not None and g.dtype == torch.bfloat16 and g.abs().sum() > 0
    ref = lnn.MultiheadLinearAttention(16, 2, spec=LUNA, batch_first=True)
    ref.load_state_dict({k: v.float() for k, v in m.state_dict().items()})
    want = ref(x.float(), x.float(), x.float(), need_weights=False)[0]
    # bf16 projections and output (8 mantissa bits): a few 1e-2 relative.
    assert ((y.float() - want).norm() / want.norm()).item() < 5e-2


def test_torchscript_script_and_trace():
    core = lnn.LinearAttention(dict(LUNA, head_dim=8, value_dim=8, dtype="fp32", causal=True), heads=2)
    q, k, v = torch.randn(3, 2, 5, 2, 8).unbind(0)
    scripted = torch.jit.script(core)
    assert "lunajit::linear_attention" in str(scripted.graph)
    assert torch.equal(scripted(q, k, v), core(q, k, v))
    qs = q.clone().requires_grad_()
    scripted(qs, k, v).sum().backward()
    assert qs.grad is not None and qs.grad.abs().sum() > 0

    m = lnn.MultiheadLinearAttention(16, 2, spec=LUNA, batch_first=True)
    x = torch.randn(2, 5, 16)

    class SelfAttention(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, a):
            return self.inner(a, a, a, need_weights=False)[0]

    traced = torch.jit.trace(SelfAttention(m), (x,))
    assert "lunajit::linear_attention" in str(traced.inlined_graph)
    y = torch.randn(2, 9, 16)  # another length: the op, not a constant, was traced
    assert torch.allclose(traced(y), m(y, y, y, need_weights=False)[0])
    mhs = torch.jit.script(m)
    assert torch.allclose(mhs(x, x, x)[0], m(x, x, x)[0])


def test_safetensors_checkpoint_round_trip_and_spec_check(tmp_path):
    a = lnn.MultiheadLinearAttention(16, 2, spec=LUNA, seed=1)
    path = str(tmp_path / "m.safetensors")
    lnn.save_safetensors(a, path, {"note": "test"})
    tensors, meta = st.load_file(path, with_metadata=True)
    assert "core.feature_map.params" in tensors and meta["note"] == "test"
    assert meta["lunajit.spec:core.feature_map"] == a.core.spec_json
    b = lnn.MultiheadLinearAttention(16, 2, spec=LUNA, seed=2)
    lnn.load_safetensors(b, path)
    x = torch.randn(5, 2, 16)
    assert torch.equal(a(x, x, x)[0], b(x, x, x)[0])
    # Another spec with the same parameter count (causal differs) is refused.
    c = lnn.MultiheadLinearAttention(16, 2, spec=LUNA, causal=True)
    with pytest.raises(ValueError, match="was saved with spec"):
        lnn.load_safetensors(c, path)
    d = lnn.MultiheadLinearAttention(16, 2, spec=LUNA, bias=False)
    with pytest.raises(ValueError, match="which the module does not have"):
        lnn.load_safetensors(d, path)
    # A module in another dtype loads the values converted.
    e = lnn.MultiheadLinearAttention(16, 2, spec=LUNA).double()
    lnn.load_safetensors(e, path)
    assert torch.equal(e.q_proj.weight, a.q_proj.weight.double())


def test_package_safetensors_reader_validates(tmp_path):
    t = {"a": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.tensor([True, False]),
         "c": torch.randn(3).to(torch.bfloat16), "e": torch.zeros(0, 2, dtype=torch.float64)}
    data = st.serialize(t, {"k": "v"})
    back, meta = st.parse(data)
    assert meta == {"k": "v"} and all(torch.equal(back[n], t[n]) for n in t)
    with pytest.raises(ValueError, match="shorter than the 8-byte header length"):
        st.parse(data[:5])
    with pytest.raises(ValueError, match="runs past the end of the file"):
        st.parse(data[:40])
    with pytest.raises(ValueError, match="trailing bytes"):
        st.parse(data + b"\0")
    import json
    import struct
    bad = json.dumps({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                      "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}).encode()
    with pytest.raises(ValueError, match="overlap"):
        st.parse(struct.pack("<Q", len(bad)) + bad + bytes(8))
    bad = json.dumps({"a": {"dtype": "F9", "shape": [1], "data_offsets": [0, 4]}}).encode()
    with pytest.raises(ValueError, match="dtype 'F9' is not supported"):
        st.parse(struct.pack("<Q", len(bad)) + bad + bytes(4))
    # Every truncation is rejected, never a crash.
    for n in range(len(data)):
        with pytest.raises(ValueError):
            st.parse(data[:n])


def test_report_and_tune_ops(tmp_path, monkeypatch):
    # The tuning database goes to a scratch cache so that no other test (nor the
    # C++ suites sharing LUNAJIT_CACHE_DIR) sees this tuned config.
    monkeypatch.setenv("LUNAJIT_CACHE_DIR", str(tmp_path))
    spec = lunajit.make_spec(family="elu", head_dim=16, value_dim=16, dtype="fp32")
    r = lunajit.report(spec, shapes=[(1, 2, 64)], archs="sm_90", measure=False, compile=False)
    assert r["kernels"] and r["spec"]["family"] == "elu"
    given = lunajit.report(spec, shapes=[(1, 2, 64)], archs="sm_90", measure=False, compile=False,
                           config={"state_splits": 1})
    assert given["kernels"]
    assert all(k["config"]["how"] == "given (--config)" and k["config"]["tile"]["state_splits"] == 1
               for k in given["kernels"])
    with pytest.raises(ValueError, match="config.chunk = 7"):
        lunajit.report(spec, shapes=[(1, 2, 64)], archs="sm_90", measure=False, compile=False, config='{"chunk": 7}')
    with pytest.raises(TypeError, match="config"):
        lunajit.report(spec, shapes=[(1, 2, 64)], archs="sm_90", measure=False, compile=False, config=3)
    t = lunajit.tune(spec, shapes=[(1, 2, 64)], backend="host", pass_="forward", max_candidates=2, retune=True)
    (res,) = t["results"]
    assert res["pass"] == "forward" and res["correct"] >= 1 and res["chosen"]
    # The op then serves that shape from the database without tuning again.
    again = lunajit.tune(spec, shapes=[(1, 2, 64)], backend="host", pass_="forward", max_candidates=2)
    assert again["results"][0]["from_db"]
    assert again["database"].startswith(str(tmp_path))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device in this torch")
def test_cuda_kernels_on_gpu():
    spec = lunajit.make_spec(LUNA, head_dim=16, value_dim=16, dtype="fp32", causal=True)
    q, k, v = torch.randn(3, 1, 64, 2, 16, device="cuda").unbind(0)
    p = lunajit.init_feature_params(spec, 2).cuda()
    o = lunajit.linear_attention(q, k, v, spec=spec, params=p, path="cuda_kernels")
    r = lunajit.linear_attention(q, k, v, spec=spec, params=p, path="aten")
    assert ((o - r).norm() / r.norm()).item() < 1e-4
