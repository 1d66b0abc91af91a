#include "pipeline/hidden_store.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "core/log.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

// Bytes reserved for a shard's safetensors header (JSON padded with spaces, as the format allows):
// about 450 bytes per record, so some 18,000 records; a shard closes before its header outgrows it.
constexpr int64_t kHeaderReserve = int64_t(8) << 20;
constexpr int64_t kDataStart = 8 + kHeaderReserve;

Status errno_error(const char* what, const std::string& path) {
  return internal_error("{} {}: {}", what, path, std::strerror(errno));
}

std::string shard_file_name(int number) { return fmt::format("shard-{:05d}.safetensors", number); }

Status pwrite_all(int fd, const uint8_t* data, size_t size, int64_t offset,
                  const std::string& path) {
  while (size > 0) {
    const ssize_t n = ::pwrite(fd, data, size, off_t(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_error("writing", path);
    }
    data += n;
    size -= size_t(n);
    offset += n;
  }
  return Status();
}

const char* safetensors_dtype(DType d) { return d == DType::kF32 ? "F32" : "BF16"; }

}  // namespace

// SGLang's LlamaForCausalLM.set_eagle3_layers_to_capture (python/sglang/srt/models/llama.py; the
// same in deepseek_v2.py): with no ids it captures before layers [2, L // 2, L - 3], and given
// eagle_aux_hidden_state_layer_ids it captures before layers [id + 1] — "for the ith layer, it
// takes the output of the (i-1)th layer" (LlamaModel.forward appends hidden_states + residual at
// the start of each layer in layers_to_capture). SpecForge's scripts/prepare_hidden_states.py
// passes [2 - 1, L // 2 - 1, L - 3 - 1] and its HF backend reads output_hidden_states[id + 1]. So
// the aux states are the outputs of layers [1, L // 2 - 1, L - 4].
std::vector<int> eagle3_default_layers(int num_layers) {
  return {1, num_layers / 2 - 1, num_layers - 4};
}

nlohmann::json CaptureOptions::to_json() const {
  return {{"layers", layers},
          {"hidden_size", hidden_size},
          {"dtype", dtype == DType::kF32 ? "float32" : "bfloat16"},
          {"capture_only", capture_only}};
}

std::string hidden_dir_for(const std::string& results_path) {
  const fs::path p(results_path);
  std::string stem = p.filename().string();
  if (stem.size() > 6 && stem.substr(stem.size() - 6) == ".jsonl") stem.resize(stem.size() - 6);
  return (p.parent_path() / "hidden" / stem).string();
}

int64_t filesystem_free_bytes(const std::string& path) {
  fs::path p = fs::absolute(path);
  std::error_code ec;
  while (!p.empty() && !fs::exists(p, ec)) p = p.parent_path();
  struct statvfs st {};
  if (p.empty() || ::statvfs(p.c_str(), &st) != 0) return -1;
  return int64_t(st.f_bavail) * int64_t(st.f_frsize);
}

HiddenStore::~HiddenStore() {
  if (shard_fd_ >= 0) ::close(shard_fd_);
}

StatusOr<std::unique_ptr<HiddenStore>> HiddenStore::open(const std::string& dir,
                                                         const nlohmann::json& meta,
                                                         const CommittedFn& committed,
                                                         int64_t shard_bytes) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return internal_error("cannot create {}: {}", dir, ec.message());
  const std::string meta_path = (fs::path(dir) / "meta.json").string();
  if (fs::exists(meta_path)) {
    std::ifstream in(meta_path);
    nlohmann::json old = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (old.is_discarded()) return data_loss("{} is not JSON", meta_path);
    if (old != meta)
      return failed_precondition(
          "{} was captured with {} but this run captures {}; use another output", meta_path,
          old.dump(), meta.dump());
  } else {
    STRATA_RETURN_IF_ERROR(write_file_atomic(meta_path, meta.dump(1) + "\n"));
  }
  std::unique_ptr<HiddenStore> s(new HiddenStore(dir));
  s->shard_bytes_ = shard_bytes;
  STRATA_RETURN_IF_ERROR(s->recover(committed));
  return s;
}

