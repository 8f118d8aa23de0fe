#!/usr/bin/env python3
"""The shared reference rows (published_runs.json: a model config, a cluster, the layout in
trainplan's flag spelling, the published step time) predicted through the command line as a user
with only those would run them: `trainplan predict --model CONFIG --cluster C <flags>`, every other
setting at its default. Prints each row's error and the mean absolute error.

  python3 tests/validation/reference_rows_cli.py --trainplan build/trainplan \\
      --reference ../shared/reference/moe_blackwell/published_runs.json [--part moe|blackwell_dense] [--mxfp8]

--mxfp8 runs the rows whose precision label is mxfp8 in that format (the file's flags spell it
fp8). Not part of `make test`: the reference file lives outside the repository.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trainplan", required=True, help="the trainplan binary")
    ap.add_argument("--reference", required=True, help="published_runs.json")
    ap.add_argument("--part", default="moe", help="the file's list of rows (moe, blackwell_dense)")
    ap.add_argument("--mxfp8", action="store_true", help="run rows labelled mxfp8 with --dtype mxfp8")
    a = ap.parse_args()
    rows = json.load(open(a.reference))[a.part]
    errors = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, r in enumerate(rows):
            model, out = os.path.join(tmp, f"model{i}.json"), os.path.join(tmp, f"out{i}.json")
            json.dump(r["model"], open(model, "w"))
            cmd = [a.trainplan, "predict", "--model", model, "--cluster", r["cluster"], "--json", out]
            for k, v in r["flags"].items():
                if k == "dtype" and a.mxfp8 and r.get("precision") == "mxfp8":
                    v = "mxfp8"
                cmd += [f"--{k}", str(v)]
            p = subprocess.run(cmd, capture_output=True, text=True)
            if p.returncode not in (0, 3):  # 3: predicted, but out of memory
                print(f"{i:2d} not predicted: {p.stderr.strip()}")
                continue
            step = json.load(open(out))["time"]["step_s"]
            err = step / r["expected_step_s"] - 1
            errors.append(abs(err))
            f = r["flags"]
            print(f"{i:2d} {r['cluster']:12s} {r.get('container', ''):9s} {f['gpus']:4d} GPUs tp{f['tp']} pp{f['pp']} "
                  f"vp{f.get('vp', 1)} ep{f.get('ep', 1)} {r.get('precision', ''):7s} predicted {step:7.2f} s "
                  f"published {r['expected_step_s']:7.2f} s error {100 * err:+6.1f}%")
    if not errors:
        print("no row predicted")
        return 1
    print(f"{len(errors)} of {len(rows)} rows predicted: mean absolute error {100 * sum(errors) / len(errors):.1f}%, "
          f"worst {100 * max(errors):.1f}%, {sum(e <= 0.2 for e in errors)} within 20%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
