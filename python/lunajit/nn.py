"""Modules over torch.ops.lunajit, mirroring torch_binding/modules.h (the same
parameter names, so checkpoints move between C++ and Python):

    FeatureMap                phi of a spec; `params` is the flat parameter buffer of
                              codegen/feature_params.h: a Parameter for learned
                              families (luna, t2r, hedgehog), a buffer for fixed
                              ones (performer, rff, slay), None for elu, relu, cosformer
    LinearAttention           the core on [batch, seq, heads, dim] (FeatureMap + op)
    MultiheadLinearAttention  a drop-in for torch.nn.MultiheadAttention (batch_first,
                              key_padding_mask, need_weights (default False),
                              average_attn_weights, num_kv_heads for grouped-query
                              attention, key/value of another length when not
                              causal; attn_mask rejected: causality is the spec's
                              causal flag)
    save_safetensors / load_safetensors   checkpoints that store the spec of every
                              FeatureMap and check it on load
"""
import json
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

import lunajit
from . import safetensors as _st


class FeatureMap(torch.nn.Module):
    __jit_unused_properties__ = ["spec"]  # Python-only (json), not compiled by torch.jit.script

    def __init__(self, spec, heads, seed=0, family="luna", **spec_fields):
        super().__init__()
        s = lunajit.make_spec(spec, family, **spec_fields)
        if heads < 1:
            raise ValueError("FeatureMap: heads must be >= 1, got %d" % heads)
        self.spec_json = lunajit.canonical_spec(s)
        self.heads = int(heads)
        layout = lunajit.param_layout(s)
        self.learned = any(t["learned"] for t in layout["tensors"])
        init = lunajit.init_feature_params(s, heads, seed)
        if init.numel() == 0:
            self.register_buffer("params", None)
        elif self.learned:
            self.params = torch.nn.Parameter(init)
        else:
            self.register_buffer("params", init)

    @property
    def spec(self):
        return json.loads(self.spec_json)

    def forward(self, x: torch.Tensor, query: bool = True) -> torch.Tensor:
        return torch.ops.lunajit.feature_map(x, self.params, self.spec_json, query)

    def extra_repr(self):
        return "family=%s, heads=%d, learned=%s" % (self.spec["family"], self.heads, self.learned)


