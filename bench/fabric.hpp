// rdx benchmarks: the fabric under test (loopback: two sides in one process;
// two nodes: this side plus a responder process reached over rdx's TCP
// bootstrap), the two posting interfaces compared (rdx and plain verbs), and
// the measured loops, written once and instantiated for each interface so
// that both twins run the same algorithm on the same queue pair.
#pragma once

#include <rdx/channel/channel.hpp>
#include <rdx/channel/connection.hpp>
#include <rdx/channel/exchange.hpp>
#include <rdx/channel/window.hpp>
#include <rdx/connect/tcp_bootstrap.hpp>
#include <rdx/verbs/completion_queue.hpp>
#include <rdx/verbs/context.hpp>
#include <rdx/verbs/memory_region.hpp>
#include <rdx/verbs/post.hpp>
#include <rdx/verbs/protection_domain.hpp>
#include <rdx/verbs/queue_pair.hpp>
#include <rdx/verbs/work_request.hpp>

#include <infiniband/verbs.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace rdx_bench {

using clk = std::chrono::steady_clock;

enum class op : std::uint32_t {
  write_bw,
  read_bw,
  send_bw,
  write_lat,
  read_lat,
  send_lat,
  // Typed channels (layer 5): remote_window writes and reads, striped over
  // 1 or 2 queue pairs, and channel<std::byte> messages.
  window_write_bw,
  window_read_bw,
  window_write_lat,
  window_read_lat,
  chan_send_bw,
  chan_send_lat,
  quit
};
enum class api_kind : std::uint32_t { raw, rdx };

[[nodiscard]] inline std::string_view to_string(op o) noexcept {
  switch (o) {
    case op::write_bw: return "write_bw";
    case op::read_bw: return "read_bw";
    case op::send_bw: return "send_bw";
    case op::write_lat: return "write_lat";
    case op::read_lat: return "read_lat";
    case op::send_lat: return "send_lat";
    case op::window_write_bw: return "window_write_bw";
    case op::window_read_bw: return "window_read_bw";
    case op::window_write_lat: return "window_write_lat";
    case op::window_read_lat: return "window_read_lat";
    case op::chan_send_bw: return "chan_send_bw";
    case op::chan_send_lat: return "chan_send_lat";
    case op::quit: return "quit";
  }
  return "?";
}
[[nodiscard]] inline bool is_latency(op o) noexcept {
  return o == op::write_lat || o == op::read_lat || o == op::send_lat || o == op::window_write_lat ||
         o == op::window_read_lat || o == op::chan_send_lat;
}

// Queue settings shared by both twins (they post on the same queue pairs).
inline constexpr std::uint32_t sq_depth = 256;  // rdx's default send depth
inline constexpr std::uint32_t rq_depth = 256;
inline constexpr int cq_depth = 1024;
inline constexpr unsigned max_batch = 64;         // largest group posted with one doorbell
inline constexpr unsigned lat_signal_every = 16;  // latency loops: one signaled send in 16
inline constexpr unsigned max_qps = 2;

//! A benchmark failure (a failed post or completion, a peer out of step): the
//! benchmark reports it and stops; it is never thrown on success.
struct failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};
[[noreturn]] inline void fail(const std::string& what) {
  throw failure(what);
}

//! One end of the fabric: one registered buffer of [rx | tx], nqp RC queue
//! pairs, each with its own send and receive completion queue.
class side {
public:
  side(rdx::context ctx, std::size_t region, unsigned nqp)
      : ctx_(std::move(ctx)),
        pd_(ctx_),
        region_(region),
        mem_(alloc(2 * region)),
        mr_(pd_, mem_.get(), 2 * region,
            rdx::access::local_write | rdx::access::remote_write | rdx::access::remote_read) {
    scq_.reserve(nqp);
    rcq_.reserve(nqp);
    qp_.reserve(nqp);
    for (unsigned i = 0; i < nqp; ++i) {
      scq_.emplace_back(ctx_, cq_depth);
      rcq_.emplace_back(ctx_, cq_depth);
      qp_.emplace_back(
          pd_, scq_[i], rcq_[i],
          rdx::queue_pair_attr{.max_send_wr = sq_depth,
                               .max_recv_wr = rq_depth,
                               .remote_access = rdx::access::remote_write | rdx::access::remote_read});
    }
  }

  [[nodiscard]] unsigned nqp() const noexcept { return static_cast<unsigned>(qp_.size()); }
  [[nodiscard]] rdx::queue_pair& qp(unsigned i) noexcept { return qp_[i]; }
  [[nodiscard]] rdx::completion_queue& scq(unsigned i) noexcept { return scq_[i]; }
  [[nodiscard]] rdx::completion_queue& rcq(unsigned i) noexcept { return rcq_[i]; }
  [[nodiscard]] std::size_t region() const noexcept { return region_; }
  [[nodiscard]] std::byte* rx() const noexcept { return mem_.get(); }
  [[nodiscard]] std::byte* tx() const noexcept { return mem_.get() + region_; }
  [[nodiscard]] ibv_sge rx_sge(std::size_t off, std::size_t len) const noexcept { return mr_.sge(off, len); }
  [[nodiscard]] ibv_sge tx_sge(std::size_t off, std::size_t len) const noexcept {
    return mr_.sge(region_ + off, len);
  }
  [[nodiscard]] rdx::remote_descriptor descriptor() const noexcept { return mr_.remote(); }
  [[nodiscard]] const rdx::context& context() const noexcept { return ctx_; }
  [[nodiscard]] const rdx::protection_domain& pd() const noexcept { return pd_; }

