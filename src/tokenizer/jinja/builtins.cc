// Jinja's filters, tests and global functions as chat templates use them, plus Hugging Face's
// additions (tojson with json.dumps arguments, raise_exception, strftime_now).
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <unordered_map>

#include "tokenizer/jinja/eval.h"
#include "tokenizer/jinja/text.h"

namespace strata::jinja {
namespace {

using FilterFn = StatusOr<Value> (*)(Renderer&, const Value&, CallArgs&);
using TestFn = StatusOr<bool> (*)(Renderer&, const Value&, CallArgs&);

bool arg_bool(const CallArgs& a, size_t i, std::string_view name, bool dflt) {
  const Value* v = a.get(i, name);
  return v != nullptr ? v->truthy() : dflt;
}

// Jinja's attribute getter for filters: "a.b.0" looks up items (then attributes) step by step.
StatusOr<Value> attr_path(const Value& item, const std::string& path) {
  Value cur = item;
  for (const std::string& part : py_split(path, std::string("."), -1, false)) {
    bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    Value key = numeric ? Value(static_cast<int64_t>(std::stoll(part))) : Value(part);
    STRATA_ASSIGN_OR_RETURN(cur, get_item(cur, key));
  }
  return cur;
}

// Sort/unique key: the attribute if asked for, lowercased when comparing case-insensitively.
StatusOr<Value> sort_key(const Value& item, const Value* attribute, bool case_sensitive) {
  Value key = item;
  if (attribute != nullptr && !attribute->is_none()) {
    STRATA_ASSIGN_OR_RETURN(key, attr_path(item, to_output(*attribute)));
  }
  if (!case_sensitive && key.is_string()) return Value(ascii_lower(key.str()));
  return key;
}

StatusOr<List> sorted(const List& items, const Value* attribute, bool case_sensitive,
                      bool reverse) {
  std::vector<std::pair<Value, Value>> keyed;
  for (const Value& item : items) {
    STRATA_ASSIGN_OR_RETURN(Value k, sort_key(item, attribute, case_sensitive));
    keyed.emplace_back(std::move(k), item);
  }
  Status err;
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    StatusOr<bool> lt = reverse ? less_than(y.first, x.first) : less_than(x.first, y.first);
    if (!lt.ok()) {
      err = lt.status();
      return false;
    }
    return *lt;
  });
  STRATA_RETURN_IF_ERROR(err);
  List out;
  for (auto& [k, v] : keyed) out.push_back(std::move(v));
  return out;
}

// select/reject/selectattr/rejectattr: args[0] (after the attribute for *attr) names the test.
StatusOr<Value> select_common(Renderer& r, const Value& seq, CallArgs& a, bool by_attr, bool keep) {
  STRATA_ASSIGN_OR_RETURN(List items, iterate(seq));
  size_t next = 0;
  std::string attribute;
  if (by_attr) {
    if (a.args.empty() || !a.args[0].is_string())
      return invalid_argument("selectattr needs an attribute name");
    attribute = a.args[0].str();
    next = 1;
  }
  std::string test;
  if (next < a.args.size()) {
    if (!a.args[next].is_string())
      return invalid_argument("select: the test name must be a string");
    test = a.args[next].str();
    ++next;
  }
  CallArgs test_args;
  test_args.args.assign(a.args.begin() + std::min(next, a.args.size()), a.args.end());
  test_args.kwargs = a.kwargs;
  List out;
  for (const Value& item : items) {
    STRATA_RETURN_IF_ERROR(r.charge_iterations(1));
    Value subject = item;
    if (by_attr) {
      STRATA_ASSIGN_OR_RETURN(subject, attr_path(item, attribute));
    }
    bool pass = subject.truthy();
    if (!test.empty()) {
      CallArgs copy = test_args;
      STRATA_ASSIGN_OR_RETURN(pass, r.apply_test(test, subject, copy, 0));
    }
    if (pass == keep) out.push_back(item);
  }
  return Value(std::move(out));
}

StatusOr<Value> f_map(Renderer& r, const Value& seq, CallArgs& a) {
  STRATA_ASSIGN_OR_RETURN(List items, iterate(seq));
  const Value* attribute = nullptr;
  const Value* dflt = nullptr;
  for (const auto& [k, v] : a.kwargs) {
    if (k == "attribute") attribute = &v;
    if (k == "default") dflt = &v;
  }
  List out;
  for (const Value& item : items) {
    STRATA_RETURN_IF_ERROR(r.charge_iterations(1));
    if (attribute != nullptr) {
      STRATA_ASSIGN_OR_RETURN(Value v, attr_path(item, to_output(*attribute)));
      out.push_back(v.is_undefined() && dflt != nullptr ? *dflt : v);
      continue;
    }
    if (a.args.empty() || !a.args[0].is_string())
      return invalid_argument("map needs a filter name or attribute=");
    CallArgs rest;
    rest.args.assign(a.args.begin() + 1, a.args.end());
    rest.kwargs = a.kwargs;
    STRATA_ASSIGN_OR_RETURN(Value v, r.apply_filter(a.args[0].str(), item, rest, 0));
    out.push_back(std::move(v));
  }
  return Value(std::move(out));
}

