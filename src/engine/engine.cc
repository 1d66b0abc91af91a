#include "engine/engine.h"

#ifdef STRATA_CUDA
#include <cuda_runtime.h>
#endif

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/log.h"
#include "engine/batch_plan.h"
#include "engine/live_request.h"
#include "engine/schedule_state.h"
#include "engine/tp_driver.h"
#include "backend/kv_host_io.h"
#include "kv/host_pool.h"
#include "kv/page_pool.h"
#include "kv/radix_cache.h"
#include "model/config.h"
#include "model/weights.h"

namespace strata {

KvCacheOptions kv_cache_options(const EngineConfig& c) {
  return KvCacheOptions{.dtype = c.kv_cache_dtype,
                        .bf16_layers = c.kv_bf16_layers,
                        .scales_path = c.kv_scales_path,
                        .mla_rope_dtype = c.kv_mla_rope_dtype};
}

namespace {
// Total memory of the current CUDA device in GiB (what SGLang plans against); 0 without CUDA.
double device_memory_gib() {
#ifdef STRATA_CUDA
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess)
    return double(total_bytes) / double(int64_t(1) << 30);
#endif
  return 0;
}
double physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? double(pages) * double(page) : 0;
}
}  // namespace

// The host tier's options on their own (before any loading, so a bad flag fails fast).
static Status check_host_tier_options(const EngineConfig& c) {
  if (c.enable_hierarchical_cache && c.disable_radix_cache)
    return invalid_argument("--enable-hierarchical-cache keeps the prefix cache's evicted prefixes: it does not go "
                            "with --disable-radix-cache");
  if (!c.enable_hierarchical_cache) {
    if (c.hicache_size_gb != 0 || c.hicache_ratio != 0 || !c.hicache_io_backend.empty())
      return invalid_argument("--hicache-size/--hicache-ratio/--hicache-io-backend need --enable-hierarchical-cache");
    return Status::ok_status();
  }
  if (c.hicache_size_gb != 0 && c.hicache_ratio != 0)
    return invalid_argument("--hicache-size and --hicache-ratio both set: give one (size in GB, or a multiple of the device pool)");
  if (c.hicache_size_gb < 0 || std::isnan(c.hicache_size_gb))
    return invalid_argument("--hicache-size must be > 0 GB, got {}", c.hicache_size_gb);
  if (c.hicache_ratio < 0 || std::isnan(c.hicache_ratio))
    return invalid_argument("--hicache-ratio must be > 0, got {}", c.hicache_ratio);
  STRATA_RETURN_IF_ERROR(parse_hicache_write_policy(c.hicache_write_policy).status());
  STRATA_RETURN_IF_ERROR(parse_kv_io_backend(c.hicache_io_backend).status());
  return Status::ok_status();
}

Status Engine::setup_host_tier(const KvLayout& layout) {
  const EngineConfig& c = config_;
  if (!c.enable_hierarchical_cache) return Status::ok_status();
  STRATA_ASSIGN_OR_RETURN(HiCacheWritePolicy policy, parse_hicache_write_policy(c.hicache_write_policy));
  STRATA_ASSIGN_OR_RETURN(KvIoBackend io, parse_kv_io_backend(c.hicache_io_backend));
  if (backend_->device() == Device::kCpu && (io == KvIoBackend::kDirect || io == KvIoBackend::kKernel)) {
    LOG_WARN("--hicache-io-backend {} does not apply on the cpu backend: host copies are memcpy",
             kv_io_backend_name(io));
    io = KvIoBackend::kMemcpy;
  }
  const int64_t page_bytes = layout.bytes_per_token() * layout.page_size;
  const double ratio = c.hicache_ratio > 0 ? c.hicache_ratio : 2.0;
  const int64_t pages = c.hicache_size_gb > 0 ? int64_t(c.hicache_size_gb * 1e9 / double(page_bytes))
                                              : int64_t(double(layout.num_pages) * ratio);
  if (pages < 1)
    return invalid_argument("host KV tier of {} holds no {}-byte page: raise --hicache-size/--hicache-ratio",
                            c.hicache_size_gb > 0 ? fmt::format("{} GB", c.hicache_size_gb)
                                                  : fmt::format("ratio {}", ratio),
                            page_bytes);
  if (pages > int64_t(INT32_MAX)) return invalid_argument("host KV tier: {} pages is too many", pages);
  const double bytes = double(pages) * double(page_bytes);
  // Ranks that are threads of this process each hold their own tier (engine/tp_host_tier.h).
  const int local_ranks = tp_launched_ ? 1 : c.tp_size;
  const double ram = physical_memory_bytes();
  if (ram > 0 && bytes * local_ranks > 0.9 * ram)
    return resource_exhausted("host KV tier of {:.2f} GB{} exceeds 90% of this machine's {:.2f} GB of memory",
                              bytes / 1e9, local_ranks > 1 ? fmt::format(" x {} ranks", local_ranks) : "",
                              ram / 1e9);
  STRATA_ASSIGN_OR_RETURN(host_io_, make_kv_host_io(*backend_, *kv_, pages, io));
  if (c.tp_size > 1) {
    // Rank 0 decides every copy; each other rank repeats it on its own pool and host memory.
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<TpHostTier> tier,
                            attach_tp_host_tier(*model_, *kv_, pages, host_io_->backend(),
                                                std::make_unique<KvHostIoCopier>(host_io_.get())));
    tp_host_tier_ = tier.get();
    hicache_io_ = std::move(tier);
  } else {
    hicache_io_ = std::make_unique<KvHostIoCopier>(host_io_.get());
  }
  host_pool_ = std::make_unique<HostPool>(int32_t(pages), layout.page_size);
  hicache_ = std::make_unique<HiCache>(pool_.get(), cache_.get(), host_pool_.get(), hicache_io_.get(), policy);
  stats_.hicache_capacity_tokens = host_pool_->capacity_tokens();
  stats_.hicache_ranks = rank_host_stats(/*force=*/true);  // every rank's host memory, from the start
  LOG_INFO("Host KV tier: {} tokens ({:.2f} GB{}, {:.2f}x the device pool) · write policy {} · io {}",
           host_pool_->capacity_tokens(), bytes / 1e9, c.tp_size > 1 ? " per rank" : "",
           double(pages) / double(layout.num_pages), hicache_write_policy_name(policy),
           kv_io_backend_name(host_io_->backend()));
  return Status::ok_status();
}

