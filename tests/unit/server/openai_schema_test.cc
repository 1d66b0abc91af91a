// Request parsing/validation and Prometheus rendering, without HTTP or a model.
#include "server/openai_schema.h"

#include <gtest/gtest.h>

#include "bad_request_case.h"
#include "server/metrics.h"
#include "server/sse.h"

namespace strata {
namespace {

TEST(ServerSchemaTest, ParsesChatRequest) {
  OpenAiRequest r;
  auto e = parse_openai_request(
      R"({"model":"m","messages":[{"role":"system","content":"be brief"},
          {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],
          "max_completion_tokens":7,"temperature":0,"top_p":0.5,"top_k":3,"seed":11,"stop":"x",
          "logprobs":true,"top_logprobs":2,"n":3,"stream":true,"stream_options":{"include_usage":true}})",
      Endpoint::kChat, &r);
  ASSERT_FALSE(e) << e->message;
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(r.messages[1]["content"], "ab");
  EXPECT_EQ(*r.max_tokens, 7);
  EXPECT_EQ(r.sampling.temperature, 0.0f);
  EXPECT_EQ(r.sampling.top_k, 3);
  EXPECT_EQ(*r.sampling.seed, 11u);
  EXPECT_EQ(r.sampling.stop_strings, std::vector<std::string>{"x"});
  EXPECT_EQ(r.top_logprobs, 2);
  EXPECT_EQ(r.n, 3);
  EXPECT_TRUE(r.stream && r.include_usage);
}

TEST(ServerSchemaTest, OnlyJsonContentTypesAreAccepted) {
  for (const char* ok : {"", "application/json", "Application/JSON; charset=utf-8",
                         " application/json ", "application/vnd.api+json"})
    EXPECT_FALSE(check_json_content_type(ok)) << ok;
  for (const char* bad : {"text/plain", "application/x-www-form-urlencoded",
                          "multipart/form-data; boundary=x", "application/jsonx"}) {
    auto e = check_json_content_type(bad);
    ASSERT_TRUE(e) << bad;
    EXPECT_EQ(e->status, 415);
    EXPECT_NE(e->message.find(bad), std::string::npos) << e->message;
    EXPECT_NE(e->message.find("application/json"), std::string::npos);
  }
}

TEST(ServerSchemaTest, AbortIsNoFinishReasonOnTheWire) {
  EXPECT_EQ(finish_reason_json(FinishReason::kAbort), "length");
  EXPECT_EQ(finish_reason_json(FinishReason::kStop), "stop");
  EXPECT_TRUE(finish_reason_json(FinishReason::kNone).is_null());
}

TEST(ServerSchemaTest, ParsesPromptForms) {
  OpenAiRequest a, b, c;
  EXPECT_FALSE(
      parse_openai_request(R"({"prompt":["x","y"],"logprobs":1})", Endpoint::kCompletions, &a));
  EXPECT_EQ(a.text_prompts.size(), 2u);
  EXPECT_EQ(a.top_logprobs, 1);
  EXPECT_FALSE(parse_openai_request(R"({"prompt":[1,2,3]})", Endpoint::kCompletions, &b));
  EXPECT_EQ(b.token_prompts, (std::vector<std::vector<int32_t>>{{1, 2, 3}}));
  EXPECT_FALSE(parse_openai_request(R"({"prompt":[[1],[2,3]]})", Endpoint::kCompletions, &c));
  EXPECT_EQ(c.num_prompts(), 2);
}

