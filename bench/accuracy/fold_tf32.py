"""The fold's arithmetic alone, on the CPU (no GPU needed): S <- dcy S + sum_j (w_j u_j) k_j^T every F tokens over a
(64 x 128) state, in float64 (the reference), in fp32 with one FMA per term in order (what the CUDA-core folds do), and
in 3xTF32 (each fp32 operand split into a truncated tf32 high part and a truncated tf32 remainder; hi hi + hi lo + lo hi
added to an fp32 accumulator that starts at dcy S), the accumulator rounded to nearest or truncated (toward zero: how
tensor cores are reported to align and add in fp32 accumulation; which of the two the H200 does is not measured here).
Question it answers (bench/NOTES.md, session 26): may an early fold on tensor cores write the fp32 checkpoint?

    python bench/accuracy/fold_tf32.py [per-token decay, default drawn]   # ~1-3 min on 2 cores
"""
import numpy as np
rng = np.random.default_rng(0)
R, K, F, folds = 64, 128, 8, 1000
MASK = np.uint32(0xffffe000)
def tf32(x):  # truncate an fp32 array to tf32
    return (x.astype(np.float32).view(np.uint32) & MASK).view(np.float32)
def split(x):
    hi = tf32(x); lo = tf32((x.astype(np.float32) - hi).astype(np.float32)); return hi, lo
import sys
a = float(sys.argv[1]) if len(sys.argv) > 1 else np.exp(-rng.uniform(1e-4, 1e-2, size=(1,)))[0]  # per-token decay of this head
S64 = rng.standard_normal((R, K)) * 0.1
S32 = S64.astype(np.float32); Stc = S32.copy(); Srz = S32.copy()
def rz(x64):
    f = x64.astype(np.float32)
    over = np.abs(f.astype(np.float64)) > np.abs(x64)
    f[over] = np.nextafter(f[over], np.float32(0))
    return f
errs = []
for f in range(folds):
    u = (rng.standard_normal((F, R)) * 0.05).astype(np.float32)
    k = rng.standard_normal((F, K)); k /= np.linalg.norm(k, axis=1, keepdims=True); k = k.astype(np.float32)
    w = np.array([a ** (F - 1 - j) for j in range(F)], dtype=np.float32)  # decay weights
    dcy = np.float32(a ** F)
    # reference
    S64 = float(dcy) * S64 + sum(float(w[j]) * np.outer(u[j].astype(np.float64), k[j].astype(np.float64)) for j in range(F))
    # fp32 sequential FMAs (fmaf emulated by float64 then rounding: exact product + add, one rounding)
    x = (S32 * dcy).astype(np.float32)
    for j in range(F):
        wu = (w[j] * u[j]).astype(np.float32)
        x = (x.astype(np.float64) + np.outer(wu.astype(np.float64), k[j].astype(np.float64))).astype(np.float32)
    S32 = x
    # 3xTF32: A = wu (rows x j), B = k (j x cols); accumulator C = dcy * S in fp32
    acc = (Stc * dcy).astype(np.float32)
    for j in range(F):
        wu = (w[j] * u[j]).astype(np.float32)
        ah, al = split(wu); bh, bl = split(k[j])
        for p_, q_ in ((al, bh), (ah, bl), (ah, bh)):
            acc = (acc.astype(np.float64) + np.outer(p_.astype(np.float64), q_.astype(np.float64))).astype(np.float32)
    Stc = acc
    acc = (Srz * dcy).astype(np.float32)
    for j in range(F):
        wu = (w[j] * u[j]).astype(np.float32)
        ah, al = split(wu); bh, bl = split(k[j])
        for p_, q_ in ((al, bh), (ah, bl), (ah, bh)):
            acc = rz(acc.astype(np.float64) + np.outer(p_.astype(np.float64), q_.astype(np.float64)))
    Srz = acc
    if (f + 1) in (10, 100, 500, 1000):
        n = np.linalg.norm(S64)
        errs.append((f + 1, np.linalg.norm(S32 - S64) / n, np.linalg.norm(Stc - S64) / n, np.linalg.norm(Srz - S64) / n))
print(f"decay per token {a:.5f}, {F} tokens a fold")
for f, e32, etc, erz in errs: print(f"after {f:5d} folds: fp32 FMA {e32:.2e}   3xTF32 {etc:.2e} ({etc / e32:.2f}x)   3xTF32, accumulator truncated {erz:.2e} ({erz / e32:.2f}x)")
