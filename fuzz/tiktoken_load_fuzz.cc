// Fuzzes the tiktoken.model conversion (tokenizer/tiktoken_model.h: Kimi K2 / Moonlight
// checkpoints) through Tokenizer::load, then runs the loaded tokenizer on a short text: encode,
// decode and the streaming decoder must agree.
// Input: "<tiktoken.model>\0<tokenizer_config.json>\0<text>"; an empty config is Kimi's.
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "fuzz_util.h"
#include "tokenizer/tokenizer.h"

namespace {

const std::string& work_dir() {
  static const std::string* dir = [] {
    char tmpl[] = "/tmp/strata-fuzz-tiktoken-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) std::abort();
    return new std::string(tmpl);
  }();
  return *dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto f = strata::fuzz::split_fields(data, size, 3);
  const std::string& dir = work_dir();
  std::ofstream(dir + "/tiktoken.model", std::ios::binary | std::ios::trunc) << f[0];
  std::ofstream(dir + "/tokenizer_config.json", std::ios::binary | std::ios::trunc)
      << (f[1].empty() ? std::string_view(R"({"auto_map": {"AutoTokenizer":
             ["tokenization_kimi.TikTokenTokenizer", null]}})")
                       : f[1]);
  auto tok = strata::Tokenizer::load(dir);
  if (!tok.ok()) return 0;
  std::string_view text =
      f[2].empty() ? std::string_view("Hello 世界 123 \xc3\xa9 <|im_end|>") : f[2];
  std::vector<int32_t> ids = tok->encode(text.substr(0, 4096));
  strata::StreamDecoder stream(*tok, /*skip_special=*/false);
  std::string streamed;
  for (int32_t id : ids) streamed += stream.push(id);
  streamed += stream.finish();
  if (streamed != tok->decode(ids)) __builtin_trap();
  return 0;
}
