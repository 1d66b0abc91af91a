#include "dist/tp_driver.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "arch/tp.h"
#include "core/log.h"
#include "dist/tp_host_tier.h"
#include "engine/batch_plan.h"
#include "engine/plan_forward.h"
#include "model/config.h"
#include "model/weights.h"

namespace strata {
namespace {

enum class TpMessage : uint8_t {
  kInitKv = 1,
  kStep = 2,
  kShutdown = 3,
  kInitHost = 4,
  kHostStats = 5,
  kMoveKv = 6  // speculative decoding's draft trees: accepted nodes' KV rows into place
};

// STRATA_STEP_TIMING=1 (as for the engine's step log): every 256 steps a rank logs where its
// step time went — rank 0: sending the plan vs its forward; a worker: waiting for the plan
// (rank 0's host work and the broadcast) vs its forward.
class TpStepTiming {
 public:
  using Clock = std::chrono::steady_clock;
  TpStepTiming(int rank, const char* wait_name) : rank_(rank), wait_name_(wait_name) {}
  void add(Clock::time_point begin, Clock::time_point mid, Clock::time_point end) {
    if (!on_) return;
    wait_s_ += std::chrono::duration<double>(mid - begin).count();
    forward_s_ += std::chrono::duration<double>(end - mid).count();
    if (++steps_ < 256) return;
    LOG_INFO("tensor-parallel rank {}: {} steps: {} {:.2f} ms, forward {:.2f} ms per step", rank_,
             steps_, wait_name_, 1e3 * wait_s_ / steps_, 1e3 * forward_s_ / steps_);
    wait_s_ = forward_s_ = 0;
    steps_ = 0;
  }

 private:
  const bool on_ = [] {
    const char* e = std::getenv("STRATA_STEP_TIMING");
    return e != nullptr && e[0] == '1';
  }();
  const int rank_;
  const char* wait_name_;
  double wait_s_ = 0, forward_s_ = 0;
  int steps_ = 0;
};

// What the rank threads of this process share: the first failure, which stops every rank's
// communicator so nobody waits on a rank that is gone.
class TpGroupState {
 public:
  void fail(const Status& s) {
    std::lock_guard<std::mutex> lk(mu_);
    if (first_.ok()) first_ = s;
    failed_.store(true);
    for (Communicator* c : comms_) c->abort(first_);
  }
  void add(Communicator* c) {
    std::lock_guard<std::mutex> lk(mu_);
    comms_.push_back(c);
    if (!first_.ok()) c->abort(first_);
  }
  void remove(Communicator* c) {
    std::lock_guard<std::mutex> lk(mu_);
    comms_.erase(std::remove(comms_.begin(), comms_.end(), c), comms_.end());
  }
  Status first() const {
    std::lock_guard<std::mutex> lk(mu_);
    return first_;
  }
  const std::atomic<bool>& failed() const { return failed_; }

