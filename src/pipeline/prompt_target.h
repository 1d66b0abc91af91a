// What a batch job runs its prompts on: the in-process engine (engine_target.h) or an
// OpenAI-compatible server (server_target.h). The job (runner.h) feeds tasks up to
// max_in_flight() and writes each outcome as it arrives.
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "engine/kv_rows.h"
#include "engine/sampling_params.h"
#include "pipeline/dataset.h"
#include "tokenizer/reasoning_parser.h"
#include "tokenizer/tool_call_parser.h"

namespace strata {

struct CapturedRecord;  // pipeline/hidden_store.h
class HiddenStore;

// The generation settings of a job, the same for every prompt: the request's SamplingParams
// (engine/sampling_params.h; its seed is the job's base seed, each prompt drawing with
// prompt_seed(base_seed(), id)) and the chat template's extra variables.
struct JobSampling {
  SamplingParams params{.temperature = 0.0f, .seed = 0};  // strata generate's default: greedy
  nlohmann::json chat_template_kwargs{};                  // null or an object
  // --reasoning-parser (in-process engine): a chat record's answer keeps the reasoning apart.
  std::optional<ReasoningFormat> reasoning{};
  // --tool-call-parser (in-process engine): the calls in the answer of a record with tools become
  // the assistant message's tool_calls.
  std::optional<ToolCallFormat> tool_call{};
  uint64_t base_seed() const { return params.seed.value_or(0); }

