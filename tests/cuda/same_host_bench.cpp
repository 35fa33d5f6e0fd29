// Same-host window figures between two processes on one GPU, against the
// limit, cudaMemcpyAsync device to device inside one process:
//   - write bandwidth for 1 MiB to 1 GiB, by copy engine and by SM copy;
//   - latency of a 4 KiB write with its completion (write(), then wait());
//   - export plus import time per region (VMM and legacy IPC), first and after.
// The whole buffer written by each copier is then checked by a kernel in the
// exporting process. Prints RESULT lines for scripts/gpu-check.sh.
//
//   usage: cuda_same_host_bench    (1 GiB buffers on each side)
#include <rdx/cuda/same_host.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <span>
#include <string_view>
#include <vector>

#include "patterns.hpp"
#include "two_process.hpp"

namespace {

namespace cu = rdx::cuda;
using clock_type = std::chrono::steady_clock;
constexpr auto rw = rdx::rights::read | rdx::rights::write;
constexpr int regions = 8;
constexpr std::size_t region_bytes = std::size_t{64} << 20;

double seconds(clock_type::duration d) {
  return std::chrono::duration<double>(d).count();
}

std::uint32_t receive(cu::same_host_peer& p) {
  auto n = p.receive_notification();
  if (const std::error_code ec = n.wait(std::chrono::seconds(120))) {
    throw rdx::error(ec, "receive_notification");
  }
  return n.tag();
}
void notify(cu::same_host_peer& p, std::uint32_t tag) {
  auto n = p.notify(tag);
  if (const std::error_code ec = n.wait()) {
    throw rdx::error(ec, "notify");
  }
}

int child(std::size_t max_bytes) {
  auto p = cu::same_host_peer::from_socket(rdx_test::child_socket_fd);
  cu::shareable_buffer<std::uint8_t> dst(max_bytes);
  auto g = p.grant(dst, 0, max_bytes, rw);
  std::vector<cu::shareable_buffer<std::uint8_t>> vmm;
  std::vector<cu::device_buffer<std::uint8_t>> legacy;
  std::vector<cu::same_host_grant> grants;
  for (;;) {
    const std::uint32_t t = receive(p);
    if (t == 100 || t == 101) {  // check what the parent wrote with seed 7 or 8
      RDX_CUDA_TRY(cudaDeviceSynchronize());
      notify(p, rdx_test::gpu_check(dst.data(), max_bytes, t == 100 ? 7 : 8).ok() ? 1 : 0);
    } else if (t == 200) {  // export regions, timing each grant
      for (int i = 0; i < regions; ++i) {
        vmm.emplace_back(region_bytes);
        legacy.emplace_back(region_bytes);
      }
      for (int i = 0; i < 2 * regions + 1; ++i) {
        const auto t0 = clock_type::now();
        grants.push_back(i < regions ? p.grant(vmm[static_cast<std::size_t>(i)], 0, region_bytes, rw)
                         : i < 2 * regions
                             ? p.grant(legacy[static_cast<std::size_t>(i - regions)], 0, region_bytes, rw)
                             : p.grant(vmm[1], 0, region_bytes, rw));  // mapped there already
        notify(p, static_cast<std::uint32_t>(
                      std::chrono::duration_cast<std::chrono::nanoseconds>(clock_type::now() - t0).count()));
      }
    } else if (t == 999) {
      return 0;
    }
  }
}

// Bytes per second of `iters` copies of n bytes by copy (queued on s), timed with events.
template <class Copy>
double in_process(Copy copy, std::size_t n, int iters, cudaStream_t s) {
  cu::event a(cu::event::timing::on);
  cu::event b(cu::event::timing::on);
  double best = 0;
  for (int round = 0; round < 3; ++round) {
    a.record(s);
    for (int i = 0; i < iters; ++i) {
      copy(n, s);
    }
    b.record(s);
    b.synchronize();
    best = std::max(best, static_cast<double>(n) * iters / (cu::event::elapsed_ms(a, b) * 1e-3));
  }
  return best;
}

// Bytes per second of `iters` window writes of n bytes, from the first write() to the last wait().
double windowed(cu::same_host_window<std::uint8_t>& w, const std::uint8_t* src, std::size_t n, int iters,
                std::vector<cu::peer_operation>& ops) {
  double best = 0;
  for (int round = 0; round < 3; ++round) {
    const auto t0 = clock_type::now();
    for (int i = 0; i < iters; ++i) {
      auto& slot = ops[static_cast<std::size_t>(i) % ops.size()];
      if (i >= static_cast<int>(ops.size())) {  // its slot's earlier write must end first
        if (const std::error_code ec = slot.wait()) throw rdx::error(ec, "window write");
      }
      slot = w.write(std::span<const std::uint8_t>(src, n), 0);
    }
    for (auto& op : ops) {
      if (const std::error_code ec = op.wait(); ec && ec != rdx::errc::not_ready)
        throw rdx::error(ec, "window write");
    }
    best = std::max(best, static_cast<double>(n) * iters / seconds(clock_type::now() - t0));
  }
  return best;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

int parent(std::size_t max_bytes) {
  cu::stream s;
  cu::device_buffer<std::uint8_t> src(max_bytes);
  cu::device_buffer<std::uint8_t> local(max_bytes);
  rdx_test::gpu_fill(src.data(), max_bytes, 3);
  RDX_CUDA_TRY(cudaDeviceSynchronize());
  const auto c = rdx_test::spawn_child("bench");
  auto p = cu::same_host_peer::from_socket(c.socket, {.depth = 128});
  std::printf("choice: %s (%s)\n", std::string(cu::to_string(p.choice().path)).c_str(),
              p.choice().reason.c_str());
  auto w = p.accept_window<std::uint8_t>();
  std::vector<cu::peer_operation> ops(64);

  std::vector<std::size_t> sizes;
  for (std::size_t n = std::size_t{1} << 20; n <= max_bytes; n *= 4) sizes.push_back(n);
  if (sizes.back() != max_bytes) sizes.push_back(max_bytes);
  for (const bool sm : {false, true}) {
    p.set_copier(sm ? &rdx_test::sm_copy : nullptr);
    const char* how = sm ? "sm" : "ce";
    for (const std::size_t n : sizes) {
      const int iters = static_cast<int>(std::clamp<std::size_t>((std::size_t{8} << 30) / n, 8, 2000));
      const double limit = in_process(
          [&](std::size_t b, cudaStream_t st) {
            if (sm) {
              RDX_CUDA_TRY(rdx_test::sm_copy(local.data(), src.data(), b, st));
            } else {
              RDX_CUDA_TRY(cudaMemcpyAsync(local.data(), src.data(), b, cudaMemcpyDeviceToDevice, st));
            }
          },
          n, iters, s.native_handle());
      (void)windowed(w, src.data(), n, 4, ops);  // warm
      const double got = windowed(w, src.data(), n, iters, ops);
      std::printf("RESULT bw %s %5zu MiB  window %7.1f GB/s  in-process %7.1f GB/s  ratio %.3f\n", how,
                  n >> 20, got / 1e9, limit / 1e9, got / limit);
    }
    // every byte of the peer's buffer, written by this copier, checked there.
    rdx_test::gpu_fill(src.data(), max_bytes, sm ? 8 : 7);
    RDX_CUDA_TRY(cudaDeviceSynchronize());
    auto op = w.write(std::span<const std::uint8_t>(src.data(), max_bytes), 0);
    if (const std::error_code ec = op.wait()) throw rdx::error(ec, "window write (check)");
    notify(p, sm ? 101 : 100);
    std::printf("RESULT check %s %zu MiB written across, every byte checked by the peer: %s\n", how,
                max_bytes >> 20, receive(p) == 1 ? "ok" : "FAILED");
  }
  p.set_copier(nullptr);

  // 4 KiB: write() to its completion seen by wait(), against cudaMemcpyAsync + event in one process.
  std::vector<double> lat;
  std::vector<double> base;
  cu::event e;
  for (int i = 0; i < 2000; ++i) {
    const auto t0 = clock_type::now();
    auto op = w.write(std::span<const std::uint8_t>(src.data(), 4096), 0);
    if (const std::error_code ec = op.wait()) throw rdx::error(ec, "4 KiB write");
    const auto t1 = clock_type::now();
    RDX_CUDA_TRY(
        cudaMemcpyAsync(local.data(), src.data(), 4096, cudaMemcpyDeviceToDevice, s.native_handle()));
    e.record(s);
    while (!e.ready()) {}
    const auto t2 = clock_type::now();
    if (i >= 100) {
      lat.push_back(seconds(t1 - t0) * 1e6);
      base.push_back(seconds(t2 - t1) * 1e6);
    }
  }
  std::printf(
      "RESULT latency 4 KiB write+completion  window %.2f us  in-process memcpy+event %.2f us (medians)\n",
      median(lat), median(base));

  // Export (peer, grant()) plus import (here, accept_window()) per 64 MiB region.
  notify(p, 200);
  std::vector<cu::same_host_window<std::uint8_t>> windows;
  std::vector<double> vmm_ms;
  std::vector<double> legacy_ms;
  double cached_export_ms = 0;
  double cached_import_ms = 0;
  for (int i = 0; i < 2 * regions + 1; ++i) {
    const double export_ms = receive(p) * 1e-6;  // the grant frame is here already
    const auto t0 = clock_type::now();
    windows.push_back(p.accept_window<std::uint8_t>());
    const double import_ms = seconds(clock_type::now() - t0) * 1e3;
    if (i == 2 * regions) {
      cached_export_ms = export_ms;
      cached_import_ms = import_ms;
    } else {
      (i < regions ? vmm_ms : legacy_ms).push_back(export_ms + import_ms);
    }
  }
  auto after_first = [](const std::vector<double>& v) {
    return median(std::vector<double>(v.begin() + 1, v.end()));
  };
  std::printf("RESULT export+import vmm 64 MiB  first %.3f ms  after %.3f ms (median of %d)\n", vmm_ms[0],
              after_first(vmm_ms), regions - 1);
  std::printf("RESULT export+import legacy-ipc 64 MiB  first %.3f ms  after %.3f ms (median of %d)\n",
              legacy_ms[0], after_first(legacy_ms), regions - 1);
  std::printf(
      "RESULT export+import vmm, allocation mapped already (cache hit)  export %.3f ms + import %.3f ms\n",
      cached_export_ms, cached_import_ms);
  windows.clear();
  notify(p, 999);
  return rdx_test::wait_child(c.pid);
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc == 3 && std::string_view(argv[1]) == "--child") {
    return child(std::size_t{1024} << 20);
  }
  if (const std::string why = cu::no_device_reason(); !why.empty()) {
    std::fprintf(stderr, "cuda_same_host_bench: SKIP: needs a CUDA GPU: %s\n", why.c_str());
    return 77;
  }
  return parent(std::size_t{1024} << 20);
} catch (const std::exception& e) {
  std::fprintf(stderr, "cuda_same_host_bench: %s\n", e.what());
  return 1;
}