TEST(ServerSchemaTest, RejectsBadInput) {
  struct Case {
    const char* body;
    Endpoint ep;
    const char* param;
  };
  const Case cases[] = {
      {"{", Endpoint::kChat, ""},
      {R"({"messages":[]})", Endpoint::kChat, "messages"},
      {R"({"messages":[{"role":"wizard","content":"x"}]})", Endpoint::kChat, "messages[0].role"},
      {R"({"messages":[{"role":"user","content":5}]})", Endpoint::kChat, "messages[0].content"},
      {R"({"prompt":"x","max_tokens":0})", Endpoint::kCompletions, "max_tokens"},
      {R"({"prompt":"x","max_tokens":1.5})", Endpoint::kCompletions, "max_tokens"},
      {R"({"prompt":"x","top_p":0})", Endpoint::kCompletions, "top_p"},
      {R"({"prompt":"x","logprobs":true})", Endpoint::kCompletions, "logprobs"},
      {R"({"prompt":[-1]})", Endpoint::kCompletions, "prompt"},
      {R"({"prompt":"x","stop":["a","b","c","d","e","f","g","h","i","j","k","l","m","n","o","p","q"]})",
       Endpoint::kCompletions, "stop"},
      {R"({"prompt":"x","stream_options":1})", Endpoint::kCompletions, "stream_options"},
  };
  for (const Case& c : cases) {
    OpenAiRequest r;
    auto e = parse_openai_request(c.body, c.ep, &r);
    ASSERT_TRUE(e) << c.body;
    EXPECT_EQ(e->status, 400) << c.body;
    EXPECT_EQ(e->param, c.param) << c.body << " -> " << e->message;
    const auto j = e->to_json();
    EXPECT_TRUE(j["error"].contains("message") && j["error"].contains("type") &&
                j["error"].contains("code"));
  }
  OpenAiRequest r;
  auto e = parse_openai_request(std::string("{\"prompt\":\"\xff\"}"), Endpoint::kCompletions, &r);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code, "invalid_utf8");
}

// Every sampling field SGLang accepts on the OpenAI request reaches the one SamplingParams.
TEST(ServerSchemaTest, ParsesEverySamplingField) {
  OpenAiRequest r;
  auto e = parse_openai_request(
      R"({"messages":[{"role":"user","content":"hi"},
                      {"role":"assistant","content":"a","reasoning_content":"because"},
                      {"role":"user","content":"more"}],
          "temperature":0.7,"top_p":0.9,"top_k":20,"min_p":0.05,"repetition_penalty":1.1,
          "presence_penalty":0.5,"frequency_penalty":-0.25,"logit_bias":{"17":-100,"3":2.5},
          "stop_token_ids":[7,8],"seed":5,"ignore_eos":true,"max_tokens":9,"min_tokens":3,
          "include_stop_str_in_output":true,
          "chat_template_kwargs":{"enable_thinking":false}})",
      Endpoint::kChat, &r);
  ASSERT_FALSE(e) << e->message;
  const SamplingParams& p = r.sampling;
  EXPECT_EQ(p.temperature, 0.7f);
  EXPECT_EQ(p.top_p, 0.9f);
  EXPECT_EQ(p.top_k, 20);
  EXPECT_EQ(p.min_p, 0.05f);
  EXPECT_EQ(p.repetition_penalty, 1.1f);
  EXPECT_EQ(p.presence_penalty, 0.5f);
  EXPECT_EQ(p.frequency_penalty, -0.25f);
  EXPECT_EQ(p.logit_bias, (std::vector<std::pair<int32_t, float>>{{3, 2.5f}, {17, -100.0f}}));
  EXPECT_EQ(p.stop_token_ids, (std::vector<int32_t>{7, 8}));  // without a "stop" too
  EXPECT_EQ(*p.seed, 5u);
  EXPECT_TRUE(p.ignore_eos);
  EXPECT_EQ(p.min_new_tokens, 3);
  EXPECT_TRUE(p.include_stop_str_in_output);
  EXPECT_EQ(*r.max_tokens, 9);
  EXPECT_EQ(r.chat_template_kwargs, nlohmann::json::parse(R"({"enable_thinking":false})"));
  EXPECT_EQ(r.messages[1]["reasoning_content"], "because");
  EXPECT_FALSE(r.messages[0].contains("reasoning_content"));
}

