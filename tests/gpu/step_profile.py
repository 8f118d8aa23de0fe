"""Kernel times inside a training step: what the op tables should hold, measured where they are used.

The dgx-h100 op tables are single calls timed on an idle GPU (ops_bench.py: each figure includes
the ~11 us a call takes to reach an idle GPU) and short back-to-back runs (trainplan calibrate).
tests/validation/test_validation_h100.cpp locates the remaining eager miss (llama-1b, micro-batch 2) in the
fixed cost per micro-batch and cannot tell from those tables whether the GEMM and memory-bound
rates at M = 4096 tokens, or the idle gaps between kernels, are what the model gets wrong. This
script answers it on the GPU: it runs one training step exactly as
tests/data/h100/pytorch_reference.py does (bf16 autocast over fp32 parameters, fused AdamW,
gradient accumulation), after warm-up steps, under torch.profiler, and writes per run:

  wall_s             the profiled step, host clock (synchronised)
  kernel_s           the sum of all GPU kernel durations (chrome trace, cat "kernel")
  busy_s, idle_s     the union of kernel intervals on the GPU, and wall - busy (gaps no kernel ran)
  kernels            the number of kernels launched
  by_class           kernel time and count per class: gemm, attention, optimizer, other (by name)
  top_kernels        the kernels that took the most time, by name: time and count
  gemm_shapes        per aten::mm / aten::addmm / aten::bmm input-shape group: calls and the mean
                     GPU time per call (self device time), the in-step figure to set against
                     `trainplan`'s table lookup for that M x N x K

usage: python3 step_profile.py --out FILE [RUN ...]     RUN = MODEL:MB:GB:SEQ[:compile]
       python3 step_profile.py --summarize TRACE [...]  the same kernel figures of chrome traces
                                                       written elsewhere (`trainplan exec --trace`)
       python3 step_profile.py --self-test             checks the trace summary on a made-up trace
                                                       (no GPU, no torch; run by ctest)
       (default: the three llama-1b eager rows and gpt2-medium compiled, as in pytorch_steps.jsonl)
MODEL is a model JSON path, or a name under models/ (llama-1b: tests/data/h100/llama-1b.json).
"""
import argparse
import importlib.util
import json
import os
import re
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DEFAULT_RUNS = ["llama-1b:2:32:2048", "llama-1b:4:32:2048", "llama-1b:8:32:2048", "gpt2-medium:8:64:1024:compile"]
CLASSES = [("attention", re.compile(r"flash|fmha|attention|sdpa", re.I)),
           ("gemm", re.compile(r"gemm|cutlass|xmma|nvjet", re.I)),
           ("optimizer", re.compile(r"adam", re.I))]
TOP_KERNELS = 25  # kernel names listed per run, by time


