"""tools/eagle3_train.py's own checks (issue 26), on a random drafter shaped for house-llama:
  - the training-time-test unroll computes what plain causal inference does: step k of row p
    equals a sequence of the p + 1 prefix rows followed by k draft rows fed their own hidden;
  - the draft vocabulary: the most frequent response tokens, d2t and t2d consistent;
  - the files it writes read back (safetensors without the safetensors package);
  - the device path's batches (records packed into flat tensors) equal the host path's, the
    capture layout check refuses what strata does not write, the cosine schedule's ends.
Needs PyTorch (Debian's python3-torch or the GPU machine's); skipped without it. STRATA_SHARED_DIR
(ctest sets it) locates house-llama."""
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
try:
    import torch
    import eagle3_train as E
except ImportError:
    torch = None

SHARED = os.environ.get("STRATA_SHARED_DIR", os.path.join(HERE, "..", "..", "..", "shared"))
TARGET = os.path.join(SHARED, "models", "house-llama")


@unittest.skipIf(torch is None, "PyTorch is not installed")
class Eagle3Train(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        torch.set_num_threads(1)
        cls.tmp = tempfile.TemporaryDirectory()
        E.main(["init", "--target", TARGET, "--out", cls.tmp.name, "--draft-vocab", "64"])
        cls.m = E.load_drafter(cls.tmp.name, TARGET)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_unroll_is_causal_inference(self):
        m, L, steps = self.m, 7, 3
        g = torch.Generator().manual_seed(5)
        ids = torch.randint(0, 8192, (1, L + steps), generator=g)
        aux = torch.randn(1, L, 3 * 320, generator=g)
        with torch.no_grad():
            outs = E.unroll_with_tokens(m, ids, aux, steps)
            for p in (0, 3, L - 1):
                # prefix rows 0..p, then draft rows: own hidden, tokens p + 2.., positions p + 1..
                x = m.fc(aux[:, :p + 1])
                toks = ids[:, 1:p + 2]
                pos = torch.arange(p + 1)
                for k in range(steps):
                    n = x.shape[1]
                    mask = torch.full((n, n), float("-inf")).triu(1)
                    h = m.step(toks, x, pos[None], [], mask)
                    self.assertLess(float((h[0, p + k] - outs[k][0][0, p]).abs().max()), 1e-4,
                                    f"row {p} step {k}")
                    x = torch.cat([x, h[:, -1:]], 1)
                    toks = torch.cat([toks, ids[:, p + 2 + k:p + 3 + k]], 1)
                    pos = torch.cat([pos, torch.tensor([p + 1 + k])])

    def test_draft_vocabulary(self):
        class R:
            items = [("a", torch.tensor([5, 9, 9, 7, 9, 7]), torch.tensor([0, 1, 1, 1, 1, 1]), None,
                      None)]
        d2t, t2d, covered = E.choose_vocab(R, 16, 2)
        self.assertEqual((torch.arange(2) + d2t).tolist(), [7, 9])  # sorted ids of the top 2
        self.assertEqual(t2d.nonzero().flatten().tolist(), [7, 9])
        self.assertAlmostEqual(covered, 1.0)
        d2t, t2d, covered = E.choose_vocab(R, 16, 1)
        self.assertEqual((torch.arange(1) + d2t).tolist(), [9])
        self.assertAlmostEqual(covered, 3 / 5)

    def test_packed_batch_is_make_batch(self):
        # the device path gathers from flat tensors what the host path pads record by record
        g = torch.Generator().manual_seed(3)

        def record(i, n):
            return (f"r{i}", torch.randint(0, 8192, (n,), generator=g),
                    torch.randint(0, 2, (n,), generator=g), torch.randn(n, 960).bfloat16(),
                    torch.randn(n, 320).bfloat16())

        class R:
            items = [record(i, n) for i, n in enumerate([5, 9, 1, 7])]
        head = torch.randn(64, 320)
        packed = E.Packed(R, "cpu")
        for index in ([0], [1, 3], [3, 2, 0, 1]):
            want = E.make_batch([R.items[i] for i in index], head)
            got = packed.batch(index, head)
            for name, w, h in zip(("ids", "mask", "aux", "target"), want, got):
                self.assertEqual(w.shape, h.shape, name)
                self.assertTrue(torch.allclose(w.float(), h.float(), atol=1e-5), f"{index} {name}")

    def test_capture_layout_is_checked(self):
        t = {"input_ids": {"dtype": "I32", "shape": [4]},
             "loss_mask": {"dtype": "I32", "shape": [4]},
             "aux_hidden_state": {"dtype": "BF16", "shape": [4, 960]},
             "hidden_state": {"dtype": "BF16", "shape": [4, 320]}}
        E.check_entry("d", {"id": "x", "tokens": 4, "tensors": t}, 320, 3)  # as strata writes
        bad = dict(t, aux_hidden_state={"dtype": "BF16", "shape": [4, 640]})
        with self.assertRaisesRegex(SystemExit, "aux_hidden_state"):
            E.check_entry("d", {"id": "x", "tokens": 4, "tensors": bad}, 320, 3)
        bad = {k: v for k, v in t.items() if k != "loss_mask"}
        with self.assertRaisesRegex(SystemExit, "tensors"):
            E.check_entry("d", {"id": "x", "tokens": 4, "tensors": bad}, 320, 3)

    def test_cosine_schedule_ends_low(self):
        class A:
            lr, warmup, schedule = 1e-3, 10, "cosine"
        self.assertAlmostEqual(E.learning_rate(A, 0, None), 1e-4)  # warmup: 1 of 10
        self.assertAlmostEqual(E.learning_rate(A, 10, 510), 1e-3)  # the cosine's top
        self.assertAlmostEqual(E.learning_rate(A, 260, 510), (1e-3 + 5e-5) / 2)  # its middle
        self.assertAlmostEqual(E.learning_rate(A, 510, 510), 5e-5)  # lr / 20 at the end
        A.schedule = "constant"
        self.assertAlmostEqual(E.learning_rate(A, 500, 510), 1e-3)

    def test_written_drafter_reads_back(self):
        st = E.read_safetensors(os.path.join(self.tmp.name, "model.safetensors"))
        self.assertEqual(st["fc.weight"].shape, (320, 960))
        self.assertEqual(st["midlayer.self_attn.q_proj.weight"].shape, (320, 640))
        self.assertEqual(st["lm_head.weight"].shape, (64, 320))
        self.assertEqual(st["t2d"].dtype, torch.bool)
        self.assertEqual(int(st["t2d"].sum()), 64)
        used = (torch.arange(64) + st["d2t"]).tolist()
        self.assertEqual(used, st["t2d"].nonzero().flatten().tolist())
        self.assertNotIn("embed_tokens.weight", st)  # shared with the target
        self.assertTrue(torch.equal(st["norm.weight"].float(), self.m.norm.detach()))


if __name__ == "__main__":
    unittest.main()
