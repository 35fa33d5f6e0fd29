// rdma tests: the handler-style message path (channel<T>::post and
// on_message), with no operation per message: delivery in order with every
// byte checked (inline and staged), credits exhausted (would block) and the
// recovery after the peer's progress, the rules beside receive(), a message
// that is not a whole number of T, a failed connection (later posts refused
// with its reason, the handler never called after it), many connections on
// a worker, and destruction in any order with a handler set.
// `ctest -R 'channel_handler|worker_handler'` selects them.
#include <catch2/catch.hpp>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <system_error>
#include <vector>

#include "channel_support.hpp"
#include "peer_record.hpp"

using namespace std::chrono_literals;
using clk = std::chrono::steady_clock;
using peer_test::make_record;
using peer_test::record;

namespace {

const std::error_code would_block = std::make_error_code(std::errc::resource_unavailable_try_again);

// What a test's handler saw: messages in order, checked by the test.
struct inbox {
  std::vector<std::vector<std::uint32_t>> got;
  void take(std::span<const std::uint32_t> m) { got.emplace_back(m.begin(), m.end()); }
};

// Message k: k % 64 + 1 words, word j = k * 1000 + j (so every byte differs from its neighbours').
std::vector<std::uint32_t> message_of(std::uint32_t k) {
  std::vector<std::uint32_t> v(k % 64 + 1);
  for (std::uint32_t j = 0; j < v.size(); ++j) v[j] = k * 1000 + j;
  return v;
}

// Drives a and b until pred() or the timeout.
template <class P>
bool drive(rdx::connection* a, rdx::connection* b, P pred, std::chrono::milliseconds timeout = 20s) {
  const auto end = clk::now() + timeout;
  while (!pred()) {
    if (a != nullptr) a->progress();
    if (b != nullptr) b->progress();
    if (clk::now() > end) return false;
  }
  return true;
}

rdx::connection_attr attr(std::uint32_t recv_depth = 16) {
  return rdx::connection_attr{
      .send_depth = 64, .signal_interval = 16, .recv_depth = recv_depth, .message_size = 256};
}

}  // namespace

TEST_CASE("post and a handler deliver every message in order, every byte checked", "[channel_handler]") {
  channel_test::pair p(attr());
  rdx::channel<std::uint32_t> tx(p.a), rx(p.b);
  inbox in;
  auto* inp = &in;
  REQUIRE(rx.on_message([inp](std::span<const std::uint32_t> m) { inp->take(m); }) == std::error_code{});
  CHECK(rx.has_handler());
  // Up to 256 bytes: the short ones go inline, the longer ones through staging.
  constexpr std::uint32_t n = 2000;
  std::uint32_t blocked = 0;
  for (std::uint32_t k = 0; k < n;) {
    std::vector<std::uint32_t> m = message_of(k);
    const std::error_code ec = tx.post(std::span<const std::uint32_t>(m));
    if (ec == would_block) {
      ++blocked;
      p.b.progress();
      p.a.progress();
      continue;
    }
    REQUIRE(ec == std::error_code{});
    std::fill(m.begin(), m.end(), 0xdeadbeef);  // the caller's buffer is free at once
    ++k;
  }
  p.a.cover();  // the last posts were unsignaled: their completion retires them
  REQUIRE(drive(&p.a, &p.b, [&] { return in.got.size() == n && p.a.outstanding() == 0; }));
  for (std::uint32_t k = 0; k < n; ++k) {
    INFO("message " << k);
    REQUIRE(in.got[k] == message_of(k));
  }
  std::printf("channel_handler: %u messages, %u posts refused (would block) and posted again\n", n, blocked);
  CHECK(p.a.signaled_count() < p.a.posted_count());  // unsignaled in between: no operation per message
  CHECK_FALSE(p.a.failed());
  CHECK_FALSE(p.b.failed());
}

