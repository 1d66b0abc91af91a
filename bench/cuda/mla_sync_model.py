#!/usr/bin/env python3
"""Model check of the synchronization of the MLA decode kernel (mla_decode.cuh), the pipelined
wgmma kernel (mla_attention_wgmma_pipe.cu) unpaired and as row-tile pairs (a cluster of 2 fed by
multicast copies), the seesaw form dropped in session 38, and the keys-as-M kernel prepared in
session 39 (its patch): each warp is a coroutine that
follows the kernel's sequence of mbarrier inits / arrivals / parity waits, named-barrier syncs and
arrivals, cluster barriers, and the shared-memory buffers it writes and reads (tagged with the
chunk they hold); copies (TMA bulk and tensor copies, cp.async tracked by mbarriers, remote
mbarrier arrivals) land at random later times. A random scheduler runs
thousands of interleavings per shape and reports a deadlock (no warp can move, not all done) or a
hazard (a warp reads a buffer holding another chunk than it expects, or a copy overwrites a buffer
still in use). Hardware semantics modeled: an mbarrier phase completes when its pending arrivals
reach zero and its transaction bytes are all counted; try_wait.parity(P) passes when the current
phase's parity differs from P; a named barrier completes when `count` threads have arrived (sync
or arrive), releasing its waiters. Pure Python. Run: python3 bench/cuda/mla_sync_model.py
"""
import random
import sys


class MBar:
    def __init__(self, count):
        self.count, self.pending, self.tx, self.phase = count, count, 0, 0

    def arrive(self, tx=0):
        self.pending -= 1
        self.tx += tx
        self._check()

    def complete_tx(self, n):
        self.tx -= n
        self._check()

    def _check(self):
        assert self.pending >= 0, "more arrivals than the phase expects"
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count

    def passed(self, parity):
        return (self.phase & 1) != parity


class Named:
    def __init__(self):
        self.arrived = {}  # id -> threads so far in the current generation
        self.gen = {}

    def arrive(self, bid, n, threads):
        a = self.arrived.get(bid, 0) + threads
        assert a <= n, f"named barrier {bid}: {a} arrivals of {n}"
        if a == n:
            self.arrived[bid] = 0
            self.gen[bid] = self.gen.get(bid, 0) + 1
        else:
            self.arrived[bid] = a
        return self.gen.get(bid, 0)


class Sim:
    """Warps yield requests: ('wait', pred) blocks until pred() is true; ('sync', id, n) is
    bar.sync; ('step',) lets others run."""

    def __init__(self, rng):
        self.rng = rng
        self.named = Named()
        self.pending_copies = []  # (callback)

    def run(self, warps):
        gens = {name: w for name, w in warps.items()}
        state = {name: None for name in gens}  # what each warp waits for
        done = set()
        for name in list(gens):
            state[name] = next(gens[name], "DONE")
        steps = 0
        while True:
            steps += 1
            assert steps < 10 ** 6, "livelock"
            runnable = []
            for name, req in state.items():
                if name in done:
                    continue
                if req == "DONE":
                    done.add(name)
                    continue
                if req[0] == "step":
                    runnable.append(name)
                elif req[0] == "wait" and req[1]():
                    runnable.append(name)
                elif req[0] == "named" and self.named.gen.get(req[1], 0) > req[2]:
                    runnable.append(name)
            if len(done) == len(state) and not self.pending_copies:
                return
            if not runnable and not self.pending_copies:
                raise AssertionError("deadlock: " + ", ".join(f"{n}: {state[n][3] if len(state[n]) > 3 else state[n][0]}"
                                                              for n in state if n not in done))
            if self.pending_copies and (not runnable or self.rng.random() < 0.3):
                cb = self.pending_copies.pop(self.rng.randrange(len(self.pending_copies)))
                cb()
                continue
            name = self.rng.choice(runnable)
            state[name] = next(gens[name], "DONE")

    def copy(self, cb):
        self.pending_copies.append(cb)

    def sync(self, bid, n, threads=32, what=""):
        """bar.sync: arrive, then wait for the generation to complete."""
        g = self.named.gen.get(bid, 0)
        self.named.arrive(bid, n, threads)
        return ("named", bid, g, what)


