// HiddenStore: the hidden states a capture job (strata generate --capture-hidden-states) keeps per
// record, in safetensors shards beside the results JSONL, with an index from record to shard and
// byte offsets. For EAGLE-3 training: what SpecForge's offline pass
// (scripts/prepare_hidden_states.py) writes, without running the target model a second time.
//
// Files, for a results file DIR/NAME.jsonl (or DIR/FILE for --output DIR/FILE):
//   DIR/hidden/NAME/meta.json              what was captured: layers, hidden size, dtype, model
//   DIR/hidden/NAME/index.jsonl            one line per stored record:
//       {"dataset","id","shard","tokens":T,"tensors":{NAME:{"dtype","shape","offset","nbytes"}}}
//       (offset: bytes from the start of the shard file)
//   DIR/hidden/NAME/shard-00000.safetensors  records' tensors back to back; a valid safetensors
//       file once closed (its header lists every tensor as "<dataset>/<id>/<tensor>")
// Tensors per record, T = prompt + response tokens (each position's state is computed from the
// tokens up to it, exactly as a prefill over the finished conversation would):
//   aux_hidden_state  [T, k*H] model dtype  the outputs of the k aux layers, concatenated
//   hidden_state      [T, H]   model dtype  the final norm's output
//   input_ids         [T]      int32
//   loss_mask         [T]      int32        1 on assistant tokens (SpecForge's rule)
//
// Exactly once: a record commits when its results line is written (output_log.h). Before that,
// append() makes its tensors durable (shard data fdatasync'ed, then its index line, fdatasync'ed),
// so a committed record always has its tensors. A kill between the two leaves an orphan: open()
// keeps only index entries whose record is committed, truncates each shard after its last kept
// record and rewrites the index, so no orphan bytes survive a restart. A shard's safetensors
// header (space-padded into a fixed reserve before the data, as the format allows) is written when
// the shard is closed and rebuilt by open(); while a shard is open, readers use the index.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "engine/captured_states.h"
#include "pipeline/output_log.h"

namespace strata {

// One record's capture, as a target hands it over (GenerationOutcome::hidden).
struct CapturedRecord {
  std::vector<int32_t> input_ids;  // prompt + response tokens
  std::vector<int32_t> loss_mask;  // [input_ids.size()]
  // Rows [0, input_ids.size()): k aux blocks then the final-norm block, each `hidden` wide.
  std::shared_ptr<const CapturedStates> states;
};

// What a job captures (JobOptions::capture).
struct CaptureOptions {
  bool enabled = false;
  bool capture_only = false;  // teacher-forced: conversations already hold their responses
  std::vector<int> layers;    // aux layers (outputs of these decoder layers)
  int64_t hidden_size = 0;
  DType dtype = DType::kBF16;
  int64_t shard_bytes = int64_t(4) << 30;  // a new shard once this much data is in one
  // Free bytes of the filesystem holding `dir` (statvfs when empty; tests inject their own).
  std::function<int64_t(const std::string& dir)> free_bytes{};

  int64_t element_bytes() const { return dtype == DType::kF32 ? 4 : 2; }
  // Stored bytes per token: (k + 1) states of H elements, plus input_ids and loss_mask.
  int64_t bytes_per_token() const {
    return (int64_t(layers.size()) + 1) * hidden_size * element_bytes() + 2 * 4;
  }
  nlohmann::json to_json() const;  // meta.json's capture settings (compared on resume)
};

// The default EAGLE-3 aux layers of a model with `num_layers` decoder layers: [1, L/2 - 1, L - 4]
// (SpecForge's and SGLang's eagle_aux_hidden_state_layer_ids; the states are the outputs of these
// layers). See hidden_store.cc for the references.
std::vector<int> eagle3_default_layers(int num_layers);

// The hidden directory of a results file: DIR/hidden/<results file name without .jsonl>.
std::string hidden_dir_for(const std::string& results_path);

// Free bytes for unprivileged writes on the filesystem holding `path` (its nearest existing
// ancestor), by statvfs; -1 when unknown.
int64_t filesystem_free_bytes(const std::string& path);

class HiddenStore {
 public:
  using CommittedFn = std::function<bool(const std::string& dataset, const std::string& id)>;

  // Opens (creating) `dir`. meta.json must match `meta` when present (a resumed job captures the
  // same way) or is written. Index entries whose record is not committed are reclaimed (see
  // above). Errors: unreadable or corrupt files, a meta mismatch.
  static StatusOr<std::unique_ptr<HiddenStore>> open(const std::string& dir,
                                                     const nlohmann::json& meta,
                                                     const CommittedFn& committed,
                                                     int64_t shard_bytes = int64_t(4) << 30);
  ~HiddenStore();
  HiddenStore(const HiddenStore&) = delete;
  HiddenStore& operator=(const HiddenStore&) = delete;

  bool contains(const std::string& dataset, const std::string& id) const {
    return keys_.count({dataset, id}) > 0;
  }
  int64_t records() const { return int64_t(keys_.size()); }
  int64_t reclaimed() const { return reclaimed_; }  // orphans dropped by open()

  // Writes one record's tensors durably (see above). `num_aux` blocks of `hidden` in each row,
  // then the final-norm block. Not thread-safe (the job's thread).
  Status append(const std::string& dataset, const std::string& id, const CapturedRecord& record,
                int num_aux, int64_t hidden);
  // Writes the safetensors header of the open shard (the job's end; open() also rebuilds them).
  Status close();

  const std::string& dir() const { return dir_; }

 private:
  struct Entry {
    std::string dataset, id, shard;
    nlohmann::json line;  // the index line
    int64_t end = 0;      // byte after its last tensor
  };
  explicit HiddenStore(std::string dir) : dir_(std::move(dir)) {}
  Status recover(const CommittedFn& committed);
  Status open_shard(int number, int64_t end);
  // When `shard` has holes between its kept records: copies them back to back into shard `number`
  // (the entries then name it) and returns its name; else returns `shard`.
  StatusOr<std::string> compact_shard(const std::string& shard, int number);
  Status write_header(const std::string& shard) const;

  std::string dir_;
  int64_t shard_bytes_ = 0;
  std::set<std::pair<std::string, std::string>> keys_;
  std::vector<Entry> entries_;  // kept, in index order
  std::unique_ptr<AppendLog> index_;
  int shard_number_ = 0;
  std::string shard_name_;
  int shard_fd_ = -1;
  int64_t shard_end_ = 0;           // append position in the open shard
  int64_t shard_header_bytes_ = 0;  // the open shard's header, as written at close
  int64_t reclaimed_ = 0;
};

}  // namespace strata
