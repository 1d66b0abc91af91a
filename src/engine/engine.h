// Engine: owns the model, the KV pool, the radix cache and the scheduler, and runs them on one
// engine thread (design.md §1). Other threads submit requests and receive their tokens through
// callbacks; the loop is: decide, apply, run, postprocess.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "arch/model.h"
#include "backend/kv_host_io.h"
#include "core/status.h"
#include "engine/capture_writer.h"
#include "engine/captured_states.h"
#include "engine/host_tier_io.h"
#include "engine/kv_config.h"
#include "engine/kv_rows.h"
#include "engine/kv_rows_io.h"
#include "engine/model_runner.h"
#include "engine/request.h"
#include "engine/request_error.h"
#include "engine/request_validation.h"
#include "engine/sampler.h"
#include "engine/sampling_params.h"
#include "engine/scheduler.h"
#include "engine/spec/drafter.h"
#include "engine/spec/spec_config.h"
#include "kv/hicache.h"
#include "planner/planner.h"
#include "tokenizer/tokenizer.h"

namespace strata {

class PagePool;
class RadixCache;
class ScheduleState;
class GroupHostTier;
class ParallelRuntime;
struct ScheduledSeq;

// The default of --cuda-graph-max-bs on one GPU. H200, 8B shape, 512 in / 256 out (2026-11-30):
// graphs replay after one capture per batch size, and steps at batch 64 took 17.0 ms with them
// vs 17.8 eager; the host then records a step (~0.1-0.15 ms) instead of launching ~300 kernels.
inline constexpr int kDefaultCudaGraphMaxBs = 64;

// The CLI's --chunked-prefill-size and --max-prefill-tokens on cpu when not given: a prefill step
// there should take well under a second, so an abort (a client gone) or a health check waits for
// at most one short step. house-llama, a 3,750-token prompt on 2 cores: ~0.2 s per 128-token
// chunk on an idle machine (bench/RESULTS.md); 8,192-token chunks took 15-18 s each.
inline constexpr int kCpuDefaultChunkedPrefillSize = 128;

// The engine's configuration, typed: the CLI (tools/engine_flags.cc) turns its strings into these
// enums through their name tables (core/enum_names.h) and reports a bad name there.
struct EngineConfig {
  std::string model_path;
  // SGLang's --tokenizer-path (tokenizer.json, tokenizer_config.json, chat template; "": the
  // model's) and --chat-template (a file or a built-in name; "": the tokenizer's own template).
  std::string tokenizer_path;
  std::string chat_template;
  const std::string& tokenizer_dir() const {
    return tokenizer_path.empty() ? model_path : tokenizer_path;
  }
  Device device = Device::kCpu;
  // --tp-size: tensor-parallel ranks (the distributed runtime, dist/tp_driver.h): cpu runs them
  // as threads of this process, cuda one per visible GPU. tp_allow_uneven: tests only
  // (model/sharding.h).
  int tp_size = 1;
  bool tp_allow_uneven = false;
  // --tp-one-rank: only rank 0 of the --tp-size ranks, on this process's device, with every
  // collective skipped and counted (backend/solo_comm.h). A benchmark mode — what each GPU of a
  // tp group computes, measured on one GPU; the outputs are not the model's.
  bool tp_one_rank = false;
  // --enable-deterministic-inference (SGLang's flag): batch-invariant kernels (BackendOptions::
  // deterministic), so a request's tokens do not depend on what else the server runs, at a cost
  // in throughput. cuda with one rank (NCCL's reductions follow the message size); the CPU
  // reference is batch-invariant without it.
  bool deterministic_inference = false;
  // --dcp-size: decode context parallelism (arch/dcp.h; MLA models, divides tp_size): each group of
  // dcp_size ranks holds 1/dcp_size of every sequence's latent KV, so the pool holds dcp_size x
  // the tokens. The engine's page then holds page_size x dcp_size tokens (each rank's pool page
  // page_size of them): Engine::config().page_size reports the engine's page.
  int dcp_size = 1;
  KvCacheDtype kv_cache_dtype = KvCacheDtype::kAuto;  // auto: f32 on cpu, bf16 on cuda (exact)
  std::vector<int> kv_bf16_layers;         // layers kept in bf16 when kv_cache_dtype is fp8
  std::string kv_scales_path;              // per-layer K/V scales (strata eval-kv --calibrate)
  std::optional<DType> kv_mla_rope_dtype;  // MLA rope part; unset: as kv_cache_dtype
  int page_size = 16;
  std::optional<double> mem_fraction_static;  // nullopt: the planner's default
  // Memory the KV pool is planned against: the GPU's on cuda; on cpu a budget standing in for it.
  double device_memory_gib = 0;             // 0: cpu 4 GiB; cuda: the device's total memory
  std::optional<int64_t> max_total_tokens;  // caps the KV pool, as in SGLang
  std::optional<int> max_running_requests;
  int chunked_prefill_size = 8192;
  int max_prefill_tokens = 16384;
  int num_continuous_decode_steps = 1;
  bool disable_radix_cache = false;  // SGLang's --disable-radix-cache: no prefix sharing
  // SGLang's --cuda-graph-max-bs: decode steps of at most this many requests run as captured
  // CUDA graphs (one graph per step shape, replayed); 0: every step launches eagerly. Unset:
  // kDefaultCudaGraphMaxBs on cuda at tp 1, off otherwise (the tensor-parallel collectives are
  // not recorded into graphs; a value given for tp > 1 or the CPU is an error).
  std::optional<int> cuda_graph_max_bs;
  // SGLang's --schedule-conservativeness: scales the decode reservation (new-token ratio) that
  // admission holds back for running requests. Below 1 admits more and retracts when wrong.
  double schedule_conservativeness = 1.0;
  int64_t context_length = 0;  // 0: the model's max_position_embeddings
  uint64_t seed = 0;           // for requests that give none
  // Host KV tier (kv/hicache.h), SGLang's flags. Its size: hicache_size_gb (1e9 bytes) per rank,
  // or hicache_ratio x the device pool; 2x the device pool when neither is set. Not both.
  bool enable_hierarchical_cache = false;
  double hicache_size_gb = 0;  // 0: unset
  double hicache_ratio = 0;    // 0: unset
  HiCacheWritePolicy hicache_write_policy = HiCacheWritePolicy::kWriteThrough;
  KvIoBackend hicache_io_backend = KvIoBackend::kAuto;  // auto: kernel on cuda, memcpy on cpu
  // Hidden states the model runner can capture (engine/model_runner.h) for requests that ask
  // (GenerateRequest::capture). Empty: none (the capture buffer is not even allocated).
  CaptureSpec capture{};
  // Speculative decoding (SGLang's --speculative-* flags; engine/spec/): off unless an algorithm
  // is set. Greedy output stays token for token that of decoding without it on a batch-invariant
  // backend (the CPU reference; on CUDA bf16 a verify chunk and one-token decodes differ in
  // rounding, so exactness there needs the deterministic mode: see Engine::create).
  SpeculativeConfig speculative{};
  // Tests only: receives the drafter the engine made and returns the one it uses (a recording
  // proxy around it sees every observe() and propose()). Unset: the drafter as made.
  std::function<std::unique_ptr<Drafter>(std::unique_ptr<Drafter>)> wrap_drafter{};
};

// The KV options of a config, for resolve_kv_cache_config (engine/kv_config.h).
KvCacheOptions kv_cache_options(const EngineConfig& config);

// What a request's callback receives, on the engine thread (keep the callback short).
struct StreamEvent {
  std::vector<int32_t> token_ids;       // tokens sampled since the last event
  std::string text;                     // complete UTF-8 text since the last event
  std::vector<TokenLogprobs> logprobs;  // one per token when requested
  // GenerateRequest::prompt_logprobs_from: on the event of the first output token, the logprobs
  // of prompt tokens prompt_logprobs_from.. (each given the tokens before it; token 0 has none,
  // so the first is at least 1), with top_logprobs alternatives each.
  std::vector<TokenLogprobs> prompt_logprobs;
  int32_t prompt_logprobs_from = 0;
  bool started = false;  // the request was admitted: its prefill begins (no tokens yet)
  // The event carries GenerateRequest::resume_output_ids (their text), not newly sampled tokens.
  bool resumed = false;
  uint64_t rng_draws = 0;  // the sampler's draws after these tokens (SamplerRng)
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  std::string error;  // set when the engine aborted the request
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;
  int32_t cached_tokens = 0;  // prompt tokens served from the prefix cache
  // Speculative decoding, on the finished event (SGLang's meta_info names): verify steps with
  // drafts, drafts proposed, drafts accepted. Zero without speculation.
  int32_t spec_verify_ct = 0;
  int32_t spec_draft_token_num = 0;
  int32_t spec_accept_token_num = 0;
  // GenerateRequest::export_kv: KV rows of whole pages the request completed since its last
  // export (an event of its own: no tokens, not finished). Their tokens were emitted before.
  std::shared_ptr<const KvRows> kv{};
};
using StreamCallback = std::function<void(const StreamEvent&)>;

struct GenerateRequest {
  std::vector<int32_t> prompt_ids;
  SamplingParams params;
  int top_logprobs = -1;  // -1: no logprobs; n >= 0: the chosen token's and the top n
  // >= 0: the logprobs of the prompt's tokens from this one on (SGLang's logprob_start_len;
  // OpenAI's echo with logprobs: 0), on the first output token's event (StreamEvent::
  // prompt_logprobs), each with top_logprobs alternatives (top_logprobs must be >= 0). The prompt
  // is then computed whole (no prefix cache) in chunks of at most score_rows_per_step tokens
  // (each prompt token takes a full logits row). -1: none.
  int32_t prompt_logprobs_from = -1;
  StreamCallback on_event;
  // Resuming a generation that was cut short (a checkpoint of a killed batch job): the tokens it
  // had produced and its sampler's draws then (StreamEvent::rng_draws). The engine prefills prompt
  // + these, emits them as the first event (resumed, with their text) and decodes on; they count
  // toward max_new_tokens. With the request's seed, the continuation equals an uninterrupted run
  // on a batch-invariant backend (the cpu reference is; see backend/cpu/linear.cc).
  std::vector<int32_t> resume_output_ids{};
  uint64_t resume_rng_draws = 0;
  // The KV of prompt + resume_output_ids' first resume_kv->rows tokens, as a checkpoint stored
  // them (rows from 0, whole pages, checked against kv_rows_layout() by the caller; at most
  // prompt + resumed - 1 rows). The engine loads them into the pool as a cached prefix before the
  // request is queued, so its admission hits them and only the rest is computed: with rows =
  // prompt + resumed - 1 the request continues by computing one token, its last resumed one, as
  // its next decode step would have. Rows the pool cannot hold now are computed as usual.
  std::shared_ptr<const KvRows> resume_kv{};
  // Stream the request's KV rows as its pages fill (StreamEvent::kv), from row kv_export_from_row
  // (a multiple of the page size: what an earlier checkpoint already holds). One device -> host
  // copy per step for every exporting request together. Ignored under tensor parallelism
  // (kv_rows_layout() says why).
  bool export_kv = false;
  int32_t kv_export_from_row = 0;
  // An internal request (the server's health probe): not counted in the request and token totals
  // of EngineStats, so monitoring does not see it as user traffic.
  bool internal = false;
  // Hidden-state capture (EngineConfig::capture must be set): the engine writes the captured rows
  // of every position it computes for this request, by position, into `capture`; read it after the
  // finished event. The last sampled token is never computed (nothing follows it).
  std::shared_ptr<CapturedStates> capture{};
  // False: admission ignores the prefix cache, so every position is computed (and captured).
  bool use_prefix_cache = true;
  // Queued ahead of the waiting requests (Request::urgent).
  bool urgent = false;
  // The event text leaves special tokens out (Hugging Face's and SGLang's default), except those in
  // keep_special_ids (a reasoning parser's tags, tokenizer/reasoning_parser.h); false keeps all.
  bool skip_special_tokens = true;
  std::vector<int32_t> keep_special_ids{};
};

// A consistent snapshot of the engine's counters (thread-safe to read).
struct EngineStats {
  int64_t num_running = 0;
  int64_t num_waiting = 0;
  int64_t kv_tokens_total = 0;
  int64_t kv_tokens_used = 0;    // held by running requests or the prefix cache
  int64_t kv_tokens_cached = 0;  // held by the prefix cache only (evictable)
  int64_t prompt_tokens_total = 0;
  int64_t generation_tokens_total = 0;
  int64_t cache_hit_tokens_total = 0;
  int64_t cache_lookup_tokens_total = 0;
  int64_t requests_finished_total = 0;
  int64_t requests_aborted_total = 0;
  int64_t retractions_total = 0;
  int64_t steps_total = 0;
  double new_token_ratio = 0;
  int64_t prefill_tokens_total = 0;  // prompt tokens computed by prefill (not served from a cache)
  // Tokens computed (prefill and decode) for requests that were then aborted: work thrown away.
  // With chunked prefill an abort lands at the next step, so this grows by at most one chunk
  // per aborted request beyond what it had computed when the abort arrived.
  int64_t aborted_computed_tokens_total = 0;
  // Step times (forward passes included), for a health check that knows what "slow" is here.
  double last_step_seconds = 0;
  double longest_recent_step_seconds = 0;  // the longest of the last 256 steps
  int64_t hicache_capacity_tokens = 0;     // host KV tier (0 when off)
  HiCacheStats hicache;                    // host-tier counters (zero when off)
  // Each rank's host-tier copies (empty when off). Under tensor parallelism the workers' counts
  // are gathered when the engine goes idle and at most once a second while it is busy.
  std::vector<HostTierRankStats> hicache_ranks;
  // The backend's ops that run on the CPU reference through host copies (Backend::
  // cpu_fallback_counts: every declared op with its calls, zeros included; empty when the
  // backend has no such table). Under tensor parallelism, rank 0's: every rank runs the same ops.
  std::vector<std::pair<std::string, int64_t>> cpu_fallback_ops;
  // KV rows of checkpoints (GenerateRequest::export_kv / resume_kv): downloaded and loaded bytes,
  // the copies' wall time, the tokens loaded as cached prefixes and loads refused (no room, bad
  // size).
  int64_t kv_export_bytes_total = 0;
  double kv_export_seconds = 0;
  int64_t kv_import_bytes_total = 0;
  double kv_import_seconds = 0;
  int64_t kv_import_tokens_total = 0;
  int64_t kv_import_refused_total = 0;
  // Speculative decoding: verifies (one request's step with drafts), drafts proposed and
  // accepted, and the histogram of accept lengths (accepted drafts + the target's own token, so
  // 1..num_steps + 1; index 0 unused). Mean accept length = (accepted + verifies) / verifies.
  int64_t spec_verify_total = 0;
  int64_t spec_draft_tokens_total = 0;
  int64_t spec_accepted_tokens_total = 0;
  std::vector<int64_t> spec_accept_length_counts;  // empty without speculation
  // Steps with decodes run without drafts because their decodes exceeded
  // --speculative-batch-size-threshold, and the pad rows verify steps computed so that every
  // verify had num_draft_tokens rows (engine/spec/verify_shape.h).
  int64_t spec_paused_steps_total = 0;
  int64_t spec_pad_rows_total = 0;
};

struct ScheduledStep;  // engine/schedule_state.h

class Engine {
 public:
  // Loads tokenizer, model and weights, sizes the KV pool through the planner (logged in tokens
  // and bytes) and starts the engine thread. config.tp_size > 1 needs `parallel`, the distributed
  // runtime (dist/tensor_parallel.h), which must outlive the engine.
  static StatusOr<std::unique_ptr<Engine>> create(const EngineConfig& config,
                                                  const ParallelRuntime* parallel = nullptr);
  ~Engine();  // aborts what is still live (callbacks get abort) and joins the thread

