#include "capture_flags.h"

#include <set>
#include <sstream>

#include "model/config.h"
#include "model/eagle3_config.h"

namespace strata::tools {

void add_capture_flags(CLI::App& app, CaptureFlags& f) {
  app.add_option("--capture-hidden-states", f.preset,
                 "keep each record's hidden states for drafter training: 'eagle3' (aux layers "
                 "[1, L/2-1, L-4] + the final norm, as SpecForge/SGLang) into DIR/hidden/")
      ->check(CLI::IsMember({"eagle3"}));
  app.add_option(
      "--capture-layers", f.layers,
      "aux layers to capture instead of eagle3's, e.g. 1,15,28 (outputs of those decoder layers)");
  app.add_option("--capture-drafter-config", f.drafter_config,
                 "an EAGLE-3 drafter's directory: capture the layers its config.json names "
                 "(eagle_config.eagle_aux_hidden_state_layer_ids; eagle3's default without)");
  app.add_flag(
      "--capture-only", f.capture_only,
      "teacher-forced capture of conversations that already hold their responses (prefill only)");
  app.add_option("--capture-dtype", f.dtype,
                 "stored dtype of the states: bf16 (the model's) or f32")
      ->check(CLI::IsMember({"bf16", "f32"}))
      ->capture_default_str();
  app.add_option("--capture-assume-free-bytes", f.assume_free_bytes,
                 "tests: the free space the disk check assumes instead of statvfs")
      ->group("");
}

Status resolve_capture_flags(const CaptureFlags& f, const std::string& model_path, bool has_output,
                             CaptureOptions* job, CaptureSpec* engine) {
  if (!f.enabled()) {
    if (f.capture_only)
      return invalid_argument(
          "--capture-only needs --capture-hidden-states, --capture-layers or "
          "--capture-drafter-config");
    return Status();
  }
  if (!has_output)
    return invalid_argument(
        "hidden-state capture writes beside its results: give --output or --output-dir");
  STRATA_ASSIGN_OR_RETURN(ModelSpec spec, load_model_spec(model_path));
  std::vector<int> layers;
  if (!f.drafter_config.empty() && !f.layers.empty())
    return invalid_argument("--capture-drafter-config and --capture-layers both name the layers");
  if (!f.drafter_config.empty()) {
    auto drafter = load_eagle3_spec(f.drafter_config);
    if (!drafter.ok())
      return invalid_argument("--capture-drafter-config: {}", drafter.status().message());
    auto aux = eagle3_aux_layers(*drafter, spec.num_layers);
    if (!aux.ok())
      return invalid_argument("--capture-drafter-config {}: {}", f.drafter_config,
                              aux.status().message());
    layers = *aux;
  } else if (!f.layers.empty()) {
    std::stringstream in(f.layers);
    std::string item;
    std::set<int> seen;
    while (std::getline(in, item, ',')) {
      char* end = nullptr;
      const long v = std::strtol(item.c_str(), &end, 10);
      if (item.empty() || *end != '\0' || v < 0 || v >= spec.num_layers)
        return invalid_argument("--capture-layers: '{}' is not a layer of 0..{}", item,
                                spec.num_layers - 1);
      if (!seen.insert(int(v)).second)
        return invalid_argument("--capture-layers: layer {} is given twice", v);
      layers.push_back(int(v));
    }
  } else {
    if (spec.num_layers < 5)
      return invalid_argument("--capture-hidden-states eagle3 needs at least 5 layers");
    layers = eagle3_default_layers(spec.num_layers);
  }
  job->enabled = true;
  job->capture_only = f.capture_only;
  job->layers = layers;
  job->hidden_size = spec.hidden_size;
  job->dtype = f.dtype == "f32" ? DType::kF32 : DType::kBF16;
  if (f.assume_free_bytes >= 0) {
    const int64_t free = f.assume_free_bytes;
    job->free_bytes = [free](const std::string&) { return free; };
  }
  engine->layers = layers;
  engine->final_norm = true;
  return Status();
}

}  // namespace strata::tools
