// The reference for strata's tiktoken.model support (tests/e2e/cli/tiktoken_test.cc): OpenAI's
// tiktoken (the npm package: its Rust core through WASM, the same code tokenization_kimi.py runs
// through Python) encodes each case with a checkpoint's tiktoken.model, its special tokens and a
// pattern, all given by the test.
// Usage: node tiktoken_reference.mjs INPUT.json  (INPUT: {"model": path of tiktoken.model,
// "special_tokens": {name: id}, "pattern": pat_str, "cases": [text]}); prints [[ids], ...].
import { readFileSync } from 'node:fs';
import { Tiktoken } from 'tiktoken/lite';

const input = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const enc = new Tiktoken(readFileSync(input.model, 'utf8'), input.special_tokens, input.pattern);
const out = input.cases.map((text) => Array.from(enc.encode(text, 'all')));
enc.free();
process.stdout.write(JSON.stringify(out));
