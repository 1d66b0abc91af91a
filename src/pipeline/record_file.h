// RecordFile: one record's safetensors file in a capture job's hidden directory (hidden_store.h),
// written while the record is generated, so that a batch of records finishing together leaves
// little to write.
//
// Layout: the 8-byte header length, the JSON header (space-padded to a reserve sized from the
// record's names, so the data starts at a fixed page-aligned offset), then the tensors back to
// back:
//   aux_hidden_state [T, k*H] | hidden_state [T, H] | input_ids [T] int32 | loss_mask [T] int32
// Row p of aux_hidden_state starts at data_start + p * k*H*eb whatever T turns out to be, so the
// engine streams each captured row's aux blocks there as it computes them (RowSpill::write, from
// the engine's threads); the final-norm block stays in memory (a quarter of the bytes with
// EAGLE-3's three aux layers) and finish() writes it after the aux rows once T is known, with the
// ids, the mask and the header, and cuts the file at its end.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/status.h"
#include "engine/captured_states.h"

namespace strata {

struct CapturedRecord;

class RecordFile final : public RowSpill {
 public:
  // Creates `path` (which must not exist) for the record `dataset`/`id` whose rows hold `num_aux`
  // aux blocks then the final-norm block, `hidden` elements of `dtype` each.
  static StatusOr<std::shared_ptr<RecordFile>> create(const std::string& path,
                                                      const std::string& dataset,
                                                      const std::string& id, int num_aux,
                                                      int64_t hidden, DType dtype);
  ~RecordFile() override;
  RecordFile(const RecordFile&) = delete;
  RecordFile& operator=(const RecordFile&) = delete;

  // RowSpill: the aux blocks of row `pos`. Consecutive positions gather in a small buffer and go
  // to the file in one write (a decoding record adds one row per step: one pwrite per row was
  // 1.2 M writes of 32 KB in an 8B job); finish() writes what is left. One thread at a time (the
  // capture writer's; finish() after the engine's fence).
  int64_t prefix_bytes() const override { return aux_row_bytes_; }
  void write(int64_t pos, const uint8_t* prefix) override;

  // Writes the rest of `record` (its states must be whole rows in memory, or this file's spill
  // with the final-norm blocks in memory), the header, and cuts the file at the data's end.
  // Returns the index entry's "tensors" (absolute file offsets). Errors: a failed write, now or
  // of a streamed row before; states that miss a position.
  StatusOr<nlohmann::json> finish(const CapturedRecord& record);
  Status sync();  // fdatasync
  // The record is committed (its index line is durable): the file stays when this object goes.
  // Until then it is removed with it (a failed or interrupted record leaves no file behind; after
  // a kill, HiddenStore::open removes it).
  void set_committed() { committed_ = true; }
  void close();  // the descriptor (finish and sync need it)
  // Starts writing the file's dirty pages to the disk, without waiting (sync_file_range); any
  // thread, while the file is open.
  void start_writeback();

  const std::string& path() const { return path_; }
  int64_t file_bytes() const { return file_bytes_; }  // after finish()

 private:
  RecordFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}

  std::string path_;
  std::mutex fd_mu_;  // close() against start_writeback() from the store's writeback thread
  int fd_ = -1;
  std::string dataset_, id_;
  int num_aux_ = 0;
  int64_t hidden_ = 0, element_bytes_ = 2, aux_row_bytes_ = 0, data_start_ = 0, file_bytes_ = 0;
  DType dtype_ = DType::kBF16;
  std::atomic<int> write_errno_{0};  // the first failed streamed write's errno
  // Rows gathered for one write: positions [pending_pos_, pending_pos_ + pending_rows_).
  std::vector<uint8_t> pending_;
  int64_t pending_pos_ = 0, pending_rows_ = 0;
  void flush_pending();
  bool committed_ = false;
};

}  // namespace strata
