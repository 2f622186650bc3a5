"""`lunajit run --inputs/--save`: inputs written by the package's safetensors
writer are read by the C++ reader, the kernels (host backend) run on them, and
the outputs and gradients the C++ writer saves are read back here and compared
with the op and its autograd. The binary comes from $LUNAJIT_CLI (ctest sets it)."""
import json
import os
import subprocess

import pytest
import torch

import lunajit
from lunajit import safetensors as st

SPEC = lunajit.make_spec(family="luna", head_dim=16, value_dim=16, dtype="fp32", causal=True,
                         luna={"projections": 3, "channels": 2, "mlp_width": 5})


def cli():
    path = os.environ.get("LUNAJIT_CLI")
    if not path or not os.access(path, os.X_OK):
        pytest.fail("set LUNAJIT_CLI to the lunajit binary (ctest does: tests/python/CMakeLists.txt)")
    return path


def run(*args):
    return subprocess.run([cli(), "run", lunajit.canonical_spec(SPEC), "--backend", "host", *args],
                          capture_output=True, text=True, timeout=600)


def test_run_inputs_save_forward_and_backward(tmp_path):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 40, 2, 16, generator=g) for _ in range(3))
    do = torch.randn(1, 40, 2, 16, generator=g)
    p = lunajit.init_feature_params(SPEC, 2, 7)
    inp, out = str(tmp_path / "in.safetensors"), str(tmp_path / "out.safetensors")
    st.save_file({"q": q, "k": k, "v": v.double(), "params": p, "do": do}, inp)  # v in F64: converted
    r = run("--inputs", inp, "--save", out, "--backward", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["tensors"] == ["o", "dq", "dk", "dv", "dparams"]
    res, meta = st.load_file(out, with_metadata=True)
    assert meta["lunajit.spec"] == lunajit.canonical_spec(SPEC)
    ins = [t.double().requires_grad_() for t in (q, k, v, p)]
    o = lunajit.linear_attention(*ins[:3], spec=dict(SPEC, dtype="fp32"), params=ins[3])
    grads = torch.autograd.grad(o, ins, do.double())
    rel = lambda a, b: ((a.double() - b).norm() / b.norm()).item()  # noqa: E731
    # fp32 kernels against the fp64 ATen path: 1e-4 relative rms (the kernels' fp32 tolerance).
    assert rel(res["o"], o.detach()) < 1e-4
    for name, want in zip(("dq", "dk", "dv", "dparams"), grads):
        assert res[name].shape == want.shape and rel(res[name], want) < 1e-4, name


def test_run_inputs_errors_exit_2(tmp_path):
    bad = str(tmp_path / "bad.safetensors")
    st.save_file({"q": torch.zeros(1, 4, 2, 16), "k": torch.zeros(1, 4, 2, 16)}, bad)
    r = run("--inputs", bad)
    assert r.returncode == 2 and 'no tensor "v"' in r.stderr, r.stderr
    st.save_file({"q": torch.zeros(1, 4, 2, 16), "k": torch.zeros(1, 4, 2, 8), "v": torch.zeros(1, 4, 2, 16)}, bad)
    r = run("--inputs", bad)
    assert r.returncode == 2 and 'tensor "k" has shape [1, 4, 2, 8]' in r.stderr, r.stderr
    with open(bad, "r+b") as f:  # a corrupted header length
        f.write(b"\xff" * 8)
    r = run("--inputs", bad)
    assert r.returncode == 2 and "header length" in r.stderr, r.stderr