 private:
  mutable std::mutex mu_;
  Status first_;
  std::atomic<bool> failed_{false};
  std::vector<Communicator*> comms_;
};

// ---- wire helpers (host byte order: every rank of a group runs this same build) ----
template <typename T>
void put(std::vector<uint8_t>& out, T v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  out.insert(out.end(), p, p + sizeof(T));
}
template <typename T>
bool get(std::span<const uint8_t> in, size_t& at, T* v) {
  if (in.size() - at < sizeof(T)) return false;
  std::memcpy(v, in.data() + at, sizeof(T));
  at += sizeof(T);
  return true;
}

// Every worker's `mine` to rank 0: one broadcast rooted at each worker in rank order, every rank
// taking part in each. Rank 0 gets out[r - 1] from rank r; workers pass out = nullptr.
Status gather_from_workers(Communicator& comm, const std::vector<uint8_t>& mine,
                           std::vector<std::vector<uint8_t>>* out) {
  for (int root = 1; root < comm.size(); ++root) {
    std::vector<uint8_t> buf = comm.rank() == root ? mine : std::vector<uint8_t>();
    STRATA_RETURN_IF_ERROR(comm.broadcast_bytes(buf, root));
    if (out != nullptr) out->push_back(std::move(buf));
  }
  return Status();
}

// A message's host-tier section: [u32 length][HostTierSync] (length 0: nothing for the host tier).
void put_sync(std::vector<uint8_t>& out, const std::optional<HostTierSync>& sync) {
  std::vector<uint8_t> bytes;
  if (sync) sync->encode(bytes);
  put<uint32_t>(out, uint32_t(bytes.size()));
  out.insert(out.end(), bytes.begin(), bytes.end());
}
StatusOr<std::optional<HostTierSync>> get_sync(std::span<const uint8_t> in, size_t& at) {
  uint32_t n = 0;
  if (!get(in, at, &n) || in.size() - at < n)
    return data_loss("tensor-parallel message: bad host tier section");
  const size_t begin = at;
  at += n;
  if (n == 0) return std::optional<HostTierSync>();
  STRATA_ASSIGN_OR_RETURN(HostTierSync sync, HostTierSync::decode(in.subspan(begin, n)));
  return std::optional<HostTierSync>(std::move(sync));
}

// A status as one worker's reply: [u8 ok][message].
std::vector<uint8_t> encode_status(const Status& s) {
  std::vector<uint8_t> out{uint8_t(s.ok() ? 1 : 0)};
  const std::string m = s.ok() ? "" : s.message();
  out.insert(out.end(), m.begin(), m.end());
  return out;
}
Status decode_status(const std::vector<uint8_t>& in, int rank) {
  if (in.empty()) return data_loss("rank {}: empty reply", rank);
  if (in[0] == 1) return Status();
  return failed_precondition("{}", std::string(in.begin() + 1, in.end()));
}

// Whether two layouts describe the same storage as far as the kInitKv message tells: every field
// it carries (the K/V widths are each rank's own, so they are not compared).
bool same_sent_layout(const KvLayout& a, const KvLayout& b) {
  return a.num_layers == b.num_layers && a.num_pages == b.num_pages && a.page_size == b.page_size &&
         a.dtype == b.dtype && a.layer_dtypes == b.layer_dtypes && a.rope_dim == b.rope_dim &&
         a.rope_dtype == b.rope_dtype && a.format == b.format;
}

// kInitKv: rank 0's pool `id` (pages, dtypes, scales); each rank keeps its own K/V widths.
// same_sent_layout above and KvInitInputs below read the same fields: keep the three in step.
std::vector<uint8_t> encode_init_kv(const KvStorage& kv, uint32_t id) {
  const KvLayout& l = kv.layout();
  std::vector<uint8_t> out{uint8_t(TpMessage::kInitKv)};
  put<uint32_t>(out, id);
  put<int32_t>(out, l.num_layers);
  put<int64_t>(out, l.num_pages);
  put<int32_t>(out, l.page_size);
  put<uint8_t>(out, uint8_t(l.dtype));
  put<uint32_t>(out, uint32_t(l.layer_dtypes.size()));
  for (DType d : l.layer_dtypes) put<uint8_t>(out, uint8_t(d));
  put<int32_t>(out, l.rope_dim);
  put<int16_t>(out, l.rope_dtype ? int16_t(*l.rope_dtype) : int16_t(-1));
  put<uint8_t>(out, uint8_t(l.format));
  for (int i = 0; i < l.num_layers; ++i) {
    put<float>(out, kv.k_scale(i));
    put<float>(out, kv.v_scale(i));
  }
  return out;
}

// What a pool's kInitKv message is built from (its id aside), kept by rank 0 per pool so that a
// step only compares these, cheaply, instead of encoding the message to compare bytes. Scales are
// compared by their bits, as the message's bytes were.
class KvInitInputs {
 public:
  explicit KvInitInputs(const KvStorage& kv) : layout_(kv.layout()), scale_bits_(scale_bits(kv)) {}
  bool matches(const KvStorage& kv) const {
    if (!same_sent_layout(kv.layout(), layout_)) return false;
    for (int i = 0; i < layout_.num_layers; ++i)
      if (std::bit_cast<uint32_t>(kv.k_scale(i)) != scale_bits_[size_t(2 * i)] ||
          std::bit_cast<uint32_t>(kv.v_scale(i)) != scale_bits_[size_t(2 * i + 1)])
        return false;
    return true;
  }

