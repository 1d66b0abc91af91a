#include "server/generation.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <ctime>
#include <random>
#include <utility>

#include "core/log.h"
#include "server/request_log.h"
#include "server/sglang_generate.h"
#include "server/sse.h"

namespace strata {
namespace {

using nlohmann::json;

double seconds(Generation::Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string random_id(const char* prefix) {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  return fmt::format("{}{:016x}{:08x}", prefix, rng(), uint32_t(rng()));
}

// The engine request of choice `choice` (of every prompt's n) for one prompt: the parsed sampling
// values, the choice's seed, and max_tokens or the server's default (completions 16 as OpenAI, chat
// the rest of the context, at least 1: a prompt that leaves no room is then refused for its
// length).
GenerateRequest engine_request(const OpenAiRequest& req, std::vector<int32_t> prompt,
                               int64_t context, int choice) {
  GenerateRequest g;
  g.params = req.sampling;
  if (req.sampling.seed) g.params.seed = *req.sampling.seed + uint64_t(choice);
  const int64_t room = std::max<int64_t>(1, context - int64_t(prompt.size()));
  const int64_t dflt = req.endpoint == Endpoint::kChat ? room : std::min<int64_t>(16, room);
  g.params.max_new_tokens = int32_t(req.max_tokens ? *req.max_tokens : dflt);
  g.top_logprobs = req.top_logprobs;
  g.prompt_logprobs_from = req.prompt_logprobs_from;
  g.skip_special_tokens = req.skip_special_tokens;
  g.prompt_ids = std::move(prompt);
  return g;
}

}  // namespace

Generation::Generation(ServerState& state, OpenAiRequest req)
    : state_(state), req_(std::move(req)) {
  meta_.id = random_id(req_.endpoint == Endpoint::kChat          ? "chatcmpl-"
                       : req_.endpoint == Endpoint::kCompletions ? "cmpl-"
                                                                 : "");
  meta_.created = int64_t(std::time(nullptr));
  meta_.model = state_.config().served_model_name;
}

std::variant<ApiError, std::unique_ptr<Generation>> Generation::start(ServerState& state,
                                                                      OpenAiRequest req,
                                                                      Clock::time_point arrival) {
  const std::string& served = state.config().served_model_name;
  if (!req.model.empty() && req.model != served)
    return api_error(
        404,
        fmt::format("The model '{}' does not exist; this server serves '{}'", req.model, served),
        "invalid_request_error", "model", "model_not_found");
  const bool chat = req.endpoint == Endpoint::kChat;
  const char* prompt_param = chat ? "messages" : "prompt";
  std::vector<std::vector<int32_t>> prompts;
  // What this server enforces (and /v1/models reports): the model's context, or the KV pool when
  // that is smaller (a request larger than the pool could never run, not even alone).
  const ContextLimit ctx = state.context_limit();
  const int64_t limit = ctx.tokens;
  // Text that cannot fit in `limit` tokens is refused before tokenizing, which would hold this
  // thread for minutes on a 64 MiB body of spaces.
  const size_t max_bytes = state.encoder().max_prompt_bytes(limit);
  auto too_long = [&](size_t bytes) {
    return bad_request(
        fmt::format("This model's maximum context length is {} tokens{}. However, your prompt "
                    "is {} bytes, more than {} tokens can hold.",
                    limit, ctx.why(), bytes, limit),
        prompt_param, "context_length_exceeded");
  };
  if (chat) {
    if (!state.encoder().has_chat_template())
      return bad_request("this model has no chat template; use /v1/completions", "messages");
    if (wants_tool_calls(req) && !state.config().tool_call)
      return bad_request(
          fmt::format("'tools' need the server started with --tool-call-parser (the model's call "
                      "format: {}); or send tool_choice \"none\"",
                      fmt::join(tool_call_format_names(), ", ")),
          "tools");
    auto ids = req.continue_final_message
                   ? state.encoder().encode_chat_continuing(req.messages, max_bytes,
                                                            chat_template_context(req))
                   : state.encoder().encode_chat(req.messages, req.add_generation_prompt, max_bytes,
                                                 chat_template_context(req));
    if (ids.status().code() == StatusCode::kOutOfRange)
      return bad_request(ids.status().message(), "messages", "context_length_exceeded");
    if (!ids.ok()) return bad_request(ids.status().message(), "messages");
    prompts.push_back(std::move(ids).value());
  } else {
    for (const auto& t : req.text_prompts) {
      if (t.size() > max_bytes) return too_long(t.size());
      prompts.push_back(state.encoder().encode_raw(t));
    }
    for (auto& p : req.token_prompts) prompts.push_back(std::move(p));
  }
  // echo: each prompt as sent (token prompts as their text, special tokens included).
  std::vector<std::string> echo_texts;
  if (req.echo) {
    echo_texts = req.text_prompts;
    for (size_t i = req.text_prompts.size(); i < prompts.size(); ++i)
      echo_texts.push_back(state.engine().tokenizer().decode(prompts[i]));
  }
  // The request contract (engine/request_validation.h) for every prompt before any is submitted.
  for (const auto& p : prompts)
    if (auto e = state.engine().check(engine_request(req, p, limit, 0)))
      return api_error_from(*e, prompt_param);
  std::unique_ptr<Generation> g(new Generation(state, std::move(req)));
  g->echo_texts_ = std::move(echo_texts);
  if (const auto& format = state.config().reasoning; chat && format && g->req_.separate_reasoning) {
    const Tokenizer& tok = state.engine().tokenizer();
    const bool inside = starts_inside_reasoning(*format, tok, prompts[0]);
    g->keep_special_ids_ = reasoning_tag_token_ids(*format, tok);
    for (int i = 0; i < g->req_.n; ++i)
      g->splitters_.emplace_back(*format, inside, g->req_.stream_reasoning);
  }
  if (const auto& format = state.config().tool_call; format && wants_tool_calls(g->req_)) {
    for (int32_t id : tool_call_tag_token_ids(*format, state.engine().tokenizer()))
      g->keep_special_ids_.push_back(id);
    g->tool_splitters_.assign(size_t(g->req_.n), ToolCallSplitter(*format));
    g->calls_made_.assign(size_t(g->req_.n), 0);
  }
  if (auto e = g->submit_all(std::move(prompts), arrival)) return *e;
  if (const RequestLogConfig& log = state.config().log_requests; log.enabled) {
    std::vector<int32_t> lengths;
    for (size_t i = 0; i < g->prompt_tokens_.size(); i += size_t(g->req_.n))
      lengths.push_back(g->prompt_tokens_[i]);
    LOG_INFO("{}", describe_received(g->req_, g->meta_, lengths, log.level));
  }
  return g;
}

std::optional<ApiError> Generation::submit_all(std::vector<std::vector<int32_t>> prompts,
                                               Clock::time_point arrival) {
  const int total = int(prompts.size()) * req_.n;
  switch (state_.admit(total)) {
    case ServerState::Admit::kOk:
      break;
    case ServerState::Admit::kQueueFull:
      state_.metrics()->requests_rejected.inc();
      return server_error(503,
                          "the server's request queue is full (--max-queued-requests); retry later",
                          "queue_full");
    case ServerState::Admit::kDraining:
      state_.metrics()->requests_rejected.inc();
      return server_error(503, "the server is shutting down", "unavailable");
  }
  admitted_ = total;
  arrival_ = arrival;
  stream_ = std::make_shared<RequestStream>(total);
  choices_.resize(size_t(total));
  finished_.assign(size_t(total), false);
  engine_ids_.assign(size_t(total), -1);
  prompt_tokens_.assign(size_t(total), 0);
  echo_sent_.assign(size_t(total), false);
  cached_tokens_.assign(size_t(total), 0);
  spec_counts_.assign(size_t(total), {0, 0, 0});
  e2e_s_.assign(size_t(total), 0.0);
  const int64_t context = state_.context_limit().tokens;
  for (int i = 0; i < total; ++i) {
    const auto& prompt = prompts[size_t(i / req_.n)];
    GenerateRequest g = engine_request(req_, prompt, context, i);
    g.keep_special_ids = keep_special_ids_;
    prompt_tokens_[size_t(i)] = int32_t(prompt.size());
    if (req_.echo) choices_[size_t(i)].echo_text = echo_texts_[size_t(i / req_.n)];
    if (req_.echo || req_.prompt_logprobs_from >= 0) choices_[size_t(i)].prompt_ids = prompt;
    g.on_event = [stream = stream_, metrics = state_.metrics(), i, arrival,
                  last = Clock::time_point{}](const StreamEvent& ev) mutable {
      const auto now = Clock::now();
      if (!ev.token_ids.empty()) {
        if (last == Clock::time_point{}) {
          metrics->ttft.observe(seconds(now - arrival));
        } else {
          metrics->itl.observe(seconds(now - last) / double(ev.token_ids.size()));
        }
        last = now;
      }
      if (ev.finished) metrics->e2e.observe(seconds(now - arrival));
      stream->push(i, ev);
    };
    auto id = state_.engine().submit(std::move(g));
    if (!id.ok()) {
      abort();  // the destructor releases the slots
      return api_error_from(id.error(), req_.endpoint == Endpoint::kChat ? "messages" : "prompt");
    }
    engine_ids_[size_t(i)] = *id;
    state_.track(*id);
  }
  return std::nullopt;
}

Generation::~Generation() {
  if (const RequestLogConfig& log = state_.config().log_requests; log.enabled && admitted_ > 0)
    LOG_INFO("{}", describe_finished(req_, meta_, choices_, usage(),
                                     seconds(Clock::now() - arrival_), log.level));
  abort();
  for (int64_t id : engine_ids_)
    if (id >= 0) state_.untrack(id);
  if (admitted_ > 0) state_.release(admitted_);
}

void Generation::abort() {
  for (size_t i = 0; i < engine_ids_.size(); ++i)
    if (engine_ids_[i] >= 0 && !finished_[i]) state_.engine().abort(engine_ids_[i]);
}

void Generation::apply(ChoiceEvent& ce) {
  ChoiceResult& c = choices_[size_t(ce.choice)];
  StreamEvent& ev = ce.event;
  if (ev.prompt_logprobs_from > 0) {  // the first token's event brings the prompt's
    c.prompt_logprobs = std::move(ev.prompt_logprobs);
    c.prompt_logprobs_from = ev.prompt_logprobs_from;
  }
  // echo with max_tokens 0: the one sampled token is not part of the answer.
  if (!req_.prompt_only) {
    c.text += ev.text;
    c.token_ids.insert(c.token_ids.end(), ev.token_ids.begin(), ev.token_ids.end());
    for (auto& lp : ev.logprobs) c.logprobs.push_back(lp);
  }
  if (ev.finished) {
    c.finish_reason = req_.prompt_only && ev.finish_reason != FinishReason::kAbort
                          ? FinishReason::kLength
                          : ev.finish_reason;
    c.error = ev.error;
    finished_[size_t(ce.choice)] = true;
    cached_tokens_[size_t(ce.choice)] = ev.cached_tokens;
    spec_counts_[size_t(ce.choice)] = {ev.spec_verify_ct, ev.spec_draft_token_num,
                                       ev.spec_accept_token_num};
    e2e_s_[size_t(ce.choice)] = seconds(Clock::now() - arrival_);
  }
}

Usage Generation::usage() const {
  Usage usage;
  usage.include_spec = req_.return_meta_info;
  for (size_t i = 0; i < choices_.size(); ++i) {
    usage.completion_tokens += int64_t(choices_[i].token_ids.size());
    usage.spec_verify_ct += spec_counts_[i][0];
    usage.spec_draft_token_num += spec_counts_[i][1];
    usage.spec_accept_token_num += spec_counts_[i][2];
    if (i % size_t(req_.n) == 0) {
      usage.prompt_tokens += prompt_tokens_[i];
      usage.cached_tokens += cached_tokens_[i];
    }
  }
  return usage;
}

std::vector<ChoiceEvent> Generation::take_events(std::chrono::milliseconds wait) {
  if (!held_.empty()) return std::exchange(held_, {});
  return stream_->pop(wait);
}

bool Generation::try_started(std::optional<ApiError>* error) {
  std::vector<ChoiceEvent> events = stream_->pop(std::chrono::milliseconds(0));
  bool produced = false;
  for (const ChoiceEvent& ce : events) {
    produced |= ce.event.started || !ce.event.token_ids.empty();
    if (ce.event.finished) {
      ++start_finished_;
      if (ce.event.finish_reason == FinishReason::kAbort && start_error_.empty())
        start_error_ = ce.event.error.empty() ? "the request was aborted" : ce.event.error;
    }
  }
  held_.insert(held_.end(), std::make_move_iterator(events.begin()),
               std::make_move_iterator(events.end()));
  *error = std::nullopt;
  if (produced) return true;
  if (start_finished_ < int(finished_.size())) return false;
  if (start_error_.empty()) return true;  // finished normally without a token (e.g. a stop at once)
  if (state_.draining())
    *error = server_error(
        503, "the server is shutting down and this request had not started; retry it elsewhere",
        "unavailable");
  else
    *error = server_error(500, start_error_);
  return true;
}

// Waits until every choice finished or `wait` passed (events before then are folded in; a
// non-streaming response writes one keep-alive space per call, so per `wait`, not per token).
std::optional<nlohmann::json> Generation::poll_response(std::chrono::milliseconds wait) {
  auto all_finished = [&] {
    return std::all_of(finished_.begin(), finished_.end(), [](bool f) { return f; });
  };
  const auto deadline = Clock::now() + wait;
  while (!all_finished()) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    for (auto& ce : take_events(std::max(left, std::chrono::milliseconds(0)))) apply(ce);
    if (left.count() <= 0) break;
  }
  if (!all_finished()) return std::nullopt;
  if (req_.endpoint == Endpoint::kGenerate) return generate_response();
  if (splitters_.empty() && tool_splitters_.empty())
    return build_response(req_, meta_, choices_, usage(), state_.engine().tokenizer());
  std::vector<ChoiceResult> split = choices_;
  for (size_t i = 0; i < split.size(); ++i) {
    Split parts = split_text(int(i), split[i].text, /*final=*/true);
    split[i].text = std::move(parts.content);
    if (!splitters_.empty()) split[i].reasoning = std::move(parts.reasoning);
    split[i].tool_calls = std::move(parts.calls);
  }
  return build_response(req_, meta_, split, usage(), state_.engine().tokenizer());
}

nlohmann::json Generation::generate_item(int choice) const {
  const size_t i = size_t(choice);
  const int prompt = choice / req_.n;
  GenerateChoiceMeta m;
  const bool per_prompt = int(req_.rids.size()) == req_.num_prompts();
  m.id = req_.rids.empty() ? meta_.id : per_prompt ? req_.rids[size_t(prompt)] : req_.rids[0];
  if (req_.n > 1 || (!per_prompt && req_.num_prompts() > 1)) m.id += fmt::format("-{}", choice);
  m.prompt_tokens = prompt_tokens_[i];
  m.cached_tokens = cached_tokens_[i];
  m.e2e_latency_s = finished_[i] ? e2e_s_[i] : seconds(Clock::now() - arrival_);
  return build_generate_item(req_, choices_[i], m, state_.engine().tokenizer(), choice);
}

nlohmann::json Generation::generate_response() const {
  if (!req_.native_batch && choices_.size() == 1) return generate_item(0);
  nlohmann::json items = nlohmann::json::array();
  for (int i = 0; i < int(choices_.size()); ++i) items.push_back(generate_item(i));
  return items;
}

Generation::Split Generation::split_text(int choice, std::string_view text, bool final) {
  Split out;
  if (splitters_.empty()) {
    out.content = std::string(text);
  } else {
    ReasoningSplitter& rs = splitters_[size_t(choice)];
    ReasoningSplitter::Parts parts = final ? rs.push_and_finish(text) : rs.push(text);
    out.content = std::move(parts.content);
    out.reasoning = std::move(parts.reasoning);
  }
  if (tool_splitters_.empty()) return out;
  // The reasoning's tool-section tag (Kimi K2, Qwen3) ends it and stays in the content, where
  // the calls are parsed.
  ToolCallSplitter& ts = tool_splitters_[size_t(choice)];
  ToolCallSplitter::Parts parts = final ? ts.push_and_finish(out.content) : ts.push(out.content);
  out.content = std::move(parts.content);
  int& made = calls_made_[size_t(choice)];
  out.first_call = made;
  out.calls = name_tool_calls(*state_.config().tool_call, std::move(parts.calls),
                              req_.history_tool_calls, made, req_.parallel_tool_calls);
  made += int(out.calls.size());
  return out;
}

bool Generation::next_sse(std::string* out, std::chrono::milliseconds heartbeat,
                          bool keepalive_when_idle) {
  const Tokenizer& tok = state_.engine().tokenizer();
  if (!started_stream_) {
    started_stream_ = true;
    if (req_.endpoint == Endpoint::kChat) {
      for (int i = 0; i < int(choices_.size()); ++i) {
        ChunkPart role;
        role.choice = i;
        role.first = true;
        *out += sse_event(build_chunk(req_, meta_, role, tok));
      }
    }
  }
  auto events = take_events(heartbeat);
  if (events.empty() && keepalive_when_idle) *out += sse_keepalive();
  if (req_.endpoint == Endpoint::kGenerate) {
    // SGLang's stream: each event carries the choice's whole text so far.
    for (auto& ce : events) {
      const bool news = !ce.event.token_ids.empty() || !ce.event.text.empty() || ce.event.finished;
      apply(ce);
      if (news) *out += sse_event(generate_item(ce.choice));
    }
    if (!std::all_of(finished_.begin(), finished_.end(), [](bool f) { return f; })) return false;
    *out += sse_done();
    done_sent_ = true;
    return true;
  }
  for (auto& ce : events) {
    const size_t ci = size_t(ce.choice);
    if (req_.echo && !echo_sent_[ci] && (!ce.event.token_ids.empty() || ce.event.finished)) {
      // echo: the prompt's chunk first (its logprobs come with the first token's event).
      echo_sent_[ci] = true;
      const ChoiceResult& c = choices_[ci];
      ChunkPart echo;
      echo.choice = ce.choice;
      echo.text = c.echo_text;
      echo.token_ids = c.prompt_ids;
      echo.unscored = unscored_prompt_tokens(c.prompt_ids.size(), ce.event.prompt_logprobs.size(),
                                             ce.event.prompt_logprobs_from);
      if (echo.unscored < c.prompt_ids.size()) echo.logprobs = ce.event.prompt_logprobs;
      *out += sse_event(build_chunk(req_, meta_, echo, tok));
    }
    ChunkPart part;
    part.choice = ce.choice;
    // The last event also flushes what the splitters held back.
    Split parts = split_text(ce.choice, ce.event.text, ce.event.finished);
    part.text = std::move(parts.content);
    part.reasoning = std::move(parts.reasoning);
    part.tool_calls = std::move(parts.calls);
    part.tool_index = parts.first_call;
    part.token_ids = ce.event.token_ids;
    part.logprobs = ce.event.logprobs;
    part.text_offset = choices_[ci].echo_text.size() + choices_[ci].text.size();
    apply(ce);
    if (!req_.prompt_only &&
        (!part.text.empty() || !part.reasoning.empty() || !part.tool_calls.empty() ||
         (req_.top_logprobs >= 0 && !part.token_ids.empty())))
      *out += sse_event(build_chunk(req_, meta_, part, tok));
    if (ce.event.finished) {
      ChunkPart end;
      end.choice = ce.choice;
      end.finish = choices_[ci].finish_reason;
      end.called_tools = !calls_made_.empty() && calls_made_[size_t(ce.choice)] > 0;
      *out += sse_event(build_chunk(req_, meta_, end, tok));
    }
  }
  if (!std::all_of(finished_.begin(), finished_.end(), [](bool f) { return f; })) return false;
  if (req_.include_usage) *out += sse_event(build_usage_chunk(req_, meta_, usage()));
  *out += sse_done();
  done_sent_ = true;
  return true;
}

}  // namespace strata
