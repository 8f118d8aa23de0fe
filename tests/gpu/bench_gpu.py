"""Side-by-side GPU benchmark: on the same plans, `trainplan exec` and an equivalent
plain-PyTorch step (tests/gpu/pytorch_step.py: bf16 autocast, fp32 master weights, fused AdamW,
gradient accumulation), one process each, one after the other on the same GPU. Writes one JSON:
per plan both step times (median), both peak reserved (and allocated) figures and the ratios
exec/eager step, exec/eager reserved memory and, where torch.compile is run, exec/compile step.

  python3 tests/gpu/bench_gpu.py --trainplan build-gpu/trainplan --out reports/measurements/bench-gpu.json
      [--plans gpt2-xl-mb4,llama-1b-mb4,gpt2-xl-mb12] [--compile PLAN,...|all] [--steps 8 --warmup 3]
      [--phases] [--profile-dir DIR] [--exec-args '...'] [--cluster dgx-h200]

`make bench-gpu` runs it with the defaults. Needs a CUDA build of trainplan (bash
../shared/tools/gpu-build.sh, or cmake -DTRAINPLAN_EXEC_CUDA_MODE=ON) and PyTorch with a GPU.
The JSON is written to a temporary name and renamed after every plan, so an interrupted run
leaves the plans finished so far, never a partial file.
"""
import argparse
import datetime
import json
import os
import shlex
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The plans: the two measured in ../shared/reference/h100/README.md, and gpt2-xl at
# micro-batch 12, which ran out of memory (fragmentation) in the first executor while eager fit.
PLANS = {
    'gpt2-xl-mb4': dict(model='gpt2-xl', micro_batch=4, global_batch=32, seq=1024),
    'llama-1b-mb4': dict(model='llama-1b', micro_batch=4, global_batch=32, seq=2048),
    'gpt2-xl-mb12': dict(model='gpt2-xl', micro_batch=12, global_batch=48, seq=1024),
}


def write_atomic(path, obj):
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix='.bench-gpu.', dir=d)
    with os.fdopen(fd, 'w') as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write('\n')
    os.replace(tmp, path)


def tail(text, n=15):
    return '\n'.join(text.strip().splitlines()[-n:])


def run_exec(a, name, p):
    """One `trainplan exec` run in its own process; returns its figures or the failure."""
    fd, meas = tempfile.mkstemp(prefix=f'exec-{name}.', suffix='.json')
    os.close(fd)
    cmd = [a.trainplan, 'exec', '--cluster', a.cluster, '--gpus', '1',
           '--model', os.path.join(ROOT, 'models', p['model'] + '.json'),
           '--global-batch', str(p['global_batch']), '--micro-batch', str(p['micro_batch']),
           '--seq', str(p['seq']), '--dtype', 'bf16', '--recompute', 'none',
           '--steps', str(a.steps), '--warmup', str(a.warmup), '--json', meas] + shlex.split(a.exec_args)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
    out = dict(command=' '.join(shlex.quote(c) for c in cmd), exit_code=r.returncode)
    m = None
    if os.path.getsize(meas) > 0:
        with open(meas) as f:
            m = json.load(f)
    os.unlink(meas)
    if r.returncode != 0 or m is None or m.get('status', 'ok') != 'ok':
        out.update(status='failed', error=tail(r.stderr + r.stdout))
        if m is not None:
            out['measurement'] = m
        return out
    rank0 = m['memory']['per_rank'][0]
    out.update(status='ok', step_s=m['step_time']['median_s'], min_s=m['step_time']['min_s'],
               max_s=m['step_time']['max_s'], step_times_s=[s['wall_s'] for s in m['steps']],
               max_reserved_bytes=rank0['peak_reserved_bytes'], max_alloc_bytes=rank0['peak_allocated_bytes'],
               phases_s=m['time'], tokens_per_s=m['throughput']['tokens_per_s'],
               environment=m.get('environment', {}), summary=tail(r.stdout, 6))
    return out


def run_reference(a, name, p, mode):
    cmd = [a.python, os.path.join(ROOT, 'tests', 'gpu', 'pytorch_step.py'),
           '--model', os.path.join(ROOT, 'models', p['model'] + '.json'),
           '--micro-batch', str(p['micro_batch']), '--global-batch', str(p['global_batch']),
           '--seq', str(p['seq']), '--mode', mode, '--steps', str(a.steps), '--warmup', str(a.warmup)]
    if a.phases:
        cmd.append('--phases')
    if a.profile_dir and mode == 'eager':
        os.makedirs(a.profile_dir, exist_ok=True)
        cmd += ['--profile', os.path.join(a.profile_dir, f'eager-{name}.txt')]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
    out = dict(command=' '.join(shlex.quote(c) for c in cmd), exit_code=r.returncode)
    lines = [l for l in r.stdout.splitlines() if l.startswith('{')]
    if r.returncode != 0 or not lines:
        out.update(status='failed', error=tail(r.stderr + r.stdout))
        return out
    out.update(status='ok', **json.loads(lines[-1]))
    return out


