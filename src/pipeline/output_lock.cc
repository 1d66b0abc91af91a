#include "pipeline/output_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <nlohmann/json.hpp>

namespace strata {
namespace {

int64_t unix_now() { return int64_t(std::time(nullptr)); }

std::string utc_time(int64_t unix_s) {
  std::time_t t = std::time_t(unix_s);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

// The holder record in the lock file; null when empty or unreadable (a holder that is still
// writing it, or a file from an older strata).
nlohmann::json read_record(int fd) {
  std::string text;
  char buf[1024];
  for (off_t off = 0;;) {
    const ssize_t n = ::pread(fd, buf, sizeof(buf), off);
    if (n <= 0) break;
    text.append(buf, size_t(n));
    off += n;
    if (text.size() > 65536) break;
  }
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  return j.is_object() ? j : nlohmann::json();
}

// "pid 123 on host node7 (since ..., heartbeat 3s ago)", or what is known of it.
std::string describe_holder(const nlohmann::json& r) {
  if (r.is_null() || r.value("released", false)) return "a job that has not written its name yet";
  std::string s = fmt::format("pid {} on host {}", r.value("pid", int64_t(-1)),
                              r.value("host", std::string("?")));
  if (r.contains("started"))
    s += fmt::format(" (since {}", utc_time(r.value("started", int64_t(0))));
  if (r.contains("heartbeat"))
    s += fmt::format(", heartbeat {}s ago",
                     std::max<int64_t>(0, unix_now() - r.value("heartbeat", int64_t(0))));
  if (r.contains("started")) s += ")";
  return s;
}

}  // namespace

std::string local_host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "?";
  return buf;
}

StatusOr<std::unique_ptr<OutputLock>> OutputLock::acquire(const std::string& results_path) {
  const std::string path = results_path + ".lock";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0)
    return internal_error("cannot open the lock file '{}': {}", path, std::strerror(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err == EWOULDBLOCK) {
      // The holder writes its record right after its flock: a job started at the same moment may
      // look in between (an empty file, or a finished job's released record). Wait a moment for
      // the name rather than report an unknown holder.
      nlohmann::json holder_record = read_record(fd);
      for (int i = 0; i < 40 && (holder_record.is_null() || holder_record.value("released", false));
           ++i) {
        ::usleep(25 * 1000);
        holder_record = read_record(fd);
      }
      const std::string holder = describe_holder(holder_record);
      ::close(fd);
      return failed_precondition(
          "{} is being written by another job: {}. One job per output: wait for it to finish, or "
          "give "
          "this one another --output (lock file {})",
          results_path, holder, path);
    }
    ::close(fd);
    return failed_precondition(
        "cannot lock '{}': {}. This filesystem gives no file locks (Lustre: mount with -o flock; "
        "NFS: "
        "without nolock); strata will not write an output another job could write at the same time",
        path, std::strerror(err));
  }
  // flock granted. A recent heartbeat from another host means the filesystem keeps locks local to
  // each host (NFS local_lock, Lustre localflock): that job is alive and would collide with us.
  const nlohmann::json prev = read_record(fd);
  if (!prev.is_null() && !prev.value("released", true) &&
      prev.value("host", std::string()) != local_host_name() &&
      double(unix_now() - prev.value("heartbeat", int64_t(0))) < kForeignHeartbeatSeconds) {
    ::close(fd);
    return failed_precondition(
        "{} is being written by another job: {}. This filesystem's locks are not shared between "
        "hosts "
        "(NFS local_lock/nolock, Lustre localflock); if that job is dead, wait {:.0f}s or remove "
        "{}",
        results_path, describe_holder(prev), kForeignHeartbeatSeconds, path);
  }
  std::unique_ptr<OutputLock> lock(new OutputLock(path, fd));
  lock->started_unix_ = unix_now();
  lock->write_record(/*released=*/false);
  return lock;
}

OutputLock::~OutputLock() {
  if (fd_ < 0) return;
  write_record(/*released=*/true);
  ::close(fd_);
}

void OutputLock::heartbeat() {
  const auto now = std::chrono::steady_clock::now();
  if (now - last_beat_ < std::chrono::duration<double>(kLockHeartbeatSeconds)) return;
  write_record(/*released=*/false);
}

// One pwrite of a small record at offset 0, then a truncate to its length: a reader sees the old
// or the new record, or (rarely, mid-write) text that does not parse, which it reports as unknown.
void OutputLock::write_record(bool released) {
  last_beat_ = std::chrono::steady_clock::now();
  const std::string text = nlohmann::json{{"pid", int64_t(::getpid())},
                                          {"host", local_host_name()},
                                          {"started", started_unix_},
                                          {"heartbeat", unix_now()},
                                          {"released", released}}
                               .dump() +
                           "\n";
  if (::pwrite(fd_, text.data(), text.size(), 0) == ssize_t(text.size()))
    (void)!::ftruncate(fd_, off_t(text.size()));
}

}  // namespace strata