  // The settings as stored in every record's meta (and compared on resume): the fields of the
  // first version always, the later ones only when set, so older outputs still resume.
  nlohmann::json to_json() const;
};

// Output tokens a running task produced since its last report, for the job's progress line and
// its checkpoints (checkpoint.h).
struct TokenReport {
  std::vector<int32_t> token_ids{};  // new output tokens, in order
  uint64_t rng_draws = 0;            // the sampler's draws after them (engine/sampler.h)
  int32_t prompt_tokens = 0;
  bool restart = false;  // the target could not resume the task: its output starts over
  // GenerationTask::export_kv: KV rows of pages completed since the last report (no tokens).
  std::shared_ptr<const KvRows> kv{};
};
using TokensCallback = std::function<void(TokenReport)>;

struct GenerationTask {
  std::string dataset{};
  const PromptRecord* record = nullptr;  // owned by the job; outlives the task
  uint64_t seed = 0;                     // prompt_seed(sampling.base_seed(), record->id)
  // Called as tokens are produced, from any thread (keep it short); may be empty. Targets that
  // only learn the output at the end never call it.
  TokensCallback on_tokens{};
  // A checkpointed partial output to continue from (targets with can_resume() only): its tokens,
  // the sampler's draws after them and the prompt length they were made with.
  std::vector<int32_t> resume_output_ids{};
  uint64_t resume_rng_draws = 0;
  int32_t resume_prompt_tokens = 0;
  // KV checkpoints (targets with kv_rows_layout() only): the KV of the first resume_kv->rows
  // tokens of prompt + resume_output_ids, loaded instead of computed; and whether to report the
  // task's KV rows as its pages fill (TokenReport::kv), from row kv_export_from_row on.
  std::shared_ptr<const KvRows> resume_kv{};
  bool export_kv = false;
  int32_t kv_export_from_row = 0;
  // Capture jobs: the store the record's states stream into while it is generated
  // (HiddenStore::begin_record, on the job's thread); null: they are kept in memory.
  HiddenStore* hidden_store = nullptr;
};

enum class OutcomeKind {
  kDone,         // generated: written to the results file
  kFailed,       // gave up on this prompt (4xx, or retries exhausted): written to the failures file
  kInterrupted,  // the job is stopping (server gone too long): written nowhere, resumed next run
};

struct GenerationOutcome {
  OutcomeKind kind = OutcomeKind::kDone;
  std::string text;
  // A chat answer's reasoning, apart from `text`: the server's reasoning_content, or the
  // in-process engine's split (JobSampling::reasoning); "" none. Kept in the record beside it.
  std::string reasoning;
  // A chat answer's calls as OpenAI's message.tool_calls (the server's, or the in-process
  // engine's parse, JobSampling::tool_call); null or empty: none. `text` is the rest.
  nlohmann::json tool_calls;
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;
  std::string finish_reason;  // "stop" | "length" | "tool_calls" | "abort" (OpenAI names)
  std::string error;          // for kFailed / kInterrupted
  // kDone: every output token counted, those of a resumed partial included.
  int http_status = 0;  // server mode: the last HTTP status (0: none / transport error)
  int attempts = 1;
  // kDone of a capture job: the record's hidden states (pipeline/hidden_store.h).
  std::shared_ptr<const CapturedRecord> hidden{};
  // The record's conversation already holds the response (--capture-only): nothing is appended.
  bool teacher_forced = false;
};

using OutcomeCallback = std::function<void(GenerationOutcome)>;

// Splits a finished outcome's text into its reasoning and its answer (JobSampling::reasoning).
// `starts_inside`: the prompt opened the reasoning (starts_inside_reasoning).
void split_reasoning(const ReasoningFormat& format, bool starts_inside, GenerationOutcome* o);
// Parses a finished outcome's text for tool calls (JobSampling::tool_call): the calls go to
// o->tool_calls (ids counting the conversation's `earlier_calls`), finish_reason "stop" becomes
// "tool_calls"; what does not parse stays in the text.
void split_tool_calls(const ToolCallFormat& format, int earlier_calls, GenerationOutcome* o);

class PromptTarget {
 public:
  virtual ~PromptTarget() = default;
  // The model name stored in records (the directory name, or the server's model id).
  virtual std::string model_name() const = 0;
  // How many tasks the job keeps started and unfinished at once.
  virtual int max_in_flight() const = 0;
  // True when start() continues GenerationTask::resume_output_ids exactly (same text as an
  // uninterrupted run) and reports tokens with their sampler state: the job then checkpoints.
  virtual bool can_resume() const { return false; }
  // A short state for the progress line ("replicas 2/3 up"); empty: nothing to say. Called from
  // the job's thread while tasks run.
  virtual std::string progress_note() const { return ""; }
  // The layout of the KV rows the target reports and loads (kv_checkpoint.h), or nullopt with the
  // reason in *why_not when it does not.
  virtual std::optional<KvRowsLayout> kv_rows_layout(std::string* why_not) const {
    if (why_not != nullptr) *why_not = "this target keeps no KV the job can read";
    return std::nullopt;
  }
  // Starts one task. `done` is called exactly once, from any thread (possibly inside start());
  // it must be short. Called from the job's thread only.
  virtual void start(const GenerationTask& task, OutcomeCallback done) = 0;
  // The prompt's length in tokens, for the capture job's disk estimate; -1 when unknown.
  virtual int64_t prompt_tokens(const PromptRecord& /*record*/) const { return -1; }
};

// Retries with capped exponential backoff and jitter, for server mode.
struct RetryPolicy {
  int max_attempts = 6;  // per prompt, for retryable errors (5xx, 429, timeouts, resets)
  double initial_delay_s = 0.5;
  double max_delay_s = 30.0;
  double multiplier = 2.0;
  // How long the server may stay unreachable (connection refused) before the job stops (its
  // work is saved; the same command resumes). Refused connections cost no attempts.
  double server_down_timeout_s = 600.0;
};

// The wait before retry number `retry` (1 = the first retry): min(max, initial*mult^(retry-1))
// scaled by a uniform factor in [0.5, 1] ("equal jitter"), so clients that failed together do
// not come back together. Pure apart from `rng`.
double backoff_delay_s(const RetryPolicy& policy, int retry, std::mt19937_64& rng);

}  // namespace strata