  void set_peer(const rdx::remote_descriptor& d) {
    if (d.length < 2 * region_)
      fail("peer exposes " + std::to_string(d.length) + " bytes, need " + std::to_string(2 * region_));
    peer_ = d;
  }
  [[nodiscard]] rdx::remote_ptr peer_rx(std::size_t off = 0) const noexcept { return rdx::at(peer_, off); }
  [[nodiscard]] rdx::remote_ptr peer_tx(std::size_t off = 0) const noexcept {
    return rdx::at(peer_, region_ + off);
  }

  //! Fills every receive queue (setup, plain verbs; both twins then keep it full).
  void fill_receives() {
    for (unsigned q = 0; q < nqp(); ++q) {
      for (std::uint32_t i = 0; i < rq_depth; ++i) {
        ibv_sge sge = rx_sge(0, region_);
        ibv_recv_wr w{};
        w.sg_list = &sge;
        w.num_sge = 1;
        ibv_recv_wr* bad = nullptr;
        if (int rc = ::ibv_post_recv(qp_[q].native_handle(), &w, &bad); rc != 0) {
          fail("ibv_post_recv (setup): " + std::string(std::strerror(rc)));
        }
      }
    }
  }

  //! The 8-byte sequence word at the end of a message of `size` bytes.
  [[nodiscard]] std::uint64_t rx_tail(std::size_t size) const noexcept {
    return std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(rx() + size - 8))
        .load(std::memory_order_acquire);
  }
  void set_rx_tail(std::size_t size, std::uint64_t v) const noexcept {
    std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(rx() + size - 8))
        .store(v, std::memory_order_release);
  }
  void set_tx_tail(std::size_t size, std::uint64_t v) const noexcept {
    std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(tx() + size - 8))
        .store(v, std::memory_order_release);
  }

private:
  struct free_deleter {
    void operator()(std::byte* p) const noexcept { std::free(p); }
  };
  static std::unique_ptr<std::byte, free_deleter> alloc(std::size_t n) {
    void* p = std::aligned_alloc(4096, (n + 4095) / 4096 * 4096);
    if (p == nullptr) throw std::bad_alloc();
    std::memset(p, 0, n);
    return std::unique_ptr<std::byte, free_deleter>(static_cast<std::byte*>(p));
  }

  rdx::context ctx_;
  rdx::protection_domain pd_;
  std::size_t region_;
  std::unique_ptr<std::byte, free_deleter> mem_;
  rdx::memory_region mr_;
  std::vector<rdx::completion_queue> scq_;
  std::vector<rdx::completion_queue> rcq_;
  std::vector<rdx::queue_pair> qp_;
  rdx::remote_descriptor peer_{};
};

//! One work request as the loops describe it; each interface builds its own from it.
struct wr_desc {
  ibv_wr_opcode opcode = IBV_WR_RDMA_WRITE;
  ibv_sge sge{};
  rdx::remote_ptr remote{};
};

// ---------------------------------------------------------------------------
// The two interfaces. Each posts `k` copies of a request with one call (one
// doorbell), the last one signaled when asked (carrying `id`, the number of
// requests its completion retires), posts receives and polls.

//! Plain verbs: ibv_send_wr arrays, ibv_post_send, ibv_post_recv, ibv_poll_cq.
struct raw_api {
  static constexpr std::string_view name = "raw";
  using wc_type = ibv_wc;
  static bool ok(const ibv_wc& c) noexcept { return c.status == IBV_WC_SUCCESS; }
  static std::uint64_t id(const ibv_wc& c) noexcept { return c.wr_id; }
  static const char* status(const ibv_wc& c) noexcept { return ::ibv_wc_status_str(c.status); }

  static int post(side& s, unsigned q, const wr_desc& d, unsigned k, bool signal_last,
                  std::uint64_t id) noexcept {
    ibv_send_wr wrs[max_batch];
    ibv_sge sges[max_batch];
    ibv_qp* qp = s.qp(q).native_handle();
    const bool inl = d.opcode != IBV_WR_RDMA_READ && d.sge.length <= s.qp(q).max_inline_data();
    for (unsigned j = 0; j < k; ++j) {
      sges[j] = d.sge;
      ibv_send_wr& w = wrs[j];
      w = ibv_send_wr{};
      w.wr_id = id;
      w.next = j + 1 < k ? &wrs[j + 1] : nullptr;
      w.sg_list = &sges[j];
      w.num_sge = 1;
      w.opcode = d.opcode;
      w.send_flags = (signal_last && j + 1 == k ? unsigned{IBV_SEND_SIGNALED} : 0u) |
                     (inl ? unsigned{IBV_SEND_INLINE} : 0u);
      w.wr.rdma.remote_addr = d.remote.addr;
      w.wr.rdma.rkey = d.remote.rkey;
    }
    ibv_send_wr* bad = nullptr;
    return ::ibv_post_send(qp, wrs, &bad);
  }
  static int post_recv(side& s, unsigned q, ibv_sge sge) noexcept {
    ibv_recv_wr w{};
    w.sg_list = &sge;
    w.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    return ::ibv_post_recv(s.qp(q).native_handle(), &w, &bad);
  }
  static int poll(rdx::completion_queue& cq, ibv_wc* out, int n) noexcept {
    return ::ibv_poll_cq(cq.native_handle(), n, out);
  }
};

