// Recursive-descent parser with Jinja's grammar and precedence:
//   condexpr (a if c else b) < or < and < not < compare < + - < ~ < * / // % < ** < unary -
//   < filters/tests (x|f, x is t) < postfix (a.b, a[i], a[i:j], f()) < primary.
#include <algorithm>
#include <initializer_list>
#include <set>

#include "tokenizer/jinja/ast.h"

namespace strata::jinja {
namespace {

constexpr int kMaxNesting = 200;  // expression and block nesting; deeper is refused, not overflowed

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : toks_(tokens) {}

  StatusOr<NodeList> parse_root() {
    NodeList nodes;
    std::string end;
    STRATA_RETURN_IF_ERROR(parse_body({}, nodes, end));
    return nodes;
  }

 private:
  // ---- token helpers ----
  const Token& cur() const { return toks_[pos_]; }
  const Token& peek(size_t n = 1) const { return toks_[std::min(pos_ + n, toks_.size() - 1)]; }
  bool at_op(std::string_view op) const { return cur().type == TokenType::kOp && cur().text == op; }
  bool at_name(std::string_view name) const {
    return cur().type == TokenType::kName && cur().text == name;
  }
  void advance() {
    if (pos_ + 1 < toks_.size()) ++pos_;
  }
  bool skip_op(std::string_view op) {
    if (!at_op(op)) return false;
    advance();
    return true;
  }
  bool skip_name(std::string_view name) {
    if (!at_name(name)) return false;
    advance();
    return true;
  }
  std::string describe(const Token& t) const {
    switch (t.type) {
      case TokenType::kText:
        return "template text";
      case TokenType::kVarBegin:
        return "'{{'";
      case TokenType::kVarEnd:
        return "'}}'";
      case TokenType::kBlockBegin:
        return "'{%'";
      case TokenType::kBlockEnd:
        return "'%}'";
      case TokenType::kEof:
        return "end of template";
      case TokenType::kString:
        return "string";
      case TokenType::kInt:
      case TokenType::kFloat:
        return "number";
      default:
        return "'" + t.text + "'";
    }
  }
  Status error(std::string_view what) const {
    return invalid_argument("line {}: {} (at {})", cur().line, what, describe(cur()));
  }
  Status expect_op(std::string_view op) {
    if (!skip_op(op)) return error(fmt::format("expected '{}'", op));
    return Status();
  }
  Status expect_block_end() {
    if (cur().type != TokenType::kBlockEnd) return error("expected '%}'");
    advance();
    return Status();
  }
  StatusOr<std::string> expect_name() {
    if (cur().type != TokenType::kName) return error("expected a name");
    std::string name = cur().text;
    advance();
    return name;
  }

