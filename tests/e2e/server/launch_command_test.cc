// The users' SGLang launch command (issue 32) on CPU ranks: `--tp-size 5` on house-mla (5 heads)
// with the host KV tier, NCCL variables and every flag of their command. It starts, serves the
// official `openai` npm client, promotes prefixes evicted to the host tier back on every rank
// (each rank's host hits in /metrics), and its greedy completions equal tp 1's with the tier and
// without it. The device pool holds one prefix at a time (--max-total-tokens), so the second
// round of prompts finds its prefixes on host only.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "server_process.h"

namespace strata::e2e {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string house_mla() { return std::string(STRATA_SHARED_DIR) + "/models/house-mla"; }

// Three long held-out texts as shared prefixes, each asked twice with a different ending.
std::vector<std::string> prompts() {
  std::ifstream in(std::string(STRATA_SHARED_DIR) + "/data/heldout.jsonl");
  std::vector<std::string> texts;
  std::string line;
  while (texts.size() < 3 && std::getline(in, line)) {
    const json j = json::parse(line);
    if (j.contains("text") && j["text"].get<std::string>().size() > 400)
      texts.push_back(j["text"].get<std::string>());
  }
  EXPECT_EQ(texts.size(), 3u);
  std::vector<std::string> out;
  for (const char* ending : {" In short,", " That is,"})
    for (const std::string& t : texts) out.push_back(t.substr(0, 120) + ending);
  return out;
}

// The sample of `name` whose labels include `label` (e.g. rank="2"); -1 when absent.
double labelled_value(const std::string& metrics, const std::string& name,
                      const std::string& label) {
  std::istringstream in(metrics);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(name + "{", 0) == 0 && line.find(label) != std::string::npos)
      return std::atof(line.c_str() + line.rfind(' ') + 1);
  return -1;
}

struct Served {
  json completions;
  std::string metrics;
  std::string log;
};

// Starts `strata serve` on house-mla with `args`, runs the node client over the prompts, and
// returns its completions and the final /metrics (once the host-tier counters settled).
Served serve_and_complete(std::vector<std::string> args, const fs::path& dir,
                          const std::string& name, int tp_with_tier) {
  Served s;
  ServerProcess server;
  server.set_model_path(house_mla());
  for (const char* v : {"NCCL_PROTO=LL", "NCCL_ALGO=Ring", "NCCL_P2P_LEVEL=SYS",
                        "NCCL_MAX_NCHANNELS=16", "NCCL_BUFFSIZE=16777216", "NCCL_NTHREADS=512"}) {
    const std::string kv = v;
    server.set_env(kv.substr(0, kv.find('=')), kv.substr(kv.find('=') + 1));
  }
  EXPECT_TRUE(server.start(args)) << server.log();
  if (server.port() <= 0) return s;
  const fs::path js_dir = fs::path(STRATA_SOURCE_DIR) / "tests" / "e2e" / "js";
  const fs::path output = dir / (name + ".json");
  std::string out;
  const std::string cmd = "cd '" + js_dir.string() +
                          "' && STRATA_BASE_URL=http://127.0.0.1:" + std::to_string(server.port()) +
                          "/v1 STRATA_PROMPTS_FILE='" + (dir / "prompts.json").string() +
                          "' STRATA_OUTPUT_FILE='" + output.string() +
                          "' node --test completions_to_file.test.mjs";
  EXPECT_EQ(run_command(cmd, &out), 0) << name << ": " << out;
  s.completions = json::parse(read_file(output.string()), nullptr, false);
  // Each rank's counters are gathered when the engine goes idle, right after the last reply.
  poll_until(
      [&] {
        s.metrics = http(server.port(), "GET", "/metrics").body;
        return tp_with_tier == 0 ||
               labelled_value(s.metrics, "strata_hicache_rank_hit_tokens_total",
                              "rank=\"" + std::to_string(tp_with_tier - 1) + "\"") > 0;
      },
      30);
  EXPECT_EQ(server.stop(), 0) << server.log();
  s.log = server.log();
  return s;
}

