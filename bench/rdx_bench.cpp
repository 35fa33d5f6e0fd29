// rdx benchmarks: every rdx figure next to its plain-verbs twin from the same
// run, on the same queue pairs and sizes, with the ratio as a counter. The
// code compared is twins.hpp; loops.hpp runs it, fabric.hpp sets it up.
//
//   fabric/<op>/<api>/size:<bytes>[/depth:<n>]   RDMA write, read, send: bandwidth, latency
//   fabric/window_<op>/..., fabric/chan_send_<bw|lat>/rdx/..., fabric/chan_zc_<bw|lat>/rdx/...
//                                                typed channels: windows, the copying channel,
//                                                the zero-copy one (send_registered, receive_view)
//   fabric/paired/<op>/size:<bytes>[/depth:<n>]  both twins alternating within one run
//   micro/<what>/<api>[/batch:<n>]               the data path's own cost
//
// Loopback (default): two queue pairs of one device in this process.
// Two nodes (RDX_PEER_ADDR set, as cmake/softroce/rdx-vm sets it): RDX_NODE=1
// serves as the responder, RDX_NODE=0 runs the benchmarks against it; they
// meet over rdx's TCP bootstrap on --rdx_port.
#include <rdx/verbs/device_list.hpp>

#include <benchmark/benchmark.h>

#include <charconv>
#include <functional>
#include <map>
#include <numeric>

#include "common.hpp"
#include "fabric.hpp"
#include "loops.hpp"
#include "twins.hpp"

