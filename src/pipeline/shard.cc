#include "pipeline/shard.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>

namespace strata {
namespace {

// A whole decimal number >= 0, or nullopt.
std::optional<int64_t> parse_count(const std::string& text) {
  int64_t v = 0;
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || p != end || v < 0) return std::nullopt;
  return v;
}

// A variable that must be a whole number when set.
StatusOr<std::optional<int64_t>> env_number(const EnvLookup& env, const std::string& name) {
  const std::optional<std::string> value = env(name);
  if (!value) return std::optional<int64_t>();
  const std::optional<int64_t> n = parse_count(*value);
  if (!n) return invalid_argument("--shard auto: {}='{}' is not a whole number", name, *value);
  return n;
}

// K of "auto": Slurm's array task (made 0-based) or a Kubernetes completion index.
StatusOr<int64_t> auto_index(const EnvLookup& env) {
  STRATA_ASSIGN_OR_RETURN(std::optional<int64_t> task, env_number(env, "SLURM_ARRAY_TASK_ID"));
  if (task) {
    STRATA_ASSIGN_OR_RETURN(std::optional<int64_t> min, env_number(env, "SLURM_ARRAY_TASK_MIN"));
    if (min && *min > *task)
      return invalid_argument(
          "--shard auto: SLURM_ARRAY_TASK_ID={} is below SLURM_ARRAY_TASK_MIN={}", *task, *min);
    return *task - min.value_or(0);
  }
  STRATA_ASSIGN_OR_RETURN(std::optional<int64_t> index, env_number(env, "JOB_COMPLETION_INDEX"));
  if (index) return *index;
  return invalid_argument(
      "--shard auto: neither SLURM_ARRAY_TASK_ID (a Slurm job array) nor JOB_COMPLETION_INDEX (a "
      "Kubernetes indexed Job) is set; give --shard K/N");
}

StatusOr<ShardSpec> checked(int64_t k, int64_t n, const std::string& text) {
  if (n < 1) return invalid_argument("--shard {}: the shard count must be >= 1", text);
  if (n > 1'000'000) return invalid_argument("--shard {}: at most 1000000 shards", text);
  if (k >= n)
    return invalid_argument("--shard {}: shard {} does not exist, shards are numbered 0..{}", text,
                            k, n - 1);
  return ShardSpec{.index = int(k), .count = int(n)};
}

}  // namespace

std::string ShardSpec::label() const { return fmt::format("{}/{}", index, count); }

uint64_t shard_hash(const std::string& id) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : id) h = (h ^ c) * 0x100000001b3ull;
  // FNV-1a alone leaves the low bits (the ones mod N keeps) poorly mixed for ids that differ only
  // in their last characters ("p-1", "p-2", ...); the finalizer spreads every bit over all of them.
  uint64_t z = h ^ 0x5368617264537472ull;  // "ShardStr": unrelated to prompt_seed's stream
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

int shard_of(const std::string& id, int count) {
  return int(shard_hash(id) % uint64_t(std::max(count, 1)));
}

EnvLookup process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

StatusOr<ShardSpec> parse_shard_spec(const std::string& text, const EnvLookup& env) {
  const size_t slash = text.find('/');
  const std::string first = text.substr(0, slash);
  const std::string second = slash == std::string::npos ? "" : text.substr(slash + 1);
  if (first == "auto") {
    STRATA_ASSIGN_OR_RETURN(int64_t k, auto_index(env));
    STRATA_ASSIGN_OR_RETURN(std::optional<int64_t> slurm_n,
                            env_number(env, "SLURM_ARRAY_TASK_COUNT"));
    if (slash == std::string::npos) {
      if (!slurm_n)
        return invalid_argument(
            "--shard auto: SLURM_ARRAY_TASK_COUNT is not set (outside Slurm, e.g. on Kubernetes, "
            "give the count: --shard auto/N)");
      return checked(k, *slurm_n, text);
    }
    const std::optional<int64_t> n = parse_count(second);
    if (!n) return invalid_argument("--shard {}: expected auto/N with N a whole number", text);
    if (slurm_n && *slurm_n != *n)
      return invalid_argument("--shard {}: but SLURM_ARRAY_TASK_COUNT={}; the two must agree", text,
                              *slurm_n);
    return checked(k, *n, text);
  }
  const std::optional<int64_t> k = parse_count(first), n = parse_count(second);
  if (slash == std::string::npos || !k || !n)
    return invalid_argument("--shard '{}': expected K/N (e.g. 0/4), auto or auto/N", text);
  return checked(*k, *n, text);
}

void keep_shard(std::vector<Dataset>& datasets, const ShardSpec& shard) {
  for (Dataset& d : datasets) {
    std::erase_if(d.records, [&](const PromptRecord& r) {
      return shard_of(r.id, shard.count) != shard.index;
    });
  }
}

std::string substitute_shard(const std::string& path, const ShardSpec& shard) {
  std::string out;
  for (size_t i = 0; i < path.size();) {
    if (path.compare(i, 7, "{shard}") == 0) {
      out += std::to_string(shard.index);
      i += 7;
    } else if (path.compare(i, 8, "{shards}") == 0) {
      out += std::to_string(shard.count);
      i += 8;
    } else {
      out += path[i++];
    }
  }
  return out;
}

}  // namespace strata
