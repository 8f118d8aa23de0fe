"""Turns op measurements (ops_bench.py JSON lines, e.g. h100-ops.jsonl) into the "ops" object of a
trainplan/cluster/v2 topology file. No fitting: every figure is a measured kernel time, converted to
microseconds, with the GPU it was measured on ("measured_on": its name, dense peak in the table
dtype, HBM bandwidth), which the loader checks against the cluster's GPU.

usage: python3 make_ops_table.py OPS.jsonl SOURCE_TEXT --gpu NAME --peak-tflops X --hbm-gbps Y
           [--calibrate calibrate.txt] [--latency-correction] > ops.json
       python3 splice_ops.py ../dgx-h100.json ops.json "SENTENCE"   # write those tables into a topology in place

Tables for a GPU that was NOT measured are not made here: a cluster file says
"ops": {"source": ..., "derive": {"from": "<measured cluster>"}} and trainplan derives them at load by
its one rule (sim/op_costs.hpp, derive_op_costs); `trainplan cluster derive` writes such a file.

With a `trainplan calibrate --device cuda` output (--calibrate calibrate.txt), its square matmuls from 1024^3 up are
added as GEMM points (only the product a @ b was timed: dgrad and wgrad take the same time, an
assumption the table supports within about 10% where all three were measured). A shape measured twice
keeps its fastest time: interference only ever slows a kernel.

Launch latency. ops_bench.py times one call between two CUDA events right after a device
synchronise, so the GPU is idle when the start event is recorded and every figure includes the time
the host takes to issue the call (Python dispatch and launch) before the first kernel starts; in a
training step kernels are queued while the GPU is busy and that latency is hidden (host-bound
stretches are costed separately, from the software profile's host time per kernel). The latency is
estimated from the same file: the intercept of a least-squares line of time against bytes for the
two one-kernel memory-bound families (`add`: x + g, `gelu_tanh`: F.gelu), which run at a constant
bandwidth over the measured sizes, so their intercept is the fixed cost of one timed call. The
forward intercept is subtracted from every single-call figure of ops.jsonl (GEMMs, forward
passes, the AdamW step), the forward+backward intercept from every forward+backward figure,
before any scaling (the latency is the host's, not the GPU's). calibrate.txt's matmuls are timed
back to back (exec/calibrate.cpp) and carry no such latency; they are not corrected.
--latency-correction applies it (11.49 us per call, 32.09 us per forward+backward on
h100-ops.jsonl). The shipped tables do NOT. Rechecked on 2026-11-25 (commit c73455a, all sets of
tests/test_validation_*.cpp; mean absolute step error, shipped -> corrected):
  everything corrected:  trainplan exec 3.5% -> 10.8% (rows to -16%), PyTorch eager 7.2% -> 7.7%
    (llama-1b mb2 +15.2% -> +6.5%, gpt2-xl mb2 -6.1% -> -19.8%), torch.compile 11.5% -> 6.2%,
    Narayanan 2021 2.55% -> 3.25%, NeMo 24.12 FP8 3.86% -> 8.18%, Megatron-Bridge FP8 2.42% ->
    4.92%, Megatron-LM BF16 7.23% -> 6.96%;
  GEMMs and attention only: exec 5.7% with a row past 10%, eager 5.8%, compile 7.3%, NeMo 5.30%;
  memory-bound kernels only: exec 8.2% (gpt2-xl selective -12.4%), eager 5.6% (gpt2 -11.9%,
    gpt2-xl mb2 -14.2%), compile 7.8%, NeMo 6.15%;
  and with misaligned_gemm_slowdown refitted (3.5-4.5) on top of either, the gpt2 rows move back
  but trainplan exec keeps a row past 10% and gpt2-xl at micro-batch 2 stays 13-19% fast.
Nor are the GEMM outliers the cause: capping each pass at 1.2x the fastest of its shape's three (45
of the 49 shapes measured by ops_bench.py are within 1.18x) moves no set by more than 0.1 point
(llama-1b mb2 +15.2% -> +15.0%).
Every variant trades the two known misses for others: the latency-inflated small figures stand in
for costs the step model does not itemise (the gaps and host time between kernels of a real step,
clocks under sustained load). tests/gpu/remeasure.sh (phases sustained, profile) measures those
on a GPU; until then the measured figures are shipped as measured.
"""
import argparse
import json
import sys

ap = argparse.ArgumentParser(description="ops_bench.py JSON lines -> a topology's measured \"ops\" object")
ap.add_argument("ops_jsonl")
ap.add_argument("source", help="ops.source: where and how the figures were measured")
ap.add_argument("--gpu", required=True, help="name of the GPU measured (ops.measured_on.gpu)")
ap.add_argument("--peak-tflops", type=float, required=True, help="its dense bf16 datasheet peak")
ap.add_argument("--hbm-gbps", type=float, required=True, help="its HBM bandwidth, GB/s (datasheet)")
ap.add_argument("--calibrate", help="a trainplan calibrate --device cuda output on the same GPU")
ap.add_argument("--latency-correction", action="store_true")
args = ap.parse_args()
correct = args.latency_correction
rows = [json.loads(l) for l in open(args.ops_jsonl) if l.strip()]


