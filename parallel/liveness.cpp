// The run's liveness service (see liveness.hpp): a line protocol over TCP, rank 0 serving.
#include "parallel/liveness.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>

#include "core/error.hpp"
#include "core/switches.hpp"

namespace mtnlg::parallel {

double PauseClock::tick(double now) {
  const double gap = last_ < 0 ? 0 : now - last_;
  last_ = now;
  if (gap <= gap_s_) return 0;
  total_ += gap;
  return gap;
}

double monotonic_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

namespace {

double wall_clock() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Writes all of `text` to a socket that may be non-blocking: waits (at most 100 ms per
// try) while its buffer is full; gives up on an error or a peer that reads nothing.
bool send_all(int fd, const std::string& text) {
  size_t off = 0;
  for (int tries = 0; off < text.size() && tries < 20;) {
    const ssize_t n = ::send(fd, text.data() + off, text.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      off += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, 100);
      ++tries;
      continue;
    }
    return false;
  }
  return off == text.size();
}

// Splits the complete lines off the front of `buf`.
std::vector<std::string> take_lines(std::string& buf) {
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t nl; (nl = buf.find('\n', start)) != std::string::npos; start = nl + 1)
    lines.push_back(buf.substr(start, nl - start));
  buf.erase(0, start);
  return lines;
}

// Reads what is there; false when the peer closed the connection (or it failed).
bool read_some(int fd, std::string& buf) {
  char chunk[4096];
  for (;;) {
    const ssize_t n = ::recv(fd, chunk, sizeof chunk, MSG_DONTWAIT);
    if (n > 0) {
      buf.append(chunk, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    return false;  // 0: an orderly close; < 0: reset
  }
}

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL, 0) | O_NONBLOCK); }

}  // namespace

// ---- the server (rank 0) ----------------------------------------------------------------

struct LivenessServer::Impl {
  struct Client {
    int fd = -1;
    int64_t rank = -1;  // until its hello
    std::string in;
    double last_seen = 0;
    bool bye = false, silent_told = false, closed = false;
  };
  int listen_fd = -1, port = 0;
  double heartbeat_timeout_s = 0;
  std::thread thread;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> sent{0}, received{0};
  std::vector<Client> clients;
  std::vector<std::string> history;  // every line told: a client that says hello late hears them
  bool aborted = false;
  PauseClock pause;

  void tell(Client& c, const std::string& line) {
    if (c.closed) return;
    if (send_all(c.fd, line + "\n")) ++sent;
  }
  void broadcast(const std::string& line) {
    if (line != "closing") history.push_back(line);
    for (Client& c : clients)
      if (c.rank >= 0) tell(c, line);
  }
  void on_line(Client& c, const std::string& line, double now);
  void close_client(Client& c);
  void judge_silence(double now);
  void loop();
};

void LivenessServer::Impl::on_line(Client& c, const std::string& line, double now) {
  ++received;
  c.last_seen = now;
  if (line.rfind("hello ", 0) == 0) {
    c.rank = std::strtoll(line.c_str() + 6, nullptr, 10);
    for (const std::string& h : history) tell(c, h);
  } else if (line == "bye") {
    c.bye = true;
  } else if (line.rfind("abort ", 0) == 0) {
    if (aborted) return;  // the first rank to trip wins
    aborted = true;
    broadcast(fmt::format("abort {} {}", c.rank, line.substr(6)));
  } else if (line.rfind("state ", 0) == 0) {
    broadcast(fmt::format("state {} {}", c.rank, line.substr(6)));
  }
}

void LivenessServer::Impl::close_client(Client& c) {
  ::close(c.fd);
  c.closed = true;
  if (c.rank >= 0 && !c.bye) broadcast(fmt::format("dead {} {:.3f}", c.rank, wall_clock()));
}

void LivenessServer::Impl::judge_silence(double now) {
  if (heartbeat_timeout_s <= 0) return;
  for (Client& c : clients)
    if (c.rank >= 0 && !c.closed && !c.bye && !c.silent_told && now - c.last_seen > heartbeat_timeout_s) {
      c.silent_told = true;
      broadcast(fmt::format("silent {} {:.1f}", c.rank, now - c.last_seen));
    }
}

