// Realistic hub-style templates (written for these tests after the shapes of Llama 3.1, Qwen2.5,
// Mistral v0.1 and DeepSeek-V3 templates): system-message extraction, namespace state, loop
// lookbehind, tojson of tool schemas, and raise_exception on bad role order.
#include <gtest/gtest.h>

#include "render_helper.h"

namespace strata::testing {
namespace {

const char* kLlama3Style = R"JINJA({{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message + builtin tools #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
)JINJA";

TEST(HubTemplates, Llama3Style) {
  ojson ctx = {{"bos_token", "<|begin_of_text|>"},
               {"messages", ojson::parse(R"([{"role": "system", "content": "You are helpful. "},
                                             {"role": "user", "content": " Hi there\n"},
                                             {"role": "assistant", "content": "Hello!"}])")}};
  EXPECT_EQ(render(kLlama3Style, ctx, true),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
            "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
            "You are helpful.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  // No system message, a date from the caller, no generation prompt.
  ojson ctx2 = {{"bos_token", "<|begin_of_text|>"},
                {"date_string", "01 Jan 2025"},
                {"messages", ojson::parse(R"([{"role": "user", "content": "Q"}])")}};
  EXPECT_EQ(render(kLlama3Style, ctx2, false),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
            "Cutting Knowledge Date: December 2023\nToday Date: 01 Jan 2025\n\n<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nQ<|eot_id|>");
}

const char* kQwen25Style = R"JINJA({%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
)JINJA";

TEST(HubTemplates, Qwen25StyleWithoutTools) {
  ojson ctx = {{"messages", ojson::parse(R"([{"role": "user", "content": "Hi"}])")}};
  EXPECT_EQ(render(kQwen25Style, ctx, true),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
            "assistant.<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  ojson ctx2 = {{"messages", ojson::parse(R"([{"role": "system", "content": "S"},
                                              {"role": "user", "content": "U"},
                                              {"role": "assistant", "content": "A"}])")}};
  EXPECT_EQ(render(kQwen25Style, ctx2, false),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>"
            "assistant\nA<|im_end|>\n");
}

TEST(HubTemplates, Qwen25StyleWithToolsKeepsJsonKeyOrder) {
  ojson ctx = {{"tools", ojson::parse(R"([{"type": "function", "function": {"name": "get_weather",
          "description": "Get weather", "parameters": {"type": "object",
          "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])")},
               {"messages", ojson::parse(R"([{"role": "system", "content": "Be brief."},
          {"role": "user", "content": "Weather in Paris?"},
          {"role": "assistant", "content": "", "tool_calls": [{"type": "function",
              "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
          {"role": "tool", "content": "18C"}])")}};
  EXPECT_EQ(
      render(kQwen25Style, ctx, true),
      "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to assist "
      "with the user "
      "query.\n\nYou are provided with function signatures within <tools></tools> XML "
      "tags:\n<tools>\n"
      "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Get "
      "weather\", "
      "\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, "
      "\"required\": [\"city\"]}}}\n</tools>\n\nFor each function call, return a json object with "
      "function "
      "name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
      "<function-name>, "
      "\"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"
      "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
      "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\"}}\n"
      "</tool_call><|im_end|>\n"
      "<|im_start|>user\n<tool_response>\n18C\n</tool_response><|im_end|>\n"
      "<|im_start|>assistant\n");
}

const char* kMistralStyle =
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 "
    "% 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') "
    "}}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% "
    "endfor %}";

TEST(HubTemplates, MistralStyleAlternation) {
  ojson ctx = {{"bos_token", "<s>"},
               {"eos_token", "</s>"},
               {"messages", ojson::parse(R"([{"role": "user", "content": "Hi"},
                                             {"role": "assistant", "content": "Hello"},
                                             {"role": "user", "content": "Bye"}])")}};
  EXPECT_EQ(render(kMistralStyle, ctx), "<s>[INST] Hi [/INST]Hello</s>[INST] Bye [/INST]");

  ctx["messages"] =
      ojson::parse(R"([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])");
  StatusOr<std::string> out = try_render(kMistralStyle, ctx);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(out.status().message().find(
                "Conversation roles must alternate user/assistant/user/assistant/..."),
            std::string::npos)
      << out.status().message();

  // A system message in an assistant slot passes the alternation check and hits the role check.
  ctx["messages"] =
      ojson::parse(R"([{"role": "user", "content": "a"}, {"role": "system", "content": "b"}])");
  out = try_render(kMistralStyle, ctx);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("Only user and assistant roles are supported!"),
            std::string::npos)
      << out.status().message();
}

const char* kDeepSeekStyle =
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif "
    "%}"
    "{% set ns = namespace(is_first=false, is_tool=false, is_output_first=true, system_prompt='', "
    "is_first_sp=true) %}"
    "{%- for message in messages %}{%- if message['role'] == 'system' %}{%- if ns.is_first_sp %}"
    "{% set ns.system_prompt = ns.system_prompt + message['content'] %}{% set ns.is_first_sp = "
    "false %}"
    "{%- else %}{% set ns.system_prompt = ns.system_prompt + '\\n\\n' + message['content'] %}{%- "
    "endif %}"
    "{%- endif %}{%- endfor %}{{ bos_token }}{{ ns.system_prompt }}"
    "{%- for message in messages %}{%- if message['role'] == 'user' %}{%- set ns.is_tool = false "
    "-%}"
    "{{'<\xef\xbd\x9cUser\xef\xbd\x9c>' + message['content']}}{%- endif %}"
    "{%- if message['role'] == 'assistant' and message['content'] is not none %}"
    "{{'<\xef\xbd\x9c"
    "Assistant\xef\xbd\x9c>' + message['content'] + '<\xef\xbd\x9c"
    "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>'}}"
    "{%- endif %}{%- endfor -%}"
    "{% if add_generation_prompt and not ns.is_tool %}{{'<\xef\xbd\x9c"
    "Assistant\xef\xbd\x9c>'}}{% endif %}";

TEST(HubTemplates, DeepSeekStyleNamespaceSystemPrompt) {
  ojson ctx = {{"bos_token",
                "<\xef\xbd\x9c"
                "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"},
               {"messages", ojson::parse(R"([{"role": "system", "content": "A"},
                                             {"role": "system", "content": "B"},
                                             {"role": "user", "content": "hi"},
                                             {"role": "assistant", "content": "yo"},
                                             {"role": "user", "content": "q"}])")}};
  EXPECT_EQ(render(kDeepSeekStyle, ctx, true),
            "<\xef\xbd\x9c"
            "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>A\n\nB"
            "<\xef\xbd\x9cUser\xef\xbd\x9c>hi<\xef\xbd\x9c"
            "Assistant\xef\xbd\x9c>yo"
            "<\xef\xbd\x9c"
            "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
            "<\xef\xbd\x9cUser\xef\xbd\x9c>q<\xef\xbd\x9c"
            "Assistant\xef\xbd\x9c>");
}

}  // namespace
}  // namespace strata::testing
