#!/usr/bin/env python3
"""Lane-level emulation of the keys-as-M MLA decode kernel (mla_attention_wgmma_keys.cu of
bench/results/2026-12-06-session39-mla-keys-m.patch), written after its code, to check its index
math without a GPU: the loader's swizzled tiles (swz), the wgmma operands read through their
shared-memory descriptors (K-major and MN-major, 128-byte swizzle, as the PTX ISA describes the
canonical layouts: an 8-row atom of 128-byte rows, 16-byte chunk c of row r at c ^ (r % 8)), the
m64n16 accumulator fragments (d[4 i + 2 h + e] = D[16 w + g + 8 h][8 i + 2 q + e]), the softmax
along the keys with its lane and warp reductions, P in its [16 rows][64 keys] tile (p_off), the
rescaled P·V, the rows' sums and the paired column stores. Compared with float64 attention over
the same bf16 values, masks included (causal rows of several new tokens; keys past a split's end).

Needs numpy (Debian: python3-numpy). Run: python3 bench/cuda/mla_keys_emulate.py
"""
import sys

import numpy as np

CHUNK, D, R, GROUPS, QROWS = 64, 576, 512, 9, 16


def bf16(x):
    """float -> bf16 (round to nearest even) -> float32, as pack_bf16x2."""
    a = np.asarray(x, np.float32)
    b = np.atleast_1d(a).view(np.uint32).astype(np.uint64)
    one, sh = np.uint64(1), np.uint64(16)
    b = ((b + np.uint64(0x7FFF) + ((b >> sh) & one)) >> sh) << sh
    return b.astype(np.uint32).view(np.float32).reshape(a.shape)


def swz(r, c, rows):
    """kernel swz: byte offset of 16-byte piece c of row r in a [groups][rows][64] bf16 tile."""
    return (c >> 3) * rows * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4)


def p_off(n, key):
    return n * 128 + (((key >> 3) ^ (n & 7)) << 4) + (key & 7) * 2