//! rdx: typed builders, a reused send_batch, queue_pair::post_send/post_recv,
//! completion_queue::poll.
struct rdx_api {
  static constexpr std::string_view name = "rdx";
  using wc_type = rdx::completion;
  static bool ok(const rdx::completion& c) noexcept { return c.ok(); }
  static std::uint64_t id(const rdx::completion& c) noexcept { return c.wr_id(); }
  static const char* status(const rdx::completion& c) noexcept { return ::ibv_wc_status_str(c.status()); }

  static rdx::send_wr build(const wr_desc& d) noexcept {
    switch (d.opcode) {
      case IBV_WR_RDMA_READ: return rdx::wr::read(d.sge, d.remote);
      case IBV_WR_SEND: return rdx::wr::send(d.sge);
      default: return rdx::wr::write(d.sge, d.remote);
    }
  }
  static int post(side& s, unsigned q, const wr_desc& d, unsigned k, bool signal_last,
                  std::uint64_t id) noexcept {
    if (k == 1) return s.qp(q).post_send(build(d).id(id).signaled(signal_last)).value();
    // A long-lived batch, as an application keeps one per queue pair.
    static thread_local rdx::send_batch<max_batch> batch;
    rdx::send_wr w = build(d).id(id).unsignaled();
    for (unsigned j = 0; j + 1 < k; ++j) (void)batch.push(w);
    (void)batch.push(w.signaled(signal_last));
    std::error_code ec = rdx::post(s.qp(q), batch);
    if (ec) batch.clear();
    return ec.value();
  }
  static int post_recv(side& s, unsigned q, ibv_sge sge) noexcept {
    return s.qp(q).post_recv(rdx::wr::recv(sge)).value();
  }
  static int poll(rdx::completion_queue& cq, rdx::completion* out, int n) noexcept {
    return cq.poll(std::span<rdx::completion>(out, static_cast<std::size_t>(n)));
  }
};

// ---------------------------------------------------------------------------

//! What the client asks the responder to do for one measured run.
struct command {
  op what = op::quit;
  api_kind api = api_kind::raw;
  std::uint64_t size = 0;
  std::uint64_t count = 0;
  std::uint32_t depth = 1;
  std::uint32_t nqp = 1;
};

//! Send-queue bookkeeping: requests posted and not yet retired by a completion.
struct sq_credit {
  std::uint64_t outstanding = 0;
  unsigned since_signal = 0;
};

template <class Api>
inline void check_completion(const typename Api::wc_type& c, const char* where) {
  if (!Api::ok(c)) [[unlikely]]
    fail(std::string(where) + ": completion with status " + Api::status(c));
}
inline void check_post(int rc, const char* where) {
  if (rc != 0) [[unlikely]]
    fail(std::string(where) + ": post failed: " + std::strerror(rc));
}

//! Polls a send CQ without waiting and retires what its completions cover.
template <class Api>
inline void reap(side& s, unsigned q, sq_credit& c) {
  typename Api::wc_type wcs[16];
  int n = Api::poll(s.scq(q), wcs, 16);
  if (n < 0) [[unlikely]]
    fail("poll send CQ failed");
  for (int i = 0; i < n; ++i) {
    check_completion<Api>(wcs[i], "send CQ");
    c.outstanding -= Api::id(wcs[i]);
  }
}

//! Posts one request of a latency loop: signaled every lat_signal_every, and when `last`.
template <class Api>
inline void post_lat(side& s, unsigned q, const wr_desc& d, sq_credit& c, bool last) {
  while (c.outstanding + 1 >= sq_depth) reap<Api>(s, q, c);
  const bool sig = ++c.since_signal == lat_signal_every || last;
  check_post(Api::post(s, q, d, 1, sig, c.since_signal), "post");
  ++c.outstanding;
  if (sig) c.since_signal = 0;
}

//! The passive half of a run: echoes pings, keeps receive queues full.
//! Non-blocking: step() makes what progress it can and says when it is done.
template <class Api>
class responder {
public:
  explicit responder(side& s) : s_(s) {}

  void start(const command& c) {
    cmd_ = c;
    remaining_ = c.count;
    seq_ = 0;
    credit_ = {};
    if (c.what == op::write_lat) s_.set_rx_tail(c.size, 0);
  }

  //! @return true when this run's part is finished.
  bool step() {
    switch (cmd_.what) {
      case op::send_bw: return step_recv(false);
      case op::send_lat: return step_recv(true);
      case op::write_lat: return step_write_echo();
      default: return true;
    }
  }

private:
  bool step_recv(bool echo) {
    typename Api::wc_type wcs[16];
    for (unsigned q = 0; q < cmd_.nqp; ++q) {
      int n = Api::poll(s_.rcq(q), wcs, 16);
      if (n < 0) [[unlikely]]
        fail("poll receive CQ failed");
      for (int i = 0; i < n; ++i) {
        check_completion<Api>(wcs[i], "responder receive");
        check_post(Api::post_recv(s_, q, s_.rx_sge(0, s_.region())), "responder post_recv");
        --remaining_;
        if (echo) post_lat<Api>(s_, q, {IBV_WR_SEND, s_.tx_sge(0, cmd_.size), {}}, credit_, remaining_ == 0);
      }
      if (echo) reap<Api>(s_, q, credit_);
    }
    return remaining_ == 0 && credit_.outstanding == 0;
  }

