#!/usr/bin/env python3
"""The README's Results tables from `lunajit-experiment ablate` run directories.

  python3 scripts/results_tables.py runs/lra-listops runs/conversion ...

Reads each DIR/results.json (written when the ablate run finishes) and prints
its table as Markdown: mean ± sample std over the run's seeds, as ablate's own
summary.md computes them, laid out as the README shows them (the SLAY suite as
tasks x attentions, luna's M x L as a grid). Standard library only.
"""
import json
import sys
from pathlib import Path


def fig(row, key, digits=3):
    f = row.get(key)
    if f is None:
        return "-"
    return f"{f['mean']:.{digits}f} ± {f['std']:.{digits}f}"


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def render(res):
    grid, rows = res["grid"], res["rows"]
    if grid == "convert":
        return table(["target", "teacher", "after stage 1", "converted", "recovery"],
                     [[r["name"], fig(r, "teacher_accuracy"), fig(r, "converted_accuracy_before_finetune"),
                       fig(r, "converted_accuracy"), fig(r, "recovery")] for r in rows])
    if grid == "ml":
        cells = {(r["settings"]["luna_projections"], r["settings"]["luna_channels"]): r for r in rows}
        ms = sorted({m for m, _ in cells})
        ls = sorted({l for _, l in cells})
        return table(["M \\ L"] + [str(l) for l in ls],
                     [[str(m)] + [fig(cells[(m, l)], "test_accuracy") for l in ls] for m in ms])
    if grid == "attention" and any("/" in r["name"] for r in rows):
        tasks, atts, cells = [], [], {}
        for r in rows:
            t, a = r["name"].split("/", 1)
            tasks += [t] if t not in tasks else []
            atts += [a] if a not in atts else []
            cells[(t, a)] = r
        body = [[t] + [fig(cells[(t, a)], "test_accuracy", 2) for a in atts] for t in tasks]
        tps = [f"{sum(cells[(t, a)]['tokens_per_second']['mean'] for t in tasks) / len(tasks):.0f}" for a in atts]
        body.append(["tokens/s (mean over tasks)"] + tps)
        return table(["task"] + atts, body)
    return table(["attention" if grid == "attention" else "variant", "test accuracy", "val accuracy", "tokens/s",
                  "train s (mean)"],
                 [[r["name"], fig(r, "test_accuracy"), fig(r, "val_accuracy"),
                   f"{r['tokens_per_second']['mean']:.0f}", f"{r['train_seconds']['mean']:.1f}"] for r in rows])


def main(dirs):
    if not dirs:
        sys.exit(__doc__)
    for d in dirs:
        p = Path(d) / "results.json"
        if not p.exists():
            print(f"{d}: no results.json (the run is unfinished)", file=sys.stderr)
            continue
        res = json.loads(p.read_text())
        cfg = json.loads((Path(d) / "config.json").read_text())
        print(f"### {d} ({res['grid']} on {res['task']}, seeds {res['seeds']}, git {cfg.get('git_revision', '?')})\n")
        print(render(res) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