  // Thread-safe. Validates the request (check()) and returns its id, or the typed reason it was
  // refused; the callback then receives every event.
  SubmitResult submit(GenerateRequest request);
  // Thread-safe, no side effects: the request contract (engine/request_validation.h) against
  // this engine's limits, as submit() applies it. Front ends that submit several requests for one
  // of theirs (the server's prompts x n) check them all first.
  std::optional<RequestError> check(const GenerateRequest& request) const;
  // What a request must fit: the vocabulary, the context, the KV pool.
  RequestLimits request_limits() const;
  // Thread-safe; a finished or unknown id is ignored. The callback gets a final abort event.
  void abort(int64_t id);
  // Blocks until no request is live. For tests and batch jobs.
  void wait_idle();
  // Drops the prefix cache (false while requests run). Thread-safe.
  bool flush_cache();

  EngineStats stats() const;
  const ModelSpec& spec() const { return model_->spec(); }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const Plan& plan() const { return plan_; }
  const KvCacheConfig& kv_config() const { return kv_config_; }
  // The layout KV rows of this engine have (kv_rows.h), or nullopt with the reason in *why_not
  // when this engine does not export or load them: under tensor parallelism each rank holds a
  // shard of every row and only rank 0's pool is here, so checkpoints would hold a fraction of
  // the KV; --tp-one-rank's KV is not the model's.
  std::optional<KvRowsLayout> kv_rows_layout(std::string* why_not = nullptr) const;
  // The engine thread's backend. Only for benchmarks that prepare device state (random weights)
  // before the first request: the backend is not thread-safe.
  Backend& backend() const { return *backend_; }
  const EngineConfig& config() const { return config_; }
  // Tokens of a page of each rank's KV pool: config().page_size / dcp_size.
  int pool_page_size() const { return config_.page_size / config_.dcp_size; }
  int64_t context_length() const { return context_length_; }
  int64_t kv_capacity_tokens() const;