  bool step_write_echo() {
    if (remaining_ != 0 && s_.rx_tail(cmd_.size) == seq_ + 1) {
      ++seq_;
      --remaining_;
      s_.set_tx_tail(cmd_.size, seq_);
      post_lat<Api>(s_, 0, {IBV_WR_RDMA_WRITE, s_.tx_sge(0, cmd_.size), s_.peer_rx()}, credit_,
                    remaining_ == 0);
    }
    reap<Api>(s_, 0, credit_);
    return remaining_ == 0 && credit_.outstanding == 0;
  }

  side& s_;
  command cmd_{};
  std::uint64_t remaining_ = 0;
  std::uint64_t seq_ = 0;
  sq_credit credit_{};
};

// ---------------------------------------------------------------------------
// Typed channels: one connection per striping width (1 and 2 queue pairs),
// a window both ways, and the channel<std::byte> of the 1-QP connection.

inline constexpr rdx::rights win_rights = rdx::rights::read | rdx::rights::write;
inline constexpr std::size_t chan_max_message = 65536;
inline constexpr std::uint32_t chan_recv_depth = 64;

[[nodiscard]] inline bool is_channel_op(op o) noexcept {
  return o == op::window_write_bw || o == op::window_read_bw || o == op::window_write_lat ||
         o == op::window_read_lat || o == op::chan_send_bw || o == op::chan_send_lat;
}
[[nodiscard]] inline std::size_t chan_message_size(std::size_t region) noexcept {
  return std::min(region, chan_max_message);
}

class chan_side {
public:
  chan_side(const side& s, std::size_t region)
      : win_(rdx::make_window_buffer<std::byte, win_rights>(s.pd(), region)),
        local_(s.pd(), region, rdx::access::local_write) {
    for (unsigned k = 0; k < max_qps; ++k) {
      rdx::connection_attr a{.queue_pairs = k + 1,
                             .send_depth = sq_depth,
                             .recv_depth = chan_recv_depth,
                             .message_size = static_cast<std::uint32_t>(chan_message_size(region))};
      conn_[k] = std::make_unique<rdx::connection>(s.pd(), a);
      grant_[k].emplace(*conn_[k], win_);  // a grant is per connection (its windows, per queue pair)
    }
  }
  chan_side(const chan_side&) = delete;
  chan_side& operator=(const chan_side&) = delete;

  [[nodiscard]] rdx::connection& conn(unsigned qps) noexcept { return *conn_[qps - 1]; }
  [[nodiscard]] rdx::channel<std::byte>& channel() noexcept { return *ch_; }
  [[nodiscard]] const rdx::window_descriptor& peer_window(unsigned qps) const noexcept {
    return peer_[qps - 1];
  }
  [[nodiscard]] rdx::local_span<std::byte> local(std::size_t n) const noexcept {
    return rdx::local_span<std::byte>(local_).subspan(0, n);
  }
  [[nodiscard]] std::span<std::byte> buffer(std::size_t n) const noexcept { return {local_.data(), n}; }

  //! Two nodes: connects every connection through the peer's offer.
  void join(const rdx::tcp::socket& sock) {
    for (unsigned k = 0; k < max_qps; ++k) {
      const rdx::window_descriptor g = grant_[k]->descriptor();
      rdx::peer_offer offer = rdx::exchange_and_connect(sock, *conn_[k], std::span(&g, 1));
      if (offer.windows.size() != 1)
        fail("peer offered " + std::to_string(offer.windows.size()) + " windows");
      peer_[k] = offer.windows[0];
    }
    ch_.emplace(*conn_[0]);
  }
  //! Loopback: connects two sides of this process.
  static void join_pair(chan_side& a, chan_side& b) {
    for (unsigned k = 0; k < max_qps; ++k) rdx::connect_pair(*a.conn_[k], *b.conn_[k]);
    for (unsigned k = 0; k < max_qps; ++k) {
      a.peer_[k] = b.grant_[k]->descriptor();
      b.peer_[k] = a.grant_[k]->descriptor();
    }
    a.ch_.emplace(*a.conn_[0]);
    b.ch_.emplace(*b.conn_[0]);
  }

private:
  rdx::registered_buffer<std::byte> win_;
  rdx::registered_buffer<std::byte> local_;
  std::optional<rdx::grant<std::byte, win_rights>> grant_[max_qps];
  std::unique_ptr<rdx::connection> conn_[max_qps];
  std::optional<rdx::channel<std::byte>> ch_;
  rdx::window_descriptor peer_[max_qps]{};
};

inline void check_op(std::error_code ec, const char* where) {
  if (ec) [[unlikely]]
    fail(std::string(where) + ": " + ec.message());
}

//! The passive half of a channel run: receives messages (and echoes them for latency).
class chan_responder {
public:
  explicit chan_responder(chan_side& s) : s_(s) {}

  void start(const command& c) {
    cmd_ = c;
    remaining_ = (c.what == op::chan_send_bw || c.what == op::chan_send_lat) ? c.count : 0;
    rx_.reset();
    tx_.reset();
  }
  //! @return true when this run's part is finished.
  bool step() {
    auto& ch = s_.channel();
    if (remaining_ == 0) {
      if (tx_) {
        check_op(tx_->wait(), "responder send");
        tx_.reset();
      }
      return true;
    }
    if (!rx_) rx_ = ch.receive(s_.buffer(cmd_.size));
    if (!rx_->test()) return false;
    check_op(rx_->error(), "responder receive");
    rx_.reset();
    --remaining_;
    if (cmd_.what == op::chan_send_lat) {
      // Like the plain-verbs responder, answer at once and retire the
      // previous answer's send lazily (it completed long ago).
      if (tx_) {
        check_op(tx_->wait(), "responder send");
        tx_.reset();
      }
      tx_ = ch.send(std::span<const std::byte>(s_.buffer(cmd_.size)));
    }
    return false;
  }

private:
  chan_side& s_;
  command cmd_{};
  std::uint64_t remaining_ = 0;
  std::optional<rdx::operation> rx_;
  std::optional<rdx::operation> tx_;
};

