// strata serve --api-key through the official `openai` npm client: its apiKey option is sent as
// `Authorization: Bearer KEY`; the right key works (plain and streaming), a wrong one is an
// AuthenticationError (401) for every call; without any Authorization header the server answers
// 401 too (the client refuses an empty apiKey itself, so that case uses fetch). Run by
// tests/e2e/server/node_client_test.cc, which starts the server with the key and sets:
//   STRATA_BASE_URL (http://127.0.0.1:PORT/v1), STRATA_TEST_API_KEY.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const baseURL = process.env.STRATA_BASE_URL;
const key = process.env.STRATA_TEST_API_KEY;
if (!baseURL || !key) throw new Error('set STRATA_BASE_URL and STRATA_TEST_API_KEY');
const model = 'house-llama';

test('the right apiKey is accepted', async () => {
  const client = new OpenAI({ baseURL, apiKey: key, maxRetries: 0 });
  const page = await client.models.list();
  assert.deepEqual(page.data.map((m) => m.id), [model]);
  const r = await client.completions.create({ model, prompt: 'The Linux kernel', max_tokens: 4, temperature: 0 });
  assert.equal(r.usage.completion_tokens, 4);
  const stream = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 4, temperature: 0, stream: true });
  let chunks = 0;
  for await (const chunk of stream) chunks += chunk.choices.length > 0 ? 1 : 0;
  assert.ok(chunks > 0);
});

test('a wrong apiKey is an AuthenticationError on every call', async () => {
  const client = new OpenAI({ baseURL, apiKey: `${key}-wrong`, maxRetries: 0 });
  const isAuthError = (e) => e instanceof OpenAI.AuthenticationError && e.status === 401 &&
                             e.code === 'invalid_api_key' && !e.message.includes(key);
  await assert.rejects(client.models.list(), isAuthError);
  await assert.rejects(client.completions.create({ model, prompt: 'hi', max_tokens: 2 }), isAuthError);
  await assert.rejects(client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 2, stream: true }), isAuthError);
});

test('no Authorization header is a 401 with an OpenAI-shaped error', async () => {
  const res = await fetch(`${baseURL}/models`);
  assert.equal(res.status, 401);
  assert.equal(res.headers.get('www-authenticate'), 'Bearer');
  const body = await res.json();
  assert.equal(body.error.type, 'invalid_request_error');
  assert.match(body.error.message, /API key/);
  const health = await fetch(`${baseURL.replace(/\/v1$/, '')}/health`);
  assert.equal(health.status, 200);
});
