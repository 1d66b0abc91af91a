// One shard of a batch job (`strata generate --shard K/N`): a deterministic 1/N of every dataset,
// so N independent tasks of a scheduler array (Slurm, a Kubernetes indexed Job) together cover
// every prompt exactly once, each writing its own output, with no coordination between them.
// `strata generate --verify` (verify.h) checks the union afterwards.
//
// A record belongs to shard shard_of(id, N): a hash of its id, not its line number. Why the id:
// adding, removing or reordering lines of an input file (a dataset that grew, a fixed typo) leaves
// every other record in its shard, so finished shards stay valid and resume where they were; a
// position-based split would move nearly every record once a line is inserted near the top. The
// price: shards are balanced only statistically (binomial counts, within a few standard deviations
// of n/N, shard_test.cc states the bound), not exactly n/N; and a record without an "id" is named
// "<dataset>-<line>" (dataset.h), which is positional again, so give records ids when sharding.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "pipeline/dataset.h"

namespace strata {

struct ShardSpec {
  int index = 0;              // K, 0-based
  int count = 1;              // N
  std::string label() const;  // "K/N"
};

// A 64-bit hash of the id that never changes across builds and platforms (FNV-1a over the bytes,
// then the splitmix64 finalizer, salted so it is unrelated to prompt_seed's hash). Written out so
// that other tools can reproduce it:
//   h = 0xcbf29ce484222325; for byte c: h = (h ^ c) * 0x100000001b3   (mod 2^64)
//   z = h ^ 0x5368617264537472;  z = (z ^ z>>30) * 0xbf58476d1ce4e5b9;
//   z = (z ^ z>>27) * 0x94d049bb133111eb;  z ^= z>>31
uint64_t shard_hash(const std::string& id);
// The shard of a record: shard_hash(id) mod count.
int shard_of(const std::string& id, int count);

// Reads the environment (tests pass their own).
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;
EnvLookup process_env();

// Parses --shard:
//   "K/N"     shard K (0 <= K < N) of N;
//   "auto"    from a Slurm job array: K = SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN (so
//             --array=0-7 and --array=1-8 both work), N = SLURM_ARRAY_TASK_COUNT;
//   "auto/N"  K from SLURM_ARRAY_TASK_ID (as above) or, on Kubernetes, JOB_COMPLETION_INDEX (an
//             indexed Job sets it; Kubernetes does not expose the completion count, hence /N).
// Errors say which variable is missing or inconsistent (an array with a step, --array=0-15:4,
// has ids that are not 0..N-1 and is refused).
StatusOr<ShardSpec> parse_shard_spec(const std::string& text, const EnvLookup& env);

// Keeps only the records of `shard` in every dataset (file order kept).
void keep_shard(std::vector<Dataset>& datasets, const ShardSpec& shard);

// Replaces "{shard}" by K and "{shards}" by N in an output path, so one command line serves every
// task of an array: --output-dir out/shard-{shard}.
std::string substitute_shard(const std::string& path, const ShardSpec& shard);

}  // namespace strata