StatusOr<std::unique_ptr<Engine>> Engine::create(const EngineConfig& config) {
  STRATA_RETURN_IF_ERROR(check_host_tier_options(config));
  std::unique_ptr<Engine> e(new Engine());
  e->config_ = config;
  if (config.device == "cpu") {
    e->backend_ = make_cpu_backend();
  } else if (config.device == "cuda") {
#ifdef STRATA_CUDA
    e->backend_ = make_cuda_backend();
#else
    return failed_precondition("--device cuda: this build has no CUDA backend (configure with -DSTRATA_CUDA=ON)");
#endif
  } else {
    return invalid_argument("--device must be cpu or cuda, got '{}'", config.device);
  }
  if (config.page_size < 1) return invalid_argument("--page-size must be >= 1, got {}", config.page_size);
  if (config.tp_size < 1) return invalid_argument("--tp-size must be >= 1, got {}", config.tp_size);
  if (config.cuda_graph_max_bs) {
    const int bs = *config.cuda_graph_max_bs;
    if (bs < 0) return invalid_argument("--cuda-graph-max-bs must be >= 0, got {}", bs);
    if (bs > 0 && config.device != "cuda")
      return invalid_argument("--cuda-graph-max-bs {} needs --device cuda (there are no graphs on {})", bs,
                              config.device);
    if (bs > 0 && config.tp_size > 1)
      return unimplemented("--cuda-graph-max-bs with --tp-size {}: the collectives are not recorded into graphs "
                           "yet; give --disable-cuda-graph", config.tp_size);
  } else {
    e->config_.cuda_graph_max_bs = config.device == "cuda" && config.tp_size == 1 ? kDefaultCudaGraphMaxBs : 0;
  }
  if (*e->config_.cuda_graph_max_bs > 0)
    LOG_INFO("CUDA graphs: decode steps of at most {} requests replay captured graphs (--cuda-graph-max-bs; "
             "--disable-cuda-graph launches every step eagerly)", *e->config_.cuda_graph_max_bs);

  STRATA_ASSIGN_OR_RETURN(ModelSpec spec, load_model_spec(config.model_path));
  STRATA_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::load(config.tokenizer_dir()));
  if (!config.tokenizer_path.empty() && tok.vocab_size() > spec.vocab_size)  // --tokenizer-path of another model?
    return invalid_argument("the tokenizer in {} has {} tokens but the model's vocab_size is {}: a tokenizer of "
                            "another model?", config.tokenizer_dir(), tok.vocab_size(), spec.vocab_size);
  e->tokenizer_ = std::make_unique<Tokenizer>(std::move(tok));

  // KV dtype: "auto" is the activation dtype of the backend (exact). Per-layer bf16, scales and
  // MLA row formats: engine/kv_config.h.
  STRATA_ASSIGN_OR_RETURN(WeightStore weights, WeightStore::open(config.model_path, spec.quant));
  STRATA_ASSIGN_OR_RETURN(e->kv_config_,
                          resolve_kv_cache_config(kv_cache_options(config), spec, &weights,
                                                  e->backend_->activation_dtype()));
  const DType kv_dtype = e->kv_config_.dtype;

  Deployment dep;
  double mem_gib = config.device_memory_gib;
  if (mem_gib <= 0) mem_gib = config.device == "cuda" ? device_memory_gib() : 4.0;
  dep.gpu_memory_bytes = int64_t(mem_gib * double(int64_t(1) << 30));
  // An uneven split (tests only) is planned as tp 1: no rank holds more than that.
  dep.tp_size = config.tp_allow_uneven ? 1 : config.tp_size;
  dep.mem_fraction_static = config.mem_fraction_static;
  dep.kv_cache_dtype = kv_dtype;
  dep.kv_bf16_layers = e->kv_config_.bf16_layers;
  dep.page_size = config.page_size;
  dep.context_length = config.context_length;
  dep.max_running_requests = config.max_running_requests;
  dep.max_total_tokens = config.max_total_tokens;
  dep.chunked_prefill_size = config.chunked_prefill_size;
  dep.cuda_graph_max_bs = *e->config_.cuda_graph_max_bs;
  dep.weight_policy = e->backend_->weight_policy();
  if (config.device == "cpu") {
    // No CUDA context, graphs or communicators; the GPU-size rule for the default fraction does
    // not apply. The planner's CPU mode is what `strata plan --device cpu` uses too.
    dep.device = PlanDevice::kCpu;
    if (!dep.mem_fraction_static) dep.mem_fraction_static = 0.9;
  }
  STRATA_ASSIGN_OR_RETURN(e->plan_, plan_kv_capacity(spec, dep));
  const Plan& plan = e->plan_;
  if (plan.kv_tokens < config.page_size)
    return resource_exhausted(
        "KV cache has room for {} tokens: the weights ({:.2f} GiB) leave nothing of {:.2f} GiB x "
        "mem-fraction-static {:.2f}; raise the memory budget or the fraction",
        plan.kv_tokens, double(plan.weight_bytes_per_rank) / double(1 << 30), mem_gib,
        plan.mem_fraction_static);
  e->context_length_ = plan.context_length;

  if (config.tp_size > 1) {
    TpConfig tpc{.tp_size = config.tp_size, .device = config.device,
                 .sharding = {.allow_uneven = config.tp_allow_uneven}};
    // Started by mpirun/srun as rank 0 of several processes: the others run run_tp_worker.
    STRATA_ASSIGN_OR_RETURN(tpc.launch, tp_launch_from_env(config.tp_size, config.device, &tpc.nccl_id_file));
    e->tp_launched_ = tpc.launch.has_value();
    STRATA_ASSIGN_OR_RETURN(TpRankFactory factory, make_tp_rank_factory(tpc));
    STRATA_ASSIGN_OR_RETURN(e->model_, create_tp_model(spec, weights, tpc, factory, &e->backend_));
  } else {
    STRATA_ASSIGN_OR_RETURN(e->model_, create_model(spec, weights, *e->backend_));
  }

  KvLayout layout = apply_kv_layout(e->kv_config_, spec, e->model_->kv_layout());
  layout.page_size = config.page_size;
  if (layout.bytes_per_token() > plan.kv_bytes_per_token) {
    // MLA rows with a bf16 rope part or FlashMLA tile scales: the planner counts dtype bytes
    // only, so fit the pool's planned bytes with the real row size.
    const int64_t pages = plan.kv_pool_bytes / (layout.bytes_per_token() * config.page_size);
    if (pages < 1) return resource_exhausted("KV cache: no room for one page of {}", e->kv_config_.describe());
    e->plan_.kv_tokens = pages * config.page_size;
    e->plan_.kv_bytes_per_token = layout.bytes_per_token();
    e->plan_.kv_pool_bytes = e->plan_.kv_tokens * e->plan_.kv_bytes_per_token;
  }
  layout.num_pages = plan.kv_tokens / config.page_size;
  STRATA_RETURN_IF_ERROR(e->backend_->check_kv_layout(layout));
  e->kv_ = e->backend_->alloc_kv(layout);
  apply_kv_scales(e->kv_config_, *e->kv_);
  e->pool_ = std::make_unique<PagePool>(int32_t(layout.num_pages), config.page_size);
  e->cache_ = std::make_unique<RadixCache>(e->pool_.get());

  SchedulerConfig sc;
  sc.page_size = config.page_size;
  sc.chunked_prefill_size = config.chunked_prefill_size;
  sc.max_prefill_tokens = config.max_prefill_tokens;
  sc.max_running_requests = plan.max_running_requests;
  sc.num_continuous_decode_steps = std::max(1, config.num_continuous_decode_steps);
  sc.disable_radix_cache = config.disable_radix_cache;
  if (config.schedule_conservativeness <= 0)
    return invalid_argument("--schedule-conservativeness must be > 0");
  sc.init_new_token_ratio = std::min(1.0, sc.init_new_token_ratio * config.schedule_conservativeness);
  sc.min_new_token_ratio = std::min(sc.init_new_token_ratio, sc.min_new_token_ratio * config.schedule_conservativeness);
  e->scheduler_ = std::make_unique<Scheduler>(sc);
  STRATA_RETURN_IF_ERROR(e->setup_host_tier(layout));
  e->state_ = std::make_unique<ScheduleState>(sc, e->pool_.get(), e->cache_.get(), spec.eos_token_ids,
                                              e->hicache_.get());

  LOG_INFO("KV cache: {} tokens ({}, {:.2f} GiB, {} B/token) · page size {} · max running requests {} · "
           "context {} · device {}",
           plan.kv_tokens, e->kv_config_.describe(),
           double(plan.kv_pool_bytes) / double(1 << 30), plan.kv_bytes_per_token, config.page_size,
           plan.max_running_requests, plan.context_length, e->backend_->name());
  e->stats_.kv_tokens_total = plan.kv_tokens;
  e->stats_.cpu_fallback_ops = e->backend_->cpu_fallback_counts();
  e->thread_ = std::thread([eng = e.get()] { eng->loop(); });
  return e;
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (hicache_) {
    const HiCacheStats h = hicache_->stats();
    LOG_INFO("Host KV tier: {} tokens served from host in {} promotions · {} pages demoted ({} evicted ahead), "
             "{} dropped · {:.3f} GB to host, {:.3f} GB to device · copies {:.3f} s",
             h.host_hit_tokens, h.promotions, h.demoted_pages, h.evicted_ahead_pages, h.dropped_pages,
             double(h.bytes_to_host) / 1e9,
             double(h.bytes_to_device) / 1e9, h.copy_seconds);
  }
  // The ops that ran on the CPU reference instead of the device (rank 0's under tensor
  // parallelism, where every rank runs the same ops), so a slow path never passes for a fast one.
  if (backend_) {
    const auto fallback = backend_->cpu_fallback_counts();
    int64_t calls = 0;
    std::string list;
    for (const auto& [op, n] : fallback) {
      calls += n;
      list += fmt::format("{}{} {}", list.empty() ? "" : ", ", op, n);
    }
    if (calls > 0)
      LOG_WARN("CPU fallback: {} calls of ops not on the {} device yet, run on the CPU reference "
               "through host copies (slow): {}", calls, backend_->name(), list);
    else if (!fallback.empty())
      LOG_INFO("CPU fallback: no calls ({})", list);
  }
}

