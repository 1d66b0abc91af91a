// The planner's weight figure (model/inventory.h device_bytes, what `strata plan` and the engine
// size the KV pool with) equals the bytes the loaders really put on a backend, for every fixture
// and house model: one formula for the same bytes. On the CPU reference every weight is float32;
// the GPU parity suite checks the CUDA backend's packed formats the same way.
#include <gtest/gtest.h>

#include <filesystem>

#include "arch/model.h"
#include "backend/cpu/cpu_backend.h"
#include "model/config.h"
#include "model/inventory.h"
#include "model/weights.h"
#include "support/counting_backend.h"

namespace strata::testing {
namespace {

std::vector<std::string> model_dirs() {
  const std::string s = STRATA_SHARED_DIR;
  std::vector<std::string> dirs = {s + "/models/house-llama", s + "/models/house-mla"};
  for (const auto& e : std::filesystem::directory_iterator(s + "/fixtures/tiny"))
    dirs.push_back(e.path());
  const std::string repo = STRATA_REPO_FIXTURES_DIR "/tiny";
  if (std::filesystem::is_directory(repo))
    for (const auto& e : std::filesystem::directory_iterator(repo))
      if (std::filesystem::exists(e.path() / "model.safetensors")) dirs.push_back(e.path());
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

TEST(WeightBytes, LoadedBytesEqualThePlannersFigure) {
  int checked = 0;
  for (const std::string& dir : model_dirs()) {
    auto spec = load_model_spec(dir);
    ASSERT_TRUE(spec.ok()) << dir << ": " << spec.status().to_string();
    auto ws = WeightStore::open(dir, spec->quant);
    ASSERT_TRUE(ws.ok()) << ws.status().to_string();
    CountingBackend<cpu::CpuBackend> be;
    auto model = create_model(*spec, *ws, be);
    ASSERT_TRUE(model.ok()) << dir << ": " << model.status().to_string();
    const InventorySummary inv = summarize_inventory(*spec, build_inventory(*spec), 1,
                                                     quant_layout(*spec), be.weight_policy());
    EXPECT_EQ(be.weight_bytes(), inv.bytes_per_rank) << dir;
    // The float32 reference holds every parameter (biases included) as float32.
    EXPECT_EQ(inv.bytes_per_rank, 4 * inv.total_params) << dir;
    ++checked;
  }
  EXPECT_GE(checked, 10);
}

}  // namespace
}  // namespace strata::testing
