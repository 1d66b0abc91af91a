// RequestStream: the thread-safe queue between the engine thread (which calls a request's
// StreamCallback) and the HTTP thread that answers it. One stream serves every choice of an HTTP
// request (n > 1, or several prompts): events carry the choice index. push() is O(1) under a
// mutex, so the engine thread never waits on a slow client.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "engine/engine.h"

namespace strata {

struct ChoiceEvent {
  int choice = 0;
  StreamEvent event;
};

class RequestStream {
 public:
  explicit RequestStream(int num_choices);

  // Engine thread (or the HTTP thread for a submit that failed).
  void push(int choice, const StreamEvent& event);
  // HTTP thread: waits up to `timeout` for events and returns all that are queued (empty on
  // timeout).
  std::vector<ChoiceEvent> pop(std::chrono::milliseconds timeout);
  // True once every choice has pushed its finished event.
  bool all_finished() const;
  // Called after every push (from the pushing thread, outside the lock): an event-driven server
  // wakes the connection that answers this stream. May be set at any time (then check for events).
  void set_notify(std::function<void()> notify);
  int num_choices() const { return num_choices_; }

 private:
  const int num_choices_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<ChoiceEvent> queue_;
  int finished_ = 0;
  std::shared_ptr<const std::function<void()>> notify_;  // under mu_
};

}  // namespace strata
