// `strata generate --capture-hidden-states eagle3` (issue 25) end to end, in-process engine on
// house-llama:
//  - killed with SIGKILL again and again (checkpoints every 2 tokens, so resumed records continue
//    from partial outputs), then resumed by the same command: every id once, and each record's
//    tensors byte-identical to an uninterrupted run's (greedy; the CPU reference is
//    batch-invariant), no orphan tensors left (index entries == records, record files end at their
//    last tensor, no file the index does not name);
//  - --capture-only keeps the conversations and captures every position;
//  - a filesystem without the room is refused before the run, naming both numbers;
//  - --capture-drafter-config DIR captures the layers an EAGLE-3 drafter's config names (issue 26).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "pipeline/output_log.h"
#include "support/child_process.h"
#include "support/shared_prompts.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using testing_support::Child;
using testing_support::count_lines;
using testing_support::kill_at_moments;
using testing_support::read_file;
using testing_support::runs_to_end;
using testing_support::wait_for_lines;
using testing_support::write_shared_prompts;

const std::string kModel = testing_support::house_llama_path();

// id -> every tensor's bytes (name order), read through the index; checks each record file ends at
// its last tensor, that no other file is left (no orphan bytes) and that no id is twice in the
// index.
std::map<std::string, std::string> read_tensors(const std::string& hidden_dir) {
  std::map<std::string, std::string> out;
  std::map<std::string, int64_t> shard_end;
  std::ifstream in(hidden_dir + "/index.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    const std::string id = j["id"], shard = hidden_dir + "/" + j["shard"].get<std::string>();
    EXPECT_EQ(out.count(id), 0u) << id << " twice in the index";
    std::string bytes;
    for (const auto& [name, t] : j["tensors"].items()) {
      std::ifstream f(shard, std::ios::binary);
      f.seekg(t["offset"].get<int64_t>());
      std::string b(size_t(t["nbytes"].get<int64_t>()), '\0');
      f.read(b.data(), std::streamsize(b.size()));
      EXPECT_TRUE(bool(f)) << id << " " << name;
      bytes += b;
      shard_end[shard] =
          std::max(shard_end[shard], t["offset"].get<int64_t>() + t["nbytes"].get<int64_t>());
    }
    out[id] = std::move(bytes);
  }
  for (const auto& [shard, end] : shard_end) EXPECT_EQ(int64_t(fs::file_size(shard)), end) << shard;
  // No file the index does not name (a record in flight at a kill, never committed).
  for (const auto& f : fs::directory_iterator(hidden_dir)) {
    if (f.path().extension() == ".safetensors") {
      EXPECT_EQ(shard_end.count(f.path().string()), 1u) << f.path() << " is an orphan";
    }
  }
  return out;
}

class CaptureCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("strata_capture_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

TEST_F(CaptureCli, KilledAndResumedCaptureEqualsAnUninterruptedRun) {
  // 80 prompts: room for ten kills (with 40 a fast machine finished after five, 2026-12-02).
  constexpr int kPrompts = 80, kKills = 10;
  const std::string input = path("define.jsonl");
  const std::vector<std::string> ids = write_shared_prompts(input, "define", kPrompts);
  auto cmd = [&](const std::string& output) {
    return std::vector<std::string>{STRATA_BINARY,
                                    "generate",
                                    "--model-path",
                                    kModel,
                                    "--input",
                                    "define=" + input,
                                    "--output",
                                    output,
                                    "--max-new-tokens",
                                    "8",
                                    "--concurrency",
                                    "6",
                                    "--checkpoint-tokens",
                                    "2",
                                    "--capture-hidden-states",
                                    "eagle3"};
  };
  // The uninterrupted run.
  const std::string clean = path("clean/out.jsonl"), log = path("log.txt");
  fs::create_directories(path("clean"));
  ASSERT_TRUE(runs_to_end(cmd(clean), log));
  const std::string out = path("killed/out.jsonl");
  fs::create_directories(path("killed"));
  std::mt19937 rng(std::random_device{}());
  const unsigned seed = rng();
  rng.seed(seed);
  int kills = 0;
  auto moment = [&](Child& c, int k) -> std::optional<int> {
    if (k % 4 == 0) return c.wait_for(int(rng() % 800));
    const std::optional<int> rc =
        wait_for_lines(c, dir_.string(), out, count_lines(out) + 1 + int64_t(rng() % 6));
    return rc ? rc : c.wait_for(int(rng() % 150));
  };
  ASSERT_TRUE(kill_at_moments(cmd(out), log, kKills, moment, &kills));
  ASSERT_TRUE(runs_to_end(cmd(out), log));
  EXPECT_GE(kills, 6) << "seed " << seed;

  auto scan = scan_output(out);
  ASSERT_TRUE(scan.ok());
  EXPECT_EQ(scan->records, kPrompts);
  EXPECT_TRUE(scan->duplicates.empty());
  const auto clean_tensors = read_tensors(path("clean/hidden/out"));
  const auto tensors = read_tensors(path("killed/hidden/out"));
  EXPECT_EQ(tensors.size(), size_t(kPrompts));
  EXPECT_EQ(clean_tensors.size(), size_t(kPrompts));
  int identical = 0;
  for (const auto& id : ids) {
    ASSERT_TRUE(tensors.count(id)) << id;
    if (tensors.at(id) == clean_tensors.at(id))
      ++identical;
    else
      ADD_FAILURE() << id << ": tensors differ from the uninterrupted run (kill seed " << seed
                    << ")";
  }
  EXPECT_TRUE(fs::exists(path("killed/hidden/out/meta.json")));
  std::printf(
      "capture: %d kills, %d/%d records byte-identical to the uninterrupted run (seed %u)\n", kills,
      identical, kPrompts, seed);
}

TEST_F(CaptureCli, CaptureOnlyKeepsConversationsAndCapturesEveryPosition) {
  const std::string input = path("conv.jsonl"), out = path("out.jsonl"), log = path("log.txt");
  const std::vector<nlohmann::json> lines = {
      {{"id", "a"},
       {"conversations",
        {{{"role", "user"}, {"content", "Define \"Brookside\"."}},
         {{"role", "assistant"}, {"content", "A brook."}}}}},
      {{"id", "b"},
       {"conversations",
        {{{"role", "user"}, {"content", "Hi"}},
         {{"role", "assistant"}, {"content", "Hello."}},
         {{"role", "user"}, {"content", "Bye"}},
         {{"role", "assistant"}, {"content", "Goodbye."}}}}}};
  {
    std::ofstream f(input);
    for (const auto& l : lines) f << l.dump() << "\n";
  }
  Child c =
      Child::spawn({STRATA_BINARY, "generate", "--model-path", kModel, "--input", "conv=" + input,
                    "--output", out, "--capture-hidden-states", "eagle3", "--capture-only"},
                   log);
  auto rc = c.wait_for(120000);
  ASSERT_TRUE(rc.has_value());
  ASSERT_EQ(*rc, 0) << read_file(log);
  std::ifstream in(out);
  std::string line;
  std::map<std::string, int> prompt_tokens;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    const std::string id = j["id"];
    for (const auto& l : lines)
      if (l["id"] == id) {
        EXPECT_EQ(j["conversations"], l["conversations"]) << id;
      }
    prompt_tokens[id] = j["meta"]["prompt_tokens"].get<int>();
  }
  ASSERT_EQ(prompt_tokens.size(), 2u);
  std::ifstream idx(path("hidden/out/index.jsonl"));
  int entries = 0;
  while (std::getline(idx, line)) {
    auto j = nlohmann::json::parse(line);
    const int t = j["tokens"].get<int>();
    EXPECT_EQ(t, prompt_tokens[j["id"]]);
    EXPECT_EQ(j["tensors"]["aux_hidden_state"]["shape"], nlohmann::json({t, 3 * 320}));
    EXPECT_EQ(j["tensors"]["hidden_state"]["shape"], nlohmann::json({t, 320}));
    EXPECT_EQ(j["tensors"]["loss_mask"]["shape"], nlohmann::json({t}));
    ++entries;
  }
  EXPECT_EQ(entries, 2);
}

