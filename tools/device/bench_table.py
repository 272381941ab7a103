#!/usr/bin/env python3
"""The tables of tools/device/check.sh, from what its runs left in the bench folder.

  bench_table.py bench DIR GPU_NAME WARMUP KEY:LABEL=L,h,heads,s,b,V ...
  bench_table.py levers DIR WARMUP

DIR holds one entry per run, named as check.sh names them:
  bench-<precision>-ptrain-<KEY>/metrics.jsonl        ptrain's run folder
  bench-<precision>-eager-<kind>-<KEY>.json           gpt_eager.py's JSON line (kind: tuned, compiled, plain)
  levers-<name>/metrics.jsonl                         the memory levers' runs
  <run>.status                                        check.sh's word on the run: STATUS|SECONDS|NOTE
A row is printed when its run left a result or a status; a run with neither was not in this check's
plan (--quick, --skip-bench). Standard library only: it runs beside any PyTorch, or none.
"""
import json
import os
import statistics
import sys

# Dense peaks, FLOP/s, by the name PyTorch gives the card. H100 PCIe and NVL have lower clocks and
# other peaks: they stay unknown rather than borrow the SXM figures.
PEAKS = (
    (lambda n: "H200" in n, "H100 SXM / H200", {"bf16": 989e12, "tf32": 494e12, "fp32": 67e12}),
    (lambda n: "H100" in n and ("HBM3" in n or "SXM" in n), "H100 SXM / H200",
     {"bf16": 989e12, "tf32": 494e12, "fp32": 67e12}),
    (lambda n: "A100" in n, "A100", {"bf16": 312e12, "tf32": 156e12, "fp32": 19.5e12}),
)
MIB_TO_GB = 2 ** 20 / 1e9  # ptrain writes MiB (peak_device_mb), gpt_eager.py GB (1e9 bytes): GB on both sides


def peaks_of(gpu):
    for match, label, peaks in PEAKS:
        if match(gpu.upper()):
            return label, peaks
    return None, None


def status_of(d, name):
    """(status, seconds, note) from check.sh's <name>.status, or None."""
    try:
        line = open(os.path.join(d, name + ".status")).read().strip()
    except OSError:
        return None
    parts = (line.split("|", 2) + ["", ""])[:3]
    return parts[0], parts[1], parts[2]


def train_rows(folder):
    """The training rows of a run's metrics.jsonl, and the peak its own mfu divides by (or None)."""
    rows, peak = [], None
    with open(os.path.join(folder, "metrics.jsonl")) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            r = json.loads(line)
            if r.get("kind") == "startup" and isinstance(r.get("peak_flops"), (int, float)):
                peak = r["peak_flops"]
            if "step_time_s" in r and r.get("kind", "train") == "train":
                rows.append(r)
    return rows, peak


def ptrain_result(d, name, warm):
    """median step after the warm-up, device peak in GB, ptrain's own median MFU and its peak (or None)."""
    try:
        rows, own_peak = train_rows(os.path.join(d, name))
    except (OSError, ValueError):
        return None
    timed = [r for r in rows if r.get("step", 0) > warm]
    if not timed:
        return None
    peak = max((r.get("peak_device_mb", 0) for r in rows), default=0) * MIB_TO_GB
    own = [r["mfu"] for r in timed if isinstance(r.get("mfu"), (int, float))]
    return {"step": statistics.median(r["step_time_s"] for r in timed), "mem": peak or None,
            "own_mfu": statistics.median(own) if own else None, "own_peak": own_peak}


def eager_result(d, name):
    try:
        lines = open(os.path.join(d, name + ".json")).read().strip().splitlines()
        r = json.loads(lines[-1])
        return {"step": r["step_time_s"], "mem": r.get("peak_gpu_mem_gb"), "compile_s": r.get("compile_s"),
                "precision": r.get("precision"), "attention": r.get("attention")}
    except (OSError, ValueError, KeyError, IndexError):
        return None


def parse_models(specs):
    models = []
    for spec in specs:
        name, nums = spec.split("=", 1)
        key, label = (name.split(":", 1) + [name])[:2]
        L, h, heads, s, b, V = map(int, nums.split(","))
        exact = L * (12 * h * h + 13 * h) + V * h + s * h + 2 * h
        models.append({"key": key, "name": label, "L": L, "h": h, "heads": heads, "s": s, "b": b, "V": V,
                       "params": exact, "tokens": b * s, "attn": 12 * L * h * s})
    return models


def fmt_mem(x):
    return f"{x:.1f}" if x is not None else "-"


