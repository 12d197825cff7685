"""Does a dependent slot-id load slow a fla-shaped GDN step? A minimal Triton kernel of fla's shape (one warp per
program, a [8 rows x K] tile of the V-first state [slots, HV, V, K], loaded once, updated, stored), timed with and
without reading its slot from slot_ids first, in place and out of place (session 9's question about gdn_step;
bench/NOTES.md). Batch 256, HV=32, H=16, K=V=128, fp32 state, bf16 q/k/v; CUDA events, median of 20 launches.

    python bench/slot_probe.py
"""
import torch
import triton
import triton.language as tl


@triton.jit
def gdn_tile_step(q, k, v, g, beta, o, h0, ht, slot_ids, HV: tl.constexpr, H: tl.constexpr, K: tl.constexpr,
                  V: tl.constexpr, BV: tl.constexpr, USE_SLOTS: tl.constexpr):
    pid = tl.program_id(0)
    i_v, i_nh = pid % (V // BV), pid // (V // BV)
    i_n, i_hv = i_nh // HV, i_nh % HV
    i_h = i_hv // (HV // H)
    cols = tl.arange(0, K)
    rows = i_v * BV + tl.arange(0, BV)
    if USE_SLOTS:
        slot = tl.load(slot_ids + i_n).to(tl.int64)
    else:
        slot = i_n.to(tl.int64)
    tile = (slot * HV + i_hv) * K * V + rows[:, None] * K + cols[None, :]
    h = tl.load(h0 + tile)
    bq = tl.load(q + (i_n * H + i_h) * K + cols).to(tl.float32)
    bk = tl.load(k + (i_n * H + i_h) * K + cols).to(tl.float32)
    bv = tl.load(v + (i_n * HV + i_hv) * V + rows).to(tl.float32)
    bq = bq / tl.sqrt(tl.sum(bq * bq) + 1e-6)
    bk = bk / tl.sqrt(tl.sum(bk * bk) + 1e-6)
    h = h * tl.exp(tl.load(g + i_nh))
    u = tl.load(beta + i_nh) * (bv - tl.sum(h * bk[None, :], 1))
    h = h + u[:, None] * bk[None, :]
    tl.store(o + (i_n * HV + i_hv) * V + rows, tl.sum(h * bq[None, :], 1).to(o.dtype.element_ty))
    tl.store(ht + tile, h)


def main():
    B, HV, H, K, V, BV = 256, 32, 16, 128, 128, 8
    dev = "cuda"
    q, k = (torch.randn(B, H, K, device=dev, dtype=torch.bfloat16) for _ in range(2))
    v = torch.randn(B, HV, V, device=dev, dtype=torch.bfloat16)
    g = -torch.rand(B, HV, device=dev) * 0.1
    beta = torch.rand(B, HV, device=dev)
    o = torch.empty_like(v)
    h0 = torch.randn(B, HV, V, K, device=dev) * 0.1
    h1 = torch.empty_like(h0)
    slots = torch.arange(B, device=dev, dtype=torch.int32)
    grid = (B * HV * (V // BV),)
    nbytes = 2 * h0.numel() * 4

    def run(use_slots, in_place):
        gdn_tile_step[grid](q, k, v, g, beta, o, h0, h0 if in_place else h1, slots, HV=HV, H=H, K=K, V=V, BV=BV,
                            USE_SLOTS=use_slots, num_warps=1)

    cases = [(False, False), (True, False), (False, True), (True, True)]
    for c in cases:  # compile and warm up
        for _ in range(3):
            run(*c)
    torch.cuda.synchronize()
    times = {c: [] for c in cases}
    for _ in range(20):  # interleaved
        for c in cases:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            run(*c)
            e.record()
            e.synchronize()
            times[c].append(s.elapsed_time(e) * 1e3)
    for (use_slots, in_place), t in times.items():
        t = sorted(t)[len(t) // 2]
        print(f"slots {'read' if use_slots else 'none'}  {'in place    ' if in_place else 'out of place'}  "
              f"{t:7.1f} us  {nbytes / t / 1e6:.2f} TB/s")


if __name__ == "__main__":
    main()
