// strata generate: batch generation. Prompts from --prompt or JSONL datasets (--input
// NAME=FILE, repeatable) run through the in-process engine or, with --server URL, any
// OpenAI-compatible server. With --output FILE (or --output-dir DIR) the job is resumable and
// exactly-once: kill it at any moment and run the same command again (src/pipeline/runner.h
// describes the files). Without them, results print to stdout in input order.
//
// With --shard K/N it runs one deterministic 1/N of every dataset (pipeline/shard.h), for the N
// tasks of a Slurm or Kubernetes array; --verify PATH... then checks the shards' outputs together
// (pipeline/verify.h) and loads no model.
//
// Exit status: 0 every prompt done; 1 an error, or some prompts failed (see the failures
// file); 3 stopped early because the server stayed unavailable (run the same command again).
// --verify: 0 every id exactly once, 1 otherwise.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "api_key_flags.h"
#include "capture_flags.h"
#include "command.h"
#include "core/log.h"
#include "dist/tensor_parallel.h"
#include "engine/request_validation.h"
#include "engine_flags.h"
#include "pipeline/engine_target.h"
#include "pipeline/runner.h"
#include "pipeline/server_target.h"
#include "pipeline/shard.h"
#include "pipeline/verify.h"

namespace strata::tools {
namespace {

struct GenerateFlags {
  std::vector<std::string> prompts;
  std::vector<std::string> inputs;  // FILE or NAME=FILE
  bool raw = false;
  bool jsonl = false;
  int64_t seed = 0;
  int concurrency = 0;               // 0: engine 2 x max running requests; server 32 per replica
  std::string logit_bias;            // JSON object
  std::string chat_template_kwargs;  // JSON object
  std::string reasoning_parser;      // "" off
  std::string tool_call_parser;      // "" off
  std::string shard;                 // K/N, auto or auto/N
  std::vector<std::string> verify;   // outputs to check instead of generating
  std::string checkpoint_kv = "auto";
  double checkpoint_kv_max_gb = 16;
  ServerConfig server;
  ApiKeyFlags api_key;
  JobOptions job;
};

void add_generate_flags(CLI::App& app, GenerateFlags& g) {
  SamplingParams& s = g.job.sampling.params;
  app.add_option("--prompt", g.prompts, "a user message (chat template applied; repeatable)");
  app.add_option("--input", g.inputs, "JSONL dataset: FILE or NAME=FILE (repeatable)");
  app.add_option(
      "--output,-o", g.job.output_file,
      "results JSONL, all datasets in one file; resumable (default: stdout, not resumable)");
  app.add_option("--output-dir", g.job.output_dir,
                 "one results file per dataset: DIR/NAME.jsonl; resumable");
  app.add_option(
      "--shard", g.shard,
      "run one shard of every dataset (chosen by a hash of each record's id): K/N with 0 <= K < N; "
      "auto in a Slurm job array (SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN of "
      "SLURM_ARRAY_TASK_COUNT); auto/N for a Kubernetes indexed Job (JOB_COMPLETION_INDEX). "
      "{shard} and {shards} in --output/--output-dir become K and N");
  app.add_option(
         "--verify", g.verify,
         "check, without generating, that these outputs (files, or directories searched for "
         "them) of the --input datasets' shards hold every id exactly once")
      ->expected(1, -1);
  app.add_flag("--raw", g.raw, "--prompt is plain text to complete (no chat template)");
  app.add_flag("--jsonl", g.jsonl, "print JSONL even for --prompt");
  app.add_option("--max-new-tokens", s.max_new_tokens, "tokens to generate per prompt")
      ->capture_default_str();
  app.add_option("--temperature", s.temperature, "0 = greedy")->capture_default_str();
  app.add_option("--top-p", s.top_p)->capture_default_str();
  app.add_option("--top-k", s.top_k, "-1 = off")->capture_default_str();
  app.add_option("--min-p", s.min_p,
                 "drop tokens below this x the most likely one's probability (0 = off)")
      ->capture_default_str();
  app.add_option("--repetition-penalty", s.repetition_penalty,
                 "divides positive / multiplies negative logits of generated tokens (1 = off)")
      ->capture_default_str();
  app.add_option("--presence-penalty", s.presence_penalty,
                 "subtracted from generated tokens' logits")
      ->capture_default_str();
  app.add_option("--frequency-penalty", s.frequency_penalty,
                 "subtracted per occurrence in the output")
      ->capture_default_str();
  app.add_option("--logit-bias", g.logit_bias,
                 "OpenAI logit_bias as JSON, e.g. '{\"50256\": -100}'");
  app.add_option(
      "--chat-template-kwargs", g.chat_template_kwargs,
      "extra chat template variables as a JSON object, e.g. '{\"enable_thinking\": false}'");
  app.add_option("--reasoning-parser", g.reasoning_parser,
                 "keep a thinking model's reasoning apart: the record's assistant message gets it "
                 "as reasoning_content (names as strata serve's; in-process engine)");
  app.add_option("--tool-call-parser", g.tool_call_parser,
                 "records with \"tools\": the model's calls become the assistant message's "
                 "tool_calls (names as strata serve's; in-process engine; without it a call stays "
                 "in the content as written)");
  app.add_option("--seed", g.seed,
                 "base sampling seed; each prompt uses a hash of it and the prompt id")
      ->capture_default_str();
  app.add_option("--stop", s.stop_strings, "stop string (repeatable)");
  app.add_option("--stop-token-id", s.stop_token_ids,
                 "stop when this token id is sampled (repeatable)");
  app.add_flag("--ignore-eos", s.ignore_eos, "keep generating past EOS");
  app.add_option("--min-new-tokens", s.min_new_tokens,
                 "no stop token, EOS or stop string ends a prompt's output before this many "
                 "tokens");
  app.add_flag("!--no-progress", g.job.progress, "no progress lines on stderr");
  app.add_option("--progress-interval", g.job.progress_interval_s, "seconds between progress lines")
      ->capture_default_str();
  app.add_option("--checkpoint-tokens", g.job.checkpoint_tokens,
                 "checkpoint an unfinished prompt's output once it has this many unsaved tokens "
                 "(in-process "
                 "engine with --output/--output-dir; a resumed job continues from it; 0: off)")
      ->capture_default_str();
  app.add_option("--checkpoint-interval", g.job.checkpoint_interval_s,
                 "and at least this often (seconds) while any prompt has unsaved tokens")
      ->capture_default_str();
  app.add_option(
         "--checkpoint-kv", g.checkpoint_kv,
         "auto|on|off: checkpoints hold the prompts' KV rows too (OUTPUT.partial.kv), so a resumed "
         "prompt decodes on instead of prefilling its prompt and partial output again; auto: on "
         "unless "
         "the rows could exceed --checkpoint-kv-max-gb (not under --tp-size > 1)")
      ->capture_default_str();
  app.add_option("--checkpoint-kv-max-gb", g.checkpoint_kv_max_gb,
                 "--checkpoint-kv auto: off when KV bytes/token x --max-new-tokens x prompts in "
                 "flight exceeds this")
      ->capture_default_str();
  app.add_flag("--retry-failures", g.job.retry_failures,
               "run the prompts of the failures file again");
  app.add_flag("--allow-mixed-settings", g.job.allow_mixed_settings,
               "resume an output made with another model or other sampling settings");
  app.add_option("--concurrency", g.concurrency,
                 "prompts in flight (server: parallel requests, default 32 per replica; engine: "
                 "default 2 x max running)");
  app.add_option(
         "--server", g.server.urls,
         "OpenAI-compatible server, e.g. http://127.0.0.1:30000 (default: in-process engine); "
         "repeat it "
         "or separate URLs by commas for replicas of one model: requests go to the least busy, and "
         "move to the others when one is down")
      ->delimiter(',');
  app.add_option("--server-model", g.server.model,
                 "model name for the server (default: first of /v1/models)");
  add_api_key_flags(app, g.api_key, "sent to --server as 'Authorization: Bearer KEY'");
  app.add_option("--max-attempts", g.server.retry.max_attempts,
                 "tries per prompt on retryable server errors")
      ->capture_default_str();
  app.add_option("--retry-initial-delay", g.server.retry.initial_delay_s, "first backoff (s)")
      ->capture_default_str();
  app.add_option("--retry-max-delay", g.server.retry.max_delay_s, "backoff cap (s)")
      ->capture_default_str();
  app.add_option("--server-down-timeout", g.server.retry.server_down_timeout_s,
                 "stop (resumably) after the server is unreachable this long (s)")
      ->capture_default_str();
  app.add_option("--request-timeout", g.server.request_timeout_s, "per-request read timeout (s)")
      ->capture_default_str();
}

// The flag of each request field the contract may name (engine/request_validation.h).
std::string flag_of(const std::string& param) {
  if (param == "max_tokens") return "--max-new-tokens";
  if (param == "min_tokens") return "--min-new-tokens";
  if (param == "stop_token_ids") return "--stop-token-id";
  std::string flag = "--" + param;
  std::replace(flag.begin(), flag.end(), '_', '-');
  return flag;
}

// --logit-bias and --chat-template-kwargs: JSON objects.
Status parse_json_flags(GenerateFlags& g) {
  JobSampling& job = g.job.sampling;
  if (!g.chat_template_kwargs.empty()) {
    job.chat_template_kwargs =
        nlohmann::json::parse(g.chat_template_kwargs, nullptr, /*allow_exceptions=*/false);
    if (!job.chat_template_kwargs.is_object())
      return invalid_argument("--chat-template-kwargs must be a JSON object, got '{}'",
                              g.chat_template_kwargs);
  }
  if (!g.logit_bias.empty()) {
    const auto bias = nlohmann::json::parse(g.logit_bias, nullptr, /*allow_exceptions=*/false);
    if (!bias.is_object())
      return invalid_argument("--logit-bias must be a JSON object, got '{}'", g.logit_bias);
    for (const auto& [key, value] : bias.items()) {
      char* end = nullptr;
      const long long id = std::strtoll(key.c_str(), &end, 10);
      if (key.empty() || *end != '\0' || id < 0 || id > INT32_MAX || !value.is_number())
        return invalid_argument("--logit-bias: '{}': {} is not a token id and a number", key,
                                value.dump());
      job.params.logit_bias.emplace_back(int32_t(id), value.get<float>());
    }
    std::sort(job.params.logit_bias.begin(), job.params.logit_bias.end());
  }
  return Status();
}

Status validate(GenerateFlags& g) {
  STRATA_RETURN_IF_ERROR(parse_json_flags(g));
  if (!g.reasoning_parser.empty()) {
    if (!g.server.urls.empty())
      return invalid_argument(
          "--reasoning-parser applies to the in-process engine; a --server splits the reasoning "
          "with its own --reasoning-parser (its reasoning_content is kept either way)");
    STRATA_ASSIGN_OR_RETURN(ReasoningFormat format, reasoning_format(g.reasoning_parser));
    g.job.sampling.reasoning = std::move(format);
  }
  if (!g.tool_call_parser.empty()) {
    if (!g.server.urls.empty())
      return invalid_argument(
          "--tool-call-parser applies to the in-process engine; a --server parses the calls with "
          "its own --tool-call-parser (its tool_calls are kept either way)");
    STRATA_ASSIGN_OR_RETURN(ToolCallFormat format, tool_call_format(g.tool_call_parser));
    g.job.sampling.tool_call = std::move(format);
  }
  // The request contract, with the flags' names (the engine checks the token ids again).
  if (auto e = validate_sampling(g.job.sampling.params))
    return invalid_argument("{}", e->describe(flag_of(e->param)));
  if (g.seed < 0) return invalid_argument("--seed must be >= 0");
  if (g.concurrency < 0) return invalid_argument("--concurrency must be >= 0");
  if (!(g.job.progress_interval_s > 0)) return invalid_argument("--progress-interval must be > 0");
  if (g.job.checkpoint_tokens < 0) return invalid_argument("--checkpoint-tokens must be >= 0");
  if (!(g.job.checkpoint_interval_s > 0))
    return invalid_argument("--checkpoint-interval must be > 0");
  if (g.checkpoint_kv == "auto")
    g.job.checkpoint_kv = JobOptions::CheckpointKv::kAuto;
  else if (g.checkpoint_kv == "on")
    g.job.checkpoint_kv = JobOptions::CheckpointKv::kOn;
  else if (g.checkpoint_kv == "off")
    g.job.checkpoint_kv = JobOptions::CheckpointKv::kOff;
  else
    return invalid_argument("--checkpoint-kv must be auto, on or off, got '{}'", g.checkpoint_kv);
  if (!(g.checkpoint_kv_max_gb >= 0))
    return invalid_argument("--checkpoint-kv-max-gb must be >= 0");
  g.job.checkpoint_kv_max_bytes = int64_t(g.checkpoint_kv_max_gb * 1e9);
  if (!g.job.output_file.empty() && !g.job.output_dir.empty())
    return invalid_argument("give --output or --output-dir, not both");
  g.job.sampling.params.seed = uint64_t(g.seed);
  if (!g.verify.empty() && (g.inputs.empty() || !g.prompts.empty()))
    return invalid_argument(
        "--verify checks the outputs of --input datasets: give the same --input as the job");
  if (!g.verify.empty() &&
      (!g.shard.empty() || !g.job.output_file.empty() || !g.job.output_dir.empty()))
    return invalid_argument(
        "--verify reads the outputs of every shard; drop --shard/--output/--output-dir");
  return Status();
}

// --shard: keeps this task's part of every dataset and names its outputs.
Status apply_shard(GenerateFlags& g, std::vector<Dataset>& datasets) {
  const bool placeholder = substitute_shard(g.job.output_file + g.job.output_dir, ShardSpec{}) !=
                           g.job.output_file + g.job.output_dir;
  if (g.shard.empty()) {
    if (placeholder) return invalid_argument("{{shard}} in --output/--output-dir needs --shard");
    return Status();
  }
  STRATA_ASSIGN_OR_RETURN(ShardSpec spec, parse_shard_spec(g.shard, process_env()));
  int64_t before = 0, after = 0;
  for (const Dataset& d : datasets) before += int64_t(d.records.size());
  keep_shard(datasets, spec);
  for (const Dataset& d : datasets) after += int64_t(d.records.size());
  g.job.output_file = substitute_shard(g.job.output_file, spec);
  g.job.output_dir = substitute_shard(g.job.output_dir, spec);
  g.job.shard = spec.label();
  std::fprintf(stderr, "[generate] shard %s: %lld of %lld prompts%s\n", spec.label().c_str(),
               (long long)after, (long long)before,
               placeholder ? "" : " (outputs named without {shard}: each task needs its own)");
  return Status();
}

int run_verify(const std::vector<Dataset>& datasets, const std::vector<std::string>& paths) {
  auto report = verify_outputs(datasets, paths);
  if (!report.ok()) {
    std::fprintf(stderr, "strata generate --verify: error: %s\n",
                 report.status().message().c_str());
    return 1;
  }
  for (const std::string& line : format_verify_report(*report))
    std::printf("[verify] %s\n", line.c_str());
  std::fflush(stdout);
  return report->ok() ? 0 : 1;
}

StatusOr<std::vector<Dataset>> load_datasets(const GenerateFlags& g) {
  std::vector<Dataset> out;
  if (!g.prompts.empty()) {
    Dataset d{.name = "prompt"};
    for (size_t i = 0; i < g.prompts.size(); ++i) {
      PromptRecord r;
      r.id = "prompt-" + std::to_string(i);
      if (g.raw)
        r.prompt = g.prompts[i];
      else
        r.messages = nlohmann::json::array({{{"role", "user"}, {"content", g.prompts[i]}}});
      r.original = {{"id", r.id}, {"prompt", g.prompts[i]}};
      if (!g.raw) r.original = {{"id", r.id}, {"messages", r.messages}};
      r.line = int64_t(i) + 1;
      d.records.push_back(std::move(r));
    }
    out.push_back(std::move(d));
  }
  for (const auto& spec : g.inputs) {
    STRATA_ASSIGN_OR_RETURN(Dataset d, parse_dataset_spec(spec));
    STRATA_RETURN_IF_ERROR(load_dataset(d));
    out.push_back(std::move(d));
  }
  int64_t n = 0;
  for (const auto& d : out) n += int64_t(d.records.size());
  if (n == 0)
    return invalid_argument("nothing to generate: give --prompt TEXT or --input FILE.jsonl");
  return out;
}

void print_summary(const JobSummary& s) {
  for (const auto& d : s.datasets) {
    std::fprintf(stderr,
                 "[generate] %s: %lld/%lld done (%lld this run), %lld failed; %lld prompt + %lld "
                 "generated tokens\n",
                 d.name.c_str(), (long long)(d.done_before + d.done), (long long)d.total,
                 (long long)d.done, (long long)d.failed, (long long)d.prompt_tokens,
                 (long long)d.completion_tokens);
  }
  int64_t gen = 0, prompt = 0;
  for (const auto& d : s.datasets) gen += d.completion_tokens, prompt += d.prompt_tokens;
  const double secs = std::max(s.seconds, 1e-9);
  std::fprintf(stderr, "[generate] %s in %s: prompt %.1f tok/s, generation %.1f tok/s%s\n",
               s.complete ? "finished" : "stopped", format_duration(s.seconds).c_str(),
               double(prompt) / secs, double(gen) / secs,
               s.failed() ? fmt::format(", {} failed", s.failed()).c_str() : "");
  if (!s.complete)
    std::fprintf(stderr,
                 "[generate] %lld prompts left (%s); run the same command again to resume\n",
                 (long long)s.interrupted, s.interrupt_reason.c_str());
}

int generate_main(int argc, char** argv) {
  CLI::App app("strata generate: batch generation (resumable with --output/--output-dir)",
               "strata generate");
  EngineFlags ef;
  GenerateFlags g;
  add_engine_flags(app, ef, default_model_path());
  add_generate_flags(app, g);
  CaptureFlags capture;
  add_capture_flags(app, capture);
  if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "strata generate: error: %s\n", s.message().c_str());
    return 1;
  };
  if (Status s = validate(g); !s.ok()) return fail(s);
  auto datasets = load_datasets(g);
  if (!datasets.ok()) return fail(datasets.status());
  if (!g.verify.empty()) return run_verify(*datasets, g.verify);
  if (Status s = apply_shard(g, *datasets); !s.ok()) return fail(s);
  // Before the model loads: a second job on the same output is refused at once.
  auto locks = lock_job_outputs(*datasets, g.job);
  if (!locks.ok()) return fail(locks.status());
  g.job.held_locks = std::move(locks).value();

