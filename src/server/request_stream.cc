#include "server/request_stream.h"

namespace strata {

RequestStream::RequestStream(int num_choices) : num_choices_(num_choices) {}

void RequestStream::push(int choice, const StreamEvent& event) {
  std::shared_ptr<const std::function<void()>> notify;
  {
    std::lock_guard<std::mutex> lk(mu_);
    queue_.push_back(ChoiceEvent{choice, event});
    if (event.finished) ++finished_;
    notify = notify_;
  }
  cv_.notify_all();
  if (notify) (*notify)();
}

void RequestStream::set_notify(std::function<void()> notify) {
  std::lock_guard<std::mutex> lk(mu_);
  notify_ = std::make_shared<const std::function<void()>>(std::move(notify));
}

std::vector<ChoiceEvent> RequestStream::pop(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait_for(lk, timeout, [&] { return !queue_.empty(); });
  std::vector<ChoiceEvent> out(std::make_move_iterator(queue_.begin()),
                               std::make_move_iterator(queue_.end()));
  queue_.clear();
  return out;
}

bool RequestStream::all_finished() const {
  std::lock_guard<std::mutex> lk(mu_);
  return finished_ >= num_choices_;
}

}  // namespace strata
