#!/usr/bin/env python3
"""The layout check of the CUDA backend (src/backend/cuda/): issue 21's structure rules that a
script can see.

  - every file holds at most 600 lines (MAX_LINES), and dispatch.cc, if it comes back, 200;
  - no mutable state outside an object: no variable at namespace scope that is neither const nor
    constexpr (including __device__ / __constant__ / __managed__ ones), no non-const static data
    member, no non-const static local, no thread_local, except the once-guards of ONCE_GUARDS
    (they record that a per-device or per-process setup ran; they hold no tunable). Tunables live
    in CudaTunables (tunables.h), owned by the backend;
  - environment variables are read (getenv) and set (setenv) only in tunables.cc, and every name
    tunables.cc reads is documented in tunables.h's list;
  - only cpu_twin.cc (the declared table of the ops that run on the CPU twin) includes
    backend/cpu/.

The declarations are found line by line, which works on clang-formatted code (.ci/run checks the
format first): namespace contents start at column 0, class and function bodies are indented.
Exits 1 and prints `file:line: ...` for each violation.

Usage: scripts/check_cuda_layout.py [ROOT]     (ROOT: the checkout; default: this script's ../)
Python 3 standard library only. Run by .ci/run and by ctest (tests/scripts/).
"""
import re
import sys
from pathlib import Path

CUDA = "src/backend/cuda"
MAX_LINES = 600
DISPATCH_MAX_LINES = 200
SOURCES = {".h", ".cc", ".cu", ".cuh"}
# Static locals that only say "this setup already ran" (launch.h PerDeviceOnce, std::call_once).
ONCE_GUARDS = ("std::once_flag", "PerDeviceOnce")
ENV_FILE = "tunables.cc"
ENV_DOC = "tunables.h"
TWIN_FILE = "cpu_twin.cc"

# Column-0 statements that declare no variable.
NOT_VARIABLE = re.compile(
    r"^(using|typedef|template|static_assert|namespace|friend|struct|class|union|enum|extern\s+\"C\""
    r"|extern\s+template|extern\s+__shared__|return|case|default|public|private|protected)\b")
CONST = re.compile(r"\b(const|constexpr|constinit\s+const)\b")
STATIC_LOCAL = re.compile(r"^\s+(static|thread_local)\s+(?!_assert|_cast)")
ENV_CALL = re.compile(r"\b(std::)?(getenv|setenv|putenv|unsetenv)\s*\(")
ENV_NAME = re.compile(r"\bgetenv\s*\(\s*\"([A-Za-z0-9_]+)\"")
TWIN_INCLUDE = re.compile(r'^\s*#\s*include\s*"backend/cpu/')


def code_lines(text: str) -> list:
    """The file's lines with comments, string and character literals blanked (line count kept),
    preprocessor lines (and their continuations) emptied."""
    out, i, n = [], 0, len(text)
    buf = []
    in_block = False
    while i < n:
        c = text[i]
        if in_block:
            if text.startswith("*/", i):
                in_block, i = False, i + 2
                continue
            if c == "\n":
                buf.append(c)
            i += 1
            continue
        if text.startswith("/*", i):
            in_block, i = True, i + 2
            continue
        if text.startswith("//", i):
            while i < n and text[i] != "\n":
                i += 1
            continue
        if c in "\"'":
            # a raw string literal R"(...)" is not used in the backend; plain literals are blanked
            q, j = c, i + 1
            while j < n and text[j] != q and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            buf.append(q + q)
            i = j + 1
            continue
        buf.append(c)
        i += 1
    lines = "".join(buf).split("\n")
    cont = False
    for line in lines:
        if cont or line.lstrip().startswith("#"):
            cont = line.rstrip().endswith("\\")
            out.append("")
        else:
            out.append(line)
    return out


