#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/json_limits.h"
#include "tokenizer/added_vocab.h"
#include "tokenizer/bpe.h"
#include "tokenizer/decoder.h"
#include "tokenizer/json_util.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tiktoken_model.h"
#include "tokenizer/utf8.h"

namespace strata {

using tok::Json;

namespace {

StatusOr<std::string> read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("cannot open {}", path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return data_loss("error reading {}", path.string());
  return ss.str();
}

StatusOr<Json> parse_json(std::string_view text, std::string_view source) {
  STRATA_RETURN_IF_ERROR(check_json_depth(text, source));
  try {
    return Json::parse(text);
  } catch (const Json::exception& e) {
    return invalid_argument("{}: malformed JSON: {}", source, e.what());
  }
}

StatusOr<std::vector<tok::AddedToken>> parse_added_tokens(const Json& j) {
  std::vector<tok::AddedToken> out;
  if (j.is_null()) return out;
  if (!j.is_array()) return invalid_argument("added_tokens must be an array");
  for (size_t i = 0; i < j.size(); ++i) {
    const std::string where = fmt::format("added_tokens[{}]", i);
    const Json& t = j[i];
    if (!t.is_object()) return invalid_argument("{} must be an object", where);
    tok::AddedToken a;
    STRATA_ASSIGN_OR_RETURN(a.content, tok::json_string(t, "content", where));
    STRATA_ASSIGN_OR_RETURN(int64_t id, tok::json_int_or(t, "id", -1, where));
    if (id < 0 || id > INT32_MAX) return invalid_argument("{}.id must be a non-negative id", where);
    a.id = int32_t(id);
    STRATA_ASSIGN_OR_RETURN(a.special, tok::json_bool_or(t, "special", false, where));
    STRATA_ASSIGN_OR_RETURN(a.lstrip, tok::json_bool_or(t, "lstrip", false, where));
    STRATA_ASSIGN_OR_RETURN(a.rstrip, tok::json_bool_or(t, "rstrip", false, where));
    STRATA_ASSIGN_OR_RETURN(a.single_word, tok::json_bool_or(t, "single_word", false, where));
    STRATA_ASSIGN_OR_RETURN(a.normalized, tok::json_bool_or(t, "normalized", !a.special, where));
    out.push_back(std::move(a));
  }
  return out;
}

// The single-sequence template of a post-processor as (prefix ids, suffix ids).
Status parse_post_processor(const Json& j, std::string_view where, std::vector<int32_t>* prefix,
                            std::vector<int32_t>* suffix) {
  if (j.is_null()) return Status();
  if (!j.is_object()) return invalid_argument("{} must be an object or null", where);
  STRATA_ASSIGN_OR_RETURN(std::string type, tok::json_string(j, "type", where));
  if (type == "ByteLevel") return Status();
  if (type == "Sequence") {
    auto it = j.find("processors");
    if (it == j.end() || !it->is_array()) {
      return invalid_argument("{}.processors must be an array", where);
    }
    for (size_t i = 0; i < it->size(); ++i) {
      STRATA_RETURN_IF_ERROR(parse_post_processor(
          (*it)[i], fmt::format("{}.processors[{}]", where, i), prefix, suffix));
    }
    return Status();
  }
  if (type == "TemplateProcessing") {
    const Json& single = j.value("single", Json());
    const Json& specials = j.value("special_tokens", Json::object());
    if (!single.is_array()) return invalid_argument("{}.single must be an array", where);
    bool seen_sequence = false;
    for (const Json& piece : single) {
      if (piece.contains("Sequence")) {
        seen_sequence = true;
        continue;
      }
      const Json& st = piece.value("SpecialToken", Json());
      if (!st.is_object() || !st.contains("id") || !st["id"].is_string()) {
        return invalid_argument("{}.single: unexpected piece {}", where, piece.dump());
      }
      const std::string name = st["id"].get<std::string>();
      auto sp = specials.find(name);
      if (sp == specials.end() || !sp->contains("ids") || !(*sp)["ids"].is_array()) {
        return invalid_argument("{}.special_tokens has no ids for '{}'", where, name);
      }
      for (const Json& id : (*sp)["ids"]) {
        if (!id.is_number_integer()) return invalid_argument("{}: bad id for '{}'", where, name);
        (seen_sequence ? suffix : prefix)->push_back(id.get<int32_t>());
      }
    }
    return Status();
  }
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    const Json& cls = j.value("cls", Json());
    const Json& sep = j.value("sep", Json());
    if (!cls.is_array() || cls.size() != 2 || !sep.is_array() || sep.size() != 2) {
      return invalid_argument("{}: cls/sep must be [token, id]", where);
    }
    prefix->push_back(cls[1].get<int32_t>());
    suffix->push_back(sep[1].get<int32_t>());
    return Status();
  }
  return unimplemented("{}: post-processor type '{}' is not supported", where, type);
}

// tokenizer_config.json stores special tokens as a string or as {"content": ...}.
std::optional<std::string> config_token(const Json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return std::nullopt;
}

}  // namespace

