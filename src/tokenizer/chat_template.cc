#include "tokenizer/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/json_limits.h"
#include "tokenizer/builtin_chat_templates.h"
#include "tokenizer/jinja/lexer.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

StatusOr<std::string> read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("cannot open {}", path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

StatusOr<nlohmann::json> read_json(const fs::path& path) {
  STRATA_ASSIGN_OR_RETURN(std::string text, read_file(path));
  STRATA_RETURN_IF_ERROR(check_json_depth(text, path.string()));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return data_loss("{} is not valid JSON", path.string());
  return j;
}

// The template text in tokenizer_config.json / chat_template.json: a string, or a list of named
// templates of which HF uses "default".
StatusOr<std::string> template_field(const nlohmann::json& field, const fs::path& path) {
  if (field.is_string()) return field.get<std::string>();
  if (!field.is_array())
    return invalid_argument("{}: chat_template must be a string or a list", path.string());
  std::string names;
  for (const auto& entry : field) {
    if (!entry.is_object() || !entry.contains("name") || !entry.contains("template") ||
        !entry["name"].is_string() || !entry["template"].is_string()) {
      return invalid_argument("{}: chat_template list entries need string 'name' and 'template'",
                              path.string());
    }
    if (entry["name"] == "default") return entry["template"].get<std::string>();
    names += (names.empty() ? "" : ", ") + entry["name"].get<std::string>();
  }
  return invalid_argument("{}: chat_template lists no 'default' template (has: {})", path.string(),
                          names);
}

// Special tokens as HF passes them to the template: strings, or {"content": ...} objects.
void add_special_tokens(const nlohmann::json& config, jinja::Dict& out) {
  static const char* kNames[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                 "pad_token", "cls_token", "mask_token"};
  auto token_text = [](const nlohmann::json& t) -> std::optional<std::string> {
    if (t.is_string()) return t.get<std::string>();
    if (t.is_object() && t.contains("content") && t["content"].is_string()) {
      return t["content"].get<std::string>();
    }
    return std::nullopt;
  };
  for (const char* name : kNames) {
    if (!config.contains(name)) continue;
    if (auto text = token_text(config[name])) out.set(name, jinja::Value(*text));
  }
  if (config.contains("additional_special_tokens") &&
      config["additional_special_tokens"].is_array()) {
    jinja::List tokens;
    for (const auto& t : config["additional_special_tokens"]) {
      if (auto text = token_text(t)) tokens.emplace_back(*text);
    }
    out.set("additional_special_tokens", jinja::Value(std::move(tokens)));
  }
}

}  // namespace

StatusOr<ChatTemplate> ChatTemplate::from_source(std::string source) {
  if (source.size() > kMaxTemplateBytes) {
    return invalid_argument("chat template is {} bytes, more than the {} allowed", source.size(),
                            kMaxTemplateBytes);
  }
  StatusOr<std::vector<jinja::Token>> tokens = jinja::tokenize(source);
  if (!tokens.ok()) return tokens.status().with_context("chat template");
  StatusOr<jinja::NodeList> body = jinja::parse_template(*tokens);
  if (!body.ok()) return body.status().with_context("chat template");
  ChatTemplate t;
  t.source_ = std::move(source);
  t.body_ = std::make_shared<const jinja::NodeList>(std::move(body).value());
  return t;
}

// tokenizer_config.json of `dir` (an empty object when absent).
static StatusOr<nlohmann::json> tokenizer_config(const fs::path& dir) {
  const fs::path config_path = dir / "tokenizer_config.json";
  std::error_code ec;
  if (!fs::exists(config_path, ec)) return nlohmann::json::object();
  STRATA_ASSIGN_OR_RETURN(nlohmann::json config, read_json(config_path));
  if (!config.is_object()) return data_loss("{} is not a JSON object", config_path.string());
  return config;
}

StatusOr<ChatTemplate> ChatTemplate::from_source_for(std::string source,
                                                     const std::string& tokenizer_dir) {
  STRATA_ASSIGN_OR_RETURN(nlohmann::json config, tokenizer_config(tokenizer_dir));
  STRATA_ASSIGN_OR_RETURN(ChatTemplate t, from_source(std::move(source)));
  add_special_tokens(config, t.defaults_);
  return t;
}

