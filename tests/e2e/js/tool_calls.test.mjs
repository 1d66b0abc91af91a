// Tool calls through the official `openai` npm client: the whole response, the client's stream
// helper accumulating streamed tool_calls deltas, and runTools (the client's own loop: it calls
// the function with the parsed arguments and sends the result back as a tool message, with the
// assistant's tool_calls, for the next turn). Run by tests/e2e/server/node_client_test.cc, which
// serves house-llama with one token renamed to a Qwen-style call (scripted_model.h) under
// --tool-call-parser qwen25, and sets:
//   STRATA_BASE_URL (http://127.0.0.1:PORT/v1), STRATA_CALL_TOKEN (the token that writes the call).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const baseURL = process.env.STRATA_BASE_URL;
const token = process.env.STRATA_CALL_TOKEN;
if (!baseURL || !token) throw new Error('set STRATA_BASE_URL and STRATA_CALL_TOKEN');

const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0 });
const weather = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'The weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string' }, unit: { type: 'string' } },
                  required: ['city'] },
  },
};
// The biased token writes one whole call per token: two tokens, two calls.
const request = {
  messages: [{ role: 'user', content: 'Weather in Paris?' }],
  tools: [weather],
  max_tokens: 2,
  temperature: 0,
  logit_bias: { [token]: 100 },
};

function expectCalls(message) {
  assert.equal(message.tool_calls.length, 2, JSON.stringify(message));
  for (const call of message.tool_calls) {
    assert.equal(call.type, 'function');
    assert.equal(call.function.name, 'get_weather');
    assert.deepEqual(JSON.parse(call.function.arguments), { city: 'Paris', unit: 'c' });
    assert.match(call.id, /^call_[0-9a-f]{24}$/);
  }
  assert.notEqual(message.tool_calls[0].id, message.tool_calls[1].id);
}

test('chat.completions.create returns the calls as tool_calls', async () => {
  const r = await client.chat.completions.create({ model: 'house-llama', ...request });
  expectCalls(r.choices[0].message);
  assert.equal(r.choices[0].message.content, null);
  assert.equal(r.choices[0].finish_reason, 'length');
});

test("the client's stream helper accumulates the streamed tool_calls", async () => {
  const stream = client.beta.chat.completions.stream({ model: 'house-llama', ...request });
  const done = [];
  stream.on('tool_calls.function.arguments.done', (e) => done.push(e.name));
  const final = await stream.finalChatCompletion();
  expectCalls(final.choices[0].message);
  assert.deepEqual(done, ['get_weather', 'get_weather']);
});

test('runTools calls the function and sends its result back for the next turn', async () => {
  const seen = [];
  const runner = client.beta.chat.completions.runTools(
    {
      model: 'house-llama',
      ...request,
      // The runner refuses a response cut by max_tokens: the call token also ends the answer
      // (a stop token's text stays in the output, as in vLLM), one call a turn, finish_reason
      // "tool_calls".
      stop_token_ids: [Number(token)],
      max_tokens: 4,
      tools: [{ type: 'function',
                function: { ...weather.function, parse: JSON.parse,
                            function: (args) => { seen.push(args); return { forecast: 'sunny' }; } } }],
    },
    { maxChatCompletions: 2 },
  );
  await runner.done();
  // Two turns of a call each: the second turn carried the first one's call and result.
  assert.deepEqual(seen, Array(2).fill({ city: 'Paris', unit: 'c' }));
  const roles = runner.messages.map((m) => m.role);
  assert.deepEqual(roles, ['user', 'assistant', 'tool', 'assistant', 'tool']);
  assert.equal(runner.messages[2].tool_call_id, runner.messages[1].tool_calls[0].id);
  assert.equal(runner.messages[2].content, JSON.stringify({ forecast: 'sunny' }));
});
