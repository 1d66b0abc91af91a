#include "tokenizer/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace strata::jinja {

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Dict::set(std::string key, Value value) {
  for (auto& [k, v] : items) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  items.emplace_back(std::move(key), std::move(value));
}

Value::Value(List l) {
  uint32_t d = 0;
  for (const Value& item : l) d = std::max(d, item.depth());
  depth_ = d + 1;
  v_ = std::make_shared<const List>(std::move(l));
}

Value::Value(Dict dict) {
  uint32_t d = 0;
  for (const auto& item : dict.items) d = std::max(d, item.second.depth());
  depth_ = d + 1;
  v_ = std::make_shared<const Dict>(std::move(dict));
}

uint32_t Value::depth() const {
  if (is_namespace()) return ns().depth;
  return depth_;
}

double Value::as_double() const {
  if (is_int()) return static_cast<double>(as_int());
  if (is_bool()) return as_bool() ? 1.0 : 0.0;
  return std::get<double>(v_);
}

bool Value::truthy() const {
  if (is_undefined() || is_none()) return false;
  if (is_bool()) return as_bool();
  if (is_int()) return as_int() != 0;
  if (is_float()) return as_double() != 0.0;
  if (is_string()) return !str().empty();
  if (is_list()) return !list().empty();
  if (is_dict()) return !dict().items.empty();
  return true;
}

const char* Value::type_name() const {
  if (is_undefined()) return "Undefined";
  if (is_none()) return "NoneType";
  if (is_bool()) return "bool";
  if (is_int()) return "int";
  if (is_float()) return "float";
  if (is_string()) return "str";
  if (is_list()) return "list";
  if (is_dict()) return "dict";
  if (is_namespace()) return "Namespace";
  return "function";
}

namespace {

bool equals_at(const Value& a, const Value& b, int depth) {
  if (depth > static_cast<int>(Value::kMaxDepth)) return false;
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    auto as_i = [](const Value& v) { return v.is_bool() ? int64_t{v.as_bool()} : v.as_int(); };
    return as_i(a) == as_i(b);
  }
  if (a.is_undefined() || b.is_undefined()) return a.is_undefined() && b.is_undefined();
  if (a.is_none() || b.is_none()) return a.is_none() && b.is_none();
  if (a.is_string() && b.is_string()) return a.str() == b.str();
  if (a.is_list() && b.is_list()) {
    const List& x = a.list();
    const List& y = b.list();
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i) {
      if (!equals_at(x[i], y[i], depth + 1)) return false;
    }
    return true;
  }
  if (a.is_dict() && b.is_dict()) {
    const Dict& x = a.dict();
    const Dict& y = b.dict();
    if (x.items.size() != y.items.size()) return false;
    for (const auto& [k, v] : x.items) {
      const Value* other = y.find(k);
      if (other == nullptr || !equals_at(v, *other, depth + 1)) return false;
    }
    return true;
  }
  if (a.is_namespace() && b.is_namespace()) return &a.ns() == &b.ns();
  if (a.is_function() && b.is_function()) return &a.fn() == &b.fn();
  return false;
}

StatusOr<bool> less_at(const Value& a, const Value& b, int depth) {
  if (depth > static_cast<int>(Value::kMaxDepth))
    return invalid_argument("comparison nests too deeply");
  if (a.is_number() && b.is_number()) {
    if (a.is_int() && b.is_int()) return a.as_int() < b.as_int();
    return a.as_double() < b.as_double();
  }
  if (a.is_string() && b.is_string()) return a.str() < b.str();  // UTF-8 bytes order = code points
  if (a.is_list() && b.is_list()) {
    const List& x = a.list();
    const List& y = b.list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (equals_at(x[i], y[i], depth + 1)) continue;
      return less_at(x[i], y[i], depth + 1);
    }
    return x.size() < y.size();
  }
  return invalid_argument("'<' not supported between instances of '{}' and '{}'", a.type_name(),
                          b.type_name());
}

bool py_printable(uint32_t cp) {
  if (cp < 0x20 || cp == 0x7f) return false;
  if (cp >= 0x80 && cp <= 0xa0) return false;
  if (cp == 0xad || cp == 0x1680 || cp == 0x3000 || cp == 0xfeff) return false;
  if (cp >= 0x2000 && cp <= 0x200f) return false;
  if (cp >= 0x2028 && cp <= 0x202f) return false;
  if (cp >= 0x205f && cp <= 0x2064) return false;
  if (cp >= 0xd800 && cp <= 0xf8ff) return false;  // surrogates and private use
  if (cp >= 0xfff9 && cp <= 0xfffb) return false;
  return true;
}

void repr_at(const Value& v, std::string& out, int depth);