def statement(lines: list, k: int) -> str:
    """The statement starting at line k, up to its first `;` or `{` (joined over lines)."""
    parts = []
    for line in lines[k:k + 20]:
        parts.append(line.strip())
        joined = " ".join(parts)
        if ";" in joined or "{" in joined:
            return joined
    return " ".join(parts)


def mutable_state(lines: list) -> list:
    """(line number, what) of each mutable declaration the rules forbid."""
    found = []
    for k, line in enumerate(lines):
        if not line.strip():
            continue
        if line[0] not in " \t}":  # a namespace-scope statement
            s = statement(lines, k)
            if NOT_VARIABLE.match(s) or s.startswith("}"):
                continue
            head = re.split(r"[;{=]", s, maxsplit=1)[0]
            if "(" in head or CONST.search(head) or not re.search(r"\w", head):
                continue  # a function (declared or defined), a constant
            found.append((k + 1, f"mutable namespace-scope variable: {head.strip()}"))
        elif STATIC_LOCAL.match(line):
            s = statement(lines, k)
            head = re.split(r"[;{=(]", s, maxsplit=1)[0]
            delim = s[len(head):len(head) + 1]
            if delim == "(" and "thread_local" not in head:
                continue  # a static member function or a local function declaration
            if CONST.search(head) or any(g in head for g in ONCE_GUARDS):
                continue
            found.append((k + 1, f"mutable static or thread_local: {head.strip()}"))
    return found


def check_tree(root: Path) -> list:
    cuda = root / CUDA
    errors = []
    env_names = set()
    for path in sorted(cuda.rglob("*")):
        if path.suffix not in SOURCES or not path.is_file():
            continue
        rel = path.relative_to(root).as_posix()
        text = path.read_text(encoding="utf-8", errors="replace")
        raw = text.split("\n")
        n = len(raw) - (1 if text.endswith("\n") else 0)
        limit = DISPATCH_MAX_LINES if path.name == "dispatch.cc" else MAX_LINES
        if n > limit:
            errors.append(f"{rel}: {n} lines, over the {limit} of a file in {CUDA}/ (issue 21: "
                          "split it by what its parts do)")
        lines = code_lines(text)
        for line_no, what in mutable_state(lines):
            errors.append(f"{rel}:{line_no}: {what} (tunables belong in CudaTunables, "
                          f"{CUDA}/{ENV_DOC}; once-guards: {', '.join(ONCE_GUARDS)})")
        for k, line in enumerate(lines):
            if ENV_CALL.search(line) and path.name != ENV_FILE:
                errors.append(f"{rel}:{k + 1}: reads or sets the environment outside {ENV_FILE} "
                              f"(every variable is read there and documented in {ENV_DOC})")
        for k, line in enumerate(raw):
            if TWIN_INCLUDE.match(line) and path.name != TWIN_FILE:
                errors.append(f"{rel}:{k + 1}: includes backend/cpu/: only {TWIN_FILE} (the "
                              "declared CPU-twin table) may")
        if path.name == ENV_FILE:
            env_names = {(k + 1, m.group(1)) for k, line in enumerate(raw)
                         for m in ENV_NAME.finditer(line)}
    doc = cuda / ENV_DOC
    doc_text = doc.read_text(encoding="utf-8", errors="replace") if doc.is_file() else ""
    for line_no, name in sorted(env_names):
        if not re.search(rf"^//.*\b{name}\b", doc_text, re.M):
            errors.append(f"{CUDA}/{ENV_FILE}:{line_no}: {name} is not in {CUDA}/{ENV_DOC}'s list "
                          "of environment variables")
    return errors


def main(argv: list) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent.parent
    if not (root / CUDA).is_dir():
        print(f"check_cuda_layout: {root} has no {CUDA}/", file=sys.stderr)
        return 2
    errors = check_tree(root)
    for e in errors:
        print(e)
    if errors:
        print(f"check_cuda_layout: {len(errors)} violation(s) of {CUDA}/'s layout rules",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