def bench(d, gpu, warm, specs):
    models = parse_models(specs)
    label, peaks = peaks_of(gpu)
    print(f"\nbench on {gpu or 'no GPU'}: tokens/s, TFLOP/s = 6 N tokens/s (N: every parameter), MFU = TFLOP/s over")
    if peaks:
        print(f"  the card's dense peak for the row's precision ({label}: bf16 {peaks['bf16'] / 1e12:g},"
              f" tf32 {peaks['tf32'] / 1e12:g}, fp32 {peaks['fp32'] / 1e12:g} TFLOP/s);")
    else:
        print("  the card's dense peak: none known for this card, MFU shown as '-';")
    print("  'own MFU': ptrain's metrics.jsonl mfu (its own FLOP count and peak); GB: the caching allocator's")
    print("  peak, 1e9 bytes, on both sides; step s: median after the warm-up steps.")
    shown = [m for m in models if any(os.path.exists(os.path.join(d, f"bench-{p}-{r}-{m['key']}{x}"))
                                      for p in ("bf16", "tf32", "fp32") for r in ("ptrain", "eager-tuned",
                                      "eager-compiled", "eager-plain") for x in ("", ".json", ".status"))]
    for m in shown:
        print(f"  {m['name']}: L={m['L']} h={m['h']} heads={m['heads']} seq={m['s']} batch={m['b']} vocab={m['V']},"
              f" N={m['params']:,}, {m['tokens']} tokens/step, 6N = {6 * m['params'] / 1e9:.2f} GFLOP/token"
              f" (attention adds {m['attn'] / 1e9:.2f}, not counted)")
    print("  bf16: ptrain precision.name=bf16 (bf16 weights and activations, float32 masters and gradient")
    print("  accumulation); eager tuned: autocast bf16, fp32 weights, SDPA, fused AdamW; compiled: the same")
    print("  under torch.compile. tf32 / fp32: the plain model, TF32 matrix products on / off on both sides.")
    print(f"  {'model':<10}{'run':<16}{'prec':<6}{'step s':>8}{'tok/s':>9}{'TFLOP/s':>9}{'MFU':>7}{'own MFU':>9}"
          f"{'dev GB':>8}  note")
    results = {}  # (model, precision, run) -> dict with tps, mem
    own_peaks = []  # (precision, the peak ptrain's own mfu divided by)
    plan = []
    for m in models:
        plan += [(m, "bf16", "ptrain"), (m, "bf16", "eager tuned"), (m, "bf16", "eager compiled")]
    for prec in ("tf32", "fp32"):
        for m in models:
            plan += [(m, prec, "ptrain"), (m, prec, "eager")]
    for m, prec, run in plan:
        kind = {"ptrain": None, "eager tuned": "tuned", "eager compiled": "compiled", "eager": "plain"}[run]
        name = f"bench-{prec}-ptrain-{m['key']}" if kind is None else f"bench-{prec}-eager-{kind}-{m['key']}"
        r = ptrain_result(d, name, warm) if kind is None else eager_result(d, name)
        st = status_of(d, name)
        if r is None and st is None:
            continue  # not in this check's plan
        note = st[2] if st is not None else ""
        head = f"  {m['name']:<10}{run:<16}{prec:<6}"
        if r is None:
            what = st[0] if st is not None and st[0] not in ("ok", "") else "no result"
            print(f"{head}{what:>8}  {note}".rstrip())
            continue
        tps = m["tokens"] / r["step"]
        fl = 6 * m["params"] * tps
        mfu = f"{100 * fl / peaks[prec]:6.1f}%" if peaks else f"{'-':>7}"
        own = r.get("own_mfu")
        own_s = f"{100 * own:8.1f}%" if own is not None else f"{'-':>9}"
        if r.get("compile_s") is not None:
            note = (f"compile {r['compile_s']:.0f} s (first step); " + note).rstrip("; ")
        print(f"{head}{r['step']:>8.3f}{tps:>9.0f}{fl / 1e12:>9.1f}{mfu}{own_s}{fmt_mem(r['mem']):>8}  {note}".rstrip())
        if r.get("own_peak") and (prec, r["own_peak"]) not in own_peaks:
            own_peaks.append((prec, r["own_peak"]))
        results[(m["name"], prec, run)] = {"tps": tps, "mem": r["mem"], "mfu": fl / peaks[prec] if peaks else None}

    if own_peaks:
        print("  (ptrain's own mfu divides by " + ", ".join(f"{p1 / 1e12:g} TFLOP/s in {p0}" for p0, p1 in own_peaks)
              + ")")
    print("  ('during the build': that eager run shared the CPU with the niced build, the Python thread keeping")
    print("  a core; ptrain's step ends when the loss is on the host, eager synchronizes the device around")
    print("  each step)")

    def ratio(a, b):
        return results[a]["tps"] / results[b]["tps"] if a in results and b in results else None

    def below(a, b):
        ma, mb = (results.get(a) or {}).get("mem"), (results.get(b) or {}).get("mem")
        if ma is None or mb is None:
            return None, ""
        return ma < mb, f"{ma:.1f} vs {mb:.1f} GB"

    lines = []

    def compare(label, p, against):
        """One line: ptrain's tokens/s over each of `against` [(what, row)], device memory against the first."""
        parts = []
        for what, other in against:
            r = ratio(p, other)
            if r is not None:
                parts.append(f"ptrain/{what} tokens/s {r:.2f}x")
        ok, detail = below(p, against[0][1])
        if ok is not None:
            parts.append(f"device memory below eager: {'yes' if ok else 'no'} ({detail})")
        if parts:
            lines.append(f"  {label}: " + "; ".join(parts))

    for m in models:
        n = m["name"]
        compare(f"{n} bf16", (n, "bf16", "ptrain"),
                [("eager tuned", (n, "bf16", "eager tuned")), ("compile", (n, "bf16", "eager compiled"))])
    for prec in ("tf32", "fp32"):
        for m in models:
            n = m["name"]
            compare(f"{n} {prec}", (n, prec, "ptrain"), [("eager", (n, prec, "eager"))])
    if lines:
        print()
        print("\n".join(lines))

    # The targets, on the largest model (the first); informational: they do not fail the check.
    big = models[0]["name"]
    p, t, c = (big, "bf16", "ptrain"), (big, "bf16", "eager tuned"), (big, "bf16", "eager compiled")
    print(f"\ntargets, {big} in bf16 (informational):")

    def target(ok, text, value):
        word = "n/a " if ok is None else ("PASS" if ok else "MISS")
        print(f"  {word}  {text}: {value}")

    if p not in results:
        target(None, "MFU >= 50% of the dense bf16 peak", "no ptrain bf16 result")
    elif not peaks:
        target(None, "MFU >= 50% of the dense bf16 peak", f"no dense peak known for {gpu or 'this card'}")
    else:
        target(results[p]["mfu"] >= 0.5, "MFU >= 50% of the dense bf16 peak", f"{100 * results[p]['mfu']:.1f}%")
    rt, rc = ratio(p, t), ratio(p, c)
    target(None if rt is None else rt >= 1.1, "tokens/s >= 1.1x eager tuned",
           f"{rt:.2f}x" if rt is not None else "no result on one side")
    target(None if rc is None else rc >= 1.0, "tokens/s >= torch.compile",
           f"{rc:.2f}x" if rc is not None else "no result on one side")
    ok, detail = below(p, t)
    target(ok, "device memory below eager tuned", detail or "no result on one side")


