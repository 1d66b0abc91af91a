// A minimal blocking HTTP/1.1 client over POSIX sockets for the server e2e tests: exact control
// of the bytes sent (invalid UTF-8, malformed JSON) and of the connection (hang up mid-stream).
// Header-only; no dependency beyond libc.
#pragma once

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace strata::e2e {

struct HttpResponse {
  int status = 0;                              // 0: no response (connection failed or closed early)
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;                            // de-chunked
  bool complete = false;                       // the whole body arrived
  std::string failure;  // when status is 0: what went wrong (connect, send, or what arrived)
};

// One connection; Connection: close, so the response ends at EOF (or at the last chunk).
class HttpConn {
 public:
  HttpConn() = default;
  HttpConn(const HttpConn&) = delete;
  ~HttpConn() { close(); }

  // `ip`: a numeric IPv4 or IPv6 address.
  bool connect(int port, const std::string& ip = "127.0.0.1") {
    const bool v6 = ip.find(':') != std::string::npos;
    fd_ = ::socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM, 0);
    if (fd_ < 0) {
      error_ = std::string("socket: ") + std::strerror(errno);
      return false;
    }
    sockaddr_storage a{};
    socklen_t len = 0;
    if (v6) {
      auto* a6 = reinterpret_cast<sockaddr_in6*>(&a);
      a6->sin6_family = AF_INET6;
      a6->sin6_port = htons(uint16_t(port));
      ::inet_pton(AF_INET6, ip.c_str(), &a6->sin6_addr);
      len = sizeof(sockaddr_in6);
    } else {
      auto* a4 = reinterpret_cast<sockaddr_in*>(&a);
      a4->sin_family = AF_INET;
      a4->sin_port = htons(uint16_t(port));
      ::inet_pton(AF_INET, ip.c_str(), &a4->sin_addr);
      len = sizeof(sockaddr_in);
    }
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), len) != 0) {
      error_ = std::string("connect: ") + std::strerror(errno);
      close();
      return false;
    }
    return true;
  }
  // `headers`: extra header lines ("Name: value").
  bool send_request(const std::string& method, const std::string& path, const std::string& body,
                    const std::string& content_type = "application/json",
                    const std::vector<std::string>& headers = {}) {
    std::string req = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
    for (const std::string& h : headers) req += h + "\r\n";
    if (!body.empty() || method == "POST")
      req += "Content-Type: " + content_type +
             "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
    req += "\r\n" + body;
    size_t off = 0;
    while (off < req.size()) {
      ssize_t n = ::send(fd_, req.data() + off, req.size() - off, MSG_NOSIGNAL);
      if (n <= 0) {
        error_ = std::string("send: ") + std::strerror(errno);
        return false;
      }
      off += size_t(n);
    }
    return true;
  }
  // Appends what arrives within `timeout_ms` to raw(); false on EOF/error.
  bool read_some(int timeout_ms) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) <= 0) return true;
    char buf[16384];
    ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
    if (n <= 0) return false;
    raw_.append(buf, size_t(n));
    return true;
  }
  // Reads until EOF or `deadline`; parses the response.
  HttpResponse read_response(std::chrono::steady_clock::time_point deadline) {
    bool open = true;
    while (open && std::chrono::steady_clock::now() < deadline && !body_complete())
      open = read_some(200);
    HttpResponse r = parse();
    if (r.status == 0)
      r.failure = std::to_string(raw_.size()) + " bytes arrived, then " +
                  (open ? "the deadline passed" : "the server closed the connection") +
                  (raw_.empty() ? "" : ": '" + raw_.substr(0, 200) + "'");
    return r;
  }
  // Why connect() or send_request() failed (errno's words).
  const std::string& error() const { return error_; }
  const std::string& raw() const { return raw_; }
  int fd() const { return fd_; }  // for tests that send bytes of their own
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  bool body_complete() const {
    size_t he = raw_.find("\r\n\r\n");
    if (he == std::string::npos) return false;
    const std::string head = lower(raw_.substr(0, he));
    if (head.find("transfer-encoding: chunked") != std::string::npos)
      return raw_.find("\r\n0\r\n\r\n", he) != std::string::npos;
    size_t cl = head.find("content-length:");
    if (cl == std::string::npos) return false;
    return raw_.size() - (he + 4) >= std::stoul(head.substr(cl + 15));
  }
  static std::string lower(std::string s) {
    for (auto& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
    return s;
  }
  HttpResponse parse() const {
    HttpResponse r;
    size_t he = raw_.find("\r\n\r\n");
    if (he == std::string::npos || raw_.compare(0, 5, "HTTP/") != 0) return r;
    r.status = std::stoi(raw_.substr(9, 3));
    size_t pos = raw_.find("\r\n") + 2;
    while (pos < he) {
      size_t eol = raw_.find("\r\n", pos);
      const std::string line = raw_.substr(pos, eol - pos);
      size_t colon = line.find(':');
      if (colon != std::string::npos) {
        std::string v = line.substr(colon + 1);
        while (!v.empty() && v[0] == ' ') v.erase(0, 1);
        r.headers[lower(line.substr(0, colon))] = v;
      }
      pos = eol + 2;
    }
    const std::string rest = raw_.substr(he + 4);
    if (r.headers["transfer-encoding"] == "chunked") {
      size_t p = 0;
      while (p < rest.size()) {
        size_t eol = rest.find("\r\n", p);
        if (eol == std::string::npos) break;
        const size_t len = std::stoul(rest.substr(p, eol - p), nullptr, 16);
        if (len == 0) {
          r.complete = true;
          break;
        }
        if (eol + 2 + len > rest.size()) break;
        r.body += rest.substr(eol + 2, len);
        p = eol + 2 + len + 2;
      }
    } else {
      r.body = rest;
      r.complete = r.headers.count("content-length") &&
                   rest.size() >= std::stoul(r.headers["content-length"]);
    }
    return r;
  }

  int fd_ = -1;
  std::string raw_;
  std::string error_;
};

inline HttpResponse http(int port, const std::string& method, const std::string& path,
                         const std::string& body = "", int timeout_s = 120,
                         const std::vector<std::string>& headers = {}) {
  HttpConn c;
  if (!c.connect(port) || !c.send_request(method, path, body, "application/json", headers)) {
    HttpResponse r;
    r.failure = c.error();
    return r;
  }
  return c.read_response(std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s));
}

}  // namespace strata::e2e
