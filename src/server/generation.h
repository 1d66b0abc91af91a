// Generation: one /v1/completions or /v1/chat/completions request in flight. start() validates
// it against the served model and the context, takes queue slots and submits one engine request
// per choice; the HTTP thread then either waits for the whole response or pulls SSE text.
// The engine callbacks only push into the RequestStream and observe latency histograms.
// One HTTP thread uses a Generation at a time; destroying it aborts unfinished choices (a
// client that went away) and releases the queue slots.
#pragma once

#include <array>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "server/openai_schema.h"
#include "server/request_stream.h"
#include "server/server_state.h"
#include "tokenizer/reasoning_parser.h"
#include "tokenizer/tool_call_parser.h"

namespace strata {

class Generation {
 public:
  using Clock = std::chrono::steady_clock;
  static std::variant<ApiError, std::unique_ptr<Generation>> start(ServerState& state,
                                                                   OpenAiRequest req,
                                                                   Clock::time_point arrival);
  ~Generation();
  Generation(const Generation&) = delete;
  Generation& operator=(const Generation&) = delete;

  bool streaming() const { return req_.stream; }
  // Whether the engine admitted the request (a choice's prefill began) or every choice ended; does
  // not block. False while it waits for admission; true once decided, with *error set when a
  // request that ended before admission because it was aborted (drained at shutdown, refused by
  // the engine) must be answered with that error (503 / 500) instead of a 200 with an empty body.
  // The server sends nothing before this says true; from then on its keep-alive writes notice a
  // client that hung up within a second.
  bool try_started(std::optional<ApiError>* error);
  // Called after every engine event of this request (set before events can arrive: at start()).
  void set_notify(std::function<void()> notify) { stream_->set_notify(std::move(notify)); }
  // Non-streaming: waits up to `wait` for every choice to finish. Returns the response body when
  // they have, nullopt otherwise (call again).
  std::optional<nlohmann::json> poll_response(std::chrono::milliseconds wait);
  // Streaming: waits up to `heartbeat` for events and appends their SSE text to *out (a
  // keep-alive when nothing happened, sse.h). Returns true when *out ends the stream with
  // `data: [DONE]`; the caller then sends it and stops.
  bool next_sse(std::string* out, std::chrono::milliseconds heartbeat,
                bool keepalive_when_idle = true);
  // True once every choice finished (its events may still be unread).
  bool all_finished() const { return stream_->all_finished(); }
  // Aborts every unfinished choice (the client went away); events still drain normally.
  void abort();

 private:
  Generation(ServerState& state, OpenAiRequest req);
  std::optional<ApiError> submit_all(std::vector<std::vector<int32_t>> prompts,
                                     Clock::time_point arrival);
  void apply(ChoiceEvent& ce);  // folds an event into choices_
  std::vector<ChoiceEvent> take_events(
      std::chrono::milliseconds wait);  // held_ first, then the stream
  Usage usage() const;                  // prompts counted once, not once per choice
  // A choice's new text through the reasoning and tool-call splitters (each when on); `final`
  // flushes what they held back (the choice finished).
  struct Split {
    std::string content, reasoning;
    std::vector<ApiToolCall> calls;
    int first_call = 0;  // the first call's index in the choice
  };
  Split split_text(int choice, std::string_view text, bool final);
  // /generate (server/sglang_generate.h): one choice's object, and the whole response.
  nlohmann::json generate_item(int choice) const;
  nlohmann::json generate_response() const;

  ServerState& state_;
  OpenAiRequest req_;
  ResponseMeta meta_;
  std::shared_ptr<RequestStream> stream_;
  std::vector<int64_t> engine_ids_;  // per choice; -1 when not submitted
  std::vector<ChoiceResult> choices_;
  std::vector<bool> finished_;
  std::vector<ChoiceEvent> held_;        // popped by try_started, not yet applied
  int start_finished_ = 0;               // try_started's count of choices that ended
  std::string start_error_;              // try_started: the first abort's reason
  std::vector<std::string> echo_texts_;  // OpenAiRequest::echo: per prompt
  std::vector<bool> echo_sent_;          // streaming echo: per choice, its prompt's chunk went out
  std::vector<int32_t> prompt_tokens_;   // per choice
  std::vector<int32_t> cached_tokens_;
  std::vector<std::array<int32_t, 3>> spec_counts_;  // verifies, drafted, accepted per choice
  std::vector<double> e2e_s_;                        // per choice: arrival to its end
  // --reasoning-parser on a chat request: one splitter per choice (none: off), and the parser's
  // tags that are special tokens (kept in the text).
  std::vector<ReasoningSplitter> splitters_;
  std::vector<int32_t> keep_special_ids_;
  // A chat request offering tools, with --tool-call-parser: one splitter per choice (none: off),
  // and the calls each choice made so far.
  std::vector<ToolCallSplitter> tool_splitters_;
  std::vector<int> calls_made_;
  Clock::time_point arrival_{};
  int admitted_ = 0;
  bool started_stream_ = false;
  bool done_sent_ = false;
};

}  // namespace strata
