// Client-side balancing over the replicas of one model (`strata generate --server A --server B`):
// which replica gets the next request, and which are down. The HTTP side is server_target.h; this
// is the bookkeeping alone, pure (time is passed in) and thread-safe, so it is tested directly.
//
//   - Least outstanding requests: a request goes to the replica with the fewest of this client's
//     requests in flight (ties rotate), so a slow or busy replica gets fewer.
//   - A replica that does not answer (connection refused or reset, 502/503) is marked down and
//     gets no requests; the caller retries those requests on another replica at once.
//   - After a backoff (RetryPolicy's delays, doubling per failed try, capped) one request probes
//     it (a circuit breaker's half-open state): an answer brings it back, another failure doubles
//     the wait. Requests already in flight when it went down do not extend the wait.
#pragma once

#include <cstddef>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "pipeline/prompt_target.h"

namespace strata {

// One request's hold on a replica, from acquire() to release().
struct ReplicaTicket {
  size_t replica = 0;
  bool probe = false;  // the one request sent to a down replica whose wait is over
};

enum class ReplicaResult {
  kAnswered,  // any HTTP reply but 502/503 (a 4xx or 500 is the request's problem, not the
              // replica's)
  kDown,      // no reply, or 502/503
};

enum class ReplicaChange { kNone, kWentDown, kCameBack };

class ReplicaSet {
 public:
  ReplicaSet(std::vector<std::string> names, const RetryPolicy& policy);

  // The replica for one request at time `now_s` (any monotonic clock, in seconds), counted as
  // outstanding until release(); nullopt when every replica is down and waiting (or being probed).
  std::optional<ReplicaTicket> acquire(double now_s);
  // The request's end. Says whether the replica changed state, for the log.
  ReplicaChange release(const ReplicaTicket& ticket, ReplicaResult result, double now_s);

  // When a down replica may next be probed (the earliest); nullopt when none is waiting (all up,
  // or the down ones are being probed right now).
  std::optional<double> next_probe_s() const;
  // The wait a replica gets after its `failures`-th failed try in a row: policy's
  // min(max, initial x multiplier^(failures-1)), without jitter.
  double down_delay_s(int failures) const;

  size_t size() const { return replicas_.size(); }
  size_t up_count() const;
  int outstanding(size_t replica) const;
  bool is_down(size_t replica) const;
  const std::string& name(size_t replica) const { return replicas_[replica].name; }

 private:
  struct Replica {
    std::string name;
    int outstanding = 0;
    bool down = false;
    bool probing = false;
    int failures = 0;  // failed tries in a row while down
    double down_until_s = 0;
  };
  RetryPolicy policy_;
  mutable std::mutex mu_;
  std::vector<Replica> replicas_;
  size_t cursor_ = 0;  // where the search for the least loaded starts: rotates ties
};

}  // namespace strata
