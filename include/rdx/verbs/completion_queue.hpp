// rdx: completion queues, completion channels (event mode) and polling.
#pragma once

#include <rdx/detail/handle.hpp>
#include <rdx/error.hpp>
#include <rdx/verbs/completion.hpp>
#include <rdx/verbs/context.hpp>

#include <infiniband/verbs.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <system_error>

#include <fcntl.h>
#include <poll.h>

namespace rdx {

//! A completion channel: a file descriptor that becomes readable when an armed
//! completion queue gets a completion. Keeps its context alive.
class completion_channel : detail::move_only {
public:
  //! @throws rdx::error when ibv_create_comp_channel fails.
  explicit completion_channel(const context& ctx) {
    ibv_comp_channel* ch = ::ibv_create_comp_channel(ctx.native_handle());
    if (ch == nullptr) {
      detail::throw_errno("ibv_create_comp_channel", ctx.name(), errno ? errno : ENOMEM);
    }
    h_ = detail::make_shared_verbs(ch, &::ibv_destroy_comp_channel, "ibv_destroy_comp_channel",
                                   {ctx.shared_handle()});
  }

  //! The ibv_comp_channel, still owned (nullptr when empty).
  [[nodiscard]] ibv_comp_channel* native_handle() const noexcept { return h_.get(); }
  //! Gives up ownership. @throws rdx::error while CQs created with it are alive.
  [[nodiscard]] ibv_comp_channel* release() { return detail::release_verbs(h_, "completion_channel"); }
  //! The shared reference that completion queues made with it hold, so it outlives them.
  [[nodiscard]] const std::shared_ptr<ibv_comp_channel>& shared_handle() const noexcept { return h_; }
  //! The descriptor to add to an epoll/poll loop (readable when an event waits).
  [[nodiscard]] int fd() const noexcept { return h_->fd; }

  //! Makes get_event() return at once when nothing waits. @throws rdx::error on failure.
  void set_nonblocking(bool on = true) {
    int fl = ::fcntl(h_->fd, F_GETFL);
    if (fl < 0 || ::fcntl(h_->fd, F_SETFL, on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK)) < 0) {
      detail::throw_errno("fcntl(O_NONBLOCK)", "completion channel", errno);
    }
  }

  //! Waits up to timeout for the fd to become readable, then takes one event
  //! and acknowledges it.
  //! @param cq set to the CQ that fired, or nullptr on failure.
  //! @return empty on an event; errc::timed_out on timeout; or the errno of poll or
  //! ibv_get_cq_event.
  [[nodiscard]] std::error_code get_event(std::chrono::milliseconds timeout, ibv_cq*& cq) noexcept {
    cq = nullptr;
    pollfd p{h_->fd, POLLIN, 0};
    int r = 0;
    do {
      r = ::poll(&p, 1, timeout.count() < 0 ? -1 : static_cast<int>(timeout.count()));
    } while (r < 0 && errno == EINTR);
    if (r < 0) {
      return {errno, std::generic_category()};
    }
    if (r == 0) {
      return make_error_code(errc::timed_out);
    }
    ibv_cq* fired = nullptr;
    void* cq_ctx = nullptr;
    if (::ibv_get_cq_event(h_.get(), &fired, &cq_ctx) != 0) {
      return {errno ? errno : EAGAIN, std::generic_category()};
    }
    ::ibv_ack_cq_events(fired, 1);
    cq = fired;
    return detail::no_error();
  }

private:
  std::shared_ptr<ibv_comp_channel> h_;
};

//! Settings of a completion queue.
struct completion_queue_attr {
  int depth = 512;                        //!< minimum entries; checked against max_cqe
  completion_channel* channel = nullptr;  //!< event mode when set
  int comp_vector = 0;                    //!< event mode's interrupt vector, below num_comp_vectors
};

