// pingpong's runs, one per kind of session; main() picks one from the options.
#pragma once

#include "options.hpp"

namespace pingpong {

//! send or write_imm over raw verbs, set up over TCP or (--cm) rdma_cm.
int run_native(const options& o);

//! --rc-compat: ibv_rc_pingpong's exchange and traffic.
int run_rc_compat(const options& o);

//! --channel or --window over rdx::connection: a client, or the server of one client.
int run_typed(const options& o);

//! --channel or --window with --clients N: N clients on one worker, from one thread.
int serve_typed_clients(const options& o);

}  // namespace pingpong