StatusOr<Value> f_tojson(Renderer& r, const Value& v, CallArgs& a) {
  // HF's override: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
  JsonDumpOptions o;
  o.ensure_ascii = arg_bool(a, 0, "ensure_ascii", false);
  if (const Value* indent = a.get(1, "indent"); indent != nullptr && !indent->is_none()) {
    if (indent->is_int()) {
      o.indent =
          std::string(static_cast<size_t>(std::clamp<int64_t>(indent->as_int(), 0, 1024)), ' ');
    } else if (indent->is_string()) {
      o.indent = indent->str();
    } else {
      return invalid_argument("tojson: indent must be an int or a string");
    }
  }
  if (const Value* seps = a.get(2, "separators"); seps != nullptr && !seps->is_none()) {
    if (!seps->is_list() || seps->list().size() != 2 || !seps->list()[0].is_string() ||
        !seps->list()[1].is_string()) {
      return invalid_argument("tojson: separators must be a pair of strings");
    }
    o.item_sep = seps->list()[0].str();
    o.key_sep = seps->list()[1].str();
  }
  o.sort_keys = arg_bool(a, 3, "sort_keys", false);
  STRATA_ASSIGN_OR_RETURN(std::string s, json_dumps(v, o));
  STRATA_RETURN_IF_ERROR(r.check_size(s.size()));
  return Value(std::move(s));
}

StatusOr<Value> f_join(Renderer& r, const Value& v, CallArgs& a) {
  STRATA_ASSIGN_OR_RETURN(List items, iterate(v));
  const Value* sep = a.get(0, "d");
  const Value* attribute = a.get(1, "attribute");
  std::string s = sep != nullptr ? to_output(*sep) : "";
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += s;
    Value item = items[i];
    if (attribute != nullptr && !attribute->is_none()) {
      STRATA_ASSIGN_OR_RETURN(item, attr_path(item, to_output(*attribute)));
    }
    out += to_output(item);
    STRATA_RETURN_IF_ERROR(r.check_size(out.size()));
  }
  return Value(std::move(out));
}

StatusOr<Value> f_indent(Renderer& r, const Value& v, CallArgs& a) {
  std::string pad(4, ' ');
  if (const Value* w = a.get(0, "width"); w != nullptr) {
    if (w->is_string()) {
      pad = w->str();
    } else if (w->is_int()) {
      pad = std::string(static_cast<size_t>(std::clamp<int64_t>(w->as_int(), 0, 1024)), ' ');
    }
  }
  bool first = arg_bool(a, 1, "first", false);
  bool blank = arg_bool(a, 2, "blank", false);
  std::vector<std::string> lines = py_splitlines(to_output(v) + "\n");
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) out += '\n';
    bool pad_line = i == 0 ? first : (blank || !lines[i].empty());
    if (pad_line) out += pad;
    out += lines[i];
    STRATA_RETURN_IF_ERROR(r.check_size(out.size()));
  }
  return Value(std::move(out));
}

StatusOr<Value> to_int(const Value& v, const Value& dflt, int base) {
  if (v.is_int()) return v;
  if (v.is_bool()) return Value(int64_t{v.as_bool()});
  if (v.is_float()) {
    double d = v.as_double();
    if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) return dflt;
    return Value(static_cast<int64_t>(d));
  }
  if (!v.is_string()) return dflt;
  std::string s = py_strip(v.str(), std::nullopt, true, true);
  s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
  errno = 0;
  char* end = nullptr;
  long long i = std::strtoll(s.c_str(), &end, base);
  if (!s.empty() && *end == '\0' && errno == 0) return Value(static_cast<int64_t>(i));
  double d = std::strtod(s.c_str(), &end);  // Jinja falls back to int(float(value))
  if (!s.empty() && *end == '\0' && std::isfinite(d) && std::fabs(d) < 9.2e18) {
    return Value(static_cast<int64_t>(d));
  }
  return dflt;
}

StatusOr<Value> to_float(const Value& v, const Value& dflt) {
  if (v.is_number()) return Value(v.as_double());
  if (!v.is_string()) return dflt;
  std::string s = py_strip(v.str(), std::nullopt, true, true);
  char* end = nullptr;
  double d = std::strtod(s.c_str(), &end);
  if (!s.empty() && *end == '\0') return Value(d);
  return dflt;
}