 private:
  static std::vector<uint32_t> scale_bits(const KvStorage& kv) {
    std::vector<uint32_t> bits;
    for (int i = 0; i < kv.layout().num_layers; ++i) {
      bits.push_back(std::bit_cast<uint32_t>(kv.k_scale(i)));
      bits.push_back(std::bit_cast<uint32_t>(kv.v_scale(i)));
    }
    return bits;
  }
  KvLayout layout_;  // rank 0's, as sent (its k_dim/v_dim are not sent nor compared)
  std::vector<uint32_t> scale_bits_;  // [num_layers, 2]: k, v scale
};

// A decoded kInitKv message: the pool's layout with this rank's K/V widths, and its scales.
struct KvInit {
  KvLayout layout;
  std::vector<float> scales;  // [num_layers, 2]: k, v scale
};

StatusOr<KvInit> decode_init_kv(std::span<const uint8_t> in, const Model& model,
                                const Backend& backend) {
  size_t at = 5;                   // kind, id
  KvLayout l = model.kv_layout();  // this rank's widths
  int32_t layers = 0, page_size = 0, rope_dim = 0;
  int64_t pages = 0;
  uint8_t dtype = 0, format = 0;
  uint32_t n_layer_dtypes = 0;
  int16_t rope_dtype = -1;
  bool ok = get(in, at, &layers) && get(in, at, &pages) && get(in, at, &page_size) &&
            get(in, at, &dtype) && get(in, at, &n_layer_dtypes) &&
            n_layer_dtypes <= uint32_t(std::max(0, layers));
  if (ok && layers != l.num_layers)
    return data_loss("KV init message: {} layers, this rank's model has {}", layers, l.num_layers);
  std::vector<DType> layer_dtypes(ok ? n_layer_dtypes : 0);
  for (auto& d : layer_dtypes) {
    uint8_t v = 0;
    ok = ok && get(in, at, &v);
    d = DType(v);
  }
  ok = ok && get(in, at, &rope_dim) && get(in, at, &rope_dtype) && get(in, at, &format);
  std::vector<float> scales(size_t(std::max(0, layers)) * 2);
  for (float& s : scales) ok = ok && get(in, at, &s);
  if (!ok || at != in.size() || pages < 1 || page_size < 1)
    return data_loss("KV init message: malformed");
  l.num_pages = pages;
  l.page_size = page_size;
  l.dtype = DType(dtype);
  l.layer_dtypes = std::move(layer_dtypes);
  l.rope_dim = rope_dim;
  if (rope_dtype >= 0) l.rope_dtype = DType(rope_dtype);
  l.format = KvFormat(format);
  STRATA_RETURN_IF_ERROR(backend.check_kv_layout(l));
  return KvInit{std::move(l), std::move(scales)};
}

// Applies a kInitKv message to the worker's pool `kv` (null: none yet). The same storage again
// (rank 0 changed only scales, e.g. mid-sequence) keeps the pool and its cached K/V, as rank 0
// keeps its own: set_scales only changes how stored values are read and written from now on,
// on every rank alike. Other storage means rank 0 has another pool at that address (a pool's
// layout is fixed when it is made), whose contents are new: the worker allocates a new one.
void apply_init_kv(KvInit init, Backend& backend, std::unique_ptr<KvStorage>& kv) {
  if (kv == nullptr || !same_sent_layout(kv->layout(), init.layout)) {
    kv.reset();  // free the old storage before allocating its successor
    kv = backend.alloc_kv(init.layout);
  }
  for (int i = 0; i < init.layout.num_layers; ++i)
    kv->set_scales(i, init.scales[size_t(2 * i)], init.scales[size_t(2 * i + 1)]);
}

// A step's plan as rank 0's forward sees it (the engine's BatchPlan, through ForwardBatch).
BatchPlan plan_of(const ForwardBatch& b) {
  const AttentionMetadata& a = b.attn;
  BatchPlan p;
  p.page_size = a.page_size;
  auto take = [](const int32_t* x, int64_t n) { return std::vector<int32_t>(x, x + n); };
  p.token_ids = take(b.token_ids, a.num_tokens);
  p.positions = take(a.positions, a.num_tokens);
  p.q_indptr = take(a.q_indptr, a.num_seqs + 1);
  p.kv_lens = take(a.kv_lens, a.num_seqs);
  p.page_indptr = take(a.page_indptr, a.num_seqs + 1);
  p.page_indices = take(a.page_indices, a.page_indptr[a.num_seqs]);
  p.slot_mapping = take(a.slot_mapping, a.num_tokens);
  p.logits_rows = take(b.logit_rows, b.num_logit_rows);
  if (a.tree_mask != nullptr) p.tree_mask.assign(a.tree_mask, a.tree_mask + a.num_tokens);
  for (int32_t row : p.logits_rows) {
    const auto it = std::upper_bound(p.q_indptr.begin(), p.q_indptr.end(), row);
    p.sampled_seqs.push_back(int32_t(it - p.q_indptr.begin()) - 1);
  }
  return p;
}

// A worker's step: the plan must fit the rank's pool (pages and slots), or the message is bad.
// Under decode context parallelism the plan's page holds dcp_size pool pages' tokens.
Status check_plan_fits(const BatchPlan& p, const KvStorage* kv, int dcp_size) {
  if (kv == nullptr) return data_loss("step message before the KV init message");
  const int64_t pages = kv->layout().num_pages;
  if (p.page_size != kv->layout().page_size * dcp_size)
    return data_loss(
        "step message: page size {} but the pool's is {} (x {} ranks of context parallelism)",
        p.page_size, kv->layout().page_size, dcp_size);
  for (int32_t x : p.page_indices)
    if (x >= pages) return data_loss("step message: page {} outside the pool of {}", x, pages);
  for (int32_t s : p.slot_mapping)
    if (s >= pages * p.page_size) return data_loss("step message: slot {} outside the pool", s);
  return Status();
}

// Ranks 1..N-1: receive, run, repeat until kShutdown or the group fails. Keeps one pool per id
// rank 0 uses (the engine has one; eval-kv a reference and a candidate).
Status worker_loop(Communicator& comm, Model& model, Backend& backend, int dcp_size) {
  std::unordered_map<uint32_t, std::unique_ptr<KvStorage>> pools;
  // The host KV tier behind a pool (dist/tp_host_tier.h), driven by rank 0's copies.
  std::unordered_map<uint32_t, std::unique_ptr<TpHostMirror>> mirrors;
  auto apply_sync = [&](uint32_t id, const std::optional<HostTierSync>& sync) -> Status {
    if (!sync) return Status();
    auto it = mirrors.find(id);
    if (it == mirrors.end())
      return data_loss("host tier copies for pool {}, which has no host tier", id);
    return it->second->apply(*sync);
  };
  std::vector<uint8_t> msg;
  TpStepTiming timing(comm.rank(), "waiting for the plan");
  for (;;) {
    const auto wait_begin = TpStepTiming::Clock::now();
    STRATA_RETURN_IF_ERROR(comm.broadcast_bytes(msg, 0));
    const auto received = TpStepTiming::Clock::now();
    if (msg.empty()) return data_loss("empty tensor-parallel message");
    uint32_t id = 0;
    size_t at = 1;
    if (TpMessage(msg[0]) != TpMessage::kShutdown && !get(msg, at, &id))
      return data_loss("tensor-parallel message without a pool id");
    switch (TpMessage(msg[0])) {
      case TpMessage::kShutdown:
        return Status();
      case TpMessage::kInitKv: {
        STRATA_ASSIGN_OR_RETURN(KvInit init, decode_init_kv(msg, model, backend));
        const KvStorage* before = pools[id].get();
        apply_init_kv(std::move(init), backend, pools[id]);
        if (pools[id].get() != before)
          mirrors.erase(id);  // its copier pointed into the old storage
        break;
      }
      case TpMessage::kInitHost: {
        int64_t host_pages = 0;
        uint8_t io = 0;
        if (!get(msg, at, &host_pages) || !get(msg, at, &io) || at != msg.size())
          return data_loss("host tier init message: malformed");
        auto it = pools.find(id);
        Status made = it == pools.end()
                          ? data_loss("host tier for pool {} before its KV init message", id)
                          : Status();
        if (made.ok()) {
          auto mirror =
              TpHostMirror::create(backend, *it->second, host_pages, KvIoBackend(io), comm.rank());
          if (mirror.ok()) mirrors[id] = std::move(mirror).value();
          made = mirror.status();
        }
        STRATA_RETURN_IF_ERROR(gather_from_workers(comm, encode_status(made), nullptr));
        break;
      }
      case TpMessage::kHostStats: {
        STRATA_ASSIGN_OR_RETURN(std::optional<HostTierSync> sync, get_sync(msg, at));
        STRATA_RETURN_IF_ERROR(apply_sync(id, sync));
        auto it = mirrors.find(id);
        if (it == mirrors.end())
          return data_loss("host tier statistics for pool {}, which has no host tier", id);
        std::vector<uint8_t> mine;
        encode_rank_stats(it->second->stats(), mine);
        STRATA_RETURN_IF_ERROR(gather_from_workers(comm, mine, nullptr));
        break;
      }
      case TpMessage::kMoveKv: {
        // Rank 0 moved the same rows of its pool right after its verify: in message order, so
        // after this step's host tier copies and before the next step's.
        uint32_t n = 0;
        if (!get(msg, at, &n) || msg.size() != at + 8 * size_t(n))
          return data_loss("KV move message: malformed");
        std::vector<int32_t> from(n), to(n);
        for (uint32_t i = 0; i < n; ++i) get(msg, at, &from[i]);
        for (uint32_t i = 0; i < n; ++i) get(msg, at, &to[i]);
        auto it = pools.find(id);
        if (it == pools.end()) return data_loss("KV move for pool {} before its KV init", id);
        const int64_t slots = it->second->layout().num_pages * it->second->layout().page_size;
        for (uint32_t i = 0; i < n; ++i)
          if (from[i] < 0 || from[i] >= slots || to[i] < 0 || to[i] >= slots)
            return data_loss("KV move message: slot {} -> {} outside the pool", from[i], to[i]);
        backend.kv_move_rows(*it->second, from.data(), to.data(), int(n));
        break;
      }
      case TpMessage::kStep: {
        STRATA_ASSIGN_OR_RETURN(std::optional<HostTierSync> sync, get_sync(msg, at));
        STRATA_ASSIGN_OR_RETURN(BatchPlan plan,
                                BatchPlan::deserialize(std::span<const uint8_t>(msg).subspan(at)));
        auto it = pools.find(id);
        KvStorage* kv = it == pools.end() ? nullptr : it->second.get();
        STRATA_RETURN_IF_ERROR(check_plan_fits(plan, kv, dcp_size));
        // Rank 0's copies between this step's plan and the last: before the forward reads or
        // overwrites the pages they move.
        STRATA_RETURN_IF_ERROR(apply_sync(id, sync));
        model.forward(forward_batch(plan), *kv, nullptr);  // the logits are rank 0's
        // Nothing was downloaded, so end the step here: its staged inputs are released.
        backend.synchronize();
        STRATA_RETURN_IF_ERROR(comm.status());
        timing.add(wait_begin, received, TpStepTiming::Clock::now());
        break;
      }
      default:
        return data_loss("unknown tensor-parallel message kind {}", int(msg[0]));
    }
  }
}

// Rank 0's model as the engine sees it: forward() broadcasts the step, then runs rank 0's part.
class TpModel : public Model {
 public:
  TpModel(std::unique_ptr<Model> inner, std::unique_ptr<Communicator> comm,
          std::unique_ptr<Communicator> dcp_comm, std::function<void()> bind_thread,
          std::shared_ptr<TpGroupState> state, std::shared_ptr<TpShardPlan> plan,
          std::vector<std::thread> workers)
      : Model(inner->spec(), inner->backend()),
        inner_(std::move(inner)),
        comm_(std::move(comm)),
        dcp_comm_(std::move(dcp_comm)),
        bind_thread_(std::move(bind_thread)),
        state_(std::move(state)),
        plan_(std::move(plan)),
        workers_(std::move(workers)) {}

