// strata serve through the official `openai` npm client: completions and chat completions,
// streaming and not, against `strata generate` for greedy output. Run by
// tests/e2e/server/node_client_test.cc, which starts the server and sets:
//   STRATA_BASE_URL (http://127.0.0.1:PORT/v1), STRATA_BINARY, STRATA_MODEL_PATH.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import OpenAI from 'openai';

const baseURL = process.env.STRATA_BASE_URL;
const binary = process.env.STRATA_BINARY;
const modelPath = process.env.STRATA_MODEL_PATH;
if (!baseURL || !binary || !modelPath) throw new Error('set STRATA_BASE_URL, STRATA_BINARY and STRATA_MODEL_PATH');

const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0 });
const model = 'house-llama';
const MAX = 24;
const PROMPTS = ['The Linux kernel', 'A dictionary is', 'def main():'];
const QUESTIONS = ['What is a file system?', 'Explain the word "daemon".'];

// `strata generate` greedy results for the same prompts (one process, all prompts batched).
function generate(prompts, raw) {
  const args = ['generate', '--model-path', modelPath, '--max-new-tokens', String(MAX), '--temperature', '0',
                '--jsonl', '--no-progress', '--log-level', 'error'];
  if (raw) args.push('--raw');
  for (const p of prompts) args.push('--prompt', p);
  const out = execFileSync(binary, args, { encoding: 'utf8' });
  return out.trim().split('\n').map((line) => {
    const r = JSON.parse(line);
    if (raw) return r.completion;
    const conv = r.messages ?? r.conversations;
    return conv[conv.length - 1].content;
  });
}

test('models.list names the served model', async () => {
  const page = await client.models.list();
  assert.deepEqual(page.data.map((m) => m.id), [model]);
});

test('completions (non-streaming and streaming) equal strata generate --raw', async () => {
  const expected = generate(PROMPTS, true);
  assert.ok(expected.length === PROMPTS.length && expected.every((t) => t.length > 0), JSON.stringify(expected));
  for (let i = 0; i < PROMPTS.length; ++i) {
    const r = await client.completions.create({ model, prompt: PROMPTS[i], max_tokens: MAX, temperature: 0 });
    assert.equal(r.object, 'text_completion');
    assert.equal(r.choices[0].text, expected[i], `prompt ${i}`);
    assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
    assert.ok(r.usage.prompt_tokens > 0 && r.usage.completion_tokens > 0);

    const stream = await client.completions.create({ model, prompt: PROMPTS[i], max_tokens: MAX, temperature: 0,
                                                     stream: true });
    let text = '';
    let finish = null;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.text ?? '';
      finish = chunk.choices[0]?.finish_reason ?? finish;
    }
    assert.equal(text, expected[i], `streamed prompt ${i}`);
    assert.equal(finish, r.choices[0].finish_reason);
  }
});

test('chat completions (non-streaming and streaming) equal strata generate', async () => {
  const expected = generate(QUESTIONS, false);
  assert.ok(expected.length === QUESTIONS.length && expected.every((t) => t.length > 0), JSON.stringify(expected));
  for (let i = 0; i < QUESTIONS.length; ++i) {
    const messages = [{ role: 'user', content: QUESTIONS[i] }];
    const r = await client.chat.completions.create({ model, messages, max_tokens: MAX, temperature: 0 });
    assert.equal(r.object, 'chat.completion');
    assert.equal(r.choices[0].message.role, 'assistant');
    assert.equal(r.choices[0].message.content, expected[i], `question ${i}`);

    const stream = await client.chat.completions.create({ model, messages, max_completion_tokens: MAX, temperature: 0,
                                                          stream: true, stream_options: { include_usage: true } });
    let text = '';
    let usage = null;
    let role = null;
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      const d = chunk.choices[0]?.delta;
      if (d?.role) role = d.role;
      text += d?.content ?? '';
    }
    assert.equal(role, 'assistant');
    assert.equal(text, expected[i], `streamed question ${i}`);
    assert.equal(usage.completion_tokens, r.usage.completion_tokens);
    assert.equal(usage.prompt_tokens, r.usage.prompt_tokens);
  }
});

test('chat logprobs and sampling parameters', async () => {
  const r = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'Hello' }], max_tokens: 4, temperature: 0.8, top_p: 0.9, seed: 7,
    n: 2, logprobs: true, top_logprobs: 3,
  });
  assert.equal(r.choices.length, 2);
  for (const c of r.choices) {
    assert.equal(c.logprobs.content.length, r.usage.completion_tokens / 2);
    for (const t of c.logprobs.content) {
      assert.equal(t.top_logprobs.length, 3);
      assert.ok(t.logprob <= 0);
    }
  }
  // The same seed reproduces the same samples.
  const again = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'Hello' }], max_tokens: 4, temperature: 0.8, top_p: 0.9, seed: 7, n: 2,
  });
  assert.deepEqual(again.choices.map((c) => c.message.content), r.choices.map((c) => c.message.content));
});

// lm-evaluation-harness's loglikelihood request (its local-completions model): echo, logprobs 1,
// max_tokens 0 — the prompt back with each token's logprob (the first null), plus a completion
// after it with max_tokens > 0. The values are checked against Hugging Face in
// tests/e2e/server/prompt_logprobs_test.cc; here the client's view of the shape.
test('completions echo the prompt with its logprobs', async () => {
  const prompt = PROMPTS[0];
  const r = await client.completions.create({ model, prompt, echo: true, logprobs: 1, max_tokens: 0, temperature: 0 });
  const c = r.choices[0];
  assert.equal(c.text, prompt);
  assert.equal(c.finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 0);
  assert.equal(c.logprobs.tokens.join(''), prompt);
  assert.equal(c.logprobs.tokens.length, r.usage.prompt_tokens);
  assert.equal(c.logprobs.token_logprobs[0], null);
  for (const lp of c.logprobs.token_logprobs.slice(1)) assert.ok(lp <= 0, `logprob ${lp}`);
  const more = await client.completions.create({ model, prompt, echo: true, logprobs: 1, max_tokens: 4, temperature: 0 });
  const plain = await client.completions.create({ model, prompt, max_tokens: 4, temperature: 0 });
  assert.equal(more.choices[0].text, prompt + plain.choices[0].text);
  assert.deepEqual(more.choices[0].logprobs.token_logprobs.slice(0, c.logprobs.tokens.length),
                   c.logprobs.token_logprobs);
});

test('errors surface as OpenAI API errors', async () => {
  await assert.rejects(client.completions.create({ model: 'gpt-4', prompt: 'hi' }),
                       (e) => e instanceof OpenAI.NotFoundError && /does not exist/.test(e.message));
  await assert.rejects(client.chat.completions.create({ model, messages: [] }),
                       (e) => e instanceof OpenAI.BadRequestError && e.param === 'messages');
  await assert.rejects(client.completions.create({ model, prompt: 'hi', max_tokens: 100000 }),
                       (e) => e instanceof OpenAI.BadRequestError && e.code === 'context_length_exceeded');
});