def ratio(x, y, key):
    if x.get('status') != 'ok' or y.get('status') != 'ok':
        return None
    return x[key] / y[key]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--trainplan', default=os.path.join(ROOT, 'build-gpu', 'trainplan'))
    ap.add_argument('--python', default=sys.executable)
    ap.add_argument('--out', default=os.path.join(ROOT, 'reports', 'measurements', 'bench-gpu.json'))
    ap.add_argument('--plans', default=','.join(PLANS))
    ap.add_argument('--compile', default='', help="plans to also run under torch.compile: names, 'all' or empty")
    ap.add_argument('--steps', type=int, default=8)
    ap.add_argument('--warmup', type=int, default=3)
    ap.add_argument('--phases', action='store_true', help='reference: one extra step timed per phase')
    ap.add_argument('--profile-dir', default='', help='reference: PyTorch profiler kernel table per plan')
    ap.add_argument('--exec-args', default='', help='extra flags for trainplan exec')
    ap.add_argument('--cluster', default='dgx-h100',
                    help="exec's --cluster: the GPU its memory check assumes (dgx-h200 on an H200)")
    ap.add_argument('--timeout', type=float, default=900, help='seconds per run')
    ap.add_argument('--git-commit', default='', help="commit of the code measured (default: git rev-parse HEAD)")
    a = ap.parse_args()
    names = [n for n in a.plans.split(',') if n]
    for n in names:
        if n not in PLANS:
            sys.stderr.write(f'--plans {n}: unknown plan (known: {", ".join(PLANS)})\n')
            return 2
    if not os.access(a.trainplan, os.X_OK):
        sys.stderr.write(f'--trainplan {a.trainplan}: not an executable (build trainplan with CUDA first)\n')
        return 2
    compile_set = set(names) if a.compile == 'all' else {n for n in a.compile.split(',') if n}
    commit = a.git_commit
    try:
        commit = commit or subprocess.run(['git', '-C', ROOT, 'rev-parse', 'HEAD'], capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = ''
    report = dict(schema='trainplan/bench-gpu/v1', command=' '.join(shlex.quote(c) for c in sys.argv),
                  git_commit=commit, date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
                  steps=a.steps, warmup=a.warmup,
                  target='exec step time <= eager step time and exec peak reserved <= eager peak reserved',
                  notes='step time: median wall time of the measured steps; memory: peak reserved bytes of the '
                        'CUDA caching allocator over the whole run (warm-up included), each side in its own process',
                  plans=[])
    for n in names:
        p = PLANS[n]
        print(f'[bench-gpu] {n}: trainplan exec', flush=True)
        e = run_exec(a, n, p)
        print(f'[bench-gpu] {n}: pytorch eager', flush=True)
        r = run_reference(a, n, p, 'eager')
        entry = dict(plan=n, **p, exec=e, eager=r)
        entry['ratios'] = dict(exec_over_eager_step=ratio(e, r, 'step_s'),
                               exec_over_eager_reserved=ratio(e, r, 'max_reserved_bytes'))
        rs = entry['ratios']
        entry['meets_target'] = (rs['exec_over_eager_step'] is not None and rs['exec_over_eager_step'] <= 1.0
                                 and rs['exec_over_eager_reserved'] <= 1.0)
        report['plans'].append(entry)
        write_atomic(a.out, report)  # kept even if the compile run below never ends
        if n in compile_set:
            print(f'[bench-gpu] {n}: pytorch compile', flush=True)
            c = run_reference(a, n, p, 'compile')
            entry['compile'] = c
            entry['ratios']['exec_over_compile_step'] = ratio(e, c, 'step_s')
            write_atomic(a.out, report)
        fmt = lambda x: 'n/a' if x is None else f'{x:.3f}'
        print(f"[bench-gpu] {n}: exec {e.get('status')} {fmt(e.get('step_s'))} s "
              f"{fmt((e.get('max_reserved_bytes') or 0) / 1e9)} GB | eager {r.get('status')} {fmt(r.get('step_s'))} s "
              f"{fmt((r.get('max_reserved_bytes') or 0) / 1e9)} GB | exec/eager step {fmt(rs['exec_over_eager_step'])} "
              f"memory {fmt(rs['exec_over_eager_reserved'])} | exec/compile {fmt(rs.get('exec_over_compile_step'))}",
              flush=True)
    print(f'[bench-gpu] wrote {a.out}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