void repr_items(const Value& v, std::string& out, int depth) {
  if (depth > static_cast<int>(Value::kMaxDepth)) {
    out += "...";
    return;
  }
  if (v.is_list()) {
    out += v.is_tuple() ? '(' : '[';
    bool first = true;
    for (const Value& item : v.list()) {
      if (!first) out += ", ";
      first = false;
      repr_at(item, out, depth + 1);
    }
    if (v.is_tuple() && v.list().size() == 1) out += ',';
    out += v.is_tuple() ? ')' : ']';
    return;
  }
  const Dict& d = v.is_dict() ? v.dict() : v.ns().attrs;
  out += v.is_dict() ? "{" : "<Namespace {";
  bool first = true;
  for (const auto& [k, item] : d.items) {
    if (!first) out += ", ";
    first = false;
    out += py_repr_string(k);
    out += ": ";
    repr_at(item, out, depth + 1);
  }
  out += v.is_dict() ? "}" : "}>";
}

void scalar_str(const Value& v, std::string& out) {
  if (v.is_none()) {
    out += "None";
  } else if (v.is_bool()) {
    out += v.as_bool() ? "True" : "False";
  } else if (v.is_int()) {
    out += std::to_string(v.as_int());
  } else if (v.is_float()) {
    out += float_repr(v.as_double());
  } else if (v.is_function()) {
    out += "<function " + v.fn().name + ">";
  }
}

void repr_at(const Value& v, std::string& out, int depth) {
  if (v.is_string()) {
    out += py_repr_string(v.str());
  } else if (v.is_undefined()) {
    out += "Undefined";
  } else if (v.is_list() || v.is_dict() || v.is_namespace()) {
    repr_items(v, out, depth);
  } else {
    scalar_str(v, out);
  }
}

void json_string(std::string_view s, bool ensure_ascii, std::string& out) {
  static const char kHex[] = "0123456789abcdef";
  auto u_escape = [&](uint32_t unit) {
    out += "\\u";
    for (int shift = 12; shift >= 0; shift -= 4) out += kHex[(unit >> shift) & 0xf];
  };
  out += '"';
  for (size_t i = 0; i < s.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    switch (c) {
      case '"':
        out += "\\\"";
        continue;
      case '\\':
        out += "\\\\";
        continue;
      case '\n':
        out += "\\n";
        continue;
      case '\r':
        out += "\\r";
        continue;
      case '\t':
        out += "\\t";
        continue;
      case '\b':
        out += "\\b";
        continue;
      case '\f':
        out += "\\f";
        continue;
      default:
        break;
    }
    if (c < 0x20) {
      u_escape(c);
    } else if (c < 0x80 || !ensure_ascii) {
      out += static_cast<char>(c);
    } else {
      // Decode one code point and write it as \uXXXX (a surrogate pair above the BMP).
      size_t len = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
      std::vector<uint32_t> cps = utf8_decode(s.substr(i, len));
      i += len - 1;
      for (uint32_t cp : cps) {
        if (cp >= 0x10000) {
          cp -= 0x10000;
          u_escape(0xd800 + (cp >> 10));
          u_escape(0xdc00 + (cp & 0x3ff));
        } else {
          u_escape(cp);
        }
      }
    }
  }
  out += '"';
}

Status dumps_at(const Value& v, const JsonDumpOptions& o, int level, std::string& out) {
  if (level > static_cast<int>(Value::kMaxDepth))
    return invalid_argument("tojson: value nests too deeply");
  if (v.is_string()) {
    json_string(v.str(), o.ensure_ascii, out);
    return Status();
  }
  if (v.is_none()) {
    out += "null";
    return Status();
  }
  if (v.is_bool()) {
    out += v.as_bool() ? "true" : "false";
    return Status();
  }
  if (v.is_int()) {
    out += std::to_string(v.as_int());
    return Status();
  }
  if (v.is_float()) {
    double d = v.as_double();
    out += std::isnan(d)   ? "NaN"
           : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity")
                           : float_repr(d);
    return Status();
  }
  if (!v.is_list() && !v.is_dict()) {
    return invalid_argument("tojson: Object of type {} is not JSON serializable", v.type_name());
  }
  const std::string item_sep = o.item_sep ? *o.item_sep : (o.indent ? "," : ", ");
  const std::string key_sep = o.key_sep ? *o.key_sep : ": ";
  std::string newline_indent;
  if (o.indent) {
    newline_indent = "\n";
    for (int i = 0; i <= level; ++i) newline_indent += *o.indent;
  }
  auto close_indent = [&] {
    if (!o.indent) return;
    out += '\n';
    for (int i = 0; i < level; ++i) out += *o.indent;
  };
  if (v.is_list()) {
    if (v.list().empty()) {
      out += "[]";
      return Status();
    }
    out += '[';
    out += newline_indent;
    bool first = true;
    for (const Value& item : v.list()) {
      if (!first) out += item_sep + newline_indent;
      first = false;
      STRATA_RETURN_IF_ERROR(dumps_at(item, o, level + 1, out));
    }
    close_indent();
    out += ']';
    return Status();
  }
  const Dict& d = v.dict();
  if (d.items.empty()) {
    out += "{}";
    return Status();
  }
  std::vector<const std::pair<std::string, Value>*> items;
  for (const auto& item : d.items) items.push_back(&item);
  if (o.sort_keys) {
    std::stable_sort(items.begin(), items.end(),
                     [](const auto* a, const auto* b) { return a->first < b->first; });
  }
  out += '{';
  out += newline_indent;
  bool first = true;
  for (const auto* item : items) {
    if (!first) out += item_sep + newline_indent;
    first = false;
    json_string(item->first, o.ensure_ascii, out);
    out += key_sep;
    STRATA_RETURN_IF_ERROR(dumps_at(item->second, o, level + 1, out));
  }
  close_indent();
  out += '}';
  return Status();
}

