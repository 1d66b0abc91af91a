// SGLang launch flags that `strata serve` has no setting of its own for, so that an SGLang
// command line runs or is refused with a reason, never with "argument not expected":
// - accepted without effect: knobs of SGLang's own machinery (a kernel backend, a warm-up, a
//   log interval, stream batching) that change nothing strata computes or returns; each one
//   given is named once in the log;
// - accepted at their neutral value only (--dp-size 1, --dtype auto, --base-gpu-id 0): any
//   other value is refused, saying what to do instead;
// - refused: features strata has not built (expert or data parallelism, LoRA, tool-call
//   parsing, ...), since an operator must not believe such a setting took effect.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "core/status.h"

namespace strata::tools {

struct SglangFlags {
  std::vector<std::vector<std::string>> values;  // one per table entry (flags: unused)
  std::vector<CLI::Option*> options;
};

// Registers every flag of the table on `app`.
void add_sglang_flags(CLI::App& app, SglangFlags& flags);

// After parsing: the first refused flag's error (Unimplemented or InvalidArgument); otherwise
// logs the accepted ones that have no effect and returns OK.
Status check_sglang_flags(const SglangFlags& flags);

}  // namespace strata::tools
