import trainplan

print(f"{'tp':>3} {'zero':>4} {'step s':>8} {'peak GB':>8}  feasible")
for tp in (1, 2, 4, 8):
    for zero in (1, 2, 3):
        p = trainplan.predict(model="llama3-8b", cluster="dgx-h100", gpus=8, global_batch=64,
                              tp=tp, zero=zero, recompute="selective", sequence_parallel=tp > 1)
        peak = p["memory"]["peak_bytes"] / 1e9
        print(f"{tp:>3} {zero:>4} {p['time']['step_s']:>8.3f} {peak:>8.1f}  {p['feasible']}")
