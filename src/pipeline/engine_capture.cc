// EngineTarget's capture jobs: each record's hidden states at every position of prompt + response.
//
// How the positions come together:
//  - Generation: the request runs with capture on and without the prefix cache, so its prefill (of
//    the prompt, or of prompt + a checkpoint's tokens when resumed) and its decode steps compute
//    and capture every position but the last (the final sampled token is never fed back). Then a
//    one-token request over prompt + response, with the prefix cache (the finished request's pages
//    are cached, so only the last page is computed again), captures the rest. Every position's
//    state depends on the tokens up to it only, so this equals a prefill over the finished
//    conversation (within batching noise on the GPU). The tail captures into the record's own
//    states, which keep the rows already written (CapturedStates::keep_written).
//  - Teacher-forced (--capture-only): one request over the whole conversation; its prefill covers
//    every position and its one sampled token is dropped.
// The loss mask follows SpecForge (specforge/data/parse.py, GeneralParser.parse): 1 on each
// assistant turn from the end of the assistant header through its end-of-turn token. SpecForge
// finds those spans with a regex over the rendered text (assistant_header ... end_of_turn_token of
// its per-model template); here the chat template itself says where they are: turn k's span
// starts at the length of messages[:k] rendered with the generation prompt (which ends with the
// assistant header) and ends at the length of messages[:k+1] rendered without it (which ends
// after the end-of-turn). A generated response is masked from its first token through its EOS.
#include <algorithm>

#include "core/log.h"
#include "pipeline/engine_target.h"
#include "pipeline/hidden_store.h"

