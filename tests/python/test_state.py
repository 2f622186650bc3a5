"""Carried state and decoding in Python (lunajit.linear_attention with
initial_state / output_final_state, lunajit.linear_attention_step): chained
calls equal one call, forward and every gradient (aten fp64 to 1e-10; host
kernels fp32 to 1e-4 relative of the fp64 result); torch.autograd.gradcheck
of the initial state; decoding token by token equals the causal forward."""
import pytest
import torch

import lunajit

SPEC = {"family": "luna", "luna": {"projections": 3, "channels": 2, "mlp_width": 5}}


def inputs(dtype, B=2, N=13, H=2, d=6, dv=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    spec = lunajit.make_spec(SPEC, head_dim=d, value_dim=dv, causal=True, dtype="fp32")
    D = 3 * 2  # luna: D = projections * channels
    q, k, v = (torch.randn(B, N, H, x, generator=g, dtype=torch.float64) for x in (d, d, dv))
    params = lunajit.init_feature_params(spec, H).double() + 0.05 * torch.randn(
        lunajit.init_feature_params(spec, H).shape, generator=g, dtype=torch.float64)
    S0 = 0.3 * torch.randn(B, H, D, dv, generator=g, dtype=torch.float64)
    z0 = 1.0 + torch.rand(B, H, D, generator=g, dtype=torch.float64)
    ts = [t.to(dtype) for t in (q, k, v, S0, z0)]
    return spec, ts[0], ts[1], ts[2], params.to(dtype if dtype == torch.float64 else torch.float32), ts[3], ts[4]


def run(spec, q, k, v, params, S0, z0, cuts, path):
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v, params, S0, z0)]
    state = (leaves[4] * 1.0, leaves[5] * 1.0)
    outs = []
    for a, b in zip(cuts[:-1], cuts[1:]):
        o, state = lunajit.linear_attention(leaves[0][:, a:b], leaves[1][:, a:b], leaves[2][:, a:b], spec=spec,
                                            params=leaves[3], path=path, chunk=4, initial_state=state,
                                            output_final_state=True)
        outs.append(o)
    out = torch.cat(outs, 1)
    g = torch.Generator().manual_seed(1)
    w = [torch.randn(t.shape, generator=g, dtype=torch.float64) for t in (out, state[0], state[1])]
    loss = sum((x.double() * wx).sum() for x, wx in zip((out, state[0], state[1]), w))
    loss.backward()
    return [out.detach(), state[0].detach(), state[1].detach()] + [t.grad for t in leaves]


def close(got, want, rtol, atol):
    for i, (a, b) in enumerate(zip(got, want)):
        scale = b.abs().max().item()
        assert scale > 1e-8, "tensor %d is zero: the check could not fail" % i
        err = (a.double() - b.double()).abs().max().item()
        assert err <= atol + rtol * scale, "tensor %d: max error %g (scale %g)" % (i, err, scale)


def test_chained_calls_equal_one_call_aten_fp64():
    spec, *t = inputs(torch.float64)
    close(run(spec, *t, [0, 5, 6, 13], "aten"), run(spec, *t, [0, 13], "aten"), 1e-10, 1e-12)


def test_chained_host_kernel_calls_equal_aten_one_call():
    spec, *t64 = inputs(torch.float64)
    want = run(spec, *t64, [0, 13], "aten")
    t32 = [x.float() for x in t64]
    close(run(spec, *t32, [0, 7, 13], "host_kernels"), want, 1e-4, 2e-5)


def test_initial_state_gradcheck():
    spec, q, k, v, params, S0, z0 = inputs(torch.float64, B=1, N=4, H=1)

    def f(S, z):
        o, (S1, z1) = lunajit.linear_attention(q, k, v, spec=spec, params=params, path="aten", initial_state=(S, z),
                                               output_final_state=True)
        return o, S1, z1

    assert torch.autograd.gradcheck(f, (S0.requires_grad_(), z0.requires_grad_()), eps=1e-6, atol=1e-7)


@pytest.mark.parametrize("path", ["aten", "host_kernels"])
def test_decoding_token_by_token_equals_causal_forward(path):
    spec, q, k, v, params, _, _ = inputs(torch.float32, N=9)
    want = lunajit.linear_attention(q.double(), k.double(), v.double(), spec=spec, params=params.double(), path="aten")
    state, outs = None, []
    with torch.no_grad():
        for t in range(q.shape[1]):
            o, state = lunajit.linear_attention_step(q[:, t], k[:, t], v[:, t], state, spec=spec, params=params,
                                                     path=path)
            outs.append(o)
    got = torch.stack(outs, 1)
    close([got], [want], 1e-5, 1e-6)


def test_state_errors_name_the_field():
    perf = lunajit.make_spec({"family": "performer", "performer": {"features": 6}}, head_dim=4, value_dim=3,
                             causal=True)
    q = torch.randn(1, 3, 1, 4)
    v = torch.randn(1, 3, 1, 3)
    with pytest.raises(RuntimeError, match="output_final_state.*performer"):
        lunajit.linear_attention(q, q, v, spec=perf, output_final_state=True)
    with pytest.raises(ValueError, match="initial_state must be None or a pair"):
        lunajit.linear_attention(q, q, v, spec=perf, initial_state=torch.zeros(1))
    with pytest.raises(ValueError, match="linear_attention_step: q must be"):
        lunajit.linear_attention_step(q, q, v, spec=perf)


@pytest.mark.parametrize("dwc", [False, True])
def test_module_incremental_generation_equals_full_forward(dwc):
    torch.manual_seed(0)
    m = lunajit.nn.MultiheadLinearAttention(8, 2, family="elu", causal=True, batch_first=True, dwc=dwc, dwc_kernel=3)
    x = torch.randn(2, 9, 8)
    with torch.no_grad():
        want, _ = m(x, x, x)
        out, state = m.forward_incremental(x[:, :4])
        outs = [out]
        for t in range(4, 9):
            o, state = m.forward_incremental(x[:, t:t + 1], state)
            outs.append(o)
    assert state["tokens"] == 9
    close([torch.cat(outs, 1)], [want], 1e-5, 1e-6)