//! The fabric: the client's side and either a local responder side
//! (loopback) or a TCP connection to a responder process (two nodes).
class fabric {
public:
  //! Loopback: two sides on one device, queue pair i of one connected to queue pair i of the other.
  static std::unique_ptr<fabric> loopback(std::size_t region, unsigned nqp) {
    auto f = std::unique_ptr<fabric>(new fabric());
    f->client_.emplace(rdx::context::open_default(), region, nqp);
    f->peer_.emplace(rdx::context::open_default(), region, nqp);
    for (unsigned q = 0; q < nqp; ++q) {
      f->client_->qp(q).connect(f->peer_->qp(q).local_endpoint());
      f->peer_->qp(q).connect(f->client_->qp(q).local_endpoint());
    }
    f->client_->set_peer(f->peer_->descriptor());
    f->peer_->set_peer(f->client_->descriptor());
    f->client_->fill_receives();
    f->peer_->fill_receives();
    f->raw_.emplace(*f->peer_);
    f->rdx_.emplace(*f->peer_);
    f->client_chan_.emplace(*f->client_, region);
    f->peer_chan_.emplace(*f->peer_, region);
    chan_side::join_pair(*f->client_chan_, *f->peer_chan_);
    f->chan_.emplace(*f->peer_chan_);
    return f;
  }

  //! Two nodes, client end: connects to the responder and exchanges endpoints.
  static std::unique_ptr<fabric> connect(const std::string& host, std::uint16_t port, std::size_t region,
                                         unsigned nqp) {
    auto f = std::unique_ptr<fabric>(new fabric());
    f->client_.emplace(rdx::context::open_default(), region, nqp);
    f->sock_ = rdx::tcp::connect(host, port, std::chrono::seconds(120));
    const command hello{op::quit, api_kind::raw, region, 0, 0, nqp};
    f->send(hello);
    join(*f->client_, f->sock_);
    f->client_chan_.emplace(*f->client_, region);
    f->client_chan_->join(f->sock_);
    return f;
  }

  [[nodiscard]] side& client() noexcept { return *client_; }
  [[nodiscard]] chan_side& client_chan() noexcept { return *client_chan_; }
  [[nodiscard]] bool is_loopback() const noexcept { return peer_.has_value(); }

  //! Starts the responder's part of a run (two nodes: waits until it is ready).
  template <class Api>
  void begin(const command& c) {
    if (c.what == op::write_lat) client_->set_rx_tail(c.size, 0);
    if (is_loopback()) {
      if (is_channel_op(c.what))
        chan_->start(c);
      else
        local<Api>().start(c);
      channel_run_ = is_channel_op(c.what);
      return;
    }
    send(c);
    expect_byte('A', "start");
  }
  //! Lets the responder progress while the client waits (loopback only).
  template <class Api>
  void progress() {
    if (!is_loopback()) return;
    if (channel_run_)
      (void)chan_->step();
    else
      (void)local<Api>().step();
  }
  //! Waits until the responder has finished its part of the run.
  template <class Api>
  void end() {
    if (is_loopback()) {
      const auto deadline = clk::now() + std::chrono::seconds(60);
      while (!(channel_run_ ? chan_->step() : local<Api>().step())) {
        if (clk::now() > deadline) fail("loopback responder did not finish within 60 s");
      }
      return;
    }
    expect_byte('D', "finish");
  }

  ~fabric() {
    if (sock_.is_open()) {
      try {
        send(command{});
      } catch (...) {
        // The responder times out on its own; nothing to report at exit.
      }
    }
  }

  //! Two nodes, responder end: serves one client until it says quit.
  static int serve(std::uint16_t port) {
    auto l = rdx::tcp::listener::bind("", port);
    std::printf("responder: listening on port %u\n", static_cast<unsigned>(l.port()));
    std::fflush(stdout);
    rdx::tcp::socket sock = l.accept(std::chrono::seconds(300));
    command hello = recv_command(sock, std::chrono::seconds(60));
    side s(rdx::context::open_default(), hello.size, hello.nqp);
    join(s, sock);
    chan_side cs(s, hello.size);
    cs.join(sock);
    responder<raw_api> raw(s);
    responder<rdx_api> rdx(s);
    chan_responder chan(cs);
    for (;;) {
      command c = recv_command(sock, std::chrono::minutes(30));
      if (c.what == op::quit) return 0;
      char status = 'D';
      try {
        if (is_channel_op(c.what))
          run(chan, c, sock);
        else if (c.api == api_kind::rdx)
          run(rdx, c, sock);
        else
          run(raw, c, sock);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "responder: %s %s size %llu: %s\n", std::string(to_string(c.what)).c_str(),
                     c.api == api_kind::rdx ? "rdx" : "raw", static_cast<unsigned long long>(c.size),
                     e.what());
        status = 'E';
      }
      send_byte(sock, status);
      if (status != 'D') return 1;
    }
  }

