// Starts the real `strata serve` on a free port for e2e tests and stops it with SIGTERM.
// Readiness is polled (the log line with the port, then /health), never slept for.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "http_client.h"

namespace strata::e2e {

inline std::string house_llama() { return std::string(STRATA_SHARED_DIR) + "/models/house-llama"; }

inline std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Every socket listening on `port` (IPv4 and IPv6, from /proc/net) and the processes holding it:
// names a second listener that took connections meant for a test's server.
inline std::string port_listeners(int port) {
  std::vector<std::string> inodes;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::istringstream in(read_file(table));
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      std::istringstream f(line);
      std::string slot, local, remote, state, skip, inode;
      f >> slot >> local >> remote >> state;
      for (int i = 0; i < 5; ++i) f >> skip;  // tx:rx tr:when retrnsmt uid timeout
      f >> inode;
      const size_t colon = local.rfind(':');
      if (state != "0A" || colon == std::string::npos) continue;  // 0A: LISTEN
      if (std::stoi(local.substr(colon + 1), nullptr, 16) == port)
        inodes.push_back(local + " socket " + inode);
    }
  }
  std::string out = "listening on port " + std::to_string(port) + ":";
  if (inodes.empty()) return out + " nothing";
  for (const std::string& entry : inodes) {
    out += " [" + entry;
    const std::string target = "socket:[" + entry.substr(entry.rfind(' ') + 1) + "]";
    std::error_code ec;
    for (const auto& proc : std::filesystem::directory_iterator("/proc", ec)) {
      const std::string pid = proc.path().filename().string();
      if (pid.find_first_not_of("0123456789") != std::string::npos) continue;  // self, ...
      std::error_code fec;
      for (const auto& fd : std::filesystem::directory_iterator(proc.path() / "fd", fec)) {
        std::error_code lec;
        if (std::filesystem::read_symlink(fd.path(), lec).string() != target) continue;
        std::string comm = read_file(proc.path() / "comm");
        while (!comm.empty() && comm.back() == '\n') comm.pop_back();
        out += " held by pid " + pid + " (" + comm + ")";
        break;
      }
    }
    out += "]";
  }
  return out;
}

// Polls `pred` every 20 ms until it holds or `timeout_s` passes.
template <typename Pred>
bool poll_until(Pred pred, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return pred();
}

