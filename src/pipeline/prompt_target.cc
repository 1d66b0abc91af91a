#include "pipeline/prompt_target.h"

#include <algorithm>
#include <cmath>
#include <string>

#include <fmt/format.h>

namespace strata {

namespace {
// 0.8f as 0.8, not 0.800000011920929: the shortest decimal that reads back as the same float.
double shortest(float v) { return std::stod(fmt::format("{}", v)); }
}  // namespace

nlohmann::json JobSampling::to_json() const {
  return {{"temperature", shortest(temperature)}, {"top_p", shortest(top_p)},   {"top_k", top_k},
          {"max_new_tokens", max_new_tokens}, {"stop", stop}, {"ignore_eos", ignore_eos},
          {"seed", seed}};
}

double backoff_delay_s(const RetryPolicy& policy, int retry, std::mt19937_64& rng) {
  const double exp = std::pow(policy.multiplier, std::max(0, retry - 1));
  const double cap = std::min(policy.max_delay_s, policy.initial_delay_s * exp);
  std::uniform_real_distribution<double> jitter(0.5, 1.0);
  return cap * jitter(rng);
}

}  // namespace strata
