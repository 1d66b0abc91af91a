#!/usr/bin/env python3
"""Instruction counts of the loops in a `cuobjdump -sass` dump, per kernel.

A loop is a backward branch (BRA to a lower address); for each kernel matching --kernel, the
loops holding mma (HMMA) instructions are listed innermost first with their size in
instructions and the counts of the opcodes that matter for a streaming GEMV: tensor-core ops,
shared/global loads, the lop3/shift of the nibble conversion, float ops, branches. Dividing a
loop's size by its tiles (HMMA / 4 for one n tile) gives warp instructions per 512-byte tile.

Usage: sass_loops.py DUMP [--kernel SUBSTRING]...
"""
import re
import sys
from collections import Counter

FUNC = re.compile(r"^\s*Function : (\S+)")
INSN = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")
BRA = re.compile(r"0x([0-9a-f]+)")
GROUPS = [("HMMA", "HMMA"), ("LDS", "LDS"), ("LDG", "LDG"), ("LOP3", "LOP3"),
          ("SHF", "SHF"), ("FFMA", "FFMA"), ("FADD", "FADD"), ("IMAD", "IMAD"),
          ("SYNCS", "SYNCS"), ("UBLKCP", "UBLKCP"), ("BRA", "BRA"), ("MOV", "MOV")]


def parse(path):
    funcs, cur = {}, None
    for line in open(path, errors="replace"):
        m = FUNC.match(line)
        if m:
            cur = m.group(1)
            funcs[cur] = []
            continue
        m = INSN.search(line)
        if m and cur is not None:
            funcs[cur].append((int(m.group(1), 16), m.group(3), m.group(4)))
    return funcs


def loops(insns):
    out = []
    for i, (addr, op, rest) in enumerate(insns):
        if not op.startswith("BRA"):
            continue
        t = BRA.search(rest)
        if not t:
            continue
        target = int(t.group(1), 16)
        if target < addr:
            body = [o for a, o, _ in insns if target <= a <= addr]
            out.append((len(body), target, addr, Counter(o.split(".")[0] for o in body)))
    return sorted(out)


def main():
    args = sys.argv[1:]
    if not args:
        print(__doc__)
        return 2
    path, kernels = args[0], []
    for i, a in enumerate(args):
        if a == "--kernel":
            kernels.append(args[i + 1])
    for name, insns in parse(path).items():
        if kernels and not any(k in name for k in kernels):
            continue
        ls = [l for l in loops(insns) if l[3]["HMMA"] > 0]
        if not ls:
            continue
        print(f"{name}: {len(insns)} instructions")
        for size, lo, hi, cnt in ls:
            tiles = cnt["HMMA"] / 4
            hist = " ".join(f"{g} {sum(v for k, v in cnt.items() if k.startswith(p))}"
                            for g, p in GROUPS)
            print(f"  loop 0x{lo:x}-0x{hi:x}: {size} instructions, {tiles:g} tiles "
                  f"({size / tiles:.1f} per tile if one n tile): {hist}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
