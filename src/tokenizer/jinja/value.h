// The value type of the Jinja chat-template interpreter: a small variant with Python semantics
// (truthiness, ==, ordering, str()/repr(), json.dumps) so renderings match Hugging Face byte for
// byte. Lists, dicts and strings are shared immutably (HF renders in ImmutableSandboxedEnvironment,
// so nothing mutates them); only namespace() objects are mutable and shared by reference.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "core/status.h"

namespace strata::jinja {

class Value;
class Renderer;
struct CallArgs;

struct UndefinedTag {};
struct NoneTag {};

using List = std::vector<Value>;

// Python dict: insertion-ordered, string keys (JSON keys; template dict literals with other key
// types are rejected at evaluation). Linear lookup: chat dicts have a handful of keys.
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(std::string_view key) const;
  void set(std::string key, Value value);
};

// namespace(...): the only mutable object, shared by reference ({% set ns.x = ... %}).
struct Namespace {
  Dict attrs;
  uint32_t depth = 1;  // nesting depth of what it holds, kept up to date by {% set ns.x %}
};

// Built-in functions, bound methods and macros. The renderer is passed in so macros can run.
struct Function {
  std::string name;
  std::function<StatusOr<Value>(Renderer&, CallArgs&)> call;
};

class Value {
 public:
  using StrPtr = std::shared_ptr<const std::string>;
  using ListPtr = std::shared_ptr<const List>;
  using DictPtr = std::shared_ptr<const Dict>;
  using NsPtr = std::shared_ptr<Namespace>;
  using FnPtr = std::shared_ptr<const Function>;

  Value() : v_(UndefinedTag{}) {}
  // Containers deeper than this are refused by the evaluator: destroying, printing or comparing
  // them recurses, and a hostile template could otherwise build a chain deep enough to overflow the
  // stack.
  static constexpr uint32_t kMaxDepth = 256;
  static Value none() { return Value(NoneTag{}); }
  // A Python tuple: a list that prints as (a, b). Only repr() tells them apart.
  static Value tuple(List l) {
    Value v(std::move(l));
    v.tuple_ = true;
    return v;
  }
  bool is_tuple() const { return tuple_; }
  Value(bool b) : v_(b) {}                       // NOLINT: implicit, like Python literals
  Value(int64_t i) : v_(i) {}                    // NOLINT
  Value(int i) : v_(static_cast<int64_t>(i)) {}  // NOLINT
  Value(double d) : v_(d) {}                     // NOLINT
  Value(std::string s) : v_(std::make_shared<const std::string>(std::move(s))) {}  // NOLINT
  Value(const char* s) : Value(std::string(s)) {}                                  // NOLINT
  Value(List l);                                                                   // NOLINT
  Value(Dict d);                                                                   // NOLINT
  Value(NsPtr ns) : v_(std::move(ns)) {}                                           // NOLINT
  Value(FnPtr fn) : v_(std::move(fn)) {}                                           // NOLINT

  bool is_undefined() const { return std::holds_alternative<UndefinedTag>(v_); }
  bool is_none() const { return std::holds_alternative<NoneTag>(v_); }
  bool is_bool() const { return std::holds_alternative<bool>(v_); }
  bool is_int() const { return std::holds_alternative<int64_t>(v_); }
  bool is_float() const { return std::holds_alternative<double>(v_); }
  bool is_number() const { return is_int() || is_float() || is_bool(); }
  bool is_string() const { return std::holds_alternative<StrPtr>(v_); }
  bool is_list() const { return std::holds_alternative<ListPtr>(v_); }
  bool is_dict() const { return std::holds_alternative<DictPtr>(v_); }
  bool is_namespace() const { return std::holds_alternative<NsPtr>(v_); }
  bool is_function() const { return std::holds_alternative<FnPtr>(v_); }

  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const { return std::get<int64_t>(v_); }
  // Int, bool or float as a double (caller checked is_number()).
  double as_double() const;
  const std::string& str() const { return *std::get<StrPtr>(v_); }
  const List& list() const { return *std::get<ListPtr>(v_); }
  const Dict& dict() const { return *std::get<DictPtr>(v_); }
  Namespace& ns() const { return *std::get<NsPtr>(v_); }
  const Function& fn() const { return *std::get<FnPtr>(v_); }

  // Container nesting depth: 0 for scalars, 1 for [1, 2], 2 for [[1]].
  uint32_t depth() const;

  // Python bool(x); undefined is falsy.
  bool truthy() const;
  // Python type name, for error messages ("str", "list", "NoneType"...).
  const char* type_name() const;

 private:
  explicit Value(NoneTag t) : v_(t) {}
  std::variant<UndefinedTag, NoneTag, bool, int64_t, double, StrPtr, ListPtr, DictPtr, NsPtr, FnPtr>
      v_;
  uint32_t depth_ = 0;  // for lists and dicts; namespaces keep theirs
  bool tuple_ = false;
};

// Python ==, with int/float/bool numeric equality; undefined equals only undefined.
bool equals(const Value& a, const Value& b);
// Python <: numbers, strings (code point order), lists lexicographically; TypeError otherwise.
StatusOr<bool> less_than(const Value& a, const Value& b);

// Python repr(float): shortest round-trip digits, "1.0", "1e+16", "inf".
std::string float_repr(double d);
// Python repr(str) with its quote choice and escapes.
std::string py_repr_string(std::string_view s);
// What {{ x }} prints: Python str(x); undefined prints nothing.
std::string to_output(const Value& v);
// Python repr(x) (containers print their items this way).
std::string to_repr(const Value& v);

// json.dumps(x, ensure_ascii, indent, separators, sort_keys) as HF's tojson filter calls it.
// indent: nullopt = single line; item_sep/key_sep: nullopt = Python's defaults for that mode.
struct JsonDumpOptions {
  bool ensure_ascii = false;
  std::optional<std::string> indent;
  std::optional<std::string> item_sep;
  std::optional<std::string> key_sep;
  bool sort_keys = false;
};
StatusOr<std::string> json_dumps(const Value& v, const JsonDumpOptions& options);

// JSON -> Value (objects keep their key order when given ordered_json). InvalidArgument when
// nested deeper than Value::kMaxDepth.
StatusOr<Value> from_json(const nlohmann::json& j);
StatusOr<Value> from_json(const nlohmann::ordered_json& j);

// UTF-8 helpers shared by the evaluator (strings index and slice by code point, like Python).
std::vector<uint32_t> utf8_decode(std::string_view s);
void utf8_append(std::string& out, uint32_t cp);
size_t utf8_length(std::string_view s);

}  // namespace strata::jinja
