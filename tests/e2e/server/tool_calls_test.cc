// Tool calling through the real server (--tool-call-parser): the tools and the conversation's
// earlier calls reach the chat template as sent (the greedy answer equals the raw completion of
// the text Hugging Face would render), and calls the model writes come back as tool_calls, whole
// and streamed, with Kimi K2's ids counting the conversation's calls. The model is house-llama
// with two vocabulary tokens renamed to a Qwen-style and a Kimi-style call (scripted_model.h): a
// logit_bias makes it write them. The parsing itself (every format, tags across chunks, what does
// not parse) is tests/unit/tokenizer/tool_call_parser_test; the official npm client's view is
// tests/e2e/js/tool_calls.test.mjs (node_client_test.cc).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "scripted_model.h"
#include "server_process.h"
#include "support/temp_dir.h"

namespace strata::e2e {
namespace {

using nlohmann::json;
// Request bodies keep their key order, as a client's JSON does (nlohmann::json would sort it).
using ojson = nlohmann::ordered_json;

json post(int port, const std::string& path, const ojson& body) {
  const HttpResponse r = http(port, "POST", path, body.dump());
  EXPECT_EQ(r.status, 200) << path << ": " << r.body;
  return json::parse(r.body, nullptr, false);
}

const char* kQwenCall =
    R"(<tool_call>{"name":"get_weather","arguments":{"city":"Paris","unit":"c"}}</tool_call>)";
const char* kKimiCall =
    R"(<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0)"
    R"(<|tool_call_argument_begin|>{"city":"Paris"}<|tool_call_end|><|tool_calls_section_end|>)";

// Prints each message's calls and tool_call_id, as chat templates do, and the tools last (right
// before the answer, where they sway it most: a prompt that differs there answers differently).
const char* kTemplate =
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "{% for c in m['tool_calls'] or [] %}[{{ c['id'] }} {{ c['function']['name'] }} "
    "{{ c['function']['arguments'] | tojson }}]{% endfor %}"
    "{% if m['tool_call_id'] %}({{ m['tool_call_id'] }}){% endif %}<|im_end|>\n{% endfor %}"
    "{% if tools %}<|im_start|>system\n{{ tools | tojson }}<|im_end|>\n{% endif %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

// Keys deliberately out of alphabetical order: a server that sorted them would render another
// prompt.
ojson tools() {
  return ojson::parse(R"([{"type":"function","function":{"name":"get_weather",
      "parameters":{"type":"object","properties":{"zone":{"type":"string"},
      "city":{"type":"string"}},"required":["city"]}}}])");
}
const char* kToolsText =
    R"([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": )"
    R"("object", "properties": {"zone": {"type": "string"}, "city": {"type": "string"}}, )"
    R"("required": ["city"]}}}])";

ojson conversation() {
  return ojson::parse(R"([{"role":"user","content":"Weather in Paris and Rome?"},
      {"role":"assistant","content":null,"tool_calls":[
        {"id":"functions.get_weather:0","type":"function",
         "function":{"name":"get_weather","arguments":"{\"zone\":\"eu\",\"city\":\"Paris\"}"}},
        {"id":"functions.get_weather:1","type":"function",
         "function":{"name":"get_weather","arguments":"{\"city\":\"Rome\"}"}}]},
      {"role":"tool","tool_call_id":"functions.get_weather:0","content":"sunny"},
      {"role":"tool","tool_call_id":"functions.get_weather:1","content":"rain"}])");
}
const std::string kConversationText =
    std::string("<|im_start|>user\nWeather in Paris and Rome?<|im_end|>\n") +
    "<|im_start|>assistant\n[functions.get_weather:0 get_weather {\"zone\": \"eu\", \"city\": "
    "\"Paris\"}][functions.get_weather:1 get_weather {\"city\": \"Rome\"}]<|im_end|>\n"
    "<|im_start|>tool\nsunny(functions.get_weather:0)<|im_end|>\n"
    "<|im_start|>tool\nrain(functions.get_weather:1)<|im_end|>\n";
const char* kAnswerText = "<|im_start|>assistant\n";

