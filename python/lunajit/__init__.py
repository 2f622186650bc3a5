"""lunajit for PyTorch: linear attention with JIT-generated kernels (docs/MATH.md).

    import torch, lunajit
    q = k = v = torch.randn(2, 128, 4, 64, requires_grad=True)   # [batch, seq, heads, dim], as fla
    o = lunajit.linear_attention(q, k, v, family="luna", causal=True)
    o.sum().backward()

Everything runs through torch.ops.lunajit (liblunajit_torch.so, loaded on import):
the op is differentiable (torch.autograd), scriptable and traceable.
"""
import functools
import json

import torch

from . import _library

LIBRARY_PATH, BUILD_INFO = _library.load()
__version__ = BUILD_INFO["lunajit_version"]

FAMILIES = ("luna", "performer", "rff", "elu", "relu", "t2r", "hedgehog", "cosformer", "slay")
PATHS = ("automatic", "aten", "host_kernels", "cuda_kernels")
_DTYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp32"}


def _merge(base, over):
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            _merge(base[k], v)
        else:
            base[k] = v
    return base


def default_spec(family="luna"):
    """The default spec of `family` as a dict (ValueError for an unknown family)."""
    if family not in FAMILIES:
        raise ValueError("lunajit: family %r is not one of %s" % (family, ", ".join(FAMILIES)))
    return json.loads(torch.ops.lunajit.default_spec(family))


def make_spec(spec=None, family="luna", **fields):
    """A validated spec dict: `spec` (a dict, JSON text or a spec file; None: the
    default spec of `family`) with `fields` merged over it (nested dicts merge,
    e.g. luna={"projections": 4}). The C++ validator's message is raised as ValueError."""
    if spec is None:
        base = default_spec(family)
    elif isinstance(spec, dict):
        base = json.loads(json.dumps(spec))
    elif isinstance(spec, str):
        base = json.loads(torch.ops.lunajit.canonical_spec(spec))
    else:
        raise ValueError("lunajit: spec must be a dict, JSON text or a file name, got %s" % type(spec).__name__)
    _merge(base, fields)
    return json.loads(canonical_spec(base))


def canonical_spec(spec):
    """The canonical JSON text of a spec (dict or text), validated by the C++ library."""
    text = spec if isinstance(spec, str) else json.dumps(spec)
    return torch.ops.lunajit.canonical_spec(text)


def param_layout(spec):
    """The flat parameter layout of a spec: {"per_head_floats", "params_per_head", "tensors": [...]}."""
    return json.loads(torch.ops.lunajit.param_layout(canonical_spec(spec)))


def init_feature_params(spec, heads, seed=0):
    """The feature-map parameters of `spec` for `heads` heads (1-D fp32, codegen's init_params)."""
    return torch.ops.lunajit.init_feature_params(canonical_spec(spec), int(heads), int(seed))


@functools.lru_cache(maxsize=256)
def _resolve(key):
    """(canonical spec text, needs parameters) for a _spec_for key (JSON text)."""
    spec, family, causal, fields, dims = json.loads(key)
    # Fields the caller's spec leaves out come from the tensors; a given spec's
    # dims are kept, so that tensors of other sizes are an error, not a new spec.
    over = dict(fields)
    given = json.loads(canonical_spec(spec)) if isinstance(spec, str) else (spec or {})
    for name, value in dims.items():
        if name not in given:
            over.setdefault(name, value)
    if causal is not None:
        over["causal"] = bool(causal)
    s = make_spec(spec, family, **over)
    return canonical_spec(s), param_layout(s)["per_head_floats"] > 0


def _spec_for(q, v, spec, family, causal, fields):
    # Memoized by value: a training loop calls with the same arguments every step.
    dims = {"head_dim": q.shape[-1], "value_dim": v.shape[-1], "dtype": _DTYPES.get(q.dtype, "fp32")}
    return _resolve(json.dumps([spec, family, causal, fields, dims], sort_keys=True))


