// Evaluator of a parsed chat template. One Renderer per render() call (it holds that render's
// variables, output and budgets); the tree it walks is shared and never modified.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"
#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/value.h"

namespace strata::jinja {

// Budgets that keep a hostile template from exhausting memory or time. Each breach is an error
// Status naming the limit, never a crash or a hang.
struct RenderLimits {
  size_t max_output_bytes = 64u << 20;  // rendered text, and any single string built on the way
  int64_t max_loop_iterations =
      1'000'000;                   // all loops of one render together; also caps list sizes
  int64_t max_steps = 50'000'000;  // expression and statement evaluations
  int max_call_depth = 64;         // macro calls in flight
};

struct CallArgs {
  std::vector<Value> args;
  std::vector<std::pair<std::string, Value>> kwargs;
  // Positional i, else keyword `name`, else nullptr.
  const Value* get(size_t i, std::string_view name) const;
};

class Renderer {
 public:
  // `globals` are the template's variables (messages, add_generation_prompt, bos_token...).
  Renderer(const RenderLimits& limits, Dict globals);

  // Renders the template body; the output is appended to *out.
  Status render(const NodeList& body, std::string* out);

  const RenderLimits& limits() const { return limits_; }
  // Errors when a string of `bytes` would exceed the output budget; call before building it.
  Status check_size(size_t bytes) const;
  // Charges `n` loop iterations (or list items) to the render's budget.
  Status charge_iterations(int64_t n);

  // Filters, tests and methods (builtins.cc), also used by map()/select() and friends.
  StatusOr<Value> apply_filter(std::string_view name, const Value& input, CallArgs& args, int line);
  StatusOr<bool> apply_test(std::string_view name, const Value& input, CallArgs& args, int line);
  // A str/dict/list method call such as s.startswith('x') or d.items(); nullopt-like NotFound
  // status code when `obj` has no such method, so the caller can fall back to attribute lookup.
  StatusOr<Value> call_method(const Value& obj, std::string_view name, CallArgs& args, int line);
  static bool has_method(const Value& obj, std::string_view name);
  // Global functions: range, namespace, raise_exception, strftime_now, dict. Undefined if unknown.
  static Value builtin_global(std::string_view name);

  // Runs a {% macro %} body with the given arguments; returns what it rendered.
  StatusOr<Value> call_macro(const Node& macro, CallArgs& args);

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  using Frame = std::vector<std::pair<std::string, Value>>;

  Status exec_list(const NodeList& nodes);
  Status exec(const Node& node);
  Status exec_for(const Node& node);
  Status exec_set(const Node& node);
  Status capture(const NodeList& body, std::string* captured);
  Status emit(std::string_view text);

  StatusOr<Value> eval(const Expr& e);
  StatusOr<Value> eval_call(const Expr& e);
  StatusOr<Value> eval_binary(const Expr& e);
  StatusOr<Value> eval_compare(const Expr& e);
  Status eval_args(const Expr& e, size_t first, CallArgs& args);
  StatusOr<Value> eval_container(const Expr& e);

  const Value* lookup(std::string_view name) const;
  void assign(const std::string& name, Value value);

  const RenderLimits& limits_;
  std::vector<Frame> frames_;  // frames_[0]: globals and top-level {% set %}
  std::string* out_ = nullptr;
  Flow flow_ = Flow::kNormal;
  int loop_depth_ = 0;
  int call_depth_ = 0;
  int64_t steps_ = 0;
  int64_t iterations_ = 0;
};

// Python-style sequence helpers shared by the evaluator and the builtins.
StatusOr<Value> get_item(const Value& obj, const Value& key);
StatusOr<Value> get_attr(const Value& obj, std::string_view name);
// Items of an iterable: list items, dict keys, string characters; undefined is empty.
StatusOr<List> iterate(const Value& v);
// Python len(); TypeError for values without one.
StatusOr<int64_t> length_of(const Value& v);
// Python binary arithmetic for + - * / // % **.
StatusOr<Value> arithmetic(std::string_view op, const Value& a, const Value& b, const Renderer& r);
// Python's printf-style "fmt % args" (%s %r %d %i %f %x %%, with width and precision).
StatusOr<Value> printf_format(const std::string& fmt, const List& args, const Renderer& r);
// Python "a in b".
StatusOr<bool> contains(const Value& container, const Value& item);

}  // namespace strata::jinja
