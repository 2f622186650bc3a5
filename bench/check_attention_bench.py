#!/usr/bin/env python3
"""Checks the JSON of `attention_bench --cpu-smoke` (ctest attention_bench_cpu_smoke):
every (impl, causal, pass) benchmark is present; lunajit and eager ran (a time,
no error); sdpa ran or was skipped with its reason (LibTorch < 2.0 has no SDPA).
Usage: check_attention_bench.py BENCH.json"""
import json
import sys


def main(path):
    runs = json.load(open(path))["benchmarks"]
    by_name = {r["name"].split("/N:")[0]: r for r in runs}
    failures = []
    for impl in ("lunajit", "eager", "sdpa"):
        for causal in ("noncausal", "causal"):
            for mode in ("fwd", "fwd+bwd"):
                name = "%s/%s/%s" % (impl, causal, mode)
                r = by_name.get(name)
                if r is None:
                    failures.append("%s: missing (have %s)" % (name, sorted(by_name)))
                elif r.get("error_occurred"):
                    if impl != "sdpa" or "LibTorch >= 2.0" not in r.get("error_message", ""):
                        failures.append("%s: %s" % (name, r.get("error_message")))
                elif not r.get("real_time", 0) > 0 or not r.get("tokens_per_s", 0) > 0:
                    failures.append("%s: no time or tokens/s: %s" % (name, r))
    for f in failures:
        print("attention_bench check: " + f)
    print("attention_bench check: %d benchmarks, %d problems" % (len(runs), len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
