"""Out-of-place copy against in-place read-modify-write bandwidth on the GPU (session 9's question: is the ceiling
of an in-place state update, such as gdn_step and mamba2_step, the copy bandwidth?). 1 GiB fp32 tensors, CUDA
events, median of 20 launches after warm-up; each kernel reads and writes every byte once.

    python bench/inplace_bw.py
"""
import torch

n = (1 << 30) // 4
a = torch.randn(n, device="cuda")
b = torch.empty_like(a)


def bw(fn, reps=20):
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1e-3)
    t = sorted(times)[len(times) // 2]
    return 2 * a.numel() * 4 / t / 1e12


for _ in range(2):
    print(f"copy b <- a (out of place)  {bw(lambda: b.copy_(a)):.3f} TB/s")
    print(f"b = a * 1.0001 (out of place) {bw(lambda: torch.mul(a, 1.0001, out=b)):.3f} TB/s")
    print(f"a *= 1.0001 (in place)        {bw(lambda: a.mul_(1.0001)):.3f} TB/s")
