#!/usr/bin/env python3
"""Writes the seed corpora under fuzz/corpus/<target>/ from ../shared and the unit tests.

Run from anywhere: python3 fuzz/make_corpus.py [--shared PATH]. Seeds are small (no weights, no
whole datasets): configs, chat templates, small hand-made tokenizers, first lines of the JSONL
data, request bodies. Re-running rewrites the seed_* files; crash_* regression inputs and any
files libFuzzer added are left alone.
"""
import argparse
import base64
import json
import re
import struct
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "fuzz" / "corpus"


def put(target, name, data):
    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    (d / f"seed_{name}").write_bytes(data)


def fields(*parts):
    return b"\0".join(p if isinstance(p, bytes) else p.encode() for p in parts)


def safetensors_file(tensors, metadata=None):
    header, data, off = {}, b"", 0
    sizes = {"F32": 4, "BF16": 2, "F16": 2, "I64": 8, "I32": 4, "U8": 1, "I8": 1, "F8_E4M3": 1}
    for name, dtype, shape in tensors:
        n = sizes[dtype]
        for s in shape:
            n *= s
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + n]}
        data += bytes((i * 7) & 0xFF for i in range(n))
        off += n
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return h, struct.pack("<Q", len(h)) + h + data


def safetensors_seeds(shared):
    sets = [
        [("w", "BF16", [2, 3])],
        [("a", "F32", [4]), ("b", "I64", [2, 2]), ("empty", "F16", [0, 5]), ("s", "U8", [])],
        [("model.layers.0.mlp.experts.0.weight_packed", "I32", [4, 2]),
         ("model.layers.0.mlp.experts.0.weight_scale", "BF16", [4, 1]),
         ("q", "F8_E4M3", [3, 3])],
    ]
    for i, t in enumerate(sets):
        header, whole = safetensors_file(t, {"format": "pt"} if i == 0 else None)
        put("safetensors", f"header{i}.json", header)  # header mode: the target frames it
        put("safetensors", f"file{i}.safetensors", whole)  # raw mode: a whole file
    # The real header of a tiny fixture (its offsets point past the target's 4 KiB of data).
    with open(shared / "fixtures/tiny/llama-gqa/model.safetensors", "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        put("safetensors", "tiny_llama_header.json", f.read(n))


def config_seeds(shared):
    for p in sorted(shared.glob("configs/*/config.json")) + sorted(shared.glob("models/*/config.json")) \
            + sorted(shared.glob("fixtures/tiny/*/config.json")):
        put("config", f"{p.parent.name}.json", p.read_bytes())


def spm_tokenizer(metaspace):
    # The hand-made SentencePiece-style tokenizer of tests/unit/tokenizer/tokenizer_spm_test.cc.
    pieces = ["▁", "h", "e", "l", "o", "w", "r", "d", "▁h", "ll", "▁he", "▁hell", "▁hello", "or",
              "▁w", "▁wor", "▁worl", "▁world"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = 3 + b
    for i, p in enumerate(pieces):
        vocab[p] = 259 + i
    added = lambda i, c: {"id": i, "content": c, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}
    j = {"version": "1.0", "added_tokens": [added(0, "<unk>"), added(1, "<s>"), added(2, "</s>")],
         "post_processor": {"type": "TemplateProcessing",
                            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                       {"Sequence": {"id": "A", "type_id": 0}}],
                            "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
         "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>",
                   "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": True,
                   "byte_fallback": True, "vocab": vocab,
                   "merges": ["▁ h", "l l", "▁h e", "▁he ll", "▁hell o", "o r", "▁ w", "▁w or",
                              "▁wor l", "▁worl d"]}}
    if metaspace:
        ms = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False}
        j["normalizer"] = None
        j["pre_tokenizer"] = ms
        j["decoder"] = {"type": "Sequence", "decoders": [ms, {"type": "ByteFallback"}, {"type": "Fuse"}]}
    else:
        j["normalizer"] = {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}
        j["pre_tokenizer"] = None
        j["decoder"] = {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    return j


def small_house_tokenizer(shared, keep):
    # The house byte-level tokenizer cut to its first `keep` ids (merges whose parts and result
    # survive), keeping its normalizer, Split pre-tokenizer, decoder and added tokens.
    j = json.loads((shared / "models/house-llama/tokenizer.json").read_text())
    vocab = {t: i for t, i in j["model"]["vocab"].items() if i < keep}
    merges = []
    for m in j["model"]["merges"]:
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        if a in vocab and b in vocab and a + b in vocab:
            merges.append(m)
    j["model"]["vocab"] = vocab
    j["model"]["merges"] = merges
    return j


def tokenizer_seeds(shared):
    config = (shared / "models/house-llama/tokenizer_config.json").read_text()
    text = "Hello  world!\n\tdef f(x): return x**2  # é ü 你好 🙂 <|im_start|>user"
    for name, j in [("spm_llama2", spm_tokenizer(False)), ("spm_metaspace", spm_tokenizer(True)),
                    ("house_small", small_house_tokenizer(shared, 400))]:
        put("tokenizer_load", name, fields(json.dumps(j, ensure_ascii=False), config, text))
        put("tokenizer_load", name + "_noconfig", json.dumps(j, ensure_ascii=False))
    cases = json.loads((shared / "fixtures/tokenizer_cases.json").read_text())
    for i, c in enumerate(cases["cases"]):
        put("tokenizer_encode", f"case{i:02d}", c["text"])
        put("tokenizer_encode", f"ids{i:02d}", struct.pack(f"<{len(c['ids'])}i", *c["ids"]))


def chat_template_seeds(shared):
    house = (shared / "models/house-llama/chat_template.jinja").read_text()
    cases = json.loads((shared / "fixtures/tokenizer_cases.json").read_text())
    for i, c in enumerate(cases["chat_template"]):
        put("chat_template", f"house{i}", fields(house, json.dumps(c["messages"], ensure_ascii=False), "{}"))
    # Hub-style templates from the unit tests.
    src = (ROOT / "tests/unit/tokenizer/jinja/hub_templates_test.cc").read_text()
    conv = json.dumps([{"role": "system", "content": "S"}, {"role": "user", "content": "Q"},
                       {"role": "assistant", "content": "A"}, {"role": "user", "content": "Q2"}])
    extra = json.dumps({"bos_token": "<s>", "eos_token": "</s>", "tools": [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]})
    for k, m in enumerate(re.finditer(r'R"JINJA\((.*?)\)JINJA"', src, re.S)):
        put("chat_template", f"hub{k}", fields(m.group(1), conv, extra))
    # Jinja2 reference cases (tests/unit/tokenizer/jinja/data): template, messages, the rest.
    ref = json.loads((ROOT / "tests/unit/tokenizer/jinja/data/jinja2_reference.json").read_text())
    for i, c in enumerate(ref["cases"]):
        ctx = dict(c.get("context") or {})
        msgs = ctx.pop("messages", [])
        put("chat_template", f"jinja2_{i:03d}", fields(c["template"], json.dumps(msgs), json.dumps(ctx)))


def openai_seeds():
    chat = [
        {"model": "m", "messages": [{"role": "system", "content": "be brief"},
                                    {"role": "user", "content": "Hi"}], "max_tokens": 8,
         "temperature": 0, "stream": True, "stream_options": {"include_usage": True}},
        {"messages": [{"role": "user", "content": "x"}], "n": 2, "top_p": 0.9, "top_k": 5,
         "seed": 7, "stop": ["\n", "."], "logprobs": True, "top_logprobs": 3},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "parts"}]}],
         "stop_token_ids": [1, 2], "ignore_eos": True, "max_completion_tokens": 4},
        {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "reasoning_content": "c"},
                      {"role": "user", "content": "d"}],
         "chat_template_kwargs": {"enable_thinking": False}, "min_p": 0.05, "repetition_penalty": 1.1},
        {"messages": [{"role": "user", "content": "w?"},
                      {"role": "assistant", "content": None, "tool_calls": [
                          {"id": "functions.f:0", "type": "function",
                           "function": {"name": "f", "arguments": "{\"z\": 1, \"a\": [2]}"}}]},
                      {"role": "tool", "tool_call_id": "functions.f:0", "content": "ok"}],
         "tools": [{"type": "function", "function": {"name": "f", "description": "d",
                                                     "parameters": {"type": "object", "properties": {}}}}],
         "tool_choice": "auto", "parallel_tool_calls": False},
    ]
    comp = [
        {"model": "m", "prompt": "Once upon", "max_tokens": 16, "temperature": 0.7, "echo": False},
        {"prompt": ["x", "y"], "logprobs": 1, "n": 3, "stop": "\n\n"},
        {"prompt": [1, 2, 3], "max_tokens": 1},
        {"prompt": [[1], [2, 3]], "stream": True, "seed": 18446744073709551615},
        {"prompt": "x", "presence_penalty": 0.5, "frequency_penalty": -0.5, "logit_bias": {"5": -100, "7": 2},
         "top_k": 3},
    ]
    for i, b in enumerate(chat):
        put("openai_request", f"chat{i}", b"\x01" + json.dumps(b).encode())
    for i, b in enumerate(comp):
        put("openai_request", f"completions{i}", b"\x00" + json.dumps(b).encode())
    native = [
        {"text": "Once upon", "sampling_params": {"max_new_tokens": 8, "temperature": 0, "stop": ["\n"]},
         "stream": True, "return_logprob": True, "top_logprobs_num": 2, "rid": "r"},
        {"input_ids": [[1, 2], [3]], "sampling_params": {"n": 2, "sampling_seed": 5, "ignore_eos": True},
         "lora_path": None, "logprob_start_len": -1},
    ]
    for i, b in enumerate(native):
        put("openai_request", f"generate{i}", b"\x02" + json.dumps(b).encode())


