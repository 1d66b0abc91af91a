#include "pipeline/replicas.h"

#include <algorithm>
#include <cmath>

namespace strata {

ReplicaSet::ReplicaSet(std::vector<std::string> names, const RetryPolicy& policy)
    : policy_(policy) {
  for (auto& n : names) replicas_.push_back(Replica{.name = std::move(n)});
}

double ReplicaSet::down_delay_s(int failures) const {
  const double d =
      policy_.initial_delay_s * std::pow(policy_.multiplier, std::max(0, failures - 1));
  return std::min(policy_.max_delay_s, d);
}

std::optional<ReplicaTicket> ReplicaSet::acquire(double now_s) {
  std::lock_guard<std::mutex> lk(mu_);
  const size_t n = replicas_.size();
  std::optional<size_t> best;
  for (size_t i = 0; i < n; ++i) {
    const size_t r = (cursor_ + i) % n;
    const Replica& c = replicas_[r];
    const bool usable = !c.down || (!c.probing && now_s >= c.down_until_s);
    if (usable && (!best || c.outstanding < replicas_[*best].outstanding)) best = r;
  }
  if (!best) return std::nullopt;
  cursor_ = (*best + 1) % n;
  Replica& chosen = replicas_[*best];
  ++chosen.outstanding;
  const bool probe = chosen.down;
  if (probe) chosen.probing = true;
  return ReplicaTicket{.replica = *best, .probe = probe};
}

ReplicaChange ReplicaSet::release(const ReplicaTicket& t, ReplicaResult result, double now_s) {
  std::lock_guard<std::mutex> lk(mu_);
  Replica& r = replicas_[t.replica];
  --r.outstanding;
  if (t.probe) r.probing = false;
  if (result == ReplicaResult::kAnswered) {
    if (!r.down) return ReplicaChange::kNone;
    r.down = false;
    r.failures = 0;
    return ReplicaChange::kCameBack;
  }
  if (!r.down) {
    r.down = true;
    r.failures = 1;
    r.down_until_s = now_s + down_delay_s(r.failures);
    return ReplicaChange::kWentDown;
  }
  // Already down: only the probe's failure lengthens the wait, not requests that were in flight
  // when it went down and fail one by one now.
  if (t.probe) r.down_until_s = now_s + down_delay_s(++r.failures);
  return ReplicaChange::kNone;
}

std::optional<double> ReplicaSet::next_probe_s() const {
  std::lock_guard<std::mutex> lk(mu_);
  std::optional<double> next;
  for (const Replica& r : replicas_)
    if (r.down && !r.probing) next = std::min(next.value_or(r.down_until_s), r.down_until_s);
  return next;
}

size_t ReplicaSet::up_count() const {
  std::lock_guard<std::mutex> lk(mu_);
  return size_t(
      std::count_if(replicas_.begin(), replicas_.end(), [](const Replica& r) { return !r.down; }));
}

int ReplicaSet::outstanding(size_t replica) const {
  std::lock_guard<std::mutex> lk(mu_);
  return replicas_[replica].outstanding;
}

bool ReplicaSet::is_down(size_t replica) const {
  std::lock_guard<std::mutex> lk(mu_);
  return replicas_[replica].down;
}

}  // namespace strata