TEST(LaunchCommandTest, TensorParallelHostTierServesTheOfficialClientLikeTp1) {
  ASSERT_TRUE(
      fs::exists(fs::path(STRATA_SOURCE_DIR) / "tests" / "e2e" / "js" / "node_modules" / "openai"))
      << "run `npm ci` in tests/e2e/js (scripts/setup.sh does it)";
  const fs::path dir =
      fs::temp_directory_path() / ("strata_launch_command_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::vector<std::string> ps = prompts();
  std::ofstream(dir / "prompts.json") << json(ps).dump();

  // The command (host and port aside), at tp 5 on CPU ranks; --tp-allow-uneven: house-mla's
  // MLP and vocabulary do not divide by 5. One 120-character prefix (~60 tokens) fits the pool.
  const std::vector<std::string> pool = {"--page-size", "16", "--max-total-tokens", "96"};
  std::vector<std::string> users = {"--trust-remote-code",
                                    "--tp-size",
                                    "5",
                                    "--tp-allow-uneven",
                                    "--mem-fraction-static",
                                    "0.88",
                                    "--host",
                                    "127.0.0.1",
                                    "--num-continuous-decode-steps",
                                    "4",
                                    "--disable-custom-all-reduce",
                                    "--enable-hierarchical-cache",
                                    "--hicache-size",
                                    "0.002",
                                    "--hicache-write-policy",
                                    "write_through",
                                    "--hicache-io-backend",
                                    "kernel",
                                    "--log-level",
                                    "info"};
  users.insert(users.end(), pool.begin(), pool.end());
  std::vector<std::string> tp1_tier = {"--enable-hierarchical-cache", "--hicache-size", "0.002"};
  tp1_tier.insert(tp1_tier.end(), pool.begin(), pool.end());

  const Served plain = serve_and_complete(pool, dir, "tp1", 0);
  const Served tier1 = serve_and_complete(tp1_tier, dir, "tp1_tier", 1);
  const Served tier5 = serve_and_complete(users, dir, "tp5_tier", 5);
  ASSERT_TRUE(plain.completions.is_array() && plain.completions.size() == ps.size())
      << plain.completions;
  for (size_t i = 0; i < ps.size(); ++i) {
    EXPECT_EQ(tier1.completions[i]["text"], plain.completions[i]["text"])
        << "tp 1 with the tier, prompt " << i;
    EXPECT_EQ(tier5.completions[i]["text"], plain.completions[i]["text"])
        << "tp 5 with the tier, prompt " << i;
  }
  EXPECT_NE(tier5.log.find("tensor parallel: 5 ranks on cpu"), std::string::npos) << tier5.log;
  EXPECT_NE(tier5.log.find("Host KV tier:"), std::string::npos) << tier5.log;
  // Rank 0 promoted from host; every rank did the same on its own pool.
  const double hits = metric_value(tier5.metrics, "strata_hicache_hit_tokens_total");
  std::printf("tp 5: %.0f prompt tokens promoted from host; cached tokens per prompt:", hits);
  for (const json& c : tier5.completions) std::printf(" %d", c["cached_tokens"].get<int>());
  std::printf("\n");
  EXPECT_GT(hits, 0) << tier5.metrics;
  EXPECT_EQ(hits, metric_value(tier1.metrics, "strata_hicache_hit_tokens_total"));
  for (int r = 0; r < 5; ++r) {
    const std::string rank = "rank=\"" + std::to_string(r) + "\"";
    EXPECT_EQ(labelled_value(tier5.metrics, "strata_hicache_rank_hit_tokens_total", rank), hits)
        << rank;
    EXPECT_GT(labelled_value(tier5.metrics, "strata_hicache_rank_bytes_to_device_total", rank), 0)
        << rank;
    EXPECT_GT(labelled_value(tier5.metrics, "strata_hicache_rank_bytes_to_host_total", rank), 0)
        << rank;
    EXPECT_GE(labelled_value(tier5.metrics, "strata_hicache_rank_copy_seconds_total", rank), 0)
        << rank;
  }
  EXPECT_EQ(labelled_value(tier5.metrics, "strata_hicache_rank_hit_tokens_total", "rank=\"5\""),
            -1);
  std::string out;
  if (run_command("command -v promtool", &out) ==
      0) {  // the per-rank series are valid exposition text
    std::ofstream(dir / "metrics.txt") << tier5.metrics;
    EXPECT_EQ(run_command("promtool check metrics < " + (dir / "metrics.txt").string(), &out), 0)
        << out;
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace strata::e2e