StatusOr<Value> f_round(Renderer&, const Value& v, CallArgs& a) {
  if (!v.is_number()) return invalid_argument("round: expected a number, got {}", v.type_name());
  int64_t precision = 0;
  if (const Value* p = a.get(0, "precision"); p != nullptr && p->is_int()) precision = p->as_int();
  const Value* m = a.get(1, "method");
  std::string method = m != nullptr ? to_output(*m) : "common";
  if (method != "common" && method != "ceil" && method != "floor") {
    return invalid_argument("round: method must be common, ceil or floor");
  }
  if (method == "common" && !v.is_float() && precision >= 0)
    return v;  // Python round(int) is an int
  double scale = std::pow(10.0, static_cast<double>(precision));
  double x = v.as_double() * scale;
  double rounded = method == "ceil"    ? std::ceil(x)
                   : method == "floor" ? std::floor(x)
                                       : std::nearbyint(x);
  return Value(rounded / scale);
}

StatusOr<Value> first_or_last(const Value& v, bool last) {
  if (v.is_undefined()) return Value();
  STRATA_ASSIGN_OR_RETURN(List items, iterate(v));
  if (items.empty()) return Value();
  return last ? items.back() : items.front();
}

StatusOr<Value> min_max(Renderer&, const Value& v, CallArgs& a, bool want_max) {
  STRATA_ASSIGN_OR_RETURN(List items, iterate(v));
  STRATA_ASSIGN_OR_RETURN(
      List s, sorted(items, a.get(1, "attribute"), arg_bool(a, 0, "case_sensitive", false), false));
  if (s.empty()) return Value();
  return want_max ? s.back() : s.front();
}

