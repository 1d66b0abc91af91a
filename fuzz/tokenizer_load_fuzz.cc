// Fuzzes Tokenizer::from_json_text (tokenizer.json + tokenizer_config.json) and then runs the
// loaded tokenizer: encode, decode and the streaming decoder on a short text.
// Input: "<tokenizer.json>\0<tokenizer_config.json>\0<text>" (missing fields are empty).
#include <cstdint>
#include <string>

#include "fuzz_util.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto f = strata::fuzz::split_fields(data, size, 3);
  auto tok = strata::Tokenizer::from_json_text(f[0], f[1], "fuzz/tokenizer.json");
  if (!tok.ok()) return 0;
  std::string_view text = f[2].empty() ? std::string_view("Hello world! <s> 123 \xc3\xa9") : f[2];
  std::vector<int32_t> ids = tok->encode(text.substr(0, 4096));
  std::string decoded = tok->decode(ids);
  std::vector<int32_t> with = tok->with_special_tokens(ids);
  strata::StreamDecoder stream(*tok, /*skip_special=*/false);
  std::string streamed;
  for (int32_t id : with) streamed += stream.push(id);
  streamed += stream.finish();
  // StreamDecoder promises that its pieces concatenate to decode(), for any decoder chain
  // (a Strip of 2 leading spaces after Fuse once broke it: the crash_stream_decoder_strip seed).
  if (streamed != tok->decode(with)) __builtin_trap();
  // Ids around the vocabulary's edges.
  std::vector<int32_t> edges = {
      0, -1, int32_t(tok->vocab_size()), int32_t(tok->vocab_size()) - 1, INT32_MAX, INT32_MIN};
  (void)tok->decode(edges);
  for (int32_t id : edges) (void)tok->id_to_token(id), (void)tok->is_special(id);
  return 0;
}