  ExprPtr make(ExprKind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  // ---- statements ----

  // Parses nodes until a block tag whose name is in `ends` (consumed up to and including that name,
  // which is returned in `end`), or the end of the template when `ends` is empty.
  Status parse_body(std::initializer_list<std::string_view> ends, NodeList& out, std::string& end) {
    if (++depth_ > kMaxNesting) return error("blocks nest too deeply");
    while (true) {
      const Token& t = cur();
      if (t.type == TokenType::kEof) {
        if (ends.size() == 0) break;
        std::string names;
        for (auto e : ends) names += (names.empty() ? "'" : " or '") + std::string(e) + "'";
        return invalid_argument("line {}: unexpected end of template, expected {}", t.line, names);
      }
      if (t.type == TokenType::kText) {
        auto n = std::make_unique<Node>();
        n->kind = NodeKind::kText;
        n->text = t.text;
        n->line = t.line;
        out.push_back(std::move(n));
        advance();
        continue;
      }
      if (t.type == TokenType::kVarBegin) {
        advance();
        auto n = std::make_unique<Node>();
        n->kind = NodeKind::kOutput;
        n->line = t.line;
        STRATA_ASSIGN_OR_RETURN(n->expr, parse_tuple(true, {}));
        if (cur().type != TokenType::kVarEnd) return error("expected '}}'");
        advance();
        out.push_back(std::move(n));
        continue;
      }
      if (t.type != TokenType::kBlockBegin) return error("unexpected token");
      advance();
      if (cur().type == TokenType::kName) {
        for (auto e : ends) {
          if (cur().text == e) {
            end = cur().text;
            advance();
            --depth_;
            return Status();
          }
        }
      }
      STRATA_ASSIGN_OR_RETURN(NodePtr n, parse_statement());
      out.push_back(std::move(n));
    }
    --depth_;
    return Status();
  }

  StatusOr<NodePtr> parse_statement() {
    if (cur().type != TokenType::kName) return error("expected a tag name");
    std::string tag = cur().text;
    int line = cur().line;
    advance();
    auto n = std::make_unique<Node>();
    n->line = line;
    if (tag == "if") {
      STRATA_RETURN_IF_ERROR(parse_if(*n));
    } else if (tag == "for") {
      STRATA_RETURN_IF_ERROR(parse_for(*n));
    } else if (tag == "set") {
      STRATA_RETURN_IF_ERROR(parse_set(*n));
    } else if (tag == "macro") {
      STRATA_RETURN_IF_ERROR(parse_macro(*n));
    } else if (tag == "break" || tag == "continue") {
      n->kind = tag == "break" ? NodeKind::kBreak : NodeKind::kContinue;
      STRATA_RETURN_IF_ERROR(expect_block_end());
    } else if (tag == "generation") {
      n->kind = NodeKind::kScope;
      STRATA_RETURN_IF_ERROR(expect_block_end());
      std::string end;
      STRATA_RETURN_IF_ERROR(parse_body({"endgeneration"}, n->body, end));
      STRATA_RETURN_IF_ERROR(expect_block_end());
    } else if (tag == "filter") {
      n->kind = NodeKind::kFilterBlock;
      STRATA_ASSIGN_OR_RETURN(n->expr, parse_filter(nullptr));
      STRATA_RETURN_IF_ERROR(expect_block_end());
      std::string end;
      STRATA_RETURN_IF_ERROR(parse_body({"endfilter"}, n->body, end));
      STRATA_RETURN_IF_ERROR(expect_block_end());
    } else {
      --pos_;
      return error(fmt::format("unknown or unexpected tag '{}'", tag));
    }
    return n;
  }

  Status parse_if(Node& n) {
    n.kind = NodeKind::kIf;
    std::string end = "elif";
    while (end == "elif") {
      STRATA_ASSIGN_OR_RETURN(ExprPtr cond, parse_tuple(false, {}));
      STRATA_RETURN_IF_ERROR(expect_block_end());
      NodeList body;
      STRATA_RETURN_IF_ERROR(parse_body({"elif", "else", "endif"}, body, end));
      n.branches.emplace_back(std::move(cond), std::move(body));
    }
    if (end == "else") {
      STRATA_RETURN_IF_ERROR(expect_block_end());
      NodeList body;
      STRATA_RETURN_IF_ERROR(parse_body({"endif"}, body, end));
      n.branches.emplace_back(nullptr, std::move(body));
    }
    return expect_block_end();
  }

  // Names to assign: "x", "a, b" or "(a, b)".
  Status parse_targets(std::vector<std::string>& targets) {
    bool parens = skip_op("(");
    do {
      STRATA_ASSIGN_OR_RETURN(std::string name, expect_name());
      targets.push_back(std::move(name));
    } while (skip_op(",") && cur().type == TokenType::kName);
    if (parens) STRATA_RETURN_IF_ERROR(expect_op(")"));
    return Status();
  }

  Status parse_for(Node& n) {
    n.kind = NodeKind::kFor;
    STRATA_RETURN_IF_ERROR(parse_targets(n.targets));
    if (!skip_name("in")) return error("expected 'in' in for loop");
    STRATA_ASSIGN_OR_RETURN(n.expr, parse_tuple(false, {"recursive", "if"}));
    if (skip_name("if")) {
      STRATA_ASSIGN_OR_RETURN(n.filter, parse_expression(true));
    }
    if (at_name("recursive")) return error("recursive loops are not supported");
    STRATA_RETURN_IF_ERROR(expect_block_end());
    std::string end;
    STRATA_RETURN_IF_ERROR(parse_body({"else", "endfor"}, n.body, end));
    if (end == "else") {
      STRATA_RETURN_IF_ERROR(expect_block_end());
      STRATA_RETURN_IF_ERROR(parse_body({"endfor"}, n.else_body, end));
    }
    return expect_block_end();
  }

  Status parse_set(Node& n) {
    n.kind = NodeKind::kSet;
    if (cur().type == TokenType::kName && peek().type == TokenType::kOp && peek().text == ".") {
      n.targets.push_back(cur().text);
      advance();
      advance();
      STRATA_ASSIGN_OR_RETURN(n.attr, expect_name());
    } else {
      STRATA_RETURN_IF_ERROR(parse_targets(n.targets));
    }
    if (skip_op("=")) {
      STRATA_ASSIGN_OR_RETURN(n.expr, parse_tuple(true, {}));
      return expect_block_end();
    }
    if (n.targets.size() != 1 || !n.attr.empty()) return error("expected '=' in set");
    n.kind = NodeKind::kSetBlock;
    STRATA_RETURN_IF_ERROR(expect_block_end());
    std::string end;
    STRATA_RETURN_IF_ERROR(parse_body({"endset"}, n.body, end));
    return expect_block_end();
  }

  Status parse_macro(Node& n) {
    n.kind = NodeKind::kMacro;
    STRATA_ASSIGN_OR_RETURN(n.text, expect_name());
    STRATA_RETURN_IF_ERROR(expect_op("("));
    while (!at_op(")")) {
      if (!n.targets.empty()) STRATA_RETURN_IF_ERROR(expect_op(","));
      if (at_op(")")) break;
      STRATA_ASSIGN_OR_RETURN(std::string param, expect_name());
      n.targets.push_back(std::move(param));
      ExprPtr def;
      if (skip_op("=")) {
        STRATA_ASSIGN_OR_RETURN(def, parse_expression(true));
      }
      n.defaults.push_back(std::move(def));
    }
    advance();
    STRATA_RETURN_IF_ERROR(expect_block_end());
    std::string end;
    STRATA_RETURN_IF_ERROR(parse_body({"endmacro"}, n.body, end));
    return expect_block_end();
  }

  // ---- expressions ----

  bool is_tuple_end(std::initializer_list<std::string_view> extra_ends) const {
    TokenType t = cur().type;
    if (t == TokenType::kVarEnd || t == TokenType::kBlockEnd || t == TokenType::kEof) return true;
    if (at_op(")")) return true;
    for (auto e : extra_ends) {
      if (at_name(e)) return true;
    }
    return false;
  }

  // "a" or "a, b" (a tuple, evaluated as a list).
  StatusOr<ExprPtr> parse_tuple(bool with_condexpr,
                                std::initializer_list<std::string_view> extra_ends) {
    int line = cur().line;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty() && !skip_op(",")) break;
      if (is_tuple_end(extra_ends)) break;
      STRATA_ASSIGN_OR_RETURN(ExprPtr e, parse_expression(with_condexpr));
      items.push_back(std::move(e));
      if (at_op(",")) is_tuple = true;
    }
    if (!is_tuple) {
      if (items.empty()) return error("expected an expression");
      return std::move(items[0]);
    }
    ExprPtr list = make(ExprKind::kList, line);
    list->negated = true;  // a tuple
    list->children = std::move(items);
    return list;
  }

