#!/usr/bin/env python3
"""Trains an EAGLE-3 drafter from the hidden states `strata generate --capture-hidden-states eagle3`
stores (issue 26), and writes it as SpecForge and SGLang publish drafters: config.json
(LlamaForCausalLMEagle3) + model.safetensors.

The drafter (the forward strata's src/arch/eagle3.cc runs, written here once more in PyTorch):
  x      = fc(concat of the target's aux states [T, 3·H_target])       step 1
         = the drafter's own previous output hidden [T, H]              steps ≥ 2
  h      = concat(input_layernorm(embed(token)), hidden_norm(x))         [T, 2H]
  x     += o_proj(attention(q/k/v_proj(h)))                              rope at the row's position
  x     += mlp(post_attention_layernorm(x))
  hidden = x   (what the next draft step consumes)
  logits = lm_head(norm(x))  over the draft vocabulary; target id = i + d2t[i]
Row p of step 1 reads the target's states after token p and the embedding of token p + 1, at
position p; it predicts token p + 2.

Training-time test (SpecForge's OfflineEagle3Model, after its PR 244 "remove attention mask shift &
add pe shift"): step k (0-based) of the unroll feeds row p its own step k-1 output and the token
p + 1 + k at rope position p + k; its query sees step 0's keys of rows 0..p and the keys of steps
1..k at row p itself, which is exactly what a chain draft at inference sees (the prefix's KV, then
the earlier draft tokens). Loss per step: cross-entropy against the target's distribution over the
draft vocabulary, on rows whose predicted token is a response token (loss mask) and whose target
argmax is in the draft vocabulary, averaged over all rows; steps weighted 0.8^k (SpecForge's
train_eagle3.py). One deliberate difference: SpecForge weighs row p by the loss mask at the target
logits' position; here by the mask of the token those logits predict, so exactly the predictions of
response tokens are supervised.

The draft vocabulary: the draft_vocab_size most frequent next tokens under the loss mask (ties by
id), sorted by id (SpecForge's generate_vocab_mapping); d2t[i] = target id − i, t2d a bool mask.

Subcommands:
  train      --hidden DIR... --target MODEL --out DRAFTER   (prints per-step accuracy as it goes;
             --device cuda [--bf16] trains on the GPU: the records are packed into flat tensors
             there once and every batch is gathered on the device)
  accept     --hidden DIR --target MODEL --drafter DRAFTER  teacher-forced top-1 agreement per step
  check      --hidden DIR... --target MODEL                 the captures have the layout strata
             writes (tensors, dtypes, shapes, aux layers), and --disjoint-from DIR... shares no id
  init       --target MODEL --out DRAFTER                   random weights (tests)
  reference  --drafter DRAFTER --target MODEL --out FILE    the parity reference strata's
             golden test (tests/golden/eagle3) reads: random inputs, the outputs of step 1 and of
             step 2 fed its own hidden, float32

Runs with Debian's python3-torch (1.13, CPU) and current PyTorch (GPU machine); needs nothing else.
"""
import argparse
import json
import math
import os
import random
import struct
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hidden_states  # noqa: E402

# ---------------------------------------------------------------------------------------------
# safetensors without the safetensors package

_ST_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16,
              "I64": torch.int64, "I32": torch.int32, "BOOL": torch.bool, "U8": torch.uint8}
_ST_NAMES = {v: k for k, v in _ST_DTYPES.items()}


def read_safetensors(path, names=None):
    """{name: tensor} (all, or only `names`)."""
    out = {}
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        base = 8 + n
        for name, t in header.items():
            if name == "__metadata__" or (names is not None and name not in names):
                continue
            begin, end = t["data_offsets"]
            f.seek(base + begin)
            data = bytearray(f.read(end - begin))
            dtype = _ST_DTYPES[t["dtype"]]
            if end == begin:
                out[name] = torch.zeros(t["shape"], dtype=dtype)
            else:
                out[name] = torch.frombuffer(data, dtype=dtype).reshape(t["shape"]).clone()
    return out


def write_safetensors(path, tensors, metadata=None):
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        # numpy has no bf16: every dtype's bytes go through a uint8 view
        raw = (t.to(torch.uint8) if t.dtype == torch.bool else t).reshape(-1).view(torch.uint8)
        raw = raw.numpy().tobytes()
        header[name] = {"dtype": _ST_NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------
# The drafter

def rms_norm(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def rope_tables(positions, head_dim, theta):
    """cos, sin [..., head_dim] for integer positions (Llama's rotate-half layout)."""
    dims = torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device)
    inv = 1.0 / (theta ** (dims / head_dim))
    freqs = positions.to(torch.float32)[..., None] * inv
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x, cos, sin):
    """x [B, heads, L, d]; cos/sin [B, L, d]."""
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None] + rot * sin[:, None]


