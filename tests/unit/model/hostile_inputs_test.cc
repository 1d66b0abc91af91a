// Hostile checkpoint files found by fuzzing (fuzz/safetensors_fuzz.cc, fuzz/config_fuzz.cc;
// FUZZING.md): each must be a clear error, never a crash. The inputs are also in
// fuzz/corpus/<target>/crash_*.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "model/config.h"
#include "model/inventory.h"
#include "model/safetensors.h"
#include "planner/planner.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

std::string nested(int depth) {
  return std::string(size_t(depth), '[') + std::string(size_t(depth), ']');
}

fs::path temp_dir(const std::string& name) {
  fs::path dir =
      fs::temp_directory_path() / ("strata_hostile_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// A __metadata__ value nested 200,000 deep (a 400 KB header) overflowed the stack when the
// loader dumped it back to text.
TEST(HostileSafetensors, DeeplyNestedMetadataIsAnError) {
  fs::path dir = temp_dir("st");
  const std::string path = (dir / "deep.safetensors").string();
  const std::string header = R"({"__metadata__": {"k": )" + nested(200000) + "}}";
  {
    std::ofstream out(path, std::ios::binary);
    uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) out.put(char(uint8_t(n >> (8 * i))));
    out << header;
  }
  auto f = SafetensorsFile::open(path);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(f.status().message().find("deep.safetensors: header: JSON nests deeper than"),
            std::string::npos)
      << f.status().to_string();
  fs::remove_all(dir);
}

TEST(HostileConfig, DeeplyNestedConfigIsAnError) {
  fs::path dir = temp_dir("cfg");
  std::ofstream(dir / "config.json")
      << R"({"model_type": "llama", "text_config": )" << nested(100000) << "}";
  auto spec = load_model_spec(dir.string());
  ASSERT_FALSE(spec.ok());
  EXPECT_NE(spec.status().message().find("config.json: JSON nests deeper than"), std::string::npos)
      << spec.status().to_string();
  fs::remove_all(dir);
}

nlohmann::json shared_config(const std::string& model) {
  std::ifstream in(std::string(STRATA_SHARED_DIR) + "/models/" + model + "/config.json");
  return nlohmann::json::parse(in);
}

// Sizes the fuzzer (fuzz/config_fuzz.cc) turned into hangs, out-of-memory or signed overflow in
// the tensor inventory and the planner. Each is now a config error naming the field.
TEST(HostileConfig, HugeSizesAreErrors) {
  struct Case {
    const char* model;
    const char* field;
    nlohmann::json value;
    const char* message;
  };
  const Case cases[] = {
      // A 2e9-layer inventory: the planner ran until killed.
      {"house-llama", "num_hidden_layers", 2000000000, "num_hidden_layers is 2000000000"},
      // 2e9 routed experts: likewise.
      {"house-mla", "n_routed_experts", 2000000000, "n_routed_experts is 2000000000"},
      // hidden x intermediate x layers overflowed int64 in summarize_inventory (UBSan).
      {"house-llama", "intermediate_size", 2147483647, "intermediate_size is 2147483647"},
      // Past int32: narrowed to the spec's int fields it wrapped to 64.
      {"house-llama", "hidden_size", 4294967360LL, "'hidden_size' is out of range"},
      {"house-llama", "num_attention_heads", -4294967295LL,
       "'num_attention_heads' is out of range"},
      // A float past int64: the cast was undefined.
      {"house-llama", "num_hidden_layers", 1e300, "'num_hidden_layers' is out of range"},
      {"house-llama", "partial_rotary_factor", 1e6, "rotary dims"},
  };
  for (const Case& c : cases) {
    nlohmann::json config = shared_config(c.model);
    config[c.field] = c.value;
    auto spec = parse_model_spec(config);
    ASSERT_FALSE(spec.ok()) << c.field;
    EXPECT_EQ(spec.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(spec.status().message().find(c.message), std::string::npos)
        << spec.status().to_string();
  }
  nlohmann::json config = shared_config("house-mla");
  config["num_hidden_layers"] = 1000;
  config["n_routed_experts"] = 4096;
  auto spec = parse_model_spec(config);
  ASSERT_FALSE(spec.ok());
  EXPECT_NE(spec.status().message().find("x n_routed_experts 4096 is more than 131072"),
            std::string::npos)
      << spec.status().to_string();
}

// The largest sizes the checks allow still plan without overflow (UBSan would abort here).
TEST(HostileConfig, LargestAllowedSizesPlan) {
  nlohmann::json config = shared_config("house-mla");
  config["vocab_size"] = 1 << 23;
  config["hidden_size"] = 1 << 17;
  config["intermediate_size"] = 1 << 18;
  config["moe_intermediate_size"] = 1 << 18;
  config["num_hidden_layers"] = 1 << 10;
  config["n_routed_experts"] = 1 << 7;  // 2^17 routed experts in all, the most allowed
  config["num_attention_heads"] = 1 << 12;
  config["num_key_value_heads"] = 1 << 12;
  auto spec = parse_model_spec(config);
  ASSERT_TRUE(spec.ok()) << spec.status().to_string();
  Deployment d;
  d.gpu_memory_bytes = int64_t(141) << 30;
  d.tp_size = 8;
  auto plan = plan_kv_capacity(*spec, d);
  EXPECT_FALSE(plan.ok());  // weights of ~1e18 bytes leave no room, which is an error, not a crash
}

}  // namespace
}  // namespace strata
