// rdx's programs (examples/ and tools/): the helpers they share (argument
// parsing, device opening, statistics, the TCP bootstrap). Not part of the
// library and not installed: each program compiles it in.
#pragma once

#include <rdx/rdx.hpp>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace app {

//! A command-line mistake: printed with a pointer to --help, exit status 2.
struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

//! Parses an unsigned number (decimal, or hex with 0x) in [lo, hi]; accepts K/M/G
//! suffixes when `sizes` is set (powers of 1024).
inline std::uint64_t parse_number(std::string_view opt, std::string_view text, std::uint64_t lo,
                                  std::uint64_t hi, bool sizes = false) {
  std::uint64_t mult = 1;
  std::string_view digits = text;
  if (sizes && !digits.empty()) {
    switch (digits.back()) {
      case 'k':
      case 'K': mult = 1024; break;
      case 'm':
      case 'M': mult = 1024 * 1024; break;
      case 'g':
      case 'G': mult = 1024ull * 1024 * 1024; break;
      default: break;
    }
    if (mult != 1) digits.remove_suffix(1);
  }
  int base = 10;
  if (digits.size() > 2 && digits[0] == '0' && (digits[1] == 'x' || digits[1] == 'X')) {
    base = 16;
    digits.remove_prefix(2);
  }
  std::uint64_t v = 0;
  auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v, base);
  if (digits.empty() || ec != std::errc{} || p != digits.data() + digits.size() || v > hi / mult ||
      v * mult < lo) {
    throw usage_error(std::string(opt) + " " + std::string(text) + ": expected a number from " +
                      std::to_string(lo) + " to " + std::to_string(hi));
  }
  return v * mult;
}

//! Walks argv, handing out options ("-s 64", "-s64", "--size 64", "--size=64").
class arg_reader {
public:
  arg_reader(int argc, char** argv) : args_(argv + 1, argv + argc) {}

  [[nodiscard]] bool done() const noexcept { return i_ >= args_.size(); }
  //! The current argument.
  [[nodiscard]] std::string_view peek() const { return args_[i_]; }

  //! True when the current argument is one of the given names; consumes it
  //! (and, with `value`, its value).
  bool match(std::initializer_list<std::string_view> names, std::string* value = nullptr) {
    std::string_view a = args_[i_];
    for (std::string_view n : names) {
      if (a == n) {
        ++i_;
        if (value != nullptr) {
          if (i_ >= args_.size()) throw usage_error(std::string(n) + " needs a value");
          *value = args_[i_++];
        }
        return true;
      }
      if (value == nullptr) continue;
      // --name=value and -xVALUE
      if (n.starts_with("--") && a.size() > n.size() && a.starts_with(n) && a[n.size()] == '=') {
        *value = std::string(a.substr(n.size() + 1));
        ++i_;
        return true;
      }
      if (!n.starts_with("--") && n.size() == 2 && a.size() > 2 && a.starts_with(n)) {
        *value = std::string(a.substr(2));
        ++i_;
        return true;
      }
    }
    return false;
  }

  //! Consumes and returns the current argument (a positional one).
  std::string take() { return args_[i_++]; }

private:
  std::vector<std::string> args_;
  std::size_t i_ = 0;
};

//! Opens the named device, or the default one (RDX_DEVICE, else the first with an ACTIVE port).
inline rdx::context open_device(const std::string& name) {
  return name.empty() ? rdx::context::open_default() : rdx::context::open(name);
}

//! The p-th percentile (0..100) of sorted samples, nearest-rank.
inline double percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  auto rank =
      static_cast<std::size_t>(std::max(1.0, std::ceil(p / 100.0 * static_cast<double>(sorted.size()))));
  return sorted[std::min(rank, sorted.size()) - 1];
}

//! The bootstrap connection: a client connects to server (retrying until
//! timeout); a server (server empty) listens on port, says so, and accepts one
//! client. @throws rdx::error naming the address and the cause.
inline rdx::tcp::socket bootstrap_socket(const std::string& server, std::uint16_t port,
                                         std::chrono::milliseconds timeout) {
  if (!server.empty()) return rdx::tcp::connect(server, port, timeout);
  auto l = rdx::tcp::listener::bind("", port);
  std::printf("  waiting for a client on TCP port %u\n", l.port());
  std::fflush(stdout);
  return l.accept(timeout);
}

}  // namespace app
