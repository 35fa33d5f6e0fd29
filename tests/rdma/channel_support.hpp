// Helpers for the channel tests: a loopback pair of connections on one
// device, and a minimal eager coroutine type to drive co_await.
#pragma once

#include <rdx/channel/channel.hpp>
#include <rdx/channel/connection.hpp>
#include <rdx/channel/exchange.hpp>
#include <rdx/channel/window.hpp>
#include <rdx/rdx.hpp>

#include <coroutine>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <string>
#include <system_error>
#include <utility>

namespace channel_test {

//! The sub-range grant the trust tests use (loopback and two nodes): 64
//! bytes at offset 4096 of a 1 MiB region, read and write.
namespace trust_case {
constexpr std::size_t region_bytes = 1 << 20;
constexpr std::size_t grant_at = 4096;
constexpr std::size_t grant_bytes = 64;
constexpr auto rw = rdx::rights::read | rdx::rights::write;
}  // namespace trust_case

//! Exits 77 (ctest: skipped) with a reason when the host has no RDMA device.
inline rdx::context open_device() {
  rdx::device_list list;
  if (list.empty()) {
    std::fprintf(stderr, "SKIP: no RDMA device on this host (run inside cmake/softroce/rdx-vm)\n");
    std::exit(77);
  }
  return rdx::context::open_default();
}

//! The code of the rdx::error f throws (its message in *what), or empty when it throws none.
inline std::error_code code_of(const std::function<void()>& f, std::string* what = nullptr) {
  try {
    f();
  } catch (const rdx::error& e) {
    if (what != nullptr) *what = e.what();
    return e.code();
  }
  return {};
}

//! Two connections of one device connected to each other.
struct pair {
  rdx::context ctx = open_device();
  rdx::protection_domain pd{ctx};
  rdx::connection a;
  rdx::connection b;
  explicit pair(const rdx::connection_attr& attr = {}, const rdx::connect_options& opt = {})
      : a(pd, attr), b(pd, attr) {
    rdx::connect_pair(a, b, opt);
  }
};

//! An eagerly started coroutine that keeps its frame until destroyed.
struct task {
  struct promise_type {
    task get_return_object() noexcept {
      return task{std::coroutine_handle<promise_type>::from_promise(*this)};
    }
    std::suspend_never initial_suspend() noexcept { return {}; }
    std::suspend_always final_suspend() noexcept { return {}; }
    void return_void() noexcept {}
    void unhandled_exception() noexcept { std::terminate(); }
  };
  explicit task(std::coroutine_handle<promise_type> h) noexcept : h_(h) {}
  task(task&& o) noexcept : h_(std::exchange(o.h_, {})) {}
  task(const task&) = delete;
  task& operator=(const task&) = delete;
  ~task() {
    if (h_) h_.destroy();
  }
  [[nodiscard]] bool done() const noexcept { return h_.done(); }

private:
  std::coroutine_handle<promise_type> h_;
};

}  // namespace channel_test
