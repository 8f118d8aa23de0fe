"""Burst against sustained GEMM rate on one GPU: whether the measured tables' burst rates hold for a whole step.

The dgx-h100 op tables come from single calls timed right after a synchronise on an idle GPU
(ops_bench.py) and from short back-to-back runs (trainplan calibrate). A training step keeps the
GPU busy for seconds, where a 700 W part may settle at a lower clock than in a short burst. This
script measures both for a few large bf16 GEMM shapes, on the same GPU, in one run:

  burst      each call alone: synchronise, sleep 50 ms (the GPU idles), time one call with CUDA events;
             the median of --calls calls
  sustained  calls back to back for --seconds, the rate over each --window seconds

and writes one JSON object: per shape the burst rate, the sustained rate per window, and the
ratio of the last third of the windows to the burst rate. tests/gpu/remeasure.sh runs it (phase
"sustained") while nvidia-smi samples SM clock, power and throttle reasons into clocks.csv, so the
two can be read side by side.

usage: python3 sustained_gemm.py --out FILE [--seconds S] [--window W] [--calls N] [--shapes MxNxK,...]
"""
import argparse
import json
import os
import statistics
import time

import torch


def burst_seconds(a, b, calls):
    times = []
    for _ in range(calls):
        torch.cuda.synchronize()
        time.sleep(0.05)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.matmul(a, b)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def sustained_rates(a, b, flops, seconds, window):
    """TFLOP/s in each window of back-to-back calls (one synchronise per window)."""
    rates = []
    t_end = time.monotonic() + seconds
    per_window = 1
    while time.monotonic() < t_end:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(per_window):
            torch.matmul(a, b)
        end.record()
        end.synchronize()
        s = start.elapsed_time(end) / 1e3
        rates.append({"t_s": round(seconds - (t_end - time.monotonic()), 3), "calls": per_window,
                      "tflops": flops * per_window / s / 1e12})
        # Size the next window to about `window` seconds of work.
        per_window = max(1, int(per_window * window / max(s, 1e-6)))
    return rates


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="JSON file to write")
    p.add_argument("--seconds", type=float, default=60, help="sustained run per shape (default 60)")
    p.add_argument("--window", type=float, default=1.0, help="seconds per sustained sample (default 1)")
    p.add_argument("--calls", type=int, default=20, help="isolated calls for the burst median (default 20)")
    p.add_argument("--shapes", default="8192x8192x8192,4096x4096x4096,8192x2048x8192",
                   help="MxNxK list (default: the 8192 square, the 4096 square, llama-1b's down projection at M=8192)")
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("sustained_gemm.py: needs a CUDA GPU")
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "dtype": "bf16",
           "seconds": args.seconds, "window_s": args.window, "shapes": []}
    for shape in args.shapes.split(","):
        m, n, k = (int(x) for x in shape.split("x"))
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        flops = 2.0 * m * n * k
        for _ in range(5):  # cuBLAS heuristics and workspace, not timed
            torch.matmul(a, b)
        torch.cuda.synchronize()
        burst = flops / burst_seconds(a, b, args.calls) / 1e12
        rates = sustained_rates(a, b, flops, args.seconds, args.window)
        tail = [r["tflops"] for r in rates[len(rates) * 2 // 3:]] or [rates[-1]["tflops"]]
        out["shapes"].append({"m": m, "n": n, "k": k, "burst_tflops": burst, "sustained": rates,
                              "sustained_last_third_tflops": statistics.median(tail),
                              "sustained_over_burst": statistics.median(tail) / burst})
        print(f"{shape}: burst {burst:.0f} TFLOP/s, sustained (last third) {statistics.median(tail):.0f} TFLOP/s "
              f"({statistics.median(tail) / burst:.3f} of burst)", flush=True)
        time.sleep(10)  # let the GPU cool a little before the next shape's burst
    with open(args.out + ".tmp", "w") as f:
        json.dump(out, f, indent=1)
    os.replace(args.out + ".tmp", args.out)


if __name__ == "__main__":
    main()