namespace detail {
//! Error text for a value above a device limit: "field value above device limit (limit)".
[[nodiscard]] inline std::string limit_message(std::string_view object, std::string_view field,
                                               std::uint64_t value, std::uint64_t limit) {
  return std::string(object) + ": " + std::string(field) + " = " + std::to_string(value) +
         " exceeds the device limit " + std::to_string(limit);
}
}  // namespace detail

//! A completion queue. Move-only; keeps its context (and channel) alive; queue
//! pairs keep it alive.
class completion_queue : detail::move_only {
public:
  //! @throws rdx::error (errc::limit_exceeded) for a depth above max_cqe, naming
  //! field, value and limit; rdx::error from ibv_create_cq otherwise.
  completion_queue(const context& ctx, const completion_queue_attr& attr) {
    if (attr.depth <= 0) {
      detail::throw_rdx(errc::invalid_argument,
                        "completion_queue: depth = " + std::to_string(attr.depth) + " must be positive");
    }
    device_attributes da = ctx.query_device();
    if (attr.depth > da.max_cqe) {
      detail::throw_rdx(errc::limit_exceeded,
                        detail::limit_message("completion_queue on " + ctx.name(), "depth",
                                              static_cast<std::uint64_t>(attr.depth),
                                              static_cast<std::uint64_t>(da.max_cqe)));
    }
    if (attr.comp_vector < 0 || attr.comp_vector >= ctx.native_handle()->num_comp_vectors) {
      detail::throw_rdx(
          errc::limit_exceeded,
          detail::limit_message("completion_queue on " + ctx.name(), "comp_vector",
                                static_cast<std::uint64_t>(attr.comp_vector < 0 ? 0 : attr.comp_vector),
                                static_cast<std::uint64_t>(ctx.native_handle()->num_comp_vectors - 1)));
    }
    ibv_cq* cq =
        ::ibv_create_cq(ctx.native_handle(), attr.depth, nullptr,
                        attr.channel != nullptr ? attr.channel->native_handle() : nullptr, attr.comp_vector);
    if (cq == nullptr) {
      detail::throw_errno("ibv_create_cq", ctx.name() + " depth " + std::to_string(attr.depth),
                          errno ? errno : ENOMEM);
    }
    std::shared_ptr<const void> ch;
    if (attr.channel != nullptr) {
      ch = attr.channel->shared_handle();
    }
    h_ = detail::make_shared_verbs(cq, &::ibv_destroy_cq, "ibv_destroy_cq", {ctx.shared_handle(), ch});
    channel_ = attr.channel != nullptr ? attr.channel->native_handle() : nullptr;
  }
  //! A polled completion queue of at least depth entries.
  completion_queue(const context& ctx, int depth)
      : completion_queue(ctx, completion_queue_attr{.depth = depth}) {}

  //! The ibv_cq, still owned (nullptr when empty).
  [[nodiscard]] ibv_cq* native_handle() const noexcept { return h_.get(); }
  //! Gives up ownership. @throws rdx::error while queue pairs using it are alive.
  [[nodiscard]] ibv_cq* release() { return detail::release_verbs(h_, "completion_queue"); }

  //! Takes ownership of a CQ created on ctx (without a channel rdx owns).
  //! @throws rdx::error on nullptr or a CQ of another context.
  [[nodiscard]] static completion_queue from_native_handle(const context& ctx, ibv_cq* cq) {
    detail::refuse_null(cq, "completion_queue::from_native_handle");
    if (cq->context != ctx.native_handle()) {
      detail::throw_rdx(errc::invalid_argument,
                        "completion_queue::from_native_handle: cq belongs to another context");
    }
    completion_queue r;
    r.h_ = detail::make_shared_verbs(cq, &::ibv_destroy_cq, "ibv_destroy_cq", {ctx.shared_handle()});
    r.channel_ = cq->channel;
    return r;
  }
  //! The shared reference that queue pairs using the CQ hold, so it outlives them.
  [[nodiscard]] const std::shared_ptr<ibv_cq>& shared_handle() const noexcept { return h_; }
  //! Another owner of the same CQ (shared ownership, as queue pairs hold it):
  //! the CQ lives until its last owner goes. Used by a worker's connections.
  [[nodiscard]] completion_queue share() const noexcept {
    completion_queue r;
    r.h_ = h_;
    r.channel_ = channel_;
    return r;
  }
  //! True when it owns a CQ (not default-constructed, moved from or released).
  explicit operator bool() const noexcept { return h_ != nullptr; }
  //! Entries the CQ actually has (at least the depth asked for).
  [[nodiscard]] int depth() const noexcept { return h_->cqe; }

