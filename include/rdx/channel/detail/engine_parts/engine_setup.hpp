// rdx::detail: a connection's engine made: its parts, queue pairs and
// receives set up (or refused with the reason before anything reaches the
// NIC), and connected to its peer. A part of detail/engine_all.hpp
// (include that).
#pragma once

#include <rdx/channel/detail/engine.hpp>

#include <string>

namespace rdx::detail {

inline engine::engine(std::shared_ptr<worker_core> w, const protection_domain& pd,
                      const connection_attr& attr)
    : attr_(attr),
      wk_(std::move(w)),
      worker_(wk_.get()),
      ctx_(pd.device_context()),
      pd_(pd.share()),
      channel_(attr.events && worker_ == nullptr ? std::optional<completion_channel>(std::in_place, ctx_)
                                                 : std::nullopt),
      cq_(worker_ != nullptr
              ? worker_->cq().share()
              : completion_queue(
                    ctx_, completion_queue_attr{.depth = static_cast<int>(attr.queue_pairs * attr.send_depth +
                                                                          attr.recv_depth + 1),
                                                .channel = channel_ ? &*channel_ : nullptr})),
      ring_(make_ring(worker_, pd, attr, this)),
      slots_(pd, attr.recv_depth, attr.message_size, ring_.pool()),
      grants_(ctx_) {
  auto bad = [](const std::string& what) { throw_rdx(errc::invalid_argument, "connection: " + what); };
  const connection_attr& a = attr;
  if (a.queue_pairs < 1 || a.queue_pairs > 64) {
    bad("queue_pairs = " + std::to_string(a.queue_pairs) + ", need 1 to 64");
  }
  if (a.send_depth < 2) {
    bad("send_depth = " + std::to_string(a.send_depth) + ", need at least 2");
  }
  if (a.signal_interval < 1 || a.signal_interval >= a.send_depth) {
    bad("signal_interval = " + std::to_string(a.signal_interval) + ", need 1 to send_depth - 1 (" +
        std::to_string(a.send_depth - 1) + ")");
  }
  if (a.recv_depth < 1) {
    bad("recv_depth = 0, need at least 1");
  }
  if (a.message_size < 1) {
    bad("message_size = 0, need at least 1");
  }
  if (a.encrypt && a.message_size <= sealed_message_overhead) {
    bad("message_size = " + std::to_string(a.message_size) + " with encrypt: a sealed message takes " +
        std::to_string(sealed_message_overhead) + " bytes beside its payload, so at least " +
        std::to_string(sealed_message_overhead + 1) + " are needed");
  }
  if (a.chunk_size == 0 || a.chunk_size % 4096 != 0 || a.chunk_size > (std::size_t{1} << 30)) {
    bad("chunk_size = " + std::to_string(a.chunk_size) + ", need a multiple of 4096 up to 1 GiB");
  }
  if (a.keepalive.count() < 0 || a.drain_timeout.count() < 0 || a.stall_timeout.count() < 0) {
    bad("keepalive, drain_timeout and stall_timeout must not be negative");
  }
  if (worker_ != nullptr) {
    if (worker_->device_context().native_handle() != ctx_.native_handle()) {
      bad("the protection domain is of device " + ctx_.name() + " but the worker's completion queue is of " +
          worker_->device_context().name() + "; make the worker on the connection's device");
    }
    if (attr.events && !worker_->events()) {
      bad("events is set but the worker was made without events (worker_attr::events): its connections "
          "sleep on the worker's descriptor");
    }
    thread_ = &worker_->thread();
  } else if (attr_.events) {
    wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) {
      throw error(std::error_code(errno, std::generic_category()),
                  "connection: eventfd (stop-request wake-up)");
    }
  }
  start_device_events();
  qps_.reserve(attr_.queue_pairs);
  sqs_.reserve(attr_.queue_pairs);
  chunk_ = attr_.chunk_size;
  // A write or read of a page or less is one request wherever it lies: split
  // at a chunk boundary it would only cost a second request (paced: none).
  whole_ = attr_.pacing ? 0 : 4096;
  pacing_ = attr_.pacing;
  if (pacing_) {
    // A chunk of 1 byte sends every write and read of more than a byte to
    // post_chunks, which cuts it at the window's chunk (paced_left): the
    // usual path (post_rdma) stays as it is without pacing.
    chunk_ = 1;
    paced_.reserve(attr_.queue_pairs);
    for (std::uint32_t i = 0; i < attr_.queue_pairs; ++i) {
      paced_.emplace_back(attr_.send_depth);
    }
  }
  try {
    // On a worker: its queue entries reserved (or refused) before any queue
    // pair exists; shut_down() gives them back if anything below throws.
    if (worker_ != nullptr) {
      // On a receive pool its receives complete from the pool's share of the queue.
      worker_->add_connection(*this, static_cast<int>(attr.queue_pairs * attr.send_depth +
                                                      (ring_.pool() != nullptr ? 0 : attr.recv_depth) + 1));
    }
    for (std::uint32_t i = 0; i < attr_.queue_pairs; ++i) {
      queue_pair_attr qa{.max_send_wr = attr_.send_depth,
                         .max_recv_wr = i == 0 ? attr_.recv_depth : 1,
                         .port = attr_.port,
                         .gid_index = attr_.gid_index,
                         // Zero-length writes (cover, probe) need remote write on every queue
                         // pair (it reaches no memory: only a grant does); grants add read and
                         // atomic as they need them.
                         .remote_access = access::remote_write,
                         // On a receive pool, queue pair 0 takes its receives from the pool's queue.
                         .srq = i == 0 && ring_.pool() != nullptr ? &ring_.pool()->srq() : nullptr,
                         .post = attr_.post};
      qps_.emplace_back(pd, cq_, cq_, qa);
      if (worker_ != nullptr) {
        worker_->add_queue_pair(qps_.back().qp_num(), *this);
      }
      qps_.back().to_init();
      sqs_.emplace_back(qps_.back(), attr_.send_depth, attr_.signal_interval);
      sqs_.back().watch_cover(&uncovered_);
      nqp_ = static_cast<std::uint32_t>(sqs_.size());
    }
    for (std::uint32_t i = 0; ring_.pool() == nullptr && i < attr_.recv_depth; ++i) {
      if (std::error_code ec = ring_.post(qps_[0], i)) {
        throw error(ec, "connection: posting receive buffer " + std::to_string(i));
      }
    }
    attach_grant(grants_.credit(), ring_.control_region(), ring_.credit_word_address(), 8,
                 access::remote_write, {});
  } catch (...) {
    shut_down();
    throw;
  }
}