TEST_F(CaptureCli, RefusesToStartWithoutRoomNamingBothNumbers) {
  const std::string input = path("p.jsonl"), out = path("out.jsonl"), log = path("log.txt");
  std::ofstream(input) << R"({"id": "x", "conversations": [{"role": "user", "content": "Hi"}]})"
                       << "\n";
  Child c =
      Child::spawn({STRATA_BINARY, "generate", "--model-path", kModel, "--input", "p=" + input,
                    "--output", out, "--max-new-tokens", "100", "--capture-hidden-states", "eagle3",
                    "--capture-assume-free-bytes", "123456"},
                   log);
  auto rc = c.wait_for(120000);
  ASSERT_TRUE(rc.has_value());
  EXPECT_NE(*rc, 0);
  const std::string text = read_file(log);
  // (3 + 1) x 320 x 2 B + 8 = 2,568 bytes per token.
  EXPECT_NE(text.find("2568 bytes per token"), std::string::npos) << text;
  EXPECT_NE(text.find("has 123456 bytes"), std::string::npos) << text;
  EXPECT_EQ(count_lines(out), 0);
}

// The layers come from the drafter's eagle_config.eagle_aux_hidden_state_layer_ids (the committed
// house-llama drafter's config with its ids changed to [0, 2, 6]); with --capture-layers too, or a
// directory without a drafter config, the run is refused before it starts.
TEST_F(CaptureCli, DrafterConfigNamesTheLayers) {
  const std::string input = path("p.jsonl"), out = path("out.jsonl"), log = path("log.txt");
  std::ofstream(input) << R"({"id": "x", "conversations": [{"role": "user", "content": "Hi"}]})"
                       << "\n";
  const std::string drafter = path("drafter");
  fs::create_directories(drafter);
  auto config = nlohmann::json::parse(
      read_file(std::string(STRATA_REPO_FIXTURES_DIR) + "/eagle3/house-llama/config.json"));
  config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = {0, 2, 6};
  std::ofstream(drafter + "/config.json") << config.dump();
  auto run = [&](std::vector<std::string> extra) {
    std::vector<std::string> cmd = {STRATA_BINARY,      "generate",   "--model-path", kModel,
                                    "--input",          "p=" + input, "--output",     out,
                                    "--max-new-tokens", "3",          "--no-progress"};
    cmd.insert(cmd.end(), extra.begin(), extra.end());
    Child c = Child::spawn(cmd, log);
    auto rc = c.wait_for(120000);
    EXPECT_TRUE(rc.has_value());
    return rc.value_or(-1);
  };
  ASSERT_EQ(run({"--capture-drafter-config", drafter}), 0) << read_file(log);
  auto meta = nlohmann::json::parse(read_file(path("hidden/out/meta.json")));
  EXPECT_EQ(meta["capture"]["layers"], nlohmann::json({0, 2, 6})) << meta.dump();
  std::ifstream idx(path("hidden/out/index.jsonl"));
  std::string line;
  ASSERT_TRUE(std::getline(idx, line));
  EXPECT_EQ(nlohmann::json::parse(line)["tensors"]["aux_hidden_state"]["shape"][1], 3 * 320);

  fs::remove_all(path("hidden"));
  fs::remove(out);
  EXPECT_NE(run({"--capture-drafter-config", drafter, "--capture-layers", "1,2,3"}), 0);
  EXPECT_NE(read_file(log).find("both name the layers"), std::string::npos) << read_file(log);
  EXPECT_NE(run({"--capture-drafter-config", path("nowhere")}), 0);
  EXPECT_NE(read_file(log).find("--capture-drafter-config"), std::string::npos) << read_file(log);
}

}  // namespace
}  // namespace strata
