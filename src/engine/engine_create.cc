// Engine::create, step by step: the configuration's own checks, then the backend, the checkpoint
// (spec, tokenizer, weights), the KV configuration and capacity plan, the model, the KV pools and
// the host tier, and last the runtime (scheduler state, stats, the engine thread). Each step is a
// member that fills what the later ones read.
#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "backend/backend_options.h"
#include "backend/kv_host_io.h"
#include "core/log.h"
#include "engine/engine.h"
#include "engine/live_request.h"
#include "engine/parallel_runtime.h"
#include "engine/schedule_state.h"
#include "engine/spec/eagle3_drafter.h"
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

double physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? double(pages) * double(page) : 0;
}

// The host tier's options on their own.
Status check_host_tier_options(const EngineConfig& c) {
  if (c.enable_hierarchical_cache && c.disable_radix_cache)
    return invalid_argument(
        "--enable-hierarchical-cache keeps the prefix cache's evicted prefixes: it does not go "
        "with --disable-radix-cache");
  if (!c.enable_hierarchical_cache) {
    if (c.hicache_size_gb != 0 || c.hicache_ratio != 0 ||
        c.hicache_io_backend != KvIoBackend::kAuto)
      return invalid_argument(
          "--hicache-size/--hicache-ratio/--hicache-io-backend need --enable-hierarchical-cache");
    return Status::ok_status();
  }
  if (c.hicache_size_gb != 0 && c.hicache_ratio != 0)
    return invalid_argument(
        "--hicache-size and --hicache-ratio both set: give one (size in GB, or a multiple of the "
        "device pool)");
  if (c.hicache_size_gb < 0 || std::isnan(c.hicache_size_gb))
    return invalid_argument("--hicache-size must be > 0 GB, got {}", c.hicache_size_gb);
  if (c.hicache_ratio < 0 || std::isnan(c.hicache_ratio))
    return invalid_argument("--hicache-ratio must be > 0, got {}", c.hicache_ratio);
  return Status::ok_status();
}

// Everything about the configuration that needs no file and no device, so a bad value fails
// before the model loads.
Status check_config(const EngineConfig& c) {
  STRATA_RETURN_IF_ERROR(check_host_tier_options(c));
  if (c.page_size < 1) return invalid_argument("--page-size must be >= 1, got {}", c.page_size);
  if (c.tp_size < 1) return invalid_argument("--tp-size must be >= 1, got {}", c.tp_size);
  if (c.dcp_size < 1 || c.tp_size % c.dcp_size != 0)
    return invalid_argument("--dcp-size {} must be >= 1 and divide --tp-size {}", c.dcp_size,
                            c.tp_size);
  if (c.dcp_size > 1 && c.tp_one_rank)
    return invalid_argument(
        "--dcp-size {} with --tp-one-rank: one rank alone holds 1/{} of the context and cannot "
        "attend over the rest",
        c.dcp_size, c.dcp_size);
  if (c.deterministic_inference && c.device == Device::kCuda && c.tp_size > 1)
    return unimplemented(
        "--enable-deterministic-inference with --tp-size {} on cuda: NCCL's all-reduce chooses its "
        "algorithm and chunking by the message size, so a row's sum would still follow the batch; "
        "the mode runs on one GPU",
        c.tp_size);
  if (c.tp_one_rank && c.tp_size < 2)
    return invalid_argument(
        "--tp-one-rank runs rank 0 of --tp-size ranks alone: give --tp-size >= 2, got {}",
        c.tp_size);
  // A non-final prefill chunk ends on a page boundary: a chunk below one page never advances.
  if (c.chunked_prefill_size > 0 && c.chunked_prefill_size < c.page_size * c.dcp_size)
    return invalid_argument(
        "--chunked-prefill-size {} is below one KV page of {} tokens (--page-size {}{})",
        c.chunked_prefill_size, c.page_size * c.dcp_size, c.page_size,
        c.dcp_size > 1 ? fmt::format(" x --dcp-size {}", c.dcp_size) : "");
  if (c.schedule_conservativeness <= 0)
    return invalid_argument("--schedule-conservativeness must be > 0");
  if (c.cuda_graph_max_bs) {
    const int bs = *c.cuda_graph_max_bs;
    if (bs < 0) return invalid_argument("--cuda-graph-max-bs must be >= 0, got {}", bs);
    if (bs > 0 && c.device != Device::kCuda)
      return invalid_argument(
          "--cuda-graph-max-bs {} needs --device cuda (there are no graphs on {})", bs,
          device_name(c.device));
    if (bs > 0 && c.tp_size > 1 && !c.tp_one_rank)  // one rank alone has no collectives to record
      return unimplemented(
          "--cuda-graph-max-bs with --tp-size {}: the collectives are not recorded into graphs "
          "yet; give --disable-cuda-graph",
          c.tp_size);
  }
  return Status::ok_status();
}

