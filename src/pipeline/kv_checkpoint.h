// FILE.partial.kv: the KV rows of unfinished records beside their token checkpoints
// (checkpoint.h), so a resumed record continues by decoding instead of prefilling its prompt and
// partial output again (engine/kv_rows.h: whole pages, every layer, the storage dtype's bytes).
//
// Layout: a header, then append-only blocks, each the rows [first_row, first_row + rows) of one
// record, checksummed:
//   "STRATAKV" u32 header_len u64 checksum  header (KvRowsLayout::header: model fingerprint,
//                                                   dtypes, row bytes, page size, tp rank)
//   "SKVB" u32 meta_len u64 payload_len u64 checksum  meta {"dataset","id","first_row","rows"}
//                                                    payload (rows / page_size pages)
// A record's rows are its blocks in order; a block starting below the rows read so far replaces
// them from there (the record restarted), one beyond them (a lost block) is ignored. The index
// (record -> blocks) is rebuilt by one scan of the block headers and checksums on open.
//
// Durability: the job appends a record's new rows and fdatasyncs this file before the token
// line that refers to them (checkpoint.h's "kv_rows"), so a line never names rows a crash lost.
// A torn or corrupt tail is cut off on open: only the records whose rows were there fall back to
// recomputing them. A header other than the job's (another model, KV dtype, layout, page size
// or rank) drops every row with a log line: never wrong KV, only slower. Rows of finished
// records are reclaimed by compact() (a new file renamed over this one) and the file is removed
// when the job completes.
//
// One writer (the job's thread); not thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "engine/kv_rows.h"
#include "pipeline/checkpoint.h"

namespace strata {

class KvCheckpointFile {
 public:
  // Opens or creates `path` for rows of `layout` (see the header comment for what is dropped).
  static StatusOr<std::unique_ptr<KvCheckpointFile>> open(const std::string& path,
                                                          const KvRowsLayout& layout);
  ~KvCheckpointFile();
  KvCheckpointFile(const KvCheckpointFile&) = delete;
  KvCheckpointFile& operator=(const KvCheckpointFile&) = delete;

  const std::string& path() const { return path_; }
  const KvRowsLayout& layout() const { return layout_; }
  // Rows of `key` held from row 0 on.
  int64_t rows(const PartialKey& key) const;
  // The first `rows` rows of `key` (at most rows(key)), read back and checksummed again.
  StatusOr<std::shared_ptr<KvRows>> read(const PartialKey& key, int64_t rows) const;
  // Appends rows of `key`; rows.first_row <= rows(key) (below it replaces the rows from there).
  // Durable after sync().
  Status append(const PartialKey& key, const KvRows& rows);
  Status sync();
  // Rewrites the file with only the first keep[key] rows of each key listed (a new file,
  // fdatasync'd and renamed over this one).
  Status compact(const std::map<PartialKey, int64_t>& keep);
  // Deletes the file (the job completed).
  void remove();

  int64_t file_bytes() const { return file_bytes_; }
  int64_t live_bytes() const;                                 // payload bytes of the rows indexed
  int64_t dropped_torn_bytes() const { return torn_bytes_; }  // cut off on open

 private:
  struct Segment {
    int64_t first_row = 0, rows = 0;
    int64_t offset = 0;  // of the payload in the file
  };
  KvCheckpointFile(std::string path, KvRowsLayout layout)
      : path_(std::move(path)), layout_(std::move(layout)) {}
  Status scan(int fd, bool* header_ok);
  void index_block(const PartialKey& key, int64_t first_row, int64_t rows, int64_t offset);
  Status write_header(int fd);

  std::string path_;
  KvRowsLayout layout_;
  int fd_ = -1;
  int64_t file_bytes_ = 0, torn_bytes_ = 0;
  bool dirty_ = false;
  std::map<PartialKey, std::vector<Segment>> index_;
};

// A 64-bit checksum of bytes (word-wise multiply-xorshift; catches torn and corrupt blocks, not
// adversaries).
uint64_t kv_checksum(const void* data, size_t size, uint64_t seed = 0);

}  // namespace strata
