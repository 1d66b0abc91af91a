// strata generate's hidden-state capture flags (issue 25): --capture-hidden-states eagle3,
// --capture-layers, --capture-drafter-config, --capture-only, --capture-dtype, and the test hook
// --capture-assume-free-bytes.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "arch/model.h"
#include "core/status.h"
#include "pipeline/hidden_store.h"

namespace strata::tools {

struct CaptureFlags {
  std::string preset;          // "eagle3" or empty
  std::string layers;          // "1,15,28" or empty
  std::string drafter_config;  // an EAGLE-3 drafter's directory: its aux layer ids, or empty
  bool capture_only = false;
  std::string dtype = "bf16";
  int64_t assume_free_bytes = -1;  // tests: the free space the disk check sees (-1: statvfs)
  bool enabled() const { return !preset.empty() || !layers.empty() || !drafter_config.empty(); }
};

void add_capture_flags(CLI::App& app, CaptureFlags& f);

// Resolves the flags against the model's config (its layer count, hidden size) into the job's
// CaptureOptions and the engine's CaptureSpec. Errors name the flag. Nothing to do when disabled
// (--capture-only alone is an error).
Status resolve_capture_flags(const CaptureFlags& f, const std::string& model_path, bool has_output,
                             CaptureOptions* job, CaptureSpec* engine);

}  // namespace strata::tools
