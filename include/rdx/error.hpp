// rdx: error types. Setup throws rdx::error; the data path returns statuses.
#pragma once

#include <infiniband/verbs.h>

#include <cerrno>
#include <cstdio>
#include <string>
#include <string_view>
#include <system_error>

//! Owners of the verbs objects, typed work requests, and connections with typed channels and
//! remote windows (the core, which needs only libibverbs).
namespace rdx {

//! Library errors that are not an errno: bad arguments caught before the NIC.
enum class errc {
  ok = 0,              //!< no error: value 0, so the error code converts to false
  invalid_argument,    //!< a value outside what the call accepts
  out_of_range,        //!< an offset/length outside a window or buffer
  limit_exceeded,      //!< a depth, size or count above a device limit
  not_ready,           //!< object not in a state that allows the call
  wire_format,         //!< a malformed, truncated or foreign wire message
  timed_out,           //!< a wait or a bootstrap step passed its deadline
  no_device,           //!< no RDMA device matched
  unsupported,         //!< the device or kernel does not do this
  operation_failed,    //!< an earlier failure stopped this operation
  operation_aborted,   //!< the connection was closed or destroyed before the operation ended
  operation_canceled,  //!< cancel() or a stop request ended the operation
  protocol_error,      //!< the peer sent an impossible value (a credit count, a header)
  //! set-up authentication refused the peer: its key, a nonce or the transcript
  authentication_failed,
  rejected,           //!< the peer (or its connection manager) refused the connection
  unreachable,        //!< no route to the peer, or its connection manager never answered
  address_error,      //!< an address that cannot be resolved to a local RDMA device
  peer_disconnected,  //!< the peer disconnected (rdma_cm): pending operations end at once
  //! work stayed posted with neither a completion nor an error for
  //! connection_attr::stall_timeout: the NIC, its driver or the peer stopped
  no_progress,
  //! the device reported an asynchronous error on one of the connection's
  //! queue pairs, its completion queue or the device itself (QP_FATAL,
  //! QP_ACCESS_ERR, CQ_ERR, DEVICE_FATAL...; failure_message() names it)
  device_error,
  //! a sealed message (connection_attr::encrypt) failed its check: changed
  //! on the wire, replayed, reordered, or sealed with another key; it was
  //! not delivered (failure_message() says which)
  integrity_failed,
  //! the connection's messages go to a handler (channel::on_message): a
  //! receive is refused while one is set, and a handler while receives wait
  handler_set,
};
}  // namespace rdx

template <>
struct std::is_error_code_enum<rdx::errc> : std::true_type {};