def levers(d, warm):
    print("\nmemory levers, the 1.2B GPT in bf16 (precision.name=bf16): median step after the first two, and the")
    print("device's peak (libtorch's caching allocator, GB = 1e9 bytes); 'none' is the bench's bf16 row. The")
    print("distributed optimizer on one GPU shards over one rank: its row shows what it costs, not what it saves.")
    print(f"  {'lever':<34}{'recompute':<11}{'step s':>8}{'peak GB':>9}  note")
    base = None
    for lever, rc, folder in (("none", "none", "bench-bf16-ptrain-1b"),
                              ("none", "full", "levers-recompute"),
                              ("offload params+grads+optimizer", "full", "levers-recompute-offload"),
                              ("optimizer.distributed", "none", "levers-distributed"),
                              ("offload params", "full", "levers-recompute-params"),
                              ("offload params+grads+optimizer", "none", "levers-offload")):
        r = ptrain_result(d, folder, warm)
        st = status_of(d, folder)
        if r is None and st is None:
            continue
        note = st[2] if st is not None and st[0] != "ok" else ""
        if r is None:
            what = st[0] if st is not None and st[0] not in ("ok", "") else "no result"
            print(f"  {lever:<34}{rc:<11}{what:>8}  {note}".rstrip())
            continue
        if base is None and folder == "bench-bf16-ptrain-1b":
            base = r
        elif base is not None:
            extra = f"{r['step'] / base['step']:.2f}x the step"
            if r["mem"] is not None and base["mem"] is not None:
                extra += f", {r['mem'] - base['mem']:+.1f} GB"
            note = (extra + "; " + note).rstrip("; ")
        print(f"  {lever:<34}{rc:<11}{r['step']:>8.3f}{fmt_mem(r['mem']):>9}  {note}".rstrip())


def main():
    if len(sys.argv) >= 5 and sys.argv[1] == "bench":
        bench(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5:])
    elif len(sys.argv) == 4 and sys.argv[1] == "levers":
        levers(sys.argv[2], int(sys.argv[3]))
    else:
        print("usage:\n" + "\n".join(__doc__.strip().splitlines()[2:4]), file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
