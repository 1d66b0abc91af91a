// Syntax tree of a parsed chat template. Built once by parse_template() and then only read, so one
// tree serves concurrent renders.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "tokenizer/jinja/lexer.h"
#include "tokenizer/jinja/value.h"

namespace strata::jinja {

enum class ExprKind {
  kLiteral,  // literal
  kName,     // name
  kGetAttr,  // children[0].name  (a.b; a.0 parses as kGetItem)
  kGetItem,  // children[0][children[1]]
  kSlice,    // children[0][children[1]:children[2]:children[3]], absent parts are null
  kCall,     // children[0](children[1..], kwargs)
  kFilter,   // children[0] | name(children[1..], kwargs); children[0] is null in {% filter %}
  kTest,     // children[0] is [not] name(children[1..], kwargs); negated for "is not"
  kNeg,      // -children[0]
  kPos,      // +children[0]
  kNot,      // not children[0]
  kBinary,   // children[0] op children[1]; op in + - * / // % ** ~
  kAnd,      // children[0] and children[1]
  kOr,       // children[0] or children[1]
  kCompare,  // children[0] ops[0] children[1] ops[1] children[2] ... (chained, like Python)
  kCond,     // children[1] if children[0] else children[2] (children[2] null: undefined)
  kList,     // [children...]; `negated` marks a tuple literal (a, b)
  kDict,     // {children[0]: children[1], children[2]: children[3], ...}
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  ExprKind kind = ExprKind::kLiteral;
  int line = 0;
  Value literal;
  std::string name;  // variable, attribute, filter, test, or operator
  std::vector<ExprPtr> children;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;  // kCompare: "==", "!=", "<", "<=", ">", ">=", "in", "not in"
  bool negated = false;
};

enum class NodeKind {
  kText,      // text
  kOutput,    // {{ expr }}
  kIf,        // branches: (condition, body); a null condition is the else branch
  kFor,       // for targets in expr [if filter]: body [else: else_body]
  kSet,       // set targets = expr, or set targets[0].attr = expr when attr is non-empty
  kSetBlock,  // set targets[0] %} body {% endset
  kMacro,     // macro text(targets = defaults...): body
  kBreak,
  kContinue,
  kScope,        // {% generation %} body: rendered in place (HF's assistant-mask marker)
  kFilterBlock,  // {% filter expr %} body: expr is a kFilter whose input is the rendered body
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using NodeList = std::vector<NodePtr>;

struct Node {
  NodeKind kind = NodeKind::kText;
  int line = 0;
  std::string text;
  ExprPtr expr;
  std::vector<std::pair<ExprPtr, NodeList>> branches;
  std::vector<std::string> targets;
  std::string attr;
  ExprPtr filter;
  NodeList body;
  NodeList else_body;
  std::vector<ExprPtr> defaults;  // kMacro: one per target, null when the parameter has none
};

// Parses a token stream from tokenize(). InvalidArgument naming the line for syntax errors,
// unknown or unclosed tags, and nesting deeper than the parser allows (hostile templates).
StatusOr<NodeList> parse_template(const std::vector<Token>& tokens);

}  // namespace strata::jinja