void LivenessServer::Impl::loop() {
  std::vector<pollfd> fds;
  while (!stop.load()) {
    fds.assign(1, pollfd{listen_fd, POLLIN, 0});
    for (const Client& c : clients) fds.push_back(pollfd{c.fd, POLLIN, 0});
    ::poll(fds.data(), fds.size(), 100);
    const double now = monotonic_now();
    if (pause.tick(now) > 0)  // this process was stopped: nobody's silence counts across it
      for (Client& c : clients) c.last_seen = now;
    for (size_t i = 1; i < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      Client& c = clients[i - 1];
      const bool open = read_some(c.fd, c.in);
      for (const std::string& line : take_lines(c.in)) on_line(c, line, now);
      if (!open) close_client(c);
    }
    std::erase_if(clients, [](const Client& c) { return c.closed; });
    if (fds[0].revents & POLLIN)
      for (int fd; (fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0;) {
        Client c;
        c.fd = fd;
        c.last_seen = now;
        clients.push_back(std::move(c));
      }
    judge_silence(now);
  }
  broadcast("closing");
  for (Client& c : clients) ::close(c.fd);
  clients.clear();
}

LivenessServer::LivenessServer(int64_t world, double heartbeat_timeout_s) : p_(std::make_unique<Impl>()) {
  // One socket per rank: raise the soft open-file limit to that (and some), up to the hard one.
  if (rlimit lim{}; ::getrlimit(RLIMIT_NOFILE, &lim) == 0) {
    const rlim_t want = static_cast<rlim_t>(world) + 256;
    if (lim.rlim_cur != RLIM_INFINITY && lim.rlim_cur < want) {
      lim.rlim_cur = lim.rlim_max == RLIM_INFINITY ? want : std::min(want, lim.rlim_max);
      ::setrlimit(RLIMIT_NOFILE, &lim);
    }
  }
  p_->heartbeat_timeout_s = heartbeat_timeout_s;
  p_->listen_fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (p_->listen_fd < 0) throw_runtime("the watchdog's liveness service: socket: {}", std::strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (::bind(p_->listen_fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(p_->listen_fd, 1024) != 0 ||
      ::getsockname(p_->listen_fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    const std::string why = std::strerror(errno);
    ::close(p_->listen_fd);
    throw_runtime("the watchdog's liveness service: cannot listen on a TCP port: {}", why);
  }
  p_->port = ntohs(a.sin_port);
  set_nonblocking(p_->listen_fd);
  p_->thread = std::thread([this] { p_->loop(); });
}

LivenessServer::~LivenessServer() {
  p_->stop = true;
  if (p_->thread.joinable()) p_->thread.join();
  ::close(p_->listen_fd);
}

int LivenessServer::port() const { return p_->port; }
LivenessStats LivenessServer::stats() const { return {p_->sent.load(), p_->received.load()}; }

// ---- the client (every rank) ------------------------------------------------------------

LivenessClient::LivenessClient(const std::string& host, int port, int64_t rank, double connect_s) : rank_(rank) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1)
    throw_runtime("the watchdog's liveness service: '{}' is not an IPv4 address (MTNLG_WATCHDOG_ADDR?)", host);
  const double t0 = monotonic_now();
  std::string why;
  for (;;) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ >= 0 && ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) break;
    why = std::strerror(errno);
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    if (monotonic_now() - t0 > connect_s)
      throw_runtime("the watchdog's liveness service at {}:{} (rank 0) is unreachable from rank {}: {}", host, port,
                    rank, why);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  set_nonblocking(fd_);
  send(fmt::format("hello {}", rank));
}

LivenessClient::~LivenessClient() {
  if (fd_ < 0) return;
  send("bye");
  ::close(fd_);
}

void LivenessClient::drop() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void LivenessClient::send(const std::string& line) {
  if (fd_ < 0) return;
  if (send_all(fd_, line + "\n")) ++sent_;
  last_sent_ = monotonic_now();
}

void LivenessClient::beat(double now) {
  if (now - last_sent_ >= 1.0) send("beat");
}

namespace {
LivenessEvent parse_event(const std::string& line) {
  std::istringstream in(line);
  std::string word;
  in >> word;
  LivenessEvent e;
  using K = LivenessEvent::Kind;
  if (word == "closing") return {K::closing, -1, 0, ""};
  in >> e.rank;
  if (word == "dead" || word == "silent") {
    e.kind = word == "dead" ? K::dead : K::silent;
    in >> e.seconds;
  } else {
    e.kind = word == "abort" ? K::abort : K::state;
    std::getline(in >> std::ws, e.text);
  }
  return e;
}
}  // namespace

std::vector<LivenessEvent> LivenessClient::poll() {
  std::vector<LivenessEvent> events;
  if (fd_ < 0) return events;
  const bool open = read_some(fd_, in_);
  for (const std::string& line : take_lines(in_)) {
    ++received_;
    events.push_back(parse_event(line));
    if (events.back().kind == LivenessEvent::Kind::closing) {
      drop();
      return events;
    }
  }
  if (!open) {
    drop();
    events.push_back({LivenessEvent::Kind::lost, 0, 0, ""});
  }
  return events;
}

// ---- addresses --------------------------------------------------------------------------

std::string liveness_host() {
  if (const auto e = switches::text(Switch::watchdog_addr); e && !e->empty()) {
    in_addr a{};
    if (::inet_pton(AF_INET, e->c_str(), &a) != 1)
      throw_input("MTNLG_WATCHDOG_ADDR=\"{}\": expected an IPv4 address of rank 0's host that every rank reaches", *e);
    return *e;
  }
  std::string found = "127.0.0.1";
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return found;
  for (ifaddrs* i = list; i; i = i->ifa_next)
    if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && (i->ifa_flags & IFF_UP) && !(i->ifa_flags & IFF_LOOPBACK)) {
      char buf[INET_ADDRSTRLEN] = {};
      ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, buf, sizeof buf);
      found = buf;
      break;
    }
  ::freeifaddrs(list);
  return found;
}

uint32_t ipv4_to_u32(const std::string& host) {
  in_addr a{};
  if (::inet_pton(AF_INET, host.c_str(), &a) != 1) throw_input("'{}' is not an IPv4 address", host);
  return ntohl(a.s_addr);
}

std::string u32_to_ipv4(uint32_t v) {
  in_addr a{};
  a.s_addr = htonl(v);
  char buf[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &a, buf, sizeof buf);
  return buf;
}

}  // namespace mtnlg::parallel
