#!/usr/bin/env python3
"""Host emulation of the stream GEMV's index math (src/backend/cuda/linear_int4_stream.cu).

Follows the kernel's control flow -- block and warp parts, stage cursors cut at row-tile ends,
the scale rows each stage copies, x in B-fragment order (every fragment word's token and k are
asserted), scale groups opened at -136*sum(x) and closed with the row's scale, partial sums per
(warp, row tile) and the epilogue -- in float64 on random data, and compares the outputs with
x @ W.T (SwiGLU: silu(g) * u). It checks indices, not float32 rounding; the GPU parity test
(tests/parity/linear_int4_parity_test.cc) checks the kernel itself. Run it after changing the
kernel's partition or layout (python3 with numpy; ~5 s):  python3 bench/cuda/dev/int4_stream_emu.py
"""
import numpy as np, itertools, sys
rng = np.random.default_rng(1)

def ceil_div(a, b): return -(-a // b)

def tile_coords(lane, s, nib):
    g, c = lane // 4, lane % 4
    i, hi = nib % 4, nib // 4
    return g + 8 * (i & 1), 16 * s + 2 * c + 8 * (i >> 1) + hi

def repack(nib, scale, n, k, group):
    KT = ceil_div(k, 64); RT = ceil_div(n, 16)
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

def magic(w):  # A register i -> (lo, hi) values 128 + nibble
    out = []
    for i in range(4):
        q = (w >> (4 * i)) & 0xffffffff
        out.append((128 + (q & 0xf), 128 + ((q >> 16) & 0xf)))
    return out

def run(n, k, group, m, W, CT, P, grid, glu_inter=0):
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
    group32 = group == 32
    tpg = 1 if group32 else group // 64
    # plan
    tiles = (2 if glu else 1) * ceil_div(units, grid) * KT
    lenmax = ceil_div(tiles // tpg, W) * tpg
    slots = 1 if lenmax == 0 else (KT + lenmax - 2) // KT + 1
    out = np.full((m, glu_inter if glu else n), np.nan)
    # x smem
    xs = {}
    kc = k // 8
    for q in range(m * kc):
        t, k0 = q // kc, (q % kc) * 8
        kt0, col = k0 // 64, k0 % 64
        s, bb = col // 16, (col % 16) // 8
        base = ((kt0 * m + t) * 2 + s // 2) * 16 + 2 * (s % 2) + bb
        for cc in range(4):
            xs[base + 4 * cc] = (t, k0 + 2 * cc)
    xsum = {}
    for t in range(m):
        for gi in range(k // group):
            xsum[gi * 8 + t] = -136 * x[t, gi * group:(gi + 1) * group].sum()
    def xval(addr_words):  # pair value (t,k),(t,k+1) -> tuple of floats, zero if unset
        if addr_words not in xs: return None
        t, kk = xs[addr_words]
        return (x[t, kk], x[t, kk + 1], t, kk)
    for blk in range(grid):
        u0 = blk * units // grid
        nu = (blk + 1) * units // grid - u0
        ns = 2 * nu if glu else nu
        L = ns * KT; J = nu * KT if glu else L
        base0 = u0 * KT; base1 = (inter_tiles + u0 - nu) * KT
        part_start = lambda w: (w * (L // tpg) // W) * tpg
        parts = np.zeros((W, slots, 16, m))
        span = []
        for w in range(W):
            a, b = part_start(w), part_start(w + 1)
            span.append((a // KT, (b - 1) // KT) if b > a else (1, 0))
        for w in range(W):
            a, b = part_start(w), part_start(w + 1)
            unit = 1 if group32 else tpg
            assert CT % unit == 0
            def chunk_len(cu): return min(CT, KT - cu[1], b - cu[0])
            def advance(cu, ln):
                i, kt = cu[0] + ln, cu[1] + ln
                return (i, 0 if kt == KT else kt)
            stages = {}
            pc = [(a, a % KT if KT else 0)]; pst = [0]; issued = [0]
            def issue_next():
                cu = pc[0]; ln = chunk_len(cu)
                gt0 = cu[0] + (base0 if cu[0] < J else base1)
                assert gt0 % unit == 0 and ln % unit == 0 and ln >= 1
                e0 = (gt0 * 64) >> gshift
                rows = 2 * ln if group32 else ln // tpg
                assert rows <= 2 * CT
                stages[pst[0]] = (issued[0], packed[gt0 * 32:(gt0 + ln) * 32], sc[e0 * 16:(e0 + rows) * 16], gt0, ln)
                issued[0] += 1
                pc[0] = advance(cu, ln)
                pst[0] = (pst[0] + 1) % P
            k_ = 0
            while k_ < P and pc[0][0] < b: issue_next(); k_ += 1
            jslot, st = 0, 0
            acc = np.zeros((16, 8)); grp = np.zeros((16, 8))
            cc = (a, a % KT if KT else 0); ci = 0
            while cc[0] < b:
                ln = chunk_len(cc)
                cid, wt, srows, gt0, ln2 = stages[st]; assert cid == ci and ln2 == ln
                kt0 = cc[1]
                gi0 = 2 * kt0 if group32 else kt0 // tpg
                for t in range(CT):
                    if t >= ln: continue
                    kt = kt0 + t
                    rt_g, kt_g = divmod(gt0 + t, KT)
                    assert kt_g == kt
                    R0 = rt_g * 16
                    for s in range(4):
                        e = 2 * t + s // 2 if group32 else t // tpg
                        start = (s % 2 == 0) if group32 else (s == 0 and t % tpg == 0)
                        if start:
                            for c in range(4):
                                for ee in range(2):
                                    grp[:, 2 * c + ee] = xsum.get((gi0 + e) * 8 + 2 * c + ee, 0.0)
                        for lane in range(32):
                            g, c = lane // 4, lane % 4
                            if g < m:
                                addr0 = ((kt * m + g) * 2 + s // 2) * 16 + 4 * c + 2 * (s % 2)
                                b0, b1 = xval(addr0), xval(addr0 + 1)
                                if kt * 64 + 16 * s < k:
                                    assert b0[2] == g and b0[3] == kt * 64 + 16 * s + 2 * c, (b0, g, kt, s, c)
                                    assert b1[3] == kt * 64 + 16 * s + 2 * c + 8
                        for r in range(16):
                            R = R0 + r
                            for t2 in range(m):
                                tot = 0.0
                                for kk in range(16):
                                    K = kt * 64 + 16 * s + kk
                                    if K >= k: continue
                                    nv = nib[R, K] if R < n else 8
                                    tot += (128 + nv) * x[t2, K]
                                grp[r, t2] += tot
                        end = (s % 2 == 1) if group32 else (s == 3 and (t + 1) % tpg == 0)
                        if end:
                            for r in range(16):
                                g = r % 8
                                sv = srows[e * 16 + 2 * g + r // 8]
                                R = R0 + r
                                gidx = gi0 + e
                                assert gidx == ((kt * 64) >> gshift) + (s // 2 if group32 else 0)
                                if R < n and gidx < k // group:
                                    assert sv == scale[R, gidx], (sv, scale[R, gidx])
                                acc[r, :] += sv * grp[r, :]
                cc = advance(cc, ln)
                if cc[1] == 0:
                    parts[w, jslot, :, :] = acc[:, :m]; acc[:] = 0; jslot += 1
                if pc[0][0] < b:
                    assert pst[0] == st
                    issue_next()
                st = (st + 1) % P; ci += 1
            if KT > 0 and b > a and b % KT != 0:
                parts[w, jslot, :, :] = acc[:, :m]
                jslot += 1
            assert jslot <= slots, (jslot, slots)
        so = nu if glu else ns
        def slot_sum(r, i, t):
            v = 0.0
            for w in range(W):
                sx, sy = span[w]
                if sx <= r <= sy: v += parts[w, r - sx, i, t]
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
    err = np.abs(out - want).max() / np.abs(want).max()
    assert not np.isnan(out).any(), "unwritten output"
    return err

cases = [
  (33, 96, 32, 1, 8, 4, 4, 132), (16, 64, 32, 3, 16, 4, 2, 132), (517, 544, 32, 2, 8, 4, 4, 5),
  (129, 384, 128, 5, 8, 8, 2, 3), (64, 256, 128, 8, 4, 4, 3, 1), (100, 512, 64, 1, 16, 8, 2, 2),
  (48, 512, 256, 2, 8, 4, 2, 2), (160, 384, 128, 1, 7, 4, 2, 4), (272, 2560, 256, 1, 1, 4, 1, 132),
  (40, 320, 64, 2, 7, 8, 3, 1), (33, 96, 32, 8, 16, 8, 1, 1),
]
for cse in cases:
    print(cse, "rel err %.2e" % run(*cse))
for (inter, k, group, m, W, CT, P, grid) in [(32, 256, 128, 2, 8, 4, 4, 1), (48, 96, 32, 1, 8, 4, 2, 2), (64, 512, 64, 3, 16, 8, 2, 3)]:
    print("glu", (inter, k, group, m, W, CT, P, grid), "rel err %.2e" % run(2 * inter, k, group, m, W, CT, P, grid, glu_inter=inter))