// A model drafter's KV (EAGLE3: one layer, as many pages as the target's pool; engine/spec/
// drafter.h) comes out of the memory the planner gave the target's pool: both pools at `pages`
// pages must fit the planned tokens' bytes (before a --max-total-tokens cap, which the pools keep
// when memory allows). `strata plan` does not know the drafter: its token count is the target's
// alone, a few percent above what a server with a drafter holds (1 layer in L + 1).
// `room`: the bytes the planner found for KV before any cap.
Status fit_drafter_kv(const EngineConfig& config, DType kv_dtype, const KvLayout& layout,
                      int64_t room, Plan* plan) {
  if (config.speculative.algorithm != SpeculativeAlgorithm::kEagle3) return Status::ok_status();
  STRATA_ASSIGN_OR_RETURN(const int64_t drafter_bytes,
                          eagle3_kv_bytes_per_token(config.speculative.draft_model_path, kv_dtype));
  const int64_t page_bytes = (layout.bytes_per_token() + drafter_bytes) * layout.page_size;
  const int64_t pages = std::min<int64_t>(plan->kv_tokens / config.page_size, room / page_bytes);
  if (pages < 1)
    return resource_exhausted(
        "KV cache: no room for one page of the target's and the drafter's KV");
  if (pages * config.page_size < plan->kv_tokens)
    LOG_INFO(
        "KV cache: the EAGLE3 drafter's KV ({} B/token) shares the planned pool: {} -> {} tokens",
        drafter_bytes, plan->kv_tokens, pages * config.page_size);
  plan->kv_tokens = pages * config.page_size;
  plan->kv_pool_bytes = pages * layout.page_size * layout.bytes_per_token();
  return Status::ok_status();
}

}  // namespace

// What create() reads from the model directory and passes between its steps.
struct Engine::Checkpoint {
  ModelSpec spec;
  WeightStore weights;
};

StatusOr<std::unique_ptr<Engine>> Engine::create(const EngineConfig& config,
                                                 const ParallelRuntime* parallel) {
  STRATA_RETURN_IF_ERROR(check_config(config));
  if (config.tp_size > 1 && parallel == nullptr)
    return failed_precondition(
        "--tp-size {}: this engine was made without a distributed runtime "
        "(Engine::create's `parallel`: dist/tensor_parallel.h)",
        config.tp_size);
  std::unique_ptr<Engine> e(new Engine());
  e->config_ = config;
  STRATA_RETURN_IF_ERROR(e->check_speculative_config());
  // Under decode context parallelism the engine's page (scheduler, prefix cache, batch plans) holds
  // --page-size tokens of each of the group's ranks (arch/dcp.h); the pools keep --page-size.
  e->config_.page_size = config.page_size * config.dcp_size;
  e->parallel_ = parallel;
  STRATA_RETURN_IF_ERROR(e->create_backend());
  STRATA_ASSIGN_OR_RETURN(Checkpoint ck, e->open_checkpoint());
  STRATA_RETURN_IF_ERROR(e->plan_kv_cache(ck));
  STRATA_RETURN_IF_ERROR(e->load_model(ck));
  STRATA_ASSIGN_OR_RETURN(KvLayout layout, e->create_kv_pools(ck.spec));
  STRATA_RETURN_IF_ERROR(e->create_drafter(layout));
  e->runner_ = std::make_unique<ModelRunner>(*e->model_, *e->kv_);
  const CaptureSpec capture = e->drafter_ && !e->drafter_->capture_spec().empty()
                                  ? e->drafter_->capture_spec()
                                  : config.capture;
  if (!capture.empty()) {
    // A step holds at most one prefill budget or 1 + drafts rows per running request.
    const int64_t per_request = e->drafter_ ? e->config_.speculative.num_draft_tokens : 1;
    const int64_t step_tokens =
        std::max<int64_t>({config.chunked_prefill_size, config.max_prefill_tokens,
                           e->plan_.max_running_requests * per_request});
    STRATA_RETURN_IF_ERROR(e->runner_->set_capture(capture, step_tokens));
  }
  // Requests' captures are stored on the capture writer's thread (the drafter's alone are not).
  if (!config.capture.empty()) e->capture_writer_ = std::make_unique<CaptureWriter>();
  STRATA_RETURN_IF_ERROR(e->create_scheduler_and_host_tier(ck.spec, layout));
  e->start_runtime();
  return e;
}