TEST_CASE("credits exhausted: post would block, and recovers after the peer's progress",
          "[channel_handler]") {
  channel_test::pair p(attr(4));
  rdx::channel<std::uint64_t> tx(p.a), rx(p.b);
  std::vector<std::uint64_t> got;
  auto* g = &got;
  REQUIRE(rx.on_message([g](std::span<const std::uint64_t> m) { g->push_back(m[0]); }) == std::error_code{});
  for (std::uint64_t i = 0; i < 4; ++i) REQUIRE(tx.post(i) == std::error_code{});
  CHECK(tx.credits() == 0);
  // The sender's own progress brings no credit: only the receiver's does.
  for (int i = 0; i < 100; ++i) p.a.progress();
  CHECK(tx.post(4) == would_block);
  CHECK(tx.post(4) == std::errc::operation_would_block);
  CHECK(got.empty());
  REQUIRE(drive(&p.a, &p.b, [&] { return got.size() == 4 && tx.credits() > 0; }));
  CHECK(got == std::vector<std::uint64_t>{0, 1, 2, 3});
  REQUIRE(tx.post(4) == std::error_code{});
  REQUIRE(drive(&p.a, &p.b, [&] { return got.size() == 5; }));
  CHECK(got.back() == 4);
}

TEST_CASE("a handler beside receive(): one or the other, in order", "[channel_handler]") {
  channel_test::pair p(attr());
  rdx::channel<std::uint64_t> tx(p.a), rx(p.b);
  std::vector<std::uint64_t> got;
  auto* g = &got;
  auto handler = [g](std::span<const std::uint64_t> m) { g->push_back(m[0]); };
  {
    // Receives wait: a handler is refused, and the receives keep their messages.
    auto r = rx.receive();
    CHECK(rx.on_message(handler) == rdx::errc::handler_set);
    CHECK_FALSE(rx.has_handler());
    REQUIRE(tx.post(10) == std::error_code{});
    REQUIRE(r.wait(20s) == std::error_code{});
    CHECK(r.value() == 10);
  }
  // Messages that arrived with no handler and no receive go to the handler when it is set.
  for (std::uint64_t i = 11; i < 14; ++i) REQUIRE(tx.post(i) == std::error_code{});
  REQUIRE(drive(&p.a, &p.b, [&] { return p.b.messages_waiting() == 3; }));
  REQUIRE(rx.on_message(handler) == std::error_code{});
  CHECK(got == std::vector<std::uint64_t>{11, 12, 13});
  // While it is set, receives are refused at once.
  auto refused = rx.receive();
  CHECK(refused.done());
  CHECK(refused.error() == rdx::errc::handler_set);
  std::uint64_t into = 0;
  auto refused_span = rx.receive(std::span<std::uint64_t>(&into, 1));
  CHECK(refused_span.error() == rdx::errc::handler_set);
  auto refused_view = rx.receive_view();
  CHECK(refused_view.error() == rdx::errc::handler_set);
  // Removed: later messages go to receives again.
  rx.remove_handler();
  CHECK_FALSE(rx.has_handler());
  auto r = rx.receive();
  REQUIRE(tx.post(14) == std::error_code{});
  REQUIRE(r.wait(20s) == std::error_code{});
  CHECK(r.value() == 14);
  CHECK(got.size() == 3);
}

TEST_CASE("a handler that removes itself or sets another", "[channel_handler]") {
  channel_test::pair p(attr());
  rdx::channel<std::uint64_t> tx(p.a), rx(p.b);
  std::vector<std::uint64_t> first, second;
  struct state {
    rdx::channel<std::uint64_t>* rx;
    std::vector<std::uint64_t>* first;
    std::vector<std::uint64_t>* second;
  } st{&rx, &first, &second};
  auto* s = &st;
  // The first handler takes message 0, then hands over to a second one,
  // which takes message 1 and removes itself: message 2 waits for a receive.
  REQUIRE(rx.on_message([s](std::span<const std::uint64_t> m) {
    s->first->push_back(m[0]);
    (void)s->rx->on_message([s](std::span<const std::uint64_t> m2) {
      s->second->push_back(m2[0]);
      s->rx->remove_handler();
    });
  }) == std::error_code{});
  for (std::uint64_t i = 0; i < 3; ++i) REQUIRE(tx.post(i) == std::error_code{});
  REQUIRE(drive(&p.a, &p.b, [&] { return p.b.messages_waiting() == 1; }));
  CHECK(first == std::vector<std::uint64_t>{0});
  CHECK(second == std::vector<std::uint64_t>{1});
  auto r = rx.receive();
  REQUIRE(r.wait(20s) == std::error_code{});
  CHECK(r.value() == 2);
}

