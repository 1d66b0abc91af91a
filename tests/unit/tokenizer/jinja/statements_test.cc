// for / if / set / namespace / macro / filter blocks, with expected strings derived from Jinja's
// scoping rules (a for-loop iteration is its own scope; namespace() is shared by reference).
#include <gtest/gtest.h>

#include "render_helper.h"

namespace strata::testing {
namespace {

TEST(JinjaFor, LoopVariables) {
  EXPECT_EQ(render("{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ "
                   "loop.revindex0 }}"
                   "{{ loop.first }}{{ loop.last }}{{ loop.length }}|{% endfor %}",
                   {{"xs", {"a", "b"}}}),
            "1021TrueFalse2|2110FalseTrue2|");
  EXPECT_EQ(render("{% for x in [1,2,3] %}{{ loop.previtem }}-{{ loop.nextitem }},{% endfor %}"),
            "-2,1-3,2-,");
  EXPECT_EQ(render("{% for x in range(3) %}{{ loop.cycle('a', 'b') }}{% endfor %}"), "aba");
}

TEST(JinjaFor, ElseFilterAndLoopControls) {
  EXPECT_EQ(render("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% for x in nothing %}x{% else %}none{% endfor %}"), "none");
  EXPECT_EQ(render("{% for x in [1,2,3,4] if x is even %}{{ loop.index }}/{{ loop.length }}:{{ x "
                   "}},{% endfor %}"),
            "1/2:2,2/2:4,");
  EXPECT_EQ(render("{% for x in [1, 3] if x is even %}x{% else %}filtered out{% endfor %}"),
            "filtered out");
  EXPECT_EQ(render("{% for x in range(10) %}{% if x == 3 %}{% break %}{% endif %}"
                   "{% if x == 1 %}{% continue %}{% endif %}{{ x }}{% endfor %}"),
            "02");
  EXPECT_EQ(render("{% for x in [1, 2] %}{% for y in [1, 2] %}{% if y == 2 %}{% break %}{% endif %}"
                   "{{ x }}{{ y }} {% endfor %}{% endfor %}"),
            "11 21 ");
}

TEST(JinjaFor, IteratesDictsStringsAndUnpacks) {
  EXPECT_EQ(render("{% for k in {'a': 1, 'b': 2} %}{{ k }}{% endfor %}"), "ab");
  EXPECT_EQ(render("{% for c in 'h\xc3\xa9' %}[{{ c }}]{% endfor %}"), "[h][\xc3\xa9]");
  EXPECT_EQ(render("{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }},{% endfor %}"), "3,7,");
  EXPECT_EQ(render("{% for (a, b) in [(1, 2)] %}{{ a }}{{ b }}{% endfor %}"), "12");
}

TEST(JinjaScope, LoopIterationsDoNotLeak) {
  EXPECT_EQ(
      render(
          "{% set x = 1 %}{% for i in range(2) %}{% set x = x + 10 %}{{ x }},{% endfor %}{{ x }}"),
      "11,11,1");
  EXPECT_EQ(render("{% for i in [1] %}{% set inner = 5 %}{% endfor %}[{{ inner }}]"), "[]");
  EXPECT_EQ(render("{% if true %}{% set y = 5 %}{% endif %}{{ y }}"), "5");  // if is not a scope
  EXPECT_EQ(
      render("{% set messages = messages[1:] %}{{ messages | length }}", {{"messages", {1, 2, 3}}}),
      "2");
}

TEST(JinjaSet, TuplesBlocksAndNamespaces) {
  EXPECT_EQ(render("{% set a, b = 1, 2 %}{{ a }}{{ b }}"), "12");
  EXPECT_EQ(render("{% set s %}a{{ 1 }}b{% endset %}[{{ s }}]"), "[a1b]");
  EXPECT_EQ(render("{% set ns = namespace(found=false, n=0) %}{% for x in [1,2,3] %}{% set ns.n = "
                   "ns.n + x %}"
                   "{% if x == 2 %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.found }} "
                   "{{ ns.n }}"),
            "True 6");
  EXPECT_EQ(render("{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }}[{{ ns.c }}]"),
            "12[]");
  EXPECT_EQ(render("{% set d = dict(a=1) %}{{ d.a }}"), "1");
}

TEST(JinjaMacro, CallsDefaultsAndGlobals) {
  EXPECT_EQ(
      render("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}"
             "{{ greet('Bob') }} {{ greet('Al', punct='?') }} {{ greet(punct='.', name='Cy') }}"),
      "Hi Bob! Hi Al? Hi Cy.");
  EXPECT_EQ(render("{% macro m() %}{{ who }}{% endmacro %}{{ m() }}", {{"who", "W"}}), "W");
  EXPECT_EQ(render("{% macro m(x) %}\n[{{ x }}]\n{% endmacro %}{{ m(1) }}"), "[1]\n");
  // Macros see globals, not the caller's loop variables.
  EXPECT_EQ(render("{% macro m() %}[{{ i }}]{% endmacro %}{% for i in [1] %}{{ m() }}{% endfor %}"),
            "[]");
  EXPECT_EQ(render("{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1) | int }}{% "
                   "endif %}{% endmacro %}"
                   "{{ fact(5) }}"),
            "120");
}

TEST(JinjaBlocks, FilterGenerationRaw) {
  EXPECT_EQ(render("{% filter upper %}abc{{ 'd' }}{% endfilter %}"), "ABCD");
  EXPECT_EQ(render("{% filter replace('a', 'b') %}aaa{% endfilter %}"), "bbb");
  EXPECT_EQ(render("{% generation %}x{% endgeneration %}"), "x");
  EXPECT_EQ(render("{% raw %}{{ x }}{% endraw %}\ny"), "{{ x }}y");
}

TEST(JinjaContext, HuggingFaceDefaults) {
  // tools and documents are None (defined) unless given; add_generation_prompt is a bool.
  EXPECT_EQ(
      render(
          "{{ tools is defined }} {{ tools is none }} {{ documents }} {{ add_generation_prompt }}"),
      "True True None False");
  EXPECT_EQ(render("{{ add_generation_prompt }}", ojson::object(), true), "True");
  EXPECT_EQ(render("{{ tools | length }}", {{"tools", {{{"type", "function"}}}}}), "1");
}

TEST(JinjaContext, StrftimeNow) {
  std::string year = render("{{ strftime_now('%Y') }}");
  ASSERT_EQ(year.size(), 4u);
  EXPECT_GE(std::stoi(year), 2024);
}

}  // namespace
}  // namespace strata::testing
