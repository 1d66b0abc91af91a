// Child processes for the generate e2e tests: spawn the real binary with its output in files,
// wait for it with a deadline (a pidfd, no sleep loop), kill it; run a job to its end, or kill it
// again and again at moments the test picks (the kill-and-resume tests).
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

namespace strata::testing_support {

class Child {
 public:
  // Runs argv[0] with stdout and stderr appended to `log_path`.
  static Child spawn(const std::vector<std::string>& argv, const std::string& log_path) {
    Child c;
    c.pid_ = ::fork();
    if (c.pid_ == 0) {
      int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    c.pidfd_ = int(::syscall(SYS_pidfd_open, c.pid_, 0));
    return c;
  }
  // Runs `fn` in a forked child (for an in-test server); the child exits when fn returns.
  template <typename Fn>
  static Child fork_fn(Fn fn) {
    Child c;
    c.pid_ = ::fork();
    if (c.pid_ == 0) {
      fn();
      ::_exit(0);
    }
    c.pidfd_ = int(::syscall(SYS_pidfd_open, c.pid_, 0));
    return c;
  }

  Child() = default;
  Child(Child&& o) noexcept { *this = std::move(o); }
  Child& operator=(Child&& o) noexcept {
    std::swap(pid_, o.pid_);
    std::swap(pidfd_, o.pidfd_);
    return *this;
  }
  ~Child() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (pidfd_ >= 0) ::close(pidfd_);
  }

  // Waits up to `timeout_ms` (-1: forever). Returns the exit status (WEXITSTATUS, or 128 +
  // signal) once it exited, nullopt if still running at the deadline.
  std::optional<int> wait_for(int timeout_ms) {
    pollfd p{pidfd_, POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) == 0) return std::nullopt;
    return reap();
  }
  // SIGKILL and reap. Returns the exit status as wait_for does.
  int kill9() {
    ::kill(pid_, SIGKILL);
    return reap();
  }
  pid_t pid() const { return pid_; }

 private:
  int reap() {
    int st = 0;
    ::waitpid(pid_, &st, 0);
    pid_ = -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }
  pid_t pid_ = -1;
  int pidfd_ = -1;
};

// A loopback TCP port that was free a moment ago.
inline int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

inline int64_t count_lines(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::count(std::istreambuf_iterator<char>(in), {}, '\n');
}

// Waits (inotify on the directory, no polling loop) until done() holds or the child exits.
// Returns the child's exit status if it exited, nullopt otherwise.
inline std::optional<int> wait_until(Child& child, const std::string& dir,
                                     const std::function<bool()>& done) {
  const int fd = ::inotify_init1(IN_CLOEXEC);
  ::inotify_add_watch(fd, dir.c_str(), IN_MODIFY | IN_CREATE);
  std::optional<int> rc;
  char buf[4096];
  while (!done()) {
    pollfd p{fd, POLLIN, 0};
    ::poll(&p, 1, 100);  // also wakes to notice a child that exited without writing
    if (p.revents & POLLIN) (void)!::read(fd, buf, sizeof(buf));
    if ((rc = child.wait_for(0))) break;
  }
  ::close(fd);
  return rc;
}

// Until `path` (in `dir`) has `lines` complete lines.
inline std::optional<int> wait_for_lines(Child& child, const std::string& dir,
                                         const std::string& path, int64_t lines) {
  return wait_until(child, dir, [&] { return count_lines(path) >= lines; });
}

inline bool file_contains(const std::string& path, const std::string& text) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {}).find(text) != std::string::npos;
}
// Until `path` (in `dir`) contains `text`.
inline std::optional<int> wait_for_text(Child& child, const std::string& dir,
                                        const std::string& path, const std::string& text) {
  return wait_until(child, dir, [&] { return file_contains(path, text); });
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Runs `argv` to its end (at most `timeout_ms`): a success when it exits 0; else the failure says
// how it ended and shows its log.
inline ::testing::AssertionResult runs_to_end(const std::vector<std::string>& argv,
                                              const std::string& log, int timeout_ms = 300000) {
  Child c = Child::spawn(argv, log);
  const std::optional<int> rc = c.wait_for(timeout_ms);
  if (!rc) return ::testing::AssertionFailure() << "still running after " << timeout_ms << " ms";
  if (*rc != 0)
    return ::testing::AssertionFailure() << "exit " << *rc << "; log:\n" << read_file(log);
  return ::testing::AssertionSuccess();
}

// Kills `argv` with SIGKILL again and again: up to `max_kills` times a run is started and
// `moment(child, k)` waits for run k's moment (returning the exit status when the run ended
// first, else nullopt); then the run is killed, counted in *kills, and `after_kill` (if any)
// looks at what it left. A run that ends on its own ends the loop, and must have exited 0.
inline ::testing::AssertionResult kill_at_moments(
    const std::vector<std::string>& argv, const std::string& log, int max_kills,
    const std::function<std::optional<int>(Child&, int)>& moment, int* kills,
    const std::function<void()>& after_kill = {}) {
  for (int k = 0; k < max_kills; ++k) {
    Child c = Child::spawn(argv, log);
    if (const std::optional<int> rc = moment(c, k)) {
      if (*rc != 0)
        return ::testing::AssertionFailure()
               << "the job failed before it was killed (exit " << *rc << "); log:\n"
               << read_file(log);
      break;  // finished early: nothing left to kill
    }
    c.kill9();
    ++*kills;
    if (after_kill) after_kill();
  }
  return ::testing::AssertionSuccess();
}

}  // namespace strata::testing_support