def linear_attention(q, k, v, *, spec=None, family="luna", causal=None, params=None, head_first=False,
                     path="automatic", chunk=64, config=None, kernel_backward=True, check_finite=False,
                     seed=0, key_mask=None, cu_seqlens=None, initial_state=None, output_final_state=False,
                     **spec_fields):
    """Linear attention o = phi(q) S / (phi(q) z + eps) of docs/MATH.md.

    q: [batch, seq_q, heads, head_dim], k: [batch, seq_k, heads_kv, head_dim], v:
    [batch, seq_k, heads_kv, value_dim] (fla's layout); head_first=True takes and
    returns [batch, heads, seq, dim]. heads_kv may divide heads (grouped-query
    attention: kv head j serves query heads j*g .. j*g+g-1, as SDPA's enable_gqa);
    seq_k may differ from seq_q when not causal (cross-attention; on the kernel
    paths in two passes of the carried-state kernels, not for performer or with
    key_mask, which take path aten).
    key_mask: bool [batch, seq_k], True for real keys, False for padding (fla's
    attention_mask meaning, the opposite of torch's key_padding_mask): masked keys
    contribute nothing, so a padded batch equals per-sequence calls on the real
    tokens (every family and path: the kernel paths, cosformer and causal
    performer pack the real tokens as with cu_seqlens; pad query rows are then 0).
    cu_seqlens: int32 [num_seqs + 1] offsets of a packed variable-length batch
    (fla's name and meaning): q, k, v are [1, total_tokens, heads, dim] with the
    sequences one after another, sequence i being tokens cu_seqlens[i] ..
    cu_seqlens[i+1]-1; each is computed alone (no token sees another sequence's;
    cosformer uses each sequence's own length, causal performer restarts its
    running stabiliser). Forward and backward on every path; not with key_mask,
    head_first or seq_k != seq_q.
    spec: a dict / JSON / file (None: the default spec of `family`); head_dim,
    value_dim and dtype the spec does not set come from the tensors; `causal` and
    `spec_fields` override the spec. params: the flat feature-map parameters
    (None: init_feature_params(spec, heads, seed), so families with learned
    parameters get no gradient for them; use lunajit.nn.FeatureMap to train).
    path: automatic | aten | host_kernels | cuda_kernels; config: a tile config
    dict for the kernel paths (None: tuned or default). Differentiable in q, k,
    v and params.
    initial_state: None or (S, z), S [batch, heads, D, dv], z [batch, heads, D]
    fp32 (fla's initial_state, with the normalizer z beside S; the same layout
    with head_first): the state of the tokens before q (causal specs; not
    performer nor cosformer). output_final_state=True returns (o, (S, z)), the
    state after the last token, for the next call; chaining calls equals one call,
    gradients included (the initial state gets one too)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError("lunajit.linear_attention: %s must be a torch.Tensor, got %s" % (name, type(t).__name__))
        if t.dim() != 4:
            raise ValueError("lunajit.linear_attention: %s must be 4-D [batch, %s, dim], got shape %s"
                             % (name, "heads, seq" if head_first else "seq, heads", list(t.shape)))
    if path not in PATHS:
        raise ValueError("lunajit.linear_attention: path %r is not one of %s" % (path, ", ".join(PATHS)))
    if head_first:
        if cu_seqlens is not None:
            raise ValueError("lunajit.linear_attention: cu_seqlens needs head_first=False (packed [1, total_tokens, "
                             "heads, dim], as fla)")
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    text, has_params = _spec_for(q, v, spec, family, causal, spec_fields)
    if params is None and has_params:
        params = torch.ops.lunajit.init_feature_params(text, q.shape[2], int(seed)).to(q.device)
    cfg = "" if config is None else (config if isinstance(config, str) else json.dumps(config))
    if initial_state is not None or output_final_state:
        S0, z0 = _state_pair(initial_state, "linear_attention", "initial_state")
        if key_mask is not None or check_finite or cu_seqlens is not None:
            raise ValueError("lunajit.linear_attention: key_mask, cu_seqlens and check_finite cannot be combined "
                             "with initial_state / output_final_state")
        o, S, z = torch.ops.lunajit.linear_attention_state(q, k, v, params, text, S0, z0, path, int(chunk), cfg,
                                                           bool(kernel_backward))
        o = o.transpose(1, 2) if head_first else o
        return (o, (S, z)) if output_final_state else o
    o = torch.ops.lunajit.linear_attention(q, k, v, params, text, path, int(chunk), cfg, bool(kernel_backward),
                                           bool(check_finite), key_mask, cu_seqlens)
    return o.transpose(1, 2) if head_first else o


def _state_pair(state, fn, name):
    if state is None:
        return None, None
    if not (isinstance(state, (tuple, list)) and len(state) == 2):
        raise ValueError("lunajit.%s: %s must be None or a pair (S, z), S [batch, heads, D, dv] and z [batch, "
                         "heads, D], got %s" % (fn, name, type(state).__name__))
    return state[0], state[1]


def linear_attention_step(q, k, v, state=None, *, spec=None, family="luna", params=None, path="automatic",
                          config=None, seed=0, **spec_fields):
    """One decoding step of causal linear attention: q, k [batch, heads, head_dim]
    (or [batch, 1, heads, head_dim]), v likewise with value_dim, the new token of
    each sequence; state: None (empty prefix) or (S, z) as linear_attention's
    initial_state. Returns (o, (S', z')) with S' = S + phi(k) v^T, z' = z + phi(k),
    o = phi(q) S' / (phi(q) z' + eps), o shaped like v; the input state is not
    modified. Paths: aten (differentiable), host_kernels / cuda_kernels (the
    generated decode kernel; inference only). The spec is made causal."""
    squeeze = q.dim() == 3
    if squeeze:
        q, k, v = q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1)
    if q.dim() != 4 or q.shape[1] != 1:
        raise ValueError("lunajit.linear_attention_step: q must be [batch, heads, head_dim] or [batch, 1, heads, "
                         "head_dim], got shape %s" % (list(q.shape),))
    if path not in PATHS:
        raise ValueError("lunajit.linear_attention_step: path %r is not one of %s" % (path, ", ".join(PATHS)))
    text, has_params = _spec_for(q, v, spec, family, True, spec_fields)
    if params is None and has_params:
        params = torch.ops.lunajit.init_feature_params(text, q.shape[2], int(seed)).to(q.device)
    S, z = _state_pair(state, "linear_attention_step", "state")
    cfg = "" if config is None else (config if isinstance(config, str) else json.dumps(config))
    o, S, z = torch.ops.lunajit.linear_attention_step(q, k, v, params, text, S, z, path, cfg)
    return (o.squeeze(1) if squeeze else o), (S, z)


def feature_map(x, params, spec, query=True):
    """phi(x) for x [batch, seq, heads, head_dim] -> [batch, seq, heads, D] (differentiable)."""
    return torch.ops.lunajit.feature_map(x, params, canonical_spec(spec), bool(query))


def _flat_shapes(shapes):
    flat = []
    for s in shapes:
        if len(s) != 3:
            raise ValueError("lunajit: each shape must be (batch, heads, seq), got %r" % (s,))
        flat.extend(int(x) for x in s)
    return flat


def tune(spec=None, shapes=((4, 8, 1024),), *, arch="", backend="auto", pass_="all", max_candidates=0,
         retune=False, family="luna"):
    """Tunes the tile configs of `spec` at `shapes` ((batch, heads, seq) each) and
    stores them in the tuning database the op reads (as `lunajit tune`): measured
    on a GPU, else checked on the host and model-ranked for `arch` (default
    sm_90). Returns the tuner's results as a dict."""
    text = canonical_spec(make_spec(spec, family))
    return json.loads(torch.ops.lunajit.tune(text, _flat_shapes(shapes), arch, backend, pass_,
                                             int(max_candidates), bool(retune)))


def report(spec=None, shapes=((2, 16, 1024),), *, archs="sm_80,sm_90", out=None, measure=True, compile=True,
           family="luna", config=None):
    """A kernel report of `spec` (as `lunajit report`): resources, occupancy,
    bytes/FLOPs, roofline and, on a GPU, measured times. Returns the report dict;
    with `out`, also writes report.json, report.md and report.html there.
    `config` (a dict or JSON text, e.g. {"state_splits": 1}): every pass at that
    tile config over its default instead of the tuned one (`--config`)."""
    text = canonical_spec(make_spec(spec, family))
    if config is None:
        config_text = ""
    elif isinstance(config, str):
        config_text = config
    elif isinstance(config, dict):
        config_text = json.dumps(config)
    else:
        raise TypeError(f"config: expected a dict or JSON text, got {type(config).__name__}")
    return json.loads(torch.ops.lunajit.report(text, archs, _flat_shapes(shapes), out or "", bool(measure),
                                               bool(compile), config_text))


from . import nn  # noqa: E402  (needs the op library loaded above)
from .safetensors import load_file, save_file  # noqa: E402,F401
