#include "pipeline/dataset.h"

#include <cctype>
#include <filesystem>
#include <fstream>
#include <unordered_set>

#include "core/json_limits.h"
#include "tokenizer/tool_call_parser.h"

namespace strata {
namespace {

StatusOr<nlohmann::json> normalize_turns(const nlohmann::json& turns, const std::string& where) {
  if (!turns.is_array()) return invalid_argument("{}: conversation must be an array", where);
  if (turns.empty()) return invalid_argument("{}: conversation is empty", where);
  nlohmann::json out = nlohmann::json::array();
  for (size_t i = 0; i < turns.size(); ++i) {
    const auto& t = turns[i];
    if (!t.is_object()) return invalid_argument("{}: turn {} is not an object", where, i);
    std::string role, content;
    if (t.contains("role")) {
      if (!t["role"].is_string())
        return invalid_argument("{}: turn {} role is not a string", where, i);
      role = t["role"].get<std::string>();
    } else if (t.contains("from") && t["from"].is_string()) {
      const std::string from = t["from"].get<std::string>();
      role = from == "human" ? "user" : from == "gpt" ? "assistant" : from;
    } else {
      return invalid_argument("{}: turn {} has no \"role\"", where, i);
    }
    const char* key = t.contains("content") ? "content" : "value";
    auto calls = t.find("tool_calls");
    const bool has_calls = calls != t.end() && !calls->is_null();
    // An assistant turn that only calls tools has no content (OpenAI writes null).
    if (has_calls && (!t.contains(key) || t[key].is_null())) {
      content = "";
    } else if (!t.contains(key) || !t[key].is_string()) {
      return invalid_argument("{}: turn {} has no string \"content\"", where, i);
    } else {
      content = t[key].get<std::string>();
    }
    nlohmann::json turn = {{"role", role}, {"content", content}};
    if (has_calls) {
      if (!calls->is_array())
        return invalid_argument("{}: turn {} \"tool_calls\" is not an array", where, i);
      for (const auto& c : *calls)
        if (!c.is_object() || !c.contains("function") || !c["function"].is_object() ||
            !c["function"].value("name", nlohmann::json()).is_string())
          return invalid_argument(
              "{}: turn {} \"tool_calls\" needs {{\"function\": {{\"name\", \"arguments\"}}}} "
              "objects",
              where, i);
      turn["tool_calls"] = *calls;
    }
    if (auto id = t.find("tool_call_id"); id != t.end() && !id->is_null()) {
      if (!id->is_string())
        return invalid_argument("{}: turn {} \"tool_call_id\" is not a string", where, i);
      turn["tool_call_id"] = *id;
    }
    out.push_back(std::move(turn));
  }
  return out;
}

}  // namespace

StatusOr<PromptRecord> parse_prompt_line(const std::string& text, int64_t line_number,
                                         const std::string& dataset) {
  const std::string where = dataset + " line " + std::to_string(line_number);
  PromptRecord r;
  r.line = line_number;
  // The runner copies and dumps the line's JSON, which recurses once per nesting level.
  STRATA_RETURN_IF_ERROR(check_json_depth(text, where));
  try {
    r.original = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range for 1e999
    return invalid_argument("{}: malformed JSON ({})", where, e.what());
  }
  if (!r.original.is_object()) return invalid_argument("{}: expected a JSON object", where);
  const auto& o = r.original;
  if (o.contains("id")) {
    if (o["id"].is_string())
      r.id = o["id"].get<std::string>();
    else if (o["id"].is_number_integer())
      r.id = std::to_string(o["id"].get<int64_t>());
    else
      return invalid_argument("{}: \"id\" must be a string or an integer", where);
  } else {
    r.id = dataset + "-" + std::to_string(line_number);
  }
  if (auto tools = o.find("tools"); tools != o.end() && !tools->is_null()) {
    if (!tools->is_array()) return invalid_argument("{}: \"tools\" must be an array", where);
    for (const auto& t : *tools)
      if (!t.is_object() || !t.contains("function") || !t["function"].is_object() ||
          !t["function"].value("name", nlohmann::json()).is_string())
        return invalid_argument(
            "{}: \"tools\" must hold {{\"type\": \"function\", \"function\": {{\"name\", "
            "...}}}} objects",
            where);
    // Parsed again keeping its key order (the line parsed above sorts keys).
    if (!tools->empty()) r.tools = nlohmann::ordered_json::parse(text).at("tools");
  }
  if (o.contains("conversations") || o.contains("messages")) {
    const auto& turns = o.contains("conversations") ? o["conversations"] : o["messages"];
    STRATA_ASSIGN_OR_RETURN(r.messages, normalize_turns(turns, where));
  } else if (o.contains("prompt")) {
    if (!o["prompt"].is_string()) return invalid_argument("{}: \"prompt\" must be a string", where);
    r.prompt = o["prompt"].get<std::string>();
  } else {
    return invalid_argument("{}: needs \"conversations\", \"messages\" or \"prompt\"", where);
  }
  return r;
}

StatusOr<std::vector<PromptRecord>> read_prompt_file(const std::string& path,
                                                     const std::string& dataset) {
  std::ifstream in(path);
  if (!in) return not_found("cannot open input file '{}'", path);
  std::vector<PromptRecord> out;
  std::unordered_set<std::string> ids;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    // Ids default to "<dataset>-<line>"; errors name the file too.
    auto parsed = parse_prompt_line(line, n, dataset);
    if (!parsed.ok()) return parsed.status().with_context("{}", path);
    PromptRecord r = std::move(parsed).value();
    if (!ids.insert(r.id).second)
      return invalid_argument("{} line {}: duplicate id '{}'", path, n, r.id);
    out.push_back(std::move(r));
  }
  return out;
}