  StatusOr<ExprPtr> parse_expression(bool with_condexpr) {
    if (++depth_ > kMaxNesting) return error("expression nests too deeply");
    StatusOr<ExprPtr> e = with_condexpr ? parse_condexpr() : parse_or();
    --depth_;
    return e;
  }

  StatusOr<ExprPtr> parse_condexpr() {
    STRATA_ASSIGN_OR_RETURN(ExprPtr e, parse_or());
    while (at_name("if")) {
      int line = cur().line;
      advance();
      ExprPtr cond = make(ExprKind::kCond, line);
      STRATA_ASSIGN_OR_RETURN(ExprPtr test, parse_or());
      cond->children.push_back(std::move(test));
      cond->children.push_back(std::move(e));
      if (skip_name("else")) {
        STRATA_ASSIGN_OR_RETURN(ExprPtr other, parse_expression(true));
        cond->children.push_back(std::move(other));
      } else {
        cond->children.push_back(nullptr);
      }
      e = std::move(cond);
    }
    return e;
  }

  StatusOr<ExprPtr> binary(ExprKind kind, std::string op, ExprPtr l, ExprPtr r, int line) {
    ExprPtr e = make(kind, line);
    e->name = std::move(op);
    e->children.push_back(std::move(l));
    e->children.push_back(std::move(r));
    return e;
  }

