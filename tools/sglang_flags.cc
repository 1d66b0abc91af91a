#include "sglang_flags.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/log.h"

namespace strata::tools {

namespace {

enum class Kind {
  kNoEffect,      // accepted; changes nothing here
  kNeutralValue,  // accepted at `neutral` (a '|' list) only
  kRefused,       // not implemented
};

struct SglangFlag {
  const char* name;
  bool takes_value;
  Kind kind;
  const char* why;  // kNoEffect: why nothing changes; otherwise: what is missing, or what to do
  const char* neutral = "";
};

// A plain array: its size follows the rows (a std::array of a stated size would zero-fill a
// missing row).
constexpr SglangFlag kFlags[] = {
    // Without effect here.
    {"--skip-server-warmup", false, Kind::kNoEffect, "strata sends no warm-up request"},
    {"--enable-cache-report", false, Kind::kNoEffect,
     "usage.prompt_tokens_details.cached_tokens is always reported"},
    {"--show-time-cost", false, Kind::kNoEffect, "SGLang's timers"},
    {"--enable-p2p-check", false, Kind::kNoEffect, "NCCL checks peer access itself"},
    {"--disable-overlap-schedule", false, Kind::kNoEffect, "strata has no overlap scheduler"},
    {"--enable-mixed-chunk", false, Kind::kNoEffect,
     "strata runs prefill and decode steps apart, SGLang's default"},
    {"--stream-interval", true, Kind::kNoEffect, "text is streamed as the engine produces it"},
    {"--decode-log-interval", true, Kind::kNoEffect,
     "the 'Decode batch' line comes every 5 s while busy"},
    {"--sampling-backend", true, Kind::kNoEffect, "strata has one sampler per device"},
    {"--moe-runner-backend", true, Kind::kNoEffect, "strata has its own MoE kernels"},
    {"--grammar-backend", true, Kind::kNoEffect,
     "constrained-decoding requests are refused with a reason"},
    {"--torch-compile-max-bs", true, Kind::kNoEffect, "no torch.compile"},
    {"--log-level-http", true, Kind::kNoEffect, "--log-level covers the HTTP server"},
    // Their neutral value only.
    {"--dp-size", true, Kind::kNeutralValue, "data parallelism is not implemented yet", "1"},
    {"--dp", true, Kind::kNeutralValue, "data parallelism is not implemented yet", "1"},
    {"--ep-size", true, Kind::kNeutralValue, "expert parallelism is not implemented yet", "1"},
    {"--ep", true, Kind::kNeutralValue, "expert parallelism is not implemented yet", "1"},
    {"--dtype", true, Kind::kNeutralValue,
     "weights run in the checkpoint's stored formats (bf16, FP8 block, INT4)", "auto|bfloat16"},
    {"--load-format", true, Kind::kNeutralValue, "strata loads safetensors checkpoints",
     "auto|safetensors"},
    {"--tokenizer-mode", true, Kind::kNeutralValue, "strata has one tokenizer implementation",
     "auto"},
    {"--base-gpu-id", true, Kind::kNeutralValue,
     "choose the GPUs with CUDA_VISIBLE_DEVICES instead", "0"},
    // Not implemented.
    {"--hicache-storage-backend", true, Kind::kRefused,
     "a storage backend behind the host KV tier"},
    {"--enable-dp-attention", false, Kind::kRefused, "DP attention"},
    {"--enable-dp-lm-head", false, Kind::kRefused, "DP attention's LM head"},
    {"--enable-ep-moe", false, Kind::kRefused, "expert parallelism"},
    {"--moe-a2a-backend", true, Kind::kRefused, "expert parallelism's all-to-all"},
    {"--ep-num-redundant-experts", true, Kind::kRefused, "expert parallelism"},
    {"--quantization", true, Kind::kRefused, "on-the-fly quantization"},
    {"--attention-backend", true, Kind::kRefused, "choosing the attention backend"},
    {"--enable-torch-compile", false, Kind::kRefused, "torch.compile"},
    {"--schedule-policy", true, Kind::kRefused, "scheduling policies other than the default"},
    {"--lora-paths", true, Kind::kRefused, "LoRA adapters"},
    {"--allow-auto-truncate", false, Kind::kRefused,
     "cutting prompts to the context (a longer prompt is refused with its length)"},
    {"--revision", true, Kind::kRefused,
     "downloading checkpoints (--model-path is a local directory)"},
    {"--download-dir", true, Kind::kRefused,
     "downloading checkpoints (--model-path is a local directory)"},
    {"--cuda-graph-bs", true, Kind::kRefused,
     "a list of graph sizes; --cuda-graph-max-bs sets the largest"},
    {"--watchdog-timeout", true, Kind::kRefused,
     "SGLang's watchdog; --health-timeout makes /health fail on a stalled engine"},
};

bool is_neutral(const SglangFlag& f, const std::vector<std::string>& values) {
  if (values.size() != 1) return false;
  const std::string& value = values[0];
  const std::string_view all(f.neutral);
  for (size_t start = 0; start <= all.size();) {
    const size_t bar = std::min(all.find('|', start), all.size());
    if (all.substr(start, bar - start) == value) return true;
    start = bar + 1;
  }
  return false;
}

}  // namespace

void add_sglang_flags(CLI::App& app, SglangFlags& flags) {
  flags.values.assign(std::size(kFlags), {});
  flags.options.clear();
  for (size_t i = 0; i < std::size(kFlags); ++i) {
    const SglangFlag& f = kFlags[i];
    const std::string help =
        f.kind == Kind::kNoEffect ? std::string("SGLang's; no effect here: ") + f.why
        : f.kind == Kind::kNeutralValue
            ? std::string("SGLang's; accepted as ") + f.neutral + " only (" + f.why + ")"
            : std::string("not implemented yet (") + f.why + ")";
    flags.options.push_back(f.takes_value ? app.add_option(f.name, flags.values[i], help)
                                          : app.add_flag(f.name, help));
  }
}

Status check_sglang_flags(const SglangFlags& flags) {
  for (size_t i = 0; i < std::size(kFlags); ++i) {
    const SglangFlag& f = kFlags[i];
    if (flags.options[i]->count() == 0) continue;
    switch (f.kind) {
      case Kind::kNoEffect:
        LOG_INFO("{}: accepted for SGLang compatibility, no effect here ({})", f.name, f.why);
        break;
      case Kind::kNeutralValue:
        if (!is_neutral(f, flags.values[i]))
          return invalid_argument("{} {}: {}; strata accepts {} only", f.name,
                                  fmt::format("{}", fmt::join(flags.values[i], " ")), f.why,
                                  f.neutral);
        break;
      case Kind::kRefused:
        return unimplemented("{} is not implemented yet ({})", f.name, f.why);
    }
  }
  return Status();
}

}  // namespace strata::tools