nlohmann::ordered_json template_messages(const nlohmann::json& messages) {
  nlohmann::ordered_json out = messages;
  for (auto& m : out) {
    if (!m.contains("tool_calls")) continue;
    for (auto& c : m["tool_calls"]) {
      auto& fn = c["function"];
      if (auto a = fn.find("arguments"); a != fn.end() && a->is_string())
        *a = template_arguments(a->get<std::string>());
    }
  }
  return out;
}

nlohmann::ordered_json template_context(const PromptRecord& record, const nlohmann::json& kwargs) {
  nlohmann::ordered_json ctx =
      kwargs.is_object() ? nlohmann::ordered_json(kwargs) : nlohmann::ordered_json::object();
  if (!record.tools.is_null()) ctx["tools"] = record.tools;
  return ctx;
}

int count_tool_calls(const nlohmann::json& messages) {
  int n = 0;
  if (messages.is_array())
    for (const auto& m : messages)
      if (auto c = m.find("tool_calls"); c != m.end() && c->is_array()) n += int(c->size());
  return n;
}

nlohmann::json prompt_messages(const nlohmann::json& messages) {
  nlohmann::json m = messages;
  while (!m.empty() && m.back().value("role", "") == "assistant") m.erase(m.size() - 1);
  return m;
}

StatusOr<Dataset> parse_dataset_spec(const std::string& spec) {
  Dataset d;
  const size_t eq = spec.find('=');
  d.path = eq == std::string::npos ? spec : spec.substr(eq + 1);
  d.name =
      eq == std::string::npos ? std::filesystem::path(spec).stem().string() : spec.substr(0, eq);
  if (d.path.empty()) return invalid_argument("--input '{}': no file given", spec);
  if (d.name.empty()) return invalid_argument("--input '{}': empty dataset name", spec);
  for (char c : d.name) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-'))
      return invalid_argument(
          "--input '{}': dataset name '{}' may use only letters, digits, '.', '_', '-'", spec,
          d.name);
  }
  return d;
}

Status load_dataset(Dataset& dataset) {
  STRATA_ASSIGN_OR_RETURN(dataset.records, read_prompt_file(dataset.path, dataset.name));
  return Status();
}

uint64_t prompt_seed(uint64_t base_seed, const std::string& id) {
  // FNV-1a over the id, then a splitmix64 finalizer mixed with the base seed: stable across
  // platforms and releases (results must not change when a job resumes on another build).
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : id) h = (h ^ c) * 0x100000001b3ull;
  uint64_t z = h ^ (base_seed + 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return (z ^ (z >> 31)) & 0x7fffffffffffffffull;  // fits a JSON/OpenAI int64 seed
}

}  // namespace strata
