// HiddenStore: the hidden states a capture job (strata generate --capture-hidden-states) keeps per
// record, in safetensors files beside the results JSONL, with an index from record to file and
// byte offsets. For EAGLE-3 training: what SpecForge's offline pass
// (scripts/prepare_hidden_states.py) writes, without running the target model a second time.
//
// Files, for a results file DIR/NAME.jsonl (or DIR/FILE for --output DIR/FILE):
//   DIR/hidden/NAME/meta.json              what was captured: layers, hidden size, dtype, model
//   DIR/hidden/NAME/index.jsonl            one line per stored record:
//       {"dataset","id","shard","tokens":T,"tensors":{NAME:{"dtype","shape","offset","nbytes"}}}
//       (shard: the file holding it; offset: bytes from the start of that file)
//   DIR/hidden/NAME/rec-NNNNNNNN.safetensors  one record's tensors (record_file.h), a valid
//       safetensors file once committed (its header names them "<dataset>/<id>/<tensor>")
// One file per record (as SpecForge's own data_<i>.ckpt): a record's rows are written to its file
// while it is generated (the aux blocks, streamed by the engine), so a batch of records that
// finish together leaves only their final-norm blocks to write. Directories written by earlier
// versions (several records per shard-NNNNN.safetensors) read the same way.
// Tensors per record, T = prompt + response tokens (each position's state is computed from the
// tokens up to it, exactly as a prefill over the finished conversation would):
//   aux_hidden_state  [T, k*H] model dtype  the outputs of the k aux layers, concatenated
//   hidden_state      [T, H]   model dtype  the final norm's output
//   input_ids         [T]      int32
//   loss_mask         [T]      int32        1 on assistant tokens (SpecForge's rule)
//
// Exactly once: a record commits when its results line is written (output_log.h). Before that,
// commit() makes its tensors durable (its file fdatasync'ed, the directory synced, then its index
// line, fdatasync'ed), so a committed record always has its tensors. Commits go in groups: the
// records a job thread wakes up to are written, synced in parallel, then indexed with one sync.
// A kill leaves files of records in flight or between the two: open() keeps only index entries
// whose record is committed, rewrites the index, and deletes every record file no kept entry names,
// so no orphan bytes survive a restart.
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
                                                     const CommittedFn& committed);
  ~HiddenStore();
  HiddenStore(const HiddenStore&) = delete;
  HiddenStore& operator=(const HiddenStore&) = delete;

  bool contains(const std::string& dataset, const std::string& id) const {
    return keys_.count({dataset, id}) > 0;
  }
  int64_t records() const { return int64_t(keys_.size()); }
  int64_t reclaimed() const { return reclaimed_; }  // orphans dropped by open()

  // The states a record's generation captures into: rows of `num_aux` aux blocks then the
  // final-norm block, `hidden` elements of `dtype` each; the aux blocks stream into a new record
  // file, the final-norm blocks stay in memory (room for `rows` reserved). Without a file (it
  // cannot be created: logged) whole rows stay in memory; commit() writes them then.
  std::shared_ptr<CapturedStates> begin_record(const std::string& dataset, const std::string& id,
                                               int num_aux, int64_t hidden, DType dtype,
                                               int64_t rows);

  struct Pending {
    std::string dataset, id;
    const CapturedRecord* record = nullptr;
  };
  // Writes the records' tensors durably (see above), as one group: each file's rest, one
  // fdatasync per file (in parallel), the directory, the index lines, one index fdatasync.
  // Records already stored are skipped. `num_aux` blocks of `hidden` in each row, then the
  // final-norm block. Not thread-safe (the job's thread).
  Status commit(const std::vector<Pending>& records, int num_aux, int64_t hidden);
  // One record's commit.
  Status append(const std::string& dataset, const std::string& id, const CapturedRecord& record,
                int num_aux, int64_t hidden) {
    return commit({Pending{dataset, id, &record}}, num_aux, hidden);
  }
  // The job's end: logs where the capture's time went (core/capture_counters.h).
  Status close();

  const std::string& dir() const { return dir_; }

 private:
  struct Writeback;  // hidden_store.cc
  explicit HiddenStore(std::string dir);
  Status recover(const CommittedFn& committed);
  std::string next_file_name();

  std::string dir_;
  std::set<std::pair<std::string, std::string>> keys_;
  std::unique_ptr<AppendLog> index_;
  int64_t next_file_ = 0;  // the number of the next record file
  int64_t reclaimed_ = 0;
  bool warned_no_file_ = false;
  // Starts the writeback of the record files in flight every so often, so that their streamed
  // rows reach the disk while they generate, not all at the commit's fdatasync.
  std::unique_ptr<Writeback> writeback_;
};

}  // namespace strata
