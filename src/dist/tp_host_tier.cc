#include "dist/tp_host_tier.h"

#include <bit>
#include <cstring>

#include "core/check.h"
#include "core/log.h"

namespace strata {
namespace {

constexpr uint32_t kMaxBatches = 1u << 20;
constexpr uint32_t kMaxPagesPerBatch = 1u << 28;

template <typename T>
void put(std::vector<uint8_t>& out, T v) {
  static_assert(std::endian::native == std::endian::little,
                "the wire form is the host's little-endian");
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  out.insert(out.end(), p, p + sizeof(T));
}

struct Reader {
  std::span<const uint8_t> in;
  size_t at = 0;
  template <typename T>
  bool get(T* v) {
    if (in.size() - at < sizeof(T)) return false;
    std::memcpy(v, in.data() + at, sizeof(T));
    at += sizeof(T);
    return true;
  }
};

}  // namespace

void HostTierSync::encode(std::vector<uint8_t>& out) const {
  put<uint64_t>(out, done_through);
  put<uint32_t>(out, uint32_t(batches.size()));
  for (const HostCopyBatch& b : batches) {
    put<uint8_t>(out, b.to_host ? 1 : 0);
    put<uint64_t>(out, b.ticket);
    put<uint32_t>(out, uint32_t(b.pages.size()));
    for (const PageCopy& c : b.pages) {
      put<int32_t>(out, c.device_page);
      put<int32_t>(out, c.host_page);
    }
  }
}

StatusOr<HostTierSync> HostTierSync::decode(std::span<const uint8_t> in) {
  Reader r{in};
  HostTierSync s;
  uint32_t n = 0;
  if (!r.get(&s.done_through) || !r.get(&n) || n > kMaxBatches)
    return data_loss("host tier message: malformed");
  s.batches.resize(n);
  for (HostCopyBatch& b : s.batches) {
    uint8_t to_host = 0;
    uint32_t pages = 0;
    if (!r.get(&to_host) || to_host > 1 || !r.get(&b.ticket) || !r.get(&pages) ||
        pages > kMaxPagesPerBatch || (in.size() - r.at) / 8 < pages)
      return data_loss("host tier message: malformed copy batch");
    b.to_host = to_host == 1;
    b.pages.resize(pages);
    for (PageCopy& c : b.pages) {
      int32_t d = 0, h = 0;
      r.get(&d);
      r.get(&h);
      c = PageCopy{.device_page = d, .host_page = h};
    }
  }
  if (r.at != in.size()) return data_loss("host tier message: {} trailing bytes", in.size() - r.at);
  return s;
}

void encode_rank_stats(const HostTierRankStats& s, std::vector<uint8_t>& out) {
  put<int32_t>(out, s.rank);
  for (int64_t v :
       {s.host_bytes, s.pages_to_host, s.pages_to_device, s.bytes_to_host, s.bytes_to_device})
    put<int64_t>(out, v);
  put<double>(out, s.copy_seconds);
}

StatusOr<HostTierRankStats> decode_rank_stats(std::span<const uint8_t> in) {
  Reader r{in};
  HostTierRankStats s;
  const bool ok = r.get(&s.rank) && r.get(&s.host_bytes) && r.get(&s.pages_to_host) &&
                  r.get(&s.pages_to_device) && r.get(&s.bytes_to_host) &&
                  r.get(&s.bytes_to_device) && r.get(&s.copy_seconds);
  if (!ok || r.at != in.size()) return data_loss("host tier statistics message: malformed");
  return s;
}

// ---- rank 0 ----

TpHostTier::TpHostTier(std::unique_ptr<HiCacheIo> local, int64_t host_pages)
    : local_(std::move(local)), host_pages_(host_pages) {}

TpHostTier::~TpHostTier() {
  if (on_destroy_) on_destroy_();
}

void TpHostTier::set_group(Gather gather, std::function<void()> on_destroy) {
  gather_ = std::move(gather);
  on_destroy_ = std::move(on_destroy);
}

uint64_t TpHostTier::record(bool to_host, uint64_t ticket, std::span<const PageCopy> copies) {
  pending_.batches.push_back(
      HostCopyBatch{.to_host = to_host,
                    .ticket = ticket,
                    .pages = std::vector<PageCopy>(copies.begin(), copies.end())});
  (to_host ? pages_to_host_ : pages_to_device_) += int64_t(copies.size());
  stale_ = true;
  return ticket;
}

uint64_t TpHostTier::device_to_host(std::span<const PageCopy> copies) {
  return record(true, local_->device_to_host(copies), copies);
}

uint64_t TpHostTier::host_to_device(std::span<const PageCopy> copies) {
  return record(false, local_->host_to_device(copies), copies);
}

bool TpHostTier::done(uint64_t ticket) {
  if (!local_->done(ticket)) return false;
  done_through_ = std::max(done_through_, ticket);
  return true;
}

void TpHostTier::wait(uint64_t ticket) {
  local_->wait(ticket);
  done_through_ = std::max(done_through_, ticket);
}

HostTierSync TpHostTier::take_sync() {
  HostTierSync s = std::move(pending_);
  pending_ = HostTierSync{};
  s.done_through = done_through_;
  return s;
}

HostTierRankStats TpHostTier::local_stats() const {
  const int64_t page = local_->page_bytes();
  return HostTierRankStats{.rank = 0,
                           .host_bytes = host_pages_ * page,
                           .pages_to_host = pages_to_host_,
                           .pages_to_device = pages_to_device_,
                           .bytes_to_host = pages_to_host_ * page,
                           .bytes_to_device = pages_to_device_ * page,
                           .copy_seconds = local_->copy_seconds()};
}

StatusOr<std::vector<HostTierRankStats>> TpHostTier::gather_rank_stats() {
  CHECK_MSG(gather_ != nullptr, "TpHostTier without a group (attach_tp_host_tier makes them)");
  stale_ = false;
  return gather_();
}

// ---- workers ----

StatusOr<std::unique_ptr<TpHostMirror>> TpHostMirror::create(const Backend& backend,
                                                             const KvStorage& kv,
                                                             int64_t num_host_pages, KvIoBackend io,
                                                             int rank) {
  auto made = make_kv_host_io(backend, kv, num_host_pages, io);
  if (!made.ok())
    return made.status().with_context("rank {}: host KV tier of {} pages", rank, num_host_pages);
  std::unique_ptr<KvHostIo> owned = std::move(made).value();
  auto copier = std::make_unique<KvHostIoCopier>(owned.get());
  return std::make_unique<TpHostMirror>(
      std::move(copier),
      Geometry{.device_pages = kv.layout().num_pages, .host_pages = num_host_pages}, rank,
      std::move(owned));
}

TpHostMirror::TpHostMirror(std::unique_ptr<HiCacheIo> copier, Geometry geometry, int rank,
                           std::unique_ptr<KvHostIo> owned)
    : owned_(std::move(owned)), copier_(std::move(copier)), geometry_(geometry), rank_(rank) {}

Status TpHostMirror::apply(const HostTierSync& sync) {
  for (const HostCopyBatch& b : sync.batches) {
    if (b.ticket <= last_rank0_ticket_)
      return data_loss("host tier message: ticket {} after {}", b.ticket, last_rank0_ticket_);
    for (const PageCopy& c : b.pages)
      if (c.device_page < 0 || c.device_page >= geometry_.device_pages || c.host_page < 0 ||
          c.host_page >= geometry_.host_pages)
        return data_loss(
            "host tier message: copy of device page {} / host page {} outside the pools ({} / {})",
            c.device_page, c.host_page, geometry_.device_pages, geometry_.host_pages);
    last_ticket_ = b.to_host ? copier_->device_to_host(b.pages) : copier_->host_to_device(b.pages);
    last_rank0_ticket_ = b.ticket;
    tickets_.emplace_back(b.ticket, last_ticket_);
    (b.to_host ? pages_to_host_ : pages_to_device_) += int64_t(b.pages.size());
  }
  uint64_t wait_for = 0;
  while (!tickets_.empty() && tickets_.front().first <= sync.done_through) {
    wait_for = tickets_.front().second;
    tickets_.pop_front();
  }
  if (wait_for != 0 && !copier_->done(wait_for)) copier_->wait(wait_for);
  return Status();
}

HostTierRankStats TpHostMirror::stats() {
  if (last_ticket_ != 0) copier_->done(last_ticket_);  // lets the copier account what has landed
  const int64_t page = copier_->page_bytes();
  return HostTierRankStats{.rank = rank_,
                           .host_bytes = geometry_.host_pages * page,
                           .pages_to_host = pages_to_host_,
                           .pages_to_device = pages_to_device_,
                           .bytes_to_host = pages_to_host_ * page,
                           .bytes_to_device = pages_to_device_ * page,
                           .copy_seconds = copier_->copy_seconds()};
}

}  // namespace strata
