// strata generate: batch generation through the in-process engine. Prompts from --prompt or
// JSONL files; all prompts run concurrently through the engine (continuous batching); results
// in input order as JSONL (or plain text for a single --prompt).
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "command.h"
#include "core/log.h"
#include "engine/prompt.h"
#include "engine_flags.h"
#include "pipeline/dataset.h"

namespace strata::tools {
namespace {

struct GenerateFlags {
  std::vector<std::string> prompts;
  std::vector<std::string> inputs;  // FILE or NAME=FILE
  std::string output;
  bool raw = false;
  bool jsonl = false;
  int max_new_tokens = 128;
  float temperature = 0.0f;
  float top_p = 1.0f;
  int top_k = -1;
  int64_t seed = -1;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  bool progress = true;
};

struct Job {
  PromptRecord record;
  std::string dataset;
  std::vector<int32_t> prompt_ids;
  std::string text;
  StreamEvent final_event;
  bool done = false;
};

Status load_jobs(const GenerateFlags& g, std::vector<Job>& jobs) {
  for (size_t i = 0; i < g.prompts.size(); ++i) {
    Job j;
    j.dataset = "prompt";
    j.record.id = "prompt-" + std::to_string(i);
    if (g.raw) {
      j.record.prompt = g.prompts[i];
    } else {
      j.record.messages = nlohmann::json::array({{{"role", "user"}, {"content", g.prompts[i]}}});
    }
    j.record.original = {{"id", j.record.id}, {"prompt", g.prompts[i]}};
    jobs.push_back(std::move(j));
  }
  for (const auto& spec : g.inputs) {
    const size_t eq = spec.find('=');
    const std::string name = eq == std::string::npos ? std::filesystem::path(spec).stem().string() : spec.substr(0, eq);
    const std::string path = eq == std::string::npos ? spec : spec.substr(eq + 1);
    STRATA_ASSIGN_OR_RETURN(std::vector<PromptRecord> records, read_prompt_file(path, name));
    for (auto& r : records) {
      Job j;
      j.dataset = name;
      j.record = std::move(r);
      jobs.push_back(std::move(j));
    }
  }
  if (jobs.empty()) return invalid_argument("nothing to generate: give --prompt TEXT or --input FILE.jsonl");
  return Status();
}

nlohmann::json result_json(const Job& j, const std::string& model, const GenerateFlags& g) {
  nlohmann::json out = j.record.original;
  const char* reason = finish_reason_name(j.final_event.finish_reason);
  if (!j.record.messages.is_null()) {
    const char* key = out.contains("messages") ? "messages" : "conversations";
    nlohmann::json conv = prompt_messages(j.record.messages);
    conv.push_back({{"role", "assistant"}, {"content", j.text}});
    out[key] = conv;
  } else {
    out["completion"] = j.text;
  }
  out["id"] = j.record.id;
  out["meta"] = {{"dataset", j.dataset},
                 {"model", model},
                 {"temperature", g.temperature},
                 {"top_p", g.top_p},
                 {"top_k", g.top_k},
                 {"max_new_tokens", g.max_new_tokens},
                 {"prompt_tokens", j.final_event.prompt_tokens},
                 {"completion_tokens", j.final_event.completion_tokens},
                 {"finish_reason", reason}};
  if (!j.final_event.error.empty()) out["meta"]["error"] = j.final_event.error;
  return out;
}

// Writes to PATH.tmp and renames, so an interrupted run never leaves a file that looks complete.
Status write_results(const std::vector<Job>& jobs, const std::string& path, const std::string& model,
                     const GenerateFlags& g) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) return not_found("cannot write output file '{}'", tmp);
    for (const auto& j : jobs) out << result_json(j, model, g).dump() << "\n";
    out.flush();
    if (!out) {
      std::filesystem::remove(tmp);
      return internal_error("writing '{}' failed", tmp);
    }
  }
  std::filesystem::rename(tmp, path);
  return Status();
}