private:
  fabric() = default;

  template <class Api>
  responder<Api>& local() {
    if constexpr (std::is_same_v<Api, rdx_api>)
      return *rdx_;
    else
      return *raw_;
  }

  template <class R>
  static void run(R& r, const command& c, const rdx::tcp::socket& sock) {
    r.start(c);
    send_byte(sock, 'A');
    const auto deadline = clk::now() + std::chrono::minutes(10);
    unsigned spins = 0;
    while (!r.step()) {
      if (++spins % 4096 == 0 && clk::now() > deadline) fail("run did not finish within 10 minutes");
    }
  }

  //! Exchanges endpoints and memory for every queue pair, connects, fills receives, meets at a barrier.
  static void join(side& s, const rdx::tcp::socket& sock) {
    std::optional<rdx::remote_descriptor> peer;
    for (unsigned q = 0; q < s.nqp(); ++q) {
      const rdx::remote_descriptor mine = s.descriptor();
      rdx::wire::message m = rdx::tcp::exchange(sock, s.qp(q).local_endpoint(), std::span(&mine, 1));
      if (m.descriptors.size() != 1)
        fail("peer sent " + std::to_string(m.descriptors.size()) + " descriptors, expected 1");
      s.qp(q).connect(m.ep);
      peer = m.descriptors[0];
    }
    s.set_peer(*peer);
    s.fill_receives();
    rdx::tcp::barrier(sock);
  }

  void send(const command& c) const {
    sock_.send_all(std::as_bytes(std::span(&c, 1)), clk::now() + std::chrono::seconds(30), "send command");
  }
  static command recv_command(const rdx::tcp::socket& sock, std::chrono::milliseconds timeout) {
    command c;
    sock.recv_exact(std::as_writable_bytes(std::span(&c, 1)), clk::now() + timeout, "receive command");
    return c;
  }
  static void send_byte(const rdx::tcp::socket& sock, char b) {
    const std::byte x{static_cast<unsigned char>(b)};
    sock.send_all(std::span(&x, 1), clk::now() + std::chrono::seconds(30), "send status");
  }
  void expect_byte(char want, const char* what) const {
    std::byte b{};
    sock_.recv_exact(std::span(&b, 1), clk::now() + std::chrono::minutes(10), "responder status");
    if (b != std::byte{static_cast<unsigned char>(want)}) {
      fail(std::string("responder failed to ") + what + " the run (see its log)");
    }
  }

  std::optional<side> client_;
  std::optional<side> peer_;
  std::optional<responder<raw_api>> raw_;
  std::optional<responder<rdx_api>> rdx_;
  std::optional<chan_side> client_chan_;
  std::optional<chan_side> peer_chan_;
  std::optional<chan_responder> chan_;
  bool channel_run_ = false;
  rdx::tcp::socket sock_;
};

// ---------------------------------------------------------------------------
// The measured loops.

struct result {
  double seconds = 0;  // whole run, first post to last completion
  std::uint64_t bytes = 0;
  std::vector<double> lat_us;  // per operation (latency runs), sorted
  double wr_per_op = 0;        // connection runs: work requests posted per operation (probes included)
  double signaled_per_op = 0;  // connection runs: signaled work requests per operation
};

//! Bandwidth: keeps `depth` requests in flight on queue pair 0, posted in
//! groups of depth/4 (one doorbell, last one signaled), until `count` completed.
template <class Api>
inline result run_bw(fabric& f, op o, std::size_t size, unsigned depth, std::uint64_t count) {
  side& s = f.client();
  wr_desc d;
  switch (o) {
    case op::write_bw: d = {IBV_WR_RDMA_WRITE, s.tx_sge(0, size), s.peer_rx()}; break;
    case op::read_bw: d = {IBV_WR_RDMA_READ, s.rx_sge(0, size), s.peer_tx()}; break;
    default: d = {IBV_WR_SEND, s.tx_sge(0, size), {}}; break;
  }
  const unsigned group = std::max(1u, std::min(depth / 4, max_batch));
  const command c{o, std::is_same_v<Api, rdx_api> ? api_kind::rdx : api_kind::raw, size, count, depth, 1};
  f.begin<Api>(c);
  std::uint64_t posted = 0;
  std::uint64_t done = 0;
  typename Api::wc_type wcs[16];
  const auto t0 = clk::now();
  while (done < count) {
    while (posted < count) {
      const auto g = static_cast<unsigned>(std::min<std::uint64_t>(group, count - posted));
      if (posted - done + g > depth) break;
      check_post(Api::post(s, 0, d, g, true, g), "post");
      posted += g;
    }
    int n = Api::poll(s.scq(0), wcs, 16);
    if (n < 0) [[unlikely]]
      fail("poll send CQ failed");
    for (int i = 0; i < n; ++i) {
      check_completion<Api>(wcs[i], "send CQ");
      done += Api::id(wcs[i]);
    }
    if (o == op::send_bw) f.progress<Api>();
  }
  const auto t1 = clk::now();
  f.end<Api>();
  return {std::chrono::duration<double>(t1 - t0).count(), count * size, {}};
}