  ~TpModel() override {
    std::vector<uint8_t> msg{uint8_t(TpMessage::kShutdown)};
    if (bind_thread_) bind_thread_();
    if (comm_->status().ok()) {
      const Status st = comm_->broadcast_bytes(msg, 0);
      if (!st.ok()) LOG_WARN("tensor-parallel shutdown: {}", st.to_string());
    }
    for (auto& t : workers_) t.join();
    state_->remove(comm_.get());
    if (dcp_comm_) state_->remove(dcp_comm_.get());
  }

  KvLayout kv_layout() const override { return inner_->kv_layout(); }

  // Rank 0's model captures (after each all-reduce its residual stream is the whole hidden state;
  // the worker ranks' forwards have nothing to copy); this model keeps the spec for the runner.
  Status set_capture(const CaptureSpec& spec, int64_t max_tokens) override {
    STRATA_RETURN_IF_ERROR(set_capture_spec(spec));
    return inner_->set_capture(spec, max_tokens);
  }

  // attach_tp_host_tier: every worker makes its host mirror of `kv`'s pool; the first failure is
  // returned (naming its rank). From then on the pool's steps carry `tier`'s copies.
  Status attach_host_tier(TpHostTier* tier, const KvStorage& kv, int64_t host_pages,
                          KvIoBackend io) {
    if (bind_thread_) bind_thread_();
    if (host_tier_ != nullptr)
      return failed_precondition("this tensor-parallel model already has a host KV tier");
    const uint32_t id = announce_pool(kv).id;
    std::vector<uint8_t> msg{uint8_t(TpMessage::kInitHost)};
    put<uint32_t>(msg, id);
    put<int64_t>(msg, host_pages);
    put<uint8_t>(msg, uint8_t(io));
    STRATA_RETURN_IF_ERROR(comm_->broadcast_bytes(msg, 0));
    std::vector<std::vector<uint8_t>> replies;
    STRATA_RETURN_IF_ERROR(gather_from_workers(*comm_, {}, &replies));
    for (size_t r = 0; r < replies.size(); ++r)
      STRATA_RETURN_IF_ERROR(decode_status(replies[r], int(r) + 1));
    host_tier_ = tier;
    host_kv_ = &kv;
    return Status();
  }
  void detach_host_tier() { host_tier_ = nullptr, host_kv_ = nullptr; }