def reasoning_seeds():
    texts = [
        (2, 0, 3, "<think>\nLet me add.\n</think>\n\n4"),
        (1, 1, 1, "plan</think>answer"),
        (6, 2, 5, "<think>call it<|tool_calls_section_begin|>x<|tool_calls_section_end|>"),
        (5, 0, 2, "\u25c1think\u25b7r\u25c1/think\u25b7c"),
        (0, 3, 4, "<think><think>cut short </thi"),
    ]
    for i, (fmt, mode, step, text) in enumerate(texts):
        put("reasoning_split", f"text{i}", bytes([fmt, mode, step]) + text.encode())


def tool_call_seeds():
    # Byte 0: the format's index in tool_call_format_names() (kimi_k2, deepseekv3, deepseekv31,
    # qwen25, qwen, hermes, llama3); byte 1: the piece size.
    k = "<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{\"a\": 1}<|tool_call_end|>"
    ds = "<\uff5ctool\u2581calls\u2581begin\uff5c><\uff5ctool\u2581call\u2581begin\uff5c>"
    sep = "<\uff5ctool\u2581sep\uff5c>"
    ds_end = "<\uff5ctool\u2581call\u2581end\uff5c><\uff5ctool\u2581calls\u2581end\uff5c>"
    texts = [
        (0, 3, "ok<|tool_calls_section_begin|>" + k + k + "<|tool_calls_section_end|>after"),
        (0, 1, "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_"),
        (1, 4, ds + "function" + sep + "f\n```json\n{\"x\": [1]}\n```" + ds_end),
        (2, 2, ds + "f" + sep + "{}" + ds_end),
        (3, 5, "text<tool_call>\n{\"name\": \"f\", \"arguments\": {\"b\": \"}\"}}\n</tool_call>"),
        (6, 6, "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\"}"),
    ]
    for i, (fmt, step, text) in enumerate(texts):
        put("tool_call_split", f"text{i}", bytes([fmt, step]) + text.encode())


