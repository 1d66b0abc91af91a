#!/usr/bin/env python3
"""Host emulation of the register GEMV's index math (src/backend/cuda/linear_int4_reg.cu).

Follows the kernel's control flow -- block and warp parts, the register ring (position i in slot
(i - a) % U, refilled U positions ahead; the scale ring loaded with a group's last tile), the
global tile and scale-word addresses, x in shared memory in B-fragment order with odd tokens'
halves swapped (every word a lane reads is asserted to hold the token and k its mma needs),
scale groups opened at -136*sum(x) and closed with the row's scale, partial sums per (warp, row
tile), the epilogue -- in float64 on random data, and compares the outputs with x @ W.T (SwiGLU:
silu(g) * u). It checks indices, not float32 rounding; the GPU parity test
(tests/parity/linear_int4_parity_test.cc) checks the kernel itself. Run it after changing the
kernel's partition or layout (python3 with numpy; ~10 s):  python3 bench/cuda/dev/int4_reg_emu.py
"""
import numpy as np

rng = np.random.default_rng(2)


def ceil_div(a, b):
    return -(-a // b)


def tile_coords(lane, s, nib):
    g, c = lane // 4, lane % 4
    i, hi = nib % 4, nib // 4
    return g + 8 * (i & 1), 16 * s + 2 * c + 8 * (i >> 1) + hi


def repack(nib, scale, n, k, group):
    """The device layout (linear_int4.cu): packed words per (tile, lane, step), scales."""
    KT, RT = ceil_div(k, 64), ceil_div(n, 16)
    G = ceil_div(KT * 64, group)
    packed = np.zeros((RT * KT * 32, 4), dtype=np.uint64)
    for rt in range(RT):
        for kt in range(KT):
            for lane in range(32):
                for s in range(4):
                    w = 0
                    for nb in range(8):
                        r, col = tile_coords(lane, s, nb)
                        R, K = rt * 16 + r, kt * 64 + col
                        v = nib[R, K] if (R < n and K < k) else 8
                        w |= int(v) << (4 * nb)
                    packed[(rt * KT + kt) * 32 + lane, s] = w
    sc = np.zeros(RT * G * 16)
    for rt in range(RT):
        for gi in range(G):
            for r in range(16):
                R = rt * 16 + r
                if R < n and gi < k // group:
                    sc[(rt * G + gi) * 16 + 2 * (r % 8) + r // 8] = scale[R, gi]
    return packed, sc, KT, G


def run(n, k, group, m, W, U, grid, glu_inter=0):
    nib = rng.integers(0, 16, size=(n, k))
    scale = rng.uniform(0.5, 2, size=(n, k // group)) * np.where(rng.random((n, k // group)) < 0.2, -1, 1)
    x = rng.normal(size=(m, k))
    Wt = (nib - 8) * np.repeat(scale, group, axis=1)
    ref = x @ Wt.T
    packed, sc, KT, G = repack(nib, scale, n, k, group)
    glu = glu_inter > 0
    units = glu_inter // 16 if glu else ceil_div(n, 16)
    inter_tiles = units if glu else 0
    grid = max(1, min(units, grid))
    gshift = group.bit_length() - 1
    TPG = 0 if group == 32 else group // 64
    unit = 1 if TPG == 0 else TPG
    if TPG == 0:
        U = 8
    assert U % unit == 0
    # choose_reg's plan
    tiles = (2 if glu else 1) * ceil_div(units, grid) * KT
    lenmax = ceil_div(tiles // unit, W) * unit
    slots = 1 if lenmax == 0 else (KT + lenmax - 2) // KT + 1
    out = np.full((m, glu_inter if glu else n), np.nan)
    # x in shared memory: word -> (token, k) of its low bf16; the padded half tile is zero.
    xs = {}
    kc = k // 8
    for q in range(m * kc):
        t, k0 = q // kc, (q % kc) * 8
        kt0, col = k0 // 64, k0 % 64
        s, bb = col // 16, (col % 16) // 8
        base = (kt0 * m + t) * 32 + ((s // 2) ^ (t & 1)) * 16 + 2 * (s % 2) + bb
        for w in range(4):
            assert base + 4 * w not in xs
            xs[base + 4 * w] = (t, k0 + 2 * w)
    if k % 64:
        for t in range(m):
            for i in range(16):
                wd = ((KT - 1) * m + t) * 32 + (1 ^ (t & 1)) * 16 + i
                assert wd not in xs
                xs[wd] = "zero"
    xsum = {}
    for t in range(8):
        for gi in range(G):
            xsum[gi * 8 + t] = -136 * x[t, gi * group:(gi + 1) * group].sum() if t < m and gi < k // group else 0.0
    for blk in range(grid):
        u0 = blk * units // grid
        nu = (blk + 1) * units // grid - u0
        ns = 2 * nu if glu else nu
        L = ns * KT
        J = nu * KT if glu else L
        base0, base1 = u0 * KT, (inter_tiles + u0 - nu) * KT
        part_start = lambda w: (w * (L // unit) // W) * unit
        parts = np.zeros((W, slots, 16, m))
        span = []
        for w in range(W):
            a, b = part_start(w), part_start(w + 1)
            span.append((a // KT, (b - 1) // KT) if b > a else (1, 0))
        for w in range(W):
            a, b = part_start(w), part_start(w + 1)
            nsc = 2 * U if TPG == 0 else U // unit
            ring, sring = [None] * U, [None] * nsc

            def load(t, i):
                if i >= b:
                    return
                gt = i + (base0 if i < J else base1)
                ring[t] = (i, gt)
                if TPG == 0:
                    sring[2 * t] = (i, gt * 16)  # scale word index of lane g = 0
                    sring[2 * t + 1] = (i, gt * 16 + 8)
                elif t % unit == unit - 1:
                    sring[t // unit] = (i, ((gt * 64) >> gshift) * 8)

            for t in range(U):
                load(t, a + t)
            kt = a % KT if KT else 0
            jslot = 0
            acc = np.zeros((16, 8))
            g0 = np.zeros((16, 8))

            def flush():
                parts[w, jslot, :, :] = acc[:, :m]
                acc[:] = 0

            i0 = a
            while i0 < b:
                for t in range(U):
                    i = i0 + t
                    if i >= b:
                        continue
                    pos, gt = ring[t]
                    assert pos == i
                    rt_g, kt_g = divmod(gt, KT)
                    assert kt_g == kt
                    R0 = rt_g * 16
                    if glu:
                        slot = i // KT
                        assert rt_g == (u0 + slot if slot < nu else inter_tiles + u0 + slot - nu)
                    # x words per lane: every lane's fragment pairs hold (its token, the A columns)
                    for lane in range(32):
                        g, c = lane // 4, lane % 4
                        tok = g if g < m else 0
                        # x_lane (+ kt tiles) and, for half 1, that address ^ 64 bytes (16 words)
                        xa = tok * 32 + c * 4 + (tok & 1) * 16 + kt * m * 32
                        xb = xa ^ 16
                        xw = [xa + j for j in range(4)] + [xb + j for j in range(4)]
                        for s in range(4):
                            for bb in range(2):
                                v = xs[xw[2 * s + bb]]
                                col = kt * 64 + 16 * s + 2 * c + 8 * bb
                                if col >= k:
                                    assert v == "zero"
                                else:
                                    assert v == (tok, col), (v, tok, col)
                    for s in range(4):
                        start = (s % 2 == 0) if TPG == 0 else (s == 0 and t % unit == 0)
                        if start:
                            grp_i = 2 * kt + s // 2 if TPG == 0 else (kt * 64) >> gshift
                            for c in range(4):
                                for ee in range(2):
                                    g0[:, 2 * c + ee] = xsum[grp_i * 8 + 2 * c + ee]
                        for t2 in range(m):
                            cols = [kt * 64 + 16 * s + kk for kk in range(16)]
                            for r in range(16):
                                R = R0 + r
                                tot = 0.0
                                for K in cols:
                                    if K < k:
                                        tot += (128 + (nib[R, K] if R < n else 8)) * x[t2, K]
                                g0[r, t2] += tot
                        end = (s % 2 == 1) if TPG == 0 else (s == 3 and t % unit == unit - 1)
                        if end:
                            e = 2 * t + s // 2 if TPG == 0 else t // unit
                            spos, word0 = sring[e]
                            # the scale word was loaded with this group's tiles, not a later one's
                            assert spos // (1 if TPG == 0 else unit) == i // (1 if TPG == 0 else unit), (spos, i)
                            gidx_global = word0 // 8
                            rt_s, gidx = divmod(gidx_global, G)
                            assert rt_s == rt_g
                            assert gidx == ((kt * 64) >> gshift) + (s // 2 if TPG == 0 else 0)
                            for r in range(16):
                                gl = r % 8
                                sv = sc[2 * (word0 + gl) + r // 8]
                                R = R0 + r
                                if R < n and gidx < k // group:
                                    assert sv == scale[R, gidx]
                                acc[r, :] += sv * g0[r, :]
                    load(t, i + U)
                    kt += 1
                    if kt == KT:
                        kt = 0
                        flush()
                        jslot += 1
                i0 += U
            if KT > 0 and b > a and b % KT != 0:
                flush()
                jslot += 1
            assert jslot <= slots, (jslot, slots)
        so = nu if glu else ns

        def slot_sum(r, i, t):
            v = 0.0
            for w in range(W):
                sx, sy = span[w]
                if sx <= r <= sy:
                    v += parts[w, r - sx, i, t]
            return v

        for o in range(so * 16 * m):
            t, r, i = o // (so * 16), (o // 16) % so, o % 16
            row = (u0 + r) * 16 + i
            if glu:
                gv, uv = slot_sum(r, i, t), slot_sum(r + nu, i, t)
                out[t, row] = gv / (1 + np.exp(-gv)) * uv
            elif row < n:
                out[t, row] = slot_sum(r, i, t)
    if glu:
        gte, up = ref[:, :glu_inter], ref[:, glu_inter:]
        want = gte / (1 + np.exp(-gte)) * up
    else:
        want = ref
    assert not np.isnan(out).any(), "unwritten output"
    return np.abs(out - want).max() / np.abs(want).max()


# (n, k, group, m, warps, U, grid): partial row tiles, k % 64 == 32, groups 32..256, warps with
# empty parts, parts crossing row tiles, rings longer than a part, several row tiles per block.
cases = [
    (33, 96, 32, 1, 8, 8, 132), (16, 64, 32, 3, 8, 8, 132), (517, 544, 32, 2, 8, 8, 5),
    (129, 384, 128, 5, 8, 16, 3), (64, 256, 128, 8, 4, 8, 1), (100, 512, 64, 1, 8, 16, 2),
    (48, 512, 256, 2, 8, 8, 2), (160, 384, 128, 1, 7, 16, 4), (272, 2560, 256, 1, 1, 16, 132),
    (40, 320, 64, 2, 7, 8, 1), (33, 96, 32, 8, 8, 8, 1), (96, 1024, 128, 1, 3, 16, 1),
]
for cse in cases:
    print(cse, "rel err %.2e" % run(*cse))
for (inter, k, group, m, W, U, grid) in [(32, 256, 128, 2, 8, 16, 1), (48, 96, 32, 1, 8, 8, 2),
                                         (64, 512, 64, 3, 8, 16, 3), (48, 768, 256, 1, 5, 8, 2)]:
    err = run(2 * inter, k, group, m, W, U, grid, glu_inter=inter)
    print("glu", (inter, k, group, m, W, U, grid), "rel err %.2e" % err)