// Speculative decoding's flags, checked before anything is loaded. On CUDA, greedy exactness
// against plain decoding needs a batch-invariant forward (a k+1-token verify chunk and k+1
// one-token decodes round differently in bf16): --enable-deterministic-inference.
Status Engine::check_speculative_config() {
  STRATA_RETURN_IF_ERROR(resolve_speculative_config(&config_.speculative));
  if (!config_.speculative.enabled()) return Status::ok_status();
  if (config_.tp_size > 1 || config_.dcp_size > 1)
    return unimplemented(
        "--speculative-algorithm with --tp-size/--dcp-size > 1: the tensor-parallel ranks' batch "
        "plans carry no drafts yet");
  // A missing drafter is reported before the target loads.
  if (config_.speculative.algorithm == SpeculativeAlgorithm::kEagle3)
    STRATA_RETURN_IF_ERROR(check_eagle3_dir(config_.speculative.draft_model_path));
  return Status::ok_status();
}

// The drafter (engine/spec/), when an algorithm is set: after the target and its KV pool, which
// a model drafter shares (its KV has the pool's pages; engine/spec/drafter.h).
Status Engine::create_drafter(const KvLayout& layout) {
  if (!config_.speculative.enabled()) return Status::ok_status();
  STRATA_ASSIGN_OR_RETURN(
      drafter_,
      strata::create_drafter(config_.speculative,
                             DrafterTarget{.model = model_.get(),
                                           .model_dir = config_.model_path,
                                           .num_pages = layout.num_pages,
                                           .page_size = layout.page_size,
                                           .cuda_graph_max_bs = *config_.cuda_graph_max_bs}));
  if (config_.wrap_drafter) drafter_ = config_.wrap_drafter(std::move(drafter_));
  if (!drafter_->capture_spec().empty() && !config_.capture.empty())
    return unimplemented(
        "speculative decoding with a drafter that reads hidden states and hidden-state capture "
        "for requests together: one capture spec per engine");
  LOG_INFO(
      "speculative decoding: {} drafter, {} draft steps, topk {}, up to {} draft tokens per step",
      drafter_->name(), config_.speculative.num_steps, config_.speculative.eagle_topk,
      config_.speculative.num_draft_tokens - 1);
  return Status::ok_status();
}

// The device's backend, and the CUDA graph batch limit it implies when none was given.
Status Engine::create_backend() {
  switch (config_.device) {
    case Device::kCpu:
      backend_ = make_cpu_backend();
      break;
    case Device::kCuda:
#ifdef STRATA_CUDA
      backend_ =
          make_cuda_backend(BackendOptions{.deterministic = config_.deterministic_inference});
      break;
#else
      return failed_precondition(
          "--device cuda: this build has no CUDA backend (configure with -DSTRATA_CUDA=ON)");
#endif
  }
  if (config_.deterministic_inference)
    LOG_INFO(
        "--enable-deterministic-inference: {}",
        config_.device == Device::kCuda
            ? "batch-invariant kernels (a request's tokens do not depend on its batches; slower)"
            : "the CPU reference is batch-invariant already; nothing changes");
  if (!config_.cuda_graph_max_bs)
    config_.cuda_graph_max_bs =
        config_.device == Device::kCuda && (config_.tp_size == 1 || config_.tp_one_rank)
            ? kDefaultCudaGraphMaxBs
            : 0;
  if (config_.tp_one_rank)
    LOG_WARN(
        "--tp-one-rank: rank 0 of {} tensor-parallel ranks runs alone, every collective skipped "
        "and counted: "
        "a benchmark of one rank's work; the outputs are NOT the model's",
        config_.tp_size);
  if (*config_.cuda_graph_max_bs > 0)
    LOG_INFO(
        "CUDA graphs: decode steps of at most {} requests replay captured graphs "
        "(--cuda-graph-max-bs; "
        "--disable-cuda-graph launches every step eagerly)",
        *config_.cuda_graph_max_bs);
  return Status::ok_status();
}

