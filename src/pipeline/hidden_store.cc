#include "pipeline/hidden_store.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include "core/capture_counters.h"
#include "core/log.h"
#include "pipeline/record_file.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

constexpr const char* kRecordPrefix = "rec-";

// The number in a record file's name (rec-NNNNNNNN.safetensors), or -1 for other files.
int64_t record_file_number(const std::string& name) {
  if (name.rfind(kRecordPrefix, 0) != 0) return -1;
  return std::atoll(name.c_str() + 4);
}

bool is_tensor_file(const std::string& name) {
  return (name.rfind(kRecordPrefix, 0) == 0 || name.rfind("shard-", 0) == 0) && name.size() > 12 &&
         name.substr(name.size() - 12) == ".safetensors";
}

Status sync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return internal_error("opening {}: {}", dir, std::strerror(errno));
  const int rc = ::fsync(fd);
  const int e = errno;
  ::close(fd);
  if (rc != 0) return internal_error("syncing {}: {}", dir, std::strerror(e));
  return Status();
}

// A capture job keeps one descriptor per record in flight (thousands): the soft limit goes up to
// the hard one.
void raise_open_files_limit() {
  struct rlimit rl {};
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &rl);
  }
}

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

// A thread that starts the writeback of the record files in flight twice a second: the kernel
// would otherwise leave their streamed rows dirty until its own thresholds (gigabytes), and the
// commit's fdatasync would wait for all of them at once.
struct HiddenStore::Writeback {
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  std::vector<std::weak_ptr<RecordFile>> files;  // in flight (expired ones pruned)
  std::thread thread;

  Writeback() : thread([this] { run(); }) {}
  ~Writeback() {
    {
      std::lock_guard<std::mutex> lk(mu);
      stop = true;
    }
    cv.notify_all();
    thread.join();
  }
  void add(const std::shared_ptr<RecordFile>& f) {
    std::lock_guard<std::mutex> lk(mu);
    files.push_back(f);
  }
  void run() {
    std::unique_lock<std::mutex> lk(mu);
    while (!cv.wait_for(lk, std::chrono::milliseconds(500), [this] { return stop; })) {
      std::vector<std::shared_ptr<RecordFile>> live;
      std::vector<std::weak_ptr<RecordFile>> kept;
      for (const auto& w : files) {
        if (auto f = w.lock()) {
          live.push_back(std::move(f));
          kept.push_back(w);
        }
      }
      files.swap(kept);
      lk.unlock();
      for (const auto& f : live) f->start_writeback();
      live.clear();  // a last reference dropped here removes an uncommitted file: outside mu
      lk.lock();
    }
  }
};

HiddenStore::HiddenStore(std::string dir)
    : dir_(std::move(dir)), writeback_(std::make_unique<Writeback>()) {}

HiddenStore::~HiddenStore() = default;

StatusOr<std::unique_ptr<HiddenStore>> HiddenStore::open(const std::string& dir,
                                                         const nlohmann::json& meta,
                                                         const CommittedFn& committed) {
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
  raise_open_files_limit();
  std::unique_ptr<HiddenStore> s(new HiddenStore(dir));
  STRATA_RETURN_IF_ERROR(s->recover(committed));
  return s;
}

// Reads the index, keeps the committed records' entries, rewrites the index, then deletes every
// tensor file no kept entry names (records in flight or uncommitted when the last run stopped).
Status HiddenStore::recover(const CommittedFn& committed) {
  const std::string index_path = (fs::path(dir_) / "index.jsonl").string();
  std::set<std::string> kept_files;
  std::string text;
  {
    std::ifstream in(index_path, std::ios::binary);
    std::string line;
    while (std::getline(in, line)) {
      if (in.eof()) break;  // a last line without '\n' is torn: never committed
      nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.is_object() || !j.contains("id") || !j.contains("shard"))
        return data_loss("{}: a line that is not an index entry: {}", index_path,
                         line.substr(0, 200));
      const std::string dataset = j.value("dataset", ""), id = j["id"].get<std::string>();
      if (!committed(dataset, id) || keys_.count({dataset, id}) > 0) {
        ++reclaimed_;
        continue;
      }
      keys_.insert({dataset, id});
      kept_files.insert(j["shard"].get<std::string>());
      text += line + "\n";
    }
  }
  // Durable order: the index without the dropped entries, then their files go.
  STRATA_RETURN_IF_ERROR(write_file_atomic(index_path, text));
  int64_t orphans = 0;
  for (const auto& f : fs::directory_iterator(dir_)) {
    const std::string name = f.path().filename().string();
    if (!is_tensor_file(name)) continue;
    next_file_ = std::max(next_file_, record_file_number(name) + 1);
    if (kept_files.count(name) > 0) continue;
    std::error_code ec;
    fs::remove(f.path(), ec);
    ++orphans;
  }
  if (reclaimed_ > 0 || orphans > 0)
    LOG_WARN("{}: reclaimed the tensors of {} uncommitted records ({} files)", dir_, reclaimed_,
             orphans);
  STRATA_ASSIGN_OR_RETURN(index_, AppendLog::open(index_path, int64_t(text.size())));
  return Status();
}

