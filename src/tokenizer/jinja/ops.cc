// Python object semantics used by the evaluator: attribute and item lookup (a failed lookup is
// undefined, as in Jinja), slicing, iteration, arithmetic, "in", and str/dict/list methods.
#include <cmath>
#include <set>

#include "tokenizer/jinja/eval.h"
#include "tokenizer/jinja/text.h"

namespace strata::jinja {
namespace {

const std::set<std::string, std::less<>> kStrMethods = {
    "startswith", "endswith", "strip",  "lstrip",       "rstrip",      "split",   "rsplit",
    "splitlines", "upper",    "lower",  "title",        "capitalize",  "replace", "find",
    "rfind",      "count",    "join",   "isdigit",      "isalpha",     "isalnum", "isspace",
    "islower",    "isupper",  "format", "removeprefix", "removesuffix"};
const std::set<std::string, std::less<>> kDictMethods = {"get",        "items", "keys",    "values",
                                                         "copy",       "pop",   "popitem", "update",
                                                         "setdefault", "clear", "fromkeys"};
const std::set<std::string, std::less<>> kListMethods = {"index",  "count",   "copy",   "append",
                                                         "extend", "pop",     "insert", "remove",
                                                         "sort",   "reverse", "clear"};

// Python sequence index normalisation; false when out of range.
bool normalize_index(int64_t& i, int64_t n) {
  if (i < 0) i += n;
  return i >= 0 && i < n;
}

StatusOr<int64_t> as_index(const Value& v, std::string_view what) {
  if (v.is_int()) return v.as_int();
  if (v.is_bool()) return int64_t{v.as_bool()};
  return invalid_argument("{} must be an integer, not {}", what, v.type_name());
}

// Python slice semantics: the indices list[start:stop:step] visits, for a sequence of length n.
StatusOr<std::vector<int64_t>> slice_indices(const Value& start_v, const Value& stop_v,
                                             const Value& step_v, int64_t n) {
  int64_t step = 1;
  if (!step_v.is_none()) {
    STRATA_ASSIGN_OR_RETURN(step, as_index(step_v, "slice step"));
  }
  if (step == 0) return invalid_argument("slice step cannot be zero");
  const int64_t lower = step > 0 ? 0 : -1;
  const int64_t upper = step > 0 ? n : n - 1;
  auto bound = [&](const Value& v, int64_t dflt) -> StatusOr<int64_t> {
    if (v.is_none()) return dflt;
    STRATA_ASSIGN_OR_RETURN(int64_t i, as_index(v, "slice index"));
    if (i < 0) i += n;
    return std::clamp(i, lower, upper);
  };
  STRATA_ASSIGN_OR_RETURN(int64_t start, bound(start_v, step > 0 ? lower : upper));
  STRATA_ASSIGN_OR_RETURN(int64_t stop, bound(stop_v, step > 0 ? upper : lower));
  std::vector<int64_t> out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.push_back(i);
  return out;
}

Value bound_method(const Value& obj, std::string_view name) {
  std::string method(name);
  return Value(
      std::make_shared<const Function>(Function{method, [obj, method](Renderer& r, CallArgs& a) {
                                                  return r.call_method(obj, method, a, 0);
                                                }}));
}

StatusOr<std::optional<std::string>> optional_string(const CallArgs& a, size_t i,
                                                     std::string_view name) {
  const Value* v = a.get(i, name);
  if (v == nullptr || v->is_none()) return std::optional<std::string>();
  if (!v->is_string()) return invalid_argument("{} must be a string, not {}", name, v->type_name());
  return std::optional<std::string>(v->str());
}

StatusOr<std::string> required_string(const CallArgs& a, size_t i, std::string_view name) {
  const Value* v = a.get(i, name);
  if (v == nullptr || !v->is_string())
    return invalid_argument("argument '{}' must be a string", name);
  return v->str();
}

int64_t optional_int(const CallArgs& a, size_t i, std::string_view name, int64_t dflt) {
  const Value* v = a.get(i, name);
  return v != nullptr && v->is_int() ? v->as_int() : dflt;
}

StatusOr<Value> affix_test(const std::string& s, const Value* arg, bool prefix) {
  if (arg == nullptr) return invalid_argument("startswith/endswith need an argument");
  List options;
  if (arg->is_string()) {
    options.push_back(*arg);
  } else if (arg->is_list()) {
    options = arg->list();
  } else {
    return invalid_argument("startswith/endswith argument must be str or a tuple of str");
  }
  for (const Value& o : options) {
    if (!o.is_string()) return invalid_argument("startswith/endswith argument must be str");
    const std::string& p = o.str();
    if (p.size() <= s.size() && (prefix ? s.compare(0, p.size(), p) == 0
                                        : s.compare(s.size() - p.size(), p.size(), p) == 0)) {
      return Value(true);
    }
  }
  return Value(false);
}

template <typename Pred>
Value all_chars(const std::string& s, Pred pred) {
  std::vector<uint32_t> cps = utf8_decode(s);
  return Value(!cps.empty() && std::all_of(cps.begin(), cps.end(), pred));
}

// str.format with "{}", "{0}" and "{name}" fields (no format specs).
StatusOr<Value> str_format(const std::string& fmt_str, const CallArgs& a, const Renderer& r) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt_str.size(); ++i) {
    char c = fmt_str[i];
    if ((c == '{' || c == '}') && i + 1 < fmt_str.size() && fmt_str[i + 1] == c) {
      out += c;
      ++i;
      continue;
    }
    if (c != '{') {
      out += c;
      continue;
    }
    size_t close = fmt_str.find('}', i);
    if (close == std::string::npos)
      return invalid_argument("str.format: single '{{' in format string");
    std::string field = fmt_str.substr(i + 1, close - i - 1);
    if (field.find_first_of(":!") != std::string::npos) {
      return unimplemented("str.format: format specs are not supported ('{}')", field);
    }
    const Value* v = nullptr;
    if (field.empty()) {
      v = auto_index < a.args.size() ? &a.args[auto_index] : nullptr;
      ++auto_index;
    } else if (std::all_of(field.begin(), field.end(), ::isdigit)) {
      size_t idx = std::stoul(field);
      v = idx < a.args.size() ? &a.args[idx] : nullptr;
    } else {
      v = a.get(SIZE_MAX, field);
    }
    if (v == nullptr) return invalid_argument("str.format: no argument for field '{{{}}}'", field);
    out += to_output(*v);
    STRATA_RETURN_IF_ERROR(r.check_size(out.size()));
    i = close;
  }
  return Value(std::move(out));
}