  StatusOr<ExprPtr> parse_or() {
    STRATA_ASSIGN_OR_RETURN(ExprPtr e, parse_and());
    while (at_name("or")) {
      int line = cur().line;
      advance();
      STRATA_ASSIGN_OR_RETURN(ExprPtr r, parse_and());
      STRATA_ASSIGN_OR_RETURN(e, binary(ExprKind::kOr, "or", std::move(e), std::move(r), line));
    }
    return e;
  }

  StatusOr<ExprPtr> parse_and() {
    STRATA_ASSIGN_OR_RETURN(ExprPtr e, parse_not());
    while (at_name("and")) {
      int line = cur().line;
      advance();
      STRATA_ASSIGN_OR_RETURN(ExprPtr r, parse_not());
      STRATA_ASSIGN_OR_RETURN(e, binary(ExprKind::kAnd, "and", std::move(e), std::move(r), line));
    }
    return e;
  }

  StatusOr<ExprPtr> parse_not() {
    if (at_name("not")) {
      int line = cur().line;
      advance();
      if (++depth_ > kMaxNesting) return error("expression nests too deeply");
      ExprPtr e = make(ExprKind::kNot, line);
      STRATA_ASSIGN_OR_RETURN(ExprPtr inner, parse_not());
      --depth_;
      e->children.push_back(std::move(inner));
      return e;
    }
    return parse_compare();
  }