def intercept(points):
    """Least-squares intercept (s) of time against bytes."""
    n = len(points)
    mx = sum(b for b, _ in points) / n
    my = sum(t for _, t in points) / n
    slope = sum((b - mx) * (t - my) for b, t in points) / sum((b - mx) ** 2 for b, _ in points)
    return my - slope * mx


one_kernel = [r for r in rows if r.get("op") in ("add", "gelu_tanh")]
lat_fwd = lat_fb = 0.0
if correct:
    fams = sorted({r["op"] for r in one_kernel})
    lat_fwd = sum(intercept([(r["tokens"] * r["hidden"], r["fwd_s"]) for r in one_kernel if r["op"] == f]) for f in fams) / len(fams)
    lat_fb = sum(intercept([(r["tokens"] * r["hidden"], r["fwdbwd_s"]) for r in one_kernel if r["op"] == f]) for f in fams) / len(fams)
    assert 0 < lat_fwd < lat_fb, (lat_fwd, lat_fb)
    print(f"launch latency removed: {lat_fwd * 1e6:.2f} us per call, {lat_fb * 1e6:.2f} us per forward+backward", file=sys.stderr)


def less(t, lat):
    """A measured time without the launch latency; refuses a correction that would remove half of it."""
    assert t - lat > 0.5 * t, (t, lat)
    return t - lat
us = lambda s: round(s * 1e6, 3)
ops = {"source": args.source,
       "measured_on": {"gpu": args.gpu, "peak_tflops": args.peak_tflops, "hbm_bandwidth_gbps": args.hbm_gbps},
       "dtype": "bf16", "kernel_floor_us": None, "gemm": [], "attention": [], "memory_bound": {}}
mem = ops["memory_bound"]
names = {"layer_norm": "layer_norm", "rms_norm": "rms_norm", "gelu_tanh": "gelu", "add": "add", "swiglu": "swiglu"}
gemm = {}
for r in rows:
    op = r.get("op")
    if op == "launch_overhead":
        ops["kernel_floor_us"] = round(r["per_kernel_us"], 3)
    elif op == "gemm":
        g = gemm.setdefault((r["tokens"], r["out"], r["inn"]), {"m": r["tokens"], "n": r["out"], "k": r["inn"]})
        g[r["kind"] + "_us"] = us(less(r["s"], lat_fwd))
    elif op == "sdpa_causal":
        ops["attention"].append({"seq": r["seq"], "head_dim": r["head_dim"], "batch_heads": r["batch"] * r["heads"],
                                 "fwd_us": us(less(r["fwd_s"], lat_fwd)),
                                 "fwd_bwd_us": us(less(r["fwdbwd_s"], lat_fb))})
    elif op in names:
        # bytes: the input activation (bf16, tokens x hidden); SwiGLU's input is gate+up (2 x hidden)
        b = r["tokens"] * r["hidden"] * 2 * (2 if op == "swiglu" else 1)
        mem.setdefault(names[op], []).append({"bytes": b, "fwd_us": us(less(r["fwd_s"], lat_fwd)),
                                              "fwd_bwd_us": us(less(r["fwdbwd_s"], lat_fb))})
    elif op == "cross_entropy_fp32":
        b = r["tokens"] * r["vocab"] * 2  # bf16 logits, cast to fp32 inside
        mem.setdefault("cross_entropy_fp32", []).append({"bytes": b, "fwd_us": us(less(r["fwd_s"], lat_fwd)),
                                                          "fwd_bwd_us": us(less(r["fwdbwd_s"], lat_fb))})
    elif op == "adamw":
        mem.setdefault("adamw_" + r["impl"], []).append({"bytes": r["params"] * 4, "step_us": us(less(r["s"], lat_fwd))})
if args.calibrate:
    import re
    for line in open(args.calibrate):
        m = re.match(r"\s*(\d+)\^3\s+\S+\s+([0-9.]+) ms", line)
        if m and int(m.group(1)) >= 1024:
            n, t = int(m.group(1)), us(float(m.group(2)) * 1e-3)
            g = gemm.setdefault((n, n, n), {"m": n, "n": n, "k": n, "fwd_us": t, "dgrad_us": t, "wgrad_us": t})
            for k in ("fwd_us", "dgrad_us", "wgrad_us"):
                g[k] = min(g[k], t)
ops["gemm"] = list(gemm.values())
for v in mem.values():
    v.sort(key=lambda p: p["bytes"])
print(json.dumps(ops))