StatusOr<Value> string_method(const std::string& s, std::string_view name, CallArgs& a,
                              const Renderer& r) {
  if (name == "startswith" || name == "endswith")
    return affix_test(s, a.get(0, "prefix"), name == "startswith");
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    STRATA_ASSIGN_OR_RETURN(auto chars, optional_string(a, 0, "chars"));
    return Value(py_strip(s, chars, name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    STRATA_ASSIGN_OR_RETURN(auto sep, optional_string(a, 0, "sep"));
    if (sep && sep->empty()) return invalid_argument("str.split: empty separator");
    List parts;
    for (std::string& p : py_split(s, sep, optional_int(a, 1, "maxsplit", -1), name == "rsplit")) {
      parts.emplace_back(std::move(p));
    }
    return Value(std::move(parts));
  }
  if (name == "splitlines") {
    List parts;
    for (std::string& p : py_splitlines(s)) parts.emplace_back(std::move(p));
    return Value(std::move(parts));
  }
  if (name == "upper") return Value(ascii_upper(s));
  if (name == "lower") return Value(ascii_lower(s));
  if (name == "title") return Value(py_title(s));
  if (name == "capitalize") return Value(py_capitalize(s));
  if (name == "replace") {
    STRATA_ASSIGN_OR_RETURN(std::string old, required_string(a, 0, "old"));
    STRATA_ASSIGN_OR_RETURN(std::string rep, required_string(a, 1, "new"));
    int64_t count = optional_int(a, 2, "count", -1);
    STRATA_RETURN_IF_ERROR(r.check_size(py_replace_size(s, old, rep, count)));
    return Value(py_replace(s, old, rep, count));
  }
  if (name == "find" || name == "rfind" || name == "count") {
    STRATA_ASSIGN_OR_RETURN(std::string sub, required_string(a, 0, "sub"));
    if (name == "count") return Value(py_count(s, sub));
    return Value(py_find(s, sub, name == "rfind"));
  }
  if (name == "removeprefix" || name == "removesuffix") {
    STRATA_ASSIGN_OR_RETURN(std::string affix, required_string(a, 0, "affix"));
    bool prefix = name == "removeprefix";
    if (affix.size() <= s.size() &&
        (prefix ? s.compare(0, affix.size(), affix) == 0
                : s.compare(s.size() - affix.size(), affix.size(), affix) == 0)) {
      return Value(prefix ? s.substr(affix.size()) : s.substr(0, s.size() - affix.size()));
    }
    return Value(s);
  }
  if (name == "join") {
    const Value* items = a.get(0, "iterable");
    if (items == nullptr) return invalid_argument("str.join needs an argument");
    STRATA_ASSIGN_OR_RETURN(List parts, iterate(*items));
    std::string out;
    for (size_t i = 0; i < parts.size(); ++i) {
      if (!parts[i].is_string()) {
        return invalid_argument("str.join: item {} is {}, not str", i, parts[i].type_name());
      }
      if (i > 0) out += s;
      out += parts[i].str();
      STRATA_RETURN_IF_ERROR(r.check_size(out.size()));
    }
    return Value(std::move(out));
  }
  if (name == "isdigit") return all_chars(s, [](uint32_t c) { return c >= '0' && c <= '9'; });
  if (name == "isalpha") {
    return all_chars(s, [](uint32_t c) { return (c | 0x20) >= 'a' && (c | 0x20) <= 'z'; });
  }
  if (name == "isalnum") {
    return all_chars(s, [](uint32_t c) {
      return ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') || (c >= '0' && c <= '9');
    });
  }
  if (name == "isspace") return all_chars(s, py_isspace);
  if (name == "islower" || name == "isupper") {
    bool want_upper = name == "isupper";
    bool cased = false;
    for (char c : s) {
      if (c >= 'a' && c <= 'z') {
        if (want_upper) return Value(false);
        cased = true;
      } else if (c >= 'A' && c <= 'Z') {
        if (!want_upper) return Value(false);
        cased = true;
      }
    }
    return Value(cased);
  }
  if (name == "format") return str_format(s, a, r);
  return invalid_argument("str has no method '{}'", name);
}

StatusOr<Value> dict_method(const Value& obj, std::string_view name, CallArgs& a) {
  const Dict& d = obj.dict();
  if (name == "get") {
    const Value* key = a.get(0, "key");
    if (key == nullptr) return invalid_argument("dict.get needs a key");
    const Value* found = key->is_string() ? d.find(key->str()) : nullptr;
    if (found != nullptr) return *found;
    const Value* dflt = a.get(1, "default");
    return dflt != nullptr ? *dflt : Value::none();  // Python's None, not undefined
  }
  if (name == "copy") return obj;
  if (name != "items" && name != "keys" && name != "values") {
    return invalid_argument("dict.{} is not allowed: chat templates cannot modify their inputs",
                            name);
  }
  List out;
  out.reserve(d.items.size());
  for (const auto& [k, v] : d.items) {
    if (name == "items") {
      out.push_back(Value::tuple(List{Value(k), v}));
    } else {
      out.push_back(name == "keys" ? Value(k) : v);
    }
  }
  return Value(std::move(out));
}

StatusOr<Value> list_method(const Value& obj, std::string_view name, CallArgs& a) {
  const List& l = obj.list();
  if (name == "copy") return obj;
  if (name == "index" || name == "count") {
    const Value* x = a.get(0, "value");
    if (x == nullptr) return invalid_argument("list.{} needs an argument", name);
    int64_t n = 0;
    for (size_t i = 0; i < l.size(); ++i) {
      if (!equals(l[i], *x)) continue;
      if (name == "index") return Value(static_cast<int64_t>(i));
      ++n;
    }
    if (name == "index") return invalid_argument("list.index: value is not in list");
    return Value(n);
  }
  return invalid_argument("list.{} is not allowed: chat templates cannot modify their inputs",
                          name);
}

}  // namespace