namespace strata {
namespace {

// SpecForge's assistant spans of `messages` (see above), over `n` tokens.
std::vector<int32_t> assistant_mask(const PromptEncoder& enc,
                                    const nlohmann::ordered_json& messages, size_t n,
                                    const nlohmann::ordered_json& kwargs) {
  std::vector<int32_t> mask(n, 0);
  if (!messages.is_array()) return mask;
  for (size_t k = 0; k < messages.size(); ++k) {
    if (messages[k].value("role", "") != "assistant") continue;
    const nlohmann::ordered_json before(messages.begin(), messages.begin() + std::ptrdiff_t(k));
    const nlohmann::ordered_json through(messages.begin(),
                                         messages.begin() + std::ptrdiff_t(k + 1));
    auto head = enc.encode_chat(before, /*add_generation_prompt=*/true, SIZE_MAX, kwargs);
    auto turn = enc.encode_chat(through, /*add_generation_prompt=*/false, SIZE_MAX, kwargs);
    if (!head.ok() || !turn.ok()) continue;
    const size_t begin = std::min(head->size(), n), end = std::min(turn->size(), n);
    for (size_t i = begin; i < end; ++i) mask[i] = 1;
  }
  return mask;
}

// One record's capture in progress; shared by the engine-thread callbacks.
struct CaptureRun {
  std::string dataset, id;
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> output_ids;  // resumed + generated
  std::vector<int32_t> prompt_mask;
  std::string text;
  std::shared_ptr<CapturedStates> states;
  GenerationOutcome outcome;
  OutcomeCallback done;
  TokensCallback on_tokens;
};

GenerationOutcome failed_outcome(const std::string& error) {
  GenerationOutcome o;
  o.kind = OutcomeKind::kFailed;
  o.error = error;
  return o;
}

// Hands the finished record over: states must cover every position.
void finish_record(CaptureRun& run, bool teacher_forced) {
  auto rec = std::make_shared<CapturedRecord>();
  rec->input_ids = run.prompt_ids;
  rec->input_ids.insert(rec->input_ids.end(), run.output_ids.begin(), run.output_ids.end());
  rec->loss_mask = run.prompt_mask;
  rec->loss_mask.resize(rec->input_ids.size(), 1);  // the generated response
  const int64_t n = int64_t(rec->input_ids.size());
  run.states->truncate(n);
  if (!run.states->complete(n))
    return run.done(failed_outcome(
        fmt::format("internal: the captured states miss positions of {} tokens", n)));
  rec->states = run.states;
  GenerationOutcome o = std::move(run.outcome);
  o.hidden = std::move(rec);
  o.teacher_forced = teacher_forced;
  run.done(std::move(o));
}

}  // namespace

void EngineTarget::start_capture(const GenerationTask& task, std::vector<int32_t> prompt_ids,
                                 OutcomeCallback done) {
  const PromptRecord& r = *task.record;
  const bool forced = capture_.capture_only;
  auto run = std::make_shared<CaptureRun>();
  run->dataset = task.dataset;
  run->id = r.id;
  run->done = std::move(done);
  run->on_tokens = task.on_tokens;
  // Room for every position it can reach; its aux blocks stream to its file when the job has one.
  const int64_t rows =
      int64_t(prompt_ids.size()) + (forced ? 0 : int64_t(sampling_.params.max_new_tokens)) + 1;
  const int num_aux = int(capture_.layers.size());
  if (task.hidden_store != nullptr) {
    run->states = task.hidden_store->begin_record(task.dataset, r.id, num_aux, capture_.hidden_size,
                                                  capture_.dtype, rows);
  } else {
    run->states = std::make_shared<CapturedStates>(capture_.dtype);
    run->states->reserve(rows, int64_t(num_aux + 1) * capture_.hidden_size);
  }
  // The prompt's own assistant turns (earlier turns of a multi-turn prompt; every turn when
  // teacher-forced). Computed here, on the job's thread, not in the engine's callbacks.
  const nlohmann::ordered_json messages =
      r.messages.is_null() ? nlohmann::ordered_json()
                           : template_messages(forced ? r.messages : prompt_messages(r.messages));
  run->prompt_mask = assistant_mask(encoder_, messages, prompt_ids.size(),
                                    template_context(r, sampling_.chat_template_kwargs));
  run->prompt_ids = prompt_ids;

  GenerateRequest req;
  req.prompt_ids = std::move(prompt_ids);
  req.params = sampling_.params;
  req.params.seed = task.seed;
  req.capture = run->states;
  req.use_prefix_cache = false;  // every position is computed, so every position is captured
  if (forced) {
    req.params = SamplingParams{.temperature = 0.0f, .seed = task.seed};
    req.params.max_new_tokens = 1;
  } else if (!task.resume_output_ids.empty()) {
    if (task.resume_prompt_tokens == int32_t(req.prompt_ids.size())) {
      req.resume_output_ids = task.resume_output_ids;
      req.resume_rng_draws = task.resume_rng_draws;
    } else {
      LOG_WARN(
          "{} id {}: its checkpoint was made for a {}-token prompt, this one has {}; starting it "
          "over",
          task.dataset, r.id, task.resume_prompt_tokens, req.prompt_ids.size());
      if (task.on_tokens) task.on_tokens(TokenReport{.restart = true});
    }
  }
  // --reasoning-parser and --tool-call-parser on a generated chat answer (a teacher-forced one is
  // kept as it is).
  bool inside = false;
  const std::optional<ReasoningFormat> reasoning =
      forced ? std::nullopt : reasoning_of(r, req, &inside);
  const std::optional<ToolCallFormat> tool_call = forced ? std::nullopt : tool_call_of(r, req);
  const int earlier_calls = tool_call ? count_tool_calls(prompt_messages(r.messages)) : 0;
  Engine* engine = &engine_;
  req.on_event = [run, forced, engine, reasoning, inside, tool_call,
                  earlier_calls](const StreamEvent& ev) {
    if (!forced) {
      run->text += ev.text;
      run->output_ids.insert(run->output_ids.end(), ev.token_ids.begin(), ev.token_ids.end());
      if (run->on_tokens && !ev.resumed && !ev.token_ids.empty())
        run->on_tokens(TokenReport{.token_ids = ev.token_ids,
                                   .rng_draws = ev.rng_draws,
                                   .prompt_tokens = ev.prompt_tokens});
    }
    if (!ev.finished) return;
    if (!ev.error.empty() || ev.finish_reason == FinishReason::kAbort)
      return run->done(
          failed_outcome(ev.error.empty() ? "the engine aborted the request" : ev.error));
    GenerationOutcome& o = run->outcome;
    o.prompt_tokens = ev.prompt_tokens;
    o.completion_tokens = forced ? 0 : ev.completion_tokens;
    o.finish_reason = forced ? "capture" : finish_reason_name(ev.finish_reason);
    if (forced) {
      run->output_ids.clear();  // the sampled token is not part of the conversation
      return finish_record(*run, /*teacher_forced=*/true);
    }
    o.text = std::move(run->text);
    split_answer(reasoning, inside, tool_call, earlier_calls, &o);
    if (run->output_ids.empty()) return finish_record(*run, false);
    // The last token's state: one more token over prompt + response (see the top of the file).
    GenerateRequest tail;
    tail.prompt_ids = run->prompt_ids;
    tail.prompt_ids.insert(tail.prompt_ids.end(), run->output_ids.begin(), run->output_ids.end());
    tail.params = SamplingParams{.temperature = 0.0f, .seed = 0};
    tail.params.max_new_tokens = 1;
    // Straight into the record's states (its file, for a streamed record), keeping the rows the
    // request captured: the tail recomputes the last page but adds only the last position. The
    // finished event came after the capture writer stored every row of the request, and the
    // tail's rows follow in later writer jobs, so the states see one writer at a time.
    run->states->keep_written();
    tail.capture = run->states;
    // Ahead of the queue: admitted while the finished request's pages are still in the prefix
    // cache, so only the last page is computed again (behind a full queue they may be evicted).
    tail.urgent = true;
    tail.on_event = [run](const StreamEvent& tev) {
      if (!tev.finished) return;
      if (!tev.error.empty() || tev.finish_reason == FinishReason::kAbort)
        return run->done(
            failed_outcome(tev.error.empty() ? "the engine aborted the request" : tev.error));
      finish_record(*run, false);
    };
    auto id = engine->submit(std::move(tail));
    if (!id.ok())
      run->done(failed_outcome("capturing the last token's state: " + id.error().describe()));
  };
  auto id = engine_.submit(std::move(req));
  if (!id.ok()) run->done(failed_outcome(id.error().describe()));
}

}  // namespace strata
