#include "eval/eval_checkpoint.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace strata {
namespace {

constexpr const char* kCheckpointFormat = "strata-eval-kv-checkpoint/1";
constexpr uint32_t kGroupBegin = 0x3147564bu;  // "KVG1"
constexpr uint32_t kGroupEnd = 0x4547564bu;    // "KVGE"

template <typename T>
void put(std::string& out, const T& v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}
template <typename T>
bool get(std::istream& in, T* v) {
  return bool(in.read(reinterpret_cast<char*>(v), sizeof(T)));
}

// One group record from `in`, or false when the file ends inside it (a torn write).
bool read_group(std::istream& in, CheckpointGroup* g) {
  uint32_t magic = 0, end = 0;
  int32_t results = 0;
  if (!get(in, &magic) || magic != kGroupBegin || !get(in, &g->first_window) ||
      !get(in, &g->windows) || !get(in, &results) || results < 0)
    return false;
  g->results.assign(size_t(results), {});
  for (auto& r : g->results) {
    int64_t n = 0;
    if (!get(in, &n) || n < 0 || n > (int64_t(1) << 32)) return false;
    r.resize(size_t(n));
    for (auto& p : r)
      if (!get(in, &p.position) || !get(in, &p.stats)) return false;
  }
  return get(in, &end) && end == kGroupEnd;
}

}  // namespace

StatusOr<std::unique_ptr<EvalCheckpoint>> EvalCheckpoint::open(const std::string& path,
                                                               const std::string& key,
                                                               std::vector<CheckpointGroup>* done) {
  static_assert(sizeof(LogitStatsRow) == 20);
  done->clear();
  std::error_code ec;
  const bool exists = std::filesystem::exists(path, ec) && std::filesystem::file_size(path, ec) > 0;
  if (exists) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return invalid_argument("--checkpoint: cannot read '{}'", path);
    std::string header;
    std::getline(in, header);
    const nlohmann::json h = nlohmann::json::parse(header, nullptr, /*allow_exceptions=*/false);
    if (!h.is_object() || h.value("format", "") != kCheckpointFormat)
      return invalid_argument("--checkpoint '{}' is not an eval-kv checkpoint", path);
    if (h.value("key", "") != key)
      return invalid_argument(
          "--checkpoint '{}' belongs to another evaluation (other model, data, options, "
          "candidates or devices): remove it or name another file",
          path);
    int64_t good = in.tellg();
    for (;;) {
      CheckpointGroup g;
      if (!read_group(in, &g)) break;
      done->push_back(std::move(g));
      good = in.tellg();
    }
    in.close();
    std::filesystem::resize_file(path, uint64_t(good), ec);  // drops a torn last record
    if (ec) return invalid_argument("--checkpoint: cannot truncate '{}': {}", path, ec.message());
  }
  std::unique_ptr<EvalCheckpoint> c(new EvalCheckpoint());
  c->path_ = path;
  c->file_ = std::fopen(path.c_str(), "ab");
  if (c->file_ == nullptr)
    return invalid_argument("--checkpoint: cannot write '{}': {}", path, std::strerror(errno));
  if (!exists) {
    const std::string line =
        nlohmann::json{{"format", kCheckpointFormat}, {"key", key}}.dump() + "\n";
    if (std::fwrite(line.data(), 1, line.size(), c->file_) != line.size() ||
        std::fflush(c->file_) != 0)
      return data_loss("--checkpoint: writing '{}' failed", path);
  }
  return c;
}

EvalCheckpoint::~EvalCheckpoint() {
  if (file_ != nullptr) std::fclose(file_);
}

Status EvalCheckpoint::append(const CheckpointGroup& g) {
  std::string bytes;
  put(bytes, kGroupBegin);
  put(bytes, g.first_window);
  put(bytes, g.windows);
  put(bytes, int32_t(g.results.size()));
  for (const auto& r : g.results) {
    put(bytes, int64_t(r.size()));
    for (const auto& p : r) {
      put(bytes, p.position);
      put(bytes, p.stats);
    }
  }
  put(bytes, kGroupEnd);
  if (std::fwrite(bytes.data(), 1, bytes.size(), file_) != bytes.size() ||
      std::fflush(file_) != 0 || ::fsync(::fileno(file_)) != 0)
    return data_loss("--checkpoint: writing '{}' failed: {}", path_, std::strerror(errno));
  return Status();
}

}  // namespace strata