const std::unordered_map<std::string_view, FilterFn>& filters() {
  static const std::unordered_map<std::string_view, FilterFn> kFilters = {
      {"abs",
       [](Renderer&, const Value& v, CallArgs&) -> StatusOr<Value> {
         if (v.is_float()) return Value(std::fabs(v.as_double()));
         if (v.is_bool()) return Value(int64_t{v.as_bool()});
         if (!v.is_int()) return invalid_argument("abs: expected a number, got {}", v.type_name());
         if (v.as_int() == INT64_MIN) return out_of_range("abs: integer overflow");
         return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
       }},
      {"attr",
       [](Renderer&, const Value& v, CallArgs& a) -> StatusOr<Value> {
         const Value* name = a.get(0, "name");
         if (name == nullptr || !name->is_string()) return invalid_argument("attr needs a name");
         if (v.is_dict())
           return Renderer::has_method(v, name->str()) ? get_attr(v, name->str()) : Value();
         return get_attr(v, name->str());
       }},
      {"capitalize",
       [](Renderer&, const Value& v, CallArgs&) -> StatusOr<Value> {
         return Value(py_capitalize(to_output(v)));
       }},
      {"batch",
       [](Renderer&, const Value& v, CallArgs& a) -> StatusOr<Value> {
         const Value* n = a.get(0, "linecount");
         if (n == nullptr || !n->is_int() || n->as_int() <= 0)
           return invalid_argument("batch needs a positive count");
         const Value* fill = a.get(1, "fill_with");
         STRATA_ASSIGN_OR_RETURN(List items, iterate(v));
         List out;
         for (size_t i = 0; i < items.size(); i += static_cast<size_t>(n->as_int())) {
           List chunk;
           for (size_t j = i; j < items.size() && j < i + static_cast<size_t>(n->as_int()); ++j)
             chunk.push_back(items[j]);
           while (fill != nullptr && !fill->is_none() &&
                  static_cast<int64_t>(chunk.size()) < n->as_int())
             chunk.push_back(*fill);
           out.push_back(Value(std::move(chunk)));
         }
         return Value(std::move(out));
       }},
      {"center",
       [](Renderer& r, const Value& v, CallArgs& a) -> StatusOr<Value> {
         const Value* w = a.get(0, "width");
         int64_t width = w != nullptr && w->is_int() ? w->as_int() : 80;
         std::string s = to_output(v);
         int64_t len = static_cast<int64_t>(utf8_length(s));
         if (width <= len) return Value(std::move(s));
         STRATA_RETURN_IF_ERROR(r.check_size(s.size() + static_cast<size_t>(width - len)));
         int64_t pad = width - len;
         int64_t left = pad / 2 + (pad & width & 1);  // Python's str.center
         return Value(std::string(left, ' ') + s + std::string(pad - left, ' '));
       }},
      {"count",
       [](Renderer&, const Value& v, CallArgs&) -> StatusOr<Value> {
         STRATA_ASSIGN_OR_RETURN(int64_t n, length_of(v));
         return Value(n);
       }},
      {"default",
       [](Renderer&, const Value& v, CallArgs& a) -> StatusOr<Value> {
         const Value* d = a.get(0, "default_value");
         if (v.is_undefined() || (arg_bool(a, 1, "boolean", false) && !v.truthy())) {
           return d != nullptr ? *d : Value("");
         }
         return v;
       }},
      {"dictsort",
       [](Renderer&, const Value& v, CallArgs& a) -> StatusOr<Value> {
         if (!v.is_dict())
           return invalid_argument("dictsort: expected a dict, got {}", v.type_name());
         const Value* by = a.get(1, "by");
         bool by_value = by != nullptr && to_output(*by) == "value";
         List pairs;
         for (const auto& [k, item] : v.dict().items)
           pairs.push_back(Value::tuple(List{Value(k), item}));
         Value attr(by_value ? "1" : "0");
         STRATA_ASSIGN_OR_RETURN(List s,
                                 sorted(pairs, &attr, arg_bool(a, 0, "case_sensitive", false),
                                        arg_bool(a, 2, "reverse", false)));
         return Value(std::move(s));
       }},
      {"escape",
       [](Renderer&, const Value& v, CallArgs&) -> StatusOr<Value> {
         return Value(html_escape(to_output(v)));
       }},
      {"first", [](Renderer&, const Value& v, CallArgs&) { return first_or_last(v, false); }},
      {"last", [](Renderer&, const Value& v, CallArgs&) { return first_or_last(v, true); }},
      {"float",
       [](Renderer&, const Value& v, CallArgs& a) -> StatusOr<Value> {
         const Value* d = a.get(0, "default");
         return to_float(v, d != nullptr ? *d : Value(0.0));
       }},
      {"int",
       [](Renderer&, const Value& v, CallArgs& a) -> StatusOr<Value> {
         const Value* d = a.get(0, "default");
         const Value* base = a.get(1, "base");
         return to_int(v, d != nullptr ? *d : Value(0),
                       base != nullptr && base->is_int() ? base->as_int() : 10);
       }},
      {"format",
       [](Renderer& r, const Value& v, CallArgs& a) -> StatusOr<Value> {
         return printf_format(to_output(v), a.args, r);
       }},
      {"indent", f_indent},
      {"items",
       [](Renderer&, const Value& v, CallArgs& a) -> StatusOr<Value> {
         if (v.is_undefined()) return Value(List{});
         if (!v.is_dict()) return invalid_argument("items: expected a dict, got {}", v.type_name());
         List pairs;
         for (const auto& [k, item] : v.dict().items)
           pairs.push_back(Value::tuple(List{Value(k), item}));
         return Value(std::move(pairs));
       }},
      {"join", f_join},
      {"length",
       [](Renderer&, const Value& v, CallArgs&) -> StatusOr<Value> {
         STRATA_ASSIGN_OR_RETURN(int64_t n, length_of(v));
         return Value(n);
       }},
      {"list",
       [](Renderer&, const Value& v, CallArgs&) -> StatusOr<Value> {
         STRATA_ASSIGN_OR_RETURN(List items, iterate(v));
         return Value(std::move(items));
       }},
      {"lower",
       [](Renderer&, const Value& v, CallArgs&) -> StatusOr<Value> {
         return Value(ascii_lower(to_output(v)));
       }},
      {"upper",
       [](Renderer&, const Value& v, CallArgs&) -> StatusOr<Value> {
         return Value(ascii_upper(to_output(v)));
       }},
      {"map", f_map},
      {"max", [](Renderer& r, const Value& v, CallArgs& a) { return min_max(r, v, a, true); }},
      {"min", [](Renderer& r, const Value& v, CallArgs& a) { return min_max(r, v, a, false); }},
      {"select", [](Renderer& r, const Value& v,
                    CallArgs& a) { return select_common(r, v, a, false, true); }},
      {"reject", [](Renderer& r, const Value& v,
                    CallArgs& a) { return select_common(r, v, a, false, false); }},
      {"selectattr",
       [](Renderer& r, const Value& v, CallArgs& a) { return select_common(r, v, a, true, true); }},
      {"rejectattr", [](Renderer& r, const Value& v,
                        CallArgs& a) { return select_common(r, v, a, true, false); }},
      {"replace",
       [](Renderer& r, const Value& v, CallArgs& a) -> StatusOr<Value> {
         const Value* old = a.get(0, "old");
         const Value* rep = a.get(1, "new");
         const Value* count = a.get(2, "count");
         if (old == nullptr || rep == nullptr) return invalid_argument("replace needs old and new");
         std::string s = to_output(v);
         int64_t n = count != nullptr && count->is_int() ? count->as_int() : -1;
         STRATA_RETURN_IF_ERROR(
             r.check_size(py_replace_size(s, to_output(*old), to_output(*rep), n)));
         return Value(py_replace(s, to_output(*old), to_output(*rep), n));
       }},
      {"reverse",
       [](Renderer&, const Value& v, CallArgs&) -> StatusOr<Value> {
         STRATA_ASSIGN_OR_RETURN(List items, iterate(v));
         std::reverse(items.begin(), items.end());
         if (!v.is_string()) return Value(std::move(items));
         std::string out;
         for (const Value& c : items) out += c.str();
         return Value(std::move(out));
       }},
      {"round", f_round},
      {"safe", [](Renderer&, const Value& v, CallArgs&) -> StatusOr<Value> { return v; }},
      {"sort",
       [](Renderer&, const Value& v, CallArgs& a) -> StatusOr<Value> {
         STRATA_ASSIGN_OR_RETURN(List items, iterate(v));
         STRATA_ASSIGN_OR_RETURN(
             List s, sorted(items, a.get(2, "attribute"), arg_bool(a, 1, "case_sensitive", false),
                            arg_bool(a, 0, "reverse", false)));
         return Value(std::move(s));
       }},
      {"string",
       [](Renderer&, const Value& v, CallArgs&) -> StatusOr<Value> { return Value(to_output(v)); }},
      {"sum",
       [](Renderer& r, const Value& v, CallArgs& a) -> StatusOr<Value> {
         STRATA_ASSIGN_OR_RETURN(List items, iterate(v));
         const Value* attribute = a.get(0, "attribute");
         const Value* start = a.get(1, "start");
         Value total = start != nullptr ? *start : Value(0);
         for (const Value& item : items) {
           Value x = item;
           if (attribute != nullptr && !attribute->is_none()) {
             STRATA_ASSIGN_OR_RETURN(x, attr_path(item, to_output(*attribute)));
           }
           STRATA_ASSIGN_OR_RETURN(total, arithmetic("+", total, x, r));
         }
         return total;
       }},
      {"title",
       [](Renderer&, const Value& v, CallArgs&) -> StatusOr<Value> {
         return Value(jinja_title(to_output(v)));
       }},
      {"tojson", f_tojson},
      {"trim",
       [](Renderer&, const Value& v, CallArgs& a) -> StatusOr<Value> {
         const Value* chars = a.get(0, "chars");
         std::optional<std::string> set;
         if (chars != nullptr && !chars->is_none()) set = to_output(*chars);
         return Value(py_strip(to_output(v), set, true, true));
       }},
      {"unique",
       [](Renderer&, const Value& v, CallArgs& a) -> StatusOr<Value> {
         STRATA_ASSIGN_OR_RETURN(List items, iterate(v));
         bool case_sensitive = arg_bool(a, 0, "case_sensitive", false);
         const Value* attribute = a.get(1, "attribute");
         List out;
         List seen;
         for (const Value& item : items) {
           STRATA_ASSIGN_OR_RETURN(Value key, sort_key(item, attribute, case_sensitive));
           if (std::any_of(seen.begin(), seen.end(),
                           [&](const Value& s) { return equals(s, key); }))
             continue;
           seen.push_back(key);
           out.push_back(item);
         }
         return Value(std::move(out));
       }},
      {"wordcount",
       [](Renderer&, const Value& v, CallArgs&) -> StatusOr<Value> {
         int64_t n = 0;
         bool in_word = false;
         for (char c : to_output(v)) {
           bool w = std::isalnum(static_cast<unsigned char>(c)) || c == '_' ||
                    (static_cast<unsigned char>(c) >= 0x80);
           if (w && !in_word) ++n;
           in_word = w;
         }
         return Value(n);
       }},
  };
  return kFilters;
}