// The chat answer and the raw completion of `prompt`: the same text, prompt tokens and logprobs
// (which differ, to the bit, for any other prompt).
void expect_same_answer(int port, const ojson& chat_body, const std::string& prompt) {
  ojson c = chat_body;
  c["logprobs"] = true;
  const json answer = post(port, "/v1/chat/completions", c);
  const json raw = post_json(
      port, "/v1/completions",
      {{"prompt", prompt}, {"max_tokens", c["max_tokens"]}, {"temperature", 0}, {"logprobs", 0}});
  EXPECT_EQ(answer["choices"][0]["message"]["content"], raw["choices"][0]["text"]) << answer;
  EXPECT_EQ(answer["usage"]["prompt_tokens"], raw["usage"]["prompt_tokens"]) << answer;
  const json& lps = answer["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(lps.size(), raw["choices"][0]["logprobs"]["token_logprobs"].size()) << answer;
  for (size_t i = 0; i < lps.size(); ++i)
    EXPECT_EQ(lps[i]["logprob"], raw["choices"][0]["logprobs"]["token_logprobs"][i]) << i;
  EXPECT_FALSE(answer["choices"][0]["message"].contains("tool_calls")) << answer;
}

ojson chat(int32_t biased, int max_tokens, bool stream = false) {
  ojson body = {{"messages", conversation()},
                {"tools", tools()},
                {"max_tokens", max_tokens},
                {"temperature", 0},
                {"stream", stream}};
  if (biased >= 0) body["logit_bias"] = {{std::to_string(biased), 100}};
  return body;
}

struct Streamed {
  std::string content;
  json calls = json::array();  // the tool_calls deltas as they came
  std::string finish;
};
Streamed stream_chat(int port, const ojson& body) {
  const HttpResponse r = http(port, "POST", "/v1/chat/completions", body.dump());
  EXPECT_EQ(r.status, 200) << r.body;
  Streamed s;
  for (const std::string& data : sse_data(r.body)) {
    if (data == "[DONE]") continue;
    const json choice = json::parse(data)["choices"][0];
    const json& delta = choice["delta"];
    if (delta.contains("content")) s.content += delta["content"].get<std::string>();
    if (delta.contains("tool_calls"))
      for (const json& c : delta["tool_calls"]) s.calls.push_back(c);
    if (!choice["finish_reason"].is_null()) s.finish = choice["finish_reason"];
  }
  return s;
}

TEST(ServeToolCallsTest, CallsComeBackAsToolCallsAndToolsReachTheTemplate) {
  const testing::TempDir dir("strata_tool_calls");
  const ScriptedModel model = make_scripted_model(dir.file("model"), {kQwenCall, kKimiCall});
  dir.write("tools.jinja", kTemplate);
  const int32_t qwen_token = model.ids[0], kimi_token = model.ids[1];

  ServerProcess qwen;
  qwen.set_model_path(model.dir);
  ASSERT_TRUE(
      qwen.start({"--chat-template", dir.file("tools.jinja"), "--tool-call-parser", "qwen25"}))
      << qwen.log();
  const int port = qwen.port();

  // The prompt: tools in the client's key order, the earlier calls' arguments as objects. The
  // greedy answer to it is the raw completion of that text, and has no call: plain content.
  expect_same_answer(
      port, chat(-1, 8),
      kConversationText + "<|im_start|>system\n" + kToolsText + "<|im_end|>\n" + kAnswerText);
  // tool_choice "none": the tools are left out of the prompt.
  ojson none = chat(-1, 8);
  none["tool_choice"] = "none";
  expect_same_answer(port, none, kConversationText + kAnswerText);

  // Two calls written: two tool_calls with their own ids, content null; cut by max_tokens, so
  // finish_reason stays "length".
  const json called = post(port, "/v1/chat/completions", chat(qwen_token, 2));
  const json& message = called["choices"][0]["message"];
  EXPECT_TRUE(message["content"].is_null()) << called;
  ASSERT_EQ(message["tool_calls"].size(), 2u) << called;
  for (const json& c : message["tool_calls"]) {
    EXPECT_EQ(c["type"], "function");
    EXPECT_EQ(c["function"]["name"], "get_weather");
    EXPECT_EQ(json::parse(c["function"]["arguments"].get<std::string>()),
              json({{"city", "Paris"}, {"unit", "c"}}));
    EXPECT_TRUE(c["id"].get<std::string>().starts_with("call_")) << c;
  }
  EXPECT_NE(message["tool_calls"][0]["id"], message["tool_calls"][1]["id"]);
  EXPECT_EQ(called["choices"][0]["finish_reason"], "length");
  // A call token that also stops the answer (stop_token_ids keep the token's text, as vLLM's):
  // finish_reason "tool_calls".
  ojson stopped = chat(qwen_token, 4);
  stopped["stop_token_ids"] = {qwen_token};
  const json one = post(port, "/v1/chat/completions", stopped);
  EXPECT_EQ(one["choices"][0]["message"]["tool_calls"].size(), 1u) << one;
  EXPECT_EQ(one["choices"][0]["finish_reason"], "tool_calls") << one;
  stopped["stream"] = true;
  EXPECT_EQ(stream_chat(port, stopped).finish, "tool_calls");
  ojson single = chat(qwen_token, 2);
  single["parallel_tool_calls"] = false;
  EXPECT_EQ(
      post(port, "/v1/chat/completions", single)["choices"][0]["message"]["tool_calls"].size(), 1u);

  // Streamed: one delta per call as its end tag arrives, indexed; nothing as content.
  const Streamed s = stream_chat(port, chat(qwen_token, 2, /*stream=*/true));
  EXPECT_EQ(s.content, "");
  ASSERT_EQ(s.calls.size(), 2u) << s.calls;
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(s.calls[i]["index"], i);
    EXPECT_EQ(s.calls[i]["function"]["name"], "get_weather");
    EXPECT_EQ(s.calls[i]["function"]["arguments"],
              message["tool_calls"][i]["function"]["arguments"]);
  }
  EXPECT_EQ(s.finish, "length");
  EXPECT_EQ(qwen.stop(), 0) << qwen.log();

  // Kimi K2: the ids count the conversation's calls (two before: :2 and :3), whole and streamed.
  ServerProcess kimi;
  kimi.set_model_path(model.dir);
  ASSERT_TRUE(
      kimi.start({"--chat-template", dir.file("tools.jinja"), "--tool-call-parser", "kimi_k2"}))
      << kimi.log();
  const json k = post(kimi.port(), "/v1/chat/completions", chat(kimi_token, 2));
  const json& kc = k["choices"][0]["message"]["tool_calls"];
  ASSERT_EQ(kc.size(), 2u) << k;
  EXPECT_EQ(kc[0]["id"], "functions.get_weather:2");
  EXPECT_EQ(kc[1]["id"], "functions.get_weather:3");
  EXPECT_EQ(kc[0]["function"]["arguments"], R"({"city":"Paris"})");
  const Streamed ks = stream_chat(kimi.port(), chat(kimi_token, 2, /*stream=*/true));
  ASSERT_EQ(ks.calls.size(), 2u) << ks.calls;
  EXPECT_EQ(ks.calls[1]["id"], "functions.get_weather:3");
  // The other format's call is no Kimi call: content, as written.
  const json q = post(kimi.port(), "/v1/chat/completions", chat(qwen_token, 1));
  EXPECT_EQ(q["choices"][0]["message"]["content"], kQwenCall) << q;
  EXPECT_FALSE(q["choices"][0]["message"].contains("tool_calls")) << q;

  // `strata generate` on a record with tools: through the server (its tool_calls kept in the
  // record) and in-process with the same parser: the same record, ids included.
  std::ofstream(dir.file("in.jsonl"))
      << ojson({{"id", "w"}, {"tools", tools()}, {"messages", conversation()}}).dump() << "\n";
  const std::string flags = " --input w=" + dir.file("in.jsonl") +
                            " --max-new-tokens 4 --temperature 0 --logit-bias '{\"" +
                            std::to_string(kimi_token) + "\": 100}' --stop-token-id " +
                            std::to_string(kimi_token);
  std::string gen_out;
  ASSERT_EQ(run_command(std::string(STRATA_BINARY) +
                            " generate --server http://127.0.0.1:" + std::to_string(kimi.port()) +
                            flags + " --output " + dir.file("served.jsonl"),
                        &gen_out),
            0)
      << gen_out;
  EXPECT_EQ(kimi.stop(), 0) << kimi.log();
  const std::string local = std::string(STRATA_BINARY) + " generate --model-path " + model.dir +
                            " --chat-template " + dir.file("tools.jinja") +
                            " --tool-call-parser kimi_k2" + flags;
  ASSERT_EQ(run_command(local + " --output " + dir.file("local.jsonl"), &gen_out), 0) << gen_out;
  const json served = json::parse(read_file(dir.file("served.jsonl")));
  const json in_process = json::parse(read_file(dir.file("local.jsonl")));
  const json& answer_message = served["messages"].back();
  EXPECT_TRUE(answer_message["content"].is_null()) << served;
  ASSERT_EQ(answer_message["tool_calls"].size(), 1u) << served;
  EXPECT_EQ(answer_message["tool_calls"][0]["id"], "functions.get_weather:2") << served;
  EXPECT_EQ(served["meta"]["finish_reason"], "tool_calls") << served;
  EXPECT_EQ(in_process["messages"], served["messages"]) << in_process;
  EXPECT_EQ(in_process["meta"]["finish_reason"], "tool_calls") << in_process;
  // The same prompt (the tools rendered in both): the answer is forced, its length is not.
  EXPECT_EQ(in_process["meta"]["prompt_tokens"], served["meta"]["prompt_tokens"]) << in_process;
  EXPECT_EQ(in_process["meta"]["sampling"]["tool_call_parser"], "kimi_k2") << in_process;
  EXPECT_EQ(in_process["tools"], served["tools"]);
  EXPECT_EQ(
      run_command(local + " --server http://127.0.0.1:1 --output " + dir.file("refused.jsonl"),
                  &gen_out),
      1)
      << gen_out;
  EXPECT_NE(gen_out.find("--tool-call-parser applies to the in-process engine"), std::string::npos)
      << gen_out;

  // Without --tool-call-parser, a request offering tools is refused, saying what to start with.
  ServerProcess plain;
  ASSERT_TRUE(plain.start({})) << plain.log();
  const HttpResponse refused =
      http(plain.port(), "POST", "/v1/chat/completions", chat(-1, 4).dump());
  EXPECT_EQ(refused.status, 400) << refused.body;
  EXPECT_NE(refused.body.find("--tool-call-parser"), std::string::npos) << refused.body;
  EXPECT_EQ(json::parse(refused.body)["error"]["param"], "tools") << refused.body;
  EXPECT_EQ(plain.stop(), 0) << plain.log();

  std::string out;
  EXPECT_EQ(run_command(std::string(STRATA_BINARY) + " serve --port 0 --model-path " +
                            house_llama() + " --tool-call-parser nope",
                        &out),
            1)
      << out;
  EXPECT_NE(out.find("unknown parser 'nope'"), std::string::npos) << out;
}

}  // namespace
}  // namespace strata::e2e
