// `strata generate` end to end through the real binary: bad input gives one clear line and a
// non-zero exit without leaving an output file; concurrency does not change greedy outputs.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/engine.h"
#include "model/safetensors.h"
#include "tokenizer/tokenizer.h"

namespace fs = std::filesystem;

namespace {

const std::string kShared = STRATA_SHARED_DIR;
const std::string kBinary = STRATA_BINARY;
const std::string kHouse = kShared + "/models/house-llama";

struct CliRun {
  int exit_code = -1;
  std::string out, err;
};

// Runs the binary with `args` (already shell-quoted), capturing stdout and stderr.
CliRun run_cli(const std::string& args) {
  const fs::path dir = fs::temp_directory_path() / ("strata_cli_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string out = (dir / "stdout").string(), err = (dir / "stderr").string();
  const std::string cmd = kBinary + " " + args + " >" + out + " 2>" + err;
  const int status = std::system(cmd.c_str());
  CliRun r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  std::ifstream o(out), e(err);
  r.out.assign(std::istreambuf_iterator<char>(o), {});
  r.err.assign(std::istreambuf_iterator<char>(e), {});
  return r;
}

// A writable copy of house-llama in which tests break one thing.
class BrokenModel : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("strata_model_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    for (const auto& f : fs::directory_iterator(kHouse))
      fs::copy(f.path(), dir_ / f.path().filename());
    for (const auto& f : fs::directory_iterator(dir_))
      fs::permissions(f.path(), fs::perms::owner_all, fs::perm_options::add);
  }
  void TearDown() override { fs::remove_all(dir_); }
  CliRun generate() {
    return run_cli("generate --model-path " + dir_.string() + " --prompt hi --max-new-tokens 2");
  }
  fs::path dir_;
};

// One line on stderr (logs aside) that names the problem.
void expect_clear_error(const CliRun& r, const std::string& needle) {
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find(needle), std::string::npos) << "stderr: " << r.err;
  EXPECT_NE(r.err.find("error"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("CHECK failed"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

TEST(GenerateCli, MissingModelDirectory) {
  expect_clear_error(run_cli("generate --model-path /nonexistent/model --prompt hi"),
                     "/nonexistent/model");
}

// SGLang's graph flags: graphs exist on cuda only, never silently ignored elsewhere.
TEST(GenerateCli, CudaGraphFlags) {
  const std::string base = "generate --model-path " + kHouse + " --prompt hi --max-new-tokens 2 ";
  expect_clear_error(run_cli(base + "--cuda-graph-max-bs 8"),
                     "--cuda-graph-max-bs 8 needs --device cuda");
  expect_clear_error(run_cli(base + "--cuda-graph-max-bs -1"), "--cuda-graph-max-bs must be >= 0");
  expect_clear_error(run_cli(base + "--disable-cuda-graph --cuda-graph-max-bs 8"), "both given");
  CliRun r = run_cli(base + "--disable-cuda-graph");
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// The default --model-path is relative to the working directory: from elsewhere the error says
// it is the default and where it looked.
TEST(GenerateCli, MissingDefaultModelSaysItIsTheDefault) {
  CliRun r = run_cli("--help >/dev/null; cd / && " + kBinary + " generate --prompt hi");
  expect_clear_error(r, "the default --model-path");
  EXPECT_NE(r.err.find("working directory /"), std::string::npos) << r.err;
}

// --max-new-tokens 0 would fail every prompt: refused by the CLI, naming the flag.
TEST(GenerateCli, ZeroNewTokensIsRefused) {
  expect_clear_error(run_cli("generate --model-path " + kHouse + " --prompt hi --max-new-tokens 0"),
                     "--max-new-tokens must be >= 1, got 0");
}

// A prompt + --max-new-tokens beyond the KV pool fails with the reason (in text mode too), never
// a silently shorter answer.
TEST(GenerateCli, NeverFittingRequestFailsWithTheReason) {
  CliRun r = run_cli("generate --model-path " + kHouse +
                     " --prompt hi --max-new-tokens 100 --max-total-tokens 64");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("maximum context length is 64 tokens (the KV cache pool holds 64 tokens"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("--max-total-tokens"), std::string::npos) << r.err;
}

// Sampling flags go through the request contract: a bad value is refused naming its flag.
TEST(GenerateCli, BadSamplingFlagsNameThemselves) {
  expect_clear_error(run_cli("generate --model-path " + kHouse + " --prompt hi --min-p 2"),
                     "--min-p must be between 0 and 1, got 2");
  expect_clear_error(
      run_cli("generate --model-path " + kHouse + " --prompt hi --repetition-penalty 0"),
      "--repetition-penalty must be greater than 0");
  expect_clear_error(
      run_cli("generate --model-path " + kHouse + " --prompt hi --logit-bias '{\"5\": 200}'"),
      "--logit-bias values must be between -100 and 100");
  expect_clear_error(
      run_cli("generate --model-path " + kHouse + " --prompt hi --chat-template-kwargs '[1]'"),
      "--chat-template-kwargs must be a JSON object");
}

TEST(GenerateCli, UnknownFlag) {
  CliRun r = run_cli("generate --no-such-flag 3");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("no-such-flag"), std::string::npos) << r.err;
}

TEST_F(BrokenModel, TruncatedSafetensors) {
  fs::resize_file(dir_ / "model.safetensors", fs::file_size(dir_ / "model.safetensors") / 2);
  expect_clear_error(generate(), "model.safetensors");
}

TEST_F(BrokenModel, CorruptSafetensorsHeader) {
  std::fstream f(dir_ / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(8);
  f.write("#garbage#", 9);
  f.close();
  expect_clear_error(generate(), "model.safetensors");
}

TEST_F(BrokenModel, TensorOfWrongShape) {
  auto cfg = nlohmann::json::parse(std::ifstream(dir_ / "config.json"));
  cfg["intermediate_size"] = 1000;  // the stored MLP weights are 896 wide
  std::ofstream(dir_ / "config.json") << cfg.dump();
  expect_clear_error(generate(), "mlp");
}

TEST_F(BrokenModel, UnknownArchitecture) {
  auto cfg = nlohmann::json::parse(std::ifstream(dir_ / "config.json"));
  cfg["model_type"] = "gpt_neox";
  std::ofstream(dir_ / "config.json") << cfg.dump();
  expect_clear_error(generate(), "gpt_neox");
}

TEST(GenerateCli, MalformedJsonlLineLeavesNoOutput) {
  const fs::path dir = fs::temp_directory_path() / ("strata_jsonl_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path in = dir / "in.jsonl", out = dir / "out.jsonl";
  std::ofstream(in) << R"({"id": "a", "messages": [{"role": "user", "content": "hi"}]})"
                    << "\n"
                    << R"({"id": "b", "messages": [ oops )"
                    << "\n";
  CliRun r = run_cli("generate --model-path " + kHouse + " --input " + in.string() + " --output " +
                     out.string());
  expect_clear_error(r, "line 2");
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(fs::exists(out.string() + ".tmp"));
  fs::remove_all(dir);
}

// --max-running-requests 1 (one at a time) and the default concurrent run give identical greedy
// outputs for the same JSONL input.
TEST(GenerateCli, ConcurrencyDoesNotChangeGreedyOutputs) {
  const fs::path dir = fs::temp_directory_path() / ("strata_conc_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path in = dir / "in.jsonl";
  {
    std::ifstream src(kShared + "/data/prompts-define.jsonl");
    std::ofstream dst(in);
    std::string line;
    for (int i = 0; i < 24 && std::getline(src, line); ++i) dst << line << "\n";
  }
  const std::string common = "generate --model-path " + kHouse + " --input " + in.string() +
                             " --max-new-tokens 16 --temperature 0 --no-progress";
  CliRun serial =
      run_cli(common + " --max-running-requests 1 --output " + (dir / "serial.jsonl").string());
  CliRun batched = run_cli(common + " --output " + (dir / "batched.jsonl").string());
  ASSERT_EQ(serial.exit_code, 0) << serial.err;
  ASSERT_EQ(batched.exit_code, 0) << batched.err;
  // Results are written in completion order: compare by id.
  auto by_id = [](const fs::path& path) {
    std::map<std::string, nlohmann::json> m;
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      auto j = nlohmann::json::parse(line);
      m[j["id"].dump()] = j["conversations"];
    }
    return m;
  };
  auto a = by_id(dir / "serial.jsonl"), b = by_id(dir / "batched.jsonl");
  EXPECT_EQ(a, b);
  const int n = int(a.size());
  EXPECT_EQ(n, 24);
  fs::remove_all(dir);
}

// The README's main command reproduces the Hugging Face greedy reference text (greedy1), for the
// Llama and the DeepSeek (MLA + MoE) house models.
class HouseGreedy : public ::testing::TestWithParam<std::string> {};

TEST_P(HouseGreedy, HarborMatchesHuggingFaceGreedy) {
  const std::string model = kShared + "/models/" + GetParam();
  CliRun r = run_cli(
      "generate --model-path " + model +
      " --prompt 'What does the word \"harbor\" mean?' --max-new-tokens 32 --temperature 0");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto ref =
      strata::SafetensorsFile::open(kShared + "/fixtures/" + GetParam() + "/reference.safetensors");
  ASSERT_TRUE(ref.ok());
  std::vector<int32_t> ids;
  for (const auto& t : (*ref)->tensors())
    if (t.name == "greedy1.output_ids") {
      ids.resize(size_t(t.numel()));
      std::memcpy(ids.data(), t.data, ids.size() * 4);
    }
  ASSERT_EQ(ids.size(), 32u);
  auto tok = strata::Tokenizer::load(model);
  ASSERT_TRUE(tok.ok());
  EXPECT_EQ(r.out, tok->decode(ids, /*skip_special=*/true) + "\n");
}

INSTANTIATE_TEST_SUITE_P(Models, HouseGreedy, ::testing::Values("house-llama", "house-mla"),
                         [](const auto& info) {
                           return info.param == "house-llama" ? "llama" : "mla";
                         });

// The engine's KV capacity equals `strata plan` for the same deployment (one formula).
TEST(PlanCli, EngineCapacityEqualsPlan) {
  CliRun plan =
      run_cli("plan --model-path " + kHouse +
              " --device cpu --gpu-memory-gib 4 --mem-fraction-static 0.9 --page-size 16 "
              "--kv-cache-dtype f32 --json");  // f32: the CPU engine's exact (auto) KV dtype
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  const int64_t planned = nlohmann::json::parse(plan.out)["kv_tokens"].get<int64_t>();
  strata::EngineConfig c;
  c.model_path = kHouse;
  c.device_memory_gib = 4;
  c.mem_fraction_static = 0.9;
  c.page_size = 16;
  auto engine = strata::Engine::create(c);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  EXPECT_EQ((*engine)->kv_capacity_tokens(), planned);
}

}  // namespace
