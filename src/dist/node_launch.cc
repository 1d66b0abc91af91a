#include "dist/node_launch.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>

#include "core/log.h"

namespace strata {

const std::vector<std::string>& launcher_rank_variables() {
  static const std::vector<std::string> kVars = {"OMPI_COMM_WORLD_RANK",
                                                 "OMPI_COMM_WORLD_SIZE",
                                                 "OMPI_COMM_WORLD_LOCAL_RANK",
                                                 "PMI_RANK",
                                                 "PMI_SIZE",
                                                 "MPI_LOCALRANKID",
                                                 "SLURM_PROCID",
                                                 "SLURM_NTASKS",
                                                 "SLURM_LOCALID"};
  return kVars;
}

Status check_dist_init_addr(const std::string& addr) {
  auto bad = [&] {
    return invalid_argument("--dist-init-addr '{}': expected HOST:PORT (IPv6: [ADDR]:PORT)", addr);
  };
  const size_t colon = addr.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == addr.size()) return bad();
  const std::string host = addr.substr(0, colon), port = addr.substr(colon + 1);
  if (host.front() == '[' ? host.back() != ']' || host.size() < 3
                          : host.find(':') != std::string::npos)
    return bad();
  if (port.find_first_not_of("0123456789") != std::string::npos || port.size() > 5) return bad();
  const int p = std::atoi(port.c_str());
  if (p < 1 || p > 65535)
    return invalid_argument("--dist-init-addr '{}': port {} is not in [1, 65535]", addr, p);
  return Status();
}

StatusOr<std::vector<RankProcess>> plan_node_ranks(const NodeLaunchFlags& f, int tp_size,
                                                   Device device, const std::string& nccl_id_hex) {
  if (f.nnodes < 1) return invalid_argument("--nnodes must be >= 1, got {}", f.nnodes);
  if (f.node_rank < 0 || f.node_rank >= f.nnodes)
    return invalid_argument("--node-rank {} is not in [0, --nnodes {})", f.node_rank, f.nnodes);
  if (f.nnodes == 1) return std::vector<RankProcess>();
  if (device != Device::kCuda)
    return invalid_argument(
        "--nnodes {}: ranks on several nodes talk through NCCL: give --device cuda (cpu ranks "
        "are threads of one process)",
        f.nnodes);
  if (tp_size % f.nnodes != 0)
    return invalid_argument(
        "--tp-size {} does not split over --nnodes {} (each node runs --tp-size / --nnodes "
        "ranks, one per GPU)",
        tp_size, f.nnodes);
  if (f.dist_init_addr.empty())
    return invalid_argument(
        "--nnodes {} needs --dist-init-addr HOST:PORT (node 0's address, the same on every "
        "node: NCCL's bootstrap)",
        f.nnodes);
  STRATA_RETURN_IF_ERROR(check_dist_init_addr(f.dist_init_addr));
  const int local = tp_size / f.nnodes;
  std::vector<RankProcess> plan;
  for (int i = 0; i < local; ++i) {
    RankProcess p;
    p.rank = f.node_rank * local + i;
    p.local_rank = i;
    p.set_env = {{"RANK", std::to_string(p.rank)},
                 {"WORLD_SIZE", std::to_string(tp_size)},
                 {"LOCAL_RANK", std::to_string(i)},
                 {"LOCAL_WORLD_SIZE", std::to_string(local)},
                 {"NCCL_COMM_ID", f.dist_init_addr}};
    if (!nccl_id_hex.empty()) p.set_env.emplace_back("STRATA_NCCL_ID", nccl_id_hex);
    p.unset_env = launcher_rank_variables();
    plan.push_back(std::move(p));
  }
  return plan;
}

namespace {

int exit_code(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// In the child: its own signal mask and environment, then the same binary. Never returns.
[[noreturn]] void exec_rank(const std::vector<std::string>& argv, const RankProcess& p,
                            const sigset_t& mask) {
  pthread_sigmask(SIG_SETMASK, &mask, nullptr);
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);  // a launcher that dies takes its ranks with it
  for (const std::string& v : p.unset_env) ::unsetenv(v.c_str());
  for (const auto& [k, v] : p.set_env) ::setenv(k.c_str(), v.c_str(), 1);
  std::vector<char*> cargv;
  for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  ::execv(cargv[0], cargv.data());
  std::_Exit(127);
}

}  // namespace

int run_rank_processes(const std::vector<std::string>& argv, const std::vector<RankProcess>& plan,
                       double grace_s) {
  using Clock = std::chrono::steady_clock;
  sigset_t signals, old;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, &old);
  struct Child {
    pid_t pid;
    int rank;
    bool alive;
  };
  std::vector<Child> children;
  int result = 0;
  bool stopping = false;
  Clock::time_point stop_since{};
  auto stop_all = [&](int sig) {
    for (const Child& c : children)
      if (c.alive) ::kill(c.pid, sig);
    if (!stopping) stop_since = Clock::now();
    stopping = true;
  };
  for (const RankProcess& p : plan) {
    const pid_t pid = ::fork();
    if (pid == 0) exec_rank(argv, p, old);
    if (pid < 0) {
      LOG_ERROR("cannot start rank {}: fork failed", p.rank);
      result = 1;
      stop_all(SIGTERM);
      break;
    }
    children.push_back(Child{pid, p.rank, true});
  }
  bool killed = false;
  for (;;) {
    bool any_alive = false;
    for (Child& c : children) {
      if (!c.alive) continue;
      int status = 0;
      if (::waitpid(c.pid, &status, WNOHANG) != c.pid) {
        any_alive = true;
        continue;
      }
      c.alive = false;
      const int code = exit_code(status);
      if (code == 0) continue;
      if (result == 0) result = code;
      if (!stopping) {
        LOG_ERROR("rank {} exited with status {}: stopping this node's other ranks", c.rank, code);
        stop_all(SIGTERM);
      }
    }
    if (!any_alive) break;
    if (stopping && !killed && Clock::now() - stop_since > std::chrono::duration<double>(grace_s)) {
      LOG_WARN("ranks still running {:.0f} s after SIGTERM: killing them", grace_s);
      stop_all(SIGKILL);
      killed = true;
    }
    const timespec tick{0, 100 * 1000 * 1000};
    siginfo_t info;
    const int sig = sigtimedwait(&signals, &info, &tick);
    if (sig > 0) {
      LOG_INFO("received {}: passing it to this node's ranks",
               sig == SIGTERM ? "SIGTERM" : "SIGINT");
      stop_all(sig);
    }
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  return result;
}

}  // namespace strata