int generate_main(int argc, char** argv) {
  CLI::App app("strata generate: batch generation", "strata generate");
  EngineFlags ef;
  GenerateFlags g;
  add_engine_flags(app, ef, default_model_path());
  app.add_option("--prompt", g.prompts, "a user message (chat template applied; repeatable)");
  app.add_option("--input", g.inputs, "JSONL prompts: FILE or NAME=FILE (repeatable)");
  app.add_option("--output,-o", g.output, "JSONL results (default: stdout)");
  app.add_flag("--raw", g.raw, "--prompt is plain text to complete (no chat template)");
  app.add_flag("--jsonl", g.jsonl, "print JSONL even for --prompt");
  app.add_option("--max-new-tokens", g.max_new_tokens, "tokens to generate per prompt")->capture_default_str();
  app.add_option("--temperature", g.temperature, "0 = greedy")->capture_default_str();
  app.add_option("--top-p", g.top_p)->capture_default_str();
  app.add_option("--top-k", g.top_k, "-1 = off")->capture_default_str();
  app.add_option("--seed", g.seed, "sampling seed (per prompt: seed + index)");
  app.add_option("--stop", g.stop, "stop string (repeatable)");
  app.add_flag("--ignore-eos", g.ignore_eos, "keep generating past EOS");
  app.add_flag("!--no-progress", g.progress, "no progress line on stderr");
  if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;

  auto fail = [](const Status& s) {
    std::fprintf(stderr, "strata generate: error: %s\n", s.message().c_str());
    return 1;
  };
  if (g.max_new_tokens < 0) return fail(invalid_argument("--max-new-tokens must be >= 0"));
  if (g.temperature < 0) return fail(invalid_argument("--temperature must be >= 0"));
  if (!(g.top_p > 0 && g.top_p <= 1)) return fail(invalid_argument("--top-p must be in (0, 1]"));
  auto cfg = finish_engine_flags(ef);
  if (!cfg.ok()) return fail(cfg.status());
  std::vector<Job> jobs;
  if (Status s = load_jobs(g, jobs); !s.ok()) return fail(s);

  auto engine_or = Engine::create(*cfg);
  if (!engine_or.ok()) return fail(engine_or.status());
  Engine& engine = **engine_or;
  auto enc_or = PromptEncoder::load(cfg->model_path, engine.tokenizer());
  if (!enc_or.ok()) return fail(enc_or.status());
  const PromptEncoder& enc = *enc_or;
  for (auto& j : jobs) {
    if (j.record.messages.is_null()) {
      j.prompt_ids = enc.encode_raw(j.record.prompt);
    } else {
      auto ids = enc.encode_chat(prompt_messages(j.record.messages));
      if (!ids.ok()) return fail(ids.status().with_context("{} id {}", j.dataset, j.record.id));
      j.prompt_ids = std::move(ids).value();
    }
  }

  std::mutex mu;
  std::atomic<int64_t> done{0}, gen_tokens{0};
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < jobs.size(); ++i) {
    Job& j = jobs[i];
    GenerateRequest req;
    req.prompt_ids = j.prompt_ids;
    req.params.temperature = g.temperature;
    req.params.top_p = g.top_p;
    req.params.top_k = g.top_k;
    req.params.max_new_tokens = g.max_new_tokens;
    req.params.stop_strings = g.stop;
    req.params.ignore_eos = g.ignore_eos;
    if (g.seed >= 0) req.params.seed = uint64_t(g.seed) + i;
    req.on_event = [&j, &mu, &done, &gen_tokens](const StreamEvent& ev) {
      std::lock_guard<std::mutex> lk(mu);
      j.text += ev.text;
      gen_tokens += int64_t(ev.token_ids.size());
      if (ev.finished) {
        j.final_event = ev;
        j.done = true;
        ++done;
      }
    };
    auto id = engine.submit(std::move(req));
    if (!id.ok()) return fail(id.status().with_context("{} id {}", j.dataset, j.record.id));
  }

  std::atomic<bool> finished{false};
  std::thread progress([&] {
    const bool show = g.progress && jobs.size() > 1;
    while (!finished) {
      for (int k = 0; k < 10 && !finished; ++k) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (!show) continue;
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const int64_t d = done;
      const double rate = double(gen_tokens) / std::max(secs, 1e-9);
      const double eta = d > 0 ? secs / double(d) * double(int64_t(jobs.size()) - d) : 0;
      std::fprintf(stderr, "[generate] %lld/%zu done · %.1f tok/s · elapsed %.0fs · ETA %.0fs\n",
                   (long long)d, jobs.size(), rate, secs, eta);
    }
  });
  engine.wait_idle();
  finished = true;
  progress.join();

  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  int64_t prompt_tokens = 0, errors = 0;
  for (const auto& j : jobs) {
    prompt_tokens += j.final_event.prompt_tokens;
    errors += !j.final_event.error.empty();
  }
  const std::string model = std::filesystem::path(cfg->model_path).filename().string();
  if (!g.output.empty()) {
    if (Status s = write_results(jobs, g.output, model, g); !s.ok()) return fail(s);
  } else if (!g.jsonl && g.inputs.empty()) {
    for (const auto& j : jobs) std::printf("%s\n", j.text.c_str());
  } else {
    for (const auto& j : jobs) std::printf("%s\n", result_json(j, model, g).dump().c_str());
  }
  std::fflush(stdout);
  LOG_INFO("generated {} prompts in {:.2f}s: {} prompt tokens, {} generated tokens ({:.1f} tok/s){}",
           jobs.size(), secs, prompt_tokens, int64_t(gen_tokens), double(gen_tokens) / std::max(secs, 1e-9),
           errors ? fmt::format(", {} failed", errors) : "");
  return errors ? 1 : 0;
}

const CommandRegistrar reg("generate", "batch generation with the in-process engine", generate_main);

}  // namespace
}  // namespace strata::tools