Tokenizer::Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

StatusOr<Tokenizer> Tokenizer::load(const std::string& model_dir) {
  const std::filesystem::path dir(model_dir);
  const auto tokenizer_path = dir / "tokenizer.json";
  std::string text;
  if (has_tiktoken_model(model_dir)) {  // Kimi K2 / K2.5, Moonlight (tokenizer/tiktoken_model.h)
    STRATA_ASSIGN_OR_RETURN(text, tiktoken_tokenizer_json(model_dir));
  } else if (!std::filesystem::exists(tokenizer_path)) {
    return not_found(
        "{} not found (a Hugging Face tokenizer.json is required, or a Kimi tiktoken.model)",
        tokenizer_path.string());
  } else {
    STRATA_ASSIGN_OR_RETURN(text, read_file(tokenizer_path));
  }
  std::string config_text;
  const auto config_path = dir / "tokenizer_config.json";
  if (std::filesystem::exists(config_path)) {
    STRATA_ASSIGN_OR_RETURN(config_text, read_file(config_path));
  }
  auto tokenizer = from_json_text(text, {}, tokenizer_path.string());
  if (!tokenizer.ok()) return tokenizer.status();
  if (!config_text.empty()) {
    STRATA_RETURN_IF_ERROR(tokenizer->parse_config(config_text, config_path.string()));
  }
  return tokenizer;
}

StatusOr<Tokenizer> Tokenizer::from_json_text(std::string_view tokenizer_json,
                                              std::string_view config_json,
                                              std::string_view source) {
  STRATA_ASSIGN_OR_RETURN(Json j, parse_json(tokenizer_json, source));
  if (!j.is_object()) return invalid_argument("{}: top level must be a JSON object", source);
  Tokenizer t;
  Status st = [&]() -> Status {
    try {
      const Json& model = j.value("model", Json());
      if (!model.is_object()) return invalid_argument("model must be an object");
      const std::string type = model.value("type", std::string("BPE"));
      if (type != "BPE") {
        return unimplemented("model type '{}' is not supported (only BPE)", type);
      }
      STRATA_ASSIGN_OR_RETURN(t.model_, tok::BpeModel::from_json(model, "model"));
      STRATA_ASSIGN_OR_RETURN(t.normalizer_,
                              tok::make_normalizer(j.value("normalizer", Json()), "normalizer"));
      STRATA_ASSIGN_OR_RETURN(
          t.pre_tokenizer_,
          tok::make_pre_tokenizer(j.value("pre_tokenizer", Json()), "pre_tokenizer"));
      STRATA_ASSIGN_OR_RETURN(t.decoder_, tok::make_decoder(j.value("decoder", Json()), "decoder"));
      STRATA_RETURN_IF_ERROR(parse_post_processor(j.value("post_processor", Json()),
                                                  "post_processor", &t.template_prefix_,
                                                  &t.template_suffix_));
      STRATA_ASSIGN_OR_RETURN(auto added, parse_added_tokens(j.value("added_tokens", Json())));
      t.added_ = std::make_unique<tok::AddedVocab>();
      t.added_->build(std::move(added), t.normalizer_.get());
      return Status();
    } catch (const Json::exception& e) {
      return invalid_argument("unexpected field type: {}", e.what());
    }
  }();
  if (!st.ok()) return st.with_context("{}", source);

  int64_t size = t.model_->id_limit();
  for (const auto& a : t.added_->tokens()) size = std::max<int64_t>(size, int64_t(a.id) + 1);
  t.added_slot_.assign(size_t(size), -1);
  for (size_t i = 0; i < t.added_->tokens().size(); ++i) {
    t.added_slot_[size_t(t.added_->tokens()[i].id)] = int32_t(i);
  }
  for (int32_t id : t.template_prefix_) {
    if (id < 0 || id >= size)
      return invalid_argument("{}: post_processor id {} out of range", source, id);
  }
  for (int32_t id : t.template_suffix_) {
    if (id < 0 || id >= size)
      return invalid_argument("{}: post_processor id {} out of range", source, id);
  }
  if (!config_json.empty())
    STRATA_RETURN_IF_ERROR(t.parse_config(config_json, "tokenizer_config.json"));
  return t;
}