def tiktoken_seeds():
    # Byte-level seeds: the 256 bytes, a few merges, Kimi's config (empty field: the default).
    lines = [base64.b64encode(bytes([b])).decode() + f" {b}" for b in range(256)]
    for rank, tok in enumerate([b"ab", b"abc", b"bc", b" th", b"\xe4\xb8"], start=256):
        lines.append(base64.b64encode(tok).decode() + f" {rank}")
    model = "\n".join(lines) + "\n"
    config = json.dumps({"auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
                         "added_tokens_decoder": {"262": {"content": "<|im_end|>", "special": True}}})
    put("tiktoken_load", "bytes", (model + "\0" + config + "\0abc the 中文 <|im_end|>").encode())
    put("tiktoken_load", "small", ("YQ== 0\nYg== 1\nYWI= 2\n\0\0ab ba").encode())


def dataset_seeds(shared):
    for p in sorted(shared.glob("data/*.jsonl")):
        lines = []
        with open(p, encoding="utf-8") as f:
            for line in f:
                if len(line) < 600:
                    lines.append(line)
                if len(lines) == 3:
                    break
        put("dataset", p.stem, "".join(lines))
    put("dataset", "layouts", "\n".join([
        '{"id": 7, "messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}',
        '{"prompt": "raw text"}',
        '   ',
        '{"id": "s1", "conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "r"}]}',
    ]) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shared", default=str(ROOT.parent / "shared"))
    shared = Path(ap.parse_args().shared)
    safetensors_seeds(shared)
    config_seeds(shared)
    tokenizer_seeds(shared)
    chat_template_seeds(shared)
    openai_seeds()
    reasoning_seeds()
    tool_call_seeds()
    tiktoken_seeds()
    dataset_seeds(shared)


if __name__ == "__main__":
    main()