namespace rdx {

namespace detail {
class rdx_category_impl final : public std::error_category {
public:
  const char* name() const noexcept override { return "rdx"; }
  std::string message(int ev) const override {
    switch (static_cast<errc>(ev)) {
      case errc::ok: return "success";
      case errc::invalid_argument: return "invalid argument";
      case errc::out_of_range: return "out of range";
      case errc::limit_exceeded: return "device limit exceeded";
      case errc::not_ready: return "object not ready";
      case errc::wire_format: return "malformed wire message";
      case errc::timed_out: return "timed out";
      case errc::no_device: return "no RDMA device";
      case errc::unsupported: return "not supported";
      case errc::operation_failed: return "operation failed after an earlier error";
      case errc::operation_aborted: return "operation aborted: its connection was closed";
      case errc::operation_canceled: return "operation canceled";
      case errc::protocol_error: return "protocol error: the peer sent an impossible value";
      case errc::authentication_failed: return "authentication failed";
      case errc::rejected: return "connection rejected";
      case errc::unreachable: return "peer unreachable";
      case errc::address_error: return "address error";
      case errc::peer_disconnected: return "the peer disconnected";
      case errc::no_progress: return "no progress: posted work neither completed nor failed";
      case errc::device_error: return "the device reported an asynchronous error";
      case errc::integrity_failed: return "a sealed message failed its integrity check";
      case errc::handler_set:
        return "messages go to a handler (on_message): no receive while it is set, no handler while "
               "receives wait";
    }
    return "unknown rdx error";
  }
};

class wc_category_impl final : public std::error_category {
public:
  const char* name() const noexcept override { return "ibv_wc_status"; }
  std::string message(int ev) const override {
    std::string m = ibv_wc_status_str(static_cast<ibv_wc_status>(ev));
    const char* h = hint(static_cast<ibv_wc_status>(ev));
    if (h != nullptr && *h != '\0') {
      m += " (";
      m += h;
      m += ")";
    }
    return m;
  }
  //! A short hint for the usual cause of a completion status.
  static const char* hint(ibv_wc_status s) noexcept {
    switch (s) {
      case IBV_WC_RETRY_EXC_ERR: return "peer unreachable, wrong GID or QP number, or peer QP not ready";
      case IBV_WC_REM_ACCESS_ERR: return "remote key, bounds or permission wrong for this remote range";
      case IBV_WC_LOC_PROT_ERR: return "local buffer not inside a memory region with this lkey";
      case IBV_WC_LOC_ACCESS_ERR: return "local memory region lacks the access the operation needs";
      case IBV_WC_RNR_RETRY_EXC_ERR: return "receiver not ready: no receive was posted in time";
      case IBV_WC_REM_INV_REQ_ERR: return "remote side refused the request: opcode, length or rights";
      case IBV_WC_WR_FLUSH_ERR: return "queue pair went to error before this request ran";
      case IBV_WC_LOC_LEN_ERR: return "message longer than the posted receive buffer";
      default: return "";
    }
  }
};
}  // namespace detail

//! Category of rdx's own error codes.
inline const std::error_category& rdx_category() noexcept {
  static const detail::rdx_category_impl c;
  return c;
}
//! Category of work completion statuses (ibv_wc_status) with hints.
inline const std::error_category& wc_category() noexcept {
  static const detail::wc_category_impl c;
  return c;
}

namespace detail {
// std::system_category(), looked up once. std::error_code{} calls into the
// standard library for it each time, and the data path, which makes no such
// call per operation, returns success on every post and every completion. Defined
// before anything that includes this header, so it is set before any of
// their static objects are.
inline const std::error_category& system_category_ref = std::system_category();
// Success: equal to std::error_code{} (0 in std::system_category()), without the call.
[[gnu::always_inline]] inline std::error_code no_error() noexcept {
  return {0, system_category_ref};
}
}  // namespace detail

//! e as an error code of rdx_category(); found by ADL, so an errc compares with and converts to
//! std::error_code.
inline std::error_code make_error_code(errc e) noexcept {
  return {static_cast<int>(e), rdx_category()};
}
//! A work completion status as an error code (success maps to an empty code).
inline std::error_code make_wc_error_code(ibv_wc_status s) noexcept {
  return s == IBV_WC_SUCCESS ? detail::no_error() : std::error_code{static_cast<int>(s), wc_category()};
}

//! The one exception type of rdx: what failed ("verb on object"), and why.
class error : public std::system_error {
public:
  //! What failed (what, e.g. "ibv_reg_mr on mlx5_0") and why (ec: an errno, errc or wc status);
  //! what() holds both.
  error(std::error_code ec, const std::string& what) : std::system_error(ec, what) {}
  //! The same with one of rdx's own codes.
  error(errc e, const std::string& what) : std::system_error(make_error_code(e), what) {}
};

namespace detail {
//! The pointer to rdx-doctor that bring-up errors end with: the doctor's
//! checks (comma-separated names, as `rdx-doctor --check` takes them) that
//! confirm or rule out the likely cause on this host.
inline std::string doctor_hint(std::string_view checks) {
  return "; `rdx-doctor --check " + std::string(checks) + "` checks this host";
}
//! Throws rdx::error for a failed verb: "verb on object: strerror(err)".
[[noreturn]] inline void throw_errno(std::string_view verb, std::string_view object, int err) {
  std::string w(verb);
  if (!object.empty()) {
    w += " on ";
    w += object;
  }
  throw error(std::error_code(err, std::generic_category()), w);
}
[[noreturn]] inline void throw_rdx(errc e, std::string_view what) {
  throw error(e, std::string(what));
}

//! f()'s value with ec cleared, or, when f throws rdx::error, a default value with the error's
//! code in ec: the boundary of a set-up call's std::error_code& form. Anything else f throws
//! (std::bad_alloc) passes through.
template <class F>
auto value_or_code(std::error_code& ec, F&& f) -> decltype(f()) {
  ec.clear();
  try {
    return f();
  } catch (const error& e) {
    ec = e.code();
  }
  return {};
}

//! Log hook for failures that cannot be thrown (destructors).
using log_hook_t = void (*)(std::string_view message) noexcept;
inline void default_log_hook(std::string_view message) noexcept {
  std::fprintf(stderr, "rdx: %.*s\n", static_cast<int>(message.size()), message.data());
}
inline log_hook_t& log_hook_ref() noexcept {
  static log_hook_t hook = &default_log_hook;
  return hook;
}
//! Reports a failed destroy once, never throws.
inline void report_destroy_failure(std::string_view verb, int err) noexcept {
  char buf[160];
  int n = std::snprintf(buf, sizeof buf, "%.*s failed: errno %d", static_cast<int>(verb.size()), verb.data(),
                        err);
  log_hook_ref()(std::string_view(buf, n > 0 ? static_cast<std::size_t>(n) : 0));
}
}  // namespace detail

//! Installs a hook that receives failures that cannot be thrown; returns the old one.
inline detail::log_hook_t set_log_hook(detail::log_hook_t hook) noexcept {
  auto& h = detail::log_hook_ref();
  auto old = h;
  h = hook != nullptr ? hook : &detail::default_log_hook;
  return old;
}

}  // namespace rdx