Status Tokenizer::parse_config(std::string_view config_json, std::string_view source) {
  STRATA_ASSIGN_OR_RETURN(Json config, parse_json(config_json, source));
  if (!config.is_object()) return invalid_argument("{}: top level must be a JSON object", source);
  auto resolve = [&](const char* key, std::optional<std::string>* name,
                     std::optional<int32_t>* id) -> Status {
    *name = config_token(config, key);
    if (!*name) return Status();
    *id = token_to_id(**name);
    if (!*id) return invalid_argument("{}: {} '{}' is not in the vocabulary", source, key, **name);
    return Status();
  };
  STRATA_RETURN_IF_ERROR(resolve("bos_token", &special_.bos_token, &special_.bos_id));
  STRATA_RETURN_IF_ERROR(resolve("eos_token", &special_.eos_token, &special_.eos_id));
  STRATA_RETURN_IF_ERROR(resolve("pad_token", &special_.pad_token, &special_.pad_id));
  STRATA_RETURN_IF_ERROR(resolve("unk_token", &special_.unk_token, &special_.unk_id));
  return Status();
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool allow_special) const {
  std::string sanitized;
  if (!tok::is_valid_utf8(text)) {
    sanitized = tok::to_valid_utf8(text);
    text = sanitized;
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  std::vector<tok::TextSpan> spans, inner;
  added_->split(text, /*normalized_set=*/false, allow_special, &spans);
  std::string piece;
  for (const tok::TextSpan& span : spans) {
    if (span.id >= 0) {
      ids.push_back(span.id);
      continue;
    }
    piece.assign(text.substr(span.begin, span.end - span.begin));
    if (normalizer_) normalizer_->normalize(&piece);
    const bool at_start = span.begin == 0;
    if (!added_->has_normalized_tokens()) {
      encode_plain(piece, at_start, &ids);
      continue;
    }
    inner.clear();
    added_->split(piece, /*normalized_set=*/true, allow_special, &inner);
    for (const tok::TextSpan& s : inner) {
      if (s.id >= 0) {
        ids.push_back(s.id);
      } else {
        encode_plain(std::string_view(piece).substr(s.begin, s.end - s.begin),
                     at_start && s.begin == 0, &ids);
      }
    }
  }
  return ids;
}

void Tokenizer::encode_plain(std::string_view text, bool at_start,
                             std::vector<int32_t>* ids) const {
  if (text.empty()) return;
  if (!pre_tokenizer_) {
    model_->tokenize(text, ids);
    return;
  }
  std::vector<tok::Word> words{tok::Word{std::string(text), at_start}};
  pre_tokenizer_->pre_tokenize(&words);
  for (const tok::Word& w : words) model_->tokenize(w.text, ids);
}

std::vector<int32_t> Tokenizer::with_special_tokens(std::span<const int32_t> ids) const {
  std::vector<int32_t> out(template_prefix_);
  out.insert(out.end(), ids.begin(), ids.end());
  out.insert(out.end(), template_suffix_.begin(), template_suffix_.end());
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  return decode(ids, skip_special, {});
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special,
                              std::span<const int32_t> keep_special) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) continue;
    const int32_t slot = added_slot_[size_t(id)];
    if (slot >= 0) {
      const tok::AddedToken& a = added_->tokens()[size_t(slot)];
      const bool skipped =
          skip_special && a.special &&
          std::find(keep_special.begin(), keep_special.end(), id) == keep_special.end();
      if (!skipped) tokens.push_back(a.content);
      continue;
    }
    const std::string& t = model_->id_to_token(id);
    if (!t.empty()) tokens.push_back(t);
  }
  std::string out;
  if (decoder_) {
    decoder_->decode_chain(&tokens);
    for (const auto& t : tokens) out += t;
  } else {  // Hugging Face joins with spaces when there is no decoder
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0) out.push_back(' ');
      out += tokens[i];
    }
  }
  return tok::is_valid_utf8(out) ? out : tok::to_valid_utf8(out);
}

int64_t Tokenizer::vocab_size() const { return int64_t(added_slot_.size()); }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto id = added_->id_of(token)) return id;
  return model_->token_to_id(token);
}

bool Tokenizer::is_byte_fallback_piece(int32_t id) const {
  if (!decoder_ || !decoder_->joins_byte_runs() || id < 0 || id >= vocab_size()) return false;
  if (added_slot_[size_t(id)] >= 0) return false;  // added tokens decode as their content
  const std::string& t = model_->id_to_token(id);
  return t.size() == 6 && t.starts_with("<0x") && t.back() == '>';
}

std::string Tokenizer::id_to_token(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  const int32_t slot = added_slot_[size_t(id)];
  if (slot >= 0) return added_->tokens()[size_t(slot)].content;
  return model_->id_to_token(id);
}

bool Tokenizer::is_special(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return false;
  const int32_t slot = added_slot_[size_t(id)];
  return slot >= 0 && added_->tokens()[size_t(slot)].special;
}

std::vector<int32_t> Tokenizer::special_ids() const {
  std::vector<int32_t> out;
  for (const auto& a : added_->tokens()) {
    if (a.special) out.push_back(a.id);
  }
  return out;
}

}  // namespace strata
