"""The Python side of the call overhead (bench/torch_call_bench.cpp is the C++
side, same shapes): per-call wall time of lunajit.linear_attention (the
package's function: spec handling, then the op), torch.ops.lunajit.linear_attention
(the op directly) and lunajit.nn.LinearAttention, on small CPU tensors, ATen
path, forward only, single thread. A measurement, not a test:

    PYTHONPATH=build/python /usr/bin/python3 bench/python_overhead.py
"""
import time

import torch

import lunajit
import lunajit.nn

torch.set_num_threads(1)


def per_call_us(f, n=1000):
    """CPU time per call (process_time, single thread: what Google Benchmark's
    CPU column measures, robust on a loaded machine), best of 5 rounds."""
    for _ in range(50):
        f()
    best = float("inf")
    for _ in range(5):
        t0 = time.process_time()
        for _ in range(n):
            f()
        best = min(best, (time.process_time() - t0) / n)
    return best * 1e6


def main():
    print("CPU us per call")
    print("%-6s %5s %14s %14s %14s" % ("family", "seq", "package", "op", "module"))
    for family in ("elu", "luna"):
        extra = {"luna": {"projections": 2, "channels": 2, "mlp_width": 4}} if family == "luna" else {}
        spec = lunajit.make_spec(family=family, head_dim=16, value_dim=16, dtype="fp32", causal=True, **extra)
        text = lunajit.canonical_spec(spec)
        p = lunajit.init_feature_params(spec, 2)
        p = p if p.numel() else None
        module = lunajit.nn.LinearAttention(spec, 2)
        for seq in (16, 256):
            q, k, v = (torch.randn(1, seq, 2, 16) for _ in range(3))
            with torch.no_grad():
                a = per_call_us(lambda: lunajit.linear_attention(q, k, v, spec=spec, params=p))
                b = per_call_us(lambda: torch.ops.lunajit.linear_attention(q, k, v, p, text, "automatic", 64, "",
                                                                           True, False))
                c = per_call_us(lambda: module(q, k, v))
            print("%-6s %5d %14.1f %14.1f %14.1f" % (family, seq, a, b, c))


if __name__ == "__main__":
    main()