int64_t Engine::kv_capacity_tokens() const { return plan_.kv_tokens; }

RequestLimits Engine::request_limits() const {
  return RequestLimits{.vocab_size = model_->spec().vocab_size,
                       .context_length = context_length_,
                       .kv_capacity_tokens = plan_.kv_tokens};
}

std::optional<RequestError> Engine::check(const GenerateRequest& g) const {
  return validate_request(g.prompt_ids, g.params, g.resume_output_ids, request_limits());
}

SubmitResult Engine::submit(GenerateRequest g) {
  if (auto e = check(g)) return *e;
  std::lock_guard<std::mutex> lk(mu_);
  if (stop_) return request_error(RequestErrorCode::kUnavailable, "", "the engine is shutting down");
  const int64_t id = next_id_++;
  const uint64_t seed = g.params.seed ? *g.params.seed : config_.seed * 1000003u + uint64_t(id);
  auto live = std::make_unique<Live>(id, std::move(g), *tokenizer_, seed);
  for (const auto& s : live->request.params().stop_strings) live->max_stop_len = std::max(live->max_stop_len, s.size());
  inbox_.push_back(std::move(live));
  ++live_count_;
  cv_.notify_all();
  return id;
}

void Engine::abort(int64_t id) {
  std::lock_guard<std::mutex> lk(mu_);
  abort_inbox_.push_back(id);
  cv_.notify_all();
}

void Engine::wait_idle() {
  std::unique_lock<std::mutex> lk(mu_);
  idle_cv_.wait(lk, [&] { return live_count_ == 0; });
}

bool Engine::flush_cache() {
  std::unique_lock<std::mutex> lk(mu_);
  flush_requested_ = true;
  flush_done_ = false;
  cv_.notify_all();
  idle_cv_.wait(lk, [&] { return flush_done_ || stop_; });
  return flush_result_;
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}

}  // namespace strata
