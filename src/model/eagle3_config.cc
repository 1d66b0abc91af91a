#include "model/eagle3_config.h"

#include <fstream>
#include <set>
#include <sstream>

#include "core/json_limits.h"
#include "model/config.h"

namespace strata {

using json = nlohmann::json;

bool is_eagle3_config(const json& config) {
  if (!config.is_object()) return false;
  auto it = config.find("architectures");
  if (it == config.end() || !it->is_array()) return false;
  for (const json& a : *it)
    if (a.is_string() && (a.get<std::string>() == "LlamaForCausalLMEagle3" ||
                          a.get<std::string>() == "Eagle3LlamaForCausalLM"))
      return true;
  return false;
}

StatusOr<Eagle3Spec> parse_eagle3_spec(const json& config, const std::string& file) {
  if (!is_eagle3_config(config))
    return invalid_argument(
        "{}: not an EAGLE-3 drafter (architectures must name "
        "LlamaForCausalLMEagle3)",
        file);
  Eagle3Spec s;
  auto layer = parse_model_spec(config);
  if (!layer.ok()) return invalid_argument("{}: {}", file, layer.status().message());
  s.layer = std::move(layer).value();
  if (s.layer.arch != ArchKind::kLlama || s.layer.model_type != "llama")
    return invalid_argument("{}: model_type '{}': an EAGLE-3 drafter here is a llama layer", file,
                            s.layer.model_type);
  if (s.layer.num_layers != 1)
    return invalid_argument(
        "{}: num_hidden_layers is {}; drafters of more than one decoder layer are not supported",
        file, s.layer.num_layers);
  if (s.layer.tie_word_embeddings)
    return invalid_argument(
        "{}: tie_word_embeddings: a drafter whose lm_head is its embedding "
        "table is not supported",
        file);
  if (s.layer.qk_norm || s.layer.attention_bias || s.layer.mlp_bias)
    return invalid_argument("{}: attention or MLP biases are not supported in a drafter", file);

  auto int_field = [&](const char* name, int64_t dflt, int64_t* out) -> Status {
    auto it = config.find(name);
    if (it == config.end() || it->is_null()) {
      *out = dflt;
      return Status();
    }
    if (!it->is_number_integer() || it->get<int64_t>() <= 0)
      return invalid_argument("{}: '{}' must be a positive integer", file, name);
    *out = it->get<int64_t>();
    return Status();
  };
  const auto dv = config.find("draft_vocab_size");
  s.has_d2t = dv != config.end() && !dv->is_null();
  STRATA_RETURN_IF_ERROR(int_field("draft_vocab_size", s.layer.vocab_size, &s.draft_vocab_size));
  if (s.draft_vocab_size > s.layer.vocab_size)
    return invalid_argument("{}: draft_vocab_size {} exceeds vocab_size {}", file,
                            s.draft_vocab_size, s.layer.vocab_size);
  int64_t th = 0;
  STRATA_RETURN_IF_ERROR(int_field("target_hidden_size", s.layer.hidden_size, &th));
  s.target_hidden_size = int(th);
  if (auto b = config.find("bias"); b != config.end() && b->is_boolean())
    s.fc_bias = b->get<bool>();

  if (auto ec = config.find("eagle_config"); ec != config.end() && ec->is_object()) {
    auto ids = ec->find("eagle_aux_hidden_state_layer_ids");
    if (ids != ec->end() && !ids->is_null()) {
      std::set<int> seen;
      if (!ids->is_array() || ids->size() != 3)
        return invalid_argument(
            "{}: eagle_config.eagle_aux_hidden_state_layer_ids must list 3 layer ids", file);
      for (const json& v : *ids) {
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > (1 << 16) ||
            !seen.insert(v.get<int>()).second)
          return invalid_argument(
              "{}: eagle_config.eagle_aux_hidden_state_layer_ids: '{}' is not a distinct layer id",
              file, v.dump());
        s.aux_layer_ids.push_back(v.get<int>());
      }
    }
  }
  return s;
}

StatusOr<Eagle3Spec> load_eagle3_spec(const std::string& dir) {
  const std::string path = dir + "/config.json";
  std::ifstream in(path);
  if (!in) return not_found("{}: cannot open (is '{}' a drafter directory?)", path, dir);
  std::stringstream ss;
  ss << in.rdbuf();
  STRATA_RETURN_IF_ERROR(check_json_depth(ss.str(), path));
  json config = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded()) return invalid_argument("{}: not valid JSON", path);
  return parse_eagle3_spec(config, path);
}

StatusOr<std::vector<int>> eagle3_aux_layers(const Eagle3Spec& spec, int target_layers) {
  // SGLang's default (set_eagle3_layers_to_capture without ids; pipeline/hidden_store.cc explains
  // the off-by-one between its "before layer" and these "output of layer" ids).
  std::vector<int> layers = spec.aux_layer_ids;
  if (layers.empty()) {
    if (target_layers < 5)
      return invalid_argument("the default EAGLE-3 aux layers need a target of at least 5 layers");
    layers = {1, target_layers / 2 - 1, target_layers - 4};
  }
  for (int l : layers)
    if (l >= target_layers)
      return invalid_argument("EAGLE-3 aux layer {} is outside the target's {} layers", l,
                              target_layers);
  return layers;
}

}  // namespace strata