// Reads the index, keeps the committed records' entries, truncates every shard after its last kept
// record (deleting shards left empty), rewrites the index and the shard headers.
Status HiddenStore::recover(const CommittedFn& committed) {
  const std::string index_path = (fs::path(dir_) / "index.jsonl").string();
  std::map<std::string, int64_t> shard_ends;
  {
    std::ifstream in(index_path, std::ios::binary);
    std::string line;
    while (std::getline(in, line)) {
      if (in.eof()) break;  // a last line without '\n' is torn: never committed
      nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.is_object() || !j.contains("id") || !j.contains("shard"))
        return data_loss("{}: a line that is not an index entry: {}", index_path,
                         line.substr(0, 200));
      Entry e{.dataset = j.value("dataset", ""),
              .id = j["id"].get<std::string>(),
              .shard = j["shard"].get<std::string>(),
              .line = j};
      for (const auto& [name, t] : j["tensors"].items())
        e.end = std::max(e.end, t["offset"].get<int64_t>() + t["nbytes"].get<int64_t>());
      if (!committed(e.dataset, e.id) || keys_.count({e.dataset, e.id}) > 0) {
        ++reclaimed_;
        continue;
      }
      keys_.insert({e.dataset, e.id});
      shard_ends[e.shard] = std::max(shard_ends[e.shard], e.end);
      entries_.push_back(std::move(e));
    }
  }
  // A dropped record between kept ones (only a failed write can leave one) would be a hole in
  // its shard: such shards are rewritten with their kept records back to back.
  // The compacted copy gets a new shard name and the index (rewritten below) names it, so a kill
  // at any point leaves either the old shard or the new one referenced, and the other removed.
  int next_number = 0;
  for (const auto& f : fs::directory_iterator(dir_)) {
    const std::string name = f.path().filename().string();
    if (name.rfind("shard-", 0) == 0 && name.size() >= 11)
      next_number = std::max(next_number, std::atoi(name.c_str() + 6) + 1);
  }
  std::map<std::string, int64_t> compacted;
  for (const auto& [shard, end] : shard_ends) {
    STRATA_ASSIGN_OR_RETURN(std::string name, compact_shard(shard, next_number));
    if (name != shard) ++next_number;
    compacted[name] = 0;
  }
  for (const Entry& e : entries_) compacted[e.shard] = std::max(compacted[e.shard], e.end);
  shard_ends = std::move(compacted);
  // Durable order: the kept shards' headers (their fdatasync also makes a compacted copy's data
  // durable), then the index that names them, then the unreferenced shards and tails go.
  for (const auto& [shard, end] : shard_ends) STRATA_RETURN_IF_ERROR(write_header(shard));
  std::string text;
  for (const Entry& e : entries_) text += e.line.dump() + "\n";
  STRATA_RETURN_IF_ERROR(write_file_atomic(index_path, text));
  int last = -1;
  for (const auto& f : fs::directory_iterator(dir_)) {
    const std::string name = f.path().filename().string();
    if (name.rfind("shard-", 0) != 0) continue;
    auto it = shard_ends.find(name);
    if (it == shard_ends.end()) {
      fs::remove(f.path());
      continue;
    }
    if (int64_t(fs::file_size(f.path())) > it->second)
      fs::resize_file(f.path(), uintmax_t(it->second));
    last = std::max(last, std::atoi(name.c_str() + 6));
  }
  if (reclaimed_ > 0)
    LOG_WARN("{}: reclaimed the tensors of {} uncommitted records", dir_, reclaimed_);
  STRATA_ASSIGN_OR_RETURN(index_, AppendLog::open(index_path, int64_t(text.size())));
  // Appends continue the last shard.
  const int number = std::max(last, 0);
  return open_shard(number, last >= 0 ? shard_ends[shard_file_name(number)] : kDataStart);
}

