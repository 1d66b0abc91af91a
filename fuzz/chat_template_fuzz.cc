// Fuzzes the Jinja chat-template interpreter: an arbitrary template rendered with arbitrary
// messages and extra context, with and without the generation prompt.
// Input: "<template>\0<messages JSON>\0<extra context JSON>"; messages that do not parse fall back
// to a small conversation so that template mutations still render. The render limits are
// smaller than the defaults so that each input stays fast (a limit hit is an error Status,
// which is the behaviour under test).
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "fuzz_util.h"
#include "tokenizer/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using ojson = nlohmann::ordered_json;
  auto f = strata::fuzz::split_fields(data, size, 3);
  auto tmpl = strata::ChatTemplate::from_source(std::string(f[0]));
  if (!tmpl.ok()) return 0;
  tmpl->set_limits({.max_output_bytes = 1 << 20,
                    .max_loop_iterations = 100'000,
                    .max_steps = 1'000'000,
                    .max_call_depth = 64});
  ojson messages = ojson::parse(f[1], nullptr, /*allow_exceptions=*/false);
  if (messages.is_discarded()) {
    messages = ojson::array({{{"role", "system"}, {"content", "Be brief."}},
                             {{"role", "user"}, {"content", "Hi <|im_end|> {{ x }}"}},
                             {{"role", "assistant"}, {"content", "Hello."}}});
  }
  ojson extra = ojson::parse(f[2], nullptr, /*allow_exceptions=*/false);
  if (extra.is_discarded()) extra = ojson();
  for (bool gen : {false, true}) {
    auto out = tmpl->render(messages, gen, extra);
    if (out.ok() && out->size() > (1u << 20)) __builtin_trap();  // the output budget holds
  }
  return 0;
}