// Each bad or unsupported parameter is refused naming itself; a parameter that would change the
// output and is not implemented is refused, never ignored.
TEST(ServerSchemaTest, EachBadParameterNamesItself) {
  const BadRequestCase cases[] = {
      {R"({"prompt":"x","min_p":1.5})", "min_p", "'min_p' must be between 0 and 1, got 1.5", ""},
      {R"({"prompt":"x","repetition_penalty":0})", "repetition_penalty",
       "'repetition_penalty' must be", ""},
      {R"({"prompt":"x","presence_penalty":3})", "presence_penalty",
       "'presence_penalty' must be between -2 and 2", ""},
      {R"({"prompt":"x","frequency_penalty":"a"})", "frequency_penalty", "must be a number", ""},
      {R"({"prompt":"x","logit_bias":{"12":101}})", "logit_bias",
       "'logit_bias' values must be between -100 and 100", ""},
      {R"({"prompt":"x","logit_bias":{"abc":1}})", "logit_bias", "keys must be token ids", ""},
      {R"({"prompt":"x","logit_bias":[1]})", "logit_bias", "must be an object", ""},
      {R"({"prompt":"x","top_k":-5})", "top_k", "'top_k' must be", ""},
      {R"({"prompt":"x","temperature":3})", "temperature",
       "'temperature' must be between 0 and 2, got 3", ""},
      {R"({"prompt":"x","stop_token_ids":["a"]})", "stop_token_ids", "token ids", ""},
      {R"({"prompt":"x","chat_template_kwargs":{"a":1}})", "chat_template_kwargs",
       "chat/completions only", ""},
      {R"({"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":[1]})",
       "chat_template_kwargs", "must be an object", ""},
      {R"({"messages":[{"role":"assistant","content":"x","reasoning_content":5}]})",
       "messages[0].reasoning_content", "must be a string", ""},
      {R"({"prompt":"x","max_tokens":4,"min_tokens":5})", "min_tokens",
       "'min_tokens' must be between 0 and max_tokens (4), got 5", ""},
      {R"({"prompt":"x","min_tokens":-1})", "min_tokens", "must be between 0", ""},
      {R"({"prompt":"x","min_new_tokens":1.5})", "min_new_tokens", "must be an integer", ""},
      {R"({"prompt":"x","regex":"a+"})", "regex", "not supported", "unsupported_parameter"},
      {R"({"prompt":"x","json_schema":"{}"})", "json_schema", "not supported",
       "unsupported_parameter"},
      {R"({"prompt":"x","tools":[{"type":"function"}]})", "tools", "chat/completions only", ""},
      {R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]})",
       "tools[0].function", "must be an object", ""},
      {R"({"messages":[{"role":"user","content":"x"}],"tools":{"a":1}})", "tools",
       "must be an array", ""},
      {R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"code","function":{}}]})",
       "tools[0].type", "must be \"function\"", ""},
      {R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function",
          "function":{"name":""}}]})",
       "tools[0].function.name", "non-empty string", ""},
      {R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function",
          "function":{"name":"f","parameters":[]}}]})",
       "tools[0].function.parameters", "JSON Schema object", ""},
      {R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"required"})", "tool_choice",
       "needs constrained decoding", "unsupported_parameter"},
      {R"({"messages":[{"role":"user","content":"x"}],
          "tool_choice":{"type":"function","function":{"name":"f"}}})",
       "tool_choice", "needs constrained decoding", "unsupported_parameter"},
      {R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"sometimes"})", "tool_choice",
       "must be \"none\", \"auto\"", ""},
      {R"({"messages":[{"role":"user","content":"x"}],"parallel_tool_calls":1})",
       "parallel_tool_calls", "must be a boolean", ""},
      {R"({"messages":[{"role":"user","content":"x"}],"functions":[{"name":"f"}]})", "functions",
       "send 'tools'", "unsupported_parameter"},
      {R"({"messages":[{"role":"user","content":"x","tool_calls":[]}]})", "messages[0].tool_calls",
       "belongs to assistant messages", ""},
      {R"({"messages":[{"role":"assistant","tool_calls":[{"id":"a","function":{"name":1}}]}]})",
       "messages[0].tool_calls[0].function.name", "must be a string", ""},
      {R"({"messages":[{"role":"assistant","tool_calls":[{"id":"a","type":"function",
          "function":{"name":"f","arguments":5}}]}]})",
       "messages[0].tool_calls[0].function.arguments", "must be a JSON string", ""},
      {R"({"messages":[{"role":"tool","content":"x","tool_call_id":3}]})",
       "messages[0].tool_call_id", "must be a string", ""},
      {R"({"prompt":"x","no_stop_trim":true})", "no_stop_trim", "not supported",
       "unsupported_parameter"},
      {R"({"messages":[{"role":"user","content":"x"}],"continue_final_message":true})",
       "continue_final_message", "needs 'add_generation_prompt': false", ""},
      {R"({"prompt":"x","continue_final_message":true,"add_generation_prompt":false})",
       "add_generation_prompt", "chat/completions only", ""},
      {R"({"prompt":"x","continue_final_message":true})", "continue_final_message",
       "chat/completions only", ""},
      {R"({"messages":[{"role":"user","content":"x"}],"add_generation_prompt":1})",
       "add_generation_prompt", "must be a boolean", ""},
      {R"({"prompt":"x","lora_path":"a"})", "lora_path", "not supported", "unsupported_parameter"},
      {R"({"prompt":"x","return_hidden_states":true})", "return_hidden_states", "not supported",
       "unsupported_parameter"},
      {R"({"prompt":"x","skip_special_tokens":"no"})", "skip_special_tokens", "must be", ""},
      {R"({"messages":[{"role":"user","content":"x"}],"echo":true})", "echo",
       "not supported by /v1/chat/completions", "unsupported_parameter"},
      {R"({"prompt":"x","echo":1})", "echo", "must be a boolean", ""},
      {R"({"prompt":"x","max_tokens":0})", "max_tokens", "must be >= 1", ""},
  };
  for (const BadRequestCase& c : cases) {
    OpenAiRequest r;
    const Endpoint ep = std::string(c.body).find("messages") != std::string::npos
                            ? Endpoint::kChat
                            : Endpoint::kCompletions;
    auto e = parse_openai_request(c.body, ep, &r);
    expect_bad_request(c, e);
  }
}