StatusOr<std::string> HiddenStore::compact_shard(const std::string& shard, int number) {
  int64_t expect = kDataStart;
  bool holes = false;
  for (const Entry& e : entries_) {
    if (e.shard != shard) continue;
    int64_t begin = e.end;
    for (const auto& [name, t] : e.line["tensors"].items())
      begin = std::min(begin, t["offset"].get<int64_t>());
    holes = holes || begin != expect;
    expect = e.end;
  }
  if (!holes) return shard;
  const std::string name = shard_file_name(number);
  const std::string path = (fs::path(dir_) / shard).string(),
                    tmp = (fs::path(dir_) / name).string();
  std::ifstream in(path, std::ios::binary);
  std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
  out.seekp(kDataStart);
  int64_t at = kDataStart;
  std::vector<char> buf;
  for (Entry& e : entries_) {
    if (e.shard != shard) continue;
    int64_t begin = e.end;
    for (const auto& [name, t] : e.line["tensors"].items())
      begin = std::min(begin, t["offset"].get<int64_t>());
    buf.resize(size_t(e.end - begin));
    in.seekg(begin);
    in.read(buf.data(), std::streamsize(buf.size()));
    out.write(buf.data(), std::streamsize(buf.size()));
    for (auto& [tensor, t] : e.line["tensors"].items())
      t["offset"] = t["offset"].get<int64_t>() - begin + at;
    e.line["shard"] = name;
    e.shard = name;
    at += e.end - begin;
    e.end = at;
  }
  out.close();
  if (!in || !out)
    return internal_error("compacting {} into {}: a read or write failed", path, tmp);
  LOG_WARN("{}: a record between kept ones was dropped; its kept records move to {}", path, name);
  return name;
}

Status HiddenStore::open_shard(int number, int64_t end) {
  if (shard_fd_ >= 0) ::close(shard_fd_);
  shard_number_ = number;
  shard_name_ = shard_file_name(number);
  const std::string path = (fs::path(dir_) / shard_name_).string();
  shard_fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (shard_fd_ < 0) return errno_error("opening", path);
  shard_end_ = std::max(end, kDataStart);
  shard_header_bytes_ = 0;
  for (const Entry& e : entries_)
    if (e.shard == shard_name_)
      shard_header_bytes_ += int64_t(e.line["tensors"].dump().size()) + 64;
  return Status();
}

// The safetensors header of `shard` from the kept index entries: 8-byte length, then the JSON
// padded with spaces to the reserve, so the data starts at kDataStart.
Status HiddenStore::write_header(const std::string& shard) const {
  nlohmann::json header = nlohmann::json::object();
  header["__metadata__"] = {{"format", "strata-hidden-states"}};
  for (const Entry& e : entries_) {
    if (e.shard != shard) continue;
    for (const auto& [name, t] : e.line["tensors"].items()) {
      const int64_t begin = t["offset"].get<int64_t>() - kDataStart;
      header[e.dataset + "/" + e.id + "/" + name] = {
          {"dtype", t["dtype"]},
          {"shape", t["shape"]},
          {"data_offsets", {begin, begin + t["nbytes"].get<int64_t>()}}};
    }
  }
  std::string text = header.dump();
  if (int64_t(text.size()) > kHeaderReserve)
    return internal_error("{}/{}: the safetensors header ({} bytes) outgrew its reserve", dir_,
                          shard, text.size());
  text.resize(size_t(kHeaderReserve), ' ');
  const std::string path = (fs::path(dir_) / shard).string();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return errno_error("opening", path);
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(uint64_t(kHeaderReserve) >> (8 * i));
  Status st = pwrite_all(fd, len, 8, 0, path);
  if (st.ok())
    st = pwrite_all(fd, reinterpret_cast<const uint8_t*>(text.data()), text.size(), 8, path);
  if (st.ok() && ::fdatasync(fd) != 0) st = errno_error("syncing", path);
  ::close(fd);
  return st;
}

