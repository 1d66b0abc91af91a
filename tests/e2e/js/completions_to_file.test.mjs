// Greedy completions of a list of prompts through the official `openai` npm client, one at a
// time, written to a file for the caller to compare across server configurations. Run by
// tests/e2e/server/launch_command_test.cc, which sets:
//   STRATA_BASE_URL (http://127.0.0.1:PORT/v1), STRATA_PROMPTS_FILE (a JSON list of strings),
//   STRATA_OUTPUT_FILE (where the JSON list of completions goes), STRATA_MAX_TOKENS.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, writeFileSync } from 'node:fs';
import OpenAI from 'openai';

const baseURL = process.env.STRATA_BASE_URL;
const promptsFile = process.env.STRATA_PROMPTS_FILE;
const outputFile = process.env.STRATA_OUTPUT_FILE;
const maxTokens = Number(process.env.STRATA_MAX_TOKENS ?? '4');
if (!baseURL || !promptsFile || !outputFile) {
  throw new Error('set STRATA_BASE_URL, STRATA_PROMPTS_FILE and STRATA_OUTPUT_FILE');
}

test('greedy completions, one request at a time', async () => {
  const client = new OpenAI({ baseURL, apiKey: process.env.STRATA_API_KEY ?? 'unused', maxRetries: 0 });
  const model = (await client.models.list()).data[0].id;
  const prompts = JSON.parse(readFileSync(promptsFile, 'utf8'));
  const out = [];
  for (const prompt of prompts) {
    const r = await client.completions.create({ model, prompt, max_tokens: maxTokens, temperature: 0 });
    assert.equal(r.usage.completion_tokens, maxTokens);
    out.push({ text: r.choices[0].text, cached_tokens: r.usage.prompt_tokens_details?.cached_tokens ?? 0 });
  }
  writeFileSync(outputFile, JSON.stringify(out));
});
