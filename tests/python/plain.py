"""A plain PyTorch implementation of docs/MATH.md for the Python tests, written
from the document (not from torch_binding/aten_attention.cpp): one (batch, head)
at a time, features built projection by projection and channel by channel, and
attention as the explicit O(n^2) matrix A = phi_q phi_k^T, masked when causal
and row-normalized when normalize. The flat parameter layout (where each tensor
lives in the buffer) is taken from lunajit.param_layout: it is a storage
format, not part of the math under test."""
import math

import torch

import lunajit


def _sigmoid(t):
    return 1.0 / (1.0 + torch.exp(-t))


def _relu(t):
    return torch.clamp_min(t, 0.0)


def _gelu(t):
    return 0.5 * t * (1.0 + torch.erf(t / math.sqrt(2.0)))


def _softplus(t):
    return torch.log1p(torch.exp(t))


ACT = {"relu": _relu, "gelu": _gelu, "silu": lambda t: t * _sigmoid(t), "tanh": torch.tanh}
OUT_ACT = {"relu": _relu, "softplus": _softplus, "none": lambda t: t}
BASIS = [torch.sin, torch.cos, torch.tanh, _sigmoid, _relu, _gelu, _softplus, lambda u: torch.exp(-0.5 * u * u)]


def _block(params, layout, h, spec):
    """name -> tensor of head h's parameter block (fixed tensors detached)."""
    if layout["per_head_floats"] == 0:
        return {}
    n = layout["per_head_floats"]
    blk = params[(h if spec["params_per_head"] else 0) * n:][:n]
    out = {}
    for t in layout["tensors"]:
        size = 1
        for s in t["shape"]:
            size *= s
        v = blk[t["offset"]:t["offset"] + size].reshape(t["shape"])
        out[t["name"]] = v if t["learned"] else v.detach()
    return out


def phi(x, p, spec, is_query):
    """phi of one head's rows x [n, d] -> [n, D] (MATH.md section 2)."""
    n, d = x.shape
    fam = spec["family"]
    if fam == "luna":
        o = spec["luna"]
        m = o["projections"]
        u = x @ p["W"].t()
        gate = _sigmoid(x @ p["a"] + p["c"]) if o["envelope"] else torch.ones(n, dtype=x.dtype)
        cols = []
        channels = 2 if o["variant"] == "rff" else o["channels"]
        for i in range(m):
            ui = u[:, i]
            for l in range(channels):
                if o["variant"] == "neural":
                    w1 = p["W1"] if o["shared_channels"] else p["W1"][l]
                    b1 = p["b1"] if o["shared_channels"] else p["b1"][l]
                    hidden = ACT[o["activation"]](ui[:, None] * w1[None, :] + b1[None, :])
                    psi = OUT_ACT[o["output_activation"]](hidden @ p["W2"][l] + p["b2"][l])
                elif o["variant"] == "bank_coef":
                    psi = p["coef"][l] * BASIS[l % 8](ui)
                else:
                    psi = torch.cos(ui) if l == 0 else torch.sin(ui)
                cols.append(psi * gate / math.sqrt(m))
        return torch.stack(cols, 1)
    if fam == "performer":
        o = spec["performer"]
        xs = x * d ** -0.25
        e = xs @ p["omega"].t() - 0.5 * (xs * xs).sum(1, keepdim=True)
        stab = e.max(1, keepdim=True).values.detach() if is_query else e.max().detach()
        return torch.exp(e - stab) / math.sqrt(o["features"]) + o["kernel_eps"]
    if fam == "rff":
        w = x @ p["omega"].t()
        return torch.cat([torch.cos(w), torch.sin(w)], 1) / math.sqrt(spec["rff"]["features"])
    if fam == "elu":
        return torch.where(x > 0, x + 1, torch.exp(x))
    if fam == "relu":
        return _relu(x)
    if fam == "t2r":
        return _relu(x @ p["W"].t() + p["b"])
    if fam == "hedgehog":
        y = x @ p["W"].t() + p["b"]
        return torch.cat([torch.softmax(y, 1), torch.softmax(-y, 1)], 1)
    if fam == "cosformer":
        angle = torch.arange(1, n + 1, dtype=x.dtype)[:, None] * (math.pi / (2.0 * n))
        return torch.cat([_relu(x) * torch.sin(angle), _relu(x) * torch.cos(angle)], 1)
    if fam == "slay":
        o = spec["slay"]
        u = x / torch.sqrt((x * x).sum(1, keepdim=True))
        adot = u @ p["anchors"].t()
        anc = adot * adot / math.sqrt(o["anchors"])
        cols = []
        for r in range(o["nodes"]):
            s = p["nodes"][r]
            prf = torch.exp(torch.sqrt(2 * s) * (u @ p["omega"][r].t()) - s) / math.sqrt(o["prf_features"])
            for a in range(o["anchors"]):
                cols.append(torch.sqrt(p["weights"][r]) * anc[:, a:a + 1] * prf)
        return torch.cat(cols, 1)
    raise ValueError("plain: unknown family " + fam)


def _causal_performer_scores(pq, k, p, spec):
    """A [n, n] of causal performer (MATH.md section 2): query i sees key j <= i as
    m^-1/2 exp(e(k_j) - M_i) + kernel_eps, M_i = max_{j <= i} max_r e(k_j)_r
    (the running max; a stop-gradient constant)."""
    o = spec["performer"]
    n, d = k.shape
    ks = k * d ** -0.25
    e = ks @ p["omega"].t() - 0.5 * (ks * ks).sum(1, keepdim=True)  # [n, m]
    m_run = torch.cummax(e.max(1).values.detach(), 0).values  # [n]
    pk_i = torch.exp(e[None, :, :] - m_run[:, None, None]) / math.sqrt(o["features"]) + o["kernel_eps"]  # [i, j, m]
    return (pq[:, None, :] * pk_i).sum(2)


def linear_attention(q, k, v, params, spec):
    """o [batch, seq, heads, dv] for q, k [batch, seq, heads, d] (MATH.md section 1, as A V)."""
    layout = lunajit.param_layout(spec)
    b, n, h = q.shape[0], q.shape[1], q.shape[2]
    if params is not None:
        params = params.to(q.dtype)
    out = []
    for bi in range(b):
        heads = []
        for hi in range(h):
            p = _block(params, layout, hi, spec)
            pq = phi(q[bi, :, hi], p, spec, True)
            if spec["family"] == "performer" and spec["causal"]:
                a = _causal_performer_scores(pq, k[bi, :, hi], p, spec)
            else:
                pk = phi(k[bi, :, hi], p, spec, False)
                a = pq @ pk.t()
            if spec["causal"]:
                a = a * torch.ones(n, n, dtype=a.dtype).tril()
            if spec["normalize"]:
                a = a / (a.sum(1, keepdim=True) + spec["eps"])
            heads.append(a @ v[bi, :, hi].to(a.dtype))
        out.append(torch.stack(heads, 1))
    return torch.stack(out, 0)
