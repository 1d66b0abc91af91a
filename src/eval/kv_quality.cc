#include "eval/kv_quality.h"

#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>

#include "core/log.h"
#include "model/config.h"
#include "model/weights.h"

namespace strata {
namespace fs = std::filesystem;
namespace {

constexpr uint64_t kFnvOffset = 1469598103934665603ull, kFnvPrime = 1099511628211ull;

uint64_t fnv1a(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * kFnvPrime;
  return h;
}

// Header plus the first and last 64 KiB of the file (or all of a small file).
Status hash_file_sample(const fs::path& path, uint64_t& h) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return not_found("cannot read '{}'", path.string());
  f.seekg(0, std::ios::end);
  const int64_t size = f.tellg();
  constexpr int64_t kSample = 64 << 10;
  std::string buf;
  auto read_at = [&](int64_t off, int64_t n) {
    buf.resize(size_t(n));
    f.seekg(off);
    f.read(buf.data(), n);
    h = fnv1a(h, buf.data(), size_t(f.gcount()));
  };
  h = fnv1a(h, &size, sizeof(size));
  uint64_t header_len = 0;
  f.seekg(0);
  f.read(reinterpret_cast<char*>(&header_len), 8);
  const int64_t head = std::min<int64_t>(
      size, 8 + int64_t(std::min<uint64_t>(header_len, uint64_t(size))) + kSample);
  read_at(0, head);
  if (size > head) read_at(std::max(head, size - kSample), size - std::max(head, size - kSample));
  return Status();
}

std::string hex64(uint64_t h) { return fmt::format("{:016x}", h); }

std::string utc_now(const char* fmt_str) {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, fmt_str, &tm);
  return buf;
}

}  // namespace

StatusOr<ModelIdentity> model_identity(const std::string& dir) {
  if (!fs::is_directory(dir)) return not_found("--model-path '{}' is not a directory", dir);
  uint64_t h = kFnvOffset;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name == "config.json" || e.path().extension() == ".safetensors") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  for (const auto& p : files) {
    const std::string name = p.filename().string();
    h = fnv1a(h, name.data(), name.size());
    STRATA_RETURN_IF_ERROR(hash_file_sample(p, h));
  }
  ModelIdentity id;
  id.path = dir;
  id.name = fs::path(dir).lexically_normal().filename().string();
  if (id.name.empty()) id.name = fs::path(dir).lexically_normal().parent_path().filename().string();
  id.fingerprint = hex64(h);
  return id;
}

std::string default_kv_records_dir() {
  if (const char* d = std::getenv("STRATA_KV_QUALITY_DIR"); d && *d) return d;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x)
    return std::string(x) + "/strata/kv-quality";
  if (const char* home = std::getenv("HOME"); home && *home)
    return std::string(home) + "/.cache/strata/kv-quality";
  return ".strata-kv-quality";
}

std::vector<std::string> kv_record_dirs(const std::string& dir, const std::string& model_dir) {
  return {dir.empty() ? default_kv_records_dir() : dir, model_dir + "/strata-kv-quality"};
}

StatusOr<std::string> save_kv_record(const std::string& dir, const nlohmann::json& record) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    return invalid_argument("--kv-quality-records: cannot create '{}': {}", dir, ec.message());
  // The KV key and the deployment name the file: records of one configuration measured on two
  // deployments in the same second do not overwrite each other.
  std::string key = record.at("kv").at("key").get<std::string>();
  if (record.contains("deployment")) key += record.at("deployment").dump();
  const std::string name = fmt::format(
      "{}-{}-{}-{}.json", record.at("model").value("name", "model"),
      record.at("model").at("fingerprint").get<std::string>(),
      hex64(fnv1a(kFnvOffset, key.data(), key.size())).substr(0, 8), utc_now("%Y%m%dT%H%M%SZ"));
  const std::string path = (fs::path(dir) / name).string();
  std::ofstream f(path);
  if (!f) return invalid_argument("--kv-quality-records: cannot write '{}'", path);
  f << record.dump(2) << "\n";
  if (!f) return data_loss("writing '{}' failed", path);
  return path;
}

nlohmann::json KvDeployment::to_json() const {
  return {{"device", device}, {"tp_size", tp_size}, {"dcp_size", dcp_size}};
}

KvDeployment KvDeployment::from_record(const nlohmann::json& record) {
  KvDeployment d;
  if (!record.contains("deployment") || !record.at("deployment").is_object()) return d;
  const auto& j = record.at("deployment");
  d.device = j.value("device", d.device);
  d.tp_size = j.value("tp_size", d.tp_size);
  d.dcp_size = j.value("dcp_size", d.dcp_size);
  return d;
}

std::string KvDeployment::describe() const {
  return fmt::format("{} tp {}{}", device, tp_size,
                     dcp_size > 1 ? fmt::format(" dcp {}", dcp_size) : "");
}