StatusOr<bool> compare_test(const Value& v, CallArgs& a, std::string_view op) {
  const Value* other = a.get(0, "other");
  if (other == nullptr) return invalid_argument("test '{}' needs an argument", op);
  if (op == "==") return equals(v, *other);
  if (op == "!=") return !equals(v, *other);
  if (op == "<") return less_than(v, *other);
  if (op == ">") return less_than(*other, v);
  if (op == "<=") {
    STRATA_ASSIGN_OR_RETURN(bool gt, less_than(*other, v));
    return !gt;
  }
  STRATA_ASSIGN_OR_RETURN(bool lt, less_than(v, *other));
  return !lt;
}

const std::unordered_map<std::string_view, TestFn>& tests() {
  static const std::unordered_map<std::string_view, TestFn> kTests = {
      {"defined",
       [](Renderer&, const Value& v, CallArgs&) -> StatusOr<bool> { return !v.is_undefined(); }},
      {"undefined",
       [](Renderer&, const Value& v, CallArgs&) -> StatusOr<bool> { return v.is_undefined(); }},
      {"none", [](Renderer&, const Value& v, CallArgs&) -> StatusOr<bool> { return v.is_none(); }},
      {"boolean",
       [](Renderer&, const Value& v, CallArgs&) -> StatusOr<bool> { return v.is_bool(); }},
      {"true",
       [](Renderer&, const Value& v, CallArgs&) -> StatusOr<bool> {
         return v.is_bool() && v.as_bool();
       }},
      {"false",
       [](Renderer&, const Value& v, CallArgs&) -> StatusOr<bool> {
         return v.is_bool() && !v.as_bool();
       }},
      {"integer",
       [](Renderer&, const Value& v, CallArgs&) -> StatusOr<bool> { return v.is_int(); }},
      {"float",
       [](Renderer&, const Value& v, CallArgs&) -> StatusOr<bool> { return v.is_float(); }},
      {"number",
       [](Renderer&, const Value& v, CallArgs&) -> StatusOr<bool> { return v.is_number(); }},
      {"string",
       [](Renderer&, const Value& v, CallArgs&) -> StatusOr<bool> { return v.is_string(); }},
      {"mapping",
       [](Renderer&, const Value& v, CallArgs&) -> StatusOr<bool> { return v.is_dict(); }},
      {"iterable",
       [](Renderer&, const Value& v, CallArgs&) -> StatusOr<bool> {
         return v.is_list() || v.is_dict() || v.is_string() || v.is_undefined();
       }},
      {"sequence",
       [](Renderer&, const Value& v, CallArgs&) -> StatusOr<bool> {
         return v.is_list() || v.is_dict() || v.is_string();
       }},
      {"callable",
       [](Renderer&, const Value& v, CallArgs&) -> StatusOr<bool> { return v.is_function(); }},
      {"escaped", [](Renderer&, const Value&, CallArgs&) -> StatusOr<bool> { return false; }},
      {"lower",
       [](Renderer&, const Value& v, CallArgs&) -> StatusOr<bool> {
         return v.is_string() && ascii_lower(v.str()) == v.str();
       }},
      {"upper",
       [](Renderer&, const Value& v, CallArgs&) -> StatusOr<bool> {
         return v.is_string() && ascii_upper(v.str()) == v.str();
       }},
      {"odd",
       [](Renderer&, const Value& v, CallArgs&) -> StatusOr<bool> {
         if (!v.is_int()) return invalid_argument("test 'odd' needs an integer");
         return v.as_int() % 2 != 0;
       }},
      {"even",
       [](Renderer&, const Value& v, CallArgs&) -> StatusOr<bool> {
         if (!v.is_int()) return invalid_argument("test 'even' needs an integer");
         return v.as_int() % 2 == 0;
       }},
      {"divisibleby",
       [](Renderer&, const Value& v, CallArgs& a) -> StatusOr<bool> {
         const Value* n = a.get(0, "num");
         if (!v.is_int() || n == nullptr || !n->is_int() || n->as_int() == 0) {
           return invalid_argument("test 'divisibleby' needs non-zero integers");
         }
         return v.as_int() % n->as_int() == 0;
       }},
      {"in",
       [](Renderer&, const Value& v, CallArgs& a) -> StatusOr<bool> {
         const Value* seq = a.get(0, "seq");
         if (seq == nullptr) return invalid_argument("test 'in' needs an argument");
         return contains(*seq, v);
       }},
      {"sameas",
       [](Renderer&, const Value& v, CallArgs& a) -> StatusOr<bool> {
         const Value* o = a.get(0, "other");
         if (o == nullptr) return invalid_argument("test 'sameas' needs an argument");
         if (v.is_none() || v.is_bool() || o->is_none() || o->is_bool()) {
           return v.type_name() == o->type_name() && equals(v, *o);
         }
         return equals(v, *o) && (v.is_namespace() || v.is_function());
       }},
      {"eq", [](Renderer&, const Value& v, CallArgs& a) { return compare_test(v, a, "=="); }},
      {"equalto", [](Renderer&, const Value& v, CallArgs& a) { return compare_test(v, a, "=="); }},
      {"==", [](Renderer&, const Value& v, CallArgs& a) { return compare_test(v, a, "=="); }},
      {"ne", [](Renderer&, const Value& v, CallArgs& a) { return compare_test(v, a, "!="); }},
      {"!=", [](Renderer&, const Value& v, CallArgs& a) { return compare_test(v, a, "!="); }},
      {"lt", [](Renderer&, const Value& v, CallArgs& a) { return compare_test(v, a, "<"); }},
      {"lessthan", [](Renderer&, const Value& v, CallArgs& a) { return compare_test(v, a, "<"); }},
      {"<", [](Renderer&, const Value& v, CallArgs& a) { return compare_test(v, a, "<"); }},
      {"le", [](Renderer&, const Value& v, CallArgs& a) { return compare_test(v, a, "<="); }},
      {"<=", [](Renderer&, const Value& v, CallArgs& a) { return compare_test(v, a, "<="); }},
      {"gt", [](Renderer&, const Value& v, CallArgs& a) { return compare_test(v, a, ">"); }},
      {"greaterthan",
       [](Renderer&, const Value& v, CallArgs& a) { return compare_test(v, a, ">"); }},
      {">", [](Renderer&, const Value& v, CallArgs& a) { return compare_test(v, a, ">"); }},
      {"ge", [](Renderer&, const Value& v, CallArgs& a) { return compare_test(v, a, ">="); }},
      {">=", [](Renderer&, const Value& v, CallArgs& a) { return compare_test(v, a, ">="); }},
  };
  return kTests;
}

}  // namespace