TEST_CASE("post refuses bad input before anything is posted", "[channel_handler]") {
  channel_test::pair p(attr());
  rdx::channel<std::byte> tx(p.a);
  const std::vector<std::byte> big(p.a.message_size() + 1);
  const std::uint64_t posted = p.a.posted_count();  // set-up's own requests
  CHECK(tx.post(std::span<const std::byte>(big)) == rdx::errc::limit_exceeded);
  CHECK(tx.post(std::span<const std::byte>()) == rdx::errc::invalid_argument);
  CHECK(p.a.posted_count() == posted);
  rdx::context& ctx = p.ctx;
  rdx::protection_domain pd(ctx);
  rdx::connection lone(pd, attr());
  rdx::channel<std::byte> unconnected(lone);
  CHECK(unconnected.post(std::byte{1}) == rdx::errc::not_ready);
  // A handler of a type whose alignment the ring's buffers cannot give.
  struct alignas(64) wide {
    std::byte b[64];
  };
  rdx::connection odd(pd, rdx::connection_attr{.recv_depth = 4, .message_size = 96});
  rdx::channel<wide> w(odd);
  CHECK(w.on_message([](std::span<const wide>) {}) == rdx::errc::invalid_argument);
}

TEST_CASE("a message that is not a whole number of T fails the connection, unhandled", "[channel_handler]") {
  channel_test::pair p(attr());
  rdx::channel<std::byte> tx(p.a);
  rdx::channel<std::uint64_t> rx(p.b);
  int calls = 0;
  auto* c = &calls;
  REQUIRE(rx.on_message([c](std::span<const std::uint64_t>) { ++*c; }) == std::error_code{});
  const std::array<std::byte, 5> five{};
  REQUIRE(tx.post(std::span<const std::byte>(five)) == std::error_code{});
  REQUIRE(drive(&p.a, &p.b, [&] { return p.b.failed(); }));
  CHECK(calls == 0);
  CHECK(p.b.failure_reason() == rdx::errc::protocol_error);
  INFO(p.b.failure_message());
  CHECK(p.b.failure_message().find("5 bytes") != std::string::npos);
}

TEST_CASE("a failed connection: later posts fail with its error, the handler is not called after",
          "[channel_handler]") {
  SECTION("the peer destroyed") {
    rdx::context ctx = channel_test::open_device();
    rdx::protection_domain pd(ctx);
    auto a = std::make_unique<rdx::connection>(pd, attr());
    auto b = std::make_unique<rdx::connection>(pd, attr());
    rdx::connect_pair(*a, *b, rdx::connect_options{.timeout = 12, .retry_cnt = 2});
    rdx::channel<std::uint64_t> tx(*a), rx_b(*b);
    int a_calls = 0;
    auto* c = &a_calls;
    REQUIRE(tx.on_message([c](std::span<const std::uint64_t>) { ++*c; }) == std::error_code{});
    std::vector<std::uint64_t> got;
    auto* g = &got;
    REQUIRE(rx_b.on_message([g](std::span<const std::uint64_t> m) { g->push_back(m[0]); }) ==
            std::error_code{});
    REQUIRE(tx.post(1) == std::error_code{});
    REQUIRE(drive(a.get(), b.get(), [&] { return got.size() == 1; }));
    b.reset();  // the peer is gone: nothing answers
    // A message posted now is accepted (copied) but never arrives: the
    // connection's failure reports it, within its detection bound.
    const std::error_code accepted = tx.post(2);
    CHECK((accepted == std::error_code{} || accepted == would_block));
    const auto t0 = clk::now();
    REQUIRE(drive(
        a.get(), nullptr, [&] { return a->failed(); }, a->detection_bound() + 10s));
    std::printf("channel_handler: the peer's loss failed the sender in %lld ms (bound %lld ms): %s\n",
                static_cast<long long>(
                    std::chrono::duration_cast<std::chrono::milliseconds>(clk::now() - t0).count()),
                static_cast<long long>(a->detection_bound().count()), a->failure_message().c_str());
    const std::error_code reason = a->failure_reason();
    CHECK(reason);
    CHECK(tx.post(3) == reason);
    CHECK(tx.post(4) == reason);
    for (int i = 0; i < 100; ++i) a->progress();
    CHECK(a_calls == 0);
    a.reset();  // with its handler set
  }
  SECTION("messages queued before the failure never reach a handler set after it") {
    channel_test::pair p(attr());
    rdx::channel<std::uint64_t> tx(p.a), rx(p.b);
    for (std::uint64_t i = 0; i < 3; ++i) REQUIRE(tx.post(i) == std::error_code{});
    REQUIRE(drive(&p.a, &p.b, [&] { return p.b.messages_waiting() == 3; }));
    ibv_qp_attr to_err{};
    to_err.qp_state = IBV_QPS_ERR;
    REQUIRE(::ibv_modify_qp(p.b.qp(0).native_handle(), &to_err, IBV_QP_STATE) == 0);
    REQUIRE(drive(nullptr, &p.b, [&] { return p.b.failed(); }));
    int calls = 0;
    auto* c = &calls;
    CHECK(rx.on_message([c](std::span<const std::uint64_t>) { ++*c; }) == std::error_code{});
    for (int i = 0; i < 100; ++i) p.b.progress();
    CHECK(calls == 0);
    CHECK(tx.post(9) == std::error_code{});  // the sender is untouched until it notices
  }
}

