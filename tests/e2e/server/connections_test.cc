// Health that stays true under connections: with 1,000 idle and 1,000 half-header connections
// open, /health and /metrics still answer at once (the event loop holds no thread per
// connection; bench/health_under_connections.py prints the p99); beyond --max-connections a
// generation request gets a clean 503 while /health still answers; a second server on the same
// port is refused.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "server_process.h"

namespace strata::e2e {
namespace {

using nlohmann::json;

// Each connection is a descriptor here too: raise this process's soft limit to the hard one.
bool raise_fd_limit(rlim_t want) {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return false;
  lim.rlim_cur = lim.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &lim);
  return lim.rlim_cur == RLIM_INFINITY || lim.rlim_cur >= want;
}

TEST(ServeConnectionsTest, HealthAnswersWithThousandsOfIdleAndHalfSentConnections) {
  if (!raise_fd_limit(2400)) GTEST_SKIP() << "the open-file limit is below 2,400";
  ServerProcess server;
  ASSERT_TRUE(server.start({"--max-connections", "4000"})) << server.log();
  std::vector<std::unique_ptr<HttpConn>> held;
  for (int i = 0; i < 2000; ++i) {
    auto c = std::make_unique<HttpConn>();
    ASSERT_TRUE(c->connect(server.port())) << "connection " << i;
    if (i % 2 == 1) {  // half a header, then silence
      const std::string half = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Ty";
      ASSERT_EQ(::send(c->fd(), half.data(), half.size(), MSG_NOSIGNAL), ssize_t(half.size()));
    }
    held.push_back(std::move(c));
  }
  double worst_s = 0;
  for (int i = 0; i < 20; ++i) {
    const auto start = std::chrono::steady_clock::now();
    HttpResponse r = http(server.port(), "GET", i % 2 ? "/metrics" : "/health", "", 30);
    worst_s = std::max(
        worst_s, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    EXPECT_EQ(r.status, 200) << r.body;
  }
  std::printf(
      "with 1,000 idle + 1,000 half-header connections: the slowest of 20 /health and /metrics "
      "took %.1f ms\n",
      worst_s * 1e3);
  EXPECT_LT(worst_s, 10.0)
      << "a generous bound: it answers at once, not after a connection times out";
  held.clear();
  EXPECT_EQ(server.stop(), 0) << server.log();
}

TEST(ServeConnectionsTest, BeyondMaxConnectionsGenerationGets503AndHealthStillAnswers) {
  ServerProcess server;
  ASSERT_TRUE(server.start({"--max-connections", "8"})) << server.log();
  std::vector<std::unique_ptr<HttpConn>> held;
  for (int i = 0; i < 12; ++i) {
    held.push_back(std::make_unique<HttpConn>());
    ASSERT_TRUE(held.back()->connect(server.port()));
  }
  ASSERT_TRUE(poll_until([&] { return http(server.port(), "GET", "/health").status == 200; }, 30));
  HttpResponse r =
      http(server.port(), "POST", "/v1/completions", R"({"prompt":"hi","max_tokens":2})");
  EXPECT_EQ(r.status, 503) << r.body;
  EXPECT_EQ(r.headers["retry-after"], "1");
  EXPECT_EQ(json::parse(r.body)["error"]["code"], "too_many_connections");
  EXPECT_NE(r.body.find("--max-connections 8"), std::string::npos) << r.body;
  held.clear();
  ASSERT_TRUE(poll_until(
      [&] {
        return http(server.port(), "POST", "/v1/completions", R"({"prompt":"hi","max_tokens":2})")
                   .status == 200;
      },
      30));
  EXPECT_EQ(server.stop(), 0) << server.log();
}

// A second server on a port in use fails at start with the reason, as any server does: with
// SO_REUSEPORT both would listen and the kernel would deal the connections between them (half of
// a user's traffic, and the health checks, going to a server they did not mean).
TEST(ServeConnectionsTest, SecondServerOnTheSamePortIsRefused) {
  ServerProcess first;
  ASSERT_TRUE(first.start({})) << first.log();
  const std::string port = std::to_string(first.port());
  std::string out;
  // `timeout`: a second server that does listen serves until killed (then the code is 124).
  EXPECT_EQ(run_command("timeout 60 " + std::string(STRATA_BINARY) + " serve --model-path " +
                            house_llama() + " --host 127.0.0.1 --port " + port,
                        &out),
            1)
      << out;
  EXPECT_NE(out.find("cannot listen on 127.0.0.1:" + port), std::string::npos) << out;
  EXPECT_EQ(out.find("KV cache:"), std::string::npos) << "said after loading the model: " << out;
  EXPECT_NE(port_listeners(first.port()).find("held by pid " + std::to_string(first.pid())),
            std::string::npos)
      << port_listeners(first.port());
  EXPECT_EQ(http(first.port(), "GET", "/health").status, 200);
  EXPECT_EQ(first.stop(), 0) << first.log();
}

// `--host ::` listens on every address of both families, as SGLang's listener does (an
// IPv6-only socket would refuse every IPv4 client); the log writes the address in brackets.
TEST(ServeConnectionsTest, EveryIpv6AddressServesIpv4ClientsToo) {
  // A machine without IPv6 cannot listen on "::" at all; one without the ::1 loopback can, and
  // then only the IPv4 half is checked.
  const int v6_socket = ::socket(AF_INET6, SOCK_STREAM, 0);
  if (v6_socket < 0) GTEST_SKIP() << "no IPv6 on this machine";
  ::close(v6_socket);
  HttpConn probe;
  const bool ipv6 = probe.connect(1, "::1") || probe.error().find("refused") != std::string::npos;
  ServerProcess server;
  ASSERT_TRUE(server.start({"--host", "::"})) << server.log();
  EXPECT_NE(server.log().find("on http://[::]:" + std::to_string(server.port()) + " "),
            std::string::npos)
      << server.log();
  auto health = [&](const std::string& ip) {
    HttpConn c;
    if (!c.connect(server.port(), ip) || !c.send_request("GET", "/health", "")) return 0;
    return c.read_response(std::chrono::steady_clock::now() + std::chrono::seconds(30)).status;
  };
  EXPECT_EQ(health("127.0.0.1"), 200);
  if (ipv6) {
    EXPECT_EQ(health("::1"), 200);
  }
  EXPECT_EQ(server.stop(), 0) << server.log();
  if (!ipv6) GTEST_SKIP() << "no IPv6 loopback here: checked the IPv4 half only";
}

}  // namespace
}  // namespace strata::e2e