  std::unique_ptr<Engine> engine;
  std::unique_ptr<PromptTarget> target;
  if (!g.server.urls.empty()) {
    if (!set_log_level(ef.log_level))
      return fail(invalid_argument("--log-level: unknown level '{}'", ef.log_level));
    if (capture.enabled())
      return fail(
          invalid_argument("hidden-state capture needs the in-process engine, not --server"));
    if (ef.config.tp_size != 1)
      return fail(
          invalid_argument("--tp-size applies to the in-process engine; with --server the server's "
                           "own --tp-size counts"));
    auto api_key = resolve_api_key(g.api_key);
    if (!api_key.ok()) return fail(api_key.status());
    g.server.api_key = *api_key;
    g.server.sampling = g.job.sampling;
    // 32 requests in flight per replica unless told otherwise.
    g.server.concurrency = g.concurrency > 0 ? g.concurrency : 32 * int(g.server.urls.size());
    auto b = ServerTarget::create(g.server);
    if (!b.ok()) return fail(b.status());
    target = std::move(b).value();
  } else {
    auto cfg = finish_engine_flags(ef);
    if (!cfg.ok()) return fail(cfg.status());
    if (auto worker = run_tp_worker_if_launched(*cfg)) return worker->ok() ? 0 : fail(*worker);
    if (Status s = resolve_capture_flags(capture, cfg->model_path,
                                         !g.job.output_file.empty() || !g.job.output_dir.empty(),
                                         &g.job.capture, &cfg->capture);
        !s.ok())
      return fail(s);
    auto e = Engine::create(*cfg, &tensor_parallel_runtime());
    if (!e.ok()) return fail(e.status());
    engine = std::move(e).value();
    auto b = EngineTarget::create(*engine, g.job.sampling, g.concurrency, g.job.capture);
    if (!b.ok()) return fail(b.status());
    target = std::move(b).value();
  }
  const bool single_prompts = g.inputs.empty() && !g.jsonl;
  if (single_prompts && g.job.output_file.empty() && g.job.output_dir.empty())
    g.job.progress = false;

  auto summary = run_job(*datasets, *target, g.job);
  target.reset();  // server workers stop before the summary prints
  if (!summary.ok()) return fail(summary.status());
  for (const auto& r : summary->records) {
    if (single_prompts) {
      const auto& conv = r.contains("messages") ? r["messages"] : nlohmann::json();
      const std::string text = conv.is_array() && !conv.empty() ? conv.back().value("content", "")
                                                                : r.value("completion", "");
      std::printf("%s\n", text.c_str());
    } else {
      std::printf("%s\n", r.dump().c_str());
    }
  }
  std::fflush(stdout);
  if (g.job.progress || !summary->complete || summary->failed() > 0) print_summary(*summary);
  if (!summary->complete) return 3;
  return summary->failed() > 0 ? 1 : 0;
}

const CommandRegistrar reg("generate", "batch generation: engine or OpenAI server, resumable",
                           generate_main);

}  // namespace
}  // namespace strata::tools