// config.json, the tokenizer (--tokenizer-path's when given) and the weights' index.
StatusOr<Engine::Checkpoint> Engine::open_checkpoint() {
  const EngineConfig& c = config_;
  STRATA_ASSIGN_OR_RETURN(ModelSpec spec, load_model_spec(c.model_path));
  STRATA_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::load(c.tokenizer_dir()));
  if (!c.tokenizer_path.empty() &&
      tok.vocab_size() > spec.vocab_size)  // --tokenizer-path of another model?
    return invalid_argument(
        "the tokenizer in {} has {} tokens but the model's vocab_size is {}: a tokenizer of "
        "another model?",
        c.tokenizer_dir(), tok.vocab_size(), spec.vocab_size);
  tokenizer_ = std::make_unique<Tokenizer>(std::move(tok));
  STRATA_ASSIGN_OR_RETURN(WeightStore weights, WeightStore::open(c.model_path, spec.quant));
  return Checkpoint{.spec = std::move(spec), .weights = std::move(weights)};
}

// The KV dtypes (auto: the backend's exact activation dtype; per-layer bf16, scales and MLA row
// formats: engine/kv_config.h) and the capacity plan: the pool's tokens, the running requests,
// the context.
Status Engine::plan_kv_cache(const Checkpoint& ck) {
  const EngineConfig& c = config_;
  STRATA_ASSIGN_OR_RETURN(kv_config_,
                          resolve_kv_cache_config(kv_cache_options(c), ck.spec, &ck.weights,
                                                  backend_->activation_dtype()));
  Deployment dep;
  double mem_gib = c.device_memory_gib;
  if (mem_gib <= 0) {  // the device's total memory (the backend knows it), or 4 GiB on the CPU
    const double device_gib = double(backend_->device_memory_bytes()) / double(int64_t(1) << 30);
    mem_gib = c.device == Device::kCuda ? device_gib : 4.0;
  }
  dep.gpu_memory_bytes = int64_t(mem_gib * double(int64_t(1) << 30));
  // An uneven split (tests only) is planned as tp 1: no rank holds more than that.
  dep.tp_size = c.tp_allow_uneven ? 1 : c.tp_size;
  dep.dcp_size = c.tp_allow_uneven ? 1 : c.dcp_size;
  dep.mem_fraction_static = c.mem_fraction_static;
  dep.kv_cache_dtype = kv_config_.dtype;
  dep.kv_bf16_layers = kv_config_.bf16_layers;
  dep.page_size = pool_page_size();
  dep.context_length = c.context_length;
  dep.max_running_requests = c.max_running_requests;
  dep.max_total_tokens = c.max_total_tokens;
  // The uneven split is planned as one rank's pool (above): its cap is one rank's share.
  if (c.tp_allow_uneven && c.max_total_tokens)
    dep.max_total_tokens = *c.max_total_tokens / c.dcp_size;
  dep.chunked_prefill_size = c.chunked_prefill_size;
  dep.cuda_graph_max_bs = *c.cuda_graph_max_bs;
  dep.weight_policy = backend_->weight_policy();
  if (c.device == Device::kCpu) {
    // No CUDA context, graphs or communicators; the GPU-size rule for the default fraction does
    // not apply. The planner's CPU mode is what `strata plan --device cpu` uses too.
    dep.device = PlanDevice::kCpu;
    if (!dep.mem_fraction_static) dep.mem_fraction_static = 0.9;
  }
  if (c.dcp_size > 1 && !ck.spec.is_mla())
    return invalid_argument(
        "--dcp-size {}: decode context parallelism shards an MLA latent cache; {} has none "
        "(its KV heads are already split by --tp-size)",
        c.dcp_size, ck.spec.model_type);
  STRATA_ASSIGN_OR_RETURN(plan_, plan_kv_capacity(ck.spec, dep));
  // An uneven split was planned as one rank's pool (above): the group holds dcp_size x its tokens.
  if (c.tp_allow_uneven && c.dcp_size > 1) {
    plan_.kv_tokens_per_rank = plan_.kv_tokens;
    plan_.kv_tokens *= c.dcp_size;
    plan_.dcp_size = c.dcp_size;
  }
  if (plan_.kv_tokens < c.page_size)
    return resource_exhausted(
        "KV cache has room for {} tokens: the weights ({:.2f} GiB) leave nothing of {:.2f} GiB x "
        "mem-fraction-static {:.2f}; raise the memory budget or the fraction",
        plan_.kv_tokens, double(plan_.weight_bytes_per_rank) / double(1 << 30), mem_gib,
        plan_.mem_fraction_static);
  context_length_ = plan_.context_length;
  return Status::ok_status();
}