  // TpHostTier::gather_rank_stats: the copies not sent yet go first, then every worker's counts.
  StatusOr<std::vector<HostTierRankStats>> gather_host_stats() {
    CHECK(host_tier_ != nullptr);
    if (bind_thread_) bind_thread_();
    std::vector<uint8_t> msg{uint8_t(TpMessage::kHostStats)};
    put<uint32_t>(msg, pools_.at(host_kv_).id);
    put_sync(msg, host_tier_->take_sync());
    STRATA_RETURN_IF_ERROR(comm_->broadcast_bytes(msg, 0));
    std::vector<std::vector<uint8_t>> replies;
    STRATA_RETURN_IF_ERROR(gather_from_workers(*comm_, {}, &replies));
    std::vector<HostTierRankStats> out{host_tier_->local_stats()};
    for (const auto& reply : replies) {
      STRATA_ASSIGN_OR_RETURN(HostTierRankStats s, decode_rank_stats(reply));
      out.push_back(s);
    }
    return out;
  }

  // Every worker moves the same slots of its pool (each rank's pool has rank 0's pages and slots;
  // decode context parallelism, whose pools differ, has no draft trees).
  void move_kv_rows(KvStorage& kv, std::span<const int32_t> from,
                    std::span<const int32_t> to) override {
    CHECK_EQ(from.size(), to.size());
    if (from.empty()) return;
    if (bind_thread_) bind_thread_();
    const Pool& pool = announce_pool(kv);
    std::vector<uint8_t> msg{uint8_t(TpMessage::kMoveKv)};
    put<uint32_t>(msg, pool.id);
    put<uint32_t>(msg, uint32_t(from.size()));
    for (int32_t x : from) put<int32_t>(msg, x);
    for (int32_t x : to) put<int32_t>(msg, x);
    check(comm_->broadcast_bytes(msg, 0));
    inner_->move_kv_rows(kv, from, to);
  }

