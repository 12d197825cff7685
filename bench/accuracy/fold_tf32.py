"""The fold's arithmetic alone, on the CPU (no GPU needed): S <- dcy S + sum_j (w_j u_j) k_j^T every F tokens over a
(64 x 128) state, in float64 (the reference), in fp32 with one FMA per term in order (what the CUDA-core folds do), and
in 3xTF32 (each fp32 operand split into a truncated tf32 high part and a truncated tf32 remainder; hi hi + hi lo + lo hi
added to an fp32 accumulator that starts at dcy S), the accumulator rounded to nearest or truncated (toward zero: how
tensor cores are reported to align and add in fp32 accumulation; which of the two the H200 does is not measured here).
Question it answers (bench/NOTES.md, session 26): may an early fold on tensor cores write the fp32 checkpoint?

    python bench/accuracy/fold_tf32.py [per-token decay, default drawn]   # a few seconds on 2 cores

Results (session 26): fold_tf32_results.txt beside this script.
"""
import sys

import numpy as np

rng = np.random.default_rng(0)
R, K, F, folds = 64, 128, 8, 1000
MASK = np.uint32(0xffffe000)


def tf32(x):  # truncate an fp32 array to tf32
    return (x.astype(np.float32).view(np.uint32) & MASK).view(np.float32)


def split(x):  # x = hi + lo (lo truncated too)
    hi = tf32(x)
    return hi, tf32((x.astype(np.float32) - hi).astype(np.float32))


def rn(x64):  # to fp32, rounded to nearest
    return x64.astype(np.float32)


def rz(x64):  # to fp32, truncated (toward zero)
    f = x64.astype(np.float32)
    over = np.abs(f.astype(np.float64)) > np.abs(x64)
    f[over] = np.nextafter(f[over], np.float32(0))
    return f


def fp32_terms(wu, kj):  # one exact product a term: the fp32 FMA
    return ((wu, kj),)


def tf32x3_terms(wu, kj):  # 3xTF32: lo hi + hi lo + hi hi
    ah, al = split(wu)
    bh, bl = split(kj)
    return ((al, bh), (ah, bl), (ah, bh))


def fold(S, dcy, w, u, k, terms, rounding):
    """dcy S + sum_j (w_j u_j) k_j^T, each exact product added to the fp32 accumulator with one rounding."""
    acc = (S * dcy).astype(np.float32)
    for j in range(F):
        wu = (w[j] * u[j]).astype(np.float32)
        for p_, q_ in terms(wu, k[j]):
            acc = rounding(acc.astype(np.float64) + np.outer(p_.astype(np.float64), q_.astype(np.float64)))
    return acc


a = float(sys.argv[1]) if len(sys.argv) > 1 else np.exp(-rng.uniform(1e-4, 1e-2, size=(1,)))[0]  # per-token decay of this head
S64 = rng.standard_normal((R, K)) * 0.1
S32 = S64.astype(np.float32); Stc = S32.copy(); Srz = S32.copy()
errs = []
for f in range(folds):
    u = (rng.standard_normal((F, R)) * 0.05).astype(np.float32)
    k = rng.standard_normal((F, K)); k /= np.linalg.norm(k, axis=1, keepdims=True); k = k.astype(np.float32)
    w = np.array([a ** (F - 1 - j) for j in range(F)], dtype=np.float32)  # decay weights
    dcy = np.float32(a ** F)
    S64 = float(dcy) * S64 + sum(float(w[j]) * np.outer(u[j].astype(np.float64), k[j].astype(np.float64)) for j in range(F))
    S32 = fold(S32, dcy, w, u, k, fp32_terms, rn)  # the CUDA-core fold
    Stc = fold(Stc, dcy, w, u, k, tf32x3_terms, rn)  # tensor cores, accumulator rounded to nearest
    Srz = fold(Srz, dcy, w, u, k, tf32x3_terms, rz)  # tensor cores, accumulator truncated
    if (f + 1) in (10, 100, 500, 1000):
        n = np.linalg.norm(S64)
        errs.append((f + 1, np.linalg.norm(S32 - S64) / n, np.linalg.norm(Stc - S64) / n, np.linalg.norm(Srz - S64) / n))
print(f"decay per token {a:.5f}, {F} tokens a fold")
for f, e32, etc, erz in errs:
    print(f"after {f:5d} folds: fp32 FMA {e32:.2e}   3xTF32 {etc:.2e} ({etc / e32:.2f}x)   3xTF32, accumulator truncated {erz:.2e} ({erz / e32:.2f}x)")