def write_json_atomic(path, obj):
    """Writes obj to path whole or not at all (a temporary name, then renamed)."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def load_reference():
    path = os.path.join(ROOT, "tests", "data", "h100", "pytorch_reference.py")
    spec = importlib.util.spec_from_file_location("pytorch_reference", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def model_file(name):
    if name == "llama-1b":
        return os.path.join(ROOT, "tests", "data", "h100", "llama-1b.json")
    return name if name.endswith(".json") else os.path.join(ROOT, "models", name + ".json")


def kernel_summary(trace_path):
    """Totals over the kernels of a chrome trace: time, busy union, count, by class."""
    events = json.load(open(trace_path)).get("traceEvents", [])
    kernels = [e for e in events if e.get("cat") == "kernel" and "dur" in e]
    spans = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in kernels)
    busy, end = 0.0, float("-inf")
    for a, b in spans:
        if a >= end:
            busy += b - a
            end = b
        elif b > end:
            busy += b - end
            end = b
    by_class, by_name = {}, {}
    for e in kernels:
        name = e.get("name", "")
        cls = next((c for c, rx in CLASSES if rx.search(name)), "other")
        for table, key in ((by_class, cls), (by_name, name)):
            entry = table.setdefault(key, {"kernel_s": 0.0, "kernels": 0})
            entry["kernel_s"] += float(e["dur"]) * 1e-6
            entry["kernels"] += 1
    top = sorted(by_name.items(), key=lambda kv: -kv[1]["kernel_s"])[:TOP_KERNELS]
    return {"kernel_s": sum(float(e["dur"]) for e in kernels) * 1e-6, "busy_s": busy * 1e-6,
            "span_s": (spans[-1][1] - spans[0][0]) * 1e-6 if spans else 0.0,
            "kernels": len(kernels), "by_class": by_class,
            "top_kernels": [dict(name=n[:160], **v) for n, v in top]}


def gemm_shapes(prof):
    out = []
    for evt in prof.key_averages(group_by_input_shape=True):
        if evt.key not in ("aten::mm", "aten::addmm", "aten::bmm"):
            continue
        dev = getattr(evt, "self_device_time_total", None)
        if dev is None:
            dev = getattr(evt, "self_cuda_time_total", 0)
        out.append({"op": evt.key, "input_shapes": str(evt.input_shapes), "calls": evt.count,
                    "mean_us": dev / max(evt.count, 1)})
    return sorted(out, key=lambda g: -g["mean_us"] * g["calls"])


def profile_run(ref, spec, trace_dir=None):
    import torch

    parts = spec.split(":")
    if len(parts) not in (4, 5) or (len(parts) == 5 and parts[4] != "compile"):
        raise SystemExit(f"step_profile.py: run '{spec}' is not MODEL:MB:GB:SEQ[:compile]")
    name, mb, gb, seq = parts[0], int(parts[1]), int(parts[2]), int(parts[3])
    compiled = len(parts) == 5
    m = json.load(open(model_file(name)))
    torch.manual_seed(0)
    net = ref.GPT(m, seq).cuda()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4, fused=True)
    fwd = torch.compile(net) if compiled else net
    n_micro = gb // mb
    data = torch.randint(0, m["vocab"], (n_micro, mb, seq + 1), device="cuda")

    def step():
        for i in range(n_micro):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = fwd(data[i, :, :-1].contiguous(), data[i, :, 1:].contiguous()) / n_micro
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts, record_shapes=True) as prof:
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        torch.cuda.synchronize()
    if trace_dir:
        trace = os.path.join(trace_dir, spec.replace(":", "_") + ".json")
    else:
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            trace = f.name
    try:
        prof.export_chrome_trace(trace)
        summary = kernel_summary(trace)
    finally:
        if not trace_dir:
            os.unlink(trace)
    wall = start.elapsed_time(end) / 1e3
    row = {"run": spec, "model": m["name"], "mb": mb, "gb": gb, "seq": seq, "compile": compiled, "wall_s": wall}
    row.update(summary)
    row["idle_s"] = wall - summary["busy_s"]
    row["gemm_shapes"] = gemm_shapes(prof)
    del net, opt, fwd
    torch.cuda.empty_cache()
    return row


def self_test():
    """kernel_summary on a trace with overlapping kernels, a gap and one kernel of each class."""
    us = lambda name, ts, dur: {"cat": "kernel", "name": name, "ts": ts, "dur": dur}
    events = [us("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", 0, 100),  # busy 0-100
              us("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTN", 50, 100),  # overlaps: busy to 150
              us("pytorch_flash::flash_fwd_kernel", 200, 40),  # gap 150-200
              us("multi_tensor_apply_kernel<FusedAdamMathFunctor>", 240, 10),
              us("vectorized_elementwise_kernel<add>", 250, 5),
              {"cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 500}]
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"traceEvents": events}, f)
    try:
        got = kernel_summary(f.name)
    finally:
        os.unlink(f.name)
    expect = {"kernels": 5, "kernel_s": 255e-6, "busy_s": 205e-6, "span_s": 255e-6}
    problems = [f"{k}: {got[k]} != {v}" for k, v in expect.items() if abs(got[k] - v) > 1e-12]
    classes = {c: e["kernels"] for c, e in got["by_class"].items()}
    if classes != {"gemm": 2, "attention": 1, "optimizer": 1, "other": 1}:
        problems.append(f"classes {classes}")
    names = [k["name"] for k in got["top_kernels"]]
    if names[:2] != ["sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTN"] or len(names) != 5:
        problems.append(f"top kernels {names}")
    if problems:
        raise SystemExit("step_profile.py self-test failed: " + "; ".join(problems))
    print("step_profile.py self-test: ok")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="JSON file to write (one object, runs in order)")
    ap.add_argument("--self-test", action="store_true", help="check the trace summary without a GPU and exit")
    ap.add_argument("--trace-dir", help="keep each run's chrome trace in this folder (MODEL_MB_GB_SEQ.json)")
    ap.add_argument("--summarize", nargs="+", metavar="TRACE",
                    help="summarize these chrome traces (no GPU needed) and exit; with --out, also write them")
    ap.add_argument("runs", nargs="*", default=DEFAULT_RUNS, help="MODEL:MB:GB:SEQ[:compile]")
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    if args.summarize:
        result = {"traces": [dict(trace=t, **kernel_summary(t)) for t in args.summarize]}
        for row in result["traces"]:
            print(json.dumps({k: v for k, v in row.items() if k != "top_kernels"}))
        if args.out:
            write_json_atomic(args.out, result)
        return None
    if not args.out:
        ap.error("--out is required")
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("step_profile.py: needs a CUDA GPU")
    ref = load_reference()
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "runs": []}
    for spec in args.runs:
        try:
            row = profile_run(ref, spec, args.trace_dir)
        except Exception as e:  # one failed run (out of memory, a compile error) must not lose the others
            row = {"run": spec, "error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
            torch.cuda.empty_cache()
        result["runs"].append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "gemm_shapes"}), flush=True)
        # Written after every run, whole or not at all, so a time limit keeps the runs that finished.
        write_json_atomic(args.out, result)

if __name__ == "__main__":
    main()
