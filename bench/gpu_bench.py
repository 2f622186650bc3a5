#!/usr/bin/env python3
"""Forward and forward+backward of the default LUNA spec (bf16) through
lunajit's CUDA kernels, against (a) the eager ATen composition of the same
model (lunajit path "aten") and (b) torch's scaled_dot_product_attention
(FlashAttention where available), at B=8, H=12, d=64, N in {1K, 4K, 16K, 64K},
causal and not. Writes one JSON and one Markdown table (bench/gpu_check.sh).

  gpu_bench.py --out DIR [--seqs 1024,4096,...] [--batch 8 --heads 12] [--budget S]
  gpu_bench.py --dry-run --out DIR   the same on the CPU at a tiny size (path
                                     "aten" and SDPA only; lunajit's CUDA path is
                                     skipped), to check the script without a GPU
  gpu_bench.py --self-test           the table writer on made-up rows; needs no torch

Times are CUDA-event medians over repeats after warm-up; a configuration that
runs out of memory or fails is recorded with its error, never dropped.
"""
import argparse
import json
import os
import statistics
import sys
import time

IMPLS = ("lunajit", "eager", "sdpa")


def markdown(rows, meta):
    """The Markdown table of `rows` (dicts with seq, causal, mode, impl, ms or error)."""
    out = ["# lunajit GPU benchmark", "",
           "- device: %s" % meta.get("device", "?"),
           "- shape: B=%s, H=%s, d=64, bf16; %s" % (meta.get("batch"), meta.get("heads"), meta.get("note", "")), "",
           "| N | causal | pass | lunajit ms | eager ms | SDPA ms | lunajit vs eager | lunajit vs SDPA |",
           "|---|---|---|---|---|---|---|---|"]
    keys = []
    for r in rows:
        k = (r["seq"], r["causal"], r["mode"])
        if k not in keys:
            keys.append(k)

    def cell(k, impl):
        for r in rows:
            if (r["seq"], r["causal"], r["mode"]) == k and r["impl"] == impl:
                return r
        return None

    def fmt_ms(r):
        if r is None:
            return "-"
        return "%.3f" % r["ms"] if r.get("ms") is not None else "error: " + r.get("error", "?")[:40]

    def ratio(a, b):
        if a is None or b is None or a.get("ms") is None or b.get("ms") is None or a["ms"] <= 0:
            return "-"
        return "%.2fx" % (b["ms"] / a["ms"])

    for k in keys:
        lj, ea, sd = (cell(k, i) for i in IMPLS)
        out.append("| %d | %s | %s | %s | %s | %s | %s | %s |" % (
            k[0], "yes" if k[1] else "no", k[2], fmt_ms(lj), fmt_ms(ea), fmt_ms(sd), ratio(lj, ea), ratio(lj, sd)))
    return "\n".join(out) + "\n"


def self_test():
    rows = [{"seq": 1024, "causal": False, "mode": "fwd", "impl": "lunajit", "ms": 0.5},
            {"seq": 1024, "causal": False, "mode": "fwd", "impl": "eager", "ms": 2.0},
            {"seq": 1024, "causal": False, "mode": "fwd", "impl": "sdpa", "ms": None, "error": "out of memory"}]
    md = markdown(rows, {"device": "test", "batch": 8, "heads": 12})
    lines = [l for l in md.splitlines() if l.startswith("| 1024")]
    assert len(lines) == 1, md
    assert "| 0.500 | 2.000 | error: out of memory | 4.00x | - |" in lines[0], lines[0]
    print("gpu_bench self-test: ok")