// Tools are kept as sent, key order included (the chat template prints them with tojson);
// assistant messages' calls reach the template with their arguments parsed, in the model's order;
// the calls the conversation made are counted (Kimi K2's ids).
TEST(ServerSchemaTest, ToolsAndToolCallsReachTheTemplateAsSent) {
  OpenAiRequest r;
  auto e = parse_openai_request(
      R"({"messages":[{"role":"user","content":"weather?"},
          {"role":"assistant","content":null,"tool_calls":[
            {"id":"call_1","type":"function","function":{"name":"get","arguments":"{\"z\":1,\"a\":2}"}},
            {"id":"call_2","type":"function","function":{"name":"now","arguments":"not json"}}]},
          {"role":"tool","tool_call_id":"call_1","content":"sunny"}],
          "tools":[{"type":"function","function":{"name":"get","parameters":{"type":"object",
            "properties":{"zone":{"type":"string"},"city":{"type":"string"}}}}}],
          "parallel_tool_calls":false})",
      Endpoint::kChat, &r);
  ASSERT_FALSE(e) << e->message;
  EXPECT_EQ(r.tools.dump(),
            R"([{"type":"function","function":{"name":"get","parameters":{"type":"object",)"
            R"("properties":{"zone":{"type":"string"},"city":{"type":"string"}}}}}])");
  EXPECT_EQ(r.messages[1]["content"], "");
  EXPECT_EQ(r.messages[1]["tool_calls"][0]["function"]["arguments"].dump(), R"({"z":1,"a":2})");
  EXPECT_EQ(r.messages[1]["tool_calls"][1]["function"]["arguments"], "not json");
  EXPECT_EQ(r.messages[2]["tool_call_id"], "call_1");
  EXPECT_EQ(r.history_tool_calls, 2);
  EXPECT_FALSE(r.parallel_tool_calls);
  EXPECT_TRUE(wants_tool_calls(r));
  EXPECT_EQ(chat_template_context(r)["tools"], r.tools);
  // tool_choice "none": the tools stay out of the prompt and the output is not parsed.
  OpenAiRequest none;
  ASSERT_FALSE(parse_openai_request(
      R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"none",
          "tools":[{"type":"function","function":{"name":"f"}}]})",
      Endpoint::kChat, &none));
  EXPECT_FALSE(wants_tool_calls(none));
  EXPECT_FALSE(chat_template_context(none).contains("tools"));
}

