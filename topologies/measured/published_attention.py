"""Writes published attention-kernel rates into a topology's "ops.attention_kernels" (trainplan/cluster/v2).

usage: python3 published_attention.py ../dgx-h100.json     # rewrites the file in place

The cluster's "ops.attention" table is the kernel the calibration ran (PyTorch 2.11 SDPA on the
shipped H100 files, a Hopper kernel). Stacks that run another attention kernel name it in their
software profile (attention.kernel); its rates on this GPU live here, one entry per kernel.

"flash2": FlashAttention-2 on one H100 80GB SXM5, bf16, as published in Shah et al. 2024,
"FlashAttention-3: Fast and Accurate Attention with Asynchrony and Low-precision" (arXiv 2407.08608),
Figure 5 (forward, with causal mask, head dims 64 and 128) and Figure 6 (backward, head dims 64 and
128), the FlashAttention-2 bars, TFLOP/s by sequence length 512-16k. FlashAttention-2 has no Hopper
(wgmma/TMA) code path: it runs at about 35% of the H100's bf16 peak, as the paper says, against
55-60% for the calibrated kernel at long sequences. Setup of the figures: batch x sequence = 16k
tokens, hidden 2048 (heads = 2048 / head_dim), FLOPs counted as 4 seq^2 head_dim heads batch,
halved with the causal mask, backward 2.5x the forward. Assumed: the backward bars are read as the
rate of a causal backward (FLOPs counted causally); trainplan's attention table counts causal
FLOPs the same way (sim/op_costs.hpp), so the points below are those FLOPs at those rates.
"""
import json, sys

SEQS = [512, 1024, 2048, 4096, 8192, 16384]
FLASH2 = {  # head_dim: (forward causal TFLOP/s, backward TFLOP/s), by SEQS
    64: ([180, 229, 262, 284, 295, 299], [198, 238, 264, 279, 287, 291]),
    128: ([191, 260, 298, 319, 333, 335], [214, 260, 291, 310, 318, 322]),
}
SOURCE = ("FlashAttention-2 on one H100 80GB SXM5, bf16: Shah et al. 2024 (FlashAttention-3, arXiv 2407.08608), "
          "Fig. 5 forward with causal mask and Fig. 6 backward, head dims 64 and 128, seq 512-16k; batch x seq = 16k "
          "tokens, hidden 2048; written by topologies/measured/published_attention.py (the backward bars assumed to "
          "hold for a causal backward)")


def points():
    out = []
    for d, (fwd, bwd) in FLASH2.items():
        for s, f_tf, b_tf in zip(SEQS, fwd, bwd):
            batch_heads = 16384 // s * (2048 // d)
            flops = 2.0 * s * s * d * batch_heads  # causal forward, as sim/op_costs.cpp counts it
            fwd_us = flops / (f_tf * 1e12) * 1e6
            bwd_us = 2.5 * flops / (b_tf * 1e12) * 1e6
            out.append({"seq": s, "head_dim": d, "batch_heads": batch_heads,
                        "fwd_us": round(fwd_us, 3), "fwd_bwd_us": round(fwd_us + bwd_us, 3)})
    return out


def row(p):
    return "{" + ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in p.items()) + "}"


path = sys.argv[1]
text = open(path).read()
block = ('    "attention_kernels": {\n      "flash2": {\n        "source": ' + json.dumps(SOURCE) + ',\n'
         '        "points": [\n' + ",\n".join("          " + row(p) for p in points()) + "\n        ]\n      }\n    },\n")
if '    "attention_kernels": {' in text:  # replace the earlier block
    start = text.index('    "attention_kernels": {')
    end = text.index('    "memory_bound": {', start)
    text = text[:start] + block + text[end:]
else:
    at = text.index('    "memory_bound": {', text.index('    "attention": ['))
    text = text[:at] + block + text[at:]
check = json.loads(text)["ops"]["attention_kernels"]["flash2"]
assert check["points"] == points() and check["source"] == SOURCE
open(path, "w").write(text)