def decode_kernel(sim, nchunks, NS, n_sw=4, n_pv=4):
    full = [MBar(1) for _ in range(NS)]
    empty = [MBar(n_pv) for _ in range(NS)]
    stage = [None] * NS       # chunk a stage holds (None: being written)
    stage_readers = [0] * NS  # warps reading the stage now
    pbuf = [None, None]
    B = 32 * (n_sw + n_pv)
    ROW = 64  # copies per stage

    def produce(c):
        st = c % NS
        assert stage_readers[st] == 0, f"refill of stage {st} while read"
        full[st].arrive(ROW)  # expect_tx (one unit a row)
        stage[st] = None
        left = [ROW]

        def land():
            left[0] -= 1
            if left[0] == 0:
                stage[st] = c
            full[st].complete_tx(1)
        for _ in range(ROW):
            sim.copy(land)

    def s_warp(w):
        for c in range(nchunks):
            st, buf = c % NS, c & 1
            par = (c // NS) & 1
            yield ("wait", lambda st=st, par=par: full[st].passed(par), None, f"S full {c}")
            assert stage[st] == c, f"S warp read stage {st}: {stage[st]} for chunk {c}"
            stage_readers[st] += 1
            yield ("step",)
            stage_readers[st] -= 1
            yield sim.sync(1, 32 * n_sw, what=f"S max {c}")
            if c >= 2:
                yield sim.sync(4 + buf, B, what=f"S pfree {c}")
            if w == 0:
                pbuf[buf] = c
            yield ("step",)
            sim.named.arrive(2 + buf, B, 32)
            yield ("step",)
        for c in range(max(0, nchunks - 2), nchunks):
            yield sim.sync(4 + (c & 1), B, what="S tail pfree")
        sim.named.arrive(6, B, 32)

    def pv_warp(pw):
        if pw == 0:
            for c in range(min(NS, nchunks)):
                produce(c)
        for c in range(nchunks):
            st, buf = c % NS, c & 1
            par = (c // NS) & 1
            yield sim.sync(2 + buf, B, what=f"PV ready {c}")
            yield ("wait", lambda st=st, par=par: full[st].passed(par), None, f"PV full {c}")
            assert stage[st] == c and pbuf[buf] == c, f"PV chunk {c}: stage {stage[st]} P {pbuf[buf]}"
            stage_readers[st] += 1
            yield ("step",)
            stage_readers[st] -= 1
            empty[st].arrive()
            sim.named.arrive(4 + buf, B, 32)
            if pw == 0 and c + NS < nchunks:
                yield ("wait", lambda st=st, par=par: empty[st].passed(par), None, f"PV0 empty {c}")
                produce(c + NS)
        yield sim.sync(6, B, what="PV final")

    warps = {f"S{w}": s_warp(w) for w in range(n_sw)}
    warps.update({f"PV{w}": pv_warp(w) for w in range(n_pv)})
    sim.run(warps)


def wgmma_pipe_kernel(sim, nchunks, groups=9):
    full = [[MBar(4) for _ in range(groups)] for _ in range(2)]  # one arrival per WG1 warp here
    empty = [MBar(8) for _ in range(2)]
    qbar = MBar(4)
    stage = [[None] * groups for _ in range(2)]
    readers = [0, 0]
    pbuf = [None]
    B = 256

    def load(c, w1):
        s = c & 1
        assert readers[s] == 0, f"refill of stage {s} while read"
        for j in range(groups):
            stage[s][j] = None

            def land(s=s, j=j):
                stage[s][j] = c
                full[s][j].arrive()
            sim.copy(land)

    def wg1_warp(w):
        if nchunks > 0:
            sim.copy(lambda: qbar.arrive())
            load(0, w)
            if nchunks > 1:
                load(1, w)
        for c in range(nchunks):
            s, par = c & 1, (c >> 1) & 1
            yield sim.sync(1, B, what=f"WG1 P {c}")
            assert pbuf[0] == c
            sim.named.arrive(2, B, 32)
            for j in range(4, 8):
                yield ("wait", lambda s=s, j=j, par=par: full[s][j].passed(par), None, f"WG1 full {c}")
                assert stage[s][j] == c
            readers[s] += 1
            yield ("step",)
            readers[s] -= 1
            empty[s].arrive()
            if c + 2 < nchunks:
                yield ("wait", lambda s=s, par=par: empty[s].passed(par), None, f"WG1 empty {c}")
                load(c + 2, w)
        yield sim.sync(3, B, what="WG1 final")

    def wg0_warp(w):
        if nchunks > 0:
            yield ("wait", lambda: qbar.passed(0), None, "WG0 q")
        for c in range(nchunks):
            s, par = c & 1, (c >> 1) & 1
            for j in range(groups):
                yield ("wait", lambda s=s, j=j, par=par: full[s][j].passed(par), None, f"WG0 full {c}")
                assert stage[s][j] == c, f"WG0 chunk {c} group {j}: {stage[s][j]}"
                if j == 0:
                    readers[s] += 1
            yield ("step",)
            if c > 0:
                yield sim.sync(2, B, what=f"WG0 pfree {c}")
            if w == 0:
                pbuf[0] = c
            sim.named.arrive(1, B, 32)
            yield ("step",)
            readers[s] -= 1
            empty[s].arrive()
        if nchunks > 0:
            yield sim.sync(2, B, what="WG0 tail pfree")
        sim.named.arrive(3, B, 32)

    warps = {f"W0.{w}": wg0_warp(w) for w in range(4)}
    warps.update({f"W1.{w}": wg1_warp(w) for w in range(4)})
    # Each WG1 warp's copies count as that warp's arrival: the model's full barriers expect 4.
    sim.run(warps)


def wgmma_pairs_kernel(sim, nchunks, boxes=1, tail=False, mutation=None):
    """The row-tile pairs (mla_attention_wgmma_pipe.cu, MC): two CTAs of a cluster, each the pipe
    kernel's two warpgroups. Each CTA's loader (warpgroup 1's thread 0) arms its 9 full barriers
    of a stage (one arrival + the chunk's bytes) and issues its half of the groups (rank 0: 0-4,
    rank 1: 5-8) as `boxes` copies a group, each multicast: it lands in both CTAs and counts its
    bytes on the barrier at the same offset in each. Every warp frees a stage on its own CTA's
    empty barrier and the peer's (16 arrivals a phase); a remote arrival is asynchronous, performed
    at the latest by the warp's next cluster-barrier arrival (release). tail: the last chunk ends
    inside it, so warpgroup 0 zeroes its rows past the end (each warp a share) and meets at a
    named barrier of its 4 warps before any read. Cluster barriers after the barriers' init and
    before exit. Checks beyond deadlock: a copy or remote arrival reaching a CTA before its
    barriers exist or after it exited, a copy into a group some warp of that CTA has not freed, a
    read of a group holding another chunk, of a partly landed group, or of tail rows not zeroed.
    mutation (forms the model must catch): 'local_empty' (8 local arrivals, no remote: the peer
    refills a stage this CTA still reads), 'no_exit_sync', 'cta_init_sync' (__syncthreads in
    place of the first cluster barrier), 'no_tail_bar'."""
    G = 9
    halves = [range(0, 5), range(5, 9)]
    n_empty = 8 if mutation == "local_empty" else 16
    full = [[[MBar(1) for _ in range(G)] for _ in range(2)] for _ in range(2)]
    empty = [[MBar(n_empty) for _ in range(2)] for _ in range(2)]
    qbar = [MBar(4) for _ in range(2)]
    held = [[[None] * G for _ in range(2)] for _ in range(2)]    # chunk a group holds
    landed = [[[0] * G for _ in range(2)] for _ in range(2)]     # its boxes landed
    owed = [[[0] * G for _ in range(2)] for _ in range(2)]       # warps yet to free it
    zeroed = [0, 0]   # warpgroup-0 warps done zeroing the tail chunk's rows
    pbuf = [[None] * 4 for _ in range(2)]  # warp w's slots of P (WG1 warp w reads WG0 warp w's)
    inited, exited = [False, False], [0, 0]
    unsent = {}  # warp -> its remote arrivals not yet performed
    B, CL = 256, 512

    def reach(x, what):
        assert inited[x], f"{what} reached CTA {x} before its barriers exist"
        assert exited[x] < 8, f"{what} reached CTA {x} after it exited"

    def land(x, s, j, c):
        reach(x, f"copy of chunk {c}")
        if held[x][s][j] != c:
            assert owed[x][s][j] == 0, (f"chunk {c} copied into CTA {x} stage {s} group {j} while "
                                        f"{owed[x][s][j]} warps still read chunk {held[x][s][j]}")
            held[x][s][j], landed[x][s][j] = c, 0
            owed[x][s][j] = 8 if 4 <= j < 8 else 4
        landed[x][s][j] += 1
        full[x][s][j].complete_tx(1)

    def load(r, c):
        s = c & 1
        for j in range(G):
            full[r][s][j].arrive(boxes)  # arrive.expect_tx: the chunk's bytes of the group
        for _ in range(boxes):
            for j in halves[r]:
                for x in (0, 1):
                    sim.copy(lambda x=x, j=j: land(x, s, j, c))

    def read(r, s, js, c, who):
        for j in js:
            assert held[r][s][j] == c and landed[r][s][j] == boxes, (
                f"{who} read chunk {c} in group {j}: it holds {held[r][s][j]} "
                f"({landed[r][s][j]} of {boxes} boxes)")
        if tail and c == nchunks - 1:
            assert zeroed[r] == 4, f"{who} read the tail chunk with {zeroed[r]} of 4 shares zeroed"

    def free_stage(r, s, js, who):
        for j in js:
            owed[r][s][j] -= 1
        empty[r][s].arrive()
        if mutation != "local_empty":
            def remote():
                reach(r ^ 1, f"{who}'s remote arrival")
                empty[r ^ 1][s].arrive()
            unsent.setdefault(who, []).append(remote)
            sim.copy(remote)

    def cluster_sync(who):
        for cb in unsent.pop(who, []):  # release: the warp's remote arrivals are performed
            if cb in sim.pending_copies:
                sim.pending_copies.remove(cb)
                cb()
        return sim.sync("cluster", CL, what=f"{who} cluster")

    def wg1_warp(r, w):
        who = f"C{r}.W1.{w}"
        if mutation == "cta_init_sync":
            yield sim.sync((r, 0), B, what=f"{who} init")
        else:
            yield cluster_sync(who)
        if nchunks > 0:
            sim.copy(lambda: qbar[r].arrive())
            if w == 0:
                load(r, 0)
                if nchunks > 1:
                    load(r, 1)
        for c in range(nchunks):
            s, par = c & 1, (c >> 1) & 1
            yield sim.sync((r, 1), B, what=f"{who} P {c}")
            assert pbuf[r][w] == c, f"{who} read P of {pbuf[r][w]} for {c}"
            sim.named.arrive((r, 2), B, 32)
            for j in range(4, 8):
                yield ("wait", lambda s=s, j=j, par=par: full[r][s][j].passed(par), None, f"{who} full {c}")
            read(r, s, range(4, 8), c, who)
            yield ("step",)
            free_stage(r, s, range(4, 8), who)
            if c + 2 < nchunks:
                yield ("wait", lambda s=s, par=par: empty[r][s].passed(par), None, f"{who} empty {c}")
                if w == 0:
                    load(r, c + 2)
        yield sim.sync((r, 3), B, what=f"{who} final")
        if mutation != "no_exit_sync":
            yield cluster_sync(who)
        exited[r] += 1

    def wg0_warp(r, w):
        who = f"C{r}.W0.{w}"
        yield ("step",)  # the CTAs start at different times
        if w == 0:
            inited[r] = True  # thread 0 initializes the barriers, then the cluster barrier
        if mutation == "cta_init_sync":
            yield sim.sync((r, 0), B, what=f"{who} init")
        else:
            yield cluster_sync(who)
        if nchunks > 0:
            yield ("wait", lambda: qbar[r].passed(0), None, f"{who} q")
        for c in range(nchunks):
            s, par = c & 1, (c >> 1) & 1
            if tail and c == nchunks - 1:
                for j in range(G):
                    yield ("wait", lambda s=s, j=j, par=par: full[r][s][j].passed(par), None, f"{who} tail full")
                assert all(held[r][s][j] == c and landed[r][s][j] == boxes for j in range(G))
                yield ("step",)
                zeroed[r] += 1
                if mutation != "no_tail_bar":
                    yield sim.sync((r, 4), 128, what=f"{who} tail")
            for j in range(G):
                yield ("wait", lambda s=s, j=j, par=par: full[r][s][j].passed(par), None, f"{who} full {c}")
            read(r, s, range(G), c, who)
            yield ("step",)  # S and the softmax
            if c > 0:
                yield sim.sync((r, 2), B, what=f"{who} pfree {c}")
            pbuf[r][w] = c
            sim.named.arrive((r, 1), B, 32)
            read(r, s, range(4), c, who)
            yield ("step",)  # P·V on columns 0..255
            free_stage(r, s, range(G), who)
        if nchunks > 0:
            yield sim.sync((r, 2), B, what=f"{who} tail pfree")
        sim.named.arrive((r, 3), B, 32)
        if mutation != "no_exit_sync":
            yield cluster_sync(who)
        exited[r] += 1

    warps = {}
    for r in range(2):
        warps.update({f"C{r}.W0.{w}": wg0_warp(r, w) for w in range(4)})
        warps.update({f"C{r}.W1.{w}": wg1_warp(r, w) for w in range(4)})
    sim.run(warps)


def wgmma_keys_kernel(sim, nchunks, mutation=None, groups=9):
    """The keys-as-M kernel (bench/results/2026-12-06-session39-mla-keys-m.patch): the pipe
    kernel's loads (warpgroup 1, full barriers a column group, empty barriers of all 8 warps), with
    warpgroup 0 computing S of all groups, its 4 warps' row maxima meeting in a buffer of chunk
    c % 2 (named barrier 4, 128 threads), P and the factors in one shared tile written by all of
    warpgroup 0 (after P-free, barrier 2) and read by both warpgroups' P·V (warpgroup 0 after
    barrier 5 of its 128 threads, warpgroup 1 after P-ready, barrier 1); at the end the rows'
    sums through the maxima buffer of chunk nchunks % 2 and (m, l) to warpgroup 1 (barrier 3).
    mutation: 'one_red' (one maxima buffer: safe too, barrier 5 already orders every warp's reads
    of chunk c's maxima before any write of chunk c + 1's); forms the model must catch:
    'no_max_bar' (maxima read before all 4 warps wrote them), 'no_p0' (warpgroup 0 reads P before
    all its warps wrote it), 'no_pfree' (P rewritten while warpgroup 1 reads it)."""
    full = [[MBar(4) for _ in range(groups)] for _ in range(2)]
    empty = [MBar(8) for _ in range(2)]
    qbar = MBar(4)
    held = [[None] * groups for _ in range(2)]
    owed = [[0] * groups for _ in range(2)]
    ptile = [None] * 4            # chunk of each warpgroup-0 warp's share of P (and factors)
    p_unread = {}                 # chunk -> warps yet to read its P
    red = [[None] * 4 for _ in range(2)]  # chunk (or 'sum') of each warp's maxima in a buffer
    red_unread = {}               # (buffer, what) -> warps of warpgroup 0 yet to read it
    final = [False]
    B = 256

    def land(s, j, c):
        if held[s][j] != c:
            assert owed[s][j] == 0, f"chunk {c} copied into stage {s} group {j} while read"
            held[s][j], owed[s][j] = c, (8 if 4 <= j < 8 else 4)
        full[s][j].arrive()

    def load(c):
        for j in range(groups):
            sim.copy(lambda s=c & 1, j=j: land(s, j, c))

    def read_groups(s, js, c, who):
        for j in js:
            assert held[s][j] == c, f"{who} read chunk {c} in group {j}: {held[s][j]}"

    def free(s, js):
        for j in js:
            owed[s][j] -= 1
        empty[s].arrive()

    def read_p(c, who):
        assert all(x == c for x in ptile), f"{who} read P of chunk {c}: shares {ptile}"
        p_unread[c].discard(who)

    def write_p(w, c):
        for old, left in p_unread.items():
            assert old >= c or not left, f"P of chunk {c} written while {sorted(left)} read {old}"
        ptile[w] = c
        p_unread.setdefault(c, {f"W0.{x}" for x in range(4)} | {f"W1.{x}" for x in range(4)})

    def write_red(w, b, what):
        key = (b, red[b][w])
        assert not red_unread.get(key), f"maxima buffer {b} rewritten while {sorted(red_unread[key])} read"
        red[b][w] = what
        red_unread.setdefault((b, what), {f"W0.{x}" for x in range(4)})

    def read_red(b, what, who):
        assert all(x == what for x in red[b]), f"{who} read buffer {b} for {what}: {red[b]}"
        red_unread[(b, what)].discard(who)

    def wg1_warp(w):
        who = f"W1.{w}"
        if nchunks > 0:
            sim.copy(lambda: qbar.arrive())
            load(0)  # each warp's copies: one arrival of its on every group's barrier
            if nchunks > 1:
                load(1)
        for c in range(nchunks):
            s, par = c & 1, (c >> 1) & 1
            yield sim.sync(1, B, what=f"{who} P {c}")
            for j in range(4, 8):
                yield ("wait", lambda s=s, j=j, par=par: full[s][j].passed(par), None, f"{who} full {c}")
            read_groups(s, range(4, 8), c, who)
            yield ("step",)  # P·V: reads V and P
            read_p(c, who)
            sim.named.arrive(2, B, 32)
            free(s, range(4, 8))
            if c + 2 < nchunks:
                yield ("wait", lambda s=s, par=par: empty[s].passed(par), None, f"{who} empty {c}")
                load(c + 2)
        yield sim.sync(3, B, what=f"{who} final")
        assert final[0], f"{who} read (m, l) before they were written"

    def wg0_warp(w):
        who = f"W0.{w}"
        if nchunks > 0:
            yield ("wait", lambda: qbar.passed(0), None, f"{who} q")
        for c in range(nchunks):
            s, par = c & 1, (c >> 1) & 1
            for j in range(groups):
                yield ("wait", lambda s=s, j=j, par=par: full[s][j].passed(par), None, f"{who} full {c}")
            read_groups(s, range(groups), c, who)
            yield ("step",)  # S
            b = 0 if mutation == "one_red" else c & 1
            write_red(w, b, c)
            if mutation != "no_max_bar":
                yield sim.sync(4, 128, what=f"{who} max {c}")
            else:
                yield ("step",)
            read_red(b, c, who)
            yield ("step",)  # the softmax
            if c > 0 and mutation != "no_pfree":
                yield sim.sync(2, B, what=f"{who} pfree {c}")
            write_p(w, c)
            sim.named.arrive(1, B, 32)
            if mutation != "no_p0":
                yield sim.sync(5, 128, what=f"{who} P0 {c}")
            read_groups(s, range(4), c, who)
            yield ("step",)  # P·V
            read_p(c, who)
            free(s, range(groups))
        if nchunks > 0 and mutation != "no_pfree":
            yield sim.sync(2, B, what=f"{who} tail pfree")
        b = 0 if mutation == "one_red" else nchunks & 1
        write_red(w, b, "sum")
        yield sim.sync(4, 128, what=f"{who} sums")
        read_red(b, "sum", who)
        if w == 0:
            final[0] = True
        yield ("step",)
        sim.named.arrive(3, B, 32)

    warps = {f"W0.{w}": wg0_warp(w) for w in range(4)}
    warps.update({f"W1.{w}": wg1_warp(w) for w in range(4)})
    sim.run(warps)


def wgmma_seesaw_kernel(sim, nchunks, split, one_p_bar=False, groups=9):
    """The seesaw form (bench/results/2026-12-06-session37-mla-seesaw.patch): warpgroup c % 2 owns
    chunk c (its S and softmax) and hands P to the other through one buffer; both multiply P·V
    on their column halves (warpgroup v: groups 4v .. 4v + 3). split: each warpgroup reloads its
    own groups (0: 0-3 and 8; 1: 4-7) after its P·V, else warpgroup 1 reloads the stage once
    both are done (empty barriers). one_p_bar: both directions on one named barrier (the form
    that hung on the device)."""
    full = [[MBar(4) for _ in range(groups)] for _ in range(2)]  # one arrival a loader warp
    empty = [MBar(8) for _ in range(2)]
    qbar = MBar(4)
    stage = [[None] * groups for _ in range(2)]
    readers = [[0] * groups for _ in range(2)]
    pbuf = [None] * 4  # warp w's slots of P and the maxima (thread t128 writes and reads its own)
    B = 256
    own = [[0, 1, 2, 3, 8], [4, 5, 6, 7]]

    def p_bar(c):
        return 1 if one_p_bar else 1 + (c & 1)

    def load(c, gs):
        s = c & 1
        for j in gs:
            assert readers[s][j] == 0, f"refill of stage {s} group {j} while read"
            stage[s][j] = None

            def land(s=s, j=j):
                stage[s][j] = c
                full[s][j].arrive()
            sim.copy(land)

    def warp(wg, w):
        vg = range(4 * wg, 4 * wg + 4)

        def read(s, js, c, what):
            for j in js:
                assert stage[s][j] == c, f"W{wg}.{w} {what} chunk {c} group {j}: {stage[s][j]}"
                readers[s][j] += 1
            yield ("step",)
            for j in js:
                readers[s][j] -= 1

        def wait_groups(s, js, c, what):
            for j in js:
                yield ("wait", lambda s=s, j=j, par=(c >> 1) & 1: full[s][j].passed(par), None,
                       f"W{wg}.{w} {what} full {c}")

        def release(x):
            if split:
                if x + 2 < nchunks:
                    yield sim.sync(4 + wg, 128, what=f"W{wg}.{w} own pv {x}")
                    load(x + 2, own[wg])
                return
            empty[x & 1].arrive()
            if wg == 1 and x + 2 < nchunks:
                yield ("wait", lambda x=x: empty[x & 1].passed((x >> 1) & 1), None, f"W1 empty {x}")
                load(x + 2, range(groups))

        if nchunks > 0:
            if wg == 1:
                sim.copy(lambda: qbar.arrive())
            if split or wg == 1:
                for c in range(min(2, nchunks)):
                    load(c, own[wg] if split else range(groups))
            yield ("wait", lambda: qbar.passed(0), None, f"W{wg}.{w} q")
        for c in range(nchunks):
            s = c & 1
            if (c & 1) == wg:
                yield from wait_groups(s, range(groups), c, "S")
                yield from read(s, range(groups), c, "S")
                if c > 0:
                    yield sim.sync(p_bar(c - 1), B, what=f"W{wg}.{w} P {c - 1}")
                    assert pbuf[w] == c - 1, f"W{wg}.{w} read P {pbuf[w]} for {c - 1}"
                yield ("step",)  # the softmax
                pbuf[w] = c
                sim.named.arrive(p_bar(c), B, 32)
                if c > 0:
                    yield from wait_groups(s ^ 1, vg, c - 1, "PV")
                    yield from read(s ^ 1, vg, c - 1, "PV")
                    yield from release(c - 1)
                yield from read(s, vg, c, "PV")
                yield from release(c)
            elif c + 1 == nchunks:
                yield from wait_groups(s, vg, c, "PV last")
                yield sim.sync(p_bar(c), B, what=f"W{wg}.{w} P last {c}")
                assert pbuf[w] == c, f"W{wg}.{w} read P {pbuf[w]} for {c}"
                yield from read(s, vg, c, "PV last")
                yield from release(c)

    warps = {f"W{v}.{w}": warp(v, w) for v in range(2) for w in range(4)}
    sim.run(warps)


def main():
    rng = random.Random(3)
    runs = 0
    for nchunks in (0, 1, 2, 3, 4, 5, 7, 12):
        for NS in (2, 3, 5):
            for _ in range(150):
                decode_kernel(Sim(rng), nchunks, NS)
                runs += 1
        for _ in range(150):
            wgmma_pipe_kernel(Sim(rng), nchunks)
            runs += 1
        for split in (False, True):
            for _ in range(150):
                wgmma_seesaw_kernel(Sim(rng), nchunks, split)
                runs += 1
        for mutation in (None, "one_red"):
            for _ in range(100):
                wgmma_keys_kernel(Sim(rng), nchunks, mutation)
                runs += 1
        for boxes in (1, 2, 4):  # pages of 64, 32, 16 slots
            for tail in ((False, True) if nchunks > 0 else (False,)):
                for _ in range(50):
                    wgmma_pairs_kernel(Sim(rng), nchunks, boxes, tail)
                    runs += 1
    # The model must catch the seesaw form that hung on the device (one named barrier for both
    # directions of the P hand-off): some interleaving of an even chunk count deadlocks.
    caught = 0
    for _ in range(200):
        try:
            wgmma_seesaw_kernel(Sim(rng), 4, False, one_p_bar=True)
        except AssertionError:
            caught += 1
    assert caught > 0, "the model misses the one-barrier seesaw's deadlock"
    # And each broken form of the pairs' synchronization, in some interleaving.
    broken = {}
    for mutation in ("local_empty", "no_exit_sync", "cta_init_sync", "no_tail_bar"):
        broken[mutation] = 0
        for _ in range(200):
            try:
                wgmma_pairs_kernel(Sim(rng), 5, 2, True, mutation)
            except AssertionError:
                broken[mutation] += 1
        assert broken[mutation] > 0, f"the model misses the pairs' {mutation} form"
    for mutation in ("no_max_bar", "no_p0", "no_pfree"):
        broken["keys " + mutation] = 0
        for _ in range(200):
            try:
                wgmma_keys_kernel(Sim(rng), 5, mutation)
            except AssertionError:
                broken["keys " + mutation] += 1
        assert broken["keys " + mutation] > 0, f"the model misses the keys kernel's {mutation} form"
    print(f"{runs} random interleavings: no deadlock, no hazard (the one-barrier seesaw form: "
          f"{caught} of 200 caught; the pairs' broken forms: "
          + ", ".join(f"{m} {n} of 200" for m, n in broken.items()) + ")")


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print("FAIL:", e)
        sys.exit(1)
