// rdx::detail: a connection's grants (the peer's only way into memory): backing
// each one with its memory windows or exact registration, widening the queue
// pairs' remote rights to what the grants need, binding the windows once the
// queue pairs are in RTS, revoking, and the peer's per-queue-pair keys.
// The rules: rdx's design notes (share/doc/rdx/design.md), "Trust", "Grants". A part of
// detail/engine_all.hpp (include that).
#pragma once

#include <rdx/channel/detail/engine.hpp>

namespace rdx::detail {

inline grant_base::grant_base(engine& e, const memory_region& mr, const void* addr, std::size_t bytes,
                              access rights, grant_options opt) {
  e.attach_grant(*this, mr, addr, bytes, rights, opt);
}

inline grant_base::grant_base(grant_base&& o) noexcept
    : eng_(std::exchange(o.eng_, nullptr)),
      prev_(std::exchange(o.prev_, nullptr)),
      next_(std::exchange(o.next_, nullptr)),
      bytes_(o.bytes_),
      rights_(o.rights_),
      backing_(o.backing_),
      first_qp_only_(o.first_qp_only_),
      bound_(o.bound_),
      revoked_(std::exchange(o.revoked_, true)),
      windows_(std::move(o.windows_)),
      exact_(std::move(o.exact_)),
      rkeys_(std::move(o.rkeys_)) {
  o.exact_.reset();
  if (eng_ != nullptr) {
    eng_->follow_grant_move(o, *this);
  }
}

inline void grant_base::revoke() noexcept {
  if (revoked_) {
    return;
  }
  revoked_ = true;
  if (eng_ != nullptr) {
    std::exchange(eng_, nullptr)->detach_grant(*this);
  }
  windows_.clear();  // ibv_dealloc_mw: the keys are invalid when it returns
  exact_.reset();
}

inline void engine::attach_grant(grant_base& g, const memory_region& mr, const void* addr, std::size_t bytes,
                                 access rights, grant_options opt) {
  thread_check::scope guard(*thread_, "granting a window");
  auto bad = [](errc e, const std::string& what) { throw_rdx(e, "grant: " + what); };
  if (closing_) {
    bad(errc::operation_aborted, "the connection is being destroyed");
  }
  if (failed_) {
    bad(errc::operation_failed, "the connection has failed (" + failure_.message() + ")");
  }
  if (!mr || mr.native_handle()->pd != pd_.native_handle()) {
    bad(errc::invalid_argument, "the memory region belongs to another protection domain than the connection");
  }
  grant_backing b = opt.backing;
  if (b == grant_backing::automatic) {
    b = grants_.windows_supported() ? grant_backing::memory_window : grant_backing::exact_registration;
  }
  if (b == grant_backing::memory_window && !grants_.windows_supported()) {
    bad(errc::unsupported, "the device " + ctx_.name() +
                               " has no type 2 memory windows; ask for grant_backing::exact_registration "
                               "(or automatic, which falls back to it)");
  }
  g.bytes_ = bytes;
  g.rights_ = rights;
  g.backing_ = b;
  const std::size_t n = g.first_qp_only_ ? 1 : qps_.size();
  if (b == grant_backing::memory_window) {
    // The windows bind over a registration of exactly the range, with no
    // remote rights of its own: a NIC that checks a window's access against
    // its region's bounds rather than its own (Soft-RoCE does) still refuses
    // every byte outside the grant.
    g.exact_.emplace(pd_, const_cast<void*>(addr), bytes, access::local_write | access::mw_bind);
    g.windows_.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      g.windows_.emplace_back(pd_, mw_type::type2);
      g.rkeys_.push_back(g.windows_.back().next_rkey());
    }
  } else {
    g.exact_.emplace(pd_, const_cast<void*>(addr), bytes, rights);
    g.rkeys_.assign(n, g.exact_->rkey());
    g.bound_ = true;
  }
  // Listed last, so a failure above leaves nothing behind.
  g.eng_ = this;
  const access want = grants_.add(g);
  if (!g.first_qp_only_) {
    for (auto& q : qps_) {
      if (q.remote_access() != want) {
        try {
          q.set_remote_access(want);
        } catch (...) {
          g.revoke();
          throw;
        }
      }
    }
  }
  if (connected_ && !g.bound_) {
    try {
      bind_grants();
    } catch (...) {
      g.revoke();
      throw;
    }
  }
}

inline void engine::detach_grant(grant_base& g) noexcept {
  grants_.remove(g);
}

inline void engine::follow_grant_move(grant_base& from, grant_base& to) noexcept {
  grants_.moved(from, to);
}

// Binds every window not bound yet, each through its own queue pair, and
// waits (bounded by detection_bound()) until the NIC has done so.
inline void engine::bind_grants() {
  const auto deadline = std::chrono::steady_clock::now() + detection_bound();
  std::vector<std::pair<std::uint32_t, std::uint64_t>> posted;
  auto wait = [&](const char* what, auto&& done) {
    while (!done()) {
      if (failed_) {
        throw error(failure_, std::string("grant: ") + what + " failed");
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        throw error(errc::timed_out, std::string("grant: ") + what + " did not complete within " +
                                         std::to_string(detection_bound().count()) + " ms");
      }
      progress();
    }
  };
  for (grant_base* g = grants_.first(); g != nullptr; g = grant_table::next(*g)) {
    if (g->bound_) {
      continue;
    }
    for (std::uint32_t i = 0; i < g->windows_.size(); ++i) {
      send_queue& q = sqs_[i];
      wait("waiting for send-queue room to bind a memory window", [&] { return q.has_room(); });
      send_wr w =
          g->windows_[i].bind_wr(g->exact_->native_handle(),
                                 reinterpret_cast<std::uint64_t>(g->exact_->addr()), g->bytes_, g->rights_);
      posted.emplace_back(i, q.next_seq());
      // Signaled: the bind completes locally, without waiting for the peer
      // (in connect_pair the peer is not connected yet).
      if (std::error_code ec = q.post_signaled(w, nullptr, rec_probe)) {
        throw error(ec, "grant: posting the bind of a memory window on queue pair " + std::to_string(i));
      }
    }
    g->bound_ = true;
  }
  for (const auto& [qi, seq] : posted) {
    wait("binding a memory window", [&, qi = qi, seq = seq] { return sqs_[qi].find(seq) == nullptr; });
  }
}

inline std::uint32_t engine::add_peer_window(std::span<const std::uint32_t> keys) {
  return grants_.add_peer_window(keys, qps_.size());
}

inline void engine::revoke_grants() noexcept {
  grants_.revoke_all();
}

}  // namespace rdx::detail