  //! Polls up to out.size() completions into out (no allocation, no lock in rdx).
  //! @param n set to the number filled (out.first(n)); 0 on failure.
  //! @return empty, or the errno of ibv_poll_cq when polling failed.
  [[nodiscard, gnu::always_inline]] std::error_code poll(std::span<completion> out, std::size_t& n) noexcept {
    static_assert(sizeof(completion) == sizeof(ibv_wc));
    return polled(
        ::ibv_poll_cq(h_.get(), static_cast<int>(out.size()), reinterpret_cast<ibv_wc*>(out.data())), n);
  }
  //! Polls raw work completions. @param n as poll(std::span<completion>, std::size_t&).
  [[nodiscard, gnu::always_inline]] std::error_code poll(std::span<ibv_wc> out, std::size_t& n) noexcept {
    return polled(::ibv_poll_cq(h_.get(), static_cast<int>(out.size()), out.data()), n);
  }

  //! Arms the CQ: the channel gets an event at the next (solicited) completion.
  [[nodiscard]] std::error_code arm(bool solicited_only = false) noexcept {
    if (channel_ == nullptr) {
      return make_error_code(errc::not_ready);
    }
    int rc = ::ibv_req_notify_cq(h_.get(), solicited_only ? 1 : 0);
    return rc == 0 ? std::error_code{} : std::error_code(rc, std::generic_category());
  }

  //! Event mode: waits up to timeout for this CQ's channel to report an event
  //! for this CQ (then poll, and arm() again before the next wait).
  //! @return empty on an event; errc::timed_out; errc::not_ready without a channel.
  [[nodiscard]] std::error_code wait_event(std::chrono::milliseconds timeout) noexcept {
    if (channel_ == nullptr) {
      return make_error_code(errc::not_ready);
    }
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() < 0) {
        left = std::chrono::milliseconds(0);
      }
      pollfd p{channel_->fd, POLLIN, 0};
      int r = ::poll(&p, 1, static_cast<int>(left.count()));
      if (r < 0 && errno == EINTR) {
        continue;
      }
      if (r < 0) {
        return {errno, std::generic_category()};
      }
      if (r == 0) {
        return make_error_code(errc::timed_out);
      }
      ibv_cq* cq = nullptr;
      void* cq_ctx = nullptr;
      if (::ibv_get_cq_event(channel_, &cq, &cq_ctx) != 0) {
        return {errno ? errno : EAGAIN, std::generic_category()};
      }
      ::ibv_ack_cq_events(cq, 1);
      if (cq == h_.get()) {
        return {};
      }
      // An event of another CQ on a shared channel: this API is for one CQ per channel.
    }
  }

private:
  completion_queue() = default;
  // ibv_poll_cq's result rc as poll's: the count in n and an empty code, or n = 0 and -rc.
  [[gnu::always_inline]] static std::error_code polled(int rc, std::size_t& n) noexcept {
    if (rc >= 0) [[likely]] {
      n = static_cast<std::size_t>(rc);
      return detail::no_error();
    }
    n = 0;
    return {-rc, std::generic_category()};
  }
  std::shared_ptr<ibv_cq> h_;
  ibv_comp_channel* channel_ = nullptr;
};

}  // namespace rdx