// Parsed calls in whole responses (content null beside them, finish_reason "tool_calls" after a
// stop, "length" kept) and in streamed deltas (each with its index; the finish chunk says
// "tool_calls").
TEST(ServerSchemaTest, ToolCallsInResponsesAndChunks) {
  OpenAiRequest req;
  req.endpoint = Endpoint::kChat;
  const ResponseMeta meta{"chatcmpl-1", 7, "m"};
  auto loaded = Tokenizer::load(std::string(STRATA_SHARED_DIR) + "/models/house-llama");
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  const Tokenizer& tok = *loaded;
  ChoiceResult called;
  called.text = "\n";
  called.tool_calls = {{"call_a", "get", R"({"city":"Paris"})"}};
  called.finish_reason = FinishReason::kStop;
  ChoiceResult cut = called;
  cut.text = "Let me see.";
  cut.finish_reason = FinishReason::kLength;
  ChoiceResult plain;
  plain.text = "hi";
  plain.finish_reason = FinishReason::kStop;
  const nlohmann::json body = build_response(req, meta, {called, cut, plain}, Usage{}, tok);
  const nlohmann::json& m0 = body["choices"][0]["message"];
  EXPECT_TRUE(m0["content"].is_null()) << body;
  EXPECT_EQ(m0["tool_calls"], nlohmann::json::parse(R"([{"id":"call_a","type":"function",
      "function":{"name":"get","arguments":"{\"city\":\"Paris\"}"}}])"));
  EXPECT_EQ(body["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(body["choices"][1]["message"]["content"], "Let me see.");
  EXPECT_EQ(body["choices"][1]["finish_reason"], "length");
  EXPECT_FALSE(body["choices"][2]["message"].contains("tool_calls"));
  EXPECT_EQ(body["choices"][2]["finish_reason"], "stop");

  ChunkPart part;
  part.tool_calls = {{"functions.get:3", "get", "{}"}};
  part.tool_index = 1;
  const nlohmann::json chunk = build_chunk(req, meta, part, tok);
  EXPECT_EQ(chunk["choices"][0]["delta"]["tool_calls"],
            nlohmann::json::parse(R"([{"index":1,"id":"functions.get:3","type":"function",
                "function":{"name":"get","arguments":"{}"}}])"));
  EXPECT_FALSE(chunk["choices"][0]["delta"].contains("content"));
  ChunkPart end;
  end.finish = FinishReason::kStop;
  end.called_tools = true;
  EXPECT_EQ(build_chunk(req, meta, end, tok)["choices"][0]["finish_reason"], "tool_calls");
  end.called_tools = false;
  EXPECT_EQ(build_chunk(req, meta, end, tok)["choices"][0]["finish_reason"], "stop");
}

// Completions' echo: the prompt's text before the choice's; with logprobs, the prompt's tokens
// lead the list, the first with null logprobs (nothing precedes it), and the engine's prompt
// logprobs for the rest; max_tokens 0 asks for the prompt alone.
TEST(ServerSchemaTest, EchoPutsThePromptAndItsLogprobsFirst) {
  OpenAiRequest req;
  ASSERT_FALSE(parse_openai_request(R"({"prompt":"the cat","echo":true,"logprobs":1})",
                                    Endpoint::kCompletions, &req));
  EXPECT_TRUE(req.echo);
  EXPECT_FALSE(req.prompt_only);
  EXPECT_EQ(req.prompt_logprobs_from, 0);
  OpenAiRequest only;
  ASSERT_FALSE(parse_openai_request(R"({"prompt":"x","echo":true,"max_tokens":0})",
                                    Endpoint::kCompletions, &only));
  EXPECT_TRUE(only.prompt_only);
  EXPECT_EQ(only.max_tokens, 1);
  EXPECT_EQ(only.prompt_logprobs_from, -1);  // echo without logprobs: the text alone

  auto loaded = Tokenizer::load(std::string(STRATA_SHARED_DIR) + "/models/house-llama");
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  const Tokenizer& tok = *loaded;
  const std::vector<int32_t> p = tok.encode(" the cat"), out = tok.encode(" sat");
  ASSERT_EQ(p.size(), 2u);
  ASSERT_EQ(out.size(), 1u);
  ChoiceResult c;
  c.echo_text = " the cat";
  c.prompt_ids = p;
  c.prompt_logprobs = {{-2.5f, {{p[1], -2.5f}}}};
  c.prompt_logprobs_from = 1;
  c.text = " sat";
  c.token_ids = out;
  c.logprobs = {{-0.5f, {{out[0], -0.5f}}}};
  c.finish_reason = FinishReason::kLength;
  const ResponseMeta meta{"cmpl-1", 7, "m"};
  const nlohmann::json body = build_response(req, meta, {c}, Usage{}, tok);
  const nlohmann::json& choice = body["choices"][0];
  EXPECT_EQ(choice["text"], " the cat sat");
  const nlohmann::json& lp = choice["logprobs"];
  EXPECT_EQ(lp["tokens"], nlohmann::json({" the", " cat", " sat"}));
  EXPECT_EQ(lp["token_logprobs"], nlohmann::json::parse("[null, -2.5, -0.5]"));
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  EXPECT_EQ(lp["top_logprobs"][1], nlohmann::json({{" cat", -2.5}}));
  EXPECT_EQ(lp["text_offset"], nlohmann::json({0, 4, 8}));
  // A choice that ended before its prompt's logprobs came: the prompt's are all null.
  c.prompt_logprobs.clear();
  const nlohmann::json cut = build_response(req, meta, {c}, Usage{}, tok)["choices"][0]["logprobs"];
  EXPECT_EQ(cut["token_logprobs"], nlohmann::json::parse("[null, null, -0.5]"));

  // The stream's echo chunk: the prompt's text and tokens, the first unscored.
  ChunkPart echo;
  echo.text = c.echo_text;
  echo.token_ids = p;
  echo.logprobs = {{-2.5f, {{p[1], -2.5f}}}};
  echo.unscored = 1;
  const nlohmann::json chunk = build_chunk(req, meta, echo, tok)["choices"][0];
  EXPECT_EQ(chunk["text"], " the cat");
  EXPECT_EQ(chunk["logprobs"]["token_logprobs"], nlohmann::json::parse("[null, -2.5]"));
}

