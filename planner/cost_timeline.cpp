// Pipeline timeline for `mtnlg plan --svg`: an event simulation of 1F1B and of
// Megatron's interleaved 1F1B (the op order of each pipeline rank as in
// docs/specs/megatron.md §1), then an SVG drawing of it.
#include <fmt/format.h>

#include <algorithm>

#include "core/error.hpp"
#include "planner/cost_model.hpp"

namespace mtnlg::cost {

namespace {

struct OpId {
  bool forward;
  int64_t mb, chunk;
};

// The op order of pipeline rank `s`.
std::vector<OpId> rank_order(int64_t p, int64_t m, int64_t v, int64_t s) {
  std::vector<OpId> ops;
  if (v == 1) {
    const int64_t warm = std::min(p - s - 1, m);
    for (int64_t i = 0; i < warm; ++i) ops.push_back({true, i, 0});
    for (int64_t i = 0; i < m - warm; ++i) {
      ops.push_back({true, warm + i, 0});
      ops.push_back({false, i, 0});
    }
    for (int64_t i = m - warm; i < m; ++i) ops.push_back({false, i, 0});
    return ops;
  }
  // Interleaved: the k-th forward runs chunk (k mod p*v) / p of microbatch
  // (k / (p*v)) * p + k mod p; backwards walk the chunks in reverse.
  const int64_t total = m * v;
  const int64_t warm = std::min((p - s - 1) * 2 + (v - 1) * p, total);
  auto fwd = [&](int64_t k) { return OpId{true, (k / (p * v)) * p + k % p, (k % (p * v)) / p}; };
  auto bwd = [&](int64_t k) { return OpId{false, (k / (p * v)) * p + k % p, v - 1 - (k % (p * v)) / p}; };
  for (int64_t k = 0; k < warm; ++k) ops.push_back(fwd(k));
  for (int64_t i = 0; i < total - warm; ++i) {
    ops.push_back(fwd(warm + i));
    ops.push_back(bwd(i));
  }
  for (int64_t k = total - warm; k < total; ++k) ops.push_back(bwd(k));
  return ops;
}

}  // namespace

std::vector<TimelineOp> simulate_pipeline(int64_t p, int64_t m, int64_t v, const std::vector<double>& fwd,
                                          const std::vector<double>& bwd, double p2p) {
  MTNLG_CHECK(p >= 1 && m >= 1 && v >= 1, "pp {} m {} vp {}", p, m, v);
  MTNLG_CHECK(static_cast<int64_t>(fwd.size()) == p && static_cast<int64_t>(bwd.size()) == p, "per-stage times");
  if (v > 1 && m % p != 0) throw_input("interleaved pipeline: microbatches ({}) must be a multiple of pp ({})", m, p);
  // done[dir][stage][chunk][mb] = finish time, < 0 while not run.
  auto idx = [&](int64_t s, int64_t c, int64_t mb) { return static_cast<size_t>((s * v + c) * m + mb); };
  std::vector<double> done_f(static_cast<size_t>(p * v * m), -1.0), done_b(done_f);
  std::vector<std::vector<OpId>> orders;
  for (int64_t s = 0; s < p; ++s) orders.push_back(rank_order(p, m, v, s));
  std::vector<size_t> next(static_cast<size_t>(p), 0);
  std::vector<double> free_at(static_cast<size_t>(p), 0.0);
  std::vector<TimelineOp> out;
  out.reserve(static_cast<size_t>(2 * p * m * v));
  for (bool progress = true; progress;) {
    progress = false;
    for (int64_t s = 0; s < p; ++s) {
      auto& ord = orders[static_cast<size_t>(s)];
      auto& n = next[static_cast<size_t>(s)];
      while (n < ord.size()) {
        const OpId op = ord[n];
        double ready = 0;  // when the input of this op has arrived
        if (op.forward) {
          if (s > 0) {
            double d = done_f[idx(s - 1, op.chunk, op.mb)];
            if (d < 0) break;
            ready = d + p2p;
          } else if (op.chunk > 0) {
            double d = done_f[idx(p - 1, op.chunk - 1, op.mb)];
            if (d < 0) break;
            ready = d + p2p;
          }
        } else {
          if (s < p - 1) {
            double d = done_b[idx(s + 1, op.chunk, op.mb)];
            if (d < 0) break;
            ready = d + p2p;
          } else if (op.chunk < v - 1) {
            double d = done_b[idx(0, op.chunk + 1, op.mb)];
            if (d < 0) break;
            ready = d + p2p;
          } else {
            double d = done_f[idx(s, op.chunk, op.mb)];
            if (d < 0) break;
            ready = d;
          }
        }
        const double start = std::max(ready, free_at[static_cast<size_t>(s)]);
        const double dur = op.forward ? fwd[static_cast<size_t>(s)] : bwd[static_cast<size_t>(s)];
        const double end = start + dur;
        (op.forward ? done_f : done_b)[idx(s, op.chunk, op.mb)] = end;
        free_at[static_cast<size_t>(s)] = end;
        out.push_back({s, op.mb, op.chunk, op.forward, start, end});
        ++n;
        progress = true;
      }
    }
  }
  for (int64_t s = 0; s < p; ++s)
    MTNLG_CHECK(next[static_cast<size_t>(s)] == orders[static_cast<size_t>(s)].size(),
                "pipeline schedule deadlocked at stage {}", s);
  return out;
}

double makespan(const std::vector<TimelineOp>& ops) {
  double t = 0;
  for (auto& o : ops) t = std::max(t, o.end);
  return t;
}

std::string timeline_svg(const std::vector<TimelineOp>& ops, int64_t pp, const std::string& title) {
  const double total = std::max(makespan(ops), 1e-12);
  const double left = 90, top = 50, width = 1400, row = pp > 40 ? 14.0 : 24.0, gap = 2;
  const double height = top + double(pp) * row + 60;
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" viewBox=\"0 0 {:.0f} {:.0f}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n",
      left + width + 20, height, left + width + 20, height);
  auto esc = [](const std::string& s) {
    std::string o;
    for (char ch : s) {
      if (ch == '<')
        o += "&lt;";
      else if (ch == '>')
        o += "&gt;";
      else if (ch == '&')
        o += "&amp;";
      else
        o += ch;
    }
    return o;
  };
  svg += fmt::format("<text x=\"10\" y=\"20\" font-size=\"14\">{}</text>\n", esc(title));
  // Stage rows with an idle (bubble) background so gaps read as bubbles.
  for (int64_t s = 0; s < pp; ++s) {
    const double y = top + double(s) * row;
    svg += fmt::format("<text x=\"10\" y=\"{:.1f}\">stage {}</text>\n", y + row * 0.7, s);
    svg += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"#f2d7d5\"/>\n", left,
                       y, width, row - gap);
  }
  for (auto& o : ops) {
    const double x = left + o.start / total * width;
    const double w = std::max(0.5, (o.end - o.start) / total * width);
    const double y = top + double(o.stage) * row;
    // Forward blue, backward green; later chunks darker.
    const int shade = static_cast<int>(std::min<int64_t>(o.chunk, 3) * 30);
    const std::string fill = o.forward ? fmt::format("rgb({},{},{})", 70 - shade / 2, 130 - shade, 220 - shade)
                                       : fmt::format("rgb({},{},{})", 60 - shade / 2, 170 - shade, 90 - shade / 2);
    svg += fmt::format(
        "<rect x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{:.1f}\" fill=\"{}\" stroke=\"#ffffff\" "
        "stroke-width=\"0.3\"><title>{} mb {} chunk {}</title></rect>\n",
        x, y, w, row - gap, fill, o.forward ? "F" : "B", o.microbatch, o.chunk);
  }
  const double ly = top + double(pp) * row + 20;
  svg += fmt::format(
      "<rect x=\"{:.0f}\" y=\"{:.0f}\" width=\"14\" height=\"12\" fill=\"rgb(70,130,220)\"/>"
      "<text x=\"{:.0f}\" y=\"{:.0f}\">forward</text>\n",
      left, ly, left + 20, ly + 11);
  svg += fmt::format(
      "<rect x=\"{:.0f}\" y=\"{:.0f}\" width=\"14\" height=\"12\" fill=\"rgb(60,170,90)\"/>"
      "<text x=\"{:.0f}\" y=\"{:.0f}\">backward (incl. recompute)</text>\n",
      left + 100, ly, left + 120, ly + 11);
  svg += fmt::format(
      "<rect x=\"{:.0f}\" y=\"{:.0f}\" width=\"14\" height=\"12\" fill=\"#f2d7d5\"/>"
      "<text x=\"{:.0f}\" y=\"{:.0f}\">idle (bubble)</text>\n",
      left + 300, ly, left + 320, ly + 11);
  svg += fmt::format("<text x=\"{:.0f}\" y=\"{:.0f}\">time: 0 .. {:.3f} s</text>\n", left + 460, ly + 11, total);
  svg += "</svg>\n";
  return svg;
}

}  // namespace mtnlg::cost
