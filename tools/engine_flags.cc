#include "engine_flags.h"

#include <filesystem>

#include "core/log.h"
#include "core/parse_enum.h"
#include "dist/tp_driver.h"
#include "tokenizer/builtin_chat_templates.h"
#include "tokenizer/prompt_encoder.h"

namespace strata::tools {

void add_engine_flags(CLI::App& app, EngineFlags& f, const std::string& default_model) {
  EngineConfig& c = f.config;
  c.model_path = default_model;
  app.add_option("--model-path,--model", c.model_path,
                 "model directory (config.json, safetensors, tokenizer)")
      ->capture_default_str();
  app.add_option(
      "--tokenizer-path", c.tokenizer_path,
      "directory of the tokenizer (tokenizer.json, tokenizer_config.json, chat template; default: "
      "--model-path)");
  app.add_option("--chat-template", c.chat_template,
                 fmt::format("chat template instead of the tokenizer's: a Jinja file (or JSON with "
                             "\"chat_template\"), "
                             "or a name: {}",
                             fmt::join(builtin_chat_template_names(), ", ")));
  app.add_option("--device", f.device, enum_name_list<Device>())->capture_default_str();
  app.add_option(
         "--tp-size,--tp", c.tp_size,
         "tensor-parallel ranks (cuda: one per visible GPU over NCCL; cpu: in-process ranks)")
      ->capture_default_str();
  app.add_option("--dcp-size", c.dcp_size,
                 "decode context parallelism (vLLM's --decode-context-parallel-size; MLA models): "
                 "each group of this "
                 "many tensor-parallel ranks holds 1/N of every sequence's latent KV instead of "
                 "all of it, so KV "
                 "capacity is N x; divides --tp-size")
      ->capture_default_str();
  app.add_flag("--tp-allow-uneven", c.tp_allow_uneven,
               "for tests: split head/intermediate/vocab counts --tp-size does not divide into "
               "ranges one apart "
               "(exact; on GPUs the rank with the larger slices sets the pace)");
  app.add_flag("--tp-one-rank", c.tp_one_rank,
               "benchmarks: run only rank 0 of --tp-size ranks, on one device, every collective "
               "skipped and counted "
               "(what each GPU of the group computes; the outputs are not the model's)");
  app.add_flag("--enable-deterministic-inference", c.deterministic_inference,
               "batch-invariant kernels on cuda: a request's output does not depend on the other "
               "requests of its batches (exact resumption, reproducible runs); costs throughput "
               "(README, 'Deterministic inference')");
  app.add_option("--kv-cache-dtype", f.kv_cache_dtype,
                 enum_name_list<KvCacheDtype>() + " (auto: exact; fp8 needs an eval-kv record)")
      ->capture_default_str();
  app.add_option("--kv-bf16-layers", f.kv_bf16_layers,
                 "layers kept in bf16 with an fp8 KV cache, e.g. 0,7");
  app.add_option("--kv-scales", c.kv_scales_path,
                 "per-layer K/V scales JSON (strata eval-kv --calibrate)");
  app.add_option("--kv-mla-rope-dtype", f.kv_mla_rope_dtype,
                 "MLA rope part of the KV cache: bf16 | fp8_e4m3 | fp8_e5m2");
  app.add_option("--kv-quality-budget", f.kv_gate.budget_nats,
                 "mean KL divergence (nats) a lossy KV cache may cost, per its eval-kv record")
      ->capture_default_str();
  app.add_flag("--allow-lossy-kv", f.kv_gate.allow_lossy,
               "start with a lossy KV cache without a record within budget");
  app.add_option("--kv-quality-records", f.kv_gate.records_dir,
                 "where eval-kv records are read (default $STRATA_KV_QUALITY_DIR or "
                 "~/.cache/strata/kv-quality)");
  app.add_option("--page-size", c.page_size, "tokens per KV page")->capture_default_str();
  app.add_option("--mem-fraction-static", f.mem_fraction_static,
                 "fraction of device memory for weights + KV pool (default: SGLang's rule)");
  app.add_option("--device-memory-gib", c.device_memory_gib,
                 "memory the KV pool is planned against (cpu: a budget standing in for GPU memory; "
                 "default 4)");
  app.add_option("--max-total-tokens", f.max_total_tokens, "cap on the KV pool in tokens");
  app.add_option("--max-running-requests", f.max_running_requests,
                 "most requests decoding at once");
  app.add_option(
      "--chunked-prefill-size", f.chunked_prefill_size,
      fmt::format("prefill tokens per chunk (default {}; {} on cpu, where a chunk then takes well "
                  "under a second)",
                  c.chunked_prefill_size, kCpuDefaultChunkedPrefillSize));
  app.add_option("--max-prefill-tokens", f.max_prefill_tokens,
                 fmt::format("prefill tokens per step (default {}; {} on cpu)",
                             c.max_prefill_tokens, kCpuDefaultChunkedPrefillSize));
  app.add_option("--num-continuous-decode-steps", c.num_continuous_decode_steps,
                 "decode steps per scheduling decision")
      ->capture_default_str();
  app.add_flag("--disable-radix-cache", c.disable_radix_cache,
               "no prefix cache: requests share no KV and keep none after they end");
  app.add_option(
      "--cuda-graph-max-bs", c.cuda_graph_max_bs,
      fmt::format("decode steps of at most this many requests replay captured CUDA graphs (cuda, "
                  "tp 1; 0: off; default {} on one GPU)",
                  kDefaultCudaGraphMaxBs));
  app.add_flag("--disable-cuda-graph", f.disable_cuda_graph,
               "launch every step eagerly (--cuda-graph-max-bs 0)");
  app.add_option("--schedule-conservativeness", c.schedule_conservativeness,
                 "scales the decode reservation of admission (lower admits more, may retract)")
      ->capture_default_str();
  app.add_option("--context-length", c.context_length, "override the model's context length");
  app.add_option("--random-seed", c.seed, "seed for requests that give none")
      ->capture_default_str();
  app.add_flag("--enable-hierarchical-cache", c.enable_hierarchical_cache,
               "keep prefixes evicted from the KV pool in a host-memory tier and promote them back "
               "on a hit");
  app.add_option("--hicache-size", f.hicache_size_gb,
                 "host KV tier in GB per rank: each tensor-parallel rank keeps its own slice of "
                 "every page in its own "
                 "host memory (implies --enable-hierarchical-cache; not with --hicache-ratio)");
  app.add_option("--hicache-ratio", f.hicache_ratio,
                 "host KV tier as a multiple of the device KV pool (implies "
                 "--enable-hierarchical-cache; default 2)");
  app.add_option("--hicache-write-policy", f.hicache_write_policy,
                 enum_name_list<HiCacheWritePolicy>() +
                     ": write_through (default) backs up every prefix, "
                     "write_through_selective a prefix hit twice, write_back copies on eviction");
  app.add_option("--hicache-io-backend", f.hicache_io_backend,
                 enum_name_list<KvIoBackend>() +
                     ": host tier copies on cuda by kernel (default; gather/scatter "
                     "kernel) or direct (cudaMemcpyAsync per page run); memcpy on cpu");
  add_speculative_flags(app, f);
  app.add_option("--log-level", f.log_level, "trace | debug | info | warning | error")
      ->capture_default_str();
}

void add_speculative_flags(CLI::App& app, EngineFlags& f) {
  SpeculativeConfig& s = f.config.speculative;
  app.add_option("--speculative-algorithm", f.speculative_algorithm,
                 "speculative decoding: NGRAM (drafts copied from the request's own earlier "
                 "tokens) or EAGLE3 (a drafter model; not in this build yet). Greedy output stays "
                 "that of plain decoding; sampling keeps the model's distribution");
  app.add_option("--speculative-draft-model-path", s.draft_model_path,
                 "the drafter's checkpoint directory (EAGLE3)");
  app.add_option("--speculative-num-steps", s.num_steps,
                 "draft tokens proposed per request per step (default 3)");
  app.add_option("--speculative-eagle-topk", s.eagle_topk,
                 "drafts per position: 1 is a chain (draft trees, > 1, are not built yet)")
      ->capture_default_str();
  app.add_option("--speculative-num-draft-tokens", s.num_draft_tokens,
                 "tokens one verify runs per request: num-steps + 1 for a chain (default)");
  app.add_option("--speculative-batch-size-threshold", s.batch_size_threshold,
                 "decode steps of more requests than this run without speculation (plain "
                 "decode steps; the drafter keeps up and resumes below it); 0: no limit")
      ->capture_default_str();
}

namespace {

// The host KV tier's flags: sizes, and the names of policies and io backends through their tables
// (kv/hicache.h, backend/kv_host_io.h).
Status finish_hicache_flags(const EngineFlags& f, EngineConfig& c) {
  if (f.hicache_size_gb && f.hicache_ratio)
    return invalid_argument(
        "--hicache-size and --hicache-ratio both given: give one (GB, or a multiple of the device "
        "pool)");
  if (f.hicache_size_gb) {
    if (!(*f.hicache_size_gb > 0))
      return invalid_argument("--hicache-size must be > 0 GB, got {}", *f.hicache_size_gb);
    c.hicache_size_gb = *f.hicache_size_gb;
    c.enable_hierarchical_cache = true;
  }
  if (f.hicache_ratio) {
    if (!(*f.hicache_ratio > 0))
      return invalid_argument("--hicache-ratio must be > 0, got {}", *f.hicache_ratio);
    c.hicache_ratio = *f.hicache_ratio;
    c.enable_hierarchical_cache = true;
  }
  if (!c.enable_hierarchical_cache && (f.hicache_write_policy || f.hicache_io_backend))
    return invalid_argument(
        "{} has no effect without --enable-hierarchical-cache (or --hicache-size / "
        "--hicache-ratio)",
        f.hicache_write_policy ? "--hicache-write-policy" : "--hicache-io-backend");
  if (f.hicache_write_policy) {
    STRATA_ASSIGN_OR_RETURN(c.hicache_write_policy,
                            parse_hicache_write_policy(*f.hicache_write_policy));
  }
  if (f.hicache_io_backend) {
    if (f.hicache_io_backend->empty()) return invalid_argument("--hicache-io-backend is empty");
    STRATA_ASSIGN_OR_RETURN(c.hicache_io_backend, parse_kv_io_backend(*f.hicache_io_backend));
  }
  return Status::ok_status();
}

}  // namespace

StatusOr<EngineConfig> finish_engine_flags(EngineFlags& f) {
  if (!set_log_level(f.log_level))
    return invalid_argument("--log-level: unknown level '{}'", f.log_level);
  EngineConfig c = f.config;
  STRATA_ASSIGN_OR_RETURN(c.device, parse_enum<Device>(f.device, "--device"));
  STRATA_ASSIGN_OR_RETURN(c.kv_cache_dtype,
                          parse_enum<KvCacheDtype>(f.kv_cache_dtype, "--kv-cache-dtype"));
  if (!f.kv_mla_rope_dtype.empty()) {
    auto rope = parse_kv_cache_dtype(f.kv_mla_rope_dtype);
    if (!rope.ok()) return rope.status().with_context("--kv-mla-rope-dtype");
    c.kv_mla_rope_dtype = *rope;
  }
  if (f.mem_fraction_static != 0) {
    if (!(f.mem_fraction_static > 0 && f.mem_fraction_static < 1))
      return invalid_argument("--mem-fraction-static must be in (0, 1), got {}",
                              f.mem_fraction_static);
    c.mem_fraction_static = f.mem_fraction_static;
  }
  if (f.max_total_tokens < 0) return invalid_argument("--max-total-tokens must be positive");
  if (f.max_total_tokens > 0) c.max_total_tokens = f.max_total_tokens;
  if (f.max_running_requests < 0)
    return invalid_argument("--max-running-requests must be positive");
  if (f.max_running_requests > 0) c.max_running_requests = f.max_running_requests;
  if (c.page_size < 1) return invalid_argument("--page-size must be >= 1");
  const bool cpu = c.device == Device::kCpu;
  const int cpu_chunk = std::max(kCpuDefaultChunkedPrefillSize, c.page_size);
  c.chunked_prefill_size =
      f.chunked_prefill_size.value_or(cpu ? cpu_chunk : c.chunked_prefill_size);
  c.max_prefill_tokens = f.max_prefill_tokens.value_or(cpu ? cpu_chunk : c.max_prefill_tokens);
  if (c.tp_allow_uneven && !cpu)
    LOG_WARN(
        "--tp-allow-uneven on {}: a test aid; the rank with the larger slices sets every step's "
        "pace",
        device_name(c.device));
  if (c.chunked_prefill_size < c.page_size)
    return invalid_argument("--chunked-prefill-size must be >= --page-size");
  if (c.num_continuous_decode_steps < 1)
    return invalid_argument("--num-continuous-decode-steps must be >= 1");
  if (c.device_memory_gib < 0) return invalid_argument("--device-memory-gib must be positive");
  if (f.disable_cuda_graph) {
    if (c.cuda_graph_max_bs)
      return invalid_argument(
          "--disable-cuda-graph and --cuda-graph-max-bs {} both given: give one",
          *c.cuda_graph_max_bs);
    c.cuda_graph_max_bs = 0;
  }
  STRATA_RETURN_IF_ERROR(finish_hicache_flags(f, c));
  if (!f.speculative_algorithm.empty()) {
    STRATA_ASSIGN_OR_RETURN(
        c.speculative.algorithm,
        parse_enum<SpeculativeAlgorithm>(f.speculative_algorithm, "--speculative-algorithm"));
  }
  STRATA_RETURN_IF_ERROR(resolve_speculative_config(&c.speculative));
  if (!std::filesystem::is_directory(c.model_path)) {
    if (c.model_path == default_model_path())
      return not_found(
          "the default --model-path '{}' (relative to the working directory {}) is not a "
          "directory: "
          "run from the repository root or pass --model-path DIR",
          c.model_path, std::filesystem::current_path().string());
    return not_found("--model-path '{}' is not a directory", c.model_path);
  }
  if (!c.tokenizer_path.empty() && !std::filesystem::is_directory(c.tokenizer_path))
    return not_found("--tokenizer-path '{}' is not a directory", c.tokenizer_path);
  // A template that does not load fails here, before the model does.
  if (!c.chat_template.empty())
    STRATA_RETURN_IF_ERROR(
        ChatTemplate::from_argument(c.chat_template, c.tokenizer_dir()).status());
  STRATA_ASSIGN_OR_RETURN(c.kv_bf16_layers, parse_layer_list(f.kv_bf16_layers, "--kv-bf16-layers"));
  // The gate prefers a record measured where this server runs (device, tp size).
  KvGateOptions gate = f.kv_gate;
  gate.deployment = KvDeployment{.device = device_name(c.device), .tp_size = c.tp_size};
  STRATA_RETURN_IF_ERROR(enforce_kv_quality_gate(c.model_path, kv_cache_options(c), gate));
  return c;
}

std::string default_model_path() {
  for (const char* p : {"../shared/models/house-llama", "shared/models/house-llama"})
    if (std::filesystem::is_directory(p)) return p;
  return "../shared/models/house-llama";
}

int parse_cli(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ExtrasError&) {  // CLI11 lists them backwards
    std::string extras;
    for (const std::string& a : app.remaining()) extras += (extras.empty() ? "" : " ") + a;
    std::fprintf(stderr, "%s: error: unknown flag or argument: %s (%s --help lists the flags)\n",
                 app.get_name().c_str(), extras.c_str(), app.get_name().c_str());
    return 2;
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "%s: error: %s\n", app.get_name().c_str(), e.what());
    return 2;
  }
  return -1;
}

std::optional<Status> run_tp_worker_if_launched(const EngineConfig& c) {
  if (c.tp_size <= 1 || c.tp_one_rank) return std::nullopt;
  TpConfig tpc{.tp_size = c.tp_size,
               .dcp_size = c.dcp_size,
               .device = c.device,
               .sharding = {.allow_uneven = c.tp_allow_uneven}};
  auto launch = tp_launch_from_env(c.tp_size, c.device, &tpc.nccl_id_file);
  if (!launch.ok()) return launch.status();
  if (!*launch || (*launch)->rank == 0) return std::nullopt;
  tpc.launch = *launch;
  return run_tp_worker(c.model_path, tpc);
}

}  // namespace strata::tools