namespace rdx_bench {
namespace {

struct options {
  std::vector<std::size_t> sizes{8, 4096, 65536, 1 << 20};
  std::vector<unsigned> depths{1, 64};
  std::size_t depth64_max = 65536;   // largest size measured at depth 64
  std::size_t stripe_min = 65536;    // smallest size measured striped over 2 queue pairs
  std::uint64_t bw_bytes = 4 << 20;  // bytes per bandwidth run, before the bounds below
  std::uint64_t bw_max_msgs = 2000;
  std::uint64_t lat_bytes = 16 << 20;  // bytes per latency run, before the bounds below
  std::uint64_t lat_iters = 200;
  std::uint16_t port = 18600;
  std::string mode = "auto";  // auto, loopback, twonode
  bool rdx_first = false;     // run each rdx benchmark before its raw twin
};

options opt;
bool plan_only = false;
std::unique_ptr<fabric> g_fabric;  // the fabric the fabric/ benchmarks use
std::unique_ptr<fabric> g_micro;   // a small loopback pair for micro/
struct twin_figures {
  double raw = 0;
  double rdx = 0;
};
std::map<std::string, twin_figures> g_twin;  // twin key -> each twin's latest figure

std::vector<std::size_t> parse_sizes(std::string_view s) {
  std::vector<std::size_t> out;
  if (s == "all") {
    for (std::size_t v = 8; v <= (8u << 20); v *= 2) out.push_back(v);
    return out;
  }
  if (s == "default") return options{}.sizes;
  while (!s.empty()) {
    auto comma = s.find(',');
    std::string_view t = s.substr(0, comma);
    std::size_t mult = 1;
    if (!t.empty() && (t.back() == 'K' || t.back() == 'k'))
      mult = 1024, t.remove_suffix(1);
    else if (!t.empty() && (t.back() == 'M' || t.back() == 'm'))
      mult = 1 << 20, t.remove_suffix(1);
    std::uint64_t v = 0;
    auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
    if (ec != std::errc{} || p != t.data() + t.size() || v * mult < 8 || v * mult > (8u << 20) ||
        ((v * mult) & (v * mult - 1)) != 0) {
      throw std::invalid_argument("--rdx_sizes: \"" + std::string(t) +
                                  "\" is not a power of two from 8 to 8M");
    }
    out.push_back(v * mult);
    if (comma == std::string_view::npos) break;
    s.remove_prefix(comma + 1);
  }
  return out;
}

std::uint64_t parse_u64(std::string_view name, std::string_view v) {
  std::uint64_t x = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (ec != std::errc{} || p != v.data() + v.size())
    throw std::invalid_argument(std::string(name) + ": not a number");
  return x;
}

//! Takes --rdx_* options (and RDX_BENCH_SIZES) out of argv before Google Benchmark sees it.
void parse_options(int& argc, char** argv) {
  if (const char* e = std::getenv("RDX_BENCH_SIZES"); e != nullptr && *e != '\0') opt.sizes = parse_sizes(e);
  if (const char* e = std::getenv("RDX_BENCH_PORT"); e != nullptr && *e != '\0')
    opt.port = static_cast<std::uint16_t>(parse_u64("RDX_BENCH_PORT", e));
  int out = 1;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    auto value = [&](std::string_view name) -> std::optional<std::string_view> {
      if (a.size() > name.size() + 1 && a.starts_with(name) && a[name.size()] == '=')
        return a.substr(name.size() + 1);
      return std::nullopt;
    };
    if (auto v = value("--rdx_sizes"))
      opt.sizes = parse_sizes(*v);
    else if (auto v = value("--rdx_depths")) {
      opt.depths.clear();
      std::string_view l = *v;
      while (!l.empty()) {
        auto comma = l.find(',');
        const auto d = parse_u64("--rdx_depths", l.substr(0, comma));
        if (d < 1 || d > 128) throw std::invalid_argument("--rdx_depths: each depth must be from 1 to 128");
        opt.depths.push_back(static_cast<unsigned>(d));
        if (comma == std::string_view::npos) break;
        l.remove_prefix(comma + 1);
      }
    } else if (auto v = value("--rdx_depth64_max"))
      opt.depth64_max = parse_u64("--rdx_depth64_max", *v);
    else if (auto v = value("--rdx_stripe_min"))
      opt.stripe_min = parse_u64("--rdx_stripe_min", *v);
    else if (auto v = value("--rdx_bw_bytes"))
      opt.bw_bytes = parse_u64("--rdx_bw_bytes", *v);
    else if (auto v = value("--rdx_bw_max_msgs"))
      opt.bw_max_msgs = parse_u64("--rdx_bw_max_msgs", *v);
    else if (auto v = value("--rdx_lat_bytes"))
      opt.lat_bytes = parse_u64("--rdx_lat_bytes", *v);
    else if (auto v = value("--rdx_lat_iters"))
      opt.lat_iters = parse_u64("--rdx_lat_iters", *v);
    else if (auto v = value("--rdx_port"))
      opt.port = static_cast<std::uint16_t>(parse_u64("--rdx_port", *v));
    else if (auto v = value("--rdx_mode"))
      opt.mode = std::string(*v);
    else if (a == "--rdx_plan")
      plan_only = true;
    else if (auto v = value("--rdx_order")) {
      if (*v != "raw_first" && *v != "rdx_first")
        throw std::invalid_argument("--rdx_order: raw_first or rdx_first");
      opt.rdx_first = *v == "rdx_first";
    } else if (a == "--rdx_help") {
      std::printf(
          "rdx_bench options (besides Google Benchmark's):\n"
          "  --rdx_sizes=LIST|default|all  message sizes, powers of two 8..8M (e.g. 8,4K,1M); env "
          "RDX_BENCH_SIZES\n"
          "  --rdx_depths=LIST             bandwidth queue depths (default 1,64)\n"
          "  --rdx_depth64_max=BYTES       largest size measured at depths above 1 (default 65536)\n"
          "  --rdx_stripe_min=BYTES        smallest size measured striped over 2 queue pairs (default "
          "65536)\n"
          "  --rdx_bw_bytes=N --rdx_bw_max_msgs=N   bytes and message cap per bandwidth run\n"
          "  --rdx_lat_bytes=N --rdx_lat_iters=N    bytes and iteration cap per latency run\n"
          "  --rdx_mode=auto|loopback|twonode       auto: two nodes when RDX_PEER_ADDR is set\n"
          "  --rdx_port=N                  TCP port of the two-node bootstrap (default 18600); env "
          "RDX_BENCH_PORT\n"
          "  --rdx_order=raw_first|rdx_first  which twin runs first (alternate it between rounds)\n"
          "  --rdx_plan                    print the fabric runs (op size depth messages), one a line, and "
          "exit\n"
          "figures (--benchmark_filter, --benchmark_list_tests):\n"
          "  fabric/{write,read,send}_{bw,lat}/{raw,rdx}   plain verbs and rdx's verbs layer\n"
          "  fabric/window_{write,read}_{bw,lat}/{raw,rdx}  remote_window against plain verbs\n"
          "  fabric/chan_send_{bw,lat}/rdx  channel<std::byte>, copying send and receive\n"
          "  fabric/chan_zc_{bw,lat}/rdx    channel<std::byte>, zero-copy: send_registered, receive_view\n"
          "                                 (both channels' twin: fabric/send_{bw,lat}/raw)\n"
          "  fabric/paired/<op>/...         both twins alternating within one run (the channels' too)\n"
          "  micro/{build,post_poll,poll_empty}/{raw,rdx}  the data path's own cost\n");
      std::exit(0);
    } else {
      argv[out++] = argv[i];
    }
  }
  argc = out;
  argv[argc] = nullptr;
}

unsigned g_failures = 0;  // benchmarks that stopped with an error (exit status 3)

void report_failure(benchmark::State& state, const std::exception& e) {
  ++g_failures;
  state.SkipWithError(e.what());
}

std::size_t region_size() {
  return std::max<std::size_t>(4096, *std::max_element(opt.sizes.begin(), opt.sizes.end()));
}

std::uint64_t bw_count(std::size_t size, unsigned depth) {
  const std::uint64_t lo = std::max<std::uint64_t>(16, 4ull * depth);
  return std::max(lo, std::min(opt.bw_bytes / size, opt.bw_max_msgs));
}
std::uint64_t lat_count(std::size_t size) {
  return std::clamp<std::uint64_t>(opt.lat_bytes / size, 10, opt.lat_iters);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

//! Records a figure; the second twin of a pair to run gets the ratio counter
//! vs_raw = rdx / raw against the other's latest run (Google Benchmark runs
//! the final, reported run of a benchmark last). bench/plot.py recomputes the
//! ratios from all repetitions and rounds.
//! Tag for channel benchmarks: their twin is the verbs-level raw run of the
//! same size (read, never overwritten).
struct chan_api {};

template <class Api>
void twin(benchmark::State& state, const std::string& key, double figure) {
  if constexpr (std::is_same_v<Api, chan_api>) {
    auto it = g_twin.find(key);
    if (it != g_twin.end() && it->second.raw > 0) state.counters["vs_raw"] = figure / it->second.raw;
    return;
  }
  constexpr bool is_rdx = std::is_same_v<Api, rdx_api>;
  auto& pair = g_twin[key];
  (is_rdx ? pair.rdx : pair.raw) = figure;
  const bool second = is_rdx != opt.rdx_first;
  if (second && pair.rdx > 0 && pair.raw > 0) state.counters["vs_raw"] = pair.rdx / pair.raw;
}

template <class Api, class Run>
void bw_bench(benchmark::State& state, Run run, std::size_t size, unsigned depth, unsigned qps,
              const std::string& key) {
  try {
    for (auto _ : state) {
      result r = run();
      state.SetIterationTime(r.seconds);
      const double mbps = static_cast<double>(r.bytes) / r.seconds / 1e6;
      state.counters["MBps"] = mbps;
      state.counters["msgs"] = static_cast<double>(r.bytes / size);
      if (r.wr_per_op > 0) {
        state.counters["wr_per_op"] = r.wr_per_op;
        state.counters["signaled_per_op"] = r.signaled_per_op;
      }
      twin<Api>(state, key, mbps);
    }
  } catch (const std::exception& e) {
    report_failure(state, e);
  }
  state.counters["size"] = static_cast<double>(size);
  state.counters["depth"] = depth;
  state.counters["qps"] = qps;
}

template <class Api, class Run>
void lat_bench(benchmark::State& state, Run run, std::size_t size, const std::string& key) {
  try {
    for (auto _ : state) {
      result r = run();
      state.SetIterationTime(r.seconds);
      const double med = median(r.lat_us);
      state.counters["lat_us"] = med;
      state.counters["lat_avg_us"] =
          std::accumulate(r.lat_us.begin(), r.lat_us.end(), 0.0) / static_cast<double>(r.lat_us.size());
      state.counters["lat_min_us"] = r.lat_us.front();
      state.counters["lat_p99_us"] =
          r.lat_us[std::min<std::size_t>(r.lat_us.size() - 1, r.lat_us.size() * 99 / 100)];
      state.counters["msgs"] = static_cast<double>(r.lat_us.size());
      twin<Api>(state, key, med);
    }
  } catch (const std::exception& e) {
    report_failure(state, e);
  }
  state.counters["size"] = static_cast<double>(size);
  state.counters["depth"] = 1;
}

// --- micro: the data path's own cost ----------------------------------------

//! Nanoseconds per iteration since t0, measured here so the ratio counter has a figure.
double per_iteration_ns(const benchmark::State& state, clk::time_point t0) {
  const double ns = std::chrono::duration<double, std::nano>(clk::now() - t0).count();
  return state.iterations() != 0 ? ns / static_cast<double>(state.iterations()) : 0.0;
}

fabric& micro_fabric() {
  if (!g_micro) g_micro = fabric::loopback(4096, 1);
  return *g_micro;
}

//! Building a batch of 16 write requests (no device involved). rdx links the
//! chain when it posts; the raw twin links while building.
template <class Api>
void micro_build(benchmark::State& state, std::string key) {
  constexpr unsigned k = 16;
  const ibv_sge sge{0x10000, 8, 0x1234};
  const rdx::remote_ptr rp{0x20000, 0x5678};
  const auto t0 = clk::now();
  for (auto _ : state) {
    if constexpr (std::is_same_v<Api, raw_api>) {
      ibv_send_wr wrs[k];
      ibv_sge sges[k];
      for (unsigned j = 0; j < k; ++j) {
        sges[j] = sge;
        wrs[j] = ibv_send_wr{};
        wrs[j].wr_id = j;
        wrs[j].next = j + 1 < k ? &wrs[j + 1] : nullptr;
        wrs[j].sg_list = &sges[j];
        wrs[j].num_sge = 1;
        wrs[j].opcode = IBV_WR_RDMA_WRITE;
        wrs[j].send_flags = j + 1 == k ? unsigned{IBV_SEND_SIGNALED} : 0u;
        wrs[j].wr.rdma.remote_addr = rp.addr + j * 8;
        wrs[j].wr.rdma.rkey = rp.rkey;
      }
      benchmark::DoNotOptimize(wrs);
    } else {
      static rdx::send_batch<k> batch;
      batch.clear();
      for (unsigned j = 0; j < k; ++j) {
        (void)batch.emplace([&]() noexcept {
          rdx::send_wr w = rdx::wr::write(sge, rp + j * 8);
          w.id(j).signaled(j + 1 == k);
          return w;
        });
      }
      benchmark::DoNotOptimize(batch);
    }
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) * k);
  twin<Api>(state, key, per_iteration_ns(state, t0));
}

//! Posting a batch of k 8-byte (inline) writes with one doorbell, the last
//! signaled, and polling its completion: loopback on one device.
template <class Api>
void micro_post_poll(benchmark::State& state, unsigned k, std::string key) {
  try {
    fabric& f = micro_fabric();
    side& s = f.client();
    const wr_desc d{IBV_WR_RDMA_WRITE, s.tx_sge(0, 8), s.peer_rx()};
    typename Api::wc_type wcs[1];
    const auto t0 = clk::now();
    for (auto _ : state) {
      check_post(Api::post(s.qp(0), d, k, true, k), "post");
      int n = 0;
      while ((n = Api::poll(s.scq(0), wcs, 1)) == 0) {}
      if (n < 0) fail("poll failed");
      check_completion<Api>(wcs[0], "micro");
    }
    state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) * k);
    twin<Api>(state, key, per_iteration_ns(state, t0));
  } catch (const std::exception& e) {
    report_failure(state, e);
  }
  state.counters["batch"] = k;
}

