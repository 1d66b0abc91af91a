// /tokenize and /detokenize through the real server (server/tokenize_api.h): the tokens are the
// ones a generation request is given (the same count in usage, the same greedy text from them as
// token ids), conversations as the chat endpoint renders them (a final assistant message
// continued too), text back from the ids, and errors naming the field.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "server_process.h"

namespace strata::e2e {
namespace {

using nlohmann::json;

TEST(ServeTokenizeTest, TokensAreTheOnesGenerationSees) {
  ServerProcess server;
  ASSERT_TRUE(server.start({})) << server.log();
  const int port = server.port();
  const std::string prompt = "The Linux kernel schedules <|im_end|> tasks.";

  const json t = post_json(port, "/tokenize", {{"prompt", prompt}});
  ASSERT_TRUE(t["tokens"].is_array()) << t;
  EXPECT_EQ(t["count"], t["tokens"].size());
  EXPECT_GT(t["max_model_len"].get<int>(), 0);
  const json by_text = post_json(port, "/v1/completions",
                                 {{"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0}});
  EXPECT_EQ(by_text["usage"]["prompt_tokens"], t["count"]) << by_text;
  const json by_ids = post_json(port, "/v1/completions",
                                {{"prompt", t["tokens"]}, {"max_tokens", 6}, {"temperature", 0}});
  EXPECT_EQ(by_ids["choices"][0]["text"], by_text["choices"][0]["text"]);

  // Back to text (special tokens kept when asked), as a batch too, under /v1/ as vLLM serves it.
  const json d =
      post_json(port, "/v1/detokenize", {{"tokens", t["tokens"]}, {"skip_special_tokens", false}});
  EXPECT_EQ(d["text"], prompt) << d;
  EXPECT_EQ(d["prompt"], prompt) << d;
  const json batch = post_json(port, "/v1/tokenize", {{"prompt", {"a b", "c"}}});
  ASSERT_EQ(batch["tokens"].size(), 2u) << batch;
  EXPECT_EQ(batch["count"][1], batch["tokens"][1].size());
  const json texts = post_json(port, "/detokenize", {{"tokens", batch["tokens"]}});
  EXPECT_EQ(texts["text"], json({"a b", "c"})) << texts;

  // A conversation counts as the chat endpoint renders it.
  const json messages = {{{"role", "user"}, {"content", "What is a daemon?"}}};
  const json chat_tokens = post_json(port, "/tokenize", {{"messages", messages}});
  const json chat = post_json(port, "/v1/chat/completions",
                              {{"messages", messages}, {"max_tokens", 2}, {"temperature", 0}});
  EXPECT_EQ(chat["usage"]["prompt_tokens"], chat_tokens["count"]) << chat_tokens;

  // A conversation left open (vLLM's continue_final_message): its tokens without the generation
  // prompt, cut right after the final assistant message's content, and the greedy text goes on
  // from there; add_generation_prompt false alone: all of those tokens.
  const json open = {{{"role", "user"}, {"content", "What is a daemon?"}},
                     {{"role", "assistant"}, {"content", "A daemon is"}}};
  const json closed =
      post_json(port, "/tokenize", {{"messages", open}, {"add_generation_prompt", false}});
  const json cont = post_json(port, "/v1/chat/completions",
                              {{"messages", open},
                               {"add_generation_prompt", false},
                               {"continue_final_message", true},
                               {"max_tokens", 6},
                               {"temperature", 0}});
  const int n = cont["usage"]["prompt_tokens"].get<int>();
  ASSERT_LT(n, closed["count"].get<int>()) << cont << closed;
  json head = json::array();
  for (int i = 0; i < n; ++i) head.push_back(closed["tokens"][i]);
  const std::string head_text =
      post_json(port, "/detokenize", {{"tokens", head}, {"skip_special_tokens", false}})["text"];
  EXPECT_EQ(head_text.substr(head_text.size() - 11), "A daemon is") << head_text;
  const json from_head =
      post_json(port, "/v1/completions", {{"prompt", head}, {"max_tokens", 6}, {"temperature", 0}});
  EXPECT_EQ(cont["choices"][0]["message"]["content"], from_head["choices"][0]["text"]) << cont;
  const json whole = post_json(port, "/v1/chat/completions",
                               {{"messages", open},
                                {"add_generation_prompt", false},
                                {"max_tokens", 1},
                                {"temperature", 0}});
  EXPECT_EQ(whole["usage"]["prompt_tokens"], closed["count"]) << whole;
  const HttpResponse not_open = http(port, "POST", "/v1/chat/completions",
                                     json{{"messages", messages},
                                          {"add_generation_prompt", false},
                                          {"continue_final_message", true}}
                                         .dump());
  EXPECT_EQ(not_open.status, 400) << not_open.body;
  EXPECT_NE(not_open.body.find("final message to be the assistant's"), std::string::npos)
      << not_open.body;

  for (const auto& [path, body, param] :
       {std::tuple{"/tokenize", R"({"prompt": 5})", "prompt"},
        std::tuple{"/tokenize", R"({"prompt": "x", "add_special_tokens": "yes"})",
                   "add_special_tokens"},
        std::tuple{"/detokenize", R"({"tokens": [1, 99999999]})", "tokens"},
        std::tuple{"/detokenize", R"({"tokens": "abc"})", "tokens"}}) {
    const HttpResponse r = http(port, "POST", path, body);
    EXPECT_EQ(r.status, 400) << path << " " << body << ": " << r.body;
    EXPECT_EQ(json::parse(r.body)["error"]["param"], param) << r.body;
  }
  EXPECT_EQ(server.stop(), 0) << server.log();
}

}  // namespace
}  // namespace strata::e2e