//! Latency: `count` operations one at a time. Write and send are ping-pongs
//! (the peer answers in kind; half the round trip is reported), read is one
//! round trip.
template <class Api>
inline result run_lat(fabric& f, op o, std::size_t size, std::uint64_t count) {
  side& s = f.client();
  const command c{o, std::is_same_v<Api, rdx_api> ? api_kind::rdx : api_kind::raw, size, count, 1, 1};
  result r;
  r.lat_us.resize(count);
  sq_credit credit;
  typename Api::wc_type wcs[1];
  f.begin<Api>(c);
  const auto start = clk::now();
  for (std::uint64_t i = 1; i <= count; ++i) {
    const bool last = i == count;
    const auto t0 = clk::now();
    double scale = 0.5;
    if (o == op::write_lat) {
      s.set_tx_tail(size, i);
      post_lat<Api>(s, 0, {IBV_WR_RDMA_WRITE, s.tx_sge(0, size), s.peer_rx()}, credit, last);
      while (s.rx_tail(size) != i) {
        f.progress<Api>();
        reap<Api>(s, 0, credit);
      }
    } else if (o == op::send_lat) {
      post_lat<Api>(s, 0, {IBV_WR_SEND, s.tx_sge(0, size), {}}, credit, last);
      for (;;) {
        int n = Api::poll(s.rcq(0), wcs, 1);
        if (n < 0) [[unlikely]]
          fail("poll receive CQ failed");
        if (n == 1) break;
        f.progress<Api>();
        reap<Api>(s, 0, credit);
      }
      check_completion<Api>(wcs[0], "receive CQ");
      check_post(Api::post_recv(s, 0, s.rx_sge(0, s.region())), "post_recv");
    } else {
      scale = 1.0;
      check_post(Api::post(s, 0, {IBV_WR_RDMA_READ, s.rx_sge(0, size), s.peer_tx()}, 1, true, 1), "post");
      int n = 0;
      while ((n = Api::poll(s.scq(0), wcs, 1)) == 0) {}
      if (n < 0) [[unlikely]]
        fail("poll send CQ failed");
      check_completion<Api>(wcs[0], "send CQ");
    }
    r.lat_us[i - 1] = std::chrono::duration<double, std::micro>(clk::now() - t0).count() * scale;
  }
  const auto stop = clk::now();
  while (credit.outstanding != 0) reap<Api>(s, 0, credit);
  f.end<Api>();
  r.seconds = std::chrono::duration<double>(stop - start).count();
  r.bytes = count * size;
  std::sort(r.lat_us.begin(), r.lat_us.end());
  return r;
}

// --- channel runs -----------------------------------------------------------

//! remote_window bandwidth: `depth` operations in flight on a connection of
//! `qps` queue pairs (large transfers striped in 512 KiB chunks).
inline result run_window_bw(fabric& f, op o, std::size_t size, unsigned depth, std::uint64_t count,
                            unsigned qps) {
  chan_side& cs = f.client_chan();
  rdx::remote_window<std::byte, win_rights> w(cs.conn(qps), cs.peer_window(qps));
  const rdx::local_span<std::byte> local = cs.local(size);
  auto ring = std::make_unique<std::optional<rdx::operation>[]>(depth);
  rdx::connection& conn = cs.conn(qps);
  const std::uint64_t posted0 = conn.posted_count(), signaled0 = conn.signaled_count();
  f.begin<rdx_api>(command{o, api_kind::rdx, size, count, depth, qps});
  const auto t0 = clk::now();
  for (std::uint64_t i = 0; i < count; ++i) {
    auto& slot = ring[i % depth];
    if (slot) {
      check_op(slot->wait(), "window");
      slot.reset();
    }
    if (o == op::window_write_bw)
      slot = w.write(local, 0);
    else
      slot = w.read(local, 0);
  }
  for (unsigned j = 0; j < depth; ++j) {
    if (ring[j]) check_op(ring[j]->wait(), "window");
  }
  const auto t1 = clk::now();
  f.end<rdx_api>();
  result r{std::chrono::duration<double>(t1 - t0).count(), count * size, {}};
  r.wr_per_op = static_cast<double>(conn.posted_count() - posted0) / static_cast<double>(count);
  r.signaled_per_op = static_cast<double>(conn.signaled_count() - signaled0) / static_cast<double>(count);
  return r;
}

//! The plain-verbs twin of run_window_bw: the same chunks (512 KiB, aligned in
//! the remote address space), round-robin over `qps` queue pairs of the same
//! depth, one request per post, signaled every depth/4 per queue pair.
template <class Api>
inline result run_stripe_bw(fabric& f, op o, std::size_t size, unsigned depth, std::uint64_t count,
                            unsigned qps) {
  side& s = f.client();
  const bool write = o == op::window_write_bw;
  const rdx::remote_ptr base = write ? s.peer_rx() : s.peer_tx();
  constexpr std::uint64_t chunk = 512 * 1024;
  struct piece {
    std::uint64_t off, len;
  };
  std::vector<piece> pieces;
  for (std::uint64_t pos = 0; pos < size;) {
    const std::uint64_t len = std::min<std::uint64_t>(size - pos, chunk - (base.addr + pos) % chunk);
    pieces.push_back({pos, len});
    pos += len;
  }
  const std::uint64_t total = count * pieces.size();
  const std::uint64_t window = std::uint64_t{depth} * pieces.size();
  const unsigned group = std::max(1u, depth / 4);
  std::uint64_t last_on[max_qps] = {};
  for (unsigned q = 0; q < qps; ++q) last_on[q] = total - 1 - ((total - 1 + qps - q) % qps);
  unsigned since[max_qps] = {};
  typename Api::wc_type wcs[16];
  f.begin<Api>(
      command{o, std::is_same_v<Api, rdx_api> ? api_kind::rdx : api_kind::raw, size, count, depth, qps});
  std::uint64_t posted = 0, done = 0;
  const auto t0 = clk::now();
  while (done < total) {
    while (posted < total && posted - done < window) {
      const piece& p = pieces[posted % pieces.size()];
      const auto q = static_cast<unsigned>(posted % qps);
      const wr_desc d = write ? wr_desc{IBV_WR_RDMA_WRITE, s.tx_sge(p.off, p.len), base + p.off}
                              : wr_desc{IBV_WR_RDMA_READ, s.rx_sge(p.off, p.len), base + p.off};
      const bool sig = ++since[q] >= group || posted == last_on[q];
      check_post(Api::post(s, q, d, 1, sig, since[q]), "post");
      if (sig) since[q] = 0;
      ++posted;
    }
    for (unsigned q = 0; q < qps; ++q) {
      int n = Api::poll(s.scq(q), wcs, 16);
      if (n < 0) [[unlikely]]
        fail("poll send CQ failed");
      for (int i = 0; i < n; ++i) {
        check_completion<Api>(wcs[i], "send CQ");
        done += Api::id(wcs[i]);
      }
    }
  }
  const auto t1 = clk::now();
  f.end<Api>();
  return {std::chrono::duration<double>(t1 - t0).count(), count * size, {}};
}