class LinearAttention(torch.nn.Module):
    """q, k [batch, seq, heads, head_dim], v [batch, seq, heads, value_dim] -> o."""

    def __init__(self, spec, heads, seed=0, path="automatic", chunk=64, config=None, kernel_backward=True,
                 family="luna", **spec_fields):
        super().__init__()
        if path not in lunajit.PATHS:
            raise ValueError("LinearAttention: path %r is not one of %s" % (path, ", ".join(lunajit.PATHS)))
        self.feature_map = FeatureMap(spec, heads, seed, family, **spec_fields)
        self.spec_json = self.feature_map.spec_json
        self.path = path
        self.chunk = int(chunk)
        self.config = "" if config is None else (config if isinstance(config, str) else json.dumps(config))
        self.kernel_backward = bool(kernel_backward)
        spec = self.feature_map.spec
        self.causal = bool(spec["causal"])
        self.normalize = bool(spec["normalize"])
        self.eps = float(spec["eps"])

    def _params(self) -> Optional[torch.Tensor]:
        p = self.feature_map.params
        # A module moved to fp16/bf16 keeps working: the op reads fp32 (or fp64)
        # parameters, and the cast is differentiable, so gradients reach them.
        if p is not None and p.dtype != torch.float32 and p.dtype != torch.float64:
            p = p.float()
        return p

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                key_mask: Optional[torch.Tensor] = None,
                cu_seqlens: Optional[torch.Tensor] = None) -> torch.Tensor:
        """k, v may have fewer heads (GQA) and, when not causal, another length;
        key_mask: bool [batch, seq_k], True for real keys; cu_seqlens: int32 offsets
        of a packed [1, total, heads, dim] batch (lunajit.linear_attention)."""
        return torch.ops.lunajit.linear_attention(q, k, v, self._params(), self.spec_json, self.path, self.chunk,
                                                  self.config, self.kernel_backward, False, key_mask, cu_seqlens)

    def forward_with_state(self, q, k, v, state=None):
        """Causal attention from state (None or (S, z), lunajit.linear_attention's
        initial_state) -> (o, (S, z) after the last token)."""
        S, z = (None, None) if state is None else state
        o, S, z = torch.ops.lunajit.linear_attention_state(q, k, v, self._params(), self.spec_json, S, z, self.path,
                                                           self.chunk, self.config, self.kernel_backward)
        return o, (S, z)

    def step(self, q, k, v, state=None):
        """One token per sequence, q, k, v [batch, 1, heads, dim] -> (o, (S, z))
        (lunajit.linear_attention_step; the decode kernel on kernel paths)."""
        S, z = (None, None) if state is None else state
        o, S, z = torch.ops.lunajit.linear_attention_step(q, k, v, self._params(), self.spec_json, S, z, self.path,
                                                          self.config)
        return o, (S, z)

    def weights(self, q: torch.Tensor, k: torch.Tensor, key_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The weights linear attention applies, [batch, heads, seq_q, seq_k] (O(n^2))."""
        return torch.ops.lunajit.linear_attention_weights(q, k, self._params(), self.spec_json, key_mask)


class MultiheadLinearAttention(torch.nn.Module):
    """torch.nn.MultiheadAttention's interface around a LinearAttention core.

    spec (or family + spec fields) sets the feature map; head_dim = value_dim =
    embed_dim // num_heads and dtype fp32 are filled in. forward(query, key,
    value, key_padding_mask=None, need_weights=False) -> (attn_output,
    attn_weights or None); query is [seq_q, batch, embed] (or [batch, seq_q,
    embed] with batch_first), key and value alike with seq_k, which may differ
    from seq_q when not causal (not with dwc). key_padding_mask: bool [batch,
    seq_k], True for padding (torch's meaning): pad keys contribute nothing, so
    real tokens' outputs equal those of the unpadded sequences, every family
    (cosformer, causal performer and the kernel paths pack the real tokens, as
    cu_seqlens; their need_weights takes no mask). need_weights defaults to False (torch: True): the
    weights are O(seq_q * seq_k). num_kv_heads (None: num_heads) divides
    num_heads: grouped-query attention, k_proj / v_proj project to num_kv_heads
    heads."""

    def __init__(self, embed_dim, num_heads, spec=None, family="luna", causal=None, bias=True, batch_first=False,
                 dwc=False, dwc_kernel=5, seed=0, path="automatic", chunk=64, device=None, dtype=None,
                 num_kv_heads=None, **spec_fields):
        super().__init__()
        if num_heads < 1 or embed_dim % num_heads:
            raise ValueError("MultiheadLinearAttention: embed_dim (%d) must be a multiple of num_heads (%d)"
                             % (embed_dim, num_heads))
        kv_heads = num_heads if num_kv_heads is None else int(num_kv_heads)
        if kv_heads < 1 or num_heads % kv_heads:
            raise ValueError("MultiheadLinearAttention: num_kv_heads (%d) must divide num_heads (%d)"
                             % (kv_heads, num_heads))
        if dwc and kv_heads != num_heads:
            raise ValueError("MultiheadLinearAttention: dwc needs num_kv_heads == num_heads (the convolution of V is "
                             "added to every query head), got num_kv_heads = %d" % kv_heads)
        hd = embed_dim // num_heads
        over = dict(spec_fields, head_dim=hd, value_dim=hd)
        if spec is None:
            over.setdefault("dtype", "fp32")
        if causal is not None:
            over["causal"] = bool(causal)
        self.embed_dim, self.num_heads, self.head_dim = int(embed_dim), int(num_heads), hd
        self.num_kv_heads = kv_heads
        self.batch_first = bool(batch_first)
        kw = {"device": device, "dtype": dtype}
        self.q_proj = torch.nn.Linear(embed_dim, embed_dim, bias=bias, **kw)
        self.k_proj = torch.nn.Linear(embed_dim, kv_heads * hd, bias=bias, **kw)
        self.v_proj = torch.nn.Linear(embed_dim, kv_heads * hd, bias=bias, **kw)
        self.out_proj = torch.nn.Linear(embed_dim, embed_dim, bias=bias, **kw)
        self.dwc_kernel = int(dwc_kernel)
        self.dwc = (torch.nn.Conv1d(embed_dim, embed_dim, self.dwc_kernel, groups=embed_dim, bias=False, **kw)
                    if dwc else None)
        self.core = LinearAttention(spec, num_heads, seed, path, chunk, family=family, **over)
        if device is not None:
            self.core.to(device)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                key_padding_mask: Optional[torch.Tensor] = None, need_weights: bool = False,
                attn_mask: Optional[torch.Tensor] = None,
                average_attn_weights: bool = True) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        if attn_mask is not None:
            raise ValueError("MultiheadLinearAttention: attn_mask is not supported; causality is the spec's causal "
                             "flag")
        names = ["query", "key", "value"]
        tensors = [query, key, value]
        for i in range(3):
            t = tensors[i]
            if t.dim() != 3 or t.size(2) != self.embed_dim:
                raise ValueError("MultiheadLinearAttention: %s must be 3-D with embed_dim %d last, got %s"
                                 % (names[i], self.embed_dim, list(t.shape)))
        bd = 0 if self.batch_first else 1
        sd = 1 - bd
        if key.shape != value.shape or key.size(bd) != query.size(bd):
            raise ValueError("MultiheadLinearAttention: key and value must have the same shape, with query's batch, "
                             "got query %s, key %s, value %s" % (list(query.shape), list(key.shape), list(value.shape)))
        b, n, nk = query.size(bd), query.size(sd), key.size(sd)
        if nk != n and self.core.causal:
            raise ValueError("MultiheadLinearAttention: a causal core needs key and value as long as query (seq %d), "
                             "got seq_k = %d; cross-attention of different lengths is non-causal only" % (n, nk))
        if nk != n and self.dwc is not None:
            raise ValueError("MultiheadLinearAttention: dwc needs key and value as long as query (seq %d), got "
                             "seq_k = %d" % (n, nk))
        keep: Optional[torch.Tensor] = None
        if key_padding_mask is not None:
            if key_padding_mask.dtype != torch.bool:
                raise ValueError("MultiheadLinearAttention: key_padding_mask must be bool (True = padding), got %s; "
                                 "additive float masks are not supported" % key_padding_mask.dtype)
            if list(key_padding_mask.shape) != [b, nk]:
                raise ValueError("MultiheadLinearAttention: key_padding_mask must be [batch, seq_k] = [%d, %d], "
                                 "got %s" % (b, nk, list(key_padding_mask.shape)))
            keep = key_padding_mask.logical_not()
        qp, kp, vp = self.q_proj(query), self.k_proj(key), self.v_proj(value)
        if not self.batch_first:
            qp, kp, vp = qp.transpose(0, 1), kp.transpose(0, 1), vp.transpose(0, 1)
        qh = qp.reshape([b, n, self.num_heads, self.head_dim])
        kh = kp.reshape([b, nk, self.num_kv_heads, self.head_dim])
        vh = vp.reshape([b, nk, self.num_kv_heads, self.head_dim])
        attn = self.core(qh, kh, vh, keep).reshape(b, n, self.embed_dim)
        dwc = self.dwc
        if dwc is not None:
            # Pad positions hold zero, as the zero padding past an unpadded sequence.
            if keep is not None:
                vp = vp.masked_fill(keep.logical_not().unsqueeze(-1), 0.0)
            vc = vp.transpose(1, 2)
            kw = self.dwc_kernel
            padded = F.pad(vc, [kw - 1, 0]) if self.core.causal else F.pad(vc, [(kw - 1) // 2, kw // 2])
            attn = attn + dwc(padded).transpose(1, 2)
        out = self.out_proj(attn)
        if not self.batch_first:
            out = out.transpose(0, 1)
        weights: Optional[torch.Tensor] = None
        if need_weights:
            w = self.core.weights(qh, kh, keep)
            weights = w.mean(1) if average_attn_weights else w
        return out, weights

    def forward_incremental(self, x, state=None):
        """Self-attention over the next tokens x ([seq, batch, embed], or [batch,
        seq, embed] with batch_first) of sequences summarised by `state` (None: an
        empty prefix), for autoregressive generation: a prompt (seq > 1) or one
        token at a time (seq == 1, the decode kernel on kernel paths). Returns
        (out, state), state a dict {"S", "z" (the attention state, docs/MATH.md
        §1a), "dwc_window" (the last dwc_kernel - 1 projected values, with dwc),
        "tokens"}, whose size does not grow with the sequence. Any split of a
        sequence equals forward(x, x, x) on the whole (causal specs only)."""
        if not self.core.causal:
            raise ValueError("MultiheadLinearAttention.forward_incremental: the spec is not causal; incremental "
                             "generation needs causal = true")
        if x.dim() != 3 or x.size(2) != self.embed_dim:
            raise ValueError("MultiheadLinearAttention.forward_incremental: x must be 3-D with embed_dim %d last, got %s"
                             % (self.embed_dim, list(x.shape)))
        xb = x if self.batch_first else x.transpose(0, 1)
        b, n = xb.size(0), xb.size(1)
        state = state or {}
        qh = self.q_proj(xb).reshape(b, n, self.num_heads, self.head_dim)
        kh = self.k_proj(xb).reshape(b, n, self.num_kv_heads, self.head_dim)
        vp = self.v_proj(xb)
        vh = vp.reshape(b, n, self.num_kv_heads, self.head_dim)
        prev = (state["S"], state["z"]) if "S" in state else None
        attn, (S, z) = (self.core.step if n == 1 else self.core.forward_with_state)(qh, kh, vh, prev)
        attn = attn.reshape(b, n, self.embed_dim)
        nxt = {"S": S, "z": z, "tokens": state.get("tokens", 0) + n}
        if self.dwc is not None:
            kw = self.dwc_kernel
            window = state.get("dwc_window")
            if window is None:
                window = vp.new_zeros(b, self.embed_dim, kw - 1)
            full = torch.cat([window.to(vp.dtype), vp.transpose(1, 2)], 2)
            attn = attn + self.dwc(full).transpose(1, 2)
            nxt["dwc_window"] = full[:, :, full.size(2) - (kw - 1):]
        out = self.out_proj(attn)
        return (out if self.batch_first else out.transpose(0, 1)), nxt


def _feature_map_specs(module):
    return {"lunajit.spec:" + name: m.spec_json for name, m in module.named_modules() if isinstance(m, FeatureMap)}


def _module_tensors(module):
    out = dict(module.named_parameters())
    out.update((k, v) for k, v in module.named_buffers() if v is not None)
    return out


def save_safetensors(module, path, metadata=None):
    """Every parameter and buffer of `module` under its dotted name, plus
    "lunajit.spec:<path>" metadata for each FeatureMap (as the C++ save_safetensors)."""
    meta = dict(metadata or {})
    meta.update(_feature_map_specs(module))
    _st.save_file(_module_tensors(module), path, meta)


def load_safetensors(module, path):
    """Loads a checkpoint of save_safetensors (C++ or Python) into `module`,
    checking the spec of every FeatureMap, the tensor names and shapes (ValueError
    naming the first difference); values convert to each tensor's dtype."""
    tensors, meta = _st.load_file(path, with_metadata=True)
    for key, spec in _feature_map_specs(module).items():
        where = key[len("lunajit.spec:"):]
        if key not in meta:
            raise ValueError("load_safetensors: %s has no spec for the feature map at '%s' (metadata %s)"
                             % (path, where, key))
        if meta[key] != spec:
            raise ValueError("load_safetensors: %s was saved with spec %s for the feature map at '%s', but the "
                             "module has spec %s" % (path, meta[key], where, spec))
    own = _module_tensors(module)
    for name in tensors:
        if name not in own:
            raise ValueError("load_safetensors: %s holds tensor '%s', which the module does not have" % (path, name))
    with torch.no_grad():
        for name, dst in own.items():
            if name not in tensors:
                raise ValueError("load_safetensors: %s has no tensor '%s'" % (path, name))
            src = tensors[name]
            if tuple(src.shape) != tuple(dst.shape):
                raise ValueError("load_safetensors: tensor '%s' has shape %s in %s but %s in the module"
                                 % (name, list(src.shape), path, list(dst.shape)))
            dst.copy_(src)