std::optional<nlohmann::json> find_kv_record(const std::vector<std::string>& dirs,
                                             const std::string& fingerprint,
                                             const std::string& kv_key,
                                             const KvDeployment& deployment) {
  std::optional<nlohmann::json> best;
  auto better = [&](const nlohmann::json& j) {
    if (!best) return true;
    const bool jm = j.at("deployment_matches").get<bool>(),
               bm = best->at("deployment_matches").get<bool>();
    if (jm != bm) return jm;
    return j.value("date", "") > best->value("date", "");
  };
  for (const auto& dir : dirs) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) continue;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      if (e.path().extension() != ".json") continue;
      std::ifstream f(e.path());
      nlohmann::json j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
      if (!j.is_object() || j.value("format", "") != kKvRecordFormat) continue;
      try {
        if (j.at("model").at("fingerprint") != fingerprint || j.at("kv").at("key") != kv_key)
          continue;
        j.at("metrics").at("kld").at("mean").get<double>();
        j["deployment_matches"] = KvDeployment::from_record(j) == deployment;
      } catch (const std::exception&) {
        continue;
      }
      j["path"] = e.path().string();
      if (better(j)) best = std::move(j);
    }
  }
  return best;
}

KvGateDecision decide_kv_gate(const KvCacheConfig& config,
                              const std::optional<nlohmann::json>& record, const KvGateOptions& o) {
  KvGateDecision d;
  const std::string kv = config.describe();
  if (!config.lossy()) {
    d.message =
        fmt::format("KV quality: {} is exact storage of the bf16 reference; no record needed", kv);
    return d;
  }
  if (!record) {
    d.allowed = d.warn = o.allow_lossy;
    d.message =
        o.allow_lossy
            ? fmt::format(
                  "KV quality: {} is UNMEASURED (no eval-kv record); running anyway because of "
                  "--allow-lossy-kv",
                  kv)
            : fmt::format(
                  "KV cache {} is lossy and no `strata eval-kv` record for this model and "
                  "configuration was found; measure it (strata eval-kv --model-path M --data "
                  "FILE.jsonl with the same KV flags) or pass --allow-lossy-kv",
                  kv);
    return d;
  }
  const auto& k = record->at("metrics").at("kld");
  const double mean = k.at("mean").get<double>(), se = k.value("se", 0.0);
  std::string measured =
      fmt::format("measured mean KLD {:.6f} ± {:.6f} nats vs bf16 over {} tokens", mean, se,
                  record->at("metrics").value("tokens", 0));
  // The candidate against the noise floor measured the same way in the same run (bf16 vs bf16
  // under another batch composition): "within noise" is then a statement one can check.
  try {
    const double floor = record->at("noise_floor").at("kld").at("mean").get<double>();
    measured += floor > 0
                    ? fmt::format(", {:.1f}x the noise floor ({:.2e} nats)", mean / floor, floor)
                    : fmt::format(", noise floor {:.2e} nats", floor);
  } catch (const std::exception&) {
    measured += ", no noise floor in the record";
  }
  const KvDeployment at = KvDeployment::from_record(*record);
  measured += fmt::format("; record {} ({}), measured on {}", record->value("path", "?"),
                          record->value("date", "?"), at.describe());
  if (!record->value("deployment_matches", true))
    measured += fmt::format(
        ", not this deployment ({}: no record of it; `strata eval-kv --device {} --tp-size {}` "
        "makes one)",
        o.deployment.describe(), o.deployment.device, o.deployment.tp_size);
  if (mean <= o.budget_nats) {
    d.message = fmt::format("KV quality: {} admitted: {}; within budget {} nats", kv, measured,
                            o.budget_nats);
  } else if (o.allow_lossy) {
    d.warn = true;
    d.message =
        fmt::format("KV quality: {}: {}; OVER budget {} nats, running because of --allow-lossy-kv",
                    kv, measured, o.budget_nats);
  } else {
    d.allowed = false;
    d.message = fmt::format(
        "KV cache {}: {}, over --kv-quality-budget {} nats; raise the budget, keep "
        "sensitive layers in bf16 (--kv-bf16-layers), or pass --allow-lossy-kv",
        kv, measured, o.budget_nats);
  }
  return d;
}

Status enforce_kv_quality_gate(const std::string& model_dir, const KvCacheOptions& kv,
                               const KvGateOptions& o) {
  if (!(o.budget_nats >= 0))
    return invalid_argument("--kv-quality-budget must be >= 0, got {}", o.budget_nats);
  STRATA_ASSIGN_OR_RETURN(ModelSpec spec, load_model_spec(model_dir));
  STRATA_ASSIGN_OR_RETURN(WeightStore weights, WeightStore::open(model_dir, spec.quant));
  STRATA_ASSIGN_OR_RETURN(KvCacheConfig config,
                          resolve_kv_cache_config(kv, spec, &weights, DType::kBF16));
  std::optional<nlohmann::json> record;
  if (config.lossy()) {
    STRATA_ASSIGN_OR_RETURN(ModelIdentity id, model_identity(model_dir));
    record = find_kv_record(kv_record_dirs(o.records_dir, model_dir), id.fingerprint, config.key(),
                            o.deployment);
  }
  const KvGateDecision d = decide_kv_gate(config, record, o);
  if (!d.allowed) return failed_precondition("{}", d.message);
  if (d.warn)
    LOG_WARN("{}", d.message);
  else
    LOG_INFO("{}", d.message);
  return Status();
}

}  // namespace strata
