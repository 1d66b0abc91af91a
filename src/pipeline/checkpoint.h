// Checkpoints of unfinished records, so a long generation survives preemption: a job killed every
// minute still advances, because a resumed job continues each unfinished record from its last
// checkpoint (prompt + partial output prefilled, then decoding on) instead of from scratch.
//
// FILE.partial.jsonl (beside the results FILE, owned by the job holding FILE.lock) is append-only,
// one line per checkpoint of one record: the tokens produced since its previous line,
//   {"dataset","id","from":K,"tokens":[...],"draws":D,"prompt_tokens":P,"settings":"<hash>"}
// where K is how many output tokens came before these, D the sampler's draws after them
// (engine/sampler.h) and settings a hash of the job's model and sampling settings. Lines are
// written like results (one write() each, fdatasync per batch), so a kill leaves whole lines plus
// at most a torn tail. Reading concatenates each record's lines in order; a line whose K is
// below the length read so far replaces the rest (a record restarted), one beyond it (a lost
// line) drops that record's partial (it starts over: never wrong, only slower). On start the job
// rewrites the file with one line per still-unfinished record; when the job completes it removes
// it.
//
// With KV checkpoints (kv_checkpoint.h) a line also says which KV rows FILE.partial.kv holds for
// the record, written and synced before the line: "kv_rows":R (rows 0..R-1 of prompt + output,
// whole pages), "kv_tokens":T (R = prompt_tokens + T - 1: the first T output tokens, whose last
// one's KV a decode step computes next) and "kv_draws" (the sampler's draws after those T). A
// resumed record then continues from T tokens with R rows loaded, decoding on; without the
// fields (or with rows the side file lost) it continues from every token by prefilling.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace strata {

// Where a record's KV checkpoint stands (see above).
struct KvMark {
  int64_t rows = 0;    // KV rows 0..rows-1 are in FILE.partial.kv
  int64_t tokens = 0;  // rows == prompt_tokens + tokens - 1
  uint64_t draws = 0;  // the sampler's draws after `tokens` output tokens
  bool operator==(const KvMark&) const = default;
};

struct PartialOutput {
  std::vector<int32_t> tokens{};  // output token ids so far
  uint64_t rng_draws = 0;         // the sampler's draws after them
  int32_t prompt_tokens = 0;      // the prompt's length when they were made (a sanity check)
  KvMark kv{};                    // the KV rows the side file holds for them (rows 0: none)
};

using PartialKey = std::pair<std::string, std::string>;  // (dataset, id)

// The partial outputs in `path` made with `settings` (lines of other settings are ignored). A
// missing file is empty. Torn tails and unparseable lines are skipped: a checkpoint is an
// optimization, never the only copy of a result.
StatusOr<std::map<PartialKey, PartialOutput>> read_partials(const std::string& path,
                                                            const std::string& settings);

// Rewrites `path` atomically with one line per entry of `partials` (or removes it when empty).
Status rewrite_partials(const std::string& path,
                        const std::map<PartialKey, PartialOutput>& partials,
                        const std::string& settings);

// One checkpoint line: `tokens` are output tokens from index `from` on.
// `kv` is the record's KV mark after this line (rows 0: no fields, i.e. none).
std::string partial_line(const PartialKey& key, int64_t from, std::span<const int32_t> tokens,
                         uint64_t rng_draws, int32_t prompt_tokens, const std::string& settings,
                         const KvMark& kv = {});

// A short stable fingerprint of the settings (model + sampling) a partial output belongs to.
std::string settings_fingerprint(const std::string& settings_json);

}  // namespace strata
