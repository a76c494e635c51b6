import time, statistics, torch
from multispec.api import load_pair
pair = load_pair(compile=True)
for m in (pair.draft, pair.target):
    c = m.new_cache()
    m.forward(c, torch.randint(100, 2000, (1, 300)))
    def step():
        m.forward(c, torch.tensor([[42]])); m.crop(c, 300)
    for _ in range(5): step()
    def timeit(f, n=60):
        ts = []
        for _ in range(n):
            t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
        return statistics.median(ts) * 1e3
    for r in range(2):
        a = timeit(step)
        with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
            b = timeit(step)
        print(m.name, f"forward {a:.2f} ms, guards skipped {b:.2f} ms", flush=True)
    # guard count
    import torch._dynamo as d
    fn = m._compiled[m.kernels[(1, 1)]]
