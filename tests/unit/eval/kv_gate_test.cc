// The KV quality gate: refuses lossy KV without a record within budget, accepts with one or
// with --allow-lossy-kv; records are matched by model fingerprint and KV key.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "eval/kv_quality.h"
#include "model/config.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

std::string model_dir(const char* name) {
  return std::string(STRATA_SHARED_DIR) + "/models/" + name;
}

class KvGate : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / ("strata_kv_gate_" + std::to_string(::getpid()))).string();
    fs::remove_all(dir_);
    auto spec = load_model_spec(model_dir("house-llama"));
    ASSERT_TRUE(spec.ok());
    auto c =
        resolve_kv_cache_config({.dtype = KvCacheDtype::kFp8E4M3}, *spec, nullptr, DType::kBF16);
    ASSERT_TRUE(c.ok());
    fp8_ = *c;
    auto id = model_identity(model_dir("house-llama"));
    ASSERT_TRUE(id.ok()) << id.status().to_string();
    id_ = *id;
  }
  void TearDown() override { fs::remove_all(dir_); }

  nlohmann::json record(const std::string& key, double kld, const std::string& date) const {
    return {{"format", kKvRecordFormat},
            {"date", date},
            {"model", {{"name", id_.name}, {"fingerprint", id_.fingerprint}}},
            {"kv", {{"key", key}}},
            {"metrics", {{"tokens", 1000}, {"kld", {{"mean", kld}, {"se", kld / 10}}}}}};
  }

  std::string dir_;
  KvCacheConfig fp8_;
  ModelIdentity id_;
};

TEST_F(KvGate, DecisionsAsSpecified) {
  KvGateOptions o;  // budget 0.001
  KvCacheConfig exact = fp8_;
  exact.dtype = DType::kBF16;
  EXPECT_TRUE(decide_kv_gate(exact, std::nullopt, o).allowed);

  const KvGateDecision none = decide_kv_gate(fp8_, std::nullopt, o);
  EXPECT_FALSE(none.allowed);
  EXPECT_NE(none.message.find("--allow-lossy-kv"), std::string::npos);

  EXPECT_TRUE(decide_kv_gate(fp8_, record(fp8_.key(), 0.0009, "d"), o).allowed);
  const KvGateDecision over = decide_kv_gate(fp8_, record(fp8_.key(), 0.002, "d"), o);
  EXPECT_FALSE(over.allowed);
  EXPECT_NE(over.message.find("0.002000"), std::string::npos);  // states the measured quality

  o.budget_nats = 0.01;
  EXPECT_TRUE(decide_kv_gate(fp8_, record(fp8_.key(), 0.002, "d"), o).allowed);

  o.budget_nats = 0.001;
  o.allow_lossy = true;
  const KvGateDecision forced = decide_kv_gate(fp8_, record(fp8_.key(), 0.002, "d"), o);
  EXPECT_TRUE(forced.allowed);
  EXPECT_TRUE(forced.warn);
  EXPECT_TRUE(decide_kv_gate(fp8_, std::nullopt, o).allowed);
}

TEST_F(KvGate, RecordsAreFoundByFingerprintAndKey) {
  ASSERT_TRUE(save_kv_record(dir_, record(fp8_.key(), 0.5, "2024-01-01T00:00:00Z")).ok());
  ASSERT_TRUE(save_kv_record(dir_, record("other-key", 0.0, "2030-01-01T00:00:00Z")).ok());
  auto found = find_kv_record({dir_, dir_ + "/missing"}, id_.fingerprint, fp8_.key());
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ((*found)["metrics"]["kld"]["mean"], 0.5);
  EXPECT_FALSE(find_kv_record({dir_}, "0000000000000000", fp8_.key()).has_value());
  // The newest matching record wins (a second save in the same second gets its own file name
  // only when the key differs, so write this one directly).
  nlohmann::json newer = record(fp8_.key(), 0.0001, "2025-01-01T00:00:00Z");
  std::ofstream(dir_ + "/newer.json") << newer.dump();
  EXPECT_EQ((*find_kv_record({dir_}, id_.fingerprint, fp8_.key()))["metrics"]["kld"]["mean"],
            0.0001);
}

