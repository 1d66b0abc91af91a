#!/usr/bin/env python3
"""Lane-level emulation of the lean MLA decode kernel (src/backend/cuda/mla_decode_lean.cu), written
after the CUDA code to check its fragment addressing without a GPU: the padded shared-memory rows
(Q, the key stages, P), every ldmatrix address (Q and P as A operands, keys as B, V by .trans) with
the PTX ISA's fragment layouts of ldmatrix and mma.m16n8k16, the masked scores, the rows' maxima and
sums through shared memory, the running rescale, P·V over each warp's 128 columns and the output
columns. One block, one split, float64 (no bf16 rounding): the result must equal plain attention to
rounding. Needs numpy (Debian: python3-numpy). Usage: bench/cuda/mla_decode_lean_emulate.py"""
import numpy as np
R, P, W = 512, 64, 576
ROWS, CHUNK, WARPS = 16, 64, 4
ROWB = 2 * W; STRIDE = ROWB + 16; PSTRIDE = 2 * CHUNK + 16
QOFF = 0; KOFF = QOFF + ROWS * STRIDE; STAGEB = CHUNK * STRIDE
POFF = KOFF + 2 * STAGEB
smem = np.zeros((POFF + ROWS * PSTRIDE) // 2)  # b16 elements as floats

def st(addr_bytes, vals):  # store consecutive b16 values
    i = addr_bytes // 2; smem[i:i + len(vals)] = vals
def ld8(addr_bytes):
    assert addr_bytes % 16 == 0, addr_bytes
    i = addr_bytes // 2; return smem[i:i + 8]

def ldmatrix_x4(addrs, trans=False):
    # addrs[lane]: row (lane % 8) of matrix lane // 8. Returns regs[lane][j] = (lo, hi).
    mats = [np.array([ld8(addrs[8 * m + r]) for r in range(8)]) for m in range(4)]
    out = [[None] * 4 for _ in range(32)]
    for t in range(32):
        for j in range(4):
            M = mats[j].T if trans else mats[j]
            out[t][j] = (M[t // 4][2 * (t % 4)], M[t // 4][2 * (t % 4) + 1])
    return out

def mma(C, A, B0, B1):
    # C[lane][4], A[lane][4] pairs, B0/B1[lane] pairs; D = A(16x16) @ B(16x8) + C
    Am = np.zeros((16, 16)); Bm = np.zeros((16, 8))
    for t in range(32):
        g, c = t // 4, t % 4
        Am[g][2*c:2*c+2] = A[t][0]; Am[g+8][2*c:2*c+2] = A[t][1]
        Am[g][2*c+8:2*c+10] = A[t][2]; Am[g+8][2*c+8:2*c+10] = A[t][3]
        Bm[2*c:2*c+2, g] = B0[t]; Bm[2*c+8:2*c+10, g] = B1[t]
    D = Am @ Bm
    for t in range(32):
        g, c = t // 4, t % 4
        C[t][0] += D[g][2*c]; C[t][1] += D[g][2*c+1]; C[t][2] += D[g+8][2*c]; C[t][3] += D[g+8][2*c+1]

def run(rows, nkeys, seed):
    rng = np.random.default_rng(seed)
    smem[:] = 0
    Q = rng.standard_normal((rows, W)); K = rng.standard_normal((nkeys, W)); scale = 0.05
    for r in range(ROWS):
        st(QOFF + r * STRIDE, Q[r] if r < rows else np.zeros(W))
    m = [[-np.inf, -np.inf] for _ in range(128)]; l = [[0.0, 0.0] for _ in range(128)]
    o = [[[0.0] * 4 for _ in range(16)] for _ in range(128)]  # o[tid][j][e]
    nch = (nkeys + CHUNK - 1) // CHUNK
    for ci in range(nch):
        stg = KOFF + (ci & 1) * STAGEB
        j0, j1 = ci * CHUNK, min(nkeys, ci * CHUNK + CHUNK)
        for j in range(CHUNK):
            st(stg + j * STRIDE, K[j0 + j] if j0 + j < j1 else np.zeros(W))
        red = np.zeros(2 * WARPS * ROWS)
        sc_all = {}
        for w in range(WARPS):
            acc = [[[0.0] * 4 for _ in range(32)] for _ in range(2)]
            qa = [QOFF + (ln % 16) * STRIDE + (ln // 16) * 16 for ln in range(32)]
            kb = [stg + (16 * w + (ln & 7) + 8 * (ln >> 4)) * STRIDE + ((ln >> 3) & 1) * 16 for ln in range(32)]
            for ks in range(W // 16):
                a = ldmatrix_x4([x + ks * 32 for x in qa])
                b = ldmatrix_x4([x + ks * 32 for x in kb])
                mma(acc[0], a, [b[t][0] for t in range(32)], [b[t][1] for t in range(32)])
                mma(acc[1], a, [b[t][2] for t in range(32)], [b[t][3] for t in range(32)])
            for ln in range(32):
                g, c = ln // 4, ln % 4
                sc = [[0] * 4 for _ in range(2)]
                for t in range(2):
                    for e in range(4):
                        key = j0 + 16 * w + 8 * t + 2 * c + (e & 1)
                        v = acc[t][ln][e] * scale
                        sc[t][e] = -np.inf if key >= nkeys else v
                sc_all[(w, ln)] = sc
            for ln in range(32):
                g, c = ln // 4, ln % 4
                for h in range(2):
                    v = max(max(sc_all[(w, l2)][t][2*h + e] for t in range(2) for e in range(2)) for l2 in range(4*g, 4*g+4))
                    red[w * ROWS + g + 8 * h] = v
        newm = {}
        for w in range(WARPS):
            for ln in range(32):
                g, c = ln // 4, ln % 4; tid = 32 * w + ln
                corr = [0, 0]; ref = [0, 0]
                for h in range(2):
                    v = m[tid][h]
                    for u in range(WARPS): v = max(v, red[u * ROWS + g + 8 * h])
                    ref[h] = 0.0 if v == -np.inf else v
                    corr[h] = 2.0 ** (m[tid][h] - ref[h])
                    m[tid][h] = v
                newm[tid] = (corr, ref)
                sc = sc_all[(w, ln)]
                for t in range(2):
                    for h in range(2):
                        p0 = 2.0 ** (sc[t][2*h] - ref[h]); p1 = 2.0 ** (sc[t][2*h+1] - ref[h])
                        st(POFF + (g + 8*h) * PSTRIDE + 2 * (16*w + 8*t + 2*c), [p0, p1])
        # sums: per row over all 64 keys of the P row
        for w in range(WARPS):
            for ln in range(32):
                g, c = ln // 4, ln % 4; tid = 32 * w + ln
                corr, ref = newm[tid]
                for h in range(2):
                    s = sum(smem[(POFF + (g + 8*h) * PSTRIDE) // 2 + k] for k in range(CHUNK))
                    l[tid][h] = l[tid][h] * corr[h] + s
                for j in range(16):
                    o[tid][j][0] *= corr[0]; o[tid][j][1] *= corr[0]; o[tid][j][2] *= corr[1]; o[tid][j][3] *= corr[1]
        for w in range(WARPS):
            pa = [POFF + (ln % 16) * PSTRIDE + (ln // 16) * 16 for ln in range(32)]
            for ks in range(CHUNK // 16):
                a = ldmatrix_x4([x + ks * 32 for x in pa])
                for j in range(8):
                    vb = [stg + (16*ks + (ln & 7) + 8*((ln >> 3) & 1)) * STRIDE + 2*(128*w) + (ln >> 4)*16 + j*32 for ln in range(32)]
                    b = ldmatrix_x4(vb, trans=True)
                    C0 = [o[32*w + t][2*j] for t in range(32)]; C1 = [o[32*w + t][2*j+1] for t in range(32)]
                    mma(C0, a, [b[t][0] for t in range(32)], [b[t][1] for t in range(32)])
                    mma(C1, a, [b[t][2] for t in range(32)], [b[t][3] for t in range(32)])
    out = np.zeros((ROWS, R))
    for w in range(WARPS):
        for ln in range(32):
            g, c = ln // 4, ln % 4; tid = 32 * w + ln
            for h in range(2):
                r = g + 8 * h
                for j in range(16):
                    col = 128 * w + 8 * j + 2 * c
                    out[r][col] = o[tid][j][2*h] / l[tid][h]; out[r][col+1] = o[tid][j][2*h+1] / l[tid][h]
    S = (Q @ K.T) * scale
    Pm = 2.0 ** (S - S.max(1, keepdims=True)); ref = (Pm / Pm.sum(1, keepdims=True)) @ K[:, :R]
    err = np.abs(out[:rows] - ref).max()
    print(f"rows {rows:2d}, keys {nkeys:3d}: max abs err {err:.3g} (outputs up to {np.abs(ref).max():.3g})")
    assert err < 1e-9, err


if __name__ == "__main__":
    # Two chunks, the second partial; one full chunk of 16 rows; one key; three chunks (the ring).
    for i, (rows, nkeys) in enumerate([(8, 100), (16, 64), (8, 1), (16, 130)]):
        run(rows, nkeys, i)
