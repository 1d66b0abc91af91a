// Fuzzes the request parsers (/v1/completions, /v1/chat/completions and SGLang's native /generate
// bodies), then the rest of what the server does with an accepted body before the engine: the
// house model's chat template and tokenizer on chat messages, the tokenizer on text prompts.
// Input: first byte selects the endpoint (% 3: 0 completions, 1 chat, 2 /generate), the rest is
// the body.
#include <cstdint>
#include <string_view>

#include "fuzz_util.h"
#include "server/openai_schema.h"
#include "server/sglang_generate.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace {

struct House {
  strata::Tokenizer tok;
  strata::ChatTemplate tmpl;
};

const House& house() {
  static const House* h = [] {
    const std::string dir = strata::fuzz::shared_dir() + "/models/house-llama";
    auto tok = strata::Tokenizer::load(dir);
    auto tmpl = strata::ChatTemplate::load(dir);
    if (!tok.ok() || !tmpl.ok()) {
      fprintf(stderr, "openai_request_fuzz: cannot load %s\n", dir.c_str());
      std::abort();
    }
    return new House{std::move(tok).value(), std::move(tmpl).value()};
  }();
  return *h;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const House& h = house();
  const strata::Endpoint endpoints[] = {strata::Endpoint::kCompletions, strata::Endpoint::kChat,
                                        strata::Endpoint::kGenerate};
  const strata::Endpoint endpoint = endpoints[data[0] % 3];
  std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  strata::OpenAiRequest req;
  if (auto err = endpoint == strata::Endpoint::kGenerate
                     ? strata::parse_generate_request(body, &req)
                     : strata::parse_openai_request(body, endpoint, &req)) {
    (void)err->to_json().dump();  // strict: throws (and fails) on invalid UTF-8 in the message
    if (err->status < 400 || err->status > 599) __builtin_trap();
    return 0;
  }
  if (req.n < 1 || req.num_prompts() < 1) __builtin_trap();
  if (endpoint == strata::Endpoint::kChat) {
    auto text = h.tmpl.render(req.messages, /*add_generation_prompt=*/true,
                              strata::chat_template_context(req));
    if (text.ok()) (void)h.tok.encode(*text);
  }
  for (const auto& p : req.text_prompts) (void)h.tok.encode(p, /*allow_special=*/false);
  return 0;
}
