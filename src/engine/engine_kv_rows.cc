// KV rows of batch-job checkpoints (engine/kv_rows.h): streamed out as a request's pages fill
// (GenerateRequest::export_kv) and loaded back as a cached prefix when a checkpointed request
// resumes (GenerateRequest::resume_kv). Engine thread only.
#include <nlohmann/json.hpp>

#include "core/log.h"
#include "engine/batch_plan.h"
#include "engine/engine.h"
#include "engine/kv_rows_io.h"
#include "engine/live_request.h"
#include "kv/page_pool.h"
#include "kv/radix_cache.h"

namespace strata {
namespace {

// Why this engine neither exports nor loads KV rows ("" when it does).
std::string kv_rows_refusal(const EngineConfig& c) {
  if (c.tp_size > 1)
    return fmt::format(
        "--tp-size {}: each rank holds a shard of every KV row and checkpoints would hold rank 0's "
        "only",
        c.tp_size);
  if (c.tp_one_rank) return "--tp-one-rank: the KV is not the model's";
  if (c.disable_radix_cache)
    return "--disable-radix-cache: checkpointed rows are loaded as a cached prefix";
  return "";
}

}  // namespace

std::optional<KvRowsLayout> Engine::kv_rows_layout(std::string* why_not) const {
  if (std::string why = kv_rows_refusal(config_); !why.empty()) {
    if (why_not != nullptr) *why_not = std::move(why);
    return std::nullopt;
  }
  const KvLayout& l = kv_->layout();
  nlohmann::json dtypes = nlohmann::json::array(), k_rows = nlohmann::json::array(),
                 v_rows = nlohmann::json::array(), scales = nlohmann::json::array();
  for (int layer = 0; layer < l.num_layers; ++layer) {
    dtypes.push_back(dtype_name(l.layer_dtype(layer)));
    k_rows.push_back(l.k_row_bytes(layer));
    v_rows.push_back(l.v_row_bytes(layer));
    scales.push_back({kv_->k_scale(layer), kv_->v_scale(layer)});
  }
  const nlohmann::json header = {{"format", "strata-kv-rows 1"},
                                 {"model", model_fingerprint(config_.model_path)},
                                 {"device", backend_->name()},
                                 {"kv", kv_config_.describe()},
                                 {"layers", l.num_layers},
                                 {"dtypes", dtypes},
                                 {"k_row_bytes", k_rows},
                                 {"v_row_bytes", v_rows},
                                 {"rope_dim", l.rope_dim},
                                 {"format_fp8", int(l.format)},
                                 {"scales", scales},
                                 {"page_size", l.page_size},
                                 {"tp_rank", 0},
                                 {"tp_size", config_.tp_size}};
  return KvRowsLayout{.header = header.dump(),
                      .page_size = int32_t(l.page_size),
                      .page_bytes = l.bytes_per_token() * l.page_size};
}

bool Engine::ensure_kv_copier() {
  if (kv_copier_) return true;
  auto copier = KvRowsCopier::create(*backend_, *kv_);
  if (!copier.ok()) {
    LOG_WARN("KV checkpoints: no copier for the KV pool ({}); rows are neither saved nor loaded",
             copier.status().to_string());
    return false;
  }
  kv_copier_ = std::move(copier).value();
  return true;
}

void Engine::import_kv(Live& live) {
  const std::shared_ptr<const KvRows> kv = std::move(live.resume_kv);
  if (!kv || kv->rows <= 0) return;
  Request& r = live.request;
  const int32_t ps = config_.page_size;
  auto refuse = [&](const std::string& why) {
    LOG_WARN("request {}: its {} checkpointed KV rows are not loaded ({}); they are computed again",
             r.id(), kv->rows, why);
    std::lock_guard<std::mutex> lk(mu_);
    ++stats_.kv_import_refused_total;
  };
  if (std::string why = kv_rows_refusal(config_); !why.empty()) return refuse(why);
  if (kv->first_row != 0 || kv->rows % ps != 0 || kv->rows > r.total_len() - 1)
    return refuse(fmt::format("rows {}..{} are not whole pages of the first {} tokens",
                              kv->first_row, kv->first_row + kv->rows, r.total_len() - 1));
  if (!ensure_kv_copier()) return refuse("no copier");
  const int32_t num_pages = int32_t(kv->rows / ps);
  const int64_t page_bytes = kv_copier_->page_bytes();
  if (int64_t(kv->bytes.size()) != int64_t(num_pages) * page_bytes)
    return refuse(
        fmt::format("{} bytes for {} pages of {} bytes", kv->bytes.size(), num_pages, page_bytes));
  const std::vector<int32_t> tokens = r.tokens(int32_t(kv->rows));
  RadixMatch m = cache_->match_prefix(tokens, /*record_stats=*/false);
  const int32_t have = m.matched_tokens / ps;  // already cached (another request shares them)
  const int32_t need = num_pages - have;
  if (need > 0) {
    cache_->inc_lock_ref(m.node);  // what the eviction below frees must not be this match
    const int32_t free = pool_->num_free_pages();
    if (free < need) {
      if (hicache_)
        hicache_->evict_device(need - free);
      else
        cache_->evict(need - free);
    }
    std::vector<PageId> fresh;
    const bool ok = pool_->num_free_pages() >= need && pool_->allocate_into(need, &fresh);
    cache_->dec_lock_ref(m.node);
    if (!ok) return refuse(fmt::format("the KV pool has no {} free pages now", need));
    kv_copier_->write_pages(fresh, kv->bytes.data() + int64_t(have) * page_bytes);
    std::vector<PageId> path = m.pages;
    pool_->retain(m.pages);  // insert() consumes a reference to each page of the path
    path.insert(path.end(), fresh.begin(), fresh.end());
    cache_->insert(tokens, path);
    if (hicache_) hicache_->on_insert(tokens);
  }
  std::lock_guard<std::mutex> lk(mu_);
  stats_.kv_import_tokens_total += kv->rows;
  stats_.kv_import_bytes_total = kv_copier_->bytes_written();
  stats_.kv_import_seconds = kv_copier_->write_seconds();
}

void Engine::export_kv(std::span<const ScheduledSeq> seqs) {
  struct Export {
    Live* live;
    int32_t first_page, num_pages;
  };
  std::vector<Export> exports;
  std::vector<PageId> pages;
  const int32_t ps = config_.page_size;
  for (const ScheduledSeq& seq : seqs) {
    const Request* r = seq.request;
    if (!r->is_running()) continue;
    auto it = live_.find(r->id());
    if (it == live_.end() || !it->second->export_kv) continue;
    Live& live = *it->second;
    const int32_t first = live.exported_rows / ps, full = r->kv_len() / ps;
    if (full <= first) continue;  // nothing new (or recomputing after a retraction)
    exports.push_back({&live, first, full - first});
    pages.insert(pages.end(), r->pages().begin() + first, r->pages().begin() + full);
  }
  if (exports.empty()) return;
  if (!kv_rows_refusal(config_).empty() || !ensure_kv_copier()) {
    for (Export& e : exports) e.live->export_kv = false;
    return;
  }
  std::vector<std::byte> bytes;
  bytes.reserve(pages.size() * size_t(kv_copier_->page_bytes()));
  kv_copier_->read_pages(pages, &bytes);  // one batched download for every exporting request
  {
    std::lock_guard<std::mutex> lk(mu_);
    stats_.kv_export_bytes_total = kv_copier_->bytes_read();
    stats_.kv_export_seconds = kv_copier_->read_seconds();
  }
  size_t offset = 0;
  for (const Export& e : exports) {
    auto rows = std::make_shared<KvRows>();
    rows->first_row = int64_t(e.first_page) * ps;
    rows->rows = int64_t(e.num_pages) * ps;
    const size_t n = size_t(e.num_pages) * size_t(kv_copier_->page_bytes());
    rows->bytes.assign(bytes.begin() + ptrdiff_t(offset), bytes.begin() + ptrdiff_t(offset + n));
    offset += n;
    e.live->exported_rows = (e.first_page + e.num_pages) * ps;
    StreamEvent ev;
    ev.kv = std::move(rows);
    ev.rng_draws = e.live->rng.draws();
    ev.prompt_tokens = e.live->request.prompt_len();
    ev.completion_tokens = e.live->request.output_len();
    if (e.live->on_event) e.live->on_event(ev);
  }
}

}  // namespace strata