StatusOr<Value> Renderer::apply_filter(std::string_view name, const Value& input, CallArgs& args,
                                       int line) {
  static const std::unordered_map<std::string_view, std::string_view> kAliases = {
      {"d", "default"}, {"e", "escape"}, {"forceescape", "escape"}};
  if (auto alias = kAliases.find(name); alias != kAliases.end()) name = alias->second;
  auto it = filters().find(name);
  if (it == filters().end()) return invalid_argument("line {}: unknown filter '{}'", line, name);
  StatusOr<Value> v = it->second(*this, input, args);
  if (!v.ok()) return v.status().with_context("line {}: filter '{}'", line, name);
  if (v->is_list() && v->list().size() > static_cast<size_t>(limits_.max_loop_iterations)) {
    return resource_exhausted("line {}: filter '{}' built a list beyond the template's limit", line,
                              name);
  }
  return v;
}

StatusOr<bool> Renderer::apply_test(std::string_view name, const Value& input, CallArgs& args,
                                    int line) {
  if (name == "filter" || name == "test") {
    if (!input.is_string()) return false;
    return name == "filter" ? filters().count(input.str()) > 0 : tests().count(input.str()) > 0;
  }
  auto it = tests().find(name);
  if (it == tests().end()) return invalid_argument("line {}: unknown test '{}'", line, name);
  StatusOr<bool> b = it->second(*this, input, args);
  if (!b.ok()) return b.status().with_context("line {}", line);
  return b;
}

