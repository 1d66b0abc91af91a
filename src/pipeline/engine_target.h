// Runs a batch job's prompts on the in-process engine: prompts are encoded on the job's
// thread (chat template, or the tokenizer's post-processor for raw prompts) and submitted with
// a callback that collects the text on the engine thread. The engine batches them continuously.
// Tokens are reported as they come (TokenReport, with the sampler's draws), and a task with a
// checkpointed partial output continues from it (GenerateRequest::resume_output_ids).
//
// Capture jobs (CaptureOptions; the engine must capture the same layers) hand back each record's
// hidden states at every position of prompt + response (engine_capture.cc says how).
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include "engine/engine.h"
#include "pipeline/hidden_store.h"
#include "pipeline/prompt_target.h"
#include "tokenizer/prompt_encoder.h"

namespace strata {

class EngineTarget : public PromptTarget {
 public:
  // `engine` must outlive the target. `max_in_flight` <= 0: twice the engine's
  // max_running_requests (at least 64), which keeps its batch full without queueing the
  // whole dataset inside it.
  static StatusOr<std::unique_ptr<EngineTarget>> create(Engine& engine, const JobSampling& sampling,
                                                        int max_in_flight = 0,
                                                        const CaptureOptions& capture = {});

  std::string model_name() const override { return model_name_; }
  int max_in_flight() const override { return max_in_flight_; }
  bool can_resume() const override { return true; }
  std::optional<KvRowsLayout> kv_rows_layout(std::string* why_not) const override {
    return engine_.kv_rows_layout(why_not);
  }
  void start(const GenerationTask& task, OutcomeCallback done) override;
  int64_t prompt_tokens(const PromptRecord& record) const override;

 private:
  // The prompt's token ids (chat template, or raw); with the whole conversation when
  // teacher-forced.
  StatusOr<std::vector<int32_t>> encode(const PromptRecord& r) const;
  // --reasoning-parser on a chat record: the format (nullopt: none), with `req` keeping its tags
  // in the text and *inside set when the prompt (req.prompt_ids) opened the reasoning.
  std::optional<ReasoningFormat> reasoning_of(const PromptRecord& r, GenerateRequest& req,
                                              bool* inside) const;
  // --tool-call-parser on a chat record with tools: the format (nullopt: none), with `req`
  // keeping its tags in the text.
  std::optional<ToolCallFormat> tool_call_of(const PromptRecord& r, GenerateRequest& req) const;
  // Both splits of a finished chat answer, as the record's settings ask.
  static void split_answer(const std::optional<ReasoningFormat>& reasoning, bool inside,
                           const std::optional<ToolCallFormat>& tool_call, int earlier_calls,
                           GenerationOutcome* o);
  // Capture jobs (engine_capture.cc).
  void start_capture(const GenerationTask& task, std::vector<int32_t> prompt_ids,
                     OutcomeCallback done);
  EngineTarget(Engine& engine, PromptEncoder encoder, const JobSampling& sampling)
      : engine_(engine), encoder_(std::move(encoder)), sampling_(sampling) {}
  Engine& engine_;
  PromptEncoder encoder_;
  JobSampling sampling_;
  CaptureOptions capture_;
  std::string model_name_;
  int max_in_flight_ = 64;
  mutable std::atomic<bool> warned_no_tool_parser_{false};
};

}  // namespace strata