  void forward(const ForwardBatch& batch, KvStorage& kv, float* logits) override {
    const auto begin = TpStepTiming::Clock::now();
    broadcast_step(batch, kv);
    const auto sent = TpStepTiming::Clock::now();
    inner_->forward(batch, kv, logits);
    check(comm_->status());
    timing_.add(begin, sent, TpStepTiming::Clock::now());
  }
  // The workers run forward() either way (without logits): eval-kv's statistics are rank 0's.
  void forward_logits(const ForwardBatch& batch, KvStorage& kv,
                      const LogitsConsumer& consumer) override {
    const auto begin = TpStepTiming::Clock::now();
    broadcast_step(batch, kv);
    const auto sent = TpStepTiming::Clock::now();
    inner_->forward_logits(batch, kv, consumer);
    check(comm_->status());
    timing_.add(begin, sent, TpStepTiming::Clock::now());
  }
  // The workers run forward() either way (without logits): sampling happens on rank 0 only.
  void forward_sample(const ForwardBatch& batch, KvStorage& kv, const SampleArgs& args) override {
    const auto begin = TpStepTiming::Clock::now();
    broadcast_step(batch, kv);
    const auto sent = TpStepTiming::Clock::now();
    inner_->forward_sample(batch, kv, args);
    check(comm_->status());
    timing_.add(begin, sent, TpStepTiming::Clock::now());
  }

 private:
  struct Pool;
  // A pool the workers have not mirrored yet (or a new pool at a freed one's address with
  // another layout, or new scales): sends its layout first. Checked every step, so it compares
  // the message's inputs rather than encoding it.
  Pool& announce_pool(const KvStorage& kv) {
    auto [it, fresh] = pools_.try_emplace(&kv, Pool{uint32_t(pools_.size()), std::nullopt});
    Pool& pool = it->second;
    if (fresh || !pool.sent->matches(kv)) {
      pool.sent.emplace(kv);
      std::vector<uint8_t> init = encode_init_kv(kv, pool.id);
      check(comm_->broadcast_bytes(init, 0));
    }
    return pool;
  }

  // Sends the step: [kind][pool id][host tier section][plan].
  void broadcast_step(const ForwardBatch& batch, KvStorage& kv) {
    if (bind_thread_) bind_thread_();
    const Pool& pool = announce_pool(kv);
    std::vector<uint8_t> bytes{uint8_t(TpMessage::kStep)};
    put<uint32_t>(bytes, pool.id);
    put_sync(bytes, host_tier_ != nullptr && host_kv_ == &kv
                        ? std::optional<HostTierSync>(host_tier_->take_sync())
                        : std::nullopt);
    const std::vector<uint8_t> plan = plan_of(batch).serialize();
    bytes.insert(bytes.end(), plan.begin(), plan.end());
    check(comm_->broadcast_bytes(bytes, 0));
  }
  // The engine's forward cannot return an error: a failed group stops the process, naming the
  // rank and its error (the other ranks' collectives have already returned).
  void check(const Status& st) const {
    CHECK_MSG(st.ok(), "tensor-parallel group of {} ranks stopped: {}", comm_->size(),
              st.to_string());
  }

