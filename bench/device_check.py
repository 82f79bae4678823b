#!/usr/bin/env python3
"""Helpers of bench/device_check.sh (standard library only, except `gemm`).

  cmp A.jsonl B.jsonl --tol T [--from-iter K]  per-iteration lm_loss of two `megatron train
                                               --metrics-file` runs: max relative difference
  ms METRICS --skip W                          median ms/iteration of the log lines after W
  gtest FILE.json [--fail-on-skip]             counts of a gtest JSON report
  gemm --out FILE [--n 8192]                   torch bf16 matmul ceiling (TFLOP/s)
  ours --metrics F --plan P --skip W --tokens N --out FILE   `megatron train` benchmark figures
  torch-fig FILE.json                          one line of bench/llama_torch_train.py's result
  profile METRICS                              where the op profile's time goes: GEMMs (all shapes
                                               together, and the slowest shape), attention
                                               forward/backward (TFLOP/s), everything else
  bench-report --dir D                         ratios of ours / torch eager / torch compile
  summary --results R --kv K --md OUT.md --json OUT.json    the summary table

Each prints one human line (the step's key figures) and exits 0 when the check
passes, 1 when it fails.
"""
import argparse
import json
import math
import os
import statistics
import sys

PEAK = 989.0  # H100/H200 SXM dense bf16 TFLOP/s (the datasheet figure MFU is quoted against)


def read_jsonl(path):
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    pass  # a line cut by a killed run
    return rows


def iteration_rows(path):
    """{iteration: row} of the per-iteration lines (those without 'kind')."""
    return {r["iteration"]: r for r in read_jsonl(path) if "lm_loss" in r and "kind" not in r}


def rel(a, b):
    if a == b:
        return 0.0
    if not (math.isfinite(a) and math.isfinite(b)):
        return math.inf
    return abs(a - b) / max(abs(b), 1e-30)


def cmd_cmp(a):
    try:
        ra, rb = iteration_rows(a.a), iteration_rows(a.b)
    except OSError as e:
        print(f"missing metrics: {e}")
        return 1
    its = sorted(i for i in rb if i >= a.from_iter)
    missing = [i for i in its if i not in ra]
    if not its or missing:
        print(f"iterations missing: reference has {sorted(rb)}, run has {sorted(ra)}")
        return 1
    loss = max(rel(ra[i]["lm_loss"], rb[i]["lm_loss"]) for i in its)
    worst = max(its, key=lambda i: rel(ra[i]["lm_loss"], rb[i]["lm_loss"]))
    gn = max(rel(ra[i].get("grad_norm", 0.0), rb[i].get("grad_norm", 0.0)) for i in its)
    identical = all(ra[i]["lm_loss"] == rb[i]["lm_loss"] for i in its)
    ok = loss <= a.tol
    print(f"loss max rel diff {loss:.2e} (tol {a.tol:g}, worst at it {worst}) over its {its[0]}-{its[-1]}"
          f"{' (bitwise equal)' if identical else ''}; grad-norm max rel diff {gn:.2e}; "
          f"loss@{its[-1]} {ra[its[-1]]['lm_loss']:.6f} vs {rb[its[-1]]['lm_loss']:.6f}")
    return 0 if ok else 1


def log_ms(path, skip):
    rows = [r for r in read_jsonl(path) if r.get("kind") == "log" and r["iteration"] > skip]
    return [r["ms_per_iteration"] for r in rows], rows


def cmd_ms(a):
    try:
        ms, _ = log_ms(a.metrics, a.skip)
    except OSError:
        ms = []
    print(f"{statistics.median(ms):.1f}" if ms else "n/a")
    return 0 if ms else 1


def cmd_gtest(a):
    try:
        j = json.load(open(a.file))
    except (OSError, json.JSONDecodeError) as e:
        print(f"no gtest report ({e.__class__.__name__})")
        return 1
    skipped, failed = 0, []
    for s in j.get("testsuites", []):
        for t in s.get("testsuite", []):
            if t.get("result") == "SKIPPED":
                skipped += 1
            if t.get("failures"):
                failed.append(f"{s['name']}.{t['name']}")
    n = j.get("tests", 0)
    line = f"{n} tests, {len(failed)} failed, {skipped} skipped, {j.get('disabled', 0)} disabled ({j.get('time', '?')})"
    if failed:
        line += ": " + ", ".join(failed[:8]) + (" ..." if len(failed) > 8 else "")
    print(line)
    if a.fail_on_skip and skipped:
        print("  (skipped tests count as failures here: the GPU was not usable)")
        return 1
    return 0 if not failed and j.get("failures", 0) == 0 and n > 0 else 1