inline connection_info engine::local_info() const {
  connection_info i;
  for (const auto& q : qps_) {
    i.endpoints.push_back(q.local_endpoint());
  }
  i.credit_word = {reinterpret_cast<std::uint64_t>(ring_.credit_word_address()),
                   grants_.credit().keys().at(0), 8};
  i.recv_depth = attr_.recv_depth;
  i.message_size = attr_.message_size;
  i.encrypt = attr_.encrypt;
  return i;
}

inline void engine::seal_with(std::unique_ptr<message_seal> s) {
  if (!attr_.encrypt) {
    throw_rdx(errc::invalid_argument,
              "connection::seal_with: the connection was made without connection_attr::encrypt");
  }
  if (!s) {
    throw_rdx(errc::invalid_argument, "connection::seal_with: no seal");
  }
  if (connected_) {
    throw_rdx(errc::not_ready,
              "connection::seal_with: already connected (install the seal before connect())");
  }
  seal_ = std::move(s);
}

inline void engine::attach_link(std::unique_ptr<peer_link> l) noexcept {
  link_ = std::move(l);
  if (worker_ != nullptr && link_ != nullptr) {
    worker_->watch_fd(link_->fd(), true, this);
  }
}

inline void engine::connect(const connection_info& peer, const connect_options& opt) {
  connect_with(peer, opt, {});
}

inline void engine::connect_with(const connection_info& peer, const connect_options& opt,
                                 const qp_connector& how) {
  auto differ = [](const char* what, std::uint64_t here, std::uint64_t there) {
    throw_rdx(errc::invalid_argument, std::string("connection::connect: ") + what + " is " +
                                          std::to_string(here) + " here but " + std::to_string(there) +
                                          " at the peer; both sides need the same");
  };
  if (peer.endpoints.size() != qps_.size()) {
    differ("queue_pairs", qps_.size(), peer.endpoints.size());
  }
  if (peer.recv_depth != attr_.recv_depth) {
    differ("recv_depth", attr_.recv_depth, peer.recv_depth);
  }
  if (peer.message_size != attr_.message_size) {
    differ("message_size", attr_.message_size, peer.message_size);
  }
  if (attr_.encrypt && !seal_) {
    throw_rdx(errc::invalid_argument,
              "connection::connect: connection_attr::encrypt is set but no session keys were installed: "
              "connect through exchange_and_connect with exchange_options::auth (which derives them), or "
              "give connection::seal_with() a message_seal first; rdma_cm and the group mesh cannot key "
              "encryption");
  }
  if (const std::string why = encrypt_disagreement(attr_.encrypt, peer.encrypt); !why.empty()) {
    throw_rdx(errc::invalid_argument, "connection::connect: " + why);
  }
  if (peer.credit_word.length < 8 || peer.credit_word.addr % 8 != 0) {
    throw_rdx(errc::invalid_argument, "connection::connect: the peer's credit word is not 8 aligned bytes");
  }
  const connect_options o = liveness::with_bounded_retries(opt);
  if (connected_) {
    throw_rdx(errc::not_ready, "connection::connect: already connected");
  }
  for (std::size_t i = 0; i < qps_.size(); ++i) {
    if (how) {
      how(i, qps_[i], o);
    } else {
      qps_[i].connect(peer.endpoints[i], o);
    }
  }
  peer_credit_ = peer.credit_word;
  opt_ = o;
  // A paced chunk that takes half the ACK timeout (4.096 us x 2^code) waited out a retransmission.
  loss_wait_ns_ = (std::int64_t{4096} << std::min<int>(o.timeout, 31)) / 2;
  connected_ = true;
  open_ = !failed_ && !attr_.encrypt;
  // The windows bind through their queue pairs, which are in RTS now; the
  // peer learns of them only at the barrier that follows.
  bind_grants();
}

}  // namespace rdx::detail