TEST_CASE("destruction in any order with a handler set", "[channel_handler]") {
  rdx::context ctx = channel_test::open_device();
  rdx::protection_domain pd(ctx);
  int calls = 0;
  auto* c = &calls;
  auto handler = [c](std::span<const std::uint64_t>) { ++*c; };
  SECTION("the receiver first, with messages in its ring and in flight") {
    auto a = std::make_unique<rdx::connection>(pd, attr());
    auto b = std::make_unique<rdx::connection>(pd, attr());
    rdx::connect_pair(*a, *b);
    std::optional<rdx::channel<std::uint64_t>> tx(std::in_place, *a), rx(std::in_place, *b);
    REQUIRE(rx->on_message(handler) == std::error_code{});
    for (std::uint64_t i = 0; i < 8; ++i) REQUIRE(tx->post(i) == std::error_code{});
    rx.reset();  // the channel is a view: the handler stays with the connection
    b.reset();
    CHECK(calls <= 8);
    tx.reset();
    a.reset();
  }
  SECTION("the sender first, with posts not yet retired") {
    auto a = std::make_unique<rdx::connection>(pd, attr());
    auto b = std::make_unique<rdx::connection>(pd, attr());
    rdx::connect_pair(*a, *b);
    rdx::channel<std::uint64_t> tx(*a), rx(*b);
    REQUIRE(rx.on_message(handler) == std::error_code{});
    REQUIRE(tx.on_message(handler) == std::error_code{});
    for (std::uint64_t i = 0; i < 8; ++i) REQUIRE(tx.post(i) == std::error_code{});
    a.reset();
    const int before = calls;
    REQUIRE(drive(
        nullptr, b.get(), [&] { return b->failed() || calls == before + 8; }, 30s));
    b.reset();
  }
  SECTION("on workers: the workers first, then the connections") {
    std::optional<rdx::worker> wa(std::in_place, pd), wb(std::in_place, pd);
    auto a = std::make_unique<rdx::connection>(*wa, pd, attr());
    auto b = std::make_unique<rdx::connection>(*wb, pd, attr());
    rdx::connect_pair(*a, *b);
    rdx::channel<std::uint64_t> tx(*a), rx(*b);
    REQUIRE(rx.on_message(handler) == std::error_code{});
    wa.reset();
    wb.reset();
    // The connections keep the shared queues: the handler still runs.
    REQUIRE(tx.post(1) == std::error_code{});
    REQUIRE(drive(a.get(), b.get(), [&] { return calls == 1; }));
    REQUIRE(tx.post(2) == std::error_code{});
    b.reset();
    a.reset();
  }
  SECTION("on one worker: a connection leaves while its handler is set, the worker goes last") {
    rdx::worker w(pd);
    auto a = std::make_unique<rdx::connection>(w, pd, attr());
    auto b = std::make_unique<rdx::connection>(w, pd, attr());
    rdx::connect_pair(*a, *b);
    rdx::channel<std::uint64_t> tx(*a), rx(*b);
    REQUIRE(rx.on_message(handler) == std::error_code{});
    for (std::uint64_t i = 0; i < 4; ++i) REQUIRE(tx.post(i) == std::error_code{});
    b.reset();
    for (int i = 0; i < 100; ++i) w.progress();
    a.reset();
    CHECK(w.connections() == 0);
  }
}