def cmd_gemm(a):
    import time
    import torch
    n = a.n
    x = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        x @ y
    torch.cuda.synchronize()
    ts = []
    for _ in range(10):
        t0 = time.perf_counter()
        x @ y
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    tflops = 2 * n**3 / statistics.mean(ts) / 1e12
    res = {"n": n, "tflops": tflops, "ms_mean": statistics.mean(ts) * 1000, "device": torch.cuda.get_device_name(0),
           "torch": torch.__version__}
    json.dump(res, open(a.out, "w"))
    print(f"bf16 {n}^3 matmul: {tflops:.0f} TFLOP/s (mean of 10 after 3 warm-ups, {res['ms_mean']:.2f} ms), "
          f"{100 * tflops / PEAK:.0f}% of {PEAK:g}")
    return 0


def cmd_ours(a):
    try:
        ms, rows = log_ms(a.metrics, a.skip)
    except OSError:
        ms, rows = [], []
    plan = {}
    try:
        plan = json.load(open(a.plan))
    except (OSError, json.JSONDecodeError):
        pass
    flops = plan.get("compute", {}).get("flops_per_iteration")
    params = plan.get("model", {}).get("total_params")
    if not ms:
        print(f"no timed iterations after the {a.skip} warm-ups in {a.metrics}")
        return 1
    med = statistics.median(ms) / 1000
    res = {"step_ms_median": med * 1000, "step_ms_mean": statistics.mean(ms), "timed_iters": len(ms),
           "tokens_per_s": a.tokens / med, "params": params, "flops_per_iteration": flops,
           "trainer_tflops_median": statistics.median(r["tflops_per_device"] for r in rows),
           "peak_mem_measured_gib": max(r.get("memory_measured_bytes", 0) for r in rows) / 2**30,
           "loss_last": rows[-1].get("lm_loss")}
    if flops:
        res["tflops"] = flops / med / 1e12
        res["mfu_989"] = res["tflops"] / PEAK
    json.dump(res, open(a.out, "w"))
    print(f"ours: {res['step_ms_median']:.1f} ms/it (median of {len(ms)}), {res['tokens_per_s']:,.0f} tokens/s, "
          f"{res.get('tflops', float('nan')):.1f} TFLOP/s, MFU {100 * res.get('mfu_989', float('nan')):.1f}% of 989")
    return 0


def cmd_torch_fig(a):
    try:
        r = json.load(open(a.file))
    except (OSError, json.JSONDecodeError) as e:
        print(f"no result ({e.__class__.__name__})")
        return 1
    mem = f", peak {r['peak_mem_gib']:.1f} GiB" if r.get("peak_mem_gib") is not None else ""
    print(f"{r['mode']}: {r['step_ms_median']:.1f} ms/it (median of {r['timed_iters']}), {r['tokens_per_s']:,.0f} tokens/s, "
          f"{r['tflops']:.1f} TFLOP/s, MFU {100 * r['mfu_989']:.1f}% of 989, first step {r['first_step_s']:.1f} s{mem}")
    return 0


def cmd_profile(a):
    """One line from the op_profile record of a `megatron train` metrics file (MT_PROFILE_OPS=1)."""
    try:
        recs = [r for r in read_jsonl(a.metrics) if r.get("kind") == "op_profile"]
    except OSError as e:
        print(f"missing metrics: {e}")
        return 1
    if not recs:
        print(f"no op_profile record in {a.metrics}")
        return 1
    rec = recs[-1]
    ops, n = rec["ops"], max(1, rec.get("iterations", 1))
    total = sum(o["ms"] for o in ops)

    def group(pred):
        sel = [o for o in ops if pred(o["op"])]
        ms, fl = sum(o["ms"] for o in sel), sum(o.get("flops", 0) for o in sel)
        return ms, (fl / (ms * 1e9) if ms > 0 and fl > 0 else 0.0)

    gemm_ms, gemm_tf = group(lambda op: op.startswith("gemm"))
    fwd_ms, fwd_tf = group(lambda op: op == "attention_forward")
    bwd_ms, bwd_tf = group(lambda op: op == "attention_backward")
    shapes = [o for o in ops if o["op"].startswith("gemm ") and o["ms"] > 0 and o.get("flops", 0) > 0]
    slow = min(shapes, key=lambda o: o["flops"] / o["ms"]) if shapes else None
    other = total - gemm_ms - fwd_ms - bwd_ms

    def share(ms):
        return 100 * ms / total if total > 0 else 0.0

    line = (f"per iteration {total / n:.1f} ms of ops: GEMMs {gemm_ms / n:.1f} ms ({share(gemm_ms):.0f}%, {gemm_tf:.4g} TFLOP/s)"
            f", attention fwd {fwd_ms / n:.1f} ms ({fwd_tf:.4g} TFLOP/s), bwd {bwd_ms / n:.1f} ms ({bwd_tf:.4g} TFLOP/s)"
            f", other ops {other / n:.1f} ms ({share(other):.0f}%)")
    if slow:
        line += f"; slowest GEMM {slow['op']} at {slow['flops'] / (slow['ms'] * 1e9):.4g} TFLOP/s"
    print(line)
    return 0