class Drafter(torch.nn.Module):
    """LlamaForCausalLMEagle3's parameters under SpecForge's names; embeddings are the target's
    (frozen, not saved)."""

    def __init__(self, cfg, embed):
        super().__init__()
        self.cfg = cfg
        H, Ht = cfg["hidden_size"], cfg.get("target_hidden_size", cfg["hidden_size"])
        heads, kvh = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        hd = cfg.get("head_dim", H // heads)
        inter, dv = cfg["intermediate_size"], cfg["draft_vocab_size"]
        self.heads, self.kv_heads, self.head_dim = heads, kvh, hd
        self.eps, self.theta = cfg["rms_norm_eps"], cfg.get("rope_theta", 10000.0)
        L = torch.nn.Linear
        self.fc = L(3 * Ht, H, bias=False)
        self.hidden_norm = torch.nn.Parameter(torch.ones(H))
        self.input_layernorm = torch.nn.Parameter(torch.ones(H))
        self.post_attention_layernorm = torch.nn.Parameter(torch.ones(H))
        self.q_proj = L(2 * H, heads * hd, bias=False)
        self.k_proj = L(2 * H, kvh * hd, bias=False)
        self.v_proj = L(2 * H, kvh * hd, bias=False)
        self.o_proj = L(heads * hd, H, bias=False)
        self.gate_proj = L(H, inter, bias=False)
        self.up_proj = L(H, inter, bias=False)
        self.down_proj = L(inter, H, bias=False)
        self.norm = torch.nn.Parameter(torch.ones(H))
        self.lm_head = L(H, dv, bias=False)
        self.register_buffer("embed", embed, persistent=False)
        self.register_buffer("d2t", torch.zeros(dv, dtype=torch.int64))
        self.register_buffer("t2d", torch.zeros(cfg["vocab_size"], dtype=torch.bool))

    # names as SpecForge's state_dict writes them
    NAMES = {"fc": "fc.weight", "hidden_norm": "midlayer.hidden_norm.weight",
             "input_layernorm": "midlayer.input_layernorm.weight",
             "post_attention_layernorm": "midlayer.post_attention_layernorm.weight",
             "q_proj": "midlayer.self_attn.q_proj.weight", "k_proj": "midlayer.self_attn.k_proj.weight",
             "v_proj": "midlayer.self_attn.v_proj.weight", "o_proj": "midlayer.self_attn.o_proj.weight",
             "gate_proj": "midlayer.mlp.gate_proj.weight", "up_proj": "midlayer.mlp.up_proj.weight",
             "down_proj": "midlayer.mlp.down_proj.weight", "norm": "norm.weight",
             "lm_head": "lm_head.weight"}

    def _param(self, attr):
        m = getattr(self, attr)
        return m.weight if isinstance(m, torch.nn.Linear) else m

    def state_for_file(self, dtype=torch.bfloat16):
        out = {name: self._param(a).detach().to(dtype) for a, name in self.NAMES.items()}
        out["d2t"] = self.d2t.clone()
        out["t2d"] = self.t2d.clone()
        return out

    def load_file_state(self, st):
        with torch.no_grad():
            for a, name in self.NAMES.items():
                self._param(a).copy_(st[name].float())
            self.d2t.copy_(st["d2t"])
            self.t2d.copy_(st["t2d"])

    def step(self, ids, x, positions, cache, mask0):
        """One unrolled step over [B, L] rows. ids [B, L] (target ids), x [B, L, H] (fc output or
        the previous step's hidden), positions [B, L] (rope). cache: list of (k, v) [B, kvh, L, d]
        of earlier steps (step 0's are the context; later ones seen by their own row only);
        mask0 [L, L] additive mask over step 0's keys. Returns hidden [B, L, H] (pre-norm)."""
        B, L, H = x.shape
        e = F.embedding(ids, self.embed)
        h = torch.cat([rms_norm(e, self.input_layernorm, self.eps),
                       rms_norm(x, self.hidden_norm, self.eps)], dim=-1)
        q = self.q_proj(h).view(B, L, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(h).view(B, L, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(h).view(B, L, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = rope_tables(positions, self.head_dim, self.theta)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        cache.append((k, v))
        rep = self.heads // self.kv_heads
        scale = 1.0 / math.sqrt(self.head_dim)
        k0, v0 = cache[0]
        k0, v0 = k0.repeat_interleave(rep, 1), v0.repeat_interleave(rep, 1)
        scores = [torch.matmul(q, k0.transpose(2, 3)) * scale + mask0]  # [B, h, L, L]
        for kj, _ in cache[1:]:  # the row's own keys of steps 1..k: [B, h, L, 1]
            scores.append((q * kj.repeat_interleave(rep, 1)).sum(-1, keepdim=True) * scale)
        p = torch.softmax(torch.cat(scores, dim=-1).float(), dim=-1).to(q.dtype)
        out = torch.matmul(p[..., :L], v0)
        for j, (_, vj) in enumerate(cache[1:]):
            out = out + p[..., L + j:L + j + 1] * vj.repeat_interleave(rep, 1)
        out = out.transpose(1, 2).reshape(B, L, self.heads * self.head_dim)
        x = x + self.o_proj(out)
        m = rms_norm(x, self.post_attention_layernorm, self.eps)
        return x + self.down_proj(F.silu(self.gate_proj(m)) * self.up_proj(m))

    def logits(self, hidden):
        return self.lm_head(rms_norm(hidden, self.norm, self.eps))

    def unroll(self, ids, aux, steps):
        """The training-time-test unroll: ids [B, L] the sequence's tokens, aux [B, L, 3·Ht].
        Step k row p: token ids[p + 1 + k] (0 past the end) at position p + k. Returns the
        hidden [B, L, H] and draft logits [B, L, Vd] of every step."""
        B, L = ids.shape
        mask0 = torch.full((L, L), float("-inf"), device=ids.device).triu(1)
        base = torch.arange(L, device=ids.device)[None].expand(B, L)
        x = self.fc(aux)
        cache, outs = [], []
        for k in range(steps):
            tok = torch.zeros_like(ids)
            if L > k + 1:
                tok[:, :L - 1 - k] = ids[:, k + 1:]
            x = self.step(tok, x, base + k, cache, mask0)
            outs.append((x, self.logits(x)))
        return outs


def load_config(target_dir):
    with open(os.path.join(target_dir, "config.json")) as f:
        return json.load(f)


def drafter_config(target_cfg, draft_vocab, aux_layers):
    """config.json of a drafter shaped like one layer of the target (SpecForge's default)."""
    keep = ["hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
            "head_dim", "hidden_act", "max_position_embeddings", "rms_norm_eps", "rope_theta",
            "rope_scaling", "vocab_size", "pad_token_id", "bos_token_id", "eos_token_id"]
    cfg = {k: target_cfg[k] for k in keep if k in target_cfg}
    cfg.update({"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
                "num_hidden_layers": 1, "tie_word_embeddings": False, "attention_bias": False,
                "mlp_bias": False, "torch_dtype": "bfloat16", "draft_vocab_size": draft_vocab,
                "target_hidden_size": target_cfg["hidden_size"],
                "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(aux_layers),
                                 "use_aux_hidden_state": True}})
    return cfg


def target_tensor(target_dir, name):
    return read_safetensors(os.path.join(target_dir, "model.safetensors"), {name})[name].float()


def load_drafter(drafter_dir, target_dir):
    with open(os.path.join(drafter_dir, "config.json")) as f:
        cfg = json.load(f)
    st = read_safetensors(os.path.join(drafter_dir, "model.safetensors"))
    embed = st["embed_tokens.weight"].float() if "embed_tokens.weight" in st else \
        target_tensor(target_dir, "model.embed_tokens.weight")
    m = Drafter(cfg, embed)
    m.load_file_state(st)
    return m


def save_drafter(m, out_dir, extra_meta=None):
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(m.cfg, f, indent=2)
        f.write("\n")
    write_safetensors(os.path.join(out_dir, "model.safetensors"), m.state_for_file(),
                      {"format": "pt", **(extra_meta or {})})


def init_weights(m, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for a in Drafter.NAMES:
            p = m._param(a)
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
            else:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))


# ---------------------------------------------------------------------------------------------
# Data

# What `strata generate --capture-hidden-states eagle3` stores per record (tools/hidden_states.py
# documents the layout): T = prompt + response tokens, k aux layers of the target's width H. The
# trainer refuses anything else before training on it, naming what differs.
CAPTURE_TENSORS = {"input_ids": ("I32",), "loss_mask": ("I32",),
                   "aux_hidden_state": ("BF16", "F32"), "hidden_state": ("BF16", "F32")}


def check_entry(d, e, hidden_size, n_aux):
    """Raises SystemExit unless index entry e of hidden dir d has the layout above."""
    where = f"{d}: record {e.get('id')}"
    t = e.get("tensors", {})
    if set(t) != set(CAPTURE_TENSORS):
        raise SystemExit(f"{where}: tensors {sorted(t)}, expected {sorted(CAPTURE_TENSORS)}")
    T = e["tokens"]
    want = {"input_ids": [T], "loss_mask": [T], "aux_hidden_state": [T, n_aux * hidden_size],
            "hidden_state": [T, hidden_size]}
    for name, shape in want.items():
        if t[name]["shape"] != shape or t[name]["dtype"] not in CAPTURE_TENSORS[name]:
            raise SystemExit(f"{where}: {name} is {t[name]['dtype']} {t[name]['shape']}, expected "
                             f"{'/'.join(CAPTURE_TENSORS[name])} {shape}")


class Records:
    """Captured records (input_ids, loss_mask, aux, final-norm state) of some hidden dirs, checked
    against the layout strata writes (hidden_size: the target's, when known)."""

    def __init__(self, dirs, limit=None, hidden_size=None):
        self.items = []
        self.aux_layers = None
        for d in dirs:
            store = hidden_states.HiddenStates(d)
            capture = store.meta.get("capture", {})
            layers = capture.get("layers")
            H = capture.get("hidden_size")
            if not layers or H is None or (hidden_size is not None and H != hidden_size):
                raise SystemExit(f"{d}/meta.json: capture {capture} is not an eagle3 capture of a "
                                 f"target of hidden size {hidden_size}")
            if self.aux_layers is None:
                self.aux_layers = layers
            elif layers != self.aux_layers:
                raise SystemExit(f"{d}: aux layers {layers} differ from {self.aux_layers}")
            for e in store.entries:
                check_entry(d, e, H, len(layers))
                t = store.tensors(e)
                self.items.append((e["id"], t["input_ids"].long(), t["loss_mask"].long(),
                                   t["aux_hidden_state"], t["hidden_state"]))
                if limit and len(self.items) >= limit:
                    return

    def tokens(self):
        return sum(len(r[1]) for r in self.items)


def token_counts(records, vocab_size):
    """How often each token is a response token (under the loss mask)."""
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for _, ids, mask, _, _ in records.items:
        counts.index_add_(0, ids[mask.bool()], torch.ones(int(mask.sum()), dtype=torch.int64))
    return counts


def choose_vocab(records, vocab_size, draft_vocab):
    """(d2t, t2d) from next-token frequencies under the loss mask."""
    counts = token_counts(records, vocab_size)
    order = sorted(range(vocab_size), key=lambda i: (-int(counts[i]), i))
    used = sorted(order[:draft_vocab])
    covered = int(counts[used].sum()) / max(1, int(counts.sum()))
    d2t = torch.tensor(used, dtype=torch.int64) - torch.arange(draft_vocab)
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[used] = True
    return d2t, t2d, covered


def make_batch(items, draft_head):
    """Pads a list of records to one [B, L] batch: ids, loss mask, aux [B, L, 3Ht] float32, and
    the target's logits over the draft vocabulary [B, L, Vd] (draft_head: the target lm_head's
    rows of the draft tokens; None: no logits)."""
    L = max(len(r[1]) for r in items)
    B = len(items)
    ids = torch.zeros(B, L, dtype=torch.long)
    mask = torch.zeros(B, L)
    aux = torch.zeros(B, L, items[0][3].shape[-1])
    final = torch.zeros(B, L, items[0][4].shape[-1])
    for b, (_, i, m, a, h) in enumerate(items):
        n = len(i)
        ids[b, :n] = i
        mask[b, :n] = m.float()
        aux[b, :n] = a.float()
        final[b, :n] = h.float()
    target = None
    if draft_head is not None:
        with torch.no_grad():
            target = final @ draft_head.t()
    return ids, mask, aux, target


class Packed:
    """Records concatenated into flat tensors on one device (the states in their stored dtype), so
    that a batch is gathered there with one index per tensor instead of copied record by record
    from host memory: what keeps a GPU busy. batch() returns what make_batch does for the same
    records."""

    def __init__(self, records, device):
        items = records.items
        self.device = torch.device(device)
        self.lengths = torch.tensor([len(r[1]) for r in items], dtype=torch.long)
        self.starts = torch.cumsum(self.lengths, 0) - self.lengths
        self.ids = torch.cat([r[1] for r in items]).to(self.device)
        self.mask = torch.cat([r[2] for r in items]).float().to(self.device)
        self.aux = torch.cat([r[3] for r in items]).to(self.device)
        self.final = torch.cat([r[4] for r in items]).to(self.device)

    def __len__(self):
        return len(self.lengths)

    def batch(self, index, draft_head):
        sel = torch.tensor(index, dtype=torch.long)
        n = self.lengths[sel]
        L = int(n.max())
        pos = torch.arange(L)
        valid = pos[None] < n[:, None]
        flat = torch.where(valid, self.starts[sel][:, None] + pos[None],
                           torch.zeros_like(pos[None]))
        flat, valid = flat.to(self.device), valid.to(self.device)
        vf = valid.float()
        ids = self.ids[flat] * valid
        mask = self.mask[flat] * vf
        aux = self.aux[flat].float() * vf[..., None]
        target = None
        if draft_head is not None:
            with torch.no_grad():
                target = (self.final[flat].float() * vf[..., None]) @ draft_head.t()
        return ids, mask, aux, target


def shift(x, s):
    """x[:, s:] moved to the front, zeros after: row p reads row p + s."""
    out = torch.zeros_like(x)
    if x.shape[1] > s:
        out[:, :x.shape[1] - s] = x[:, s:]
    return out


def step_targets(ids, mask, target, t2d, k):
    """What step k of row p is trained on: the target's logits at position p + 1 + k over the
    draft vocabulary (they predict token p + 2 + k), and the row's weight: token p + 2 + k is a
    response token (loss mask) in the draft vocabulary. The data are the target's greedy outputs,
    so that token is the target's argmax (SpecForge masks rows whose target argmax is outside
    the draft vocabulary)."""
    nxt = shift(ids, k + 2)
    w = shift(mask, k + 2) * t2d[nxt].float()
    return shift(target, k + 1), w


def ttt_losses(model, ids, mask, aux, target, steps, autocast=None):
    """Per unrolled step: the loss, and (as tensors, so that no step waits for the device) the
    weighted count of top-1 agreements and of supervised rows."""
    if autocast is None:
        outs = model.unroll(ids, aux, steps)
    else:
        with autocast():
            outs = model.unroll(ids, aux, steps)
    losses, correct, counted = [], [], []
    for k, (_, logits) in enumerate(outs):
        tl, w = step_targets(ids, mask, target, model.t2d, k)
        p = torch.softmax(tl, -1)
        logp = torch.log_softmax(logits.float(), -1)
        losses.append(-(w * (p * logp).sum(-1)).mean())
        with torch.no_grad():
            correct.append(((logits.argmax(-1) == tl.argmax(-1)).float() * w).sum())
            counted.append(w.sum())
    return losses, correct, counted


def learning_rate(a, step, total_steps):
    """Linear warmup over a.warmup steps; then constant, or a cosine from a.lr down to a.lr / 20
    over the steps after the warmup (total_steps: the run's; None: not known yet, which only the
    warmup may not know)."""
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    if a.schedule == "constant":
        return a.lr
    progress = (step - a.warmup) / max(1, total_steps - a.warmup)
    floor = a.lr / 20
    return floor + (a.lr - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def pick_device(name):
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: PyTorch sees no CUDA device")
    if name == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # float32 weights, TF32 tensor-core GEMMs
        torch.backends.cudnn.allow_tf32 = True
    return torch.device(name)


def wait_for_peers(directory, count, timeout_s=300):
    """A barrier between training processes that share one GPU (candidates trained at once): each
    says it is ready in `directory` and waits until `count` have, so that every step rate is
    measured while all of them run."""
    os.makedirs(directory, exist_ok=True)
    open(os.path.join(directory, f"ready-{os.getpid()}"), "w").close()
    end = time.time() + timeout_s
    while len([f for f in os.listdir(directory) if f.startswith("ready-")]) < count:
        if time.time() > end:
            print(f"barrier {directory}: fewer than {count} peers after {timeout_s}s; going on",
                  flush=True)
            return
        time.sleep(0.2)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_autocast(a, device):
    """bf16 autocast (--bf16) for the unroll; the loss stays float32."""
    if not a.bf16:
        return None
    return lambda: torch.autocast(device_type=device.type, dtype=torch.bfloat16)


# ---------------------------------------------------------------------------------------------
# Commands

def cmd_check(a):
    """The capture layout, without reading the states: every index entry of every dir has the
    tensors, dtypes and shapes strata writes, the aux layers are the ones asked, and (with
    --disjoint-from) no record id of these dirs is in those dirs (held-out prompts)."""
    tcfg = load_config(a.target)
    ids, records, tokens, layers = set(), 0, 0, None
    for d in a.hidden:
        store = hidden_states.HiddenStates(d)
        cap = store.meta.get("capture", {})
        if cap.get("hidden_size") != tcfg["hidden_size"] or not cap.get("layers"):
            raise SystemExit(f"{d}/meta.json: capture {cap} is not an eagle3 capture of "
                             f"{a.target}")
        if layers is None:
            layers = cap["layers"]
        elif layers != cap["layers"]:
            raise SystemExit(f"{d}: aux layers {cap['layers']} differ from {layers}")
        if len(store) == 0:
            raise SystemExit(f"{d}: no records")
        for e in store.entries:
            check_entry(d, e, tcfg["hidden_size"], len(layers))
            ids.add((e["dataset"], e["id"]))
            tokens += e["tokens"]
        records += len(store)
        # one record read whole: the bytes are where the index says, and the mask marks a response
        t = store.tensors(store.entries[0])
        if int(t["loss_mask"].sum()) == 0 or int(t["input_ids"].max()) >= tcfg["vocab_size"]:
            raise SystemExit(f"{d}: record {store.entries[0]['id']} has no response tokens or "
                             f"token ids past the vocabulary")
    if a.aux_layers and layers != [int(x) for x in a.aux_layers.split(",")]:
        raise SystemExit(f"aux layers {layers}, expected {a.aux_layers}")
    for d in a.disjoint_from or []:
        both = ids & set(hidden_states.HiddenStates(d).keys())
        if both:
            raise SystemExit(f"{len(both)} records are also in {d}, e.g. {sorted(both)[:3]}")
    print(json.dumps({"records": records, "tokens": tokens, "aux_layers": layers}))


def cmd_train(a):
    torch.manual_seed(a.seed)
    random.seed(a.seed)
    torch.set_num_threads(a.threads)
    device = pick_device(a.device)
    t0 = time.time()
    tcfg = load_config(a.target)
    records = Records(a.hidden, a.limit, tcfg["hidden_size"])
    print(f"{len(records.items)} records, {records.tokens()} tokens, aux layers "
          f"{records.aux_layers} (read in {time.time() - t0:.1f}s)", flush=True)
    counts = token_counts(records, tcfg["vocab_size"])
    top = counts.sort(descending=True).values.cumsum(0).float() / max(1, int(counts.sum()))
    print("response-token coverage of the most frequent 512 / 1024 / 2048 / 4096: " +
          " / ".join(f"{100 * float(top[n - 1]):.2f}%" for n in (512, 1024, 2048, 4096)
                     if n <= len(top)), flush=True)
    d2t, t2d, covered = choose_vocab(records, tcfg["vocab_size"], a.draft_vocab)
    print(f"draft vocabulary {a.draft_vocab} of {tcfg['vocab_size']}: covers {100 * covered:.2f}% "
          f"of the response tokens", flush=True)
    cfg = drafter_config(tcfg, a.draft_vocab, records.aux_layers)
    embed = target_tensor(a.target, "model.embed_tokens.weight")
    lm_name = "lm_head.weight" if not tcfg.get("tie_word_embeddings") else "model.embed_tokens.weight"
    draft_head = target_tensor(a.target, lm_name)[t2d].contiguous()  # draft ids in order
    m = Drafter(cfg, embed)
    init_weights(m, a.seed)
    m.d2t.copy_(d2t)
    m.t2d.copy_(t2d)
    m.to(device)
    draft_head = draft_head.to(device)
    data = Packed(records, device)
    n_records = len(records.items)
    # length buckets: little padding; the records themselves now live in `data`
    order = sorted(range(n_records), key=lambda i: int(data.lengths[i]))
    del records
    autocast = make_autocast(a, device)
    params = [p for p in m.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.95), weight_decay=0.0)
    batches = [order[i:i + a.batch] for i in range(0, n_records, a.batch)]
    print(f"training on {device}{' (bf16 autocast)' if a.bf16 else ''}: {len(batches)} batches "
          f"of {a.batch} records (set up in {time.time() - t0:.1f}s)", flush=True)
    if a.barrier:
        wait_for_peers(a.barrier, a.barrier_count)
    if not a.max_steps and a.calibrate > a.warmup:
        raise SystemExit("--calibrate must be within --warmup (the schedule after the warmup "
                         "depends on the step count)")
    t_train = time.time()
    # The run's length in steps: --max-steps, or (a time cap) what the measured step rate fits in
    # --minutes, fixed after a.calibrate steps, so that the schedule depends on the step count
    # alone and `--max-steps N` with the N printed here runs the same schedule again. The time
    # cap stays as a hard stop 20% later (slower steps later on).
    deadline = t_train + 60 * a.minutes * (1.0 if a.max_steps else 1.2)
    total_steps = a.max_steps or None
    rate_from = None  # (step, time) where the rate measurement began
    step, epoch = 0, 0
    stats = None
    while (total_steps is None or step < total_steps) and time.time() < deadline:
        random.shuffle(batches)
        for bt in batches:
            if total_steps is None and step in (a.calibrate // 4, a.calibrate):
                sync(device)  # the device's queue drained: the wall time is its work
                now = time.time()
                if rate_from is None:
                    rate_from = (step, now)
                else:
                    rate = (step - rate_from[0]) / max(now - rate_from[1], 1e-6)
                    total_steps = step + int(rate * (t_train + 60 * a.minutes - now))
                    print(f"step budget: {total_steps} steps ({rate:.1f} steps/s over steps "
                          f"{rate_from[0]}-{step}); --max-steps {total_steps} runs this schedule "
                          f"again", flush=True)
            if (total_steps is not None and step >= total_steps) or time.time() >= deadline:
                break
            lr = learning_rate(a, step, total_steps if total_steps else a.warmup)
            for g in opt.param_groups:
                g["lr"] = lr
            ids, mask, aux, target = data.batch(bt, draft_head)
            losses, correct, counted = ttt_losses(m, ids, mask, aux, target, a.ttt_length, autocast)
            loss = sum((0.8 ** k) * l for k, l in enumerate(losses))
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 0.5)
            opt.step()
            if stats is None:
                stats = [[0.0, 0.0] for _ in losses]
            for k in range(len(losses)):
                stats[k][0] = stats[k][0] + correct[k]
                stats[k][1] = stats[k][1] + counted[k]
            step += 1
            if step % a.log_every == 0:
                acc = " ".join(f"{float(c) / max(float(n), 1):.3f}" for c, n in stats)
                print(f"step {step} epoch {epoch} lr {lr:.2e} loss {float(loss.detach()):.4f} "
                      f"acc/step {acc} ({time.time() - t0:.0f}s)", flush=True)
                stats = None
        epoch += 1
    train_s = time.time() - t_train
    if total_steps is not None and step < total_steps:
        print(f"warning: the time cap stopped the run at step {step} of {total_steps}: its "
              f"schedule did not finish, and --max-steps {total_steps} runs a different one",
              flush=True)
    save_drafter(m, a.out, {"strata_train": json.dumps(
        {"steps": step, "planned_steps": total_steps, "epochs": epoch, "records": n_records,
         "ttt_length": a.ttt_length,
         "lr": a.lr, "schedule": a.schedule, "warmup": a.warmup, "batch": a.batch, "seed": a.seed,
         "device": device.type, "bf16": a.bf16, "vocab_coverage": covered})})
    print(f"wrote {a.out} after {step} steps ({epoch} epochs) in {train_s:.0f}s of training, "
          f"{time.time() - t0:.0f}s in all", flush=True)


def cmd_accept(a):
    """Teacher-forced top-1 agreement per unrolled step on held-out captures. The data were
    generated greedily, so the target's argmax is the next token, and step k's agreement given
    steps < k agreed is a chain draft's acceptance of its k+1-th token."""
    torch.set_num_threads(a.threads)
    device = pick_device(a.device)
    tcfg = load_config(a.target)
    records = Records(a.hidden, a.limit, tcfg["hidden_size"])
    data = Packed(records, device)
    m = load_drafter(a.drafter, a.target).to(device)
    steps = a.steps
    top1 = [[0, 0] for _ in range(steps)]
    chain = [0] * steps  # rows whose steps 0..k all agreed
    rows = 0
    with torch.no_grad():
        for i in range(0, len(data), a.batch):
            ids, mask, aux, _ = data.batch(list(range(i, min(i + a.batch, len(data)))), None)
            outs = m.unroll(ids, aux, steps)
            # rows whose `steps` predicted tokens (p + 2 .. p + 1 + steps) are all response tokens
            full = torch.ones_like(mask)
            for k in range(steps):
                full *= shift(mask, k + 2)
            ok = torch.ones_like(ids, dtype=torch.bool)
            for k, (_, logits) in enumerate(outs):
                d = logits.argmax(-1)
                agree = (d + m.d2t[d]) == shift(ids, k + 2)  # the target's greedy token
                w = shift(mask, k + 2)
                top1[k][0] += int((agree.float() * w).sum())
                top1[k][1] += int(w.sum())
                ok &= agree
                chain[k] += int((ok.float() * full).sum())
            rows += int(full.sum())
    res = {"records": len(data), "steps": steps,
           "top1_per_step": [round(c / max(n, 1), 4) for c, n in top1],
           "chain_accept_per_step": [round(c / max(rows, 1), 4) for c in chain],
           "expected_accept_length": round(1 + sum(c / max(rows, 1) for c in chain), 3)}
    print(json.dumps(res))


def cmd_init(a):
    tcfg = load_config(a.target)
    aux = [int(x) for x in a.aux_layers.split(",")]
    cfg = drafter_config(tcfg, a.draft_vocab, aux)
    m = Drafter(cfg, target_tensor(a.target, "model.embed_tokens.weight"))
    init_weights(m, a.seed)
    g = torch.Generator().manual_seed(a.seed + 1)
    used = sorted(torch.randperm(tcfg["vocab_size"], generator=g)[:a.draft_vocab].tolist())
    m.d2t.copy_(torch.tensor(used) - torch.arange(a.draft_vocab))
    m.t2d.zero_()
    m.t2d[used] = True
    save_drafter(m, a.out)
    print(f"wrote {a.out} (random weights, seed {a.seed})")


def cmd_reference(a):
    """Parity reference: `seq.ids` [L] and `seq.aux` [L, 3Ht] random; step 1's hidden [L, H] and
    logits [L, Vd] over all rows, and step 2 (row p fed its own step-1 hidden and token p + 2 at
    position p + 1) for every row, from the training unroll. strata checks step 2 at a few rows
    p by drafting after a prefix of p + 1 tokens."""
    m = load_drafter(a.drafter, a.target)
    g = torch.Generator().manual_seed(a.seed)
    L = a.length
    Ht = m.cfg.get("target_hidden_size", m.cfg["hidden_size"])
    # row p reads token p + 1 in step 1 and token p + 2 in step 2: L + 2 tokens
    ids = torch.randint(0, m.cfg["vocab_size"], (1, L + 2), generator=g)
    aux = torch.randn(1, L, 3 * Ht, generator=g)
    with torch.no_grad():
        outs = unroll_with_tokens(m, ids, aux, 2)
    (h1, l1), (h2, l2) = outs
    out = {"seq.ids": ids[0].to(torch.int32), "seq.aux": aux[0],
           "step1.hidden": h1[0], "step1.logits": l1[0].float(),
           "step2.hidden": h2[0], "step2.logits": l2[0].float(),
           "d2t": m.d2t.to(torch.int32)}
    write_safetensors(a.out, {k: v.contiguous() for k, v in out.items()})
    print(f"wrote {a.out}: L={L}")


def unroll_with_tokens(m, ids, aux, steps):
    """Drafter.unroll over L = aux rows with ids [B, L + steps] holding every token the steps
    read (step k row p: ids[p + 1 + k]), none past the end."""
    B, L = aux.shape[0], aux.shape[1]
    mask0 = torch.full((L, L), float("-inf"), device=aux.device).triu(1)
    base = torch.arange(L, device=aux.device)[None].expand(B, L)
    x = m.fc(aux)
    cache, outs = [], []
    for k in range(steps):
        x = m.step(ids[:, k + 1:k + 1 + L], x, base + k, cache, mask0)
        outs.append((x, m.logits(x)))
    return outs


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("--hidden", nargs="+", required=True)
    t.add_argument("--target", required=True)
    t.add_argument("--out", required=True)
    t.add_argument("--draft-vocab", type=int, default=2048)
    t.add_argument("--ttt-length", type=int, default=7)
    t.add_argument("--batch", type=int, default=16)
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--warmup", type=int, default=50)
    t.add_argument("--minutes", type=float, default=5)
    t.add_argument("--max-steps", type=int, default=0,
                   help="the run's steps (0: as many as fit --minutes, measured)")
    t.add_argument("--barrier", default="", help="a directory: wait there for --barrier-count "
                   "training processes before the first step (candidates sharing a GPU)")
    t.add_argument("--barrier-count", type=int, default=1)
    t.add_argument("--calibrate", type=int, default=40,
                   help="without --max-steps: the step rate is measured over steps calibrate/4 "
                        "to calibrate (keep it within the warmup: the schedule then does not "
                        "depend on the measurement before it is made)")
    t.add_argument("--limit", type=int, default=0, help="read at most this many records")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--threads", type=int, default=2)
    t.add_argument("--log-every", type=int, default=20)
    t.add_argument("--device", default="cpu", help="cpu | cuda")
    t.add_argument("--bf16", action="store_true", help="bf16 autocast for the unroll")
    t.add_argument("--schedule", choices=["constant", "cosine"], default="constant",
                   help="after the warmup: constant, or cosine down to lr / 20")
    c = sub.add_parser("accept")
    c.add_argument("--hidden", nargs="+", required=True)
    c.add_argument("--target", required=True)
    c.add_argument("--drafter", required=True)
    c.add_argument("--steps", type=int, default=3)
    c.add_argument("--limit", type=int, default=0)
    c.add_argument("--threads", type=int, default=2)
    c.add_argument("--device", default="cpu", help="cpu | cuda")
    c.add_argument("--batch", type=int, default=16, help="records per forward")
    k = sub.add_parser("check")
    k.add_argument("--hidden", nargs="+", required=True)
    k.add_argument("--target", required=True)
    k.add_argument("--aux-layers", default="", help="expected aux layers, e.g. 1,3,4")
    k.add_argument("--disjoint-from", nargs="*", help="hidden dirs none of whose ids may appear")
    i = sub.add_parser("init")
    i.add_argument("--target", required=True)
    i.add_argument("--out", required=True)
    i.add_argument("--draft-vocab", type=int, default=512)
    i.add_argument("--aux-layers", default="1,3,4")
    i.add_argument("--seed", type=int, default=0)
    r = sub.add_parser("reference")
    r.add_argument("--drafter", required=True)
    r.add_argument("--target", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--length", type=int, default=13)
    r.add_argument("--seed", type=int, default=1)
    a = p.parse_args(argv)
    {"train": cmd_train, "accept": cmd_accept, "check": cmd_check, "init": cmd_init,
     "reference": cmd_reference}[a.cmd](a)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
