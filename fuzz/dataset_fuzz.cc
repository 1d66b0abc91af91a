// Fuzzes the JSONL dataset reader of `strata generate`: read_prompt_file on arbitrary bytes, and
// for every accepted record what the runner does with it (prompt_messages, the output line built
// from the original JSON).
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string_view>

#include "fuzz_util.h"
#include "pipeline/dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static strata::fuzz::MemFile file;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto records = strata::read_prompt_file(file.write(text), "fuzz");
  if (!records.ok()) return 0;
  for (const strata::PromptRecord& r : *records) {
    if (r.id.empty() && !r.original.contains("id")) __builtin_trap();
    if (!r.messages.is_null()) {
      nlohmann::json m = strata::prompt_messages(r.messages);
      (void)m.dump();
    }
    nlohmann::json out = r.original;  // as the runner writes its output line
    out["output"] = "x";
    (void)out.dump();
  }
  return 0;
}
