#include "model/config.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include "core/json_limits.h"
#include "model/quant.h"

namespace strata {
namespace {

using json = nlohmann::json;

constexpr const char* kSupportedTypes =
    "llama, mistral, qwen2, qwen3, deepseek_v2, deepseek_v3, kimi_k2, kimi_k25";

// Reads typed fields of one JSON object, keeping the first error. Absent and null fields are
// the same thing (HF writes `"q_lora_rank": null` for "not used").
class Reader {
 public:
  Reader(const json& obj, std::string where) : obj_(obj), where_(std::move(where)) {}

  const json* get(const char* key) const {
    auto it = obj_.find(key);
    return it == obj_.end() || it->is_null() ? nullptr : &*it;
  }
  bool has(const char* key) const { return get(key) != nullptr; }

  int64_t req_int(const char* key) {
    if (!has(key)) {
      fail(invalid_argument("{}: required field '{}' is missing", where_, key));
      return 0;
    }
    return int_or(key, 0);
  }
  int64_t int_or(const char* key, int64_t dflt) {
    const json* v = get(key);
    if (v == nullptr) return dflt;
    // Every size, id and count of a real config fits in int32; larger values would wrap when
    // narrowed to the spec's int fields (and casting a float past int64 is undefined).
    auto out_of_range = [&] {
      fail(invalid_argument("{}: field '{}' is out of range, got {}", where_, key, v->dump()));
      return dflt;
    };
    if (v->is_number_unsigned()) {
      return v->get<uint64_t>() > uint64_t(INT32_MAX) ? out_of_range()
                                                      : int64_t(v->get<uint64_t>());
    }
    if (v->is_number_integer()) {
      const int64_t i = v->get<int64_t>();
      return i < INT32_MIN || i > INT32_MAX ? out_of_range() : i;
    }
    // Some writers emit integral floats ("original_max_position_embeddings": 4096.0).
    if (v->is_number_float() && std::floor(v->get<double>()) == v->get<double>()) {
      return std::fabs(v->get<double>()) > double(INT32_MAX) ? out_of_range()
                                                             : int64_t(v->get<double>());
    }
    fail(invalid_argument("{}: field '{}' must be an integer, got {}", where_, key, v->dump()));
    return dflt;
  }
  double num_or(const char* key, double dflt) {
    const json* v = get(key);
    if (v == nullptr) return dflt;
    if (v->is_number()) return v->get<double>();
    fail(invalid_argument("{}: field '{}' must be a number, got {}", where_, key, v->dump()));
    return dflt;
  }
  bool bool_or(const char* key, bool dflt) {
    const json* v = get(key);
    if (v == nullptr) return dflt;
    if (v->is_boolean()) return v->get<bool>();
    fail(invalid_argument("{}: field '{}' must be true or false, got {}", where_, key, v->dump()));
    return dflt;
  }
  std::string str_or(const char* key, const std::string& dflt) {
    const json* v = get(key);
    if (v == nullptr) return dflt;
    if (v->is_string()) return v->get<std::string>();
    fail(invalid_argument("{}: field '{}' must be a string, got {}", where_, key, v->dump()));
    return dflt;
  }
  // A list of ints or a single int (eos_token_id).
  std::vector<int> int_list(const char* key) {
    const json* v = get(key);
    std::vector<int> out;
    if (v == nullptr) return out;
    if (v->is_number_integer()) return {v->get<int>()};
    if (v->is_array()) {
      for (const json& e : *v) {
        if (!e.is_number_integer()) break;
        out.push_back(e.get<int>());
      }
      if (out.size() == v->size()) return out;
    }
    fail(invalid_argument("{}: field '{}' must be an integer or a list of integers, got {}", where_,
                          key, v->dump()));
    return {};
  }

  void fail(Status s) {
    if (status_.ok()) status_ = std::move(s);
  }
  const Status& status() const { return status_; }
  const std::string& where() const { return where_; }