  std::unique_ptr<Model> inner_;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<Communicator>
      dcp_comm_;                       // the DCP group split off comm_ (null: none or all of comm_)
  std::function<void()> bind_thread_;  // rank 0's device, for the engine thread
  std::shared_ptr<TpGroupState> state_;
  std::shared_ptr<TpShardPlan> plan_;
  std::vector<std::thread> workers_;
  // The pools the workers mirror, by rank 0's address: their id and what their last init
  // message was built from. Workers keep a pool until shutdown (the engine has one; eval-kv
  // reuses a few addresses).
  struct Pool {
    uint32_t id;
    std::optional<KvInitInputs> sent;  // set once the init message went out
  };
  std::unordered_map<const KvStorage*, Pool> pools_;
  TpStepTiming timing_{0, "sending the plan"};
  // The host KV tier behind pool host_kv_ (null: none); its copies ride with that pool's steps.
  TpHostTier* host_tier_ = nullptr;
  const KvStorage* host_kv_ = nullptr;
};

// Rank r's setup on its thread: resources, weights, then the group barrier.
struct RankSetup {
  RankResources res;
  std::unique_ptr<Communicator> dcp_comm;  // a DCP group smaller than the tp group (else null)
  std::unique_ptr<Model> model;
  void remove_from(TpGroupState& state) {
    state.remove(res.comm.get());
    if (dcp_comm) state.remove(dcp_comm.get());
  }
};
StatusOr<RankSetup> setup_rank(int r, const ModelSpec& spec, const WeightStore& weights,
                               const TpShardPlan& plan, const RankFactory& factory, int dcp_size,
                               TpGroupState& state) {
  RankSetup s;
  STRATA_ASSIGN_OR_RETURN(s.res, factory(r, state.failed()));
  state.add(s.res.comm.get());
  Communicator* dcp = nullptr;
  if (dcp_size > 1 && dcp_size == s.res.comm->size()) {
    dcp = s.res.comm.get();
  } else if (dcp_size > 1) {
    auto split = s.res.comm->split(dcp_size);
    if (!split.ok()) {
      s.remove_from(state);
      return split.status();
    }
    s.dcp_comm = std::move(split).value();
    state.add(s.dcp_comm.get());
    dcp = s.dcp_comm.get();
  }
  auto model = create_model(spec, weights, *s.res.backend,
                            TpRank{.comm = s.res.comm.get(), .plan = &plan, .dcp = dcp});
  if (!model.ok()) {
    s.remove_from(state);  // its communicators go with it: the group must not abort them later
    return model.status();
  }
  s.model = std::move(model).value();
  return s;
}

}  // namespace

StatusOr<std::optional<LaunchRank>> tp_launch_from_env(int tp_size, Device device,
                                                       std::string* nccl_id_file) {
  STRATA_ASSIGN_OR_RETURN(LaunchRank launch, launch_rank_from_env());
  if (launch.size <= 1) return std::optional<LaunchRank>();
  if (launch.size != tp_size)
    return invalid_argument(
        "the launcher started {} processes ({}) but --tp-size is {}: give --tp-size {} (one "
        "rank per process)",
        launch.size, launch.source, tp_size, launch.size);
  if (device != Device::kCuda)
    return invalid_argument(
        "{} ranks started by a launcher ({}) need --device cuda: ranks of several processes "
        "talk through NCCL",
        launch.size, launch.source);
  if (const char* f = std::getenv("STRATA_NCCL_ID_FILE"); f != nullptr && *f != '\0') {
    *nccl_id_file = f;
  } else {
    // A job id every rank of this launch sees (so a file left by an earlier job is not read).
    std::string job = "0";
    for (const char* v : {"PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_ess_jobid",
                          "SLURM_JOB_ID", "PMI_JOBID"})
      if (const char* j = std::getenv(v); j != nullptr && *j != '\0') {
        job = j;
        if (const char* step = std::getenv("SLURM_STEP_ID");
            step != nullptr && std::string(v) == "SLURM_JOB_ID")
          job += std::string(".") + step;
        break;
      }
    *nccl_id_file = ".strata_nccl_id." + job;
  }
  return std::optional<LaunchRank>(launch);
}

StatusOr<RankFactory> make_tp_rank_factory(const TpConfig& config) {
  return make_rank_factory(RankGroup{.device = config.device,
                                     .size = config.tp_size,
                                     .launch = config.launch,
                                     .nccl_id_file = config.nccl_id_file,
                                     .one_rank = config.one_rank});
}

StatusOr<std::unique_ptr<Model>> create_tp_model(const ModelSpec& spec, const WeightStore& weights,
                                                 const TpConfig& config, const RankFactory& factory,
                                                 std::unique_ptr<Backend>* rank0_backend) {
  STRATA_ASSIGN_OR_RETURN(TpShardPlan plan_value,
                          plan_tp_sharding(spec, config.tp_size, config.sharding));
  auto plan = std::make_shared<TpShardPlan>(std::move(plan_value));
  auto state = std::make_shared<TpGroupState>();
  std::vector<std::thread> workers;
  if (config.launch && config.launch->rank != 0)
    return internal_error("rank {} of a launcher job runs run_tp_worker, not the engine",
                          config.launch->rank);
  // With a launcher the other ranks are other processes; else threads of this one (none with
  // --tp-one-rank: rank 0 runs alone).
  const int local_ranks = config.launch || config.one_rank ? 1 : config.tp_size;
  for (int r = 1; r < local_ranks; ++r) {
    // Workers keep only `spec` and `plan` (shared) after the barrier; `weights` is read before it.
    const int dcp_size = config.dcp_size;
    workers.emplace_back([r, spec, &weights, plan, &factory, dcp_size, state] {
      auto s = setup_rank(r, spec, weights, *plan, factory, dcp_size, *state);
      if (!s.ok()) return state->fail(s.status().with_context("tensor-parallel rank {}", r));
      Communicator& comm = *s->res.comm;
      Status st = comm.barrier();  // every rank loaded
      if (st.ok()) st = worker_loop(comm, *s->model, *s->res.backend, dcp_size);
      if (!st.ok() && !state->failed().load())
        state->fail(st.with_context("tensor-parallel rank {}", r));
      s->remove_from(*state);
    });
  }
  auto s0 = setup_rank(0, spec, weights, *plan, factory, config.dcp_size, *state);
  Status st =
      s0.ok() ? s0->res.comm->barrier() : s0.status().with_context("tensor-parallel rank 0");
  if (!st.ok()) {
    state->fail(st);
    for (auto& t : workers) t.join();
    if (s0.ok()) s0->remove_from(*state);
    return state->first();
  }
  LOG_INFO("tensor parallel: {}{} ranks on {} · {} heads, {} vocab rows per rank{}",
           config.one_rank ? "rank 0 alone (--tp-one-rank) of " : "", config.tp_size,
           device_name(config.device), plan->rank(0).q_heads.size(), plan->rank(0).vocab.size(),
           plan->kv_heads_replicated() ? " · KV heads replicated" : "");
  if (config.dcp_size > 1)
    LOG_INFO(
        "decode context parallelism: groups of {} ranks, each holding 1/{} of every sequence's "
        "latent KV",
        config.dcp_size, config.dcp_size);
  *rank0_backend = std::move(s0->res.backend);
  return std::unique_ptr<Model>(new TpModel(std::move(s0->model), std::move(s0->res.comm),
                                            std::move(s0->dcp_comm), std::move(s0->res.bind_thread),
                                            state, plan, std::move(workers)));
}

StatusOr<std::unique_ptr<TpHostTier>> attach_tp_host_tier(Model& tp_model, const KvStorage& kv,
                                                          int64_t host_pages, KvIoBackend io,
                                                          std::unique_ptr<HiCacheIo> rank0_io) {
  auto* tp = dynamic_cast<TpModel*>(&tp_model);
  if (tp == nullptr) return internal_error("attach_tp_host_tier: not a tensor-parallel model");
  auto tier = std::make_unique<TpHostTier>(std::move(rank0_io), host_pages);
  STRATA_RETURN_IF_ERROR(tp->attach_host_tier(tier.get(), kv, host_pages, io));
  tier->set_group([tp] { return tp->gather_host_stats(); }, [tp] { tp->detach_host_tier(); });
  return tier;
}

Status run_tp_worker(const std::string& model_path, const TpConfig& config) {
  if (!config.launch || config.launch->rank == 0)
    return internal_error("run_tp_worker: not a worker rank");
  const int r = config.launch->rank;
  STRATA_ASSIGN_OR_RETURN(ModelSpec spec, load_model_spec(model_path));
  STRATA_ASSIGN_OR_RETURN(WeightStore weights, WeightStore::open(model_path, spec.quant));
  STRATA_ASSIGN_OR_RETURN(TpShardPlan plan,
                          plan_tp_sharding(spec, config.tp_size, config.sharding));
  STRATA_ASSIGN_OR_RETURN(RankFactory factory, make_tp_rank_factory(config));
  TpGroupState state;
  auto s = setup_rank(r, spec, weights, plan, factory, config.dcp_size, state);
  if (!s.ok()) return s.status().with_context("tensor-parallel rank {}", r);
  Communicator& comm = *s->res.comm;
  LOG_INFO("tensor parallel: rank {} of {} ({}) loaded; serving rank 0's steps", r, config.tp_size,
           config.launch->source);
  Status st = comm.barrier();
  if (st.ok()) st = worker_loop(comm, *s->model, *s->res.backend, config.dcp_size);
  s->remove_from(state);
  return st.with_context("tensor-parallel rank {}", r);
}

}  // namespace strata