StatusOr<ChatTemplate> ChatTemplate::from_argument(const std::string& arg,
                                                   const std::string& tokenizer_dir) {
  std::error_code ec;
  if (fs::is_regular_file(arg, ec)) {
    STRATA_ASSIGN_OR_RETURN(std::string text, read_file(arg));
    if (fs::path(arg).extension() == ".json") {
      STRATA_ASSIGN_OR_RETURN(nlohmann::json j, read_json(arg));
      if (!j.is_object() || !j.contains("chat_template"))
        return invalid_argument("--chat-template {}: a JSON file needs a \"chat_template\" field",
                                arg);
      STRATA_ASSIGN_OR_RETURN(text, template_field(j["chat_template"], arg));
    }
    StatusOr<ChatTemplate> t = from_source_for(std::move(text), tokenizer_dir);
    if (!t.ok()) return t.status().with_context("--chat-template {}", arg);
    return t;
  }
  if (std::optional<std::string_view> builtin = builtin_chat_template(arg))
    return from_source_for(std::string(*builtin), tokenizer_dir);
  std::string names;
  for (std::string_view n : builtin_chat_template_names())
    names += (names.empty() ? "" : ", ") + std::string(n);
  return not_found("--chat-template '{}' is neither a file nor a built-in template name ({})", arg,
                   names);
}

StatusOr<ChatTemplate> ChatTemplate::load(const std::string& model_dir) {
  const fs::path dir(model_dir);
  const fs::path config_path = dir / "tokenizer_config.json";
  nlohmann::json config = nlohmann::json::object();
  std::error_code ec;
  if (fs::exists(config_path, ec)) {
    STRATA_ASSIGN_OR_RETURN(config, read_json(config_path));
    if (!config.is_object()) return data_loss("{} is not a JSON object", config_path.string());
  }
  std::string source;
  bool found = false;
  if (fs::exists(dir / "chat_template.jinja", ec)) {
    STRATA_ASSIGN_OR_RETURN(source, read_file(dir / "chat_template.jinja"));
    found = true;
  } else if (fs::exists(dir / "chat_template.json", ec)) {
    STRATA_ASSIGN_OR_RETURN(nlohmann::json j, read_json(dir / "chat_template.json"));
    if (j.is_object() && j.contains("chat_template")) {
      STRATA_ASSIGN_OR_RETURN(source,
                              template_field(j["chat_template"], dir / "chat_template.json"));
      found = true;
    }
  }
  if (!found && config.contains("chat_template") && !config["chat_template"].is_null()) {
    STRATA_ASSIGN_OR_RETURN(source, template_field(config["chat_template"], config_path));
    found = true;
  }
  if (!found) {
    return not_found(
        "no chat template in {} (no chat_template.jinja, and tokenizer_config.json has "
        "no chat_template)",
        model_dir);
  }
  StatusOr<ChatTemplate> t = from_source(std::move(source));
  if (!t.ok()) return t.status().with_context("{}", model_dir);
  add_special_tokens(config, t->defaults_);
  return t;
}

template <typename Json>
StatusOr<std::string> ChatTemplate::render_impl(const Json& messages, bool add_generation_prompt,
                                                const Json& extra_context) const {
  if (!body_) return failed_precondition("chat template not loaded");
  if (!messages.is_array()) return invalid_argument("chat template: messages must be a JSON array");
  if (!extra_context.is_null() && !extra_context.is_object()) {
    return invalid_argument("chat template: extra context must be a JSON object");
  }
  jinja::Dict globals = defaults_;
  StatusOr<jinja::Value> msgs = jinja::from_json(messages);
  if (!msgs.ok()) return msgs.status().with_context("chat template messages");
  globals.set("messages", std::move(msgs).value());
  globals.set("tools", jinja::Value::none());
  globals.set("documents", jinja::Value::none());
  globals.set("add_generation_prompt", jinja::Value(add_generation_prompt));
  if (extra_context.is_object()) {
    for (auto it = extra_context.begin(); it != extra_context.end(); ++it) {
      if (it.key() == "messages" || it.key() == "add_generation_prompt") continue;
      StatusOr<jinja::Value> v = jinja::from_json(it.value());
      if (!v.ok()) return v.status().with_context("chat template context '{}'", it.key());
      globals.set(it.key(), std::move(v).value());
    }
  }
  jinja::Renderer renderer(limits_, std::move(globals));
  std::string out;
  Status st = renderer.render(*body_, &out);
  if (!st.ok()) return st.with_context("chat template");
  return out;
}

StatusOr<std::string> ChatTemplate::render(const nlohmann::json& messages,
                                           bool add_generation_prompt,
                                           const nlohmann::json& extra_context) const {
  return render_impl(messages, add_generation_prompt, extra_context);
}

StatusOr<std::string> ChatTemplate::render(const nlohmann::ordered_json& messages,
                                           bool add_generation_prompt,
                                           const nlohmann::ordered_json& extra_context) const {
  return render_impl(messages, add_generation_prompt, extra_context);
}

}  // namespace strata