StatusOr<Value> printf_format(const std::string& fmt_str, const List& args, const Renderer& r) {
  std::string out;
  size_t next = 0;
  for (size_t i = 0; i < fmt_str.size(); ++i) {
    if (fmt_str[i] != '%') {
      out += fmt_str[i];
      continue;
    }
    size_t b = i++;
    while (i < fmt_str.size() &&
           std::string_view("-+ 0#").find(fmt_str[i]) != std::string_view::npos)
      ++i;
    while (i < fmt_str.size() &&
           (std::isdigit(static_cast<unsigned char>(fmt_str[i])) || fmt_str[i] == '.'))
      ++i;
    if (i >= fmt_str.size()) return invalid_argument("format: incomplete format");
    char type = fmt_str[i];
    std::string spec = fmt_str.substr(b, i - b);
    if (type == '%') {
      out += '%';
      continue;
    }
    if (next >= args.size())
      return invalid_argument("format: not enough arguments for format string");
    const Value& v = args[next++];
    char buf[512];
    if (type == 's' || type == 'r') {
      std::string s = type == 's' ? to_output(v) : to_repr(v);
      std::snprintf(buf, sizeof(buf), (spec + "s").c_str(), "");
      size_t width = std::strlen(buf);
      bool left = spec.find('-') != std::string::npos;
      size_t len = utf8_length(s);
      std::string padding(width > len ? width - len : 0, ' ');
      out += left ? s + padding : padding + s;
    } else if (type == 'd' || type == 'i' || type == 'x' || type == 'X' || type == 'o') {
      if (!v.is_number())
        return invalid_argument("format: %{} needs a number, not {}", type, v.type_name());
      long long n = v.is_int() ? v.as_int() : static_cast<long long>(v.as_double());
      std::snprintf(buf, sizeof(buf), (spec + "ll" + (type == 'i' ? 'd' : type)).c_str(), n);
      out += buf;
    } else if (std::string_view("fFeEgG").find(type) != std::string_view::npos) {
      if (!v.is_number())
        return invalid_argument("format: %{} needs a number, not {}", type, v.type_name());
      std::snprintf(buf, sizeof(buf), (spec + type).c_str(), v.as_double());
      out += buf;
    } else {
      return invalid_argument("format: unsupported format character '{}'", type);
    }
    STRATA_RETURN_IF_ERROR(r.check_size(out.size()));
  }
  if (next < args.size())
    return invalid_argument("format: not all arguments converted during string formatting");
  return Value(std::move(out));
}

