// Whitespace control, literals, operators, lookups, filters, tests and methods. Each expected
// string is derived by hand from Jinja 3 semantics under HF's settings (trim_blocks, lstrip_blocks)
// and Python's str()/repr()/json.dumps output rules.
#include <gtest/gtest.h>

#include "render_helper.h"

namespace strata::testing {
namespace {

TEST(JinjaWhitespace, TrimBlocksDropsOneNewlineAfterBlockTags) {
  EXPECT_EQ(render("{% if true %}\nx\n{% endif %}\ny"), "x\ny");
  EXPECT_EQ(render("{% if true +%}\nx{% endif %}"), "\nx");  // '+' keeps the newline
  EXPECT_EQ(render("{{ 'a' }}\nb"), "a\nb");                 // not after {{ }}
  EXPECT_EQ(render("a{# note #}\nb"), "ab");                 // comments are trimmed too
}

TEST(JinjaWhitespace, LstripBlocksOnlyBeforeBlockTagsAtLineStart) {
  EXPECT_EQ(render("  {% if true %}x{% endif %}"), "x");
  EXPECT_EQ(render("  {{ 'x' }}"), "  x");
  EXPECT_EQ(render("  {%+ if true %}x{% endif %}"), "  x");
  EXPECT_EQ(render("a  {% if true %}x{% endif %}"), "a  x");
  EXPECT_EQ(render("a\n\t {# c #}b"), "a\nb");
}

TEST(JinjaWhitespace, DashStripsAllWhitespace) {
  EXPECT_EQ(render("a  {%- if true %} b {%- endif %}"), "a b");
  EXPECT_EQ(render("{{ 'a' -}}   \n  b"), "ab");
  EXPECT_EQ(render("a \n {{- 'b' }}"), "ab");
  EXPECT_EQ(render("a {#- c -#} b"), "ab");
}

TEST(JinjaWhitespace, IndentedBlocks) {
  const std::string src =
      "{% for x in xs %}\n"
      "    {% if x %}\n"
      "        {{ x }}\n"
      "    {% endif %}\n"
      "{% endfor %}\n";
  EXPECT_EQ(render(src, {{"xs", {1, 0, 2}}}), "        1\n        2\n");
  const std::string chat =
      "{% for message in messages %}\n"
      "    {% if message.role == 'user' %}\n"
      "<user>{{ message.content }}</user>\n"
      "    {% else %}\n"
      "<bot>{{ message.content }}</bot>\n"
      "    {% endif %}\n"
      "{% endfor %}\n";
  ojson ctx = {{"messages",
                {{{"role", "user"}, {"content", "a"}}, {{"role", "assistant"}, {"content", "b"}}}}};
  EXPECT_EQ(render(chat, ctx), "<user>a</user>\n<bot>b</bot>\n");
}

TEST(JinjaWhitespace, NewlinesNormalizedAndOneTrailingNewlineDropped) {
  EXPECT_EQ(render("x\n"), "x");
  EXPECT_EQ(render("x\n\n"), "x\n");
  EXPECT_EQ(render("a\r\nb\rc"), "a\nb\nc");
  EXPECT_EQ(render("{% raw %}{{ x }}{% if %}{% endraw %}"), "{{ x }}{% if %}");
}

TEST(JinjaLiterals, PrintsLikePythonStr) {
  EXPECT_EQ(render("{{ true }} {{ False }} {{ none }} {{ None }} [{{ missing }}]"),
            "True False None None []");
  EXPECT_EQ(render("{{ 42 }} {{ 3.0 }} {{ 2.5 }} {{ 1_000 }} {{ 0x1f }}"), "42 3.0 2.5 1000 31");
  EXPECT_EQ(render("{{ 1e16 }} {{ 1e15 }} {{ 0.0001 }} {{ 0.00001 }} {{ 1.5e-7 }}"),
            "1e+16 1000000000000000.0 0.0001 1e-05 1.5e-07");
  EXPECT_EQ(render("{{ 0.1 + 0.2 }}"), "0.30000000000000004");
  EXPECT_EQ(render("{{ ['it\\'s', 'a\"b', 'x', 1, 2.0, none, true] }}"),
            "[\"it's\", 'a\"b', 'x', 1, 2.0, None, True]");
  EXPECT_EQ(render("{{ {'a': 1, 'b': [true, none], 'c': {'d': 'e'}} }}"),
            "{'a': 1, 'b': [True, None], 'c': {'d': 'e'}}");
  EXPECT_EQ(render("{{ ['a\\nb', 'tab\\t'] }}"), "['a\\nb', 'tab\\t']");
  EXPECT_EQ(render("{{ (1, 2) | length }} {{ () | length }}"), "2 0");
}

TEST(JinjaLiterals, StringEscapes) {
  EXPECT_EQ(render("{{ 'a\\nb' }}"), "a\nb");
  EXPECT_EQ(render("{{ \"q\\\"q\" }}"), "q\"q");
  EXPECT_EQ(render("{{ '\\x41\\u00e9\\U0001F600' }}"), "A\xc3\xa9\xf0\x9f\x98\x80");
  EXPECT_EQ(render("{{ '\\d' }}"), "\\d");   // unknown escapes keep their backslash
  EXPECT_EQ(render("{{ 'a' 'b' }}"), "ab");  // adjacent literals concatenate
  EXPECT_EQ(render("{{ 'multi\nline' }}"), "multi\nline");
}

TEST(JinjaOperators, Arithmetic) {
  EXPECT_EQ(render("{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 2 ** 10 }} {{ 2 ** 3 ** 2 }}"),
            "7 9 1024 64");
  EXPECT_EQ(render("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 4 / 2 }}"),
            "3 -4 1 2 3.5 2.0");
  EXPECT_EQ(
      render("{{ 1.5 + 1 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ true + 1 }} {{ -(3) }} {{ - 2.5 }}"),
      "2.5 3.0 0.5 2 -3 -2.5");
  EXPECT_EQ(render("{{ 'a' + 'b' }} {{ [1, 2] + [3] }} {{ 'ab' * 3 }} {{ 2 * [0] }}"),
            "ab [1, 2, 3] ababab [0, 0]");
  EXPECT_EQ(render("{{ 'a' ~ 1 ~ none ~ missing ~ [1] }}"), "a1None[1]");
  EXPECT_EQ(render("{{ '%s-%03d' % ('x', 7) }} {{ '%.2f' % 3.14159 }} {{ '%s' % 'solo' }}"),
            "x-007 3.14 solo");
}

TEST(JinjaOperators, ComparisonsAndLogic) {
  EXPECT_EQ(render("{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 1 == 1.0 }} {{ 'a' != 'b' }} {{ 2 >= 2 }} "
                   "{{ 'b' <= 'a' }}"),
            "True False True True True False");
  EXPECT_EQ(render("{{ [1, 2] == [1, 2] }} {{ {'a': 1} == {'a': 1} }} {{ none == none }} {{ "
                   "missing == none }}"),
            "True True True False");
  EXPECT_EQ(
      render("{{ 'a' in 'cat' }} {{ 2 not in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 'x' in missing }}"),
      "True False True False");
  EXPECT_EQ(render("{{ 0 or 'x' }} {{ 1 and 'y' }} {{ none and 1 }} {{ not 0 }} {{ not 'a' }}"),
            "x y None True False");
  EXPECT_EQ(render("{{ 'y' if 1 else 'n' }} {{ 'y' if 0 else 'n' }} [{{ 'y' if 0 }}]"), "y n []");
  EXPECT_EQ(render("{{ 'a' if false else 'b' if false else 'c' }}"), "c");
  // Filters bind tighter than + and unary minus applies before the filter, as in Jinja.
  EXPECT_EQ(render("{{ 'a' + '  b  ' | trim + 'c' }} {{ -3 | abs }} {{ not [] | length }}"),
            "abc 3 True");
}

TEST(JinjaLookups, AttributesItemsAndSlices) {
  ojson ctx = {{"m", {{"role", "user"}, {"content", "hi"}, {"items", "key!"}}}, {"xs", {1, 2, 3}}};
  EXPECT_EQ(render("{{ m.role }}{{ m['content'] }}[{{ m.missing }}][{{ m.missing.deeper }}][{{ "
                   "nope.x['y'] }}]",
                   ctx),
            "userhi[][][]");
  EXPECT_EQ(render("{{ m['items'] }}", ctx), "key!");  // m.items would be the dict method
  EXPECT_EQ(render("{{ xs[0] }}{{ xs[-1] }}[{{ xs[5] }}]{{ xs.1 }}", ctx), "13[]2");
  EXPECT_EQ(
      render("{{ xs[1:] }} {{ xs[::-1] }} {{ xs[:-1] }} {{ xs[5:] }} {{ xs[::2] }} {{ xs[-2:] }}",
             ctx),
      "[2, 3] [3, 2, 1] [1, 2] [] [1, 3] [2, 3]");
  EXPECT_EQ(render("{{ 'hello'[1:3] }} {{ 'h\xc3\xa9llo'[::-1] }} {{ 'h\xc3\xa9llo'[1] }}"),
            "el oll\xc3\xa9h \xc3\xa9");
}

TEST(JinjaTests, IsTests) {
  EXPECT_EQ(render("{{ x is defined }} {{ y is defined }} {{ y is undefined }}", {{"x", 1}}),
            "True False True");
  EXPECT_EQ(render("{{ none is none }} {{ 1 is not none }} {{ x is none }}", {{"x", nullptr}}),
            "True True True");
  EXPECT_EQ(render("{{ 'a' is string }} {{ 1 is string }} {{ {} is mapping }} {{ [] is mapping }}"),
            "True False True False");
  EXPECT_EQ(
      render("{{ [] is iterable }} {{ 'x' is iterable }} {{ 1 is iterable }} {{ [] is sequence }}"),
      "True True False True");
  EXPECT_EQ(
      render("{{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(2) }}"),
      "True True True False");
  EXPECT_EQ(render("{{ 1 is number }} {{ 1.5 is float }} {{ 1 is integer }} {{ true is boolean }} "
                   "{{ 1 is boolean }}"),
            "True True True True False");
  EXPECT_EQ(render("{{ 1 is eq 1 }} {{ 'a' is in ['a'] }} {{ 2 is gt 1 }} {{ x is true }} {{ range "
                   "is callable }}",
                   {{"x", true}}),
            "True True True True True");
  EXPECT_EQ(render("{{ 'x' if y is defined else 'z' }}"), "z");
}

TEST(JinjaFilters, Strings) {
  EXPECT_EQ(render("[{{ '  x \n' | trim }}] [{{ 'xxhixx' | trim('x') }}]"), "[x] [hi]");
  EXPECT_EQ(
      render("{{ 'hello world' | upper }} {{ 'HeLLo' | lower }} {{ 'hELLO wORLD' | capitalize }}"),
      "HELLO WORLD hello Hello world");
  EXPECT_EQ(render("{{ 'hello big-world' | title }} {{ 'aaa' | replace('a', 'b', 2) }} {{ 'ab' | "
                   "reverse }}"),
            "Hello Big-World bba ba");
  EXPECT_EQ(render("{{ '<a href=\"x\">' | e }} {{ 'x' | safe }} {{ 42 | string ~ '!' }}"),
            "&lt;a href=&#34;x&#34;&gt; x 42!");
  EXPECT_EQ(
      render(
          "{{ 'a\nb' | indent(2) }}|{{ 'a\n\nb' | indent(2, true) }}|{{ 'a\nb' | indent('> ') }}"),
      "a\n  b|  a\n\n  b|a\n> b");
  EXPECT_EQ(render("{{ '%s-%d' | format('a', 3) }} {{ 'one two  three' | wordcount }}"), "a-3 3");
}

TEST(JinjaFilters, Sequences) {
  EXPECT_EQ(render("{{ [1,2,3] | length }}{{ 'h\xc3\xa9llo' | length }}{{ {'a':1} | count }}{{ "
                   "missing | length }}"),
            "3510");
  EXPECT_EQ(render("{{ [3,1,2] | sort | join(',') }} {{ ['b','A','c'] | sort | join }} {{ [3,1,2] "
                   "| sort(reverse=true) | join('-') }}"),
            "1,2,3 Abc 3-2-1");
  EXPECT_EQ(render("{{ ['a','b'] | join(', ') }} {{ [1, none] | join('|') }}"), "a, b 1|None");
  EXPECT_EQ(render("{{ [1,2,3] | first }}{{ [1,2,3] | last }}[{{ [] | first }}]{{ 'abc' | last }}"),
            "13[]c");
  EXPECT_EQ(render("{{ 'abc' | list }} {{ range(3) | list }} {{ range(1, 10, 3) | list }} {{ "
                   "range(5, 0, -2) | list }}"),
            "['a', 'b', 'c'] [0, 1, 2] [1, 4, 7] [5, 3, 1]");
  EXPECT_EQ(render("{{ [1, 2, 1, 'a', 'A'] | unique | list }} {{ [3, 1] | max }}{{ [3, 1] | min }} "
                   "{{ [1, 2, 3] | sum }}"),
            "[1, 2, 'a'] 31 6");
  EXPECT_EQ(render("{{ [1, -2] | map('abs') | list }} {{ ['a', 'b'] | map('upper') | join }}"),
            "[1, 2] AB");
  EXPECT_EQ(render("{% for k, v in {'b': 1, 'a': 2} | dictsort %}{{ k }}={{ v }};{% endfor %}"),
            "a=2;b=1;");
  EXPECT_EQ(render("{% for k, v in d | items %}{{ k }}={{ v }};{% endfor %}",
                   {{"d", {{"x", 1}, {"y", 2}}}}),
            "x=1;y=2;");
}

TEST(JinjaFilters, SelectAndMap) {
  ojson users = ojson::parse(R"([{"name": "a", "active": true, "role": "x", "age": 3},
                                 {"name": "b", "active": false, "role": "y", "age": 1},
                                 {"name": "c", "active": true, "role": "x", "age": 2}])");
  ojson ctx = {{"users", users}};
  EXPECT_EQ(render("{{ users | selectattr('active') | map(attribute='name') | join(',') }}", ctx),
            "a,c");
  EXPECT_EQ(render("{{ users | rejectattr('active') | map(attribute='name') | join(',') }}", ctx),
            "b");
  EXPECT_EQ(render("{{ users | selectattr('role', 'equalto', 'x') | list | length }}", ctx), "2");
  EXPECT_EQ(
      render("{{ users | selectattr('name', 'in', ['b', 'c']) | map(attribute='name') | join }}",
             ctx),
      "bc");
  EXPECT_EQ(render("{{ users | sort(attribute='age') | map(attribute='name') | join }}", ctx),
            "bca");
  EXPECT_EQ(render("{{ users | map(attribute='nick', default='?') | join }}", ctx), "???");
  EXPECT_EQ(render("{{ [1, 2, 3, 4] | select('odd') | list }} {{ [0, 1, ''] | select | list }} {{ "
                   "[1, 2] | reject('even') | list }}"),
            "[1, 3] [1] [1]");
}

TEST(JinjaFilters, Numbers) {
  EXPECT_EQ(render("{{ '42' | int + 1 }} {{ '3.7' | int }} {{ 'x' | int }} {{ 'x' | int(5) }} {{ "
                   "2.9 | int }}"),
            "43 3 0 5 2");
  EXPECT_EQ(render("{{ '2.5' | float }} {{ 3 | float }} {{ 'no' | float }}"), "2.5 3.0 0.0");
  EXPECT_EQ(render("{{ 2.567 | round(2) }} {{ 2.5 | round }} {{ 3.5 | round }} {{ 3 | round }} {{ "
                   "2.1 | round(0, 'ceil') }} {{ 2.9 | round(method='floor') }}"),
            "2.57 2.0 4.0 3 3.0 2.0");
  EXPECT_EQ(render("{{ -3 | abs }} {{ -2.5 | abs }}"), "3 2.5");
}

TEST(JinjaFilters, Default) {
  EXPECT_EQ(render("{{ x | default('d') }}{{ none | default('d') }}{{ none | default('d', true) "
                   "}}{{ '' | d('e', boolean=true) }}{{ 0 | d(1) }}"),
            "dNonede0");
}

TEST(JinjaFilters, ToJsonMatchesPythonJsonDumps) {
  ojson ctx = {{"v", ojson::parse(R"({"b": [1, 2.5, "x\"y", null, true], "a": "\u00e9"})")}};
  EXPECT_EQ(render("{{ v | tojson }}", ctx),
            "{\"b\": [1, 2.5, \"x\\\"y\", null, true], \"a\": \"\xc3\xa9\"}");
  EXPECT_EQ(render("{{ v | tojson(indent=2) }}", ctx),
            "{\n  \"b\": [\n    1,\n    2.5,\n    \"x\\\"y\",\n    null,\n    true\n  ],\n  \"a\": "
            "\"\xc3\xa9\"\n}");
  EXPECT_EQ(render("{{ v | tojson(sort_keys=true) }}", ctx),
            "{\"a\": \"\xc3\xa9\", \"b\": [1, 2.5, \"x\\\"y\", null, true]}");
  EXPECT_EQ(render("{{ v | tojson(separators=(',', ':')) }}", ctx),
            "{\"b\":[1,2.5,\"x\\\"y\",null,true],\"a\":\"\xc3\xa9\"}");
  EXPECT_EQ(render("{{ v | tojson(ensure_ascii=true) }}", ctx),
            "{\"b\": [1, 2.5, \"x\\\"y\", null, true], \"a\": \"\\u00e9\"}");
  EXPECT_EQ(render("{{ 'a\\tb</\\x01' | tojson }}"),
            "\"a\\tb</\\u0001\"");  // no HTML escaping in HF's tojson
  EXPECT_EQ(
      render(
          "{{ {} | tojson(indent=2) }} {{ [] | tojson }} {{ 1.0 | tojson }} {{ none | tojson }}"),
      "{} [] 1.0 null");
  EXPECT_EQ(render("{{ '\xf0\x9f\x98\x80' | tojson(true) }}"),
            "\"\\ud83d\\ude00\"");  // HF: first positional is ensure_ascii
  EXPECT_EQ(render("{{ [1, [2]] | tojson(indent='\t') }}"), "[\n\t1,\n\t[\n\t\t2\n\t]\n]");
}

TEST(JinjaMethods, StringMethods) {
  EXPECT_EQ(render("{{ 'Hello'.startswith('He') }} {{ 'Hello'.endswith(('x', 'lo')) }} {{ "
                   "'Hello'.startswith('lo') }}"),
            "True True False");
  EXPECT_EQ(render("{{ '  a  '.strip() }}|{{ 'xxaxx'.lstrip('x') }}|{{ 'xxaxx'.rstrip('x') }}"),
            "a|axx|xxa");
  EXPECT_EQ(render("{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a,b,c'.split(',', 1) }} "
                   "{{ 'a,b,c'.rsplit(',', 1) }}"),
            "['a', 'b', '', 'c'] ['a', 'b'] ['a', 'b,c'] ['a,b', 'c']");
  EXPECT_EQ(
      render(
          "{{ 'ab'.upper() }}{{ 'AB'.lower() }}{{ 'a-b'.replace('-', '+') }}{{ 'a b'.title() }}"),
      "ABaba+bA B");
  EXPECT_EQ(render("{{ '{} and {name}'.format(1, name='x') }} {{ ', '.join(['a', 'b']) }} {{ "
                   "'abcb'.find('b') }} {{ 'abcb'.count('b') }}"),
            "1 and x a, b 1 2");
  EXPECT_EQ(render("{{ '<think>x</think>y'.split('</think>')[-1].lstrip('\\n') }}"), "y");
}

TEST(JinjaMethods, DictMethods) {
  ojson ctx = {{"d", {{"x", 1}, {"y", 2}}}};
  EXPECT_EQ(
      render("{{ d.get('x') }}{{ d.get('z') }}{{ d.get('z', 5) }}{{ d.get('z') is none }}", ctx),
      "1None5True");
  EXPECT_EQ(render("{% for k, v in d.items() %}{{ k }}:{{ v }} {% endfor %}", ctx), "x:1 y:2 ");
  EXPECT_EQ(render("{{ d.keys() | list }} {{ d.values() | list }} {{ d | list }}", ctx),
            "['x', 'y'] [1, 2] ['x', 'y']");
}

}  // namespace
}  // namespace strata::testing
