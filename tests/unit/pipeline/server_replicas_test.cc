// ServerTarget over several replicas, against small in-process OpenAI fakes (cpp-httplib): requests
// spread over healthy replicas; a replica that refuses connections or answers 503 is skipped at no
// attempt's cost; requests cut off by a replica dying mid-request finish on another; every task
// ends exactly once; replicas of different models are refused.
#include <gtest/gtest.h>

#if __has_include(<httplib.h>)
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "pipeline/server_target.h"

namespace strata {
namespace {

// A fake replica in a thread: answers chat completions ("echo <content>") after `delay_ms`.
class FakeReplica {
 public:
  enum class Mode { kHealthy, kUnavailable };
  explicit FakeReplica(Mode mode, std::string model = "fake-model", int delay_ms = 5)
      : mode_(mode), model_(std::move(model)), delay_ms_(delay_ms) {
    srv_.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(nlohmann::json({{"data", {{{"id", model_}}}}}).dump(), "application/json");
    });
    srv_.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
      ++requests;
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms_));
      if (mode_ == Mode::kUnavailable) {
        res.status = 503;
        res.set_content(R"({"error":{"message":"draining"}})", "application/json");
        return;
      }
      auto body = nlohmann::json::parse(req.body);
      nlohmann::json reply = {
          {"choices",
           {{{"message",
              {{"role", "assistant"},
               {"content", "echo " + body["messages"].back()["content"].get<std::string>()}}},
             {"finish_reason", "stop"}}}},
          {"usage", {{"prompt_tokens", 3}, {"completion_tokens", 2}}}};
      res.set_content(reply.dump(), "application/json");
    });
    port_ = srv_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { srv_.listen_after_bind(); });
    // stop() is a no-op until the loop runs: wait for it (this cpp-httplib has no
    // wait_until_ready).
    while (!srv_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~FakeReplica() {
    srv_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::atomic<int> requests{0};

 private:
  Mode mode_;
  std::string model_;
  int delay_ms_;
  httplib::Server srv_;
  int port_ = 0;
  std::thread thread_;
};

// A replica that dies mid-request, as its clients see it: it accepts each connection, reads the
// request and closes the connection without a reply.
class DroppingReplica {
 public:
  DroppingReplica() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    ::listen(fd_, 64);
    socklen_t len = sizeof(a);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] {
      char buf[4096];
      while (true) {
        const int c = ::accept(fd_, nullptr, nullptr);
        if (c < 0) return;  // closed by the destructor
        if (::read(c, buf, sizeof(buf)) > 0) ++requests;
        ::close(c);
      }
    });
  }
  ~DroppingReplica() {
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::atomic<int> requests{0};

 private:
  int fd_ = -1, port_ = 0;
  std::thread thread_;
};

// A port nobody listens on: connections are refused.
std::string dead_url() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);  // bound, never listened: refused
  return "http://127.0.0.1:" + std::to_string(ntohs(a.sin_port));
}

std::vector<PromptRecord> records(int n) {
  std::vector<PromptRecord> out;
  for (int i = 0; i < n; ++i) {
    PromptRecord r;
    r.id = "r" + std::to_string(i);
    r.messages = nlohmann::json::array({{{"role", "user"}, {"content", "q" + std::to_string(i)}}});
    out.push_back(std::move(r));
  }
  return out;
}

ServerConfig config(std::vector<std::string> urls) {
  ServerConfig c;
  c.urls = std::move(urls);
  c.concurrency = 8;
  c.retry.initial_delay_s = 0.01;
  c.retry.max_delay_s = 0.05;
  c.retry.server_down_timeout_s = 20;
  return c;
}

