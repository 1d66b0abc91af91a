// strata serve: the OpenAI-compatible HTTP server over the in-process engine.
// SIGTERM/SIGINT drain: stop accepting, finish (or after --drain-timeout abort) what is in
// flight so every connected client gets a complete response, then exit 0.
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "api_key_flags.h"
#include "backend/factory/rank_factory.h"
#include "command.h"
#include "core/log.h"
#include "dist/node_launch.h"
#include "dist/tensor_parallel.h"
#include "dist/tp_driver.h"
#include "engine_flags.h"
#include "server/http_server.h"
#include "sglang_flags.h"
#include "tokenizer/prompt_encoder.h"

namespace strata::tools {
namespace {

struct ServeFlags {
  ServerConfig server;
  NodeLaunchFlags node;
  ApiKeyFlags api_key;
  bool disable_custom_all_reduce = false;
  bool enable_metrics = false;
  bool trust_remote_code = false;
  std::string reasoning_parser;  // "" off
  std::string tool_call_parser;  // "" off
  SglangFlags sglang;            // SGLang's flags without a strata setting (sglang_flags.h)
};

// Each connection is a file descriptor: raise the soft limit (often 1,024) to the hard one, and
// say so when even that is below what --max-connections needs.
void raise_open_file_limit(int max_connections) {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return;
  if (lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &lim);
  }
  if (lim.rlim_cur != RLIM_INFINITY && lim.rlim_cur < rlim_t(max_connections) + 512)
    LOG_WARN(
        "the open-file limit is {} (ulimit -n): fewer connections than --max-connections {} can be "
        "open",
        (unsigned long long)lim.rlim_cur, max_connections);
}

int fail(const Status& s) {
  std::fprintf(stderr, "strata serve: error: %s\n", s.message().c_str());
  return 1;
}

// Blocks SIGTERM/SIGINT in every thread (call before starting any) and waits for them on one
// thread, so the drain runs in ordinary code, not in a signal handler.
class SignalWatcher {
 public:
  SignalWatcher() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGTERM);
    sigaddset(&set_, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set_, nullptr);
    std::signal(SIGPIPE, SIG_IGN);  // a client that went away is a failed write, not a crash
  }
  // Calls on_signal once when a signal arrives; stops watching when stop() is called.
  void start(std::function<void()> on_signal) {
    thread_ = std::thread([this, on_signal = std::move(on_signal)] {
      const timespec tick{0, 200 * 1000 * 1000};
      while (!stop_) {
        siginfo_t info;
        if (sigtimedwait(&set_, &info, &tick) > 0) {
          LOG_INFO("received {}: shutting down", info.si_signo == SIGTERM ? "SIGTERM" : "SIGINT");
          on_signal();
          return;
        }
      }
    });
  }
  void stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  ~SignalWatcher() { stop(); }

 private:
  sigset_t set_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// --nnodes > 1 without a launcher's ranks: this process is its node's launcher
// (dist/node_launch.h); returns the exit code of the node's ranks. nullopt: serve (or be a rank)
// here.
std::optional<int> launch_node_if_asked(const ServeFlags& sf, const EngineConfig& cfg, int argc,
                                        char** argv) {
  auto launched = launch_rank_from_env();
  if (!launched.ok()) return fail(launched.status());
  // One of --tp-size ranks already (this node's, or mpirun's): run as that rank. A launcher that
  // started one process per node (srun --ntasks-per-node 1) leaves the ranks to --nnodes.
  if (launched->size > 1 && (launched->size == cfg.tp_size || sf.node.nnodes <= 1))
    return std::nullopt;
  auto plan = plan_node_ranks(sf.node, cfg.tp_size, cfg.device, "");
  if (!plan.ok()) return fail(plan.status());
  if (plan->empty()) {
    if (!sf.node.dist_init_addr.empty())
      LOG_INFO("--nnodes 1: --dist-init-addr is not needed (one node)");
    return std::nullopt;
  }
  std::string id = std::getenv("STRATA_NCCL_ID") ? std::getenv("STRATA_NCCL_ID") : "";
  if (id.empty()) {
    auto hex = nccl_id_hex_from_address(sf.node.dist_init_addr);
    if (!hex.ok()) return fail(hex.status());
    id = *hex;
  }
  plan = plan_node_ranks(sf.node, cfg.tp_size, cfg.device, id);
  std::vector<std::string> args = {"/proc/self/exe", "serve"};
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  LOG_INFO("node {} of {}: starting ranks {}..{} of {} (NCCL bootstrap at {}{})", sf.node.node_rank,
           sf.node.nnodes, plan->front().rank, plan->back().rank, cfg.tp_size,
           sf.node.dist_init_addr, sf.node.node_rank == 0 ? "; rank 0 serves HTTP" : "");
  return run_rank_processes(args, *plan, sf.server.drain_timeout_s + 30);
}

