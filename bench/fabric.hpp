// rdx benchmarks: the fabric under test (loopback: two sides in one process;
// two nodes: this side plus a responder process reached over rdx's TCP
// bootstrap) and the responders, the passive half of every run. The code
// compared is in twins.hpp, the measured loops in loops.hpp.
#pragma once

#include <rdx/channel/channel.hpp>
#include <rdx/channel/connection.hpp>
#include <rdx/channel/exchange.hpp>
#include <rdx/channel/window.hpp>
#include <rdx/connect/tcp_bootstrap.hpp>
#include <rdx/verbs/completion_queue.hpp>
#include <rdx/verbs/context.hpp>
#include <rdx/verbs/memory_region.hpp>
#include <rdx/verbs/protection_domain.hpp>
#include <rdx/verbs/queue_pair.hpp>

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
#include <string>
#include <vector>

#include "common.hpp"
#include "twins.hpp"

namespace rdx_bench {

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

//! What the client asks the responder to do for one measured run.
struct command {
  op what = op::quit;
  api_kind api = api_kind::raw;
  std::uint64_t size = 0;
  std::uint64_t count = 0;
  std::uint32_t depth = 1;
  std::uint32_t nqp = 1;
};

// One request at a time on a twin, kept here because the responders below use
// them as the latency loops of loops.hpp do.

//! Send-queue bookkeeping: requests posted and not yet retired by a completion.
struct sq_credit {
  std::uint64_t outstanding = 0;
  unsigned since_signal = 0;
};

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
  check_post(Api::post(s.qp(q), d, 1, sig, c.since_signal), "post");
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
        check_post(Api::post_recv(s_.qp(q), s_.rx_sge(0, s_.region())), "responder post_recv");
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

//! channel<std::byte> messages, copying or zero-copy.
[[nodiscard]] inline bool is_message_op(op o) noexcept {
  return o == op::chan_send_bw || o == op::chan_send_lat || o == op::chan_zc_bw || o == op::chan_zc_lat;
}
[[nodiscard]] inline bool is_zero_copy_op(op o) noexcept {
  return o == op::chan_zc_bw || o == op::chan_zc_lat;
}
[[nodiscard]] inline bool is_channel_op(op o) noexcept {
  return o == op::window_write_bw || o == op::window_read_bw || o == op::window_write_lat ||
         o == op::window_read_lat || is_message_op(o);
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

//! The passive half of a channel run: receives messages (and echoes them for
//! latency), copying them out of the ring or, zero-copy, viewing them there
//! and answering from registered memory.
class chan_responder {
public:
  explicit chan_responder(chan_side& s) : s_(s) {}

  void start(const command& c) {
    cmd_ = c;
    remaining_ = is_message_op(c.what) ? c.count : 0;
    rx_.reset();
    view_.reset();
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
    const bool zc = is_zero_copy_op(cmd_.what);
    if (zc) {
      if (!view_) view_ = ch.receive_view();
      if (!view_->test()) return false;
      check_op(view_->error(), "responder receive_view");
      if (view_->view().size() != cmd_.size)
        fail("responder receive_view: " + std::to_string(view_->view().size()) + " bytes, expected " +
             std::to_string(cmd_.size));
      view_.reset();  // gives the ring buffer back: reposted, its credit returned
    } else {
      if (!rx_) rx_ = ch.receive(s_.buffer(cmd_.size));
      if (!rx_->test()) return false;
      check_op(rx_->error(), "responder receive");
      rx_.reset();
    }
    --remaining_;
    if (cmd_.what == op::chan_send_lat || cmd_.what == op::chan_zc_lat) {
      // Like the plain-verbs responder, answer at once and retire the
      // previous answer's send lazily (it completed long ago).
      if (tx_) {
        check_op(tx_->wait(), "responder send");
        tx_.reset();
      }
      if (zc)
        tx_ = ch.send_registered(s_.local(cmd_.size));
      else
        tx_ = ch.send(std::span<const std::byte>(s_.buffer(cmd_.size)));
    }
    return false;
  }

private:
  chan_side& s_;
  command cmd_{};
  std::uint64_t remaining_ = 0;
  std::optional<rdx::operation> rx_;
  std::optional<rdx::message_view<std::byte>> view_;
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

}  // namespace rdx_bench