std::string HiddenStore::next_file_name() {
  return fmt::format("{}{:08d}.safetensors", kRecordPrefix, next_file_++);
}

std::shared_ptr<CapturedStates> HiddenStore::begin_record(const std::string& dataset,
                                                          const std::string& id, int num_aux,
                                                          int64_t hidden, DType dtype,
                                                          int64_t rows) {
  const int64_t width = int64_t(num_aux + 1) * hidden;
  auto file = RecordFile::create((fs::path(dir_) / next_file_name()).string(), dataset, id, num_aux,
                                 hidden, dtype);
  std::shared_ptr<CapturedStates> states;
  if (file.ok()) {
    writeback_->add(*file);
    states = std::make_shared<CapturedStates>(dtype, std::move(file).value());
  } else {
    if (!warned_no_file_)
      LOG_WARN("{}; records keep their states in memory until they commit",
               file.status().message());
    warned_no_file_ = true;
    states = std::make_shared<CapturedStates>(dtype);
  }
  states->reserve(rows, width);
  return states;
}

Status HiddenStore::commit(const std::vector<Pending>& records, int num_aux, int64_t hidden) {
  // Each record's file: the one its rows streamed into, or a new one for states in memory.
  struct Item {
    const Pending* p = nullptr;
    std::shared_ptr<RecordFile> owned{};  // a file made here
    RecordFile* file = nullptr;
    nlohmann::json tensors{};
  };
  std::vector<Item> items;
  std::set<std::pair<std::string, std::string>> seen;
  for (const Pending& p : records) {
    if (contains(p.dataset, p.id) || !seen.insert({p.dataset, p.id}).second) continue;
    const CapturedStates& states = *p.record->states;
    Item it{.p = &p};
    it.file = dynamic_cast<RecordFile*>(states.spill());
    if (it.file == nullptr) {
      STRATA_ASSIGN_OR_RETURN(
          it.owned, RecordFile::create((fs::path(dir_) / next_file_name()).string(), p.dataset,
                                       p.id, num_aux, hidden, states.dtype()));
      it.file = it.owned.get();
    }
    items.push_back(std::move(it));
  }
  if (items.empty()) return Status();
  {  // Each file's rest (finish) then its fdatasync, a few files at a time: the writes copy
     // megabytes per record (hundreds of records finish together in a batch job) and the syncs
     // wait on the disk, not the CPU.
    CaptureTimer timer(capture_counters().sync, 0);
    const size_t threads = std::min<size_t>(items.size(), 8);
    std::vector<Status> status(items.size());
    auto finish_some = [&](size_t k) {
      for (size_t i = k; i < items.size(); i += threads) {
        Item& it = items[i];
        auto tensors = it.file->finish(*it.p->record);
        if (!tensors.ok()) {
          status[i] = tensors.status();
          continue;
        }
        it.tensors = std::move(tensors).value();
        status[i] = it.file->sync();
      }
    };
    std::vector<std::thread> pool;
    for (size_t k = 1; k < threads; ++k) pool.emplace_back(finish_some, k);
    finish_some(0);
    for (std::thread& t : pool) t.join();
    int64_t bytes = 0;
    for (size_t i = 0; i < items.size(); ++i) {
      STRATA_RETURN_IF_ERROR(status[i]);  // the first failed record, in the group's order
      bytes += items[i].file->file_bytes();
    }
    capture_counters().sync.bytes.fetch_add(bytes, std::memory_order_relaxed);
    STRATA_RETURN_IF_ERROR(sync_dir(dir_));  // the new files' names
  }
  CaptureTimer timer(capture_counters().index, 0);
  for (Item& it : items) {
    const CapturedRecord& r = *it.p->record;
    nlohmann::json line = {{"dataset", it.p->dataset},
                           {"id", it.p->id},
                           {"shard", fs::path(it.file->path()).filename().string()},
                           {"tokens", int64_t(r.input_ids.size())},
                           {"tensors", std::move(it.tensors)}};
    STRATA_RETURN_IF_ERROR(index_->append(line.dump()));
  }
  STRATA_RETURN_IF_ERROR(index_->sync());
  for (Item& it : items) {
    keys_.insert({it.p->dataset, it.p->id});
    it.file->set_committed();
    it.file->close();  // the descriptor: a committed file is never written again
  }
  return Status();
}

Status HiddenStore::close() {
  LOG_INFO("hidden-state capture: {} records in {}; where the time went: {}", records(), dir_,
           capture_counters().summary());
  return Status();
}

}  // namespace strata
