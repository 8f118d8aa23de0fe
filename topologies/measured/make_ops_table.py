"""Turns op measurements (ops_bench.py JSON lines, e.g. h100-ops.jsonl) into the "ops" object of a
trainplan/cluster/v2 topology file. No fitting: every figure is a measured kernel time, converted to
microseconds, optionally scaled for another GPU by stated ratios (compute time / peak-FLOP ratio,
memory-bound time / HBM-bandwidth ratio) where that GPU was not measured.

usage: python3 make_ops_table.py h100-ops.jsonl SOURCE_TEXT [compute_scale memory_scale [calibrate.txt]] > ops.json

With a `trainplan calibrate --device cuda` output (calibrate.txt), its square matmuls from 1024^3 up are
added as GEMM points (only the product a @ b was timed: dgrad and wgrad take the same time, an
assumption the table supports within about 10% where all three were measured). A shape measured twice
keeps its fastest time: interference only ever slows a kernel.
"""
import json, sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
source = sys.argv[2]
cs = float(sys.argv[3]) if len(sys.argv) > 3 else 1.0   # multiply GEMM/attention times
ms = float(sys.argv[4]) if len(sys.argv) > 4 else 1.0   # multiply memory-bound times
us = lambda s, k: round(s * 1e6 * k, 3)
ops = {"source": source, "dtype": "bf16", "kernel_floor_us": None, "gemm": [], "attention": [], "memory_bound": {}}
mem = ops["memory_bound"]
names = {"layer_norm": "layer_norm", "rms_norm": "rms_norm", "gelu_tanh": "gelu", "add": "add", "swiglu": "swiglu"}
gemm = {}
for r in rows:
    op = r.get("op")
    if op == "launch_overhead":
        ops["kernel_floor_us"] = round(r["per_kernel_us"], 3)
    elif op == "gemm":
        g = gemm.setdefault((r["tokens"], r["out"], r["inn"]), {"m": r["tokens"], "n": r["out"], "k": r["inn"]})
        g[r["kind"] + "_us"] = us(r["s"], cs)
    elif op == "sdpa_causal":
        ops["attention"].append({"seq": r["seq"], "head_dim": r["head_dim"], "batch_heads": r["batch"] * r["heads"],
                                 "fwd_us": us(r["fwd_s"], cs), "fwd_bwd_us": us(r["fwdbwd_s"], cs)})
    elif op in names:
        # bytes: the input activation (bf16, tokens x hidden); SwiGLU's input is gate+up (2 x hidden)
        b = r["tokens"] * r["hidden"] * 2 * (2 if op == "swiglu" else 1)
        mem.setdefault(names[op], []).append({"bytes": b, "fwd_us": us(r["fwd_s"], ms), "fwd_bwd_us": us(r["fwdbwd_s"], ms)})
    elif op == "cross_entropy_fp32":
        b = r["tokens"] * r["vocab"] * 2  # bf16 logits, cast to fp32 inside
        mem.setdefault("cross_entropy_fp32", []).append({"bytes": b, "fwd_us": us(r["fwd_s"], ms), "fwd_bwd_us": us(r["fwdbwd_s"], ms)})
    elif op == "adamw":
        mem.setdefault("adamw_" + r["impl"], []).append({"bytes": r["params"] * 4, "step_us": us(r["s"], ms)})
if len(sys.argv) > 5:
    import re
    for line in open(sys.argv[5]):
        m = re.match(r"\s*(\d+)\^3\s+\S+\s+([0-9.]+) ms", line)
        if m and int(m.group(1)) >= 1024:
            n, t = int(m.group(1)), us(float(m.group(2)) * 1e-3, cs)
            g = gemm.setdefault((n, n, n), {"m": n, "n": n, "k": n, "fwd_us": t, "dgrad_us": t, "wgrad_us": t})
            for k in ("fwd_us", "dgrad_us", "wgrad_us"):
                g[k] = min(g[k], t)
ops["gemm"] = list(gemm.values())
for v in mem.values():
    v.sort(key=lambda p: p["bytes"])
print(json.dumps(ops))