//! One operation at a time: remote_window write or read completion (rdx), or
//! a signaled write or read polled to completion (the plain-verbs twin).
template <class Api>
inline result run_window_lat(fabric& f, op o, std::size_t size, std::uint64_t count) {
  const bool write = o == op::window_write_lat;
  result r;
  r.lat_us.resize(count);
  f.begin<Api>(command{o, std::is_same_v<Api, rdx_api> ? api_kind::rdx : api_kind::raw, size, count, 1, 1});
  const auto start = clk::now();
  if constexpr (std::is_same_v<Api, rdx_api>) {
    chan_side& cs = f.client_chan();
    rdx::remote_window<std::byte, win_rights> w(cs.conn(1), cs.peer_window(1));
    const rdx::local_span<std::byte> local = cs.local(size);
    for (std::uint64_t i = 0; i < count; ++i) {
      const auto t0 = clk::now();
      if (write)
        check_op(w.write(local, 0).wait(), "window write");
      else
        check_op(w.read(local, 0).wait(), "window read");
      r.lat_us[i] = std::chrono::duration<double, std::micro>(clk::now() - t0).count();
    }
  } else {
    side& s = f.client();
    const wr_desc d = write ? wr_desc{IBV_WR_RDMA_WRITE, s.tx_sge(0, size), s.peer_rx()}
                            : wr_desc{IBV_WR_RDMA_READ, s.rx_sge(0, size), s.peer_tx()};
    typename Api::wc_type wc[1];
    for (std::uint64_t i = 0; i < count; ++i) {
      const auto t0 = clk::now();
      check_post(Api::post(s, 0, d, 1, true, 1), "post");
      int n = 0;
      while ((n = Api::poll(s.scq(0), wc, 1)) == 0) {}
      if (n < 0) [[unlikely]]
        fail("poll send CQ failed");
      check_completion<Api>(wc[0], "send CQ");
      r.lat_us[i] = std::chrono::duration<double, std::micro>(clk::now() - t0).count();
    }
  }
  const auto stop = clk::now();
  f.end<Api>();
  r.seconds = std::chrono::duration<double>(stop - start).count();
  r.bytes = count * size;
  std::sort(r.lat_us.begin(), r.lat_us.end());
  return r;
}

//! channel<std::byte> messages: a stream with `depth` sends in flight, or a
//! ping-pong (half the round trip reported). Twin: send_bw / send_lat.
inline result run_chan(fabric& f, op o, std::size_t size, unsigned depth, std::uint64_t count) {
  chan_side& cs = f.client_chan();
  auto& ch = cs.channel();
  const std::span<const std::byte> msg(cs.buffer(size));
  const std::span<std::byte> dst(cs.buffer(size));
  result r;
  f.begin<rdx_api>(command{o, api_kind::rdx, size, count, depth, 1});
  const auto start = clk::now();
  if (o == op::chan_send_lat) {
    r.lat_us.resize(count);
    std::optional<rdx::operation> tx;  // the previous ping, retired lazily as the raw twin does
    for (std::uint64_t i = 0; i < count; ++i) {
      const auto t0 = clk::now();
      if (tx) {
        check_op(tx->wait(), "channel send");
        tx.reset();
      }
      tx = ch.send(msg);
      rdx::operation rx = ch.receive(dst);
      while (!rx.test()) f.progress<rdx_api>();
      check_op(rx.error(), "channel receive");
      r.lat_us[i] = std::chrono::duration<double, std::micro>(clk::now() - t0).count() * 0.5;
    }
    if (tx) check_op(tx->wait(), "channel send");
  } else {
    auto ring = std::make_unique<std::optional<rdx::operation>[]>(depth);
    for (std::uint64_t i = 0; i < count; ++i) {
      auto& slot = ring[i % depth];
      if (slot) {
        check_op(slot->wait(), "channel send");
        slot.reset();
      }
      // Loopback: the receiver is this thread, so let it take messages and
      // return credits before the next send (which would otherwise be
      // deferred until the slot's wait drives both sides).
      while (ch.credits() == 0) {
        f.progress<rdx_api>();
        ch.conn().progress();
      }
      slot = ch.send(msg);
      if (f.is_loopback()) f.progress<rdx_api>();
    }
    for (unsigned j = 0; j < depth; ++j) {
      if (ring[j]) check_op(ring[j]->wait(), "channel send");
    }
  }
  const auto stop = clk::now();
  f.end<rdx_api>();
  r.seconds = std::chrono::duration<double>(stop - start).count();
  r.bytes = count * size;
  std::sort(r.lat_us.begin(), r.lat_us.end());
  return r;
}

}  // namespace rdx_bench