def cmd_ncu(a):
    """Per kernel, the headline metrics of an Nsight Compute `--csv --page details` file."""
    import csv
    try:
        lines = open(a.file, errors="replace").read().splitlines()
    except OSError as e:
        print(f"missing ncu output: {e}")
        return 1
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        print(f"no ncu table in {a.file} ({len(lines)} lines)")
        return 1
    rows = list(csv.DictReader(lines[start:]))
    kernels = {}  # ID -> (name, {metric: (value, unit)})
    for r in rows:
        if not r.get("ID") or not r.get("Metric Name"):
            continue
        name = r.get("Kernel Name", "?").replace("(anonymous namespace)", "anon").split("(")[0].split("<")[0].split("::")[-1].split()[-1]
        # The first of two same-named metrics is kept: "Memory Throughput" is a
        # percentage in SpeedOfLight, then bytes/s in MemoryWorkloadAnalysis.
        kernels.setdefault(r["ID"], (name, {}))[1].setdefault(r["Metric Name"],
                                                             (r.get("Metric Value", ""), r.get("Metric Unit", "")))
    want = [("Duration", "dur"), ("Compute (SM) Throughput", "sm%"), ("Memory Throughput", "mem%"),
            ("DRAM Throughput", "dram%"), ("Achieved Occupancy", "occ%"), ("Registers Per Thread", "regs"),
            ("Dynamic Shared Memory Per Block", "dsmem"), ("Block Limit Registers", "blk/reg"),
            ("Block Limit Shared Mem", "blk/smem"), ("Warp Cycles Per Issued Instruction", "cyc/issue"),
            ("Issue Slots Busy", "issue%")]
    out = []
    for kid, (name, m) in kernels.items():
        parts = [f"{label} {m[k][0]}{(' ' + m[k][1]) if m[k][1] and label == 'dur' else ''}" for k, label in want if k in m]
        # The share of the kernel's span in which the SMs had work: below 100%
        # for a tail of late, long blocks (or a grid smaller than the card).
        try:
            active = float(m["SM Active Cycles"][0].replace(",", ""))
            elapsed = float(m["Elapsed Cycles"][0].replace(",", ""))
            if elapsed > 0:
                parts.append(f"sm-active {100 * active / elapsed:.0f}%")
        except (KeyError, ValueError):
            pass
        out.append(f"{name}: " + ", ".join(parts))
    for l in out:
        print(l)
    print(" | ".join(out) if out else "no kernels in the ncu table")
    return 0 if out else 1


def cmd_bench_report(a):
    def load(name):
        try:
            return json.load(open(os.path.join(a.dir, name + ".json")))
        except (OSError, json.JSONDecodeError):
            return None
    gemm, ours, eager, comp = load("gemm"), load("ours"), load("eager"), load("compile")
    ceiling = gemm["tflops"] if gemm else None
    parts, rows = [], {}
    for name, r in (("ours", ours), ("torch eager", eager), ("torch compile", comp)):
        if not r or not r.get("tokens_per_s"):
            parts.append(f"{name}: n/a")
            continue
        t = r.get("tflops")
        row = {"tokens_per_s": r["tokens_per_s"], "step_ms": r["step_ms_median"], "tflops": t,
               "mfu_989": t / PEAK if t else None, "mfu_gemm": t / ceiling if t and ceiling else None}
        rows[name] = row
        parts.append(f"{name}: {row['tokens_per_s']:,.0f} tok/s, {row['step_ms']:.1f} ms, MFU {100 * (row['mfu_989'] or 0):.1f}%"
                     + (f" ({100 * row['mfu_gemm']:.1f}% of the GEMM ceiling)" if row["mfu_gemm"] else ""))
    ratios = {}
    if "ours" in rows:
        for name in ("torch eager", "torch compile"):
            if name in rows:
                ratios["ours/" + name.split()[1]] = rows["ours"]["tokens_per_s"] / rows[name]["tokens_per_s"]
    # The two sides must count the same model: parameters and FLOPs agree.
    same = None
    if ours and (eager or comp):
        peer = eager or comp
        same = ours.get("params") == peer.get("params") and \
            rel(ours.get("flops_per_iteration") or 0, peer.get("flops_per_iteration") or 1) < 1e-9
    res = {"gemm_ceiling_tflops": ceiling, "rows": rows, "ratios": ratios, "same_model_counted": same}
    json.dump(res, open(os.path.join(a.dir, "report.json"), "w"), indent=1)
    print("; ".join(parts + [f"{k} {v:.2f}x" for k, v in ratios.items()]
                    + ([f"GEMM ceiling {ceiling:.0f} TFLOP/s"] if ceiling else [])
                    + ([] if same is None else ["params/FLOPs agree" if same else "PARAMS/FLOPS DIFFER"])))
    return 0 if rows.get("ours") and same is not False else 1