TEST_F(KvGate, RecordsOfTheDeployedConfigurationArePreferred) {
  // One record per deployment for the same model and KV key; the gate takes the one measured where
  // it runs, and falls back (saying so) to another deployment's only when there is none.
  auto at = [&](const char* device, int tp, double kld, const char* date) {
    nlohmann::json r = record(fp8_.key(), kld, date);
    r["deployment"] = KvDeployment{.device = device, .tp_size = tp}.to_json();
    r["noise_floor"] = {{"kld", {{"mean", kld / 40}}}};
    return r;
  };
  fs::create_directories(dir_);
  std::ofstream(dir_ + "/cpu.json") << at("cpu", 1, 0.0001, "2030-01-01T00:00:00Z").dump();
  std::ofstream(dir_ + "/cuda8.json") << at("cuda", 8, 0.0002, "2025-01-01T00:00:00Z").dump();
  const KvDeployment cuda8{.device = "cuda", .tp_size = 8};
  auto found = find_kv_record({dir_}, id_.fingerprint, fp8_.key(), cuda8);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ((*found)["metrics"]["kld"]["mean"], 0.0002);  // older, but of this deployment
  EXPECT_TRUE((*found)["deployment_matches"].get<bool>());
  KvGateOptions o;
  o.deployment = cuda8;
  const KvGateDecision d = decide_kv_gate(fp8_, found, o);
  EXPECT_TRUE(d.allowed);
  EXPECT_NE(d.message.find("admitted"), std::string::npos) << d.message;
  EXPECT_NE(d.message.find("cuda8.json"), std::string::npos) << d.message;  // names the record
  EXPECT_NE(d.message.find("40.0x the noise floor"), std::string::npos) << d.message;
  EXPECT_NE(d.message.find("measured on cuda tp 8"), std::string::npos) << d.message;

  // No record of cuda tp 2: the newest of another deployment, flagged as such.
  const KvDeployment cuda2{.device = "cuda", .tp_size = 2};
  auto other = find_kv_record({dir_}, id_.fingerprint, fp8_.key(), cuda2);
  ASSERT_TRUE(other.has_value());
  EXPECT_FALSE((*other)["deployment_matches"].get<bool>());
  EXPECT_EQ((*other)["metrics"]["kld"]["mean"], 0.0001);
  o.deployment = cuda2;
  const KvGateDecision d2 = decide_kv_gate(fp8_, other, o);
  EXPECT_NE(d2.message.find("not this deployment (cuda tp 2"), std::string::npos) << d2.message;
  // A record without "deployment" was made on the CPU at tp 1.
  EXPECT_EQ(KvDeployment::from_record(record(fp8_.key(), 0.1, "d")), KvDeployment{});
}

TEST_F(KvGate, EnforcedOnTheHouseModel) {
  KvGateOptions o;
  o.records_dir = dir_;
  const KvCacheOptions fp8{.dtype = KvCacheDtype::kFp8E4M3};
  const Status refused = enforce_kv_quality_gate(model_dir("house-llama"), fp8, o);
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition) << refused.to_string();
  EXPECT_TRUE(
      enforce_kv_quality_gate(model_dir("house-llama"), {.dtype = KvCacheDtype::kBF16}, o).ok());

  ASSERT_TRUE(save_kv_record(dir_, record(fp8_.key(), 0.0004, "2024-01-01T00:00:00Z")).ok());
  EXPECT_TRUE(enforce_kv_quality_gate(model_dir("house-llama"), fp8, o).ok());
  // Another configuration of the same model is not covered by that record.
  EXPECT_FALSE(
      enforce_kv_quality_gate(model_dir("house-llama"), {.dtype = KvCacheDtype::kFp8E5M2}, o).ok());
  EXPECT_FALSE(enforce_kv_quality_gate(model_dir("house-llama"),
                                       {.dtype = KvCacheDtype::kFp8E4M3, .bf16_layers = {0}}, o)
                   .ok());
  // Nor is another model.
  EXPECT_FALSE(enforce_kv_quality_gate(model_dir("house-mla"), fp8, o).ok());
  o.budget_nats = 0.0001;
  EXPECT_FALSE(enforce_kv_quality_gate(model_dir("house-llama"), fp8, o).ok());
  o.allow_lossy = true;
  EXPECT_TRUE(enforce_kv_quality_gate(model_dir("house-llama"), fp8, o).ok());
}

TEST(KvGateIdentity, FingerprintsDifferBetweenModels) {
  auto a = model_identity(model_dir("house-llama"));
  auto b = model_identity(model_dir("house-mla"));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->fingerprint, b->fingerprint);
  EXPECT_EQ(a->name, "house-llama");
  EXPECT_EQ(a->fingerprint, model_identity(model_dir("house-llama"))->fingerprint);
}

}  // namespace
}  // namespace strata
