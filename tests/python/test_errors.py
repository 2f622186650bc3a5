"""Bad arguments raise Python exceptions carrying the C++ message (RuntimeError
for tensor checks, ValueError for bad option values and specs); the interpreter
keeps running."""
import pytest
import torch

import lunajit

SPEC = lunajit.make_spec(family="luna", head_dim=8, value_dim=8, dtype="fp32",
                         luna={"projections": 2, "channels": 2, "mlp_width": 3})


def qkv(d=8, dv=8, dtype=torch.float32):
    return torch.randn(1, 4, 2, d, dtype=dtype), torch.randn(1, 4, 2, d, dtype=dtype), torch.randn(1, 4, 2, dv,
                                                                                                 dtype=dtype)


def params():
    return lunajit.init_feature_params(SPEC, 2)


def test_value_dim_mismatch_names_the_argument():
    q, k, _ = qkv()
    v = torch.randn(1, 4, 2, 4)
    with pytest.raises(RuntimeError, match=r"v.size\(3\) = 4 but the spec's value_dim is 8"):
        torch.ops.lunajit.linear_attention(q, k, v, params(), lunajit.canonical_spec(SPEC))


def test_wrong_parameter_count():
    q, k, v = qkv()
    with pytest.raises(RuntimeError, match=r"feature_params has 5 floats but the spec needs"):
        lunajit.linear_attention(q, k, v, spec=SPEC, params=torch.zeros(5))


def test_batch_mismatch():
    q, k, v = qkv()
    with pytest.raises(RuntimeError, match=r"k has batch 1 but q has 2"):
        lunajit.linear_attention(torch.cat([q, q]), k, v, spec=SPEC, params=params())
    with pytest.raises(RuntimeError, match=r"v has \[seq, heads\] = \[\d+, \d+\] but k has \[3, \d+\]"):
        lunajit.linear_attention(q, k[:, :3], v, spec=SPEC, params=params())


def test_kernel_path_dtype():
    q, k, v = qkv(dtype=torch.float64)
    with pytest.raises(RuntimeError, match=r"linear_attention"):
        lunajit.linear_attention(q, k, v, spec=SPEC, params=params(), path="host_kernels")


def test_invalid_spec_is_a_value_error_from_the_validator():
    with pytest.raises(ValueError, match=r"projections"):
        lunajit.make_spec(family="luna", luna={"projections": 0})
    with pytest.raises(ValueError, match=r"spec"):
        torch.ops.lunajit.canonical_spec('{"family": "nope"}')
    with pytest.raises(ValueError, match=r"family 'nope' is not one of"):
        lunajit.default_spec("nope")


def test_bad_option_values():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"path 'fast' is not one of"):
        lunajit.linear_attention(q, k, v, spec=SPEC, path="fast")
    with pytest.raises(ValueError, match=r'path = "fast" is not one of automatic, aten, host_kernels, cuda_kernels'):
        torch.ops.lunajit.linear_attention(q, k, v, params(), lunajit.canonical_spec(SPEC), "fast")
    with pytest.raises(ValueError, match=r"chunk must be >= 1, got 0"):
        lunajit.linear_attention(q, k, v, spec=SPEC, chunk=0)
    with pytest.raises(ValueError, match=r"must be 4-D"):
        lunajit.linear_attention(q[0], k, v, spec=SPEC)
    with pytest.raises(ValueError, match=r"heads must be >= 1"):
        lunajit.init_feature_params(SPEC, 0)
    with pytest.raises(ValueError, match=r"shapes must be a flat list"):
        torch.ops.lunajit.tune(lunajit.canonical_spec(SPEC), [1, 2], "", "host", "all", 0, False)


def test_interpreter_survives_and_the_op_still_works():
    q, k, v = qkv()
    for _ in range(3):
        with pytest.raises(RuntimeError):
            lunajit.linear_attention(q, k, v[..., :3], spec=SPEC)
    assert lunajit.linear_attention(q, k, v, spec=SPEC, params=params()).shape == (1, 4, 2, 8)
