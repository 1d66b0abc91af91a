#include "pipeline/engine_target.h"

#include <algorithm>
#include <filesystem>

#include "core/log.h"

namespace strata {

StatusOr<std::unique_ptr<EngineTarget>> EngineTarget::create(Engine& engine,
                                                             const JobSampling& sampling,
                                                             int max_in_flight,
                                                             const CaptureOptions& capture) {
  STRATA_ASSIGN_OR_RETURN(PromptEncoder enc,
                          PromptEncoder::load(engine.config().tokenizer_dir(), engine.tokenizer(),
                                              engine.config().chat_template));
  if (capture.enabled &&
      (engine.config().capture.layers != capture.layers || !engine.config().capture.final_norm))
    return failed_precondition("the engine captures other layers than the job asks for");
  std::unique_ptr<EngineTarget> b(new EngineTarget(engine, std::move(enc), sampling));
  b->capture_ = capture;
  b->model_name_ =
      std::filesystem::path(engine.config().model_path).lexically_normal().filename().string();
  if (b->model_name_.empty())
    b->model_name_ = std::filesystem::path(engine.config().model_path)
                         .lexically_normal()
                         .parent_path()
                         .filename();
  b->max_in_flight_ =
      max_in_flight > 0 ? max_in_flight : std::max(64, 2 * engine.plan().max_running_requests);
  return b;
}

StatusOr<std::vector<int32_t>> EngineTarget::encode(const PromptRecord& r) const {
  if (r.messages.is_null()) return encoder_.encode_raw(r.prompt);
  const nlohmann::ordered_json context = template_context(r, sampling_.chat_template_kwargs);
  if (capture_.enabled && capture_.capture_only)  // the conversation as it is, responses included
    return encoder_.encode_chat(template_messages(r.messages), /*add_generation_prompt=*/false,
                                SIZE_MAX, context);
  return encoder_.encode_chat(template_messages(prompt_messages(r.messages)),
                              /*add_generation_prompt=*/true, SIZE_MAX, context);
}

std::optional<ReasoningFormat> EngineTarget::reasoning_of(const PromptRecord& r,
                                                          GenerateRequest& req,
                                                          bool* inside) const {
  *inside = false;
  if (!sampling_.reasoning || r.messages.is_null()) return std::nullopt;
  *inside = starts_inside_reasoning(*sampling_.reasoning, engine_.tokenizer(), req.prompt_ids);
  for (int32_t id : reasoning_tag_token_ids(*sampling_.reasoning, engine_.tokenizer()))
    req.keep_special_ids.push_back(id);
  return sampling_.reasoning;
}

std::optional<ToolCallFormat> EngineTarget::tool_call_of(const PromptRecord& r,
                                                         GenerateRequest& req) const {
  if (r.messages.is_null() || r.tools.is_null()) return std::nullopt;
  if (!sampling_.tool_call) {
    if (!warned_no_tool_parser_.exchange(true))
      LOG_WARN(
          "records offer tools, and without --tool-call-parser the model's calls stay in the "
          "answer's content as it wrote them");
    return std::nullopt;
  }
  for (int32_t id : tool_call_tag_token_ids(*sampling_.tool_call, engine_.tokenizer()))
    req.keep_special_ids.push_back(id);
  return sampling_.tool_call;
}

void EngineTarget::split_answer(const std::optional<ReasoningFormat>& reasoning, bool inside,
                                const std::optional<ToolCallFormat>& tool_call, int earlier_calls,
                                GenerationOutcome* o) {
  if (reasoning) split_reasoning(*reasoning, inside, o);
  if (tool_call) split_tool_calls(*tool_call, earlier_calls, o);
}

int64_t EngineTarget::prompt_tokens(const PromptRecord& record) const {
  auto ids = encode(record);
  return ids.ok() ? int64_t(ids->size()) : -1;
}

void EngineTarget::start(const GenerationTask& task, OutcomeCallback done) {
  const PromptRecord& r = *task.record;
  StatusOr<std::vector<int32_t>> ids = encode(r);
  auto fail = [&](const std::string& error) {
    GenerationOutcome o;
    o.kind = OutcomeKind::kFailed;
    o.error = error;
    done(std::move(o));
  };
  if (!ids.ok()) return fail(ids.status().message());
  if (capture_.enabled) return start_capture(task, std::move(ids).value(), std::move(done));
  GenerateRequest req;
  req.prompt_ids = std::move(ids).value();
  req.params = sampling_.params;
  req.params.seed = task.seed;
  req.export_kv = task.export_kv;
  if (!task.resume_output_ids.empty()) {
    if (task.resume_prompt_tokens == int32_t(req.prompt_ids.size())) {
      req.resume_output_ids = task.resume_output_ids;
      req.resume_rng_draws = task.resume_rng_draws;
      req.resume_kv = task.resume_kv;
      req.kv_export_from_row = task.kv_export_from_row;
    } else {
      LOG_WARN(
          "{} id {}: its checkpoint was made for a {}-token prompt, this one has {}; starting it "
          "over",
          task.dataset, r.id, task.resume_prompt_tokens, req.prompt_ids.size());
      if (task.on_tokens) task.on_tokens(TokenReport{.restart = true});
    }
  }
  // --reasoning-parser and --tool-call-parser on a chat record: their tags reach the text, which
  // is split once finished.
  bool inside = false;
  const std::optional<ReasoningFormat> reasoning = reasoning_of(r, req, &inside);
  const std::optional<ToolCallFormat> tool_call = tool_call_of(r, req);
  const int earlier_calls = tool_call ? count_tool_calls(prompt_messages(r.messages)) : 0;
  // The callback runs on the engine thread: it only appends text, reports new tokens and hands
  // the outcome over once finished.
  auto text = std::make_shared<std::string>();
  req.on_event = [text, done, on_tokens = task.on_tokens, reasoning, inside, tool_call,
                  earlier_calls](const StreamEvent& ev) {
    *text += ev.text;
    if (on_tokens && !ev.resumed && !ev.token_ids.empty())
      on_tokens(TokenReport{
          .token_ids = ev.token_ids, .rng_draws = ev.rng_draws, .prompt_tokens = ev.prompt_tokens});
    if (on_tokens && ev.kv) on_tokens(TokenReport{.prompt_tokens = ev.prompt_tokens, .kv = ev.kv});
    if (!ev.finished) return;
    GenerationOutcome o;
    o.prompt_tokens = ev.prompt_tokens;
    o.completion_tokens = ev.completion_tokens;
    o.finish_reason = finish_reason_name(ev.finish_reason);
    if (!ev.error.empty() || ev.finish_reason == FinishReason::kAbort) {
      o.kind = OutcomeKind::kFailed;
      o.error = ev.error.empty() ? "the engine aborted the request" : ev.error;
    } else {
      o.text = std::move(*text);
      split_answer(reasoning, inside, tool_call, earlier_calls, &o);
    }
    done(std::move(o));
  };
  // A refused request fails this prompt with the contract's message (engine/request_error.h).
  auto id = engine_.submit(std::move(req));
  if (!id.ok()) fail(id.error().describe());
}

}  // namespace strata
