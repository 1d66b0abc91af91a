// Test support for the batch job (pipeline/runner.h): datasets made in memory, and a fake prompt
// target that reports tokens as it goes and can resume, like the in-process engine.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "pipeline/dataset.h"
#include "pipeline/prompt_target.h"

namespace strata::testing {

// `n` records of dataset `name`: {"id": id_prefix + i, "conversations": [user "q<i>"]}.
inline Dataset conversation_dataset(const std::string& name, int n,
                                    const std::string& id_prefix = "p") {
  Dataset d{.name = name};
  for (int i = 0; i < n; ++i) {
    auto r = parse_prompt_line(
        nlohmann::json(
            {{"id", id_prefix + std::to_string(i)},
             {"conversations", {{{"role", "user"}, {"content", "q" + std::to_string(i)}}}}})
            .dump(),
        i + 1, name);
    EXPECT_TRUE(r.ok());
    d.records.push_back(*r);
  }
  return d;
}

// Reports tokens as it goes and can resume: prompts of 3 tokens, token i of prompt pN is
// 1000 N + i (a continuation shows where it resumed), the text "<id> from <first token index of
// this run>". Tasks in `interrupt` stop after `tokens_before_interrupt` tokens and end
// kInterrupted (the job stops, as after a kill). What each resumed task was handed is kept in
// `resumed`. A subclass that checkpoints KV rows reports them from after_token().
class ResumableTarget : public PromptTarget {
 public:
  std::set<std::string> interrupt;
  int tokens_before_interrupt = 5;
  int total_tokens = 12;
  struct Resumed {
    std::vector<int32_t> tokens;
    uint64_t draws = 0;
    std::shared_ptr<const KvRows> kv;
    int32_t export_from = 0;
  };
  std::map<std::string, Resumed> resumed;  // by id

  std::string model_name() const override { return "fake-model"; }
  int max_in_flight() const override { return 4; }  // every prompt of the tests starts at once
  bool can_resume() const override { return true; }
  void start(const GenerationTask& task, OutcomeCallback done) override {
    const std::string& id = task.record->id;
    const int n = std::stoi(id.substr(1));
    const int from = int(task.resume_output_ids.size());
    if (from > 0)
      resumed[id] = {task.resume_output_ids, task.resume_rng_draws, task.resume_kv,
                     task.kv_export_from_row};
    int64_t kv_exported = task.kv_export_from_row;
    const int until = interrupt.count(id) ? tokens_before_interrupt : total_tokens;
    for (int i = from; i < until; ++i) {
      task.on_tokens(TokenReport{
          .token_ids = {1000 * n + i}, .rng_draws = uint64_t(i + 1), .prompt_tokens = 3});
      after_token(task, n, i, &kv_exported);
    }
    GenerationOutcome o;
    if (interrupt.count(id)) {
      o.kind = OutcomeKind::kInterrupted;
      o.error = "killed";
    } else {
      o.text = id + " from " + std::to_string(from);
      o.prompt_tokens = 3;
      o.completion_tokens = total_tokens;
      o.finish_reason = "length";
    }
    done(o);
  }

 protected:
  // After output token i of prompt pN was reported; `kv_exported` is the task's KV rows reported
  // so far (from task.kv_export_from_row).
  virtual void after_token(const GenerationTask& task, int n, int i, int64_t* kv_exported) {}
};

}  // namespace strata::testing