// Kimi K2's ids count the conversation's calls (its template renders them back); other formats
// get random call_ ids; parallel_tool_calls false keeps a choice's first call only.
TEST(ServerSchemaTest, ToolCallIds) {
  const ToolCallFormat kimi = *tool_call_format("kimi_k2"), qwen = *tool_call_format("qwen25");
  const std::vector<ToolCall> two = {{"get", "{}", "functions.get:0"}, {"put", "{}", ""}};
  auto k = name_tool_calls(kimi, two, /*first=*/3, /*already=*/1, /*parallel=*/true);
  ASSERT_EQ(k.size(), 2u);
  EXPECT_EQ(k[0].id, "functions.get:4");
  EXPECT_EQ(k[1].id, "functions.put:5");
  auto q = name_tool_calls(qwen, two, 0, 0, true);
  ASSERT_EQ(q.size(), 2u);
  EXPECT_TRUE(q[0].id.starts_with("call_") && q[0].id.size() == 29) << q[0].id;
  EXPECT_NE(q[0].id, q[1].id);
  EXPECT_EQ(name_tool_calls(qwen, two, 0, 0, false).size(), 1u);
  EXPECT_TRUE(name_tool_calls(qwen, two, 0, 1, false).empty());
}

// The engine's typed refusals become OpenAI errors: the field as param, the right code and status.
TEST(ServerSchemaTest, RequestErrorsBecomeOpenAiErrors) {
  const ApiError value = api_error_from(invalid_value("top_p", "must be greater than 0, got 0"));
  EXPECT_EQ(value.status, 400);
  EXPECT_EQ(value.param, "top_p");
  EXPECT_EQ(value.message, "'top_p' must be greater than 0, got 0");
  EXPECT_EQ(value.code, "");
  const RequestError too_long{
      .code = RequestErrorCode::kContextLengthExceeded, .param = "prompt", .message = "long"};
  EXPECT_EQ(api_error_from(too_long, "messages").param, "messages");
  EXPECT_EQ(api_error_from(too_long).code, "context_length_exceeded");
  const RequestError closing{.code = RequestErrorCode::kUnavailable,
                             .message = "the engine is shutting down"};
  EXPECT_EQ(api_error_from(closing).status, 503);
  EXPECT_EQ(api_error_from(closing).message, "the engine is shutting down");
}

