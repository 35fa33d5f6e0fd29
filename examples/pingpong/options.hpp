// pingpong's command line: the modes, the options they set, and the failure
// that ends a run.
#pragma once

#include <rdx/connect/rc_pingpong_exchange.hpp>
#include <rdx/rdx.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

namespace pingpong {

using steady = std::chrono::steady_clock;

enum class mode : std::uint32_t { send = 1, write_imm = 2, channel = 3, window = 4 };

const char* mode_name(mode m);

struct options {
  std::string server;  // empty: act as the server
  std::string device;
  std::uint8_t ib_port = 0;
  std::optional<std::uint8_t> gid_index;
  std::size_t size = 4096;
  std::uint32_t iters = 1000;
  std::uint16_t tcp_port = rdx::rc_pingpong::default_port;
  std::optional<ibv_mtu> mtu;
  mode m = mode::send;
  bool rc_compat = false;
  bool cm = false;      // connect through rdma_cm instead of the TCP exchange
  bool events = false;  // sleep on completion events instead of busy polling
  std::chrono::seconds timeout{30};
  std::optional<std::chrono::milliseconds> ack_timeout;  // --ack-timeout: the local ACK timeout
  std::uint32_t clients = 1;                             // server: how many clients to serve, all at once
  bool pool = false;                                     // --clients server: one receive pool for all
  std::optional<std::uint32_t> corrupt_round;            // testing: damage one payload on purpose
  std::string psk_file;  // --psk-file: the pre-shared key that authenticates the TCP exchange
  bool encrypt = false;  // --encrypt: messages sealed with keys from the authenticated set-up
};

void usage(const char* argv0);

//! The options of argv; sets `help` (and stops) at -h or --help.
//! @throws app::usage_error for an unknown option, a bad value or options that do not go together
options parse_options(int argc, char** argv, bool& help);

//! The queue pair's connect options: the largest MTU and the ACK timeout asked for.
rdx::connect_options connect_opts(const options& o);

//! A failure that ends the run: printed, exit status 1.
struct failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace pingpong