def cmd_summary(a):
    steps = []
    if os.path.exists(a.results):
        for line in open(a.results):
            f = line.rstrip("\n").split("\t")
            if len(f) >= 5:
                steps.append({"step": f[0], "status": f[1], "seconds": int(f[2]), "budget": int(f[3]),
                              "figures": f[4], "what": f[5] if len(f) > 5 else ""})
    kv = {}
    if os.path.exists(a.kv):
        for line in open(a.kv):
            f = line.rstrip("\n").split("\t")
            if len(f) == 3:
                kv.setdefault(f[0], {})[f[1]] = f[2]
    bench = {}
    if a.bench_dir and os.path.exists(os.path.join(a.bench_dir, "report.json")):
        bench = json.load(open(os.path.join(a.bench_dir, "report.json")))
    counts = {}
    for s in steps:
        counts[s["status"]] = counts.get(s["status"], 0) + 1
    json.dump({"steps": steps, "figures": kv, "bench": bench, "counts": counts, "header": a.header}, open(a.json, "w"),
              indent=1)
    esc = lambda s: s.replace("|", "\\|")
    md = [f"# Device check{': ' + a.header if a.header else ''}", "",
          "Result: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())), "",
          "| step | what | status | s (budget) | key figures |", "| --- | --- | --- | --- | --- |"]
    for s in steps:
        md.append(f"| {s['step']} | {esc(s['what'])} | **{s['status']}** | {s['seconds']} ({s['budget']}) | {esc(s['figures'])} |")
    if bench.get("rows"):
        md += ["", "## Benchmark: ~1B LLaMA-style model, bf16, one GPU", "",
               "| run | tokens/s | ms/step | TFLOP/s | MFU (989) | MFU (GEMM ceiling) |", "| --- | --- | --- | --- | --- | --- |"]
        for name, r in bench["rows"].items():
            f = lambda v, p=1, pct=False: "n/a" if v is None else (f"{100 * v:.{p}f}%" if pct else f"{v:,.{p}f}")
            md.append(f"| {name} | {f(r['tokens_per_s'], 0)} | {f(r['step_ms'])} | {f(r['tflops'])} | "
                      f"{f(r['mfu_989'], 1, True)} | {f(r['mfu_gemm'], 1, True)} |")
        if bench.get("gemm_ceiling_tflops"):
            md.append(f"\nGEMM ceiling (torch bf16 8192^3, mean of 10): {bench['gemm_ceiling_tflops']:.0f} TFLOP/s.")
        if bench.get("ratios"):
            md.append("Ratios (tokens/s): " + ", ".join(f"{k} = {v:.2f}x" for k, v in bench["ratios"].items()) + ".")
    md += ["", "Notes: " + a.notes if a.notes else ""]
    open(a.md, "w").write("\n".join(md) + "\n")
    return 0


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("cmp"); s.add_argument("a"); s.add_argument("b")
    s.add_argument("--tol", type=float, required=True); s.add_argument("--from-iter", type=int, default=1)
    s = sub.add_parser("ms"); s.add_argument("metrics"); s.add_argument("--skip", type=int, default=0)
    s = sub.add_parser("gtest"); s.add_argument("file"); s.add_argument("--fail-on-skip", action="store_true")
    s = sub.add_parser("gemm"); s.add_argument("--out", required=True); s.add_argument("--n", type=int, default=8192)
    s = sub.add_parser("ours"); s.add_argument("--metrics", required=True); s.add_argument("--plan", required=True)
    s.add_argument("--skip", type=int, required=True); s.add_argument("--tokens", type=int, required=True)
    s.add_argument("--out", required=True)
    s = sub.add_parser("torch-fig"); s.add_argument("file")
    s = sub.add_parser("profile"); s.add_argument("metrics")
    s = sub.add_parser("ncu"); s.add_argument("file")
    s = sub.add_parser("bench-report"); s.add_argument("--dir", required=True)
    s = sub.add_parser("summary"); s.add_argument("--results", required=True); s.add_argument("--kv", required=True)
    s.add_argument("--md", required=True); s.add_argument("--json", required=True)
    s.add_argument("--bench-dir", default=""); s.add_argument("--header", default=""); s.add_argument("--notes", default="")
    a = p.parse_args(argv)
    return {"cmp": cmd_cmp, "ms": cmd_ms, "gtest": cmd_gtest, "gemm": cmd_gemm, "ours": cmd_ours, "torch-fig": cmd_torch_fig, "profile": cmd_profile, "ncu": cmd_ncu,
            "bench-report": cmd_bench_report, "summary": cmd_summary}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