// The model on the backend: this process's ranks under tensor parallelism (the distributed
// runtime, dist/tensor_parallel.h), else the whole model.
Status Engine::load_model(const Checkpoint& ck) {
  const EngineConfig& c = config_;
  if (c.tp_size == 1) {
    STRATA_ASSIGN_OR_RETURN(model_, create_model(ck.spec, ck.weights, *backend_));
    return Status::ok_status();
  }
  STRATA_ASSIGN_OR_RETURN(ParallelModel group, parallel_->create_model(c, ck.spec, ck.weights));
  model_ = std::move(group.model);
  backend_ = std::move(group.backend);
  tp_launched_ = group.ranks_are_processes;
  return Status::ok_status();
}

// The device KV pool at the planned size (rows as the model and the KV configuration lay them
// out), its page pool and radix cache.
StatusOr<KvLayout> Engine::create_kv_pools(const ModelSpec& spec) {
  // The bytes the planner found for KV (before a --max-total-tokens cap): what the pools fit in.
  const int64_t kv_room = plan_.profiled_kv_tokens * plan_.kv_bytes_per_token;
  const int page_size = config_.page_size;  // the engine's page: pool_page_size() x dcp_size tokens
  KvLayout layout = apply_kv_layout(kv_config_, spec, model_->kv_layout());
  layout.page_size = pool_page_size();
  if (layout.bytes_per_token() > plan_.kv_bytes_per_token) {
    // MLA rows with a bf16 rope part or FlashMLA tile scales: the planner counts dtype bytes
    // only, so fit the pool's planned bytes with the real row size.
    const int64_t pages = plan_.kv_pool_bytes / (layout.bytes_per_token() * layout.page_size);
    if (pages < 1)
      return resource_exhausted("KV cache: no room for one page of {}", kv_config_.describe());
    plan_.kv_tokens = pages * page_size;
    plan_.kv_bytes_per_token = layout.bytes_per_token();
    plan_.kv_pool_bytes = pages * layout.page_size * plan_.kv_bytes_per_token;
  }
  STRATA_RETURN_IF_ERROR(
      fit_drafter_kv(config_, backend_->activation_dtype(), layout, kv_room, &plan_));
  layout.num_pages = plan_.kv_tokens / page_size;
  STRATA_RETURN_IF_ERROR(backend_->check_kv_layout(layout));
  kv_ = backend_->alloc_kv(layout);
  apply_kv_scales(kv_config_, *kv_);
  pool_ = std::make_unique<PagePool>(int32_t(layout.num_pages), page_size);
  cache_ = std::make_unique<RadixCache>(pool_.get());
  return layout;
}

// The scheduler's configuration (SGLang's conservativeness scales the decode reservation), the
// host KV tier when enabled, and the schedule state over the pools.
Status Engine::create_scheduler_and_host_tier(const ModelSpec& spec, const KvLayout& layout) {
  const EngineConfig& c = config_;
  SchedulerConfig sc;
  sc.page_size = c.page_size;
  sc.chunked_prefill_size = c.chunked_prefill_size;
  sc.max_prefill_tokens = c.max_prefill_tokens;
  sc.max_running_requests = plan_.max_running_requests;
  sc.num_continuous_decode_steps = std::max(1, c.num_continuous_decode_steps);
  sc.disable_radix_cache = c.disable_radix_cache;
  // The verify's rows: the last token and the drafts (a chain's num_steps, a tree's nodes).
  if (drafter_) {
    sc.decode_tokens_per_step = c.speculative.num_draft_tokens;
    sc.speculative_batch_size_threshold = c.speculative.batch_size_threshold;
  }
  sc.init_new_token_ratio = std::min(1.0, sc.init_new_token_ratio * c.schedule_conservativeness);
  sc.min_new_token_ratio =
      std::min(sc.init_new_token_ratio, sc.min_new_token_ratio * c.schedule_conservativeness);
  scheduler_ = std::make_unique<Scheduler>(sc);
  STRATA_RETURN_IF_ERROR(setup_host_tier(layout));
  state_ = std::make_unique<ScheduleState>(sc, pool_.get(), cache_.get(), spec.eos_token_ids,
                                           hicache_.get());
  return Status::ok_status();
}