template <typename Json>
StatusOr<Value> from_json_at(const Json& j, uint32_t depth) {
  if (depth > Value::kMaxDepth)
    return invalid_argument("JSON nests deeper than {}", Value::kMaxDepth);
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return Value::none();
    case nlohmann::json::value_t::boolean:
      return Value(j.template get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Value(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      uint64_t u = j.template get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<double>(u));
      return Value(static_cast<int64_t>(u));
    }
    case nlohmann::json::value_t::number_float:
      return Value(j.template get<double>());
    case nlohmann::json::value_t::string:
      return Value(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      List list;
      list.reserve(j.size());
      for (const auto& item : j) {
        STRATA_ASSIGN_OR_RETURN(Value v, from_json_at(item, depth + 1));
        list.push_back(std::move(v));
      }
      return Value(std::move(list));
    }
    case nlohmann::json::value_t::object: {
      Dict dict;
      dict.items.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) {
        STRATA_ASSIGN_OR_RETURN(Value v, from_json_at(it.value(), depth + 1));
        dict.items.emplace_back(it.key(), std::move(v));
      }
      return Value(std::move(dict));
    }
    default:
      return invalid_argument("unsupported JSON value (binary or discarded)");
  }
}

}  // namespace

bool equals(const Value& a, const Value& b) { return equals_at(a, b, 0); }

StatusOr<bool> less_than(const Value& a, const Value& b) { return less_at(a, b, 0); }

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0.0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest round-trip digits in scientific form, then laid out as Python's repr does: fixed
  // notation when the decimal exponent is in [-4, 16), scientific otherwise.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  size_t e_pos = sci.find('e');
  std::string digits = sci.substr(0, e_pos);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  int exp10 = std::stoi(sci.substr(e_pos + 1));
  int decpt = exp10 + 1;  // digits are 0.d1d2... x 10^decpt
  std::string out = sign;
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0." + std::string(-decpt, '0') + digits;
    } else if (static_cast<size_t>(decpt) >= digits.size()) {
      out += digits + std::string(decpt - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, decpt) + "." + digits.substr(decpt);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char exp_buf[16];
  std::snprintf(exp_buf, sizeof(exp_buf), "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
  return out + exp_buf;
}

std::string py_repr_string(std::string_view s) {
  bool has_single = s.find('\'') != std::string_view::npos;
  bool has_double = s.find('"') != std::string_view::npos;
  char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  for (uint32_t cp : utf8_decode(s)) {
    if (cp == '\\') {
      out += "\\\\";
    } else if (cp == static_cast<uint32_t>(quote)) {
      out += '\\';
      out += quote;
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (!py_printable(cp)) {
      char buf[16];
      if (cp <= 0xff) {
        std::snprintf(buf, sizeof(buf), "\\x%02x", cp);
      } else if (cp <= 0xffff) {
        std::snprintf(buf, sizeof(buf), "\\u%04x", cp);
      } else {
        std::snprintf(buf, sizeof(buf), "\\U%08x", cp);
      }
      out += buf;
    } else {
      utf8_append(out, cp);
    }
  }
  out += quote;
  return out;
}

std::string to_output(const Value& v) {
  if (v.is_string()) return v.str();
  if (v.is_undefined()) return "";
  std::string out;
  repr_at(v, out, 0);
  return out;
}

std::string to_repr(const Value& v) {
  std::string out;
  repr_at(v, out, 0);
  return out;
}

StatusOr<std::string> json_dumps(const Value& v, const JsonDumpOptions& options) {
  std::string out;
  STRATA_RETURN_IF_ERROR(dumps_at(v, options, 0, out));
  return out;
}

StatusOr<Value> from_json(const nlohmann::json& j) { return from_json_at(j, 0); }
StatusOr<Value> from_json(const nlohmann::ordered_json& j) { return from_json_at(j, 0); }

std::vector<uint32_t> utf8_decode(std::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80           ? 1
                 : (c >> 5) == 0x6  ? 2
                 : (c >> 4) == 0xe  ? 3
                 : (c >> 3) == 0x1e ? 4
                                    : 0;
    if (len == 0 || i + len > s.size()) {
      out.push_back(0xfffd);  // invalid byte: Python would never hold it; keep going
      ++i;
      continue;
    }
    uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1f) : len == 3 ? (c & 0x0f) : (c & 0x07);
    for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
    out.push_back(cp);
    i += len;
  }
  return out;
}

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xc0) != 0x80;
  return n;
}

}  // namespace strata::jinja