TEST_CASE("a handler on each of many connections of a worker, driven by the worker's progress",
          "[worker_handler]") {
  rdx::context ctx = channel_test::open_device();
  rdx::protection_domain pd(ctx);
  rdx::worker wc(pd), ws(pd);
  constexpr std::uint32_t pairs = 24, per_pair = 200;
  const rdx::connection_attr small{
      .send_depth = 16, .signal_interval = 8, .recv_depth = 8, .message_size = 64};
  struct link {
    std::unique_ptr<rdx::connection> client, server;
    std::optional<rdx::channel<record>> tx, rx;
    std::vector<std::uint32_t> seqs;  // the handler's, in arrival order
    std::uint32_t sent = 0;
    std::uint32_t bad = 0;  // records whose pair or check was wrong
  };
  std::vector<std::unique_ptr<link>> links;
  for (std::uint32_t i = 0; i < pairs; ++i) {
    auto l = std::make_unique<link>();
    l->client = std::make_unique<rdx::connection>(wc, pd, small);
    l->server = std::make_unique<rdx::connection>(ws, pd, small);
    rdx::connect_pair(*l->client, *l->server);
    l->tx.emplace(*l->client);
    l->rx.emplace(*l->server);
    link* me = l.get();
    const std::uint32_t pair = i;
    REQUIRE(l->rx->on_message([me, pair](std::span<const record> m) {
      for (const record& r : m) {
        if (r.pair != pair || r.check != make_record(pair, r.seq).check) ++me->bad;
        me->seqs.push_back(r.seq);
      }
    }) == std::error_code{});
    links.push_back(std::move(l));
  }
  CHECK(ws.connections() == pairs);
  // Pair 5 loses its client half-way; the others go on, checked.
  const auto deadline = clk::now() + 120s;
  std::uint64_t refused = 0;
  for (;;) {
    bool all = true;
    for (std::uint32_t i = 0; i < pairs; ++i) {
      link& l = *links[i];
      if (l.client == nullptr) continue;
      if (i == 5 && l.sent == per_pair / 2) {
        l.client.reset();
        continue;
      }
      if (l.sent < per_pair) {
        const std::error_code ec = l.tx->post(make_record(i, l.sent));
        if (!ec) {
          ++l.sent;
        } else {
          REQUIRE(ec == would_block);
          ++refused;
        }
      }
      if (i != 5 && l.seqs.size() < per_pair) all = false;
    }
    if (all) break;
    wc.progress();
    ws.progress();
    REQUIRE(clk::now() < deadline);
  }
  for (std::uint32_t i = 0; i < pairs; ++i) {
    INFO("pair " << i);
    const link& l = *links[i];
    CHECK(l.bad == 0);
    const std::uint32_t expect = i == 5 ? per_pair / 2 : per_pair;
    REQUIRE(l.seqs.size() >= (i == 5 ? 0 : per_pair));
    for (std::uint32_t k = 0; k < std::min<std::size_t>(l.seqs.size(), expect); ++k) REQUIRE(l.seqs[k] == k);
    if (i != 5) CHECK_FALSE(l.server->failed());
  }
  std::printf("worker_handler: %u pairs x %u messages on two workers, %llu posts refused (would block)\n",
              pairs, per_pair, static_cast<unsigned long long>(refused));
  // Pair 5's server notices its peer is gone; the handler is not called after.
  link& lost = *links[5];
  const std::size_t had = lost.seqs.size();
  CHECK(had <= per_pair / 2);
  // Half the links go while their handlers are set; the worker goes after the rest.
  for (std::uint32_t i = 0; i < pairs; i += 2) links[i].reset();
  for (int i = 0; i < 100; ++i) ws.progress();
  CHECK(lost.seqs.size() == had);
}