int serve_main(int argc, char** argv) {
  CLI::App app("strata serve: OpenAI-compatible HTTP server", "strata serve");
  EngineFlags ef;
  ServeFlags sf;
  add_engine_flags(app, ef, default_model_path());
  ServerConfig& sc = sf.server;
  app.add_option("--host", sc.host, "address to listen on")->capture_default_str();
  app.add_option("--port", sc.port, "port to listen on (0: any free port)")->capture_default_str();
  app.add_option("--served-model-name", sc.served_model_name,
                 "model name clients use (default: basename of --model-path)");
  app.add_option("--reasoning-parser", sf.reasoning_parser,
                 "split a thinking model's reasoning into the chat API's reasoning_content: "
                 "deepseek-r1, deepseek-v3, qwen3, qwen3-thinking, glm45, kimi, kimi_k2");
  app.add_option("--tool-call-parser", sf.tool_call_parser,
                 "parse the model's tool calls into the chat API's tool_calls (the model's call "
                 "format): kimi_k2, deepseekv3, deepseekv31, qwen25 (qwen, hermes), llama3");
  app.add_option(
         "--max-queued-requests", sc.max_queued_requests,
         "requests waiting beyond the running slots before 503 + Retry-After (-1: unbounded)")
      ->capture_default_str();
  app.add_option("--drain-timeout", sc.drain_timeout_s,
                 "seconds in-flight requests get after SIGTERM before they are aborted")
      ->capture_default_str();
  app.add_option("--max-connections", sc.max_connections,
                 "open connections beyond which generation requests get 503 (idle connections hold "
                 "no thread)")
      ->capture_default_str();
  app.add_option("--health-timeout", sc.health_timeout_s,
                 "seconds a busy engine may go without completing a step before /health says 503 "
                 "(0: 10 x the "
                 "longest recent step, at least 30 s)")
      ->capture_default_str();
  app.add_option("--max-request-body-mb", sc.max_request_body_mb,
                 "largest request body accepted, in MiB (larger ones are answered 413)")
      ->capture_default_str();
  add_api_key_flags(app, sf.api_key,
                    "every request but /health and /health_generate must send as 'Authorization: "
                    "Bearer KEY' (401 "
                    "otherwise); none given: no key needed");
  app.add_option("--nnodes", sf.node.nnodes,
                 "nodes of one tensor-parallel group (SGLang's): each runs this command with its "
                 "--node-rank and "
                 "starts --tp-size / --nnodes rank processes, one per GPU")
      ->capture_default_str();
  app.add_option("--node-rank", sf.node.node_rank,
                 "this node's index in [0, --nnodes); node 0 holds rank 0 (HTTP)")
      ->capture_default_str();
  app.add_option("--dist-init-addr", sf.node.dist_init_addr,
                 "HOST:PORT of node 0, the same on every node: NCCL's bootstrap (NCCL_COMM_ID)");
  app.add_flag(
      "--disable-custom-all-reduce", sf.disable_custom_all_reduce,
      "accepted for SGLang compatibility: every all-reduce is NCCL's (there is no custom one)");
  app.add_flag("--enable-metrics", sf.enable_metrics,
               "accepted for SGLang compatibility: /metrics (Prometheus) is always on here, with "
               "or without it");
  app.add_flag("--log-requests", sc.log_requests.enabled,
               "log each generation request when accepted (Receive:) and when done (Finish:); "
               "never its headers");
  app.add_option("--log-requests-level", sc.log_requests.level,
                 "0 metadata, 1 + sampling parameters, 2 + prompt and output cut to 2048 "
                 "characters, 3 + all of them")
      ->capture_default_str()
      ->check(CLI::Range(0, 3));
  app.add_flag("--trust-remote-code", sf.trust_remote_code,
               "accepted for SGLang compatibility: no code is ever run");
  add_sglang_flags(app, sf.sglang);
  if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;
  if (Status s = check_sglang_flags(sf.sglang); !s.ok()) return fail(s);
  if (sc.port < 0 || sc.port > 65535) return fail(invalid_argument("--port must be in [0, 65535]"));
  if (!sf.reasoning_parser.empty()) {
    auto format = reasoning_format(sf.reasoning_parser);
    if (!format.ok()) return fail(format.status());
    sc.reasoning = *format;
  }
  if (!sf.tool_call_parser.empty()) {
    auto format = tool_call_format(sf.tool_call_parser);
    if (!format.ok()) return fail(format.status());
    sc.tool_call = *format;
  }
  if (sc.max_queued_requests < -1)
    return fail(invalid_argument("--max-queued-requests must be >= -1"));
  if (sc.drain_timeout_s < 0) return fail(invalid_argument("--drain-timeout must be >= 0"));
  if (!(sc.health_timeout_s >= 0)) return fail(invalid_argument("--health-timeout must be >= 0"));
  if (sc.max_connections < 1) return fail(invalid_argument("--max-connections must be >= 1"));
  raise_open_file_limit(sc.max_connections);
  if (sc.max_request_body_mb < 1 || sc.max_request_body_mb > 65536)
    return fail(invalid_argument("--max-request-body-mb must be in [1, 65536], got {}",
                                 sc.max_request_body_mb));
  auto api_key = resolve_api_key(sf.api_key);
  if (!api_key.ok()) return fail(api_key.status());
  sc.api_key = *api_key;
  auto cfg = finish_engine_flags(ef);
  if (!cfg.ok()) return fail(cfg.status());
  if (auto node = launch_node_if_asked(sf, *cfg, argc, argv)) return *node;
  if (auto worker = run_tp_worker_if_launched(*cfg)) return worker->ok() ? 0 : fail(*worker);
  if (sc.served_model_name.empty())
    sc.served_model_name =
        std::filesystem::path(cfg->model_path).lexically_normal().filename().string();
  if (sc.served_model_name.empty())  // a path ending in '/'
    sc.served_model_name =
        std::filesystem::path(cfg->model_path).lexically_normal().parent_path().filename().string();
  if (sf.enable_metrics) LOG_INFO("--enable-metrics: /metrics is always enabled");
  for (const CLI::Option* opt : app.get_options()) {
    if (opt->count() == 0 || opt->get_name() == "--help") continue;
    const auto results = opt->results();
    sc.flags[opt->get_name()] =
        results.size() == 1 ? nlohmann::json(results[0]) : nlohmann::json(results);
    if (opt->get_name() == "--api-key")
      sc.flags[opt->get_name()] = "(hidden)";  // /get_server_info shows the flags
  }

  if (Status s = check_listen_address(sc.host, sc.port); !s.ok()) return fail(s);
  SignalWatcher signals;  // before any thread starts, so all of them inherit the mask
  auto engine_or = Engine::create(*cfg, &tensor_parallel_runtime());
  if (!engine_or.ok()) return fail(engine_or.status());
  Engine& engine = **engine_or;
  auto enc_or = PromptEncoder::load(cfg->tokenizer_dir(), engine.tokenizer(), cfg->chat_template);
  if (!enc_or.ok()) return fail(enc_or.status());
  int rc = 0;
  {
    ServerState state(sc, engine, *enc_or);
    HttpServer server(state);
    if (Status s = server.bind(); !s.ok()) return fail(s);
    signals.start([&server] { server.shutdown(); });
    LOG_INFO("serving '{}' on http://{}:{} (OpenAI API at /v1){}", sc.served_model_name,
             url_host(sc.host), server.port(), sc.api_key.empty() ? "" : " · API key required");
    if (sc.api_key.empty() && sc.host != "127.0.0.1" && sc.host != "localhost" && sc.host != "::1")
      LOG_WARN("no API key: anyone who can reach {}:{} can use this server (--api-key-file or ${})",
               url_host(sc.host), server.port(), kApiKeyEnv);
    if (Status s = server.run(); !s.ok()) rc = fail(s);
    signals.stop();
  }
  LOG_INFO("server stopped");
  return rc;
}

const CommandRegistrar reg("serve", "OpenAI-compatible HTTP server", serve_main);

}  // namespace
}  // namespace strata::tools
