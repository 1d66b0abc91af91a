#!/usr/bin/env python3
"""The include-rule check: design.md §2's dependency arrows, one folder at a time.

Every `#include` of src/ and tools/ is read. A quoted include names a folder under src/ by its
path ("engine/batch_plan.h"); it must be the includer's own folder or one that RULES lets the
includer's folder use. Angle includes are checked only for the libraries in LIBRARIES (CUDA and
NCCL headers, the HTTP and CLI libraries) and for nothing else (the standard library, POSIX, fmt
and nlohmann-json are everyone's). Exits 1 and prints `file:line: ...` for each violation.

Usage: scripts/check_includes.py [ROOT]     (ROOT: the checkout; default: this script's ../)
Python 3 standard library only. Run by .ci/run and by ctest (tests/scripts/).
"""
import re
import sys
from pathlib import Path

# A file's folder is its first path component under src/, except these sub-folders, which are
# folders of their own (a backend implementation is not the op interface; the template
# interpreter is not the tokenizer).
SUBFOLDERS = {"backend/cpu", "backend/cuda", "backend/factory", "tokenizer/jinja"}

# folder -> the other folders it may include (its own always; core is listed where allowed).
RULES = {
    # dtypes, Tensor, Status, CHECK, logging: the bottom, includes nothing of ours.
    "core": set(),
    # config.json -> ModelSpec, safetensors, quantized formats: a description, no math.
    "model": {"core"},
    # page pool, radix cache, host-tier policy: metadata only, no device code.
    "kv": {"core"},
    # the tokenizer, chat templates (over the interpreter) and the prompt encoder.
    "tokenizer": {"core", "tokenizer/jinja"},
    # the Jinja interpreter knows no tokenizer.
    "tokenizer/jinja": {"core"},
    # the op interface: tensors and page tables, never models or requests.
    "backend": {"core"},
    # the CPU reference implements the interface.
    "backend/cpu": {"core", "backend"},
    # the CUDA backend; cpu_twin.cc runs the ops not yet on the GPU on the CPU reference.
    "backend/cuda": {"core", "backend", "backend/cpu"},
    # the one place that picks a concrete backend and communicator (rank_factory.h).
    "backend/factory": {"core", "backend", "backend/cpu", "backend/cuda"},
    # each architecture's forward pass, against the op interface.
    "arch": {"core", "model", "backend"},
    # the capacity model: pure functions of the model's description.
    "planner": {"core", "model"},
    # requests, scheduler, BatchPlan, sampler, the engine loop: the op interface headers only,
    # never backend/cpu, backend/cuda or the factory (a ParallelRuntime brings other ranks).
    "engine": {"core", "arch", "kv", "planner", "tokenizer", "model", "backend"},
    # the distributed runtime: the engine's ParallelRuntime, BatchPlan broadcast, the sharded
    # model (arch, model), rank resources from the backend factory, the host tier (kv).
    "dist": {"core", "engine", "backend", "backend/factory", "arch", "model", "kv"},
    # HTTP and the OpenAI schema over the engine; prompts through the tokenizer's encoder.
    "server": {"core", "engine", "tokenizer"},
    # batch jobs: the engine or a server as a prompt target; prompts through the encoder.
    "pipeline": {"core", "engine", "tokenizer"},
    # KV quality: teacher-forced forwards of arch::Model with the engine's KV configuration, the
    # planner's pool size, the model's weights.
    "eval": {"core", "engine", "arch", "model", "planner", "tokenizer"},
}
# tools/: thin mains over everything except the concrete backends.
RULES["tools"] = (set(RULES) | {"dist", "server", "pipeline", "eval"}) - {"backend/cpu", "backend/cuda"}
FOLDERS = set(RULES) - {"tools"}

# Angle includes that only some folders may use: (pattern, folders, what).
LIBRARIES = [
    (re.compile(r"^(cuda|cublas|curand|cusparse|cusolver|cufft|nvrtc|nvml|nccl|mma)\w*\.h$"
                r"|^(cub|thrust|cuda|cute|cutlass|nvtx3)/"),
     {"backend/cuda"}, "CUDA/NCCL header: only backend/cuda/ talks to the device"),
    (re.compile(r"^microhttpd\.h$"), {"server"}, "the HTTP server library belongs to server/"),
    (re.compile(r"^httplib\.h$"), {"pipeline"}, "the HTTP client belongs to pipeline/ (generate --server)"),
    (re.compile(r"^CLI/"), {"tools"}, "command-line parsing belongs to tools/"),
    (re.compile(r"^pcre2\.h$"), {"tokenizer"}, "the pre-tokenizer's regex library belongs to tokenizer/"),
    (re.compile(r"^spdlog/"), {"core"}, "logging goes through core/log.h"),
]

INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
SOURCES = {".h", ".cc", ".cu", ".cuh"}


def folder_of(rel: str) -> str:
    """The folder of a path relative to src/ ("backend/cuda/x.cu" -> "backend/cuda")."""
    parts = rel.split("/")
    if len(parts) > 2 and "/".join(parts[:2]) in SUBFOLDERS:
        return "/".join(parts[:2])
    return parts[0]


def check_file(path: Path, folder: str, root: Path) -> list:
    src = root / "src"
    errors = []
    allowed = RULES[folder] | {folder}
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            kind, name = m.groups()
            where = f"{path.relative_to(root).as_posix()}:{n}"
            if kind == "<":
                for pattern, folders, what in LIBRARIES:
                    if pattern.search(name) and folder not in folders:
                        errors.append(f"{where}: {folder}/ includes <{name}> ({what})")
                continue
            if (path.parent / name).is_file() and "/" not in name:
                continue  # a header beside the includer (tools/'s "command.h"): its own folder
            target = folder_of(name)
            if target not in FOLDERS or not (src / name).is_file():
                errors.append(f'{where}: {folder}/ includes "{name}", which is no header under src/')
            elif target not in allowed:
                may = ", ".join(sorted(allowed - {folder})) or "nothing of ours"
                errors.append(f'{where}: {folder}/ includes "{name}" ({target}/); {folder}/ may '
                              f"include {may} (scripts/check_includes.py RULES, design.md §2)")
    return errors


def check_tree(root: Path) -> list:
    src = root / "src"
    errors = []
    for path in sorted(src.rglob("*")):
        if path.suffix not in SOURCES or not path.is_file():
            continue
        folder = folder_of(path.relative_to(src).as_posix())
        if folder not in RULES:
            errors.append(f"{path.relative_to(root).as_posix()}: src/{folder}/ has no row in "
                          "scripts/check_includes.py RULES")
            continue
        errors += check_file(path, folder, root)
    for path in sorted((root / "tools").rglob("*")):
        if path.suffix in SOURCES and path.is_file():
            errors += check_file(path, "tools", root)
    return errors


def main(argv: list) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent.parent
    if not (root / "src").is_dir():
        print(f"check_includes: {root} has no src/", file=sys.stderr)
        return 2
    errors = check_tree(root)
    for e in errors:
        print(e)
    if errors:
        print(f"check_includes: {len(errors)} include(s) break the layering", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