def bench(args):
    import torch
    import torch.nn.functional as F
    dry = args.dry_run
    if not dry and not torch.cuda.is_available():
        sys.exit("gpu_bench: no CUDA device (use --dry-run to check the script on the CPU)")
    dev = "cpu" if dry else "cuda"
    lunajit = None
    if not args.no_lunajit:
        import lunajit
    dtype = torch.float32 if dry else torch.bfloat16  # CPU SDPA/ATen in bf16 is slow; the dry run checks plumbing
    rows = []

    def timed(fn, reps):
        for _ in range(2):
            fn()
        if dry:
            ts = []
            for _ in range(reps):
                t0 = time.perf_counter()
                fn()
                ts.append((time.perf_counter() - t0) * 1e3)
            return statistics.median(ts)
        torch.cuda.synchronize()
        ts = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            ts.append(a.elapsed_time(b))
        return statistics.median(ts)

    checks = []
    meta = {"device": "cpu (dry run)" if dry else torch.cuda.get_device_name(), "batch": args.batch,
            "heads": args.heads, "torch": torch.__version__, "dtype": str(dtype),
            "note": "dry run: fp32 on the CPU, no lunajit CUDA path" if dry else
            "causal and not; default tile configs unless tuned before; CUDA-event medians of %d" % args.repeats}

    def write():  # after every row: a run stopped from outside keeps what it measured
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "gpu_bench.json"), "w") as f:
            json.dump({"meta": meta, "rows": rows, "checks": checks}, f, indent=1)
        with open(os.path.join(args.out, "gpu_bench.md"), "w") as f:
            f.write(markdown(rows, meta))
            if checks:
                f.write("\n| N | causal | lunajit vs eager (rel. RMS, bf16 I/O) | o | dq | dk | dv |\n|---|---|---|---|---|---|---|\n")
                for c in checks:
                    f.write("| %d | %s | %s | %s | %s | %s | %s |\n" % (
                        c["seq"], "yes" if c["causal"] else "no", c.get("error", "ok"),
                        *("%.2e" % c[n] if n in c else "-" for n in ("o", "dq", "dk", "dv"))))

    def rel(a, b):
        a, b = a.double(), b.double()
        return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()

    for seq in args.seqs:
        for causal in (False, True):
            B, H, d = args.batch, args.heads, 64
            q, k, v = (torch.randn(B, seq, H, d, device=dev, dtype=dtype) * 0.5 for _ in range(3))
            impls = {
                # SDPA takes [B, H, N, d].
                "sdpa": lambda q, k, v: F.scaled_dot_product_attention(
                    q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal).transpose(1, 2),
            }
            if lunajit is not None:
                spec = lunajit.make_spec(family="luna", causal=causal, dtype="fp32" if dry else "bf16")
                params = lunajit.init_feature_params(spec, H).to(dev)
                impls = {
                    "lunajit": lambda q, k, v: lunajit.linear_attention(q, k, v, spec=spec, params=params,
                                                                        path="cuda_kernels"),
                    "eager": lambda q, k, v: lunajit.linear_attention(q, k, v, spec=spec, params=params,
                                                                      path="aten"),
                    **impls}
                if not dry and seq <= args.check_max_seq:
                    # The CUDA kernels against the ATen composition on the same inputs
                    # (the composition runs in bf16 too: this bounds both errors, it is
                    # not a reference; lunajit run --check compares with double).
                    c = {"seq": seq, "causal": causal}
                    try:
                        qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
                        do = torch.randn(B, seq, H, d, device=dev, dtype=dtype)
                        outs = []
                        for path in ("cuda_kernels", "aten"):
                            o = lunajit.linear_attention(qg, kg, vg, spec=spec, params=params, path=path)
                            outs.append((o.detach(), *torch.autograd.grad(o, (qg, kg, vg), do)))
                        for n, a, b in zip(("o", "dq", "dk", "dv"), outs[0], outs[1]):
                            c[n] = rel(a, b)
                    except Exception as e:
                        c["error"] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")
                    checks.append(c)
                    print("gpu_bench: check N=%d causal=%s: %s" % (seq, causal, c), flush=True)
            for impl, f in impls.items():
                if dry and impl == "lunajit":
                    continue
                for mode in ("fwd", "fwd+bwd"):
                    row = {"seq": seq, "causal": causal, "mode": mode, "impl": impl, "ms": None}
                    try:
                        if mode == "fwd":
                            with torch.no_grad():
                                row["ms"] = timed(lambda: f(q, k, v), args.repeats)
                        else:
                            qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
                            row["ms"] = timed(lambda: f(qg, kg, vg).float().sum().backward(), args.repeats)
                    except Exception as e:  # recorded, not dropped
                        row["error"] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")
                        if not dry:
                            torch.cuda.empty_cache()
                    rows.append(row)
                    write()
                    print("gpu_bench: N=%d causal=%s %s %s: %s" % (
                        seq, causal, mode, impl, "%.3f ms" % row["ms"] if row["ms"] is not None else row["error"]),
                        flush=True)
            del q, k, v
            if not dry:
                torch.cuda.empty_cache()
    write()
    print("gpu_bench: wrote %s/gpu_bench.json and gpu_bench.md" % args.out)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="gpu-check-out")
    p.add_argument("--seqs", default="1024,4096,16384,65536")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--check-max-seq", type=int, default=4096,
                   help="compare lunajit with the eager composition (o and gradients) up to this length")
    p.add_argument("--no-lunajit", action="store_true", help="SDPA only (no lunajit build with LibTorch)")
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--self-test", action="store_true")
    args = p.parse_args()
    if args.self_test:
        return self_test()
    args.seqs = [int(s) for s in args.seqs.split(",")]
    if args.dry_run:
        args.seqs, args.batch, args.heads, args.repeats = [64], 1, 2, 2
    bench(args)


if __name__ == "__main__":
    main()