namespace {

StatusOr<Value> g_range(Renderer& r, CallArgs& a) {
  int64_t bounds[3] = {0, 0, 1};
  if (a.args.empty() || a.args.size() > 3) return invalid_argument("range expects 1 to 3 integers");
  for (size_t i = 0; i < a.args.size(); ++i) {
    if (!a.args[i].is_int() && !a.args[i].is_bool())
      return invalid_argument("range expects integers");
  }
  auto as_i = [](const Value& v) { return v.is_int() ? v.as_int() : int64_t{v.as_bool()}; };
  if (a.args.size() == 1) {
    bounds[1] = as_i(a.args[0]);
  } else {
    bounds[0] = as_i(a.args[0]);
    bounds[1] = as_i(a.args[1]);
    if (a.args.size() == 3) bounds[2] = as_i(a.args[2]);
  }
  const auto [start, stop, step] = bounds;
  if (step == 0) return invalid_argument("range() arg 3 must not be zero");
  // Length computed in floating point so huge bounds cannot overflow; charged before building.
  double span = step > 0 ? static_cast<double>(stop) - start : static_cast<double>(start) - stop;
  double n = span <= 0 ? 0 : std::ceil(span / std::fabs(static_cast<double>(step)));
  if (n > static_cast<double>(r.limits().max_loop_iterations)) {
    return resource_exhausted("range() of {} items exceeds the template's limit of {} iterations",
                              static_cast<int64_t>(n), r.limits().max_loop_iterations);
  }
  STRATA_RETURN_IF_ERROR(r.charge_iterations(static_cast<int64_t>(n)));
  List out;
  out.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < static_cast<int64_t>(n); ++i) out.emplace_back(start + i * step);
  return Value(std::move(out));
}

StatusOr<Value> g_namespace(Renderer&, CallArgs& a) {
  auto ns = std::make_shared<Namespace>();
  for (const Value& v : a.args) {
    if (!v.is_dict()) return invalid_argument("namespace() positional argument must be a dict");
    for (const auto& [k, item] : v.dict().items) ns->attrs.set(k, item);
  }
  for (const auto& [k, v] : a.kwargs) ns->attrs.set(k, v);
  for (const auto& [k, v] : ns->attrs.items) ns->depth = std::max(ns->depth, v.depth() + 1);
  if (ns->depth > Value::kMaxDepth) return resource_exhausted("namespace() values nest too deeply");
  return Value(std::move(ns));
}

StatusOr<Value> g_dict(Renderer&, CallArgs& a) {
  Dict d;
  for (const Value& v : a.args) {
    if (!v.is_dict()) return invalid_argument("dict() positional argument must be a dict");
    for (const auto& [k, item] : v.dict().items) d.set(k, item);
  }
  for (const auto& [k, v] : a.kwargs) d.set(k, v);
  return Value(std::move(d));
}

StatusOr<Value> g_raise(Renderer&, CallArgs& a) {
  const Value* msg = a.get(0, "message");
  return Status(StatusCode::kInvalidArgument,
                msg != nullptr ? to_output(*msg) : "raise_exception()");
}

StatusOr<Value> g_strftime_now(Renderer&, CallArgs& a) {
  const Value* f = a.get(0, "format");
  if (f == nullptr || !f->is_string())
    return invalid_argument("strftime_now needs a format string");
  std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char buf[256];
  size_t n = std::strftime(buf, sizeof(buf), f->str().c_str(), &local);
  return Value(std::string(buf, n));
}

}  // namespace

Value Renderer::builtin_global(std::string_view name) {
  static const std::unordered_map<std::string_view, Value> kGlobals = [] {
    std::unordered_map<std::string_view, Value> g;
    auto add = [&](std::string_view n, StatusOr<Value> (*fn)(Renderer&, CallArgs&)) {
      g.emplace(n, Value(std::make_shared<const Function>(Function{std::string(n), fn})));
    };
    add("range", g_range);
    add("namespace", g_namespace);
    add("dict", g_dict);
    add("raise_exception", g_raise);
    add("strftime_now", g_strftime_now);
    return g;
  }();
  auto it = kGlobals.find(name);
  return it != kGlobals.end() ? it->second : Value();
}

}  // namespace strata::jinja