class ServerProcess {
 public:
  ~ServerProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  // Sets an environment variable of the server processes started after this call.
  void set_env(std::string name, std::string value) {
    env_.emplace_back(std::move(name), std::move(value));
  }
  // --model-path of the servers started after this call (default: house-llama).
  void set_model_path(std::string path) { model_path_ = std::move(path); }
  // Runs `strata serve --port 0 <args>`; returns once /health answers 200 (false on failure).
  bool start(std::vector<std::string> args, double timeout_s = 120) {
    log_path_ = ::testing::TempDir() + "strata_serve_" + std::to_string(::getpid()) + "_" +
                std::to_string(counter()++) + ".log";
    std::vector<std::string> argv = {STRATA_BINARY, "serve",  "--model-path",
                                     model_path_,   "--port", "0"};
    argv.insert(argv.end(), args.begin(), args.end());
    // Emptied here, before the fork: pids recur, and a file left by an earlier test process of
    // this pid would show its server's port to the poll below until the child truncates it (a
    // CI run probed a dead port for 120 s that way).
    std::ofstream(log_path_, std::ios::trunc).close();
    pid_ = ::fork();
    if (pid_ == 0) {
      FILE* f = std::freopen(log_path_.c_str(), "w", stderr);
      (void)f;
      ::dup2(::fileno(stderr), STDOUT_FILENO);
      for (const auto& [name, value] : env_) ::setenv(name.c_str(), value.c_str(), 1);
      std::vector<char*> cargv;
      for (auto& a : argv) cargv.push_back(a.data());
      cargv.push_back(nullptr);
      ::execv(cargv[0], cargv.data());
      std::_Exit(127);
    }
    const std::string marker = "on http://";  // host:port or [v6 host]:port, then a space
    const bool logged = poll_until(
        [&] {
          const std::string log = read_file(log_path_);
          const size_t p = log.find(marker);
          if (p == std::string::npos) return exited();
          // The whole address only: the line may still be being written (a partial port would
          // send every health probe to the wrong port until the timeout).
          const size_t end = log.find(' ', p + marker.size());
          if (end == std::string::npos) return false;
          port_ = std::atoi(log.c_str() + log.rfind(':', end) + 1);
          return true;
        },
        timeout_s);
    if (!logged || port_ <= 0) return false;
    HttpResponse last;
    if (poll_until([&] { return (last = http(port_, "GET", "/health", "", 10)).status == 200; },
                   timeout_s))
      return true;
    // Never healthy: say what /health last answered and where the server's threads wait.
    start_problem_ =
        "\n[test] /health never answered 200 in " + std::to_string(int(timeout_s)) +
        " s; the last answer: status " + std::to_string(last.status) + ", body '" + last.body +
        "'" + (last.failure.empty() ? "" : " (" + last.failure + ")") + "; server pid " +
        std::to_string(pid_) + "; " + port_listeners(port_) + "; " +
        (exited() ? "the server exited with " + std::to_string(exit_code_) : thread_states());
    return false;
  }
  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  std::string log() const { return read_file(log_path_) + start_problem_; }
  // True once the process has exited (reaps it and records the exit code).
  bool exited() {
    if (pid_ <= 0) return true;
    int st = 0;
    if (::waitpid(pid_, &st, WNOHANG) == pid_) {
      exit_code_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      pid_ = -1;
      return true;
    }
    return false;
  }
  void signal(int sig) {
    if (pid_ > 0) ::kill(pid_, sig);
  }
  // SIGTERM, then waits for the exit; returns the exit code (-1 on timeout).
  int stop(double timeout_s = 60) {
    signal(SIGTERM);
    if (!poll_until([&] { return exited(); }, timeout_s)) return -1;
    return exit_code_;
  }
  int exit_code() const { return exit_code_; }
  // Each thread of the running server: name, state and kernel wait channel (from /proc).
  std::string thread_states() const {
    std::string out = "threads (name state wchan):";
    std::error_code ec;
    for (const auto& t :
         std::filesystem::directory_iterator("/proc/" + std::to_string(pid_) + "/task", ec)) {
      const std::string stat = read_file(t.path() / "stat");
      const size_t open = stat.find('('), close = stat.rfind(')');
      if (open == std::string::npos || close == std::string::npos || close + 2 >= stat.size())
        continue;
      out += " [" + stat.substr(open + 1, close - open - 1) + " " + stat.substr(close + 2, 1) +
             " " + read_file(t.path() / "wchan") + "]";
    }
    return out;
  }
  // Resident set size in KiB (from /proc).
  long rss_kib() const {
    std::ifstream in("/proc/" + std::to_string(pid_) + "/status");
    std::string line;
    while (std::getline(in, line))
      if (line.rfind("VmRSS:", 0) == 0) return std::atol(line.c_str() + 6);
    return -1;
  }

 private:
  static int& counter() {
    static int n = 0;
    return n;
  }
  pid_t pid_ = -1;
  int port_ = -1;
  int exit_code_ = -1;
  std::string log_path_;
  std::string start_problem_;  // why start() failed, when it did past the log line
  std::vector<std::pair<std::string, std::string>> env_;
  std::string model_path_ = house_llama();
};

// POSTs `body` as JSON and parses the answer (discarded JSON when it is none); expects a 200.
inline nlohmann::json post_json(int port, const std::string& path, const nlohmann::json& body) {
  const HttpResponse r = http(port, "POST", path, body.dump());
  EXPECT_EQ(r.status, 200) << path << ": " << r.body;
  return nlohmann::json::parse(r.body, nullptr, false);
}

// Runs a command, returns its exit code and output (stdout + stderr).
inline int run_command(const std::string& cmd, std::string* output) {
  std::string full = cmd + " 2>&1";
  FILE* p = ::popen(full.c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  size_t n;
  output->clear();
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) output->append(buf, n);
  int st = ::pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

// Parses `name{labels} value` from Prometheus text (first sample of that name).
inline double metric_value(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (line.compare(0, name.size(), name) != 0) continue;
    const char next = line.size() > name.size() ? line[name.size()] : ' ';
    if (next != '{' && next != ' ') continue;
    return std::atof(line.c_str() + line.rfind(' ') + 1);
  }
  return -1;
}

// SSE `data:` payloads of a streamed body, in order ("[DONE]" included verbatim).
inline std::vector<std::string> sse_data(const std::string& body) {
  std::vector<std::string> out;
  std::istringstream in(body);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("data: ", 0) == 0) out.push_back(line.substr(6));
  return out;
}

}  // namespace strata::e2e
