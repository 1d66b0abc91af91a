#include "tokenizer/jinja/eval.h"

#include <algorithm>
#include <cmath>
#include <memory>

namespace strata::jinja {

const Value* CallArgs::get(size_t i, std::string_view name) const {
  if (i < args.size()) return &args[i];
  for (const auto& [k, v] : kwargs) {
    if (k == name) return &v;
  }
  return nullptr;
}

Renderer::Renderer(const RenderLimits& limits, Dict globals) : limits_(limits) {
  frames_.emplace_back(std::move(globals.items));
}

Status Renderer::check_size(size_t bytes) const {
  if (bytes > limits_.max_output_bytes) {
    return resource_exhausted("template output or string exceeds {} bytes",
                              limits_.max_output_bytes);
  }
  return Status();
}

Status Renderer::charge_iterations(int64_t n) {
  iterations_ += n;
  if (n < 0 || iterations_ > limits_.max_loop_iterations) {
    return resource_exhausted("template loops exceed {} iterations", limits_.max_loop_iterations);
  }
  return Status();
}

Status Renderer::render(const NodeList& body, std::string* out) {
  out_ = out;
  return exec_list(body);
}

Status Renderer::emit(std::string_view text) {
  STRATA_RETURN_IF_ERROR(check_size(out_->size() + text.size()));
  out_->append(text);
  return Status();
}

const Value* Renderer::lookup(std::string_view name) const {
  for (auto frame = frames_.rbegin(); frame != frames_.rend(); ++frame) {
    for (const auto& [k, v] : *frame) {
      if (k == name) return &v;
    }
  }
  return nullptr;
}

void Renderer::assign(const std::string& name, Value value) {
  for (auto& [k, v] : frames_.back()) {
    if (k == name) {
      v = std::move(value);
      return;
    }
  }
  frames_.back().emplace_back(name, std::move(value));
}

Status Renderer::exec_list(const NodeList& nodes) {
  for (const NodePtr& n : nodes) {
    STRATA_RETURN_IF_ERROR(exec(*n));
    if (flow_ != Flow::kNormal) break;
  }
  return Status();
}

Status Renderer::capture(const NodeList& body, std::string* captured) {
  std::string* saved = out_;
  out_ = captured;
  Status st = exec_list(body);
  out_ = saved;
  return st;
}

Status Renderer::exec(const Node& node) {
  if (++steps_ > limits_.max_steps) {
    return resource_exhausted("template evaluation exceeds {} steps", limits_.max_steps);
  }
  switch (node.kind) {
    case NodeKind::kText:
      return emit(node.text);
    case NodeKind::kOutput: {
      STRATA_ASSIGN_OR_RETURN(Value v, eval(*node.expr));
      if (v.is_string()) return emit(v.str());
      return emit(to_output(v));
    }
    case NodeKind::kIf:
      for (const auto& [cond, body] : node.branches) {
        bool take = true;
        if (cond) {
          STRATA_ASSIGN_OR_RETURN(Value c, eval(*cond));
          take = c.truthy();
        }
        if (take) return exec_list(body);
      }
      return Status();
    case NodeKind::kFor:
      return exec_for(node);
    case NodeKind::kSet:
      return exec_set(node);
    case NodeKind::kSetBlock: {
      std::string captured;
      STRATA_RETURN_IF_ERROR(capture(node.body, &captured));
      assign(node.targets[0], Value(std::move(captured)));
      return Status();
    }
    case NodeKind::kMacro: {
      const Node* macro = &node;
      auto fn = std::make_shared<const Function>(Function{
          node.text, [macro](Renderer& r, CallArgs& a) { return r.call_macro(*macro, a); }});
      assign(node.text, Value(std::move(fn)));
      return Status();
    }
    case NodeKind::kBreak:
    case NodeKind::kContinue:
      if (loop_depth_ == 0) {
        return invalid_argument("line {}: '{}' outside of a loop", node.line,
                                node.kind == NodeKind::kBreak ? "break" : "continue");
      }
      flow_ = node.kind == NodeKind::kBreak ? Flow::kBreak : Flow::kContinue;
      return Status();
    case NodeKind::kScope:
      return exec_list(node.body);
    case NodeKind::kFilterBlock: {
      std::string captured;
      STRATA_RETURN_IF_ERROR(capture(node.body, &captured));
      CallArgs args;
      STRATA_RETURN_IF_ERROR(eval_args(*node.expr, 1, args));
      STRATA_ASSIGN_OR_RETURN(
          Value v, apply_filter(node.expr->name, Value(std::move(captured)), args, node.line));
      return emit(to_output(v));
    }
  }
  return Status();
}

namespace {

Status unpack(const std::vector<std::string>& targets, const Value& item,
              std::vector<std::pair<std::string, Value>>& out, int line) {
  if (targets.size() == 1) {
    out.emplace_back(targets[0], item);
    return Status();
  }
  STRATA_ASSIGN_OR_RETURN(List parts, iterate(item));
  if (parts.size() != targets.size()) {
    return invalid_argument("line {}: cannot unpack {} values into {} names", line, parts.size(),
                            targets.size());
  }
  for (size_t i = 0; i < parts.size(); ++i) out.emplace_back(targets[i], std::move(parts[i]));
  return Status();
}

}  // namespace

Status Renderer::exec_for(const Node& node) {
  STRATA_ASSIGN_OR_RETURN(Value seq, eval(*node.expr));
  List owned;
  const List* items = nullptr;
  if (seq.is_list() && !node.filter) {
    items = &seq.list();
  } else {
    STRATA_ASSIGN_OR_RETURN(List all, iterate(seq));
    if (!node.filter) {
      owned = std::move(all);
    } else {
      for (Value& item : all) {  // "for x in xs if cond": loop.* counts only the kept items
        STRATA_RETURN_IF_ERROR(charge_iterations(1));
        frames_.emplace_back();
        STRATA_RETURN_IF_ERROR(unpack(node.targets, item, frames_.back(), node.line));
        STRATA_ASSIGN_OR_RETURN(Value keep, eval(*node.filter));
        frames_.pop_back();
        if (keep.truthy()) owned.push_back(std::move(item));
      }
    }
    items = &owned;
  }
  const int64_t n = static_cast<int64_t>(items->size());
  if (n == 0) {
    frames_.emplace_back();
    STRATA_RETURN_IF_ERROR(exec_list(node.else_body));
    frames_.pop_back();
    return Status();
  }
  auto index0 = std::make_shared<int64_t>(0);
  Value cycle(std::make_shared<const Function>(
      Function{"loop.cycle", [index0](Renderer&, CallArgs& a) -> StatusOr<Value> {
                 if (a.args.empty())
                   return invalid_argument("loop.cycle() needs at least one argument");
                 return a.args[*index0 % static_cast<int64_t>(a.args.size())];
               }}));
  ++loop_depth_;
  for (int64_t i = 0; i < n; ++i) {
    STRATA_RETURN_IF_ERROR(charge_iterations(1));
    *index0 = i;
    frames_.emplace_back();
    Frame& frame = frames_.back();
    STRATA_RETURN_IF_ERROR(unpack(node.targets, (*items)[i], frame, node.line));
    Dict loop;
    loop.items = {{"index", Value(i + 1)},
                  {"index0", Value(i)},
                  {"revindex", Value(n - i)},
                  {"revindex0", Value(n - i - 1)},
                  {"first", Value(i == 0)},
                  {"last", Value(i == n - 1)},
                  {"length", Value(n)},
                  {"depth", Value(1)},
                  {"depth0", Value(0)},
                  {"previtem", i > 0 ? (*items)[i - 1] : Value()},
                  {"nextitem", i + 1 < n ? (*items)[i + 1] : Value()},
                  {"cycle", cycle}};
    frame.emplace_back("loop", Value(std::move(loop)));
    STRATA_RETURN_IF_ERROR(exec_list(node.body));
    frames_.pop_back();
    if (flow_ == Flow::kBreak) {
      flow_ = Flow::kNormal;
      break;
    }
    flow_ = Flow::kNormal;
  }
  --loop_depth_;
  return Status();
}

Status Renderer::exec_set(const Node& node) {
  STRATA_ASSIGN_OR_RETURN(Value v, eval(*node.expr));
  if (!node.attr.empty()) {
    const Value* target = lookup(node.targets[0]);
    if (target == nullptr || !target->is_namespace()) {
      return invalid_argument(
          "line {}: cannot assign attribute '{}' on '{}', which is not a namespace()", node.line,
          node.attr, node.targets[0]);
    }
    Namespace& ns = target->ns();
    if (v.depth() + 1 > Value::kMaxDepth) {
      return resource_exhausted("line {}: values nest deeper than {}", node.line, Value::kMaxDepth);
    }
    ns.depth = std::max(ns.depth, v.depth() + 1);
    ns.attrs.set(node.attr, std::move(v));
    return Status();
  }
  std::vector<std::pair<std::string, Value>> bound;
  STRATA_RETURN_IF_ERROR(unpack(node.targets, v, bound, node.line));
  for (auto& [name, value] : bound) assign(name, std::move(value));
  return Status();
}

StatusOr<Value> Renderer::call_macro(const Node& macro, CallArgs& args) {
  if (call_depth_ + 1 > limits_.max_call_depth) {
    return resource_exhausted("macro calls nest deeper than {}", limits_.max_call_depth);
  }
  if (args.args.size() > macro.targets.size()) {
    return invalid_argument("macro '{}' takes at most {} arguments, got {}", macro.text,
                            macro.targets.size(), args.args.size());
  }
  for (const auto& [k, v] : args.kwargs) {
    if (std::find(macro.targets.begin(), macro.targets.end(), k) == macro.targets.end()) {
      return invalid_argument("macro '{}' has no parameter '{}'", macro.text, k);
    }
  }
  // A macro sees the template's globals and its own parameters, not its caller's locals.
  std::vector<Frame> saved(std::make_move_iterator(frames_.begin() + 1),
                           std::make_move_iterator(frames_.end()));
  frames_.resize(1);
  frames_.emplace_back();
  int saved_loop_depth = loop_depth_;
  loop_depth_ = 0;
  ++call_depth_;
  Status st;
  for (size_t i = 0; i < macro.targets.size() && st.ok(); ++i) {
    const Value* given = args.get(i, macro.targets[i]);
    if (given != nullptr) {
      assign(macro.targets[i], *given);
    } else if (macro.defaults[i]) {
      StatusOr<Value> def = eval(*macro.defaults[i]);
      if (def.ok()) {
        assign(macro.targets[i], std::move(def).value());
      } else {
        st = def.status();
      }
    } else {
      assign(macro.targets[i], Value());
    }
  }
  std::string captured;
  if (st.ok()) st = capture(macro.body, &captured);
  --call_depth_;
  loop_depth_ = saved_loop_depth;
  flow_ = Flow::kNormal;
  frames_.resize(1);
  for (Frame& f : saved) frames_.push_back(std::move(f));
  STRATA_RETURN_IF_ERROR(st);
  return Value(std::move(captured));
}

Status Renderer::eval_args(const Expr& e, size_t first, CallArgs& args) {
  for (size_t i = first; i < e.children.size(); ++i) {
    STRATA_ASSIGN_OR_RETURN(Value v, eval(*e.children[i]));
    args.args.push_back(std::move(v));
  }
  for (const auto& [k, expr] : e.kwargs) {
    STRATA_ASSIGN_OR_RETURN(Value v, eval(*expr));
    args.kwargs.emplace_back(k, std::move(v));
  }
  return Status();
}

StatusOr<Value> Renderer::eval(const Expr& e) {
  if (++steps_ > limits_.max_steps) {
    return resource_exhausted("template evaluation exceeds {} steps", limits_.max_steps);
  }
  switch (e.kind) {
    case ExprKind::kLiteral:
      return e.literal;
    case ExprKind::kName: {
      const Value* v = lookup(e.name);
      return v != nullptr ? *v : builtin_global(e.name);
    }
    case ExprKind::kGetAttr: {
      STRATA_ASSIGN_OR_RETURN(Value obj, eval(*e.children[0]));
      return get_attr(obj, e.name);
    }
    case ExprKind::kGetItem: {
      STRATA_ASSIGN_OR_RETURN(Value obj, eval(*e.children[0]));
      STRATA_ASSIGN_OR_RETURN(Value key, eval(*e.children[1]));
      return get_item(obj, key);
    }
    case ExprKind::kSlice: {
      STRATA_ASSIGN_OR_RETURN(Value obj, eval(*e.children[0]));
      CallArgs args;
      for (size_t i = 1; i < 4; ++i) {
        Value part = Value::none();
        if (e.children[i]) {
          STRATA_ASSIGN_OR_RETURN(part, eval(*e.children[i]));
        }
        args.args.push_back(std::move(part));
      }
      return call_method(obj, "__slice__", args, e.line);
    }
    case ExprKind::kCall:
      return eval_call(e);
    case ExprKind::kFilter: {
      STRATA_ASSIGN_OR_RETURN(Value input, eval(*e.children[0]));
      CallArgs args;
      STRATA_RETURN_IF_ERROR(eval_args(e, 1, args));
      return apply_filter(e.name, input, args, e.line);
    }
    case ExprKind::kTest: {
      STRATA_ASSIGN_OR_RETURN(Value input, eval(*e.children[0]));
      CallArgs args;
      STRATA_RETURN_IF_ERROR(eval_args(e, 1, args));
      STRATA_ASSIGN_OR_RETURN(bool result, apply_test(e.name, input, args, e.line));
      return Value(result != e.negated);
    }
    case ExprKind::kNeg:
    case ExprKind::kPos: {
      STRATA_ASSIGN_OR_RETURN(Value v, eval(*e.children[0]));
      if (e.kind == ExprKind::kPos && v.is_number()) return v;
      if (e.kind == ExprKind::kNeg && v.is_float()) return Value(-v.as_double());
      return arithmetic(e.kind == ExprKind::kNeg ? "-" : "+", Value(0), v, *this);
    }
    case ExprKind::kNot: {
      STRATA_ASSIGN_OR_RETURN(Value v, eval(*e.children[0]));
      return Value(!v.truthy());
    }
    case ExprKind::kAnd:
    case ExprKind::kOr: {  // Python semantics: the result is one of the operands
      STRATA_ASSIGN_OR_RETURN(Value l, eval(*e.children[0]));
      if (l.truthy() == (e.kind == ExprKind::kOr)) return l;
      return eval(*e.children[1]);
    }
    case ExprKind::kBinary:
      return eval_binary(e);
    case ExprKind::kCompare:
      return eval_compare(e);
    case ExprKind::kCond: {
      STRATA_ASSIGN_OR_RETURN(Value c, eval(*e.children[0]));
      if (c.truthy()) return eval(*e.children[1]);
      if (e.children[2]) return eval(*e.children[2]);
      return Value();
    }
    case ExprKind::kList:
    case ExprKind::kDict:
      return eval_container(e);
  }
  return Value();
}

StatusOr<Value> Renderer::eval_container(const Expr& e) {
  STRATA_RETURN_IF_ERROR(charge_iterations(static_cast<int64_t>(e.children.size())));
  Value result;
  if (e.kind == ExprKind::kList) {
    List list;
    list.reserve(e.children.size());
    for (const ExprPtr& c : e.children) {
      STRATA_ASSIGN_OR_RETURN(Value v, eval(*c));
      list.push_back(std::move(v));
    }
    result = e.negated ? Value::tuple(std::move(list)) : Value(std::move(list));
  } else {
    Dict dict;
    for (size_t i = 0; i + 1 < e.children.size(); i += 2) {
      STRATA_ASSIGN_OR_RETURN(Value k, eval(*e.children[i]));
      if (!k.is_string()) {
        return invalid_argument("line {}: dict keys must be strings, got {}", e.line,
                                k.type_name());
      }
      STRATA_ASSIGN_OR_RETURN(Value v, eval(*e.children[i + 1]));
      dict.set(k.str(), std::move(v));
    }
    result = Value(std::move(dict));
  }
  if (result.depth() > Value::kMaxDepth) {
    return resource_exhausted("line {}: values nest deeper than {}", e.line, Value::kMaxDepth);
  }
  return result;
}

StatusOr<Value> Renderer::eval_call(const Expr& e) {
  const Expr& callee = *e.children[0];
  CallArgs args;
  Value fn;
  if (callee.kind == ExprKind::kGetAttr) {
    STRATA_ASSIGN_OR_RETURN(Value obj, eval(*callee.children[0]));
    STRATA_RETURN_IF_ERROR(eval_args(e, 1, args));
    if (has_method(obj, callee.name)) return call_method(obj, callee.name, args, e.line);
    STRATA_ASSIGN_OR_RETURN(fn, get_attr(obj, callee.name));
  } else {
    STRATA_ASSIGN_OR_RETURN(fn, eval(callee));
    STRATA_RETURN_IF_ERROR(eval_args(e, 1, args));
  }
  if (fn.is_function()) return fn.fn().call(*this, args);
  std::string what = callee.kind == ExprKind::kName || callee.kind == ExprKind::kGetAttr
                         ? "'" + callee.name + "'"
                         : "expression";
  if (fn.is_undefined())
    return invalid_argument("line {}: {} is undefined, cannot call it", e.line, what);
  return invalid_argument("line {}: {} ({}) is not callable", e.line, what, fn.type_name());
}

StatusOr<Value> Renderer::eval_binary(const Expr& e) {
  STRATA_ASSIGN_OR_RETURN(Value l, eval(*e.children[0]));
  STRATA_ASSIGN_OR_RETURN(Value r, eval(*e.children[1]));
  if (e.name == "~") {
    std::string a = to_output(l);
    std::string b = to_output(r);
    STRATA_RETURN_IF_ERROR(check_size(a.size() + b.size()));
    return Value(a + b);
  }
  StatusOr<Value> v = arithmetic(e.name, l, r, *this);
  if (!v.ok()) return v.status().with_context("line {}", e.line);
  return v;
}

StatusOr<Value> Renderer::eval_compare(const Expr& e) {
  STRATA_ASSIGN_OR_RETURN(Value left, eval(*e.children[0]));
  for (size_t i = 0; i < e.ops.size(); ++i) {
    STRATA_ASSIGN_OR_RETURN(Value right, eval(*e.children[i + 1]));
    const std::string& op = e.ops[i];
    bool ok = false;
    if (op == "==" || op == "!=") {
      ok = equals(left, right) == (op == "==");
    } else if (op == "in" || op == "not in") {
      STRATA_ASSIGN_OR_RETURN(bool in, contains(right, left));
      ok = in == (op == "in");
    } else {
      const bool swap = op == ">" || op == "<=";
      StatusOr<bool> lt = swap ? less_than(right, left) : less_than(left, right);
      if (!lt.ok()) return lt.status().with_context("line {}", e.line);
      ok = (op == "<" || op == ">") ? *lt : !*lt;
    }
    if (!ok) return Value(false);
    left = std::move(right);
  }
  return Value(true);
}

}  // namespace strata::jinja
