"""tools/hidden_states.py against a real capture run: `strata generate --capture-hidden-states
eagle3` on house-llama (STRATA_BINARY, STRATA_SHARED_DIR from ctest), then the reader (index,
shards, their safetensors headers) and the SpecForge converter: the files load with torch.load
and have the keys, shapes and dtypes SpecForge's OfflineEagle3Dataset reads (input_ids [T],
loss_mask [T], hidden_state [1, T, H], aux_hidden_state [1, T, 3H]). The converter part needs
PyTorch (Debian's python3-torch, or the GPU machine's); it is skipped without it."""
import json
import os
import struct
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
import hidden_states  # noqa: E402

try:
    import torch
except ImportError:
    torch = None

BINARY = os.environ.get("STRATA_BINARY", "")
SHARED = os.environ.get("STRATA_SHARED_DIR", "")


@unittest.skipUnless(BINARY and SHARED, "needs STRATA_BINARY and STRATA_SHARED_DIR (ctest sets them)")
class HiddenStatesTool(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        d = cls.tmp.name
        prompts = os.path.join(d, "p.jsonl")
        with open(os.path.join(SHARED, "data", "prompts-define.jsonl")) as f, open(prompts, "w") as out:
            for _ in range(3):
                out.write(f.readline())
        cls.output = os.path.join(d, "out.jsonl")
        subprocess.run([BINARY, "generate", "--model-path", os.path.join(SHARED, "models", "house-llama"),
                        "--input", "define=" + prompts, "--output", cls.output, "--max-new-tokens", "6",
                        "--capture-hidden-states", "eagle3", "--no-progress"], check=True)
        cls.hidden = os.path.join(d, "hidden", "out")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_reader_matches_the_results_and_the_shard_headers(self):
        store = hidden_states.HiddenStates(self.hidden)
        self.assertEqual(store.meta["capture"]["layers"], [1, 3, 4])
        with open(self.output) as f:
            records = [json.loads(line) for line in f]
        self.assertEqual(len(store), len(records))
        for r in records:
            e = store.find(r["id"])
            self.assertEqual(e["tokens"], r["meta"]["prompt_tokens"] + r["meta"]["completion_tokens"])
            raw = store.raw(e)
            dtype, shape, data = raw["input_ids"]
            ids = struct.unpack(f"<{shape[0]}i", data)
            mask = struct.unpack(f"<{shape[0]}i", raw["loss_mask"][2])
            # The response (and only it: single-turn prompts) is masked.
            self.assertEqual(sum(mask), r["meta"]["completion_tokens"])
            self.assertEqual(raw["aux_hidden_state"][1], [e["tokens"], 3 * 320])
            self.assertEqual(len(ids), e["tokens"])
        # Each file is a safetensors file whose header names its records' tensors at the index's
        # offsets (one record per file).
        for shard in {e["shard"] for e in store.entries}:
            with open(os.path.join(self.hidden, shard), "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(n))
            for e in store.entries:
                if e["shard"] != shard:
                    continue
                for name, t in e["tensors"].items():
                    h = header[f"{e['dataset']}/{e['id']}/{name}"]
                    self.assertEqual(h["data_offsets"][0] + 8 + n, t["offset"])
                    self.assertEqual(h["shape"], t["shape"])

    @unittest.skipIf(torch is None, "PyTorch is not installed")
    def test_specforge_layout_loads_with_torch(self):
        store = hidden_states.HiddenStates(self.hidden)
        out = os.path.join(self.tmp.name, "specforge")
        self.assertEqual(hidden_states.to_specforge(store, out), len(store))
        files = sorted(os.path.join(root, f) for root, _, fs in os.walk(out) for f in fs if f.endswith(".ckpt"))
        self.assertEqual(len(files), len(store))
        for path in files:
            self.assertIn(os.sep + "rows_0-5000" + os.sep, path)
            data = torch.load(path)
            t = data["input_ids"].shape[0]
            self.assertEqual(set(data), {"input_ids", "loss_mask", "hidden_state", "aux_hidden_state"})
            self.assertEqual(data["input_ids"].dtype, torch.long)
            self.assertEqual(data["loss_mask"].shape, (t,))
            self.assertEqual(data["hidden_state"].shape, (1, t, 320))
            self.assertEqual(data["aux_hidden_state"].shape, (1, t, 960))
            self.assertEqual(data["hidden_state"].dtype, torch.bfloat16)
            # What OfflineEagle3Dataset.process_data does with them.
            target = data["hidden_state"].squeeze(0)[:2048][None, :]
            self.assertEqual(target.shape, (1, t, 320))
            self.assertTrue(torch.isfinite(data["aux_hidden_state"].float()).all())


if __name__ == "__main__":
    unittest.main()