TEST(ServerMetricsTest, RendersPrometheusText) {
  MetricsRegistry reg(std::vector<std::pair<std::string, std::string>>{{"model_name", "a\"b"}});
  reg.counter("x_total", "an x").inc(3);
  reg.gauge("y_ratio", "a y").set(0.25);
  Histogram& h = reg.histogram("z_seconds", "a z", {0.1, 1});
  h.observe(0.05);
  h.observe(0.5);
  h.observe(5);
  const std::string t = reg.render();
  EXPECT_NE(t.find("# TYPE x_total counter\nx_total{model_name=\"a\\\"b\"} 3\n"), std::string::npos)
      << t;
  EXPECT_NE(t.find("y_ratio{model_name=\"a\\\"b\"} 0.25\n"), std::string::npos) << t;
  EXPECT_NE(t.find("z_seconds_bucket{model_name=\"a\\\"b\",le=\"0.1\"} 1\n"), std::string::npos)
      << t;
  EXPECT_NE(t.find("z_seconds_bucket{model_name=\"a\\\"b\",le=\"1\"} 2\n"), std::string::npos) << t;
  EXPECT_NE(t.find("z_seconds_bucket{model_name=\"a\\\"b\",le=\"+Inf\"} 3\n"), std::string::npos)
      << t;
  EXPECT_NE(t.find("z_seconds_count{model_name=\"a\\\"b\"} 3\n"), std::string::npos) << t;
  EXPECT_NE(t.find("z_seconds_sum{model_name=\"a\\\"b\"} 5.55\n"), std::string::npos) << t;
}

TEST(ServerSseTest, Framing) {
  EXPECT_EQ(sse_event(nlohmann::json{{"a", 1}}), "data: {\"a\":1}\n\n");
  EXPECT_EQ(sse_done(), "data: [DONE]\n\n");
  // Keep-alives between events: every event reaches a reader that parses each non-empty line as
  // JSON after "data: " (SGLang's bench_serving), and one that splits events on blank lines.
  const std::string stream = sse_keepalive() + sse_event(nlohmann::json{{"a", 1}}) +
                             sse_keepalive() + sse_keepalive() +
                             sse_event(nlohmann::json{{"a", 2}}) + sse_keepalive() + sse_done();
  std::vector<int> by_lines, by_events;
  size_t start = 0;
  for (size_t nl; (nl = stream.find('\n', start)) != std::string::npos; start = nl + 1) {
    std::string line = stream.substr(start, nl - start);
    if (line.empty()) continue;
    ASSERT_TRUE(line.starts_with("data: ")) << line;
    line = line.substr(6);
    if (line != "[DONE]") by_lines.push_back(nlohmann::json::parse(line)["a"]);
  }
  start = 0;
  for (size_t end; (end = stream.find("\n\n", start)) != std::string::npos; start = end + 2) {
    const std::string event = stream.substr(start, end - start);
    if (event.empty()) continue;
    ASSERT_TRUE(event.starts_with("data: ")) << event;
    if (event != "data: [DONE]") by_events.push_back(nlohmann::json::parse(event.substr(6))["a"]);
  }
  EXPECT_EQ(by_lines, (std::vector<int>{1, 2}));
  EXPECT_EQ(by_events, (std::vector<int>{1, 2}));
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

// return_meta_info (SGLang's name) adds speculative decoding's per-request counts to usage.
TEST(ServerSchemaTest, ReturnMetaInfoAddsSpeculativeCountsToUsage) {
  OpenAiRequest r;
  auto e = parse_openai_request(R"({"model":"m","prompt":"a","return_meta_info":true})",
                                Endpoint::kCompletions, &r);
  ASSERT_FALSE(e) << e->message;
  EXPECT_TRUE(r.return_meta_info);
  OpenAiRequest plain;
  ASSERT_FALSE(
      parse_openai_request(R"({"model":"m","prompt":"a"})", Endpoint::kCompletions, &plain));
  EXPECT_FALSE(plain.return_meta_info);
  EXPECT_TRUE(parse_openai_request(R"({"model":"m","prompt":"a","return_meta_info":3})",
                                   Endpoint::kCompletions, &plain));

  Usage u{.prompt_tokens = 5, .completion_tokens = 9, .cached_tokens = 0};
  EXPECT_FALSE(u.to_json().contains("spec_verify_ct"));
  u.include_spec = true;
  u.spec_verify_ct = 4;
  u.spec_draft_token_num = 12;
  u.spec_accept_token_num = 5;
  const auto j = u.to_json();
  EXPECT_EQ(j["spec_verify_ct"], 4);
  EXPECT_EQ(j["spec_draft_token_num"], 12);
  EXPECT_EQ(j["spec_accept_token_num"], 5);
  EXPECT_DOUBLE_EQ(j["spec_accept_length"].get<double>(), 9.0 / 4.0);
}

}  // namespace
}  // namespace strata