  StatusOr<ExprPtr> parse_compare() {
    int line = cur().line;
    STRATA_ASSIGN_OR_RETURN(ExprPtr first, parse_math1());
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (cur().type == TokenType::kOp &&
          (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == "<=" ||
           cur().text == ">" || cur().text == ">=")) {
        op = cur().text;
        advance();
      } else if (at_name("in")) {
        op = "in";
        advance();
      } else if (at_name("not") && peek().type == TokenType::kName && peek().text == "in") {
        op = "not in";
        advance();
        advance();
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(ExprKind::kCompare, line);
        cmp->children.push_back(std::move(first));
      }
      STRATA_ASSIGN_OR_RETURN(ExprPtr r, parse_math1());
      cmp->ops.push_back(op);
      cmp->children.push_back(std::move(r));
    }
    return cmp ? std::move(cmp) : std::move(first);
  }

  // Left-associative binary levels: + -, then ~, then * / // %, then **.
  StatusOr<ExprPtr> parse_binary_level(int level) {
    static const std::vector<std::vector<std::string>> kLevels = {
        {"+", "-"}, {"~"}, {"*", "/", "//", "%"}, {"**"}};
    auto next = [&]() -> StatusOr<ExprPtr> {
      return level + 1 < static_cast<int>(kLevels.size()) ? parse_binary_level(level + 1)
                                                          : parse_unary(true);
    };
    STRATA_ASSIGN_OR_RETURN(ExprPtr e, next());
    while (cur().type == TokenType::kOp) {
      const auto& ops = kLevels[level];
      if (std::find(ops.begin(), ops.end(), cur().text) == ops.end()) break;
      std::string op = cur().text;
      int line = cur().line;
      advance();
      STRATA_ASSIGN_OR_RETURN(ExprPtr r, next());
      STRATA_ASSIGN_OR_RETURN(e, binary(ExprKind::kBinary, op, std::move(e), std::move(r), line));
    }
    return e;
  }
  StatusOr<ExprPtr> parse_math1() { return parse_binary_level(0); }

  StatusOr<ExprPtr> parse_unary(bool with_filter) {
    ExprPtr e;
    if (at_op("-") || at_op("+")) {
      int line = cur().line;
      ExprKind kind = at_op("-") ? ExprKind::kNeg : ExprKind::kPos;
      advance();
      if (++depth_ > kMaxNesting) return error("expression nests too deeply");
      STRATA_ASSIGN_OR_RETURN(ExprPtr inner, parse_unary(false));
      --depth_;
      e = make(kind, line);
      e->children.push_back(std::move(inner));
    } else {
      STRATA_ASSIGN_OR_RETURN(e, parse_primary());
    }
    STRATA_ASSIGN_OR_RETURN(e, parse_postfix(std::move(e)));
    if (!with_filter) return e;
    while (true) {
      if (at_op("|")) {
        advance();
        STRATA_ASSIGN_OR_RETURN(e, parse_filter(std::move(e)));
      } else if (at_name("is")) {
        advance();
        STRATA_ASSIGN_OR_RETURN(e, parse_test(std::move(e)));
      } else if (at_op("(")) {
        STRATA_ASSIGN_OR_RETURN(e, parse_call(std::move(e)));
      } else {
        break;
      }
    }
    return e;
  }

  StatusOr<std::string> parse_dotted_name() {
    STRATA_ASSIGN_OR_RETURN(std::string name, expect_name());
    while (at_op(".") && peek().type == TokenType::kName) {
      advance();
      name += "." + cur().text;
      advance();
    }
    return name;
  }

  StatusOr<ExprPtr> parse_filter(ExprPtr input) {
    ExprPtr e = make(ExprKind::kFilter, cur().line);
    STRATA_ASSIGN_OR_RETURN(e->name, parse_dotted_name());
    e->children.push_back(std::move(input));
    if (at_op("(")) STRATA_RETURN_IF_ERROR(parse_call_args(*e));
    return e;
  }

  StatusOr<ExprPtr> parse_test(ExprPtr input) {
    ExprPtr e = make(ExprKind::kTest, cur().line);
    e->negated = skip_name("not");
    STRATA_ASSIGN_OR_RETURN(e->name, parse_dotted_name());
    e->children.push_back(std::move(input));
    static const std::set<std::string, std::less<>> kNotAnArg = {"else", "or", "and", "if",
                                                                 "not",  "in", "is"};
    TokenType t = cur().type;
    if (at_op("(")) {
      STRATA_RETURN_IF_ERROR(parse_call_args(*e));
    } else if ((t == TokenType::kName && !kNotAnArg.count(cur().text)) || t == TokenType::kString ||
               t == TokenType::kInt || t == TokenType::kFloat || at_op("[") || at_op("{")) {
      // "x is divisibleby 3": one argument without parentheses.
      STRATA_ASSIGN_OR_RETURN(ExprPtr arg, parse_primary());
      STRATA_ASSIGN_OR_RETURN(arg, parse_postfix(std::move(arg)));
      e->children.push_back(std::move(arg));
    }
    return e;
  }

  StatusOr<ExprPtr> parse_call(ExprPtr callee) {
    ExprPtr e = make(ExprKind::kCall, cur().line);
    e->children.push_back(std::move(callee));
    STRATA_RETURN_IF_ERROR(parse_call_args(*e));
    return e;
  }

  // "(a, b, key=c)" appended to e.children / e.kwargs.
  Status parse_call_args(Expr& e) {
    STRATA_RETURN_IF_ERROR(expect_op("("));
    bool first = true;
    while (!at_op(")")) {
      if (!first) STRATA_RETURN_IF_ERROR(expect_op(","));
      first = false;
      if (at_op(")")) break;
      if (at_op("*") || at_op("**")) return error("*args and **kwargs calls are not supported");
      if (cur().type == TokenType::kName && peek().type == TokenType::kOp && peek().text == "=") {
        std::string key = cur().text;
        advance();
        advance();
        STRATA_ASSIGN_OR_RETURN(ExprPtr v, parse_expression(true));
        e.kwargs.emplace_back(std::move(key), std::move(v));
      } else {
        if (!e.kwargs.empty()) return error("positional argument after keyword argument");
        STRATA_ASSIGN_OR_RETURN(ExprPtr v, parse_expression(true));
        e.children.push_back(std::move(v));
      }
    }
    advance();
    return Status();
  }

  StatusOr<ExprPtr> parse_postfix(ExprPtr e) {
    while (true) {
      if (at_op(".")) {
        int line = cur().line;
        advance();
        if (cur().type == TokenType::kName) {
          ExprPtr a = make(ExprKind::kGetAttr, line);
          a->name = cur().text;
          a->children.push_back(std::move(e));
          e = std::move(a);
        } else if (cur().type == TokenType::kInt) {
          ExprPtr a = make(ExprKind::kGetItem, line);
          ExprPtr index = make(ExprKind::kLiteral, line);
          index->literal = Value(cur().int_value);
          a->children.push_back(std::move(e));
          a->children.push_back(std::move(index));
          e = std::move(a);
        } else {
          return error("expected an attribute name after '.'");
        }
        advance();
      } else if (at_op("[")) {
        STRATA_ASSIGN_OR_RETURN(e, parse_subscript(std::move(e)));
      } else if (at_op("(")) {
        STRATA_ASSIGN_OR_RETURN(e, parse_call(std::move(e)));
      } else {
        return e;
      }
    }
  }

  StatusOr<ExprPtr> parse_subscript(ExprPtr obj) {
    int line = cur().line;
    advance();  // [
    ExprPtr parts[3];
    int n = 0;
    while (true) {
      if (!at_op(":") && !at_op("]")) {
        STRATA_ASSIGN_OR_RETURN(parts[n], parse_expression(true));
      }
      if (!at_op(":")) break;
      if (++n > 2) return error("too many ':' in slice");
      advance();
    }
    STRATA_RETURN_IF_ERROR(expect_op("]"));
    ExprPtr e = make(n == 0 ? ExprKind::kGetItem : ExprKind::kSlice, line);
    e->children.push_back(std::move(obj));
    if (n == 0) {
      if (!parts[0]) return error("empty subscript");
      e->children.push_back(std::move(parts[0]));
    } else {
      for (auto& p : parts) e->children.push_back(std::move(p));
    }
    return e;
  }

  StatusOr<ExprPtr> parse_primary() {
    const Token& t = cur();
    int line = t.line;
    ExprPtr e = make(ExprKind::kLiteral, line);
    switch (t.type) {
      case TokenType::kName:
        if (t.text == "true" || t.text == "True") {
          e->literal = Value(true);
        } else if (t.text == "false" || t.text == "False") {
          e->literal = Value(false);
        } else if (t.text == "none" || t.text == "None") {
          e->literal = Value::none();
        } else {
          e->kind = ExprKind::kName;
          e->name = t.text;
        }
        advance();
        return e;
      case TokenType::kString: {
        std::string s;
        while (cur().type == TokenType::kString) {  // 'a' 'b' is 'ab', as in Python
          s += cur().text;
          advance();
        }
        e->literal = Value(std::move(s));
        return e;
      }
      case TokenType::kInt:
        e->literal = Value(t.int_value);
        advance();
        return e;
      case TokenType::kFloat:
        e->literal = Value(t.float_value);
        advance();
        return e;
      default:
        break;
    }
    if (skip_op("(")) {
      if (skip_op(")")) {  // empty tuple
        e->kind = ExprKind::kList;
        e->negated = true;  // ()
        return e;
      }
      if (++depth_ > kMaxNesting) return error("expression nests too deeply");
      STRATA_ASSIGN_OR_RETURN(ExprPtr inner, parse_tuple(true, {}));
      --depth_;
      STRATA_RETURN_IF_ERROR(expect_op(")"));
      return inner;
    }
    if (at_op("[") || at_op("{")) {
      bool is_dict = at_op("{");
      std::string close = is_dict ? "}" : "]";
      advance();
      if (++depth_ > kMaxNesting) return error("expression nests too deeply");
      e->kind = is_dict ? ExprKind::kDict : ExprKind::kList;
      while (!at_op(close)) {
        if (!e->children.empty()) STRATA_RETURN_IF_ERROR(expect_op(","));
        if (at_op(close)) break;
        STRATA_ASSIGN_OR_RETURN(ExprPtr item, parse_expression(true));
        e->children.push_back(std::move(item));
        if (is_dict) {
          STRATA_RETURN_IF_ERROR(expect_op(":"));
          STRATA_ASSIGN_OR_RETURN(ExprPtr v, parse_expression(true));
          e->children.push_back(std::move(v));
        }
      }
      advance();
      --depth_;
      return e;
    }
    return error("unexpected token in expression");
  }

  const std::vector<Token>& toks_;
  size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace

StatusOr<NodeList> parse_template(const std::vector<Token>& tokens) {
  Parser parser(tokens);
  return parser.parse_root();
}

}  // namespace strata::jinja