//! Polling an empty completion queue (16 entries asked for).
template <class Api>
void micro_poll_empty(benchmark::State& state, std::string key) {
  try {
    side& s = micro_fabric().client();
    typename Api::wc_type wcs[16];
    const auto t0 = clk::now();
    for (auto _ : state) {
      int n = Api::poll(s.rcq(0), wcs, 16);
      benchmark::DoNotOptimize(n);
    }
    twin<Api>(state, key, per_iteration_ns(state, t0));
  } catch (const std::exception& e) {
    report_failure(state, e);
  }
}

// --- paired: both twins alternate in blocks within one run --------------------

//! Runs the raw and the rdx loop alternately in `blocks` blocks each (order
//! flipping every block), so both see the same load on a shared, noisy host;
//! reports each one's figure and the ratio rdx / raw. Bandwidth: bytes over
//! the summed block times; latency: the median over all operations.
template <class RawRun, class RdxRun>
void paired_bench(benchmark::State& state, bool bw, RawRun raw_run, RdxRun rdx_run, std::uint64_t count,
                  std::size_t size, unsigned depth, unsigned qps) {
  const unsigned blocks = 8;
  const std::uint64_t per_block = std::max<std::uint64_t>(bw ? 4ull * depth : 5, count / blocks);
  try {
    for (auto _ : state) {
      result raw_total, rdx_total;
      double elapsed = 0;
      for (unsigned b = 0; b < blocks; ++b) {
        for (int k = 0; k < 2; ++k) {
          const bool rdx_now = (k == 0) == ((b + (opt.rdx_first ? 1 : 0)) % 2 == 1);
          result r = rdx_now ? rdx_run(per_block) : raw_run(per_block);
          result& t = rdx_now ? rdx_total : raw_total;
          t.seconds += r.seconds;
          t.bytes += r.bytes;
          t.lat_us.insert(t.lat_us.end(), r.lat_us.begin(), r.lat_us.end());
          elapsed += r.seconds;
        }
      }
      state.SetIterationTime(elapsed);
      double raw_fig, rdx_fig;
      if (bw) {
        raw_fig = static_cast<double>(raw_total.bytes) / raw_total.seconds / 1e6;
        rdx_fig = static_cast<double>(rdx_total.bytes) / rdx_total.seconds / 1e6;
        state.counters["raw_MBps"] = raw_fig;
        state.counters["rdx_MBps"] = rdx_fig;
      } else {
        raw_fig = median(raw_total.lat_us);
        rdx_fig = median(rdx_total.lat_us);
        state.counters["raw_lat_us"] = raw_fig;
        state.counters["rdx_lat_us"] = rdx_fig;
      }
      state.counters["vs_raw"] = rdx_fig / raw_fig;
      state.counters["msgs"] = static_cast<double>(per_block * blocks);
    }
  } catch (const std::exception& e) {
    report_failure(state, e);
  }
  state.counters["size"] = static_cast<double>(size);
  state.counters["depth"] = depth;
  state.counters["qps"] = qps;
}

