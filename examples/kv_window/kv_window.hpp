// kv_window: what main, the server and the client share: the failure of a
// check and the two sides of the program.
#pragma once

#include <rdx/channel/operation.hpp>

#include <stdexcept>
#include <string>
#include <system_error>

#include "options.hpp"

namespace kv {

struct failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline void expect_ok(rdx::operation& op, const options& o, const std::string& what) {
  const std::error_code ec = op.wait(o.timeout, o.events ? rdx::wait_mode::events : rdx::wait_mode::poll);
  if (ec) throw failure(what + ": " + ec.message());
}

//! Serves the table to o.clients clients (server.cpp). @return 0; throws failure.
int serve(const options& o);
//! Reads, writes and bumps the records of the server at o.server (client.cpp). @return 0; throws failure.
int run_client(const options& o);

}  // namespace kv
