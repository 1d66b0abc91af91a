// Child processes for the generate e2e tests: spawn the real binary with its output in files,
// wait for it with a deadline (a pidfd, no sleep loop), kill it.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

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

}  // namespace strata::testing_support