// Runs every record through the target; returns the outcomes by id (each must come exactly once).
std::map<std::string, GenerationOutcome> run_all(ServerTarget& target,
                                                 const std::vector<PromptRecord>& recs) {
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, GenerationOutcome> out;
  int calls = 0;
  for (const auto& r : recs) {
    target.start({.dataset = "d", .record = &r, .seed = 1}, [&, id = r.id](GenerationOutcome o) {
      std::lock_guard<std::mutex> lk(mu);
      EXPECT_TRUE(out.emplace(id, std::move(o)).second) << id << " ended twice";
      ++calls;
      cv.notify_one();
    });
  }
  std::unique_lock<std::mutex> lk(mu);
  EXPECT_TRUE(cv.wait_for(lk, std::chrono::seconds(30), [&] { return calls == int(recs.size()); }));
  return out;
}

TEST(ServerReplicas, HealthyReplicasShareTheWork) {
  FakeReplica a(FakeReplica::Mode::kHealthy), b(FakeReplica::Mode::kHealthy);
  auto target = ServerTarget::create(config({a.url(), b.url()}));
  ASSERT_TRUE(target.ok()) << target.status().message();
  const auto recs = records(80);
  const auto out = run_all(**target, recs);
  ASSERT_EQ(out.size(), recs.size());
  for (const auto& [id, o] : out) {
    EXPECT_EQ(o.kind, OutcomeKind::kDone) << id << ": " << o.error;
    EXPECT_EQ(o.text, "echo q" + id.substr(1));
  }
  EXPECT_EQ(a.requests + b.requests, 80);
  EXPECT_GE(a.requests, 20)
      << "least outstanding should spread 80 requests over two equal replicas";
  EXPECT_GE(b.requests, 20);
  EXPECT_EQ((*target)->progress_note(), "replicas 2/2 up");
}

TEST(ServerReplicas, RefusingAndUnavailableReplicasCostNoAttempts) {
  FakeReplica good(FakeReplica::Mode::kHealthy), draining(FakeReplica::Mode::kUnavailable);
  auto target = ServerTarget::create(config({dead_url(), draining.url(), good.url()}));
  ASSERT_TRUE(target.ok()) << target.status().message();
  const auto recs = records(40);
  const auto out = run_all(**target, recs);
  ASSERT_EQ(out.size(), recs.size());
  for (const auto& [id, o] : out) {
    EXPECT_EQ(o.kind, OutcomeKind::kDone) << id << ": " << o.error;
    EXPECT_EQ(o.attempts, 1) << id;  // refused / 503 elsewhere are not attempts
  }
  EXPECT_EQ(good.requests, 40);
  EXPECT_LE(draining.requests, 10) << "a replica answering 503 is marked down, not hammered";
  EXPECT_EQ((*target)->progress_note(), "replicas 1/3 up");
}

TEST(ServerReplicas, RequestsCutOffByADyingReplicaFinishOnAnother) {
  FakeReplica good(FakeReplica::Mode::kHealthy, "fake-model", 20);
  DroppingReplica dying;
  ServerConfig c = config({dying.url(), good.url()});
  c.model = "fake-model";
  auto target = ServerTarget::create(c);
  ASSERT_TRUE(target.ok()) << target.status().message();
  const auto recs = records(30);
  const auto out = run_all(**target, recs);
  ASSERT_EQ(out.size(), recs.size());
  for (const auto& [id, o] : out) EXPECT_EQ(o.kind, OutcomeKind::kDone) << id << ": " << o.error;
  EXPECT_GE(dying.requests, 1) << "the dying replica got no request: nothing was cut off";
  EXPECT_EQ(good.requests, 30);
}

TEST(ServerReplicas, ReplicasOfDifferentModelsAreRefused) {
  FakeReplica a(FakeReplica::Mode::kHealthy, "model-a"), b(FakeReplica::Mode::kHealthy, "model-b");
  auto target = ServerTarget::create(config({a.url(), b.url()}));
  ASSERT_FALSE(target.ok());
  EXPECT_NE(target.status().message().find("serves model-b, not model-a"), std::string::npos)
      << target.status().message();
}

}  // namespace
}  // namespace strata

#else
TEST(ServerReplicas, NeedsCppHttplib) { GTEST_SKIP() << "cpp-httplib is not installed"; }
#endif
