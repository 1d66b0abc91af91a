#!/usr/bin/env python3
"""Reads the hidden states `strata generate --capture-hidden-states` stores, and converts them to
SpecForge's offline layout (issue 25).

Layout (src/pipeline/hidden_store.h): DIR/hidden/NAME/ holds meta.json, index.jsonl (one line per
record: dataset, id, shard (the file holding it), tokens, and per tensor its dtype, shape, byte
offset in that file and byte count) and the safetensors files: one rec-NNNNNNNN.safetensors per
record (earlier versions: several records per shard-NNNNN.safetensors; read the same way). Per
record, T = prompt + response tokens:
  aux_hidden_state  [T, k*H] bf16   outputs of the k aux layers (eagle3: [1, L//2-1, L-4]), concatenated
  hidden_state      [T, H]   bf16   the final norm's output
  input_ids         [T]      int32
  loss_mask         [T]      int32  1 on assistant tokens

Usage:
  python3 tools/hidden_states.py show HIDDEN_DIR [--id ID]       summary, or one record's tensors
  python3 tools/hidden_states.py to-specforge HIDDEN_DIR OUT_DIR  SpecForge's offline files:
      OUT_DIR/rows_{start}-{end}/data_{i}.ckpt, torch.save'd dicts as its
      scripts/prepare_hidden_states.py writes them: input_ids [T] int64, loss_mask [T] int64,
      hidden_state [1, T, H] and aux_hidden_state [1, T, k*H] in the stored dtype; groups of 5,000
      (its group_size); OUT_DIR/ids.jsonl says which record each i is.

Reading needs only the standard library (raw bytes); tensors and the converter need PyTorch.
"""
import argparse
import json
import os
import sys

GROUP_SIZE = 5000  # SpecForge's prepare_hidden_states.py: rows_{start}-{start + 5000}


class HiddenStates:
    """The records of one hidden directory, by (dataset, id), in commit order."""

    def __init__(self, hidden_dir):
        self.dir = hidden_dir
        with open(os.path.join(hidden_dir, "meta.json")) as f:
            self.meta = json.load(f)
        self.entries = []
        with open(os.path.join(hidden_dir, "index.jsonl")) as f:
            for line in f:
                if line.endswith("\n"):  # a torn last line never committed
                    self.entries.append(json.loads(line))
        self.by_key = {(e["dataset"], e["id"]): e for e in self.entries}

    def __len__(self):
        return len(self.entries)

    def keys(self):
        return [(e["dataset"], e["id"]) for e in self.entries]

    def find(self, record_id, dataset=None):
        for e in self.entries:
            if e["id"] == record_id and (dataset is None or e["dataset"] == dataset):
                return e
        raise KeyError(record_id)

    def raw(self, entry):
        """{name: (dtype, shape, bytes)} of one index entry."""
        out = {}
        with open(os.path.join(self.dir, entry["shard"]), "rb") as f:
            for name, t in entry["tensors"].items():
                f.seek(t["offset"])
                data = f.read(t["nbytes"])
                if len(data) != t["nbytes"]:
                    raise IOError(f"{entry['shard']}: {name} of {entry['id']} is truncated")
                out[name] = (t["dtype"], t["shape"], data)
        return out

    def tensors(self, entry):
        """{name: torch.Tensor} of one index entry (needs PyTorch)."""
        import torch
        dtypes = {"BF16": torch.bfloat16, "F32": torch.float32, "I32": torch.int32}
        out = {}
        for name, (dtype, shape, data) in self.raw(entry).items():
            out[name] = torch.frombuffer(bytearray(data), dtype=dtypes[dtype]).reshape(shape)
        return out


def to_specforge(store, out_dir):
    """Writes SpecForge's offline layout; returns the number of files."""
    import torch
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "ids.jsonl"), "w") as ids:
        for i, entry in enumerate(store.entries):
            start = (i // GROUP_SIZE) * GROUP_SIZE
            group = os.path.join(out_dir, f"rows_{start}-{start + GROUP_SIZE}")
            os.makedirs(group, exist_ok=True)
            t = store.tensors(entry)
            data = {
                "input_ids": t["input_ids"].to(torch.long),
                "loss_mask": t["loss_mask"].to(torch.long),
                "hidden_state": t["hidden_state"].unsqueeze(0).contiguous(),
                "aux_hidden_state": t["aux_hidden_state"].unsqueeze(0).contiguous(),
            }
            torch.save(data, os.path.join(group, f"data_{i}.ckpt"))
            ids.write(json.dumps({"index": i, "dataset": entry["dataset"], "id": entry["id"]}) + "\n")
    return len(store.entries)


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    show = sub.add_parser("show")
    show.add_argument("hidden_dir")
    show.add_argument("--id")
    conv = sub.add_parser("to-specforge")
    conv.add_argument("hidden_dir")
    conv.add_argument("out_dir")
    args = p.parse_args(argv)
    store = HiddenStates(args.hidden_dir)
    if args.cmd == "show":
        if args.id is None:
            tokens = sum(e["tokens"] for e in store.entries)
            print(json.dumps({"records": len(store), "tokens": tokens, "meta": store.meta}, indent=1))
        else:
            for name, (dtype, shape, data) in store.raw(store.find(args.id)).items():
                print(f"{name}: {dtype} {shape} ({len(data)} bytes)")
        return 0
    n = to_specforge(store, args.out_dir)
    print(f"wrote {n} records to {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