class Smem:
    """bf16 values at byte addresses (the tiles' values as float32 of bf16)."""

    def __init__(self, size):
        self.v = np.full(size // 2, np.nan, np.float32)

    def put(self, addr, vals):  # consecutive bf16 from a byte address
        self.v[addr // 2: addr // 2 + len(vals)] = vals

    def get(self, addrs):
        return self.v[np.asarray(addrs) // 2]


def swizzled(addr):
    return addr ^ (((addr >> 7) & 7) << 4)


def operand(sm, start, sbo, lbo, rows, k16, mn_major):
    """The [rows x 16] operand a descriptor names (K-major: row r's 16 values at start + r's
    atom offset; MN-major: rows (M or N) contiguous, K rows 128 bytes apart)."""
    r = np.arange(rows)[:, None]
    k = np.arange(k16)[None, :]
    if not mn_major:
        base = start + (r // 8) * sbo + (r % 8) * 128 + k * 2
    else:
        base = start + (k // 8) * sbo + (k % 8) * 128 + (r // 64) * lbo + (r % 64) * 2
    return sm.get(swizzled(base))


def wgmma(dacc, sm, a_start, a_sbo, a_lbo, ta, b_start, b_sbo, n, scale_d):
    """D[64 x n] (+)= A[64 x 16] · B[16 x n] in float64 (the accumulators as a full matrix)."""
    a = operand(sm, a_start, a_sbo, a_lbo, 64, 16, ta == 1).astype(np.float64)
    b = operand(sm, b_start, b_sbo, 0, n, 16, False).astype(np.float64)  # B K-major: [n][16]
    prod = a @ b.T
    return prod if not scale_d else dacc + prod


def frag(dm, w, lane):
    """The m64n16 accumulator fragment of warp w's lane from the full matrix."""
    g, q = lane // 4, lane % 4
    out = np.zeros(8)
    for i in range(2):
        for h in range(2):
            for e in range(2):
                out[4 * i + 2 * h + e] = dm[16 * w + g + 8 * h, 8 * i + 2 * q + e]
    return out


def row_of(k, q):
    return 8 * (k >> 1) + 2 * q + (k & 1)


def fast_exp2(x):
    with np.errstate(over="ignore"):
        return np.exp2(np.float32(x))


def run_block(K, Qm, begin, end, lims, rows, scale_log2):
    """One block: keys [begin, end) of K (bf16 values [n][576]), Qm [16][576] (rows past `rows`
    zero), lims[16] each row's key limit. Returns (out [16][512] normalized, m, l) per row."""
    n_chunks = (end - begin + CHUNK - 1) // CHUNK if end > begin else 0
    QOFF, KOFF = 0, QROWS * D * 2
    TILE = CHUNK * D * 2
    POFF = KOFF + 2 * TILE
    sm = Smem(POFF + QROWS * CHUNK * 2)
    for qr in range(QROWS):
        for c in range(D // 8):
            sm.put(QOFF + swz(qr, c, QROWS), Qm[qr, 8 * c: 8 * c + 8])

    def load(c):
        dst = KOFF + (c & 1) * TILE
        for r in range(CHUNK):
            key = begin + c * CHUNK + r
            ok = key < end
            for piece in range(D // 8):
                vals = K[key, 8 * piece: 8 * piece + 8] if ok else np.zeros(8, np.float32)
                sm.put(dst + swz(r, piece, CHUNK), vals)

    # Thread state: warpgroup 0's (m, l) per lane and its O^T fragments, warpgroup 1's O^T.
    m = np.full((4, 32, 4), -np.inf)
    l = np.zeros((4, 32, 4))
    o = np.zeros((2, 4, 32, 4, 8))  # [wg][warp][lane][j][8]
    qk_scale = np.float32(scale_log2)
    red = np.zeros((2, 4, QROWS))
    for c in range(n_chunks):
        load(c)
        k_s = KOFF + (c & 1) * TILE
        S = np.zeros((64, QROWS))
        for ks in range(D // 16):
            ka = k_s + (ks // 4) * CHUNK * 128 + (ks % 4) * 32
            qb = QOFF + (ks // 4) * QROWS * 128 + (ks % 4) * 32
            S = wgmma(S, sm, ka, 1024, 16, 0, qb, 1024, QROWS, ks > 0)
        key0 = begin + c * CHUNK
        sc = np.zeros((4, 32, 8))
        for w in range(4):
            for lane in range(32):
                f = frag(S, w, lane)
                g, q = lane // 4, lane % 4
                for x in range(8):
                    k = 2 * (x >> 2) + (x & 1)
                    key = key0 + 16 * w + g + 8 * ((x >> 1) & 1)
                    sc[w, lane, x] = np.float32(f[x]) * qk_scale if key < lims[row_of(k, q)] else -np.inf
        # Row maxima: a lane's two keys, then lanes xor 4, 8, 16 (same q), then the 4 warps.
        mx = np.zeros((4, 32, 4))
        for w in range(4):
            for lane in range(32):
                for k in range(4):
                    x = 4 * (k >> 1) + (k & 1)
                    mx[w, lane, k] = max(sc[w, lane, x], sc[w, lane, x + 2])
            for sh in (4, 8, 16):
                mx[w] = np.maximum(mx[w], mx[w][np.arange(32) ^ sh])
        rb = red[c & 1]
        for w in range(4):
            for lane in range(32):
                if lane // 4 == 0:
                    for k in range(4):
                        rb[w, row_of(k, lane % 4)] = mx[w, lane, k]
        corr = np.zeros((4, 32, 4))
        xc = np.full(QROWS, np.nan)
        for w in range(4):
            for lane in range(32):
                g, q = lane // 4, lane % 4
                ref = np.zeros(4)
                for k in range(4):
                    n = row_of(k, q)
                    allm = max(rb[0, n], rb[1, n], rb[2, n], rb[3, n])
                    m_new = max(m[w, lane, k], allm)
                    ref[k] = 0.0 if m_new == -np.inf else m_new
                    corr[w, lane, k] = fast_exp2(m[w, lane, k] - ref[k])
                    m[w, lane, k] = m_new
                    l[w, lane, k] *= corr[w, lane, k]
                for x in range(0, 8, 2):
                    k = 2 * (x >> 2)
                    p0 = bf16(fast_exp2(sc[w, lane, x] - ref[k]))
                    p1 = bf16(fast_exp2(sc[w, lane, x + 1] - ref[k + 1]))
                    l[w, lane, k] += p0
                    l[w, lane, k + 1] += p1
                    key = 16 * w + g + 8 * ((x >> 1) & 1)
                    sm.put(POFF + p_off(row_of(k, q), key), np.array([p0], np.float32))
                    sm.put(POFF + p_off(row_of(k + 1, q), key), np.array([p1], np.float32))
                if w == 0 and g == 0:
                    for k in range(4):
                        xc[row_of(k, q)] = corr[w, lane, k]
        # Both warpgroups: rescale by their rows' factors (warpgroup 1 reads them from xc), P·V.
        for wg in range(2):
            for w in range(4):
                for lane in range(32):
                    q = lane % 4
                    f = [xc[row_of(k, q)] for k in range(4)]
                    if wg == 0:
                        assert np.allclose(f, corr[w, lane]), "xc differs from the lane's factors"
                    for x in range(8):
                        o[wg, w, lane, :, x] *= f[2 * (x >> 2) + (x & 1)]
            for j in range(4):
                Om = np.zeros((64, QROWS))
                for w in range(4):
                    for lane in range(32):
                        g, q = lane // 4, lane % 4
                        for i in range(2):
                            for h in range(2):
                                for e in range(2):
                                    Om[16 * w + g + 8 * h, 8 * i + 2 * q + e] = o[wg, w, lane, j, 4 * i + 2 * h + e]
                for kk in range(CHUNK // 16):
                    v = k_s + (4 * wg + j) * CHUNK * 128 + kk * 16 * 128
                    Om = wgmma(Om, sm, v, 1024, CHUNK * 128, 1, POFF + kk * 32, 1024, QROWS, 1)
                for w in range(4):
                    for lane in range(32):
                        o[wg, w, lane, j] = frag(Om, w, lane)
    # The rows' sums: lanes xor 4, 8, 16, then the 4 warps.
    lt = l.copy()
    for w in range(4):
        for sh in (4, 8, 16):
            lt[w] = lt[w] + lt[w][np.arange(32) ^ sh]
    rbs = np.zeros((4, QROWS))
    for w in range(4):
        for lane in range(4):
            for k in range(4):
                rbs[w, row_of(k, lane)] = lt[w, lane, k]
    l_row = (rbs[0] + rbs[1]) + (rbs[2] + rbs[3])
    m_row = np.zeros(QROWS)
    for lane in range(4):
        for k in range(4):
            m_row[row_of(k, lane)] = m[0, lane, k]
    # Paired stores: lane g even stores row 8 i + 2 q (columns D, D + 1), odd row + 1 (D - 1, D).
    out = np.full((QROWS, R), np.nan)
    for wg in range(2):
        for w in range(4):
            for j in range(4):
                for h in range(2):
                    for i in range(2):
                        send = np.array([o[wg, w, ln, j, 4 * i + 2 * h + (0 if (ln // 4) & 1 else 1)]
                                         for ln in range(32)])
                        for lane in range(32):
                            g, q = lane // 4, lane % 4
                            recv = send[lane ^ 4]
                            e0, e1 = o[wg, w, lane, j, 4 * i + 2 * h], o[wg, w, lane, j, 4 * i + 2 * h + 1]
                            odd = g & 1
                            k = 2 * i + odd
                            col = 64 * (4 * wg + j) + 16 * w + g + 8 * h
                            n = row_of(k, q)
                            inv = 1.0 / l_row[n] if l_row[n] > 0 else 0.0
                            if odd:
                                assert np.isnan(out[n, col - 1]) and np.isnan(out[n, col])
                                out[n, col - 1], out[n, col] = recv * inv, e1 * inv
                            else:
                                assert np.isnan(out[n, col]) and np.isnan(out[n, col + 1])
                                out[n, col], out[n, col + 1] = e0 * inv, recv * inv
    return out[:rows], m_row[:rows], l_row[:rows]


def reference(K, Qm, begin, end, lims, rows, scale_log2):
    out = np.zeros((rows, R))
    for r in range(rows):
        keys = np.arange(begin, min(end, lims[r]))
        if len(keys) == 0:
            continue
        s = K[keys].astype(np.float64) @ Qm[r].astype(np.float64) * scale_log2
        p = np.exp2(s - s.max())
        out[r] = (p @ K[keys, :R].astype(np.float64)) / p.sum()
    return out


def case(rng, n_keys, begin, end, heads, new_tokens):
    rows = heads * new_tokens
    K = bf16(rng.normal(0, 1, (n_keys, D)))
    Qm = np.zeros((QROWS, D), np.float32)
    Qm[:rows] = bf16(rng.normal(0, 1, (rows, D)))
    first = n_keys - new_tokens
    lims = np.full(QROWS, end)
    for r in range(rows):
        lims[r] = min(end, first + r // heads + 1)  # causal among the new tokens
    scale_log2 = np.float32(1 / np.sqrt(192) * 1.4426950408889634)
    got, _, _ = run_block(K, Qm, begin, end, lims, rows, scale_log2)
    want = reference(K, Qm, begin, end, lims, rows, scale_log2)
    err = np.sum((got - want) ** 2) / max(np.sum(want ** 2), 1e-30)
    print(f"keys {n_keys:4d} [{begin:4d}, {end:4d}) heads {heads:2d} x {new_tokens} new: nmse {err:.3g}")
    assert np.all(np.isfinite(got)), "a value never stored"
    assert err < 1e-4, f"nmse {err}"


def main():
    rng = np.random.default_rng(5)
    case(rng, 150, 0, 150, 16, 1)      # three chunks, the last partial
    case(rng, 200, 64, 200, 8, 1)      # a split starting at its second chunk; rows 8..15 padding
    case(rng, 100, 0, 100, 8, 2)       # two new tokens: causal rows
    case(rng, 1, 0, 1, 16, 1)          # one key
    case(rng, 64, 0, 64, 5, 1)         # one full chunk, 5 heads
    print("the keys-as-M kernel's index math agrees with float64 attention")


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print("FAIL:", e)
        sys.exit(1)
