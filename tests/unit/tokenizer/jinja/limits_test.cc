// Errors users and hostile templates can cause: each must be a clear Status, never a crash,
// an out-of-memory or a hang.
#include <gtest/gtest.h>

#include <string>

#include "render_helper.h"

namespace strata::testing {
namespace {

Status render_status(const std::string& source, const ojson& ctx = ojson::object(),
                     const jinja::RenderLimits* limits = nullptr) {
  StatusOr<ChatTemplate> t = ChatTemplate::from_source(source);
  if (!t.ok()) return t.status();
  if (limits != nullptr) t->set_limits(*limits);
  StatusOr<std::string> out = t->render(ojson::array(), false, ctx);
  return out.ok() ? Status() : out.status();
}

void expect_error(const Status& st, StatusCode code, const std::string& needle) {
  EXPECT_EQ(st.code(), code) << st.to_string();
  EXPECT_NE(st.message().find(needle), std::string::npos)
      << "missing '" << needle << "' in: " << st.to_string();
}

TEST(JinjaErrors, SyntaxErrors) {
  expect_error(render_status("ab\n{{ x"), StatusCode::kInvalidArgument, "line 2: unclosed");
  expect_error(render_status("{% if x %}never closed"), StatusCode::kInvalidArgument, "'endif'");
  expect_error(render_status("{% for x in y %}"), StatusCode::kInvalidArgument, "'endfor'");
  expect_error(render_status("{# no end"), StatusCode::kInvalidArgument, "comment");
  expect_error(render_status("{{ 'abc }}"), StatusCode::kInvalidArgument, "unterminated string");
  expect_error(render_status("{% frobnicate %}"), StatusCode::kInvalidArgument, "frobnicate");
  expect_error(render_status("{% endif %}"), StatusCode::kInvalidArgument, "endif");
  expect_error(render_status("{{ 1 + }}"), StatusCode::kInvalidArgument, "line 1");
  expect_error(render_status("{{ (1 }}"), StatusCode::kInvalidArgument, "line 1");
  expect_error(render_status("{{ }}"), StatusCode::kInvalidArgument, "expected an expression");
  expect_error(render_status("{{ a ? b }}"), StatusCode::kInvalidArgument, "unexpected character");
}

TEST(JinjaErrors, RuntimeErrors) {
  expect_error(render_status("{{ x | nosuchfilter }}"), StatusCode::kInvalidArgument,
               "unknown filter 'nosuchfilter'");
  expect_error(render_status("{{ x is nosuchtest }}"), StatusCode::kInvalidArgument,
               "unknown test");
  expect_error(render_status("{{ raise_exception('bad role: ' ~ 'tool') }}"),
               StatusCode::kInvalidArgument, "bad role: tool");
  expect_error(render_status("{{ 1 + 'a' }}"), StatusCode::kInvalidArgument, "unsupported operand");
  expect_error(render_status("{{ missing + 1 }}"), StatusCode::kInvalidArgument, "undefined");
  expect_error(render_status("{{ nothing() }}"), StatusCode::kInvalidArgument,
               "'nothing' is undefined");
  expect_error(render_status("{{ 1 // 0 }}"), StatusCode::kInvalidArgument, "zero");
  expect_error(render_status("{% break %}"), StatusCode::kInvalidArgument, "outside of a loop");
  expect_error(render_status("{% set x.y = 1 %}"), StatusCode::kInvalidArgument, "namespace");
  expect_error(render_status("{{ [1].append(2) }}"), StatusCode::kInvalidArgument, "not allowed");
  expect_error(render_status("{% for a, b in [[1, 2, 3]] %}{% endfor %}"),
               StatusCode::kInvalidArgument, "unpack");
  expect_error(render_status("{{ x | tojson }}"), StatusCode::kInvalidArgument,
               "not JSON serializable");
  expect_error(render_status("{{ 1 < 'a' }}"), StatusCode::kInvalidArgument, "not supported");
  expect_error(render_status("{{ 2 ** 100 }}"), StatusCode::kOutOfRange, "overflow");
}

TEST(JinjaErrors, BadInputs) {
  StatusOr<ChatTemplate> t = ChatTemplate::from_source("x");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->render(nlohmann::json::object(), false).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(t->render(nlohmann::json::array(), false, nlohmann::json::array()).status().code(),
            StatusCode::kInvalidArgument);
  // Messages nested far deeper than any chat are refused, not recursed into.
  nlohmann::json deep = nlohmann::json::array();
  for (int i = 0; i < 1000; ++i) deep = nlohmann::json::array({deep});
  EXPECT_EQ(t->render(deep, false).status().code(), StatusCode::kInvalidArgument);
}

TEST(JinjaLimits, HugeRangeFailsFast) {
  expect_error(render_status("{% for i in range(10**9) %}x{% endfor %}"),
               StatusCode::kResourceExhausted, "range()");
  expect_error(render_status("{{ range(10**18) | length }}"), StatusCode::kResourceExhausted,
               "range()");
}

TEST(JinjaLimits, NestedLoopsHitTheIterationBudget) {
  jinja::RenderLimits limits;
  limits.max_loop_iterations = 100000;
  expect_error(
      render_status("{% for i in range(1000) %}{% for j in range(1000) %}{% for k in range(1000) %}"
                    "{% endfor %}{% endfor %}{% endfor %}",
                    ojson::object(), &limits),
      StatusCode::kResourceExhausted, "iterations");
}

TEST(JinjaLimits, StepBudget) {
  jinja::RenderLimits limits;
  limits.max_steps = 10000;
  expect_error(
      render_status("{% for i in range(100000) %}{{ i }}{% endfor %}", ojson::object(), &limits),
      StatusCode::kResourceExhausted, "steps");
}

TEST(JinjaLimits, OutputAndStringSize) {
  jinja::RenderLimits limits;
  limits.max_output_bytes = 1 << 20;
  expect_error(
      render_status("{% set s = 'x' * 100000 %}{% for i in range(1000) %}{{ s }}{% endfor %}",
                    ojson::object(), &limits),
      StatusCode::kResourceExhausted, "bytes");
  expect_error(render_status("{{ 'x' * 10**12 }}"), StatusCode::kResourceExhausted, "bytes");
  expect_error(
      render_status(
          "{% set ns = namespace(s='x') %}{% for i in range(100) %}{% set ns.s = ns.s ~ ns.s %}"
          "{% endfor %}",
          ojson::object(), &limits),
      StatusCode::kResourceExhausted, "bytes");
  expect_error(
      render_status(
          "{% set ns = namespace(s='x') %}{% for i in range(100) %}{% set ns.s = ns.s + ns.s %}"
          "{% endfor %}",
          ojson::object(), &limits),
      StatusCode::kResourceExhausted, "bytes");
  expect_error(render_status("{{ ('x' * 100000) | replace('x', 'yyyyyyyyyyyyyyyyyyyy') }}",
                             ojson::object(), &limits),
               StatusCode::kResourceExhausted, "bytes");
  expect_error(
      render_status(
          "{% set ns = namespace(l=[1]) %}{% for i in range(100) %}{% set ns.l = ns.l + ns.l %}"
          "{% endfor %}"),
      StatusCode::kResourceExhausted, "limit");
}

TEST(JinjaLimits, DeepNestingIsRefused) {
  std::string parens = std::string(5000, '(') + "1" + std::string(5000, ')');
  expect_error(render_status("{{ " + parens + " }}"), StatusCode::kInvalidArgument,
               "nests too deeply");
  std::string lists = std::string(5000, '[') + std::string(5000, ']');
  expect_error(render_status("{{ " + lists + " }}"), StatusCode::kInvalidArgument,
               "nests too deeply");
  std::string nots;
  for (int i = 0; i < 5000; ++i) nots += "not ";
  expect_error(render_status("{{ " + nots + "1 }}"), StatusCode::kInvalidArgument,
               "nests too deeply");
  std::string ifs;
  for (int i = 0; i < 5000; ++i) ifs += "{% if true %}";
  expect_error(render_status(ifs), StatusCode::kInvalidArgument, "too deeply");
  expect_error(
      render_status(
          "{% set ns = namespace(x=none) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}"
          "{% endfor %}"),
      StatusCode::kResourceExhausted, "deeper");
  expect_error(render_status("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}"),
               StatusCode::kResourceExhausted, "macro");
}

TEST(JinjaLimits, TemplateSize) {
  StatusOr<ChatTemplate> t =
      ChatTemplate::from_source(std::string(ChatTemplate::kMaxTemplateBytes + 1, 'a'));
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata::testing