 private:
  const json& obj_;
  std::string where_;
  Status status_;
};

bool is_llama_family(const std::string& t) {
  return t == "llama" || t == "mistral" || t == "qwen2" || t == "qwen3";
}
bool is_deepseek_family(const std::string& t) {
  return t == "deepseek_v2" || t == "deepseek_v3" || t == "kimi_k2";
}

// The scaling object and theta, in either layout: transformers-5 `rope_parameters` (which holds
// rope_theta itself, possibly per layer type) or classic `rope_theta` + `rope_scaling`.
Status parse_rope(const json& cfg, Reader& r, ModelSpec* spec) {
  RopeSpec& rope = spec->rope;
  const json* scaling = nullptr;
  std::string scaling_where;
  if (const json* rp = r.get("rope_parameters")) {
    if (!rp->is_object())
      return invalid_argument("{}: rope_parameters must be an object", r.where());
    if (!rp->contains("rope_type") && !rp->contains("rope_theta") &&
        rp->contains("full_attention")) {
      rp = &(*rp)["full_attention"];
    }
    scaling = rp;
    scaling_where = r.where() + ": rope_parameters";
    rope.theta = r.num_or("rope_theta", 10000.0);  // rope_parameters' own rope_theta wins below
  } else {
    rope.theta = r.num_or("rope_theta", 10000.0);
    scaling = r.get("rope_scaling");
    scaling_where = r.where() + ": rope_scaling";
    if (scaling != nullptr && !scaling->is_object()) {
      return invalid_argument("{} must be an object or null", scaling_where);
    }
  }
  if (scaling == nullptr) return r.status();

  Reader s(*scaling, scaling_where);
  if (s.has("rope_theta")) rope.theta = s.num_or("rope_theta", rope.theta);
  std::string type = s.str_or("rope_type", s.str_or("type", "default"));
  rope.factor = s.num_or("factor", 1.0);
  const int64_t default_orig = spec->max_position_embeddings;
  if (type == "default") {
    rope.type = RopeType::kDefault;
  } else if (type == "linear") {
    rope.type = RopeType::kLinear;
    if (!s.has("factor"))
      s.fail(invalid_argument("{}: required field 'factor' is missing", scaling_where));
  } else if (type == "llama3") {
    rope.type = RopeType::kLlama3;
    if (!s.has("factor"))
      s.fail(invalid_argument("{}: required field 'factor' is missing", scaling_where));
    rope.low_freq_factor = s.num_or("low_freq_factor", 1.0);
    rope.high_freq_factor = s.num_or("high_freq_factor", 4.0);
    if (!s.has("low_freq_factor") || !s.has("high_freq_factor")) {
      s.fail(invalid_argument("{}: llama3 rope needs 'low_freq_factor' and 'high_freq_factor'",
                              scaling_where));
    }
    rope.original_max_position_embeddings = s.req_int("original_max_position_embeddings");
  } else if (type == "yarn") {
    rope.type = RopeType::kYarn;
    if (!s.has("factor"))
      s.fail(invalid_argument("{}: required field 'factor' is missing", scaling_where));
    rope.original_max_position_embeddings =
        s.int_or("original_max_position_embeddings", default_orig);
    rope.beta_fast = s.num_or("beta_fast", 32.0);
    rope.beta_slow = s.num_or("beta_slow", 1.0);
    rope.mscale = s.num_or("mscale", 0.0);
    rope.mscale_all_dim = s.num_or("mscale_all_dim", 0.0);
    if (s.has("attention_factor")) rope.attention_factor = s.num_or("attention_factor", 1.0);
    rope.truncate = s.bool_or("truncate", true);
  } else if (type == "dynamic") {
    rope.type = RopeType::kDynamic;
    rope.original_max_position_embeddings =
        s.int_or("original_max_position_embeddings", default_orig);
  } else {
    return unimplemented(
        "{}: rope type '{}' is not supported (default, linear, llama3, yarn, dynamic)",
        scaling_where, type);
  }
  if (rope.factor <= 0) s.fail(invalid_argument("{}: factor must be positive", scaling_where));
  STRATA_RETURN_IF_ERROR(s.status());
  return r.status();
}

ScoringFunc parse_scoring(Reader& r, ScoringFunc dflt) {
  std::string f = r.str_or("scoring_func", "");
  if (f.empty()) return dflt;
  if (f == "softmax") return ScoringFunc::kSoftmax;
  if (f == "sigmoid") return ScoringFunc::kSigmoid;
  r.fail(unimplemented("{}: scoring_func '{}' is not supported (softmax, sigmoid)", r.where(), f));
  return dflt;
}

TopkMethod parse_topk(Reader& r, TopkMethod dflt) {
  std::string m = r.str_or("topk_method", "");
  if (m.empty()) return dflt;
  if (m == "greedy") return TopkMethod::kGreedy;
  if (m == "group_limited_greedy") return TopkMethod::kGroupLimitedGreedy;
  if (m == "noaux_tc") return TopkMethod::kNoauxTc;
  r.fail(unimplemented(
      "{}: topk_method '{}' is not supported (greedy, group_limited_greedy, noaux_tc)", r.where(),
      m));
  return dflt;
}

void parse_llama_family(Reader& r, ModelSpec* spec) {
  const std::string& t = spec->text_model_type;
  if (r.has("head_dim")) {
    spec->head_dim = int(r.int_or("head_dim", 0));
  } else if (spec->num_heads > 0) {
    if (spec->hidden_size % spec->num_heads != 0) {
      r.fail(invalid_argument(
          "{}: hidden_size {} is not divisible by num_attention_heads {} (and no head_dim)",
          r.where(), spec->hidden_size, spec->num_heads));
    }
    spec->head_dim = spec->hidden_size / spec->num_heads;
  }
  if (t == "qwen2") {
    // Qwen2 always has q/k/v biases and no o_proj bias; its config has no field for it.
    spec->attention_bias = r.bool_or("attention_bias", true);
    spec->attention_out_bias = false;
  } else if (t == "mistral") {
    spec->attention_bias = spec->attention_out_bias = false;
  } else {  // llama, qwen3: one flag for q/k/v/o
    spec->attention_bias = spec->attention_out_bias = r.bool_or("attention_bias", false);
  }
  spec->mlp_bias = t == "llama" ? r.bool_or("mlp_bias", false) : false;
  spec->qk_norm = t == "qwen3";
  if (r.has("sliding_window") && r.bool_or("use_sliding_window", true)) {
    spec->sliding_window = int(r.int_or("sliding_window", 0));
  }
  spec->rope.interleaved = false;
  double partial = r.num_or("partial_rotary_factor", 1.0);
  spec->rope.rotary_dim = int(std::lround(spec->head_dim * partial));
}

void parse_deepseek_family(Reader& r, ModelSpec* spec) {
  const bool v2 = spec->text_model_type == "deepseek_v2";
  MlaSpec& mla = spec->mla;
  mla.q_lora_rank = int(r.int_or("q_lora_rank", 0));
  mla.kv_lora_rank = int(r.req_int("kv_lora_rank"));
  mla.qk_nope_head_dim = int(r.req_int("qk_nope_head_dim"));
  mla.qk_rope_head_dim = int(r.req_int("qk_rope_head_dim"));
  mla.v_head_dim = int(r.req_int("v_head_dim"));
  // HF's `head_dim` in a DeepSeek-V3 config is the rope dim; ours is the full q/k head.
  spec->head_dim = mla.qk_nope_head_dim + mla.qk_rope_head_dim;
  // q_a_proj, kv_a_proj_with_mqa and o_proj carry the bias (q_b/kv_b never do).
  spec->attention_bias = spec->attention_out_bias = r.bool_or("attention_bias", false);
  spec->rope.rotary_dim = mla.qk_rope_head_dim;
  spec->rope.interleaved = r.bool_or("rope_interleave", true);

  MoeSpec& moe = spec->moe;
  moe.n_routed_experts = int(r.int_or("n_routed_experts", 0));
  if (moe.n_routed_experts > 0) {
    moe.num_experts_per_tok = int(r.req_int("num_experts_per_tok"));
    moe.moe_intermediate_size = int(r.req_int("moe_intermediate_size"));
  }
  moe.n_shared_experts = int(r.int_or("n_shared_experts", 0));
  moe.first_k_dense_replace = int(r.int_or("first_k_dense_replace", 0));
  moe.moe_layer_freq = int(r.int_or("moe_layer_freq", 1));
  moe.n_group = int(r.int_or("n_group", 1));
  moe.topk_group = int(r.int_or("topk_group", 1));
  // transformers' defaults: DeepseekV2Config norm_topk_prob=False, routed_scaling_factor=1.0;
  // DeepseekV3Config True and 2.5.
  moe.norm_topk_prob = r.bool_or("norm_topk_prob", !v2);
  moe.routed_scaling_factor = r.num_or("routed_scaling_factor", v2 ? 1.0 : 2.5);
  // DeepSeek-V3 configs from transformers omit these: V3 routing is always sigmoid + noaux_tc.
  moe.scoring_func = parse_scoring(r, v2 ? ScoringFunc::kSoftmax : ScoringFunc::kSigmoid);
  moe.topk_method = parse_topk(r, v2 ? TopkMethod::kGreedy : TopkMethod::kNoauxTc);
  if (moe.n_routed_experts > 0 &&
      (moe.num_experts_per_tok <= 0 || moe.num_experts_per_tok > moe.n_routed_experts ||
       moe.n_group <= 0 || moe.n_routed_experts % moe.n_group != 0 || moe.topk_group <= 0 ||
       moe.topk_group > moe.n_group)) {
    r.fail(invalid_argument(
        "{}: inconsistent MoE routing: n_routed_experts {}, num_experts_per_tok {}, "
        "n_group {}, topk_group {}",
        r.where(), moe.n_routed_experts, moe.num_experts_per_tok, moe.n_group, moe.topk_group));
  }
}

StatusOr<DType> parse_weight_dtype(const std::string& name, const std::string& where) {
  if (name.empty() || name == "bfloat16") return DType::kBF16;
  if (name == "float16") return DType::kF16;
  if (name == "float32") return DType::kF32;
  return invalid_argument("{}: torch_dtype '{}' is not supported (bfloat16, float16, float32)",
                          where, name);
}

// Token ids, dtype and quantization: the text config first, then the wrapper (VL wrappers may
// put quantization_config at the top level, in text_config, or both).
Status parse_ids_dtype_quant(const json& config, const json& text, const std::string& file,
                             const std::string& where, ModelSpec* spec) {
  Reader top(config, file);
  Reader r(text, where);
  spec->eos_token_ids =
      r.has("eos_token_id") ? r.int_list("eos_token_id") : top.int_list("eos_token_id");
  Reader& bos_src = r.has("bos_token_id") ? r : top;
  if (bos_src.has("bos_token_id")) spec->bos_token_id = int(bos_src.int_or("bos_token_id", 0));
  std::string dtype = r.str_or("torch_dtype", r.str_or("dtype", ""));
  if (dtype.empty()) dtype = top.str_or("torch_dtype", top.str_or("dtype", ""));
  STRATA_RETURN_IF_ERROR(r.status());
  STRATA_RETURN_IF_ERROR(top.status());
  STRATA_ASSIGN_OR_RETURN(spec->weight_dtype, parse_weight_dtype(dtype, where));

  const json* qc = top.get("quantization_config");
  std::string qc_where = file;
  if (qc == nullptr && &text != &config) {
    qc = r.get("quantization_config");
    qc_where = where;
  }
  if (qc != nullptr) {
    STRATA_ASSIGN_OR_RETURN(spec->quant, parse_quant_spec(*qc, qc_where));
  }
  return Status();
}

// Upper bounds far above any real checkpoint (the largest have ~130 layers, hidden ~25k, vocab
// ~256k, 384 experts) that keep every tensor size and the planner's byte totals inside int64: a
// hostile config.json is an error, not a billion-entry tensor inventory or an overflow.
Status check_sizes(const ModelSpec& s, const std::string& where) {
  struct Bound {
    const char* field;
    int64_t value, lo, hi;
  };
  const Bound bounds[] = {
      {"vocab_size", s.vocab_size, 1, 1 << 23},
      {"hidden_size", s.hidden_size, 1, 1 << 17},
      {"intermediate_size", s.intermediate_size, 0, 1 << 18},
      {"num_hidden_layers", s.num_layers, 1, 1 << 10},
      {"num_attention_heads", s.num_heads, 1, 1 << 12},
      {"num_key_value_heads", s.num_kv_heads, 1, 1 << 12},
      {"head_dim", s.head_dim, 1, 1 << 12},
      {"max_position_embeddings", s.max_position_embeddings, 1, INT32_MAX},
      {"rotary dims (head_dim x partial_rotary_factor)", s.rope.rotary_dim, 0, s.head_dim},
      {"q_lora_rank", s.mla.q_lora_rank, 0, 1 << 16},
      {"kv_lora_rank", s.mla.kv_lora_rank, 0, 1 << 16},
      {"qk_nope_head_dim", s.mla.qk_nope_head_dim, 0, 1 << 12},
      {"qk_rope_head_dim", s.mla.qk_rope_head_dim, 0, 1 << 12},
      {"v_head_dim", s.mla.v_head_dim, 0, 1 << 12},
      {"n_routed_experts", s.moe.n_routed_experts, 0, 1 << 12},
      {"n_shared_experts", s.moe.n_shared_experts, 0, 1 << 12},
      {"num_experts_per_tok", s.moe.num_experts_per_tok, 0, 1 << 12},
      {"moe_intermediate_size", s.moe.moe_intermediate_size, 0, 1 << 18},
      {"first_k_dense_replace", s.moe.first_k_dense_replace, 0, 1 << 10},
      {"moe_layer_freq", s.moe.moe_layer_freq, 1, 1 << 10},
  };
  for (const Bound& b : bounds) {
    if (b.value < b.lo || b.value > b.hi) {
      return invalid_argument("{}: {} is {}; it must be between {} and {}", where, b.field, b.value,
                              b.lo, b.hi);
    }
  }
  // The tensor inventory lists every routed expert of every layer (Kimi-K2.5: 61 x 384).
  constexpr int64_t kMaxExpertLayers = 1 << 17;
  if (int64_t(s.num_layers) * s.moe.n_routed_experts > kMaxExpertLayers) {
    return invalid_argument(
        "{}: num_hidden_layers {} x n_routed_experts {} is more than {} routed experts", where,
        s.num_layers, s.moe.n_routed_experts, kMaxExpertLayers);
  }
  return Status();
}

StatusOr<ModelSpec> parse_at(const json& config, const std::string& file) {
  if (!config.is_object()) return invalid_argument("{}: top level must be a JSON object", file);
  Reader top(config, file);
  ModelSpec spec;
  spec.model_type = top.str_or("model_type", "");
  STRATA_RETURN_IF_ERROR(top.status());
  if (spec.model_type.empty())
    return invalid_argument("{}: required field 'model_type' is missing", file);

  const json* text = &config;
  std::string where = file;
  spec.text_model_type = spec.model_type;
  if (spec.model_type == "kimi_k25") {
    text = top.get("text_config");
    if (text == nullptr || !text->is_object()) {
      return invalid_argument("{}: required field 'text_config' is missing", file);
    }
    where = file + ": text_config";
    spec.text_model_type = Reader(*text, where).str_or("model_type", "deepseek_v3");
    if (!is_deepseek_family(spec.text_model_type)) {
      return invalid_argument("{}: model_type '{}' inside kimi_k25 is not supported (deepseek_v3)",
                              where, spec.text_model_type);
    }
    spec.weight_prefix = "language_model.model.";
    spec.lm_head_name = "language_model.lm_head.weight";
  } else if (!is_llama_family(spec.model_type) && !is_deepseek_family(spec.model_type)) {
    return invalid_argument("{}: model_type '{}' is not supported (supported: {})", file,
                            spec.model_type, kSupportedTypes);
  }
  spec.arch = is_deepseek_family(spec.text_model_type) ? ArchKind::kDeepseek : ArchKind::kLlama;

  Reader r(*text, where);
  spec.vocab_size = r.req_int("vocab_size");
  spec.hidden_size = int(r.req_int("hidden_size"));
  spec.intermediate_size = int(r.req_int("intermediate_size"));
  spec.num_layers = int(r.req_int("num_hidden_layers"));
  spec.num_heads = int(r.req_int("num_attention_heads"));
  spec.num_kv_heads = int(r.int_or("num_key_value_heads", spec.num_heads));
  spec.rms_norm_eps = r.num_or("rms_norm_eps", 1e-6);
  spec.max_position_embeddings = r.req_int("max_position_embeddings");
  spec.tie_word_embeddings =
      r.bool_or("tie_word_embeddings", top.bool_or("tie_word_embeddings", false));
  STRATA_RETURN_IF_ERROR(r.status());
  if (spec.vocab_size <= 0 || spec.hidden_size <= 0 || spec.num_layers <= 0 ||
      spec.num_heads <= 0 || spec.num_kv_heads <= 0 || spec.num_heads % spec.num_kv_heads != 0) {
    return invalid_argument(
        "{}: bad sizes: vocab_size {}, hidden_size {}, num_hidden_layers {}, "
        "num_attention_heads {}, num_key_value_heads {}",
        where, spec.vocab_size, spec.hidden_size, spec.num_layers, spec.num_heads,
        spec.num_kv_heads);
  }

  if (spec.arch == ArchKind::kLlama) {
    parse_llama_family(r, &spec);
  } else {
    parse_deepseek_family(r, &spec);
  }
  STRATA_RETURN_IF_ERROR(r.status());
  if (spec.head_dim <= 0) return invalid_argument("{}: head_dim must be positive", where);
  STRATA_RETURN_IF_ERROR(parse_rope(*text, r, &spec));
  STRATA_RETURN_IF_ERROR(check_sizes(spec, where));

  STRATA_RETURN_IF_ERROR(parse_ids_dtype_quant(config, *text, file, where, &spec));
  return spec;
}

}  // namespace

StatusOr<ModelSpec> parse_model_spec(const nlohmann::json& config) {
  return parse_at(config, "config.json");
}

StatusOr<ModelSpec> load_model_spec(const std::string& dir) {
  const std::string path = dir + "/config.json";
  std::ifstream in(path);
  if (!in) return not_found("{}: cannot open (is '{}' a model directory?)", path, dir);
  std::stringstream ss;
  ss << in.rdbuf();
  STRATA_RETURN_IF_ERROR(check_json_depth(ss.str(), path));
  json config = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded()) return invalid_argument("{}: not valid JSON", path);
  return parse_at(config, path);
}

}  // namespace strata