// --- registration -------------------------------------------------------------

std::string size_name(std::size_t s) {
  return std::to_string(s);
}

template <class F>
void reg_twins(const std::string& group, const std::string& suffix, F&& make, bool manual) {
  // Twins run back to back, so both see the same load; raw first gives each
  // rdx run its twin's figure for the ratio counter.
  const std::string_view first = opt.rdx_first ? rdx_api::name : raw_api::name;
  const std::string_view second = opt.rdx_first ? raw_api::name : rdx_api::name;
  for (std::string_view api : {first, second}) {
    const std::string name = group + "/" + std::string(api) + suffix;
    auto* b = benchmark::RegisterBenchmark(name.c_str(), make(api == rdx_api::name, group + suffix));
    if (manual) b->UseManualTime()->Iterations(1)->Unit(benchmark::kMillisecond);
  }
}

void register_all(bool have_device) {
  using fn = std::function<void(benchmark::State&)>;
  reg_twins(
      "micro/build", "/batch:16",
      [](bool r, std::string key) -> fn {
        if (r) return [key](benchmark::State& s) { micro_build<rdx_api>(s, key); };
        return [key](benchmark::State& s) { micro_build<raw_api>(s, key); };
      },
      false);
  if (!have_device) return;
  for (unsigned k : {1u, 16u}) {
    reg_twins(
        "micro/post_poll", "/batch:" + std::to_string(k),
        [k](bool r, std::string key) -> fn {
          if (r) return [k, key](benchmark::State& s) { micro_post_poll<rdx_api>(s, k, key); };
          return [k, key](benchmark::State& s) { micro_post_poll<raw_api>(s, k, key); };
        },
        false);
  }
  reg_twins(
      "micro/poll_empty", "",
      [](bool r, std::string key) -> fn {
        if (r) return [key](benchmark::State& s) { micro_poll_empty<rdx_api>(s, key); };
        return [key](benchmark::State& s) { micro_poll_empty<raw_api>(s, key); };
      },
      false);

  // Verbs level: rdx's queue_pair, builders and batches against plain verbs on the same queue pair.
  for (op o : {op::write_bw, op::read_bw, op::send_bw}) {
    for (unsigned depth : opt.depths) {
      for (std::size_t size : opt.sizes) {
        if (depth > 1 && size > opt.depth64_max) continue;
        const std::string suffix = "/size:" + size_name(size) + "/depth:" + std::to_string(depth);
        const std::uint64_t n = bw_count(size, depth);
        reg_twins(
            "fabric/" + std::string(to_string(o)), suffix,
            [=](bool r, std::string key) -> fn {
              if (r)
                return [=](benchmark::State& s) {
                  bw_bench<rdx_api>(
                      s, [&] { return run_bw<rdx_api>(*g_fabric, o, size, depth, n); }, size, depth, 1, key);
                };
              return [=](benchmark::State& s) {
                bw_bench<raw_api>(
                    s, [&] { return run_bw<raw_api>(*g_fabric, o, size, depth, n); }, size, depth, 1, key);
              };
            },
            true);
      }
    }
  }
  for (op o : {op::write_lat, op::read_lat, op::send_lat}) {
    for (std::size_t size : opt.sizes) {
      const std::string suffix = "/size:" + size_name(size);
      const std::uint64_t n = lat_count(size);
      reg_twins(
          "fabric/" + std::string(to_string(o)), suffix,
          [=](bool r, std::string key) -> fn {
            if (r)
              return [=](benchmark::State& s) {
                lat_bench<rdx_api>(
                    s, [&] { return run_lat<rdx_api>(*g_fabric, o, size, n); }, size, key);
              };
            return [=](benchmark::State& s) {
              lat_bench<raw_api>(
                  s, [&] { return run_lat<raw_api>(*g_fabric, o, size, n); }, size, key);
            };
          },
          true);
    }
  }

  // Typed channels: remote_window (striped over 1 or 2 queue pairs) against
  // the same chunks posted with plain verbs on queue pairs of the same depth.
  for (op o : {op::window_write_bw, op::window_read_bw}) {
    for (unsigned qps : {1u, 2u}) {
      for (unsigned depth : opt.depths) {
        for (std::size_t size : opt.sizes) {
          if ((depth > 1 && size > opt.depth64_max) || (qps > 1 && size < opt.stripe_min)) continue;
          const std::string suffix =
              "/size:" + size_name(size) + "/depth:" + std::to_string(depth) + "/qps:" + std::to_string(qps);
          const std::uint64_t n = bw_count(size, depth);
          reg_twins(
              "fabric/" + std::string(to_string(o)), suffix,
              [=](bool r, std::string key) -> fn {
                if (r)
                  return [=](benchmark::State& s) {
                    bw_bench<rdx_api>(
                        s, [&] { return run_window_bw(*g_fabric, o, size, depth, n, qps); }, size, depth, qps,
                        key);
                  };
                return [=](benchmark::State& s) {
                  bw_bench<raw_api>(
                      s, [&] { return run_stripe_bw<raw_api>(*g_fabric, o, size, depth, n, qps); }, size,
                      depth, qps, key);
                };
              },
              true);
        }
      }
    }
  }
  for (op o : {op::window_write_lat, op::window_read_lat}) {
    for (std::size_t size : opt.sizes) {
      const std::string suffix = "/size:" + size_name(size);
      const std::uint64_t n = lat_count(size);
      reg_twins(
          "fabric/" + std::string(to_string(o)), suffix,
          [=](bool r, std::string key) -> fn {
            if (r)
              return [=](benchmark::State& s) {
                lat_bench<rdx_api>(
                    s, [&] { return run_window_lat<rdx_api>(*g_fabric, o, size, n); }, size, key);
              };
            return [=](benchmark::State& s) {
              lat_bench<raw_api>(
                  s, [&] { return run_window_lat<raw_api>(*g_fabric, o, size, n); }, size, key);
            };
          },
          true);
    }
  }
  // channel<std::byte> messages, copying (chan_send_*) and zero-copy
  // (chan_zc_*: send_registered, receive_view): their twins are the
  // plain-verbs send_bw and send_lat runs of the same size (a channel's queue
  // pairs carry its own receive ring, so a plain-verbs twin cannot share them).
  const std::size_t chan_max = chan_message_size(region_size());
  for (op o : {op::chan_send_bw, op::chan_zc_bw}) {
    for (unsigned depth : opt.depths) {
      for (std::size_t size : opt.sizes) {
        if (size > chan_max || (depth > 1 && size > opt.depth64_max)) continue;
        const std::string suffix = "/size:" + size_name(size) + "/depth:" + std::to_string(depth);
        const std::uint64_t n = bw_count(size, depth);
        const std::string name = "fabric/" + std::string(to_string(o)) + "/rdx" + suffix;
        benchmark::RegisterBenchmark(name.c_str(),
                                     [=](benchmark::State& s) {
                                       bw_bench<chan_api>(
                                           s, [&] { return run_chan(*g_fabric, o, size, depth, n); }, size,
                                           depth, 1, "fabric/send_bw" + suffix);
                                     })
            ->UseManualTime()
            ->Iterations(1)
            ->Unit(benchmark::kMillisecond);
      }
    }
  }
  for (op o : {op::chan_send_lat, op::chan_zc_lat}) {
    for (std::size_t size : opt.sizes) {
      if (size > chan_max) continue;
      const std::string suffix = "/size:" + size_name(size);
      const std::uint64_t n = lat_count(size);
      const std::string name = "fabric/" + std::string(to_string(o)) + "/rdx" + suffix;
      benchmark::RegisterBenchmark(name.c_str(),
                                   [=](benchmark::State& s) {
                                     lat_bench<chan_api>(
                                         s, [&] { return run_chan(*g_fabric, o, size, 1, n); }, size,
                                         "fabric/send_lat" + suffix);
                                   })
          ->UseManualTime()
          ->Iterations(1)
          ->Unit(benchmark::kMillisecond);
    }
  }

  // Paired runs of the same twins (see paired_bench): the ratio least moved by host noise.
  auto reg_paired = [](const std::string& name, fn f) {
    benchmark::RegisterBenchmark(name.c_str(), f)
        ->UseManualTime()
        ->Iterations(1)
        ->Unit(benchmark::kMillisecond);
  };
  for (op o : {op::write_bw, op::read_bw, op::send_bw}) {
    for (unsigned depth : opt.depths) {
      for (std::size_t size : opt.sizes) {
        if (depth > 1 && size > opt.depth64_max) continue;
        const std::uint64_t n = bw_count(size, depth);
        reg_paired("fabric/paired/" + std::string(to_string(o)) + "/size:" + size_name(size) +
                       "/depth:" + std::to_string(depth),
                   [=](benchmark::State& s) {
                     paired_bench(
                         s, true,
                         [&](std::uint64_t c) { return run_bw<raw_api>(*g_fabric, o, size, depth, c); },
                         [&](std::uint64_t c) { return run_bw<rdx_api>(*g_fabric, o, size, depth, c); }, n,
                         size, depth, 1);
                   });
      }
    }
  }
  for (op o : {op::write_lat, op::read_lat, op::send_lat}) {
    for (std::size_t size : opt.sizes) {
      const std::uint64_t n = lat_count(size);
      reg_paired("fabric/paired/" + std::string(to_string(o)) + "/size:" + size_name(size),
                 [=](benchmark::State& s) {
                   paired_bench(
                       s, false, [&](std::uint64_t c) { return run_lat<raw_api>(*g_fabric, o, size, c); },
                       [&](std::uint64_t c) { return run_lat<rdx_api>(*g_fabric, o, size, c); }, n, size, 1,
                       1);
                 });
    }
  }
  for (op o : {op::window_write_bw, op::window_read_bw}) {
    for (unsigned qps : {1u, 2u}) {
      for (unsigned depth : opt.depths) {
        for (std::size_t size : opt.sizes) {
          if ((depth > 1 && size > opt.depth64_max) || (qps > 1 && size < opt.stripe_min)) continue;
          const std::uint64_t n = bw_count(size, depth);
          reg_paired("fabric/paired/" + std::string(to_string(o)) + "/size:" + size_name(size) +
                         "/depth:" + std::to_string(depth) + "/qps:" + std::to_string(qps),
                     [=](benchmark::State& s) {
                       paired_bench(
                           s, true,
                           [&](std::uint64_t c) {
                             return run_stripe_bw<raw_api>(*g_fabric, o, size, depth, c, qps);
                           },
                           [&](std::uint64_t c) { return run_window_bw(*g_fabric, o, size, depth, c, qps); },
                           n, size, depth, qps);
                     });
        }
      }
    }
  }
  for (op o : {op::window_write_lat, op::window_read_lat}) {
    for (std::size_t size : opt.sizes) {
      const std::uint64_t n = lat_count(size);
      reg_paired("fabric/paired/" + std::string(to_string(o)) + "/size:" + size_name(size),
                 [=](benchmark::State& s) {
                   paired_bench(
                       s, false,
                       [&](std::uint64_t c) { return run_window_lat<raw_api>(*g_fabric, o, size, c); },
                       [&](std::uint64_t c) { return run_window_lat<rdx_api>(*g_fabric, o, size, c); }, n,
                       size, 1, 1);
                 });
    }
  }
  for (op o : {op::chan_send_bw, op::chan_zc_bw}) {
    for (unsigned depth : opt.depths) {
      for (std::size_t size : opt.sizes) {
        if (size > chan_max || (depth > 1 && size > opt.depth64_max)) continue;
        const std::uint64_t n = bw_count(size, depth);
        reg_paired(
            "fabric/paired/" + std::string(to_string(o)) + "/size:" + size_name(size) +
                "/depth:" + std::to_string(depth),
            [=](benchmark::State& s) {
              paired_bench(
                  s, true,
                  [&](std::uint64_t c) { return run_bw<raw_api>(*g_fabric, op::send_bw, size, depth, c); },
                  [&](std::uint64_t c) { return run_chan(*g_fabric, o, size, depth, c); }, n, size, depth, 1);
            });
      }
    }
  }
  for (op o : {op::chan_send_lat, op::chan_zc_lat}) {
    for (std::size_t size : opt.sizes) {
      if (size > chan_max) continue;
      const std::uint64_t n = lat_count(size);
      reg_paired("fabric/paired/" + std::string(to_string(o)) + "/size:" + size_name(size),
                 [=](benchmark::State& s) {
                   paired_bench(
                       s, false,
                       [&](std::uint64_t c) { return run_lat<raw_api>(*g_fabric, op::send_lat, size, c); },
                       [&](std::uint64_t c) { return run_chan(*g_fabric, o, size, 1, c); }, n, size, 1, 1);
                 });
    }
  }
}

}  // namespace
}  // namespace rdx_bench