Status HiddenStore::append(const std::string& dataset, const std::string& id,
                           const CapturedRecord& r, int num_aux, int64_t hidden) {
  const CapturedStates& states = *r.states;
  const int64_t t = int64_t(r.input_ids.size()), eb = states.element_bytes();
  const int64_t width = int64_t(num_aux + 1) * hidden;
  if (states.width() != width || !states.complete(t) || int64_t(r.loss_mask.size()) != t)
    return internal_error("{} id {}: the captured states do not cover its {} tokens", dataset, id,
                          t);
  // The record's bytes: aux [T, k*H], final [T, H], input_ids, loss_mask (each 4-byte aligned).
  std::vector<uint8_t> buf(size_t(t * width * eb + 8 * t));
  uint8_t* aux = buf.data();
  uint8_t* fin = aux + t * num_aux * hidden * eb;
  for (int64_t p = 0; p < t; ++p) {
    const uint8_t* row = states.row(p);
    std::memcpy(aux + p * num_aux * hidden * eb, row, size_t(num_aux * hidden * eb));
    std::memcpy(fin + p * hidden * eb, row + num_aux * hidden * eb, size_t(hidden * eb));
  }
  uint8_t* ids = fin + t * hidden * eb;
  std::memcpy(ids, r.input_ids.data(), size_t(4 * t));
  std::memcpy(ids + 4 * t, r.loss_mask.data(), size_t(4 * t));

  const int64_t entry_bytes = 4 * (int64_t(dataset.size() + id.size()) + 200);
  if (shard_end_ > kDataStart && (shard_end_ + int64_t(buf.size()) - kDataStart > shard_bytes_ ||
                                  shard_header_bytes_ + entry_bytes > kHeaderReserve - 4096)) {
    STRATA_RETURN_IF_ERROR(write_header(shard_name_));  // the full shard becomes a valid file
    STRATA_RETURN_IF_ERROR(open_shard(shard_number_ + 1, kDataStart));
  }
  const std::string path = (fs::path(dir_) / shard_name_).string();
  const int64_t base = shard_end_;
  STRATA_RETURN_IF_ERROR(pwrite_all(shard_fd_, buf.data(), buf.size(), base, path));
  if (::fdatasync(shard_fd_) != 0) return errno_error("syncing", path);
  const char* dt = safetensors_dtype(states.dtype());
  const int64_t aux_bytes = t * num_aux * hidden * eb, fin_bytes = t * hidden * eb;
  nlohmann::json tensors = {
      {"aux_hidden_state",
       {{"dtype", dt}, {"shape", {t, num_aux * hidden}}, {"offset", base}, {"nbytes", aux_bytes}}},
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
  nlohmann::json line = {{"dataset", dataset},
                         {"id", id},
                         {"shard", shard_name_},
                         {"tokens", t},
                         {"tensors", tensors}};
  STRATA_RETURN_IF_ERROR(index_->append(line.dump()));
  STRATA_RETURN_IF_ERROR(index_->sync());
  shard_end_ = base + int64_t(buf.size());
  shard_header_bytes_ += int64_t(tensors.dump().size()) + 64;
  keys_.insert({dataset, id});
  entries_.push_back(Entry{.dataset = dataset,
                           .id = id,
                           .shard = shard_name_,
                           .line = std::move(line),
                           .end = shard_end_});
  return Status();
}

Status HiddenStore::close() {
  if (shard_fd_ < 0) return Status();
  Status st = shard_end_ > kDataStart ? write_header(shard_name_) : Status();
  ::close(shard_fd_);
  shard_fd_ = -1;
  if (shard_end_ <= kDataStart) fs::remove(fs::path(dir_) / shard_name_);  // never written
  return st;
}

}  // namespace strata
