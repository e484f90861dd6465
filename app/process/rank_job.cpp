// RankJob and WorldRankComm (rank_job.hpp).
#include "app/process/rank_job.hpp"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <tuple>
#include <utility>

#include "data/curation/text.hpp"
#include "data/preprocess.hpp"

namespace mtnlg::app {

void exit_agreed_failure(parallel::Communicator& world, const std::string& msg, int code, bool own) {
  auto say = [&] {
    std::fprintf(stderr, "mtnlg: error on rank %d: %s\n", static_cast<int>(world.rank()), msg.c_str());
    std::fflush(stderr);
  };
  if (own) say();
  world.barrier();
  if (!own) say();
  parallel::finalize_world();
  std::exit(code);
}

std::vector<char> WorldRankComm::all_to_all(const std::vector<std::span<const char>>& send) {
  constexpr int kTag = 2020;
  const int64_t W = size(), r = rank();
  std::vector<int64_t> bytes(static_cast<size_t>(W * W), 0);  // [from * W + to]
  for (int64_t q = 0; q < W; ++q) {
    MTNLG_CHECK(send[q].size() % 4 == 0, "all_to_all: {} bytes to rank {} are not whole words", send[q].size(), q);
    bytes[static_cast<size_t>(r * W + q)] = static_cast<int64_t>(send[q].size());
  }
  w_->all_reduce(bytes.data(), W * W, parallel::ReduceOp::sum);
  int64_t total = 0;
  for (int64_t q = 0; q < W; ++q) total += bytes[static_cast<size_t>(q * W + r)];
  std::vector<char> out(static_cast<size_t>(total));
  std::vector<std::unique_ptr<parallel::Request>> pending;
  for (int64_t q = 0; q < W; ++q)
    if (q != r && !send[q].empty())
      pending.push_back(w_->isend(send[q].data(), static_cast<int64_t>(send[q].size() / 4), DType::i32, q, kTag));
  int64_t at = 0;
  for (int64_t q = 0; q < W; ++q) {
    const int64_t n = bytes[static_cast<size_t>(q * W + r)];
    if (n == 0) continue;
    if (q == r)
      std::memcpy(out.data() + at, send[q].data(), static_cast<size_t>(n));
    else
      w_->recv(out.data() + at, n / 4, DType::i32, q, kTag);
    at += n;
  }
  for (auto& p : pending) p->wait();
  return out;
}

RankJob::RankJob(const parallel::LaunchInfo& info, std::string output)
    : world(parallel::init_world(info)), W(world->size()), r(world->rank()), comm_(world), output_(std::move(output)) {
  log::context().rank = static_cast<int>(r);
  log::context().world = static_cast<int>(W);
}

void RankJob::fail(std::exception_ptr e) {
  for (const auto& f : own_files) remove_file(f);
  std::string msg = "unknown error";
  int code = 1;
  try {
    std::rethrow_exception(e);
  } catch (const Error& x) {
    msg = x.what();
    code = x.exit_code();
  } catch (const std::exception& x) {
    msg = x.what();
  } catch (...) {}
  // agree() threw on every rank; a failure outside it (a broken communicator) is not
  // agreed: end the job rather than wait for peers in the barrier.
  if (!comm_.failure_agreed) {
    std::fprintf(stderr, "mtnlg: error on rank %d: %s (aborting all ranks)\n", static_cast<int>(r), msg.c_str());
    parallel::abort_world(code);
  }
  exit_agreed_failure(*world, msg, code, comm_.failed_here);
}

void RankJob::on_main_thread(const std::function<void()>& collective) {
  std::unique_lock lk(m_);
  request_ = &collective;
  served_ = false;
  cv_.wait(lk, [&] { return served_ || peer_failed_; });
  request_ = nullptr;
  if (!served_) throw curation::PeerFailed{};
  if (request_error_) std::rethrow_exception(std::exchange(request_error_, nullptr));
}

void RankJob::run_with_progress(const std::function<void()>& fn, const ProgressSpec& spec) {
  std::exception_ptr err;
  std::atomic<bool> finished{false};
  {
    std::lock_guard lk(m_);
    peer_failed_ = false;
  }
  std::thread worker([&] {
    try {
      fn();
    } catch (...) {
      err = std::current_exception();
    }
    finished = true;
    cv_.notify_all();
  });
  auto waiting = [&] {
    std::lock_guard lk(m_);
    return request_ != nullptr && !served_;
  };
  // The helper thread must not outlive this frame (a collective here threw: the
  // communicator is broken, so release it and let the exception end the job).
  struct Join {
    RankJob& j;
    std::thread& t;
    ~Join() {
      {
        std::lock_guard lk(j.m_);
        j.peer_failed_ = true;
      }
      j.cv_.notify_all();
      if (t.joinable()) t.join();
    }
  } join{*this, worker};
  Progress bar(fmt::format("{} ({} ranks)", spec.label, W), spec.total, spec.unit, spec.show && r == 0);
  if (!spec.secondary_unit.empty()) bar.set_secondary_unit(spec.secondary_unit);
  int64_t shown = 0, shown2 = 0;
  for (;;) {
    for (int i = 0; i < 20 && !finished.load() && !waiting(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    // Waiting is read before finished: a helper that waits cannot finish until served.
    const bool wait_now = waiting();
    int64_t v[4] = {spec.done ? spec.done->load() : 0, spec.secondary ? spec.secondary->load() : 0,
                    finished.load() ? 1 : 0, wait_now ? 1 : 0};
    world->all_reduce(v, 4, parallel::ReduceOp::sum);
    if (v[0] > shown || v[1] > shown2) bar.add(v[0] - shown, v[1] - shown2);
    shown = v[0];
    shown2 = v[1];
    if (v[3] == W) {  // every rank asks: run the collective here, on every rank
      std::unique_lock lk(m_);
      try {
        (*request_)();
      } catch (...) {
        request_error_ = std::current_exception();
      }
      served_ = true;
      lk.unlock();
      cv_.notify_all();
      continue;
    }
    if (v[3] > 0 && v[2] + v[3] == W) {  // the others ended without asking: release
      {
        std::lock_guard lk(m_);
        peer_failed_ = true;
      }
      cv_.notify_all();
      continue;
    }
    if (v[2] == W) break;
  }
  worker.join();
  if (err) std::rethrow_exception(err);
  bar.finish();
}

void RankJob::count_share(const std::string& input, int64_t& begin, int64_t& end, int64_t& lines_before,
                          int64_t* documents_before, int64_t* documents_total) {
  std::vector<int64_t> counts(static_cast<size_t>(2 * W), 0);
  step(
      [&] {
        if (!std::filesystem::is_regular_file(input)) throw_input("--input {}: no such file", input);
        std::error_code ec;
        if (std::filesystem::exists(output_, ec) && std::filesystem::equivalent(output_, input, ec))
          throw_input("--output {}: would overwrite the input", output_);
        std::tie(begin, end) = data::line_aligned_range(input, W, r);
        const auto c = curation::count_lines(input, begin, end);
        counts[static_cast<size_t>(2 * r)] = c.lines;
        counts[static_cast<size_t>(2 * r + 1)] = c.documents;
      },
      "reading its share");
  world->all_reduce(counts.data(), 2 * W, parallel::ReduceOp::sum);
  lines_before = 0;
  if (documents_before) *documents_before = 0;
  if (documents_total) {
    *documents_total = 0;
    for (int64_t q = 0; q < W; ++q) *documents_total += counts[static_cast<size_t>(2 * q + 1)];
  }
  for (int64_t q = 0; q < r; ++q) {
    lines_before += counts[static_cast<size_t>(2 * q)];
    if (documents_before) *documents_before += counts[static_cast<size_t>(2 * q + 1)];
  }
}

void RankJob::join_parts() const {
  curation::AtomicWriter out(output_);
  std::vector<char> buf(1 << 20);
  for (int64_t q = 0; q < W; ++q) {
    std::FILE* f = std::fopen(part(q).c_str(), "rb");
    if (!f) throw_runtime("{}: cannot open rank {}'s part ({})", part(q), q, std::strerror(errno));
    size_t got;
    while ((got = std::fread(buf.data(), 1, buf.size(), f)) > 0) out.write(std::string_view(buf.data(), got));
    const bool bad = std::ferror(f);
    std::fclose(f);
    if (bad) throw_runtime("{}: read failed", part(q));
  }
  out.close();
}

void RankJob::remove_file(const std::string& f) {
  std::error_code ec;
  std::filesystem::remove(f, ec);
}

}  // namespace mtnlg::app