 private:
  struct Live;  // a request and its streaming state
  Engine() = default;
  void loop();
  void drain_inbox();
  void run_step();
  // run_step's parts: speculative drafts for a step's decodes; one forward and its
  // post-processing (verification, streaming, finishing); the drafter's news after it.
  void propose_drafts(ScheduledStep* step);
  void run_one_step(const ScheduledStep& step, std::chrono::steady_clock::time_point step_begin);
  // paths[s]: the accepted path of sampled seq s's draft tree (tree_verify.h; [0] without drafts).
  // drafts_next: Drafter::observe's.
  void observe_committed(const ScheduledStep& step, const BatchPlan& plan, const uint8_t* captured,
                         std::span<const int32_t> kv_before,
                         std::span<const std::vector<int32_t>> paths, bool drafts_next);
  // `later`: tokens of the request's output after these, already appended by a verify step and
  // emitted by the next calls (the event's completion_tokens leaves them out).
  void emit(Live& live, std::vector<int32_t> tokens, std::vector<TokenLogprobs> logprobs,
            bool resumed = false, int32_t later = 0);
  void finalize(Live& live);
  // KV rows of checkpoints (engine_kv_rows.cc).
  bool ensure_kv_copier();
  void import_kv(Live& live);
  void export_kv(std::span<const ScheduledSeq> seqs);
  // Hands the step's captured rows of capturing requests, rows kept_rows[s] of seq s's block, to
  // capture_writer_ (engine_loop.cc). After observe_committed: the block changes hands.
  void store_captured(const ScheduledStep& step, const BatchPlan& plan,
                      std::span<const std::vector<int32_t>> kept_rows);
  // Ends request `id` (if live): takes it out of live_ and sends its finished event now or, while
  // the capture writer still holds rows of its states, once they are stored (retire_written).
  void retire(int64_t id);
  // Finalizes the retiring requests whose rows are stored; `wait`: all of them, waiting.
  void retire_written(bool wait);
  void update_stats();
  // create()'s steps, in order (engine_create.cc).
  struct Checkpoint;
  Status check_speculative_config();
  Status create_drafter(const KvLayout& layout);
  Status create_backend();
  StatusOr<Checkpoint> open_checkpoint();
  Status plan_kv_cache(const Checkpoint& ck);
  Status load_model(const Checkpoint& ck);
  StatusOr<KvLayout> create_kv_pools(const ModelSpec& spec);
  Status create_scheduler_and_host_tier(const ModelSpec& spec, const KvLayout& layout);
  void start_runtime();
  // Builds the host KV tier when the config enables it (sizes it, logs its size).
  Status setup_host_tier(const KvLayout& layout);
  // Each rank's host-tier counters, for stats_. Under tensor parallelism a collective, so only
  // when copies happened since the last one and the engine is idle or a second has passed (or
  // `force`); empty when not due (the last ones stand). Engine thread only.
  std::vector<HostTierRankStats> rank_host_stats(bool force);

