// Writes a random-weight checkpoint of a config's shape, in the config's stored format
// (bench_checkpoint.h's write_random_checkpoint), plus a tokenizer, for `strata generate` / `strata
// serve` runs on a real model shape: the end-to-end half of the engine-vs-generate comparison (the
// engine benchmark fills its device copies with the same distribution, offline_bench.cc).
//
// Usage: strata_bench_make_checkpoint --config PATH/config.json --out DIR [--tokenizer DIR] [--seed
// N]
//        [--scale S]
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

#include "bench_checkpoint.h"

using namespace strata;

int main(int argc, char** argv) {
  std::string config, out, tokenizer = std::string(STRATA_SHARED_DIR) + "/models/house-llama";
  uint64_t seed = 42;
  float scale = 0.02f;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--config")
      config = v;
    else if (k == "--out")
      out = v;
    else if (k == "--tokenizer")
      tokenizer = v;
    else if (k == "--seed")
      seed = std::stoull(v);
    else if (k == "--scale")
      scale = std::stof(v);
    else {
      std::fprintf(stderr, "unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  if (config.empty() || out.empty()) {
    std::fprintf(stderr,
                 "usage: %s --config PATH --out DIR [--tokenizer DIR] [--seed N] [--scale S]\n",
                 argv[0]);
    return 2;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t bytes = write_random_checkpoint(config, out, seed, scale);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}) {
    const std::string src = tokenizer + "/" + f;
    if (std::filesystem::exists(src))
      std::filesystem::copy_file(src, out + "/" + f,
                                 std::filesystem::copy_options::overwrite_existing);
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("checkpoint %s: %.2f GB of random weights from %s in %.1f s\n", out.c_str(),
              double(bytes) / 1e9, config.c_str(), s);
  return 0;
}
