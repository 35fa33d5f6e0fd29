// rdx_crypt_fabric: the results of every round, and the final table (median
// [min..max] over rounds) with one machine-readable line per row:
//   crypt_fabric,kind,size,plain_mbps,sealed_mbps,ratio,plain_us,sealed_us
// (medians; ratio = sealed / plain; the _us fields are the median round trip
// of a message point and empty for a transfer).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "link.hpp"
#include "plan.hpp"

namespace crypt_fabric {

//! Median, least and largest of some values (0 for none).
struct spread {
  double median = 0;
  double min = 0;
  double max = 0;
};

inline spread spread_of(std::vector<double> v) {
  if (v.empty()) {
    return {};
  }
  std::sort(v.begin(), v.end());
  const std::size_t h = v.size() / 2;
  return {v.size() % 2 == 1 ? v[h] : (v[h - 1] + v[h]) / 2, v.front(), v.back()};
}

//! Every round's numbers of every row of the table.
class results {
public:
  explicit results(const plan& pl) {
    for (std::uint64_t s : pl.sizes) {
      rows_.push_back({kind::message, s, {}});
    }
    for (kind k : {kind::transfer, kind::fetch}) {
      for (std::uint64_t s : pl.bulk) {
        rows_.push_back({k, s, {}});
      }
    }
  }

  void add(const point& p, const point_result& r) {
    auto& m = rows_[p.row].by_mode[static_cast<std::size_t>(p.how)];
    m.mbps.push_back(r.mbps);
    m.p50.push_back(r.p50_us);
    m.p99.push_back(r.p99_us);
  }

  //! The table and the machine-readable lines, on stdout.
  void print(const std::string& device, const std::string& peer, std::uint32_t rounds,
             std::uint64_t chunk) const {
    std::printf("\ncrypt_fabric: %s %s, rounds %u (median [min..max])\n", device.c_str(), peer.c_str(),
                rounds);
    line("what", "size", "plain MB/s", "sealed MB/s", "ratio", "plain lat us", "sealed lat us");
    line("", "", "", "", "", "(p50 / p99)", "(p50 / p99)");
    bool header_done = false;
    kind last = kind::message;
    for (const row& r : rows_) {
      if (r.what != last) {
        last = r.what;
        line(kind_name(r.what), "", r.what == kind::transfer ? "(window write)" : "(window read)",
             r.what == kind::transfer ? "(sealed_writer)" : "(sealed_fetcher)", "", "", "");
        header_done = true;
      }
      const spread pm = spread_of(r.by_mode[0].mbps);
      const spread sm = spread_of(r.by_mode[1].mbps);
      std::string lat[2];
      for (std::size_t m = 0; m < 2 && r.what == kind::message; ++m) {
        lat[m] =
            fixed(spread_of(r.by_mode[m].p50).median) + " / " + fixed(spread_of(r.by_mode[m].p99).median);
      }
      line(kind_name(r.what), size_name(r.size), cell(pm), cell(sm), ratio(pm, sm), lat[0], lat[1]);
    }
    if (header_done) {
      std::printf(
          "transfer: plain is one rdx::remote_window write and a message; sealed, a sealed window write in\n"
          "%s chunks. fetch: plain is one window read; sealed, the server seals %s chunks into its\n"
          "window (sealed_source), and the client reads and opens each as it is announced\n",
          size_name(chunk).c_str(), size_name(chunk).c_str());
    }
    std::printf("\n");
    for (const row& r : rows_) {
      const spread pm = spread_of(r.by_mode[0].mbps);
      const spread sm = spread_of(r.by_mode[1].mbps);
      std::string us[2];
      for (std::size_t m = 0; m < 2 && r.what == kind::message; ++m) {
        us[m] = fixed(spread_of(r.by_mode[m].p50).median);
      }
      std::printf("crypt_fabric,%s,%llu,%s,%s,%s,%s,%s\n", kind_name(r.what),
                  static_cast<unsigned long long>(r.size), fixed(pm.median).c_str(), fixed(sm.median).c_str(),
                  ratio(pm, sm).c_str(), us[0].c_str(), us[1].c_str());
    }
  }

private:
  struct per_mode {
    std::vector<double> mbps, p50, p99;
  };
  struct row {
    kind what;
    std::uint64_t size;
    std::array<per_mode, 2> by_mode;  // plain, sealed
  };

  // One line of the table, without trailing blanks.
  static void line(const char* a, const std::string& b, const std::string& c, const std::string& d,
                   const std::string& e, const std::string& f, const std::string& g) {
    char text[256];
    std::snprintf(text, sizeof text, "%-9s %-8s %-28s %-28s %-6s %-17s %s", a, b.c_str(), c.c_str(),
                  d.c_str(), e.c_str(), f.c_str(), g.c_str());
    std::string l(text);
    l.erase(l.find_last_not_of(' ') + 1);
    std::printf("%s\n", l.c_str());
  }

  static std::string fixed(double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%.1f", v);
    return b;
  }
  static std::string cell(const spread& s) {
    return fixed(s.median) + " [" + fixed(s.min) + ".." + fixed(s.max) + "]";
  }
  static std::string ratio(const spread& plain, const spread& sealed) {
    if (plain.median <= 0) {
      return "-";
    }
    char b[32];
    std::snprintf(b, sizeof b, "%.3f", sealed.median / plain.median);
    return b;
  }

  std::vector<row> rows_;
};

}  // namespace crypt_fabric