  EngineConfig config_;
  Plan plan_;
  KvCacheConfig kv_config_;
  int64_t context_length_ = 0;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<KvStorage> kv_;
  std::unique_ptr<ModelRunner> runner_;  // between the loop and model_ (engine thread)
  std::unique_ptr<Drafter> drafter_;     // speculative decoding's proposer (null: off)
  std::unique_ptr<PagePool> pool_;
  std::unique_ptr<RadixCache> cache_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<ScheduleState> state_;
  // Host KV tier (null when off); declared after cache_ so it is destroyed first.
  std::unique_ptr<KvHostIo> host_io_;
  std::unique_ptr<HiCacheIo> hicache_io_;
  std::unique_ptr<HostPool> host_pool_;
  std::unique_ptr<HiCache> hicache_;
  std::unique_ptr<KvRowsCopier> kv_copier_;    // made at the first KV export or load
  const ParallelRuntime* parallel_ = nullptr;  // create()'s; used when tp_size > 1
  GroupHostTier* group_host_tier_ = nullptr;   // hicache_io_ under tensor parallelism
  bool tp_launched_ = false;  // ranks are processes of a launcher, not threads here
  std::chrono::steady_clock::time_point last_rank_stats_{};

  // Engine-thread state.
  std::unordered_map<int64_t, std::unique_ptr<Live>> live_;
  // Ended requests whose finished event waits for the capture writer, in ending order.
  std::deque<std::unique_ptr<Live>> retiring_;
  std::unique_ptr<CaptureWriter> capture_writer_;  // with EngineConfig::capture
  std::vector<std::pair<float, int32_t>> sample_scratch_;
  std::array<double, 256> step_seconds_{};  // the last steps' wall times, a ring

  // Shared with other threads (under mu_).
  mutable std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<std::unique_ptr<Live>> inbox_;
  std::vector<int64_t> abort_inbox_;
  bool flush_requested_ = false, flush_result_ = false, flush_done_ = false;
  bool stop_ = false;
  int64_t next_id_ = 1;
  int64_t live_count_ = 0;  // submitted and not yet finalized (as of the last update_stats)
  int64_t finalized_pending_ = 0;
  EngineStats stats_;
  std::thread thread_;
};

}  // namespace strata
