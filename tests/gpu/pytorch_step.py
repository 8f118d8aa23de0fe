"""Plain-PyTorch training step for the decoder models `trainplan exec` runs: the yardstick of the
side-by-side GPU benchmark (bench_gpu.py). One GPU, bf16 autocast, fp32 parameters (master
weights), fused AdamW, gradient accumulation over micro-batches; the median step of `--steps` after
`--warmup` discarded, and the CUDA caching allocator's peak allocated and reserved bytes.

Based on ../shared/reference/h100/pytorch_reference.py (the script behind
../shared/reference/h100/pytorch_steps.jsonl, measured on one H100 on 2026-11-22): same model
shapes and step, written again here so the project carries its own copy. It reads a trainplan
model file (models/*.json) and prints one JSON line.

  python3 tests/gpu/pytorch_step.py --model models/gpt2-xl.json --micro-batch 4 --global-batch 32 \
      --seq 1024 --mode eager [--phases] [--profile FILE]

--phases adds one extra step (not among the timed ones) timed with CUDA events per phase
(forward, backward, optimizer); --profile writes the PyTorch profiler's kernel table of one more
step to FILE.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    """One pre-norm decoder layer: GPT-2 (LayerNorm, biases, GELU) or Llama (RMSNorm, no biases,
    SwiGLU, RoPE, grouped-query attention)."""

    def __init__(self, m):
        super().__init__()
        h, heads, kv = m['hidden'], m['heads'], m['kv_heads']
        self.heads, self.kv, self.d = heads, kv, h // heads
        llama = m['norm'] == 'rmsnorm'
        norm = (lambda: nn.RMSNorm(h)) if llama else (lambda: nn.LayerNorm(h))
        self.n1, self.n2 = norm(), norm()
        self.qkv = nn.Linear(h, (heads + 2 * kv) * self.d, bias=not llama)
        self.o = nn.Linear(heads * self.d, h, bias=not llama)
        self.swiglu = m['activation'] == 'swiglu'
        f = m['ffn_hidden']
        self.up = nn.Linear(h, 2 * f if self.swiglu else f, bias=not self.swiglu)
        self.down = nn.Linear(f, h, bias=not self.swiglu)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q, k, v = self.qkv(self.n1(x)).split([self.heads * self.d, self.kv * self.d, self.kv * self.d], -1)
        q = q.view(B, T, self.heads, self.d).transpose(1, 2)
        k = k.view(B, T, self.kv, self.d).transpose(1, 2)
        v = v.view(B, T, self.kv, self.d).transpose(1, 2)
        if cos is not None:  # RoPE, rotate-half form
            def rot(t):
                a, b = t.chunk(2, -1)
                return torch.cat((-b, a), -1)
            q = q * cos + rot(q) * sin
            k = k * cos + rot(k) * sin
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv != self.heads)
        x = x + self.o(y.transpose(1, 2).reshape(B, T, self.heads * self.d))
        u = self.up(self.n2(x))
        if self.swiglu:
            a, g = u.chunk(2, -1)
            u = F.silu(a) * g
        else:
            u = F.gelu(u, approximate='tanh')
        return x + self.down(u)


class GPT(nn.Module):
    def __init__(self, m, seq):
        super().__init__()
        h = m['hidden']
        self.wte = nn.Embedding(m['vocab'], h)
        self.wpe = nn.Embedding(seq, h) if m['position'] == 'learned' else None
        self.blocks = nn.ModuleList(Block(m) for _ in range(m['layers']))
        self.nf = nn.RMSNorm(h) if m['norm'] == 'rmsnorm' else nn.LayerNorm(h)
        self.head = None if m['tied_embeddings'] else nn.Linear(h, m['vocab'], bias=False)
        d = h // m['heads']
        if m['position'] == 'rope':  # base 10000, as trainplan exec
            inv = 10000.0 ** (-torch.arange(0, d, 2).float() / d)
            e = torch.outer(torch.arange(seq).float(), inv)
            e = torch.cat((e, e), -1)
            self.register_buffer('cos', e.cos()[None, None], persistent=False)
            self.register_buffer('sin', e.sin()[None, None], persistent=False)
        else:
            self.cos = self.sin = None

    def forward(self, idx, tgt):
        x = self.wte(idx)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x, self.cos, self.sin)
        x = self.nf(x)
        logits = x @ (self.wte.weight if self.head is None else self.head.weight).t()
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), tgt.reshape(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--model', required=True, help='trainplan model file (models/*.json)')
    ap.add_argument('--micro-batch', type=int, required=True)
    ap.add_argument('--global-batch', type=int, required=True)
    ap.add_argument('--seq', type=int, required=True)
    ap.add_argument('--mode', choices=['eager', 'compile'], default='eager')
    ap.add_argument('--steps', type=int, default=10)
    ap.add_argument('--warmup', type=int, default=3)
    ap.add_argument('--phases', action='store_true')
    ap.add_argument('--profile', default='')
    a = ap.parse_args()
    m = json.load(open(a.model))
    if a.global_batch % a.micro_batch:
        sys.exit(f'--global-batch {a.global_batch}: must be a multiple of --micro-batch {a.micro_batch}')
    n_micro = a.global_batch // a.micro_batch

    torch.manual_seed(0)
    net = GPT(m, a.seq).cuda()
    params = sum(p.numel() for p in net.parameters())
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4, fused=True)
    fwd = torch.compile(net) if a.mode == 'compile' else net
    data = torch.randint(0, m['vocab'], (n_micro, a.micro_batch, a.seq + 1), device='cuda')

    def step(ev=None):
        # ev: optional list collecting (phase, start event, end event)
        def mark():
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        for i in range(n_micro):
            t0 = mark() if ev is not None else None
            with torch.autocast('cuda', dtype=torch.bfloat16):
                loss = fwd(data[i, :, :-1].contiguous(), data[i, :, 1:].contiguous()) / n_micro
            t1 = mark() if ev is not None else None
            loss.backward()
            if ev is not None:
                t2 = mark()
                ev += [('forward', t0, t1), ('backward', t1, t2)]
        t3 = mark() if ev is not None else None
        opt.step()
        opt.zero_grad(set_to_none=True)
        if ev is not None:
            ev.append(('optimizer', t3, mark()))
        return loss

    torch.cuda.reset_peak_memory_stats()
    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(a.steps):
        t = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    ts = sorted(times)
    med = ts[len(ts) // 2] if len(ts) % 2 else 0.5 * (ts[len(ts) // 2 - 1] + ts[len(ts) // 2])
    out = dict(ref='pytorch-' + a.mode, model=m['name'], micro_batch=a.micro_batch, global_batch=a.global_batch,
               seq=a.seq, params=params, steps=a.steps, warmup=a.warmup, step_s=med, min_s=ts[0], max_s=ts[-1],
               step_times_s=times, tokens_per_s=a.global_batch * a.seq / med,
               max_alloc_bytes=torch.cuda.max_memory_allocated(), max_reserved_bytes=torch.cuda.max_memory_reserved(),
               torch_version=torch.__version__, device=torch.cuda.get_device_name(),
               alloc_conf=os.environ.get('PYTORCH_ALLOC_CONF', os.environ.get('PYTORCH_CUDA_ALLOC_CONF', 'default')))
    if a.phases:
        ev = []
        step(ev)
        torch.cuda.synchronize()
        ph = {}
        for name, s, e in ev:
            ph[name] = ph.get(name, 0.0) + s.elapsed_time(e) / 1e3
        out['phases_s'] = ph
    if a.profile:
        from torch.profiler import profile, ProfilerActivity
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
        with open(a.profile, 'w') as f:
            try:
                table = prof.key_averages().table(sort_by='device_time_total', row_limit=40, max_name_column_width=70)
            except Exception:  # older PyTorch names the key after CUDA
                table = prof.key_averages().table(sort_by='cuda_time_total', row_limit=40, max_name_column_width=70)
            f.write(table)
    print(json.dumps(out), flush=True)


if __name__ == '__main__':
    main()