StatusOr<Value> get_attr(const Value& obj, std::string_view name) {
  // Jinja tries the Python attribute first, then the item: d.items is the method even when d has
  // an "items" key (use d['items'] for the key).
  if (Renderer::has_method(obj, name)) return bound_method(obj, name);
  if (obj.is_dict()) {
    const Value* v = obj.dict().find(name);
    return v != nullptr ? *v : Value();
  }
  if (obj.is_namespace()) {
    const Value* v = obj.ns().attrs.find(name);
    return v != nullptr ? *v : Value();
  }
  return Value();  // including attributes of undefined: lenient, like ChainableUndefined
}

StatusOr<Value> get_item(const Value& obj, const Value& key) {
  if ((obj.is_list() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t i = key.is_int() ? key.as_int() : int64_t{key.as_bool()};
    if (obj.is_list()) {
      if (!normalize_index(i, static_cast<int64_t>(obj.list().size()))) return Value();
      return obj.list()[i];
    }
    std::vector<uint32_t> cps = utf8_decode(obj.str());
    if (!normalize_index(i, static_cast<int64_t>(cps.size()))) return Value();
    std::string ch;
    utf8_append(ch, cps[i]);
    return Value(std::move(ch));
  }
  if (key.is_string()) {
    if (obj.is_dict()) {
      const Value* v = obj.dict().find(key.str());
      if (v != nullptr) return *v;
    }
    return get_attr(obj, key.str());
  }
  return Value();
}

StatusOr<List> iterate(const Value& v) {
  if (v.is_list()) return v.list();
  if (v.is_undefined()) return List();
  List out;
  if (v.is_dict()) {
    for (const auto& [k, item] : v.dict().items) out.emplace_back(k);
    return out;
  }
  if (v.is_string()) {
    for (uint32_t cp : utf8_decode(v.str())) {
      std::string ch;
      utf8_append(ch, cp);
      out.emplace_back(std::move(ch));
    }
    return out;
  }
  return invalid_argument("'{}' object is not iterable", v.type_name());
}

StatusOr<int64_t> length_of(const Value& v) {
  if (v.is_string()) return static_cast<int64_t>(utf8_length(v.str()));
  if (v.is_list()) return static_cast<int64_t>(v.list().size());
  if (v.is_dict()) return static_cast<int64_t>(v.dict().items.size());
  if (v.is_undefined()) return int64_t{0};
  return invalid_argument("object of type '{}' has no len()", v.type_name());
}

StatusOr<bool> contains(const Value& container, const Value& item) {
  if (container.is_string()) {
    if (!item.is_string()) {
      return invalid_argument("'in <string>' requires string as left operand, not {}",
                              item.type_name());
    }
    return container.str().find(item.str()) != std::string::npos;
  }
  if (container.is_list()) {
    for (const Value& v : container.list()) {
      if (equals(v, item)) return true;
    }
    return false;
  }
  if (container.is_dict()) return item.is_string() && container.dict().find(item.str()) != nullptr;
  if (container.is_undefined()) return false;
  return invalid_argument("argument of type '{}' is not iterable", container.type_name());
}

bool Renderer::has_method(const Value& obj, std::string_view name) {
  if (obj.is_string()) return kStrMethods.count(name) > 0;
  if (obj.is_dict()) return kDictMethods.count(name) > 0;
  if (obj.is_list()) return kListMethods.count(name) > 0;
  return false;
}

StatusOr<Value> Renderer::call_method(const Value& obj, std::string_view name, CallArgs& args,
                                      int line) {
  StatusOr<Value> result = Value();
  if (name == "__slice__") {  // obj[start:stop:step], arguments as evaluated (None when absent)
    if (!obj.is_list() && !obj.is_string()) return Value();
    if (obj.is_list()) {
      const List& l = obj.list();
      STRATA_ASSIGN_OR_RETURN(auto idx, slice_indices(args.args[0], args.args[1], args.args[2],
                                                      static_cast<int64_t>(l.size())));
      List out;
      out.reserve(idx.size());
      for (int64_t i : idx) out.push_back(l[i]);
      return Value(std::move(out));
    }
    std::vector<uint32_t> cps = utf8_decode(obj.str());
    STRATA_ASSIGN_OR_RETURN(auto idx, slice_indices(args.args[0], args.args[1], args.args[2],
                                                    static_cast<int64_t>(cps.size())));
    std::string out;
    for (int64_t i : idx) utf8_append(out, cps[i]);
    return Value(std::move(out));
  }
  if (obj.is_string()) {
    result = string_method(obj.str(), name, args, *this);
  } else if (obj.is_dict()) {
    result = dict_method(obj, name, args);
  } else if (obj.is_list()) {
    result = list_method(obj, name, args);
  } else {
    result = invalid_argument("'{}' object has no method '{}'", obj.type_name(), name);
  }
  if (!result.ok()) return result.status().with_context("line {}", line);
  return result;
}

namespace {

StatusOr<Value> int_arith(std::string_view op, int64_t x, int64_t y) {
  int64_t out = 0;
  if (op == "+" && !__builtin_add_overflow(x, y, &out)) return Value(out);
  if (op == "-" && !__builtin_sub_overflow(x, y, &out)) return Value(out);
  if (op == "*" && !__builtin_mul_overflow(x, y, &out)) return Value(out);
  if (op == "/") {
    if (y == 0) return invalid_argument("division by zero");
    return Value(static_cast<double>(x) / static_cast<double>(y));
  }
  if (op == "//" || op == "%") {
    if (y == 0) return invalid_argument("integer division or modulo by zero");
    if (x == INT64_MIN && y == -1) return out_of_range("integer overflow");
    int64_t q = x / y;
    if ((x % y != 0) && ((x < 0) != (y < 0))) --q;  // Python floors
    return op == "//" ? Value(q) : Value(x - q * y);
  }
  if (op == "**") {
    if (y < 0) return Value(std::pow(static_cast<double>(x), static_cast<double>(y)));
    int64_t result = 1;
    int64_t base = x;
    for (int64_t e = y; e > 0; e >>= 1) {
      if ((e & 1) && __builtin_mul_overflow(result, base, &result))
        return out_of_range("integer overflow in '**'");
      if (e > 1 && __builtin_mul_overflow(base, base, &base))
        return out_of_range("integer overflow in '**'");
    }
    return Value(result);
  }
  return out_of_range("integer overflow in '{}'", op);
}

StatusOr<Value> float_arith(std::string_view op, double x, double y) {
  if (op == "+") return Value(x + y);
  if (op == "-") return Value(x - y);
  if (op == "*") return Value(x * y);
  if (op == "**") return Value(std::pow(x, y));
  if (y == 0) return invalid_argument("float division by zero");
  if (op == "/") return Value(x / y);
  double mod = std::fmod(x, y);
  if (mod != 0 && ((mod < 0) != (y < 0))) mod += y;
  if (op == "%") return Value(mod);
  double div = (x - mod) / y;  // Python's float floor division
  double floor_div = std::floor(div);
  if (div - floor_div > 0.5) floor_div += 1;
  return Value(floor_div);
}

}  // namespace

StatusOr<Value> arithmetic(std::string_view op, const Value& a, const Value& b, const Renderer& r) {
  if (a.is_undefined() || b.is_undefined()) {
    return invalid_argument("undefined value used with '{}'", op);
  }
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return float_arith(op, a.as_double(), b.as_double());
    auto as_i = [](const Value& v) { return v.is_bool() ? int64_t{v.as_bool()} : v.as_int(); };
    return int_arith(op, as_i(a), as_i(b));
  }
  if (op == "+" && a.is_string() && b.is_string()) {
    STRATA_RETURN_IF_ERROR(r.check_size(a.str().size() + b.str().size()));
    return Value(a.str() + b.str());
  }
  if (op == "+" && a.is_list() && b.is_list()) {
    size_t n = a.list().size() + b.list().size();
    if (n > static_cast<size_t>(r.limits().max_loop_iterations)) {
      return resource_exhausted("list of {} items exceeds the template's limit", n);
    }
    List out = a.list();
    out.insert(out.end(), b.list().begin(), b.list().end());
    return Value(std::move(out));
  }
  if (op == "*" && (a.is_string() || a.is_list()) && (b.is_int() || b.is_bool())) {
    int64_t n = std::max<int64_t>(0, b.is_int() ? b.as_int() : b.as_bool());
    if (a.is_string()) {
      size_t unit = a.str().size();
      if (unit > 0 && static_cast<uint64_t>(n) > r.limits().max_output_bytes / unit) {
        return resource_exhausted("string repetition exceeds {} bytes",
                                  r.limits().max_output_bytes);
      }
      std::string out;
      out.reserve(unit * n);
      for (int64_t i = 0; i < n; ++i) out += a.str();
      return Value(std::move(out));
    }
    size_t unit = a.list().size();
    if (unit > 0 &&
        static_cast<uint64_t>(n) > static_cast<uint64_t>(r.limits().max_loop_iterations) / unit) {
      return resource_exhausted("list repetition exceeds the template's limit");
    }
    List out;
    for (int64_t i = 0; i < n; ++i) out.insert(out.end(), a.list().begin(), a.list().end());
    return Value(std::move(out));
  }
  if (op == "%" && a.is_string())
    return printf_format(a.str(), b.is_list() ? b.list() : List{b}, r);
  if (op == "*" && (b.is_string() || b.is_list()) && (a.is_int() || a.is_bool())) {
    return arithmetic(op, b, a, r);
  }
  return invalid_argument("unsupported operand type(s) for {}: '{}' and '{}'", op, a.type_name(),
                          b.type_name());
}

}  // namespace strata::jinja
