// pingpong's results: latency percentiles and bandwidth, and the RESULT line.
#include "report.hpp"

#include <algorithm>
#include <cstdio>

#include "cli.hpp"

namespace pingpong {

namespace {

void print_stats(const options& o, const run_stats& st, const char* label) {
  std::vector<double> s = st.rtt_us;
  std::sort(s.begin(), s.end());
  double sum = 0;
  for (double v : s) sum += v;
  const double min = s.front(), med = app::percentile(s, 50), p99 = app::percentile(s, 99);
  const double bytes = 2.0 * static_cast<double>(o.size) * o.iters;
  const double mbps = bytes / (sum / 1e6) / 1e6;
  std::printf("%u round trips of %zu bytes (%s), every payload checked\n", o.iters, o.size, label);
  std::printf("  round-trip latency: min %.2f us, median %.2f us, p99 %.2f us, mean %.2f us\n", min, med, p99,
              sum / static_cast<double>(s.size()));
  std::printf("  one-way (half round trip): min %.2f us, median %.2f us, p99 %.2f us\n", min / 2, med / 2,
              p99 / 2);
  std::printf(
      "  bandwidth: %.2f MB/s = %.2f Mbit/s (2 x %zu x %u bytes in %.3f s of round trips; loop %.3f s)\n",
      mbps, mbps * 8, o.size, o.iters, sum / 1e6, st.wall_s);
  std::printf("RESULT mode=%s size=%zu iters=%u min_us=%.2f median_us=%.2f p99_us=%.2f mbit_s=%.2f\n", label,
              o.size, o.iters, min, med, p99, mbps * 8);
}

}  // namespace

void report(const options& o, const run_stats& st, bool client, const char* label) {
  if (client) {
    print_stats(o, st, label);
  } else {
    std::printf("%u payloads of %zu bytes (%s) received, checked and echoed\n", o.iters, o.size, label);
  }
}

}  // namespace pingpong
