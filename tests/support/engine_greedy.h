// Test support: greedy generations through a running Engine, collected per prompt.
#pragma once

#include <gtest/gtest.h>

#include <mutex>
#include <vector>

#include "engine/engine.h"

namespace strata::testing {

// Submits every prompt (greedy, ignore_eos, `new_tokens` each) and returns each prompt's tokens
// once the engine is idle. `one_at_a_time`: wait for each request before submitting the next.
inline std::vector<std::vector<int32_t>> greedy_tokens(
    Engine& engine, const std::vector<std::vector<int32_t>>& prompts, int new_tokens,
    bool one_at_a_time = false) {
  std::vector<std::vector<int32_t>> out(prompts.size());
  std::mutex mu;
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerateRequest g;
    g.prompt_ids = prompts[i];
    g.params.temperature = 0;
    g.params.max_new_tokens = new_tokens;
    g.params.ignore_eos = true;
    g.on_event = [&out, &mu, i](const StreamEvent& ev) {
      std::lock_guard<std::mutex> lk(mu);
      out[i].insert(out[i].end(), ev.token_ids.begin(), ev.token_ids.end());
      EXPECT_TRUE(ev.error.empty()) << ev.error;
    };
    auto id = engine.submit(std::move(g));
    EXPECT_TRUE(id.ok()) << id.status().to_string();
    if (one_at_a_time) engine.wait_idle();
  }
  engine.wait_idle();
  return out;
}

}  // namespace strata::testing