int main(int argc, char** argv) {
  using namespace rdx_bench;
  try {
    parse_options(argc, argv);
    const char* peer = std::getenv("RDX_PEER_ADDR");
    const bool twonode = opt.mode == "twonode" || (opt.mode == "auto" && peer != nullptr && *peer != '\0');
    const char* node = std::getenv("RDX_NODE");
    const std::size_t region = region_size();
    if (plan_only) {
      // What bench/run_fabric.sh matches perftest runs to: same sizes, depths and counts.
      for (op o : {op::write_bw, op::read_bw, op::send_bw}) {
        for (unsigned depth : opt.depths) {
          for (std::size_t size : opt.sizes) {
            if (depth > 1 && size > opt.depth64_max) continue;
            std::printf("%s %zu %u %llu\n", std::string(to_string(o)).c_str(), size, depth,
                        static_cast<unsigned long long>(bw_count(size, depth)));
          }
        }
      }
      for (op o : {op::write_lat, op::read_lat, op::send_lat}) {
        for (std::size_t size : opt.sizes) {
          std::printf("%s %zu 1 %llu\n", std::string(to_string(o)).c_str(), size,
                      static_cast<unsigned long long>(lat_count(size)));
        }
      }
      return 0;
    }
    if (twonode && node != nullptr && std::string_view(node) == "1") return fabric::serve(opt.port);

    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
    const bool have_device = !rdx::device_list().empty();
    if (!have_device) std::fprintf(stderr, "note: no RDMA device: only micro/build runs\n");
    register_all(have_device);
    benchmark::AddCustomContext("rdx_mode", twonode ? "twonode" : "loopback");
    if (have_device) {
      rdx::context ctx = rdx::context::open_default();
      benchmark::AddCustomContext("rdx_device", ctx.name());
      if (twonode) {
        if (peer == nullptr || *peer == '\0')
          throw std::invalid_argument("--rdx_mode=twonode needs RDX_PEER_ADDR");
        g_fabric = fabric::connect(peer, opt.port, region, max_qps);
      } else {
        g_fabric = fabric::loopback(region, max_qps);
      }
    }
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    g_fabric.reset();
    g_micro.reset();
    if (g_failures != 0) {
      std::fprintf(stderr, "rdx_bench: %u benchmark(s) failed (see their error_message)\n", g_failures);
      return 3;
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rdx_bench: %s\n", e.what());
    return 1;
  }
}