Status Engine::setup_host_tier(const KvLayout& layout) {
  const EngineConfig& c = config_;
  if (!c.enable_hierarchical_cache) return Status::ok_status();
  const HiCacheWritePolicy policy = c.hicache_write_policy;
  KvIoBackend io = c.hicache_io_backend;
  if (backend_->device() == Device::kCpu &&
      (io == KvIoBackend::kDirect || io == KvIoBackend::kKernel)) {
    LOG_WARN("--hicache-io-backend {} does not apply on the cpu backend: host copies are memcpy",
             kv_io_backend_name(io));
    io = KvIoBackend::kMemcpy;
  }
  const int64_t page_bytes = layout.bytes_per_token() * layout.page_size;
  const double ratio = c.hicache_ratio > 0 ? c.hicache_ratio : 2.0;
  const int64_t pages = c.hicache_size_gb > 0
                            ? int64_t(c.hicache_size_gb * 1e9 / double(page_bytes))
                            : int64_t(double(layout.num_pages) * ratio);
  if (pages < 1)
    return invalid_argument(
        "host KV tier of {} holds no {}-byte page: raise --hicache-size/--hicache-ratio",
        c.hicache_size_gb > 0 ? fmt::format("{} GB", c.hicache_size_gb)
                              : fmt::format("ratio {}", ratio),
        page_bytes);
  if (pages > int64_t(INT32_MAX))
    return invalid_argument("host KV tier: {} pages is too many", pages);
  const double bytes = double(pages) * double(page_bytes);
  // Ranks that are threads of this process each hold their own tier (dist/tp_host_tier.h).
  const int local_ranks = tp_launched_ ? 1 : c.tp_size;
  const double ram = physical_memory_bytes();
  if (ram > 0 && bytes * local_ranks > 0.9 * ram)
    return resource_exhausted(
        "host KV tier of {:.2f} GB{} exceeds 90% of this machine's {:.2f} GB of memory",
        bytes / 1e9, local_ranks > 1 ? fmt::format(" x {} ranks", local_ranks) : "", ram / 1e9);
  STRATA_ASSIGN_OR_RETURN(host_io_, make_kv_host_io(*backend_, *kv_, pages, io));
  if (c.tp_size > 1) {
    // Rank 0 decides every copy; each other rank repeats it on its own pool and host memory.
    STRATA_ASSIGN_OR_RETURN(
        std::unique_ptr<GroupHostTier> tier,
        parallel_->attach_host_tier(*model_, *kv_, pages, host_io_->backend(),
                                    std::make_unique<KvHostIoCopier>(host_io_.get())));
    group_host_tier_ = tier.get();
    hicache_io_ = std::move(tier);
  } else {
    hicache_io_ = std::make_unique<KvHostIoCopier>(host_io_.get());
  }
  host_pool_ = std::make_unique<HostPool>(int32_t(pages), c.page_size);  // the engine's pages
  hicache_ = std::make_unique<HiCache>(pool_.get(), cache_.get(), host_pool_.get(),
                                       hicache_io_.get(), policy);
  stats_.hicache_capacity_tokens = host_pool_->capacity_tokens();
  stats_.hicache_ranks =
      rank_host_stats(/*force=*/true);  // every rank's host memory, from the start
  LOG_INFO(
      "Host KV tier: {} tokens ({:.2f} GB{}, {:.2f}x the device pool) · write policy {} · io {}",
      host_pool_->capacity_tokens(), bytes / 1e9, c.tp_size > 1 ? " per rank" : "",
      double(pages) / double(layout.num_pages), hicache_write_policy_name(policy),
      kv_io_backend_name(host_io_->backend()));
  return Status::ok_status();
}

// The log line of the pool, the first stats, the engine thread.
void Engine::start_runtime() {
  const std::string dcp =
      config_.dcp_size > 1
          ? fmt::format(" · decode context parallelism {}: {} tokens a rank x {}", config_.dcp_size,
                        plan_.kv_tokens / config_.dcp_size, config_.dcp_size)
          : "";
  LOG_INFO(
      "KV cache: {} tokens ({}, {:.2f} GiB{}, {} B/token) · page size {} · "
      "max running requests {} · context {} · device {}{}",
      plan_.kv_tokens, kv_config_.describe(), double(plan_.kv_pool_bytes) / double(1 << 30),
      config_.tp_size > 1 ? " per rank" : "", plan_.kv_bytes_per_token, config_.page_size,
      plan_.max_running_requests, plan_.context_length, backend_->name(), dcp);
  stats_.kv_tokens_total = plan_.kv_tokens;
  if (drafter_)
    stats_.spec_accept_length_counts.assign(size_t(config_.speculative.num_steps) + 2, 0);
  stats_.cpu_fallback_ops = backend_->cpu_fallback_counts();
  thread_ = std::thread([this] { loop(); });
}

}  // namespace strata
