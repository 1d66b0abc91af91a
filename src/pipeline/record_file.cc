#include "pipeline/record_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <vector>

#include "core/capture_counters.h"
#include "pipeline/hidden_store.h"

namespace strata {
namespace {

constexpr int64_t kPage = 4096;

Status pwrite_all(int fd, const uint8_t* data, size_t size, int64_t offset,
                  const std::string& path) {
  while (size > 0) {
    const ssize_t n = ::pwrite(fd, data, size, off_t(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return internal_error("writing {}: {}", path, std::strerror(errno));
    }
    data += n;
    size -= size_t(n);
    offset += n;
  }
  return Status();
}

const char* safetensors_dtype(DType d) { return d == DType::kF32 ? "F32" : "BF16"; }

// The safetensors header of a record of `t` tokens; offsets relative to the data start.
nlohmann::json header_json(const std::string& dataset, const std::string& id, int num_aux,
                           int64_t hidden, int64_t eb, DType dtype, int64_t t) {
  const std::string prefix = dataset + "/" + id + "/";
  const int64_t aux = t * num_aux * hidden * eb, fin = t * hidden * eb;
  nlohmann::json h = nlohmann::json::object();
  h["__metadata__"] = {{"format", "strata-hidden-states"}};
  h[prefix + "aux_hidden_state"] = {{"dtype", safetensors_dtype(dtype)},
                                    {"shape", {t, int64_t(num_aux) * hidden}},
                                    {"data_offsets", {0, aux}}};
  h[prefix + "hidden_state"] = {{"dtype", safetensors_dtype(dtype)},
                                {"shape", {t, hidden}},
                                {"data_offsets", {aux, aux + fin}}};
  h[prefix + "input_ids"] = {
      {"dtype", "I32"}, {"shape", {t}}, {"data_offsets", {aux + fin, aux + fin + 4 * t}}};
  h[prefix + "loss_mask"] = {
      {"dtype", "I32"}, {"shape", {t}}, {"data_offsets", {aux + fin + 4 * t, aux + fin + 8 * t}}};
  return h;
}

}  // namespace

StatusOr<std::shared_ptr<RecordFile>> RecordFile::create(const std::string& path,
                                                         const std::string& dataset,
                                                         const std::string& id, int num_aux,
                                                         int64_t hidden, DType dtype) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return internal_error("creating {}: {}", path, std::strerror(errno));
  std::shared_ptr<RecordFile> f(new RecordFile(path, fd));
  f->dataset_ = dataset;
  f->id_ = id;
  f->num_aux_ = num_aux;
  f->hidden_ = hidden;
  f->dtype_ = dtype;
  f->element_bytes_ = dtype == DType::kF32 ? 4 : 2;
  f->aux_row_bytes_ = int64_t(num_aux) * hidden * f->element_bytes_;
  // The header's reserve: its longest form (every number at its widest), so any T fits.
  const std::string widest =
      header_json(dataset, id, num_aux, hidden, f->element_bytes_, dtype,
                  std::numeric_limits<int64_t>::max() / (8 * (num_aux + 1) * hidden))
          .dump();
  const int64_t widest_all = 8 + int64_t(widest.size()) + 20 * 16;  // any number at 20 digits
  f->data_start_ = (widest_all + kPage - 1) / kPage * kPage;
  return f;
}

RecordFile::~RecordFile() {
  close();
  if (!committed_) ::unlink(path_.c_str());
}

void RecordFile::close() {
  std::lock_guard<std::mutex> lk(fd_mu_);
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void RecordFile::start_writeback() {
  std::lock_guard<std::mutex> lk(fd_mu_);
  if (fd_ >= 0)
    ::sync_file_range(fd_, 0, 0, SYNC_FILE_RANGE_WRITE);  // a hint: errors are fdatasync's
}

void RecordFile::write(int64_t pos, const uint8_t* prefix) {
  if (write_errno_.load(std::memory_order_relaxed) != 0) return;
  // 256 KiB a write (8 rows of an 8B model's three aux layers): large enough that the system
  // call's cost is small, small enough that a batch of 512 records holds little.
  const int64_t max_rows = std::max<int64_t>(1, (int64_t(256) << 10) / aux_row_bytes_);
  if (pending_rows_ > 0 && (pos != pending_pos_ + pending_rows_ || pending_rows_ >= max_rows))
    flush_pending();
  if (pending_rows_ == 0) {
    pending_pos_ = pos;
    pending_.resize(size_t(max_rows * aux_row_bytes_));
  }
  std::memcpy(pending_.data() + pending_rows_ * aux_row_bytes_, prefix, size_t(aux_row_bytes_));
  ++pending_rows_;
}

void RecordFile::flush_pending() {
  if (pending_rows_ == 0) return;
  const int64_t bytes = pending_rows_ * aux_row_bytes_;
  pending_rows_ = 0;
  CaptureTimer timer(capture_counters().spill, bytes);
  const uint8_t* data = pending_.data();
  size_t left = size_t(bytes);
  off_t at = off_t(data_start_ + pending_pos_ * aux_row_bytes_);
  while (left > 0) {
    const ssize_t n = ::pwrite(fd_, data, left, at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {  // the first error is kept for finish(); later rows are not written
      int expected = 0;
      write_errno_.compare_exchange_strong(expected, n < 0 ? errno : ENOSPC);
      capture_counters().spill_errors.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    data += n;
    left -= size_t(n);
    at += n;
  }
}

StatusOr<nlohmann::json> RecordFile::finish(const CapturedRecord& r) {
  flush_pending();
  std::vector<uint8_t>().swap(pending_);
  if (const int e = write_errno_.load(); e != 0)
    return internal_error("writing the captured states to {}: {}", path_, std::strerror(e));
  const CapturedStates& states = *r.states;
  const int64_t t = int64_t(r.input_ids.size()), eb = element_bytes_, hidden = hidden_;
  const int64_t width = int64_t(num_aux_ + 1) * hidden;
  const bool streamed = states.spill() == this;
  if (states.dtype() != dtype_ || states.width() != width || !states.complete(t) ||
      int64_t(r.loss_mask.size()) != t || (!streamed && states.spilled_bytes() != 0))
    return internal_error("{} id {}: the captured states do not cover its {} tokens", dataset_, id_,
                          t);
  CaptureTimer timer(capture_counters().write, t * (width * eb + 8));
  const int64_t aux_bytes = t * aux_row_bytes_, fin_bytes = t * hidden * eb;
  // Rows whole in memory: their aux blocks first, as the engine would have streamed them.
  if (!streamed) {
    std::vector<uint8_t> aux(static_cast<size_t>(aux_bytes));
    for (int64_t p = 0; p < t; ++p)
      std::memcpy(aux.data() + p * aux_row_bytes_, states.row(p), size_t(aux_row_bytes_));
    STRATA_RETURN_IF_ERROR(pwrite_all(fd_, aux.data(), aux.size(), data_start_, path_));
  }
  // The final-norm blocks, then input_ids and loss_mask.
  const int64_t kept_offset = streamed ? 0 : aux_row_bytes_;
  std::vector<uint8_t> rest(size_t(fin_bytes + 8 * t));
  for (int64_t p = 0; p < t; ++p)
    std::memcpy(rest.data() + p * hidden * eb, states.row(p) + kept_offset, size_t(hidden * eb));
  std::memcpy(rest.data() + fin_bytes, r.input_ids.data(), size_t(4 * t));
  std::memcpy(rest.data() + fin_bytes + 4 * t, r.loss_mask.data(), size_t(4 * t));
  STRATA_RETURN_IF_ERROR(pwrite_all(fd_, rest.data(), rest.size(), data_start_ + aux_bytes, path_));
  // The header, padded with spaces up to the data (the format allows trailing whitespace).
  std::string header = header_json(dataset_, id_, num_aux_, hidden, eb, dtype_, t).dump();
  if (int64_t(header.size()) + 8 > data_start_)
    return internal_error("{}: the header outgrew its reserve", path_);  // never: sized above
  header.resize(size_t(data_start_ - 8), ' ');
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(uint64_t(data_start_ - 8) >> (8 * i));
  STRATA_RETURN_IF_ERROR(pwrite_all(fd_, len, 8, 0, path_));
  STRATA_RETURN_IF_ERROR(
      pwrite_all(fd_, reinterpret_cast<const uint8_t*>(header.data()), header.size(), 8, path_));
  // Rows streamed beyond T (a recomputation past the end never happens, but a cut is cheap).
  file_bytes_ = data_start_ + aux_bytes + int64_t(rest.size());
  if (::ftruncate(fd_, off_t(file_bytes_)) != 0)
    return internal_error("truncating {}: {}", path_, std::strerror(errno));
  const char* dt = safetensors_dtype(dtype_);
  const int64_t base = data_start_;
  return nlohmann::json{{"aux_hidden_state",
                         {{"dtype", dt},
                          {"shape", {t, int64_t(num_aux_) * hidden}},
                          {"offset", base},
                          {"nbytes", aux_bytes}}},
                        {"hidden_state",
                         {{"dtype", dt},
                          {"shape", {t, hidden}},
                          {"offset", base + aux_bytes},
                          {"nbytes", fin_bytes}}},
                        {"input_ids",
                         {{"dtype", "I32"},
                          {"shape", {t}},
                          {"offset", base + aux_bytes + fin_bytes},
                          {"nbytes", 4 * t}}},
                        {"loss_mask",
                         {{"dtype", "I32"},
                          {"shape", {t}},
                          {"offset", base + aux_bytes + fin_bytes + 4 * t},
                          {"nbytes", 4 * t}}}};
}

Status RecordFile::sync() {
  if (::fdatasync(fd_) != 0) return internal_error("syncing {}: {}", path_, std::strerror(errno));
  return Status();
}

}  // namespace strata
