// rdma tests: typed channels over a loopback pair of connections: send and
// receive with the data and order checked, oversize messages, notifications
// (tag and byte count, in order), a slow receiver that never causes an RNR
// (rnr_retry 0 would turn one into an error), and co_await on receives.
#include <catch2/catch.hpp>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "channel_support.hpp"

using namespace std::chrono_literals;
using channel_test::pair;
using rdx::rights;

namespace {
struct record {
  std::uint64_t seq;
  std::uint32_t check;
  char text[20];
};
record make_record(std::uint64_t i) {
  record r{};
  r.seq = i;
  r.check = static_cast<std::uint32_t>(i * 2654435761u);
  std::snprintf(r.text, sizeof r.text, "message %llu", static_cast<unsigned long long>(i));
  return r;
}
bool same(const record& a, const record& b) {
  return std::memcmp(&a, &b, sizeof a) == 0;
}

// rnr_retry 0: a send that found no posted receive would fail at once.
rdx::connect_options no_rnr_retry() {
  rdx::connect_options o;
  o.rnr_retry = 0;
  return o;
}
}  // namespace

TEST_CASE("channel send and receive, order and data checked") {
  pair p(rdx::connection_attr{.recv_depth = 16, .message_size = 256}, no_rnr_retry());
  rdx::channel<record> tx(p.a), rx(p.b);
  CHECK(tx.credits() == 16);
  for (std::uint64_t i = 0; i < 40; ++i) {
    auto s = tx.send(make_record(i));
    auto r = rx.receive();
    REQUIRE(r.wait(20s) == std::error_code{});
    CHECK(same(r.value(), make_record(i)));
    CHECK(r.byte_count() == sizeof(record));
    REQUIRE(s.wait(20s) == std::error_code{});
  }
  // Several queued before any receive: order kept.
  {
    auto s0 = tx.send(make_record(100));
    auto s1 = tx.send(make_record(101));
    auto s2 = tx.send(make_record(102));
    for (std::uint64_t i = 100; i < 103; ++i) {
      auto r = rx.receive();
      REQUIRE(r.wait(20s) == std::error_code{});
      CHECK(r.value().seq == i);
    }
    CHECK(s2.wait(20s) == std::error_code{});
  }
  // A span of values as one message, received into a larger span.
  std::array<record, 4> many{make_record(7), make_record(8), make_record(9), make_record(10)};
  auto s = tx.send(std::span<const record>(many));
  std::array<record, 8> into{};
  auto r = rx.receive(std::span<record>(into));
  REQUIRE(r.wait(20s) == std::error_code{});
  CHECK(r.byte_count() == 4 * sizeof(record));
  for (std::size_t i = 0; i < 4; ++i) CHECK(same(into[i], many[i]));
  CHECK(s.wait(20s) == std::error_code{});
  // Both directions on one connection pair.
  auto back = rx.send(make_record(55));
  auto got = tx.receive();
  REQUIRE(got.wait(20s) == std::error_code{});
  CHECK(got.value().seq == 55);
  CHECK_FALSE(p.a.failed());
  CHECK_FALSE(p.b.failed());
}

TEST_CASE("buffers of messages taken in one poll are reposted with one doorbell") {
  pair p(rdx::connection_attr{.recv_depth = 16, .message_size = 256}, no_rnr_retry());
  rdx::channel<record> tx(p.a), rx(p.b);
  const auto calls0 = p.b.receive_doorbells();
  const auto bufs0 = p.b.receives_reposted();
  // Eight receives wait; eight messages arrive before the receiver polls.
  std::vector<rdx::receive_operation<record>> rs;
  rs.reserve(8);
  for (int i = 0; i < 8; ++i) rs.push_back(rx.receive());
  for (std::uint64_t i = 0; i < 8; ++i) {
    auto s = tx.send(make_record(i));
    REQUIRE(s.wait(20s) == std::error_code{});  // acknowledged: it is in b's completion queue
  }
  for (std::uint64_t i = 0; i < 8; ++i) {
    REQUIRE(rs[i].wait(20s) == std::error_code{});
    CHECK(same(rs[i].value(), make_record(i)));
  }
  CHECK(p.b.receives_reposted() - bufs0 == 8);
  CHECK(p.b.receive_doorbells() - calls0 == 1);  // one ibv_post_recv for all eight
  // Messages taken one at a time (each receive started after its message
  // arrived) wait for a batch of a quarter of recv_depth (4 here): the
  // fourth's repost takes all four, with one doorbell.
  for (std::uint64_t i = 8; i < 12; ++i) {
    auto s = tx.send(make_record(i));
    REQUIRE(s.wait(20s) == std::error_code{});
    auto r = rx.receive();
    REQUIRE(r.wait(20s) == std::error_code{});
    CHECK(r.value().seq == i);
    CHECK(p.b.receives_reposted() - bufs0 == (i < 11 ? 8u : 12u));
  }
  CHECK(p.b.receive_doorbells() - calls0 == 2);
  for (std::uint64_t i = 12; i < 60; ++i) {  // more than the ring: reposted buffers take them
    auto si = tx.send(make_record(i));
    auto ri = rx.receive();
    REQUIRE(ri.wait(20s) == std::error_code{});
    CHECK(ri.value().seq == i);
    REQUIRE(si.wait(20s) == std::error_code{});
  }
  CHECK_FALSE(p.a.failed());
  CHECK_FALSE(p.b.failed());
}

TEST_CASE("oversize and empty messages are refused before posting") {
  pair p(rdx::connection_attr{.recv_depth = 4, .message_size = 64});
  rdx::channel<std::uint64_t> tx(p.a), rx(p.b);
  std::vector<std::uint64_t> big(9);  // 72 bytes > 64
  const auto posted = p.a.posted_count();
  auto s = tx.send(std::span<const std::uint64_t>(big));
  CHECK(s.done());
  CHECK(s.error() == rdx::errc::limit_exceeded);
  auto e = tx.send(std::span<const std::uint64_t>());
  CHECK(e.error() == rdx::errc::invalid_argument);
  CHECK(p.a.posted_count() == posted);
  CHECK(tx.credits() == 4);
  // A type larger than a buffer cannot make a channel at all.
  struct huge {
    char b[65];
  };
  CHECK_THROWS_WITH((rdx::channel<huge>(p.a)), Catch::Contains("exceeds the connection's message_size"));
  // A message larger than the receiver's span: that receive fails, the next works.
  std::vector<std::uint64_t> eight(8, 5);
  auto s8 = tx.send(std::span<const std::uint64_t>(eight));
  std::array<std::uint64_t, 2> small{};
  auto r = rx.receive(std::span<std::uint64_t>(small));
  REQUIRE(r.wait(20s) == rdx::errc::limit_exceeded);
  CHECK(r.byte_count() == 64);
  auto s1 = tx.send(std::uint64_t{77});
  auto r1 = rx.receive();
  REQUIRE(r1.wait(20s) == std::error_code{});
  CHECK(r1.value() == 77);
  // A receive of one value refuses a message of another size.
  auto s2 = tx.send(std::span<const std::uint64_t>(eight.data(), 2));
  auto r2 = rx.receive();
  CHECK(r2.wait(20s) == rdx::errc::limit_exceeded);
}

TEST_CASE("notify: write with immediate, the receiver gets (tag, byte count) in order") {
  pair p(rdx::connection_attr{.recv_depth = 8, .message_size = 64}, no_rnr_retry());
  rdx::channel<std::uint32_t> a(p.a), b(p.b);
  auto target = rdx::make_window_buffer<std::uint32_t, rights::write>(p.pd, 1024);
  rdx::grant<std::uint32_t, rights::write> w_grant(p.b, target);
  rdx::remote_window<std::uint32_t, rights::write> w(p.a, w_grant.descriptor());
  rdx::registered_buffer<std::uint32_t> src(p.pd, 1024);
  for (std::uint32_t i = 0; i < 1024; ++i) src[i] = i * 7 + 1;
  rdx::local_span<const std::uint32_t> s(src);
  // More notifications than buffers: flow control holds the sender back.
  for (std::uint32_t round = 0; round < 3; ++round) {
    std::array<std::uint32_t, 12> sizes{};
    for (std::uint32_t k = 0; k < 12; ++k) {
      sizes[k] = (k * 37 + round) % 100;  // some zero-length: a bare tag
      if (sizes[k] == 0) {
        auto n = a.notify(0xabc00000u + round * 100 + k);
        REQUIRE(n.wait(20s) == std::error_code{});
      } else {
        auto n = a.notify(w, s.subspan(k * 64, sizes[k]), k * 64, 0xabc00000u + round * 100 + k);
        // Completing the write needs no receiver progress... but credits
        // do: take notifications on the other side while sending.
        while (!n.test()) p.b.progress();
        REQUIRE(n.ok());
      }
      if (k % 3 == 2) {
        for (std::uint32_t j = k - 2; j <= k; ++j) {
          auto got = b.next_notification();
          REQUIRE(got.wait(20s) == std::error_code{});
          CHECK(got.tag() == 0xabc00000u + round * 100 + j);
          CHECK(got.byte_count() == sizes[j] * 4);
          CHECK(std::memcmp(target.data() + j * 64, src.data() + j * 64, sizes[j] * 4) == 0);
        }
      }
    }
  }
  // Messages and notifications interleaved: each kind keeps its own order.
  auto m1 = a.send(std::uint32_t{1});
  auto n1 = a.notify(501);
  auto m2 = a.send(std::uint32_t{2});
  auto n2 = a.notify(502);
  auto g1 = b.next_notification();
  auto r1 = b.receive();
  auto g2 = b.next_notification();
  auto r2 = b.receive();
  REQUIRE(r2.wait(20s) == std::error_code{});
  REQUIRE(g2.wait(20s) == std::error_code{});
  CHECK(g1.tag() == 501);
  CHECK(g2.tag() == 502);
  CHECK(r1.value() == 1);
  CHECK(r2.value() == 2);
}

TEST_CASE("slow receiver: no RNR, nothing lost, order kept") {
  // Two threads, one connection each; the receiver takes one message at a
  // time with a pause. With rnr_retry 0 a single send without a posted
  // receive would fail the connection.
  pair p(rdx::connection_attr{.recv_depth = 4, .message_size = 64}, no_rnr_retry());
  constexpr std::uint64_t count = 200;
  std::atomic<bool> sender_ok{true};
  std::atomic<std::uint32_t> min_credits{99};
  std::thread sender([&] {
    rdx::channel<record> tx(p.a);
    for (std::uint64_t i = 0; i < count; ++i) {
      auto s = tx.send(make_record(i));
      if (s.wait(30s)) {
        sender_ok = false;
        return;
      }
      min_credits = std::min(min_credits.load(), tx.credits());
    }
  });
  rdx::channel<record> rx(p.b);
  std::uint64_t received = 0;
  bool in_order = true;
  for (std::uint64_t i = 0; i < count; ++i) {
    if (i % 8 == 0) std::this_thread::sleep_for(5ms);
    auto r = rx.receive();
    if (r.wait(30s)) break;
    if (!same(r.value(), make_record(i))) in_order = false;
    ++received;
  }
  sender.join();
  CHECK(sender_ok);
  CHECK(received == count);
  CHECK(in_order);
  CHECK(min_credits == 0);  // the sender did run out and wait
  CHECK_FALSE(p.a.failed());
  CHECK_FALSE(p.b.failed());
}

namespace {
channel_test::task echo_server(rdx::channel<record>& ch, int rounds, int& served) {
  for (int i = 0; i < rounds; ++i) {
    rdx::received<record> m = co_await ch.receive();
    if (!m) co_return;
    m.value.check += 1;
    if (co_await ch.send(m.value)) co_return;
    ++served;
  }
}
channel_test::task client(rdx::channel<record>& ch, int rounds, int& good) {
  for (int i = 0; i < rounds; ++i) {
    record r = make_record(static_cast<std::uint64_t>(i));
    if (co_await ch.send(r)) co_return;
    rdx::received<record> m = co_await ch.receive();
    if (!m || m.value.seq != r.seq || m.value.check != r.check + 1) co_return;
    ++good;
  }
}
}  // namespace

TEST_CASE("co_await on sends and receives: an echo between two coroutines") {
  pair p(rdx::connection_attr{.recv_depth = 8, .message_size = 64}, no_rnr_retry());
  rdx::channel<record> a(p.a), b(p.b);
  int served = 0, good = 0;
  auto srv = echo_server(b, 100, served);
  auto cli = client(a, 100, good);
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while ((!srv.done() || !cli.done()) && std::chrono::steady_clock::now() < deadline) {
    p.a.progress();
    p.b.progress();
  }
  CHECK(served == 100);
  CHECK(good == 100);
}

TEST_CASE("connections refuse a peer with other settings") {
  auto ctx = channel_test::open_device();
  rdx::protection_domain pd(ctx);
  rdx::connection a(pd, rdx::connection_attr{.recv_depth = 8});
  rdx::connection b(pd, rdx::connection_attr{.recv_depth = 16});
  rdx::connection c(pd, rdx::connection_attr{.queue_pairs = 2, .recv_depth = 8});
  CHECK_THROWS_WITH(a.connect(b.local_info()), Catch::Contains("recv_depth is 8 here but 16"));
  CHECK_THROWS_WITH(a.connect(c.local_info()), Catch::Contains("queue_pairs is 1 here but 2"));
  CHECK_THROWS_WITH(rdx::connection(pd, rdx::connection_attr{.signal_interval = 0}),
                    Catch::Contains("signal_interval"));
  CHECK_THROWS_WITH(rdx::connection(pd, rdx::connection_attr{.chunk_size = 1000}),
                    Catch::Contains("chunk_size"));
  // Before connect, operations fail at once with not_ready.
  rdx::channel<int> ch(a);
  auto s = ch.send(1);
  CHECK(s.error() == rdx::errc::not_ready);
}

TEST_CASE("send_registered: messages straight from registered memory, deferred past the credits, in order") {
  pair p(rdx::connection_attr{.recv_depth = 4, .message_size = 4096}, no_rnr_retry());
  rdx::channel<std::uint32_t> tx(p.a), rx(p.b);
  constexpr std::size_t words = 1024;  // 4 KiB a message, above the inline size
  constexpr std::size_t count = 20;    // five times the receiver's buffers
  rdx::registered_buffer<std::uint32_t> src(p.pd, words * count);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::uint32_t>(i * 2654435761u);
  const rdx::local_span<const std::uint32_t> all(src);
  // Twenty started before the receiver takes any: four go out on the
  // credits, sixteen wait. None takes a staging buffer (there are eight),
  // so none fails for want of one.
  std::vector<rdx::operation> sends;
  sends.reserve(count);
  for (std::size_t m = 0; m < count; ++m) {
    sends.push_back(tx.send_registered(all.subspan(m * words, words)));
    REQUIRE_FALSE(sends.back().done());
  }
  CHECK(p.a.has_deferred());
  std::vector<std::uint32_t> into(words);
  for (std::size_t m = 0; m < count; ++m) {
    INFO("message " << m);
    auto r = rx.receive(std::span<std::uint32_t>(into));
    // Both sides polled: a's deferred sends go out as b's credits come back.
    const auto end = std::chrono::steady_clock::now() + 20s;
    while (!r.done() && std::chrono::steady_clock::now() < end) {
      (void)p.a.progress();
      (void)p.b.progress();
    }
    REQUIRE(r.done());
    REQUIRE(r.error() == std::error_code{});
    REQUIRE(r.byte_count() == words * 4);
    CHECK(std::memcmp(into.data(), src.data() + m * words, words * 4) == 0);
  }
  for (auto& s : sends) CHECK(s.wait(20s) == std::error_code{});
  // A small one goes inline from the same memory.
  auto small = tx.send_registered(all.subspan(5, 3));
  std::array<std::uint32_t, 3> three{};
  auto r3 = rx.receive(std::span<std::uint32_t>(three));
  REQUIRE(r3.wait(20s) == std::error_code{});
  CHECK(std::memcmp(three.data(), src.data() + 5, 12) == 0);
  REQUIRE(small.wait(20s) == std::error_code{});
  CHECK_FALSE(p.a.failed());
}

TEST_CASE("send_registered: bad sizes fail before anything is posted; a withdrawn one never arrives") {
  pair p(rdx::connection_attr{.recv_depth = 2, .message_size = 256}, no_rnr_retry());
  rdx::channel<std::byte> tx(p.a), rx(p.b);
  rdx::registered_buffer<std::byte> src(p.pd, 1024);
  std::memset(src.data(), 0x5a, src.size());
  const rdx::local_span<const std::byte> all(src);
  const auto posted = p.a.posted_count();
  auto empty = tx.send_registered(all.subspan(0, 0));
  CHECK(empty.done());
  CHECK(empty.error() == rdx::errc::invalid_argument);
  auto big = tx.send_registered(all.subspan(0, 257));
  CHECK(big.done());
  CHECK(big.error() == rdx::errc::limit_exceeded);
  CHECK(p.a.posted_count() == posted);
  // Two use the credits; the third waits and is destroyed before it is posted.
  auto s0 = tx.send_registered(all.subspan(0, 200));
  auto s1 = tx.send_registered(all.subspan(200, 200));
  {
    auto s2 = tx.send_registered(all.subspan(400, 200));
    CHECK(s2.deferred());
  }
  CHECK_FALSE(p.a.has_deferred());
  std::array<std::byte, 256> into{};
  for (int m = 0; m < 2; ++m) {
    auto r = rx.receive(std::span<std::byte>(into));
    REQUIRE(r.wait(20s) == std::error_code{});
    CHECK(r.byte_count() == 200);
  }
  REQUIRE(s0.wait(20s) == std::error_code{});
  REQUIRE(s1.wait(20s) == std::error_code{});
  // The withdrawn one never comes: a later message is the next to arrive.
  src[600] = std::byte{0x11};
  auto s3 = tx.send_registered(all.subspan(600, 1));
  auto r = rx.receive(std::span<std::byte>(into));
  REQUIRE(r.wait(20s) == std::error_code{});
  CHECK(r.byte_count() == 1);
  CHECK(into[0] == std::byte{0x11});
  REQUIRE(s3.wait(20s) == std::error_code{});
  CHECK(p.b.messages_waiting() == 0);
}

TEST_CASE("while a view holds a buffer, the buffers of copied messages are reposted at once") {
  // Thirteen views hold 13 of b's 16 buffers; 3 credits are left to a.
  // Were copied messages' buffers held back for a batch (4) here, a
  // ping-pong would spend those 3 and wait for ever: b's replies would carry
  // no credit for them. Reposted at once, each reply gives its credit back.
  pair p(rdx::connection_attr{.recv_depth = 16, .message_size = 256}, no_rnr_retry());
  rdx::channel<record> ab(p.a), ba(p.b);
  std::vector<rdx::message_view<record>> views;
  views.reserve(13);
  for (std::uint64_t i = 0; i < 13; ++i) {
    auto s = ab.send(make_record(i));
    views.push_back(ba.receive_view());
    REQUIRE(views.back().wait(20s) == std::error_code{});
    REQUIRE(s.wait(20s) == std::error_code{});
  }
  const auto reposted0 = p.b.receives_reposted();
  for (std::uint64_t i = 100; i < 140; ++i) {
    auto s = ab.send(make_record(i));
    auto r = ba.receive();
    REQUIRE(r.wait(20s) == std::error_code{});
    CHECK(same(r.value(), make_record(i)));
    REQUIRE(s.wait(20s) == std::error_code{});
    auto back = ba.send(make_record(i + 1000));
    auto got = ab.receive();
    REQUIRE(got.wait(20s) == std::error_code{});
    CHECK(got.value().seq == i + 1000);
    REQUIRE(back.wait(20s) == std::error_code{});
  }
  CHECK(p.b.receives_reposted() - reposted0 == 40);  // one for each, at once
  for (std::uint64_t i = 0; i < 13; ++i) CHECK(same(views[i].view()[0], make_record(i)));
  // Once the views are gone, copied messages' buffers wait for a batch again;
  // a buffer held back goes at once when a view takes another.
  const auto held = p.b.receives_reposted();
  views.clear();
  const auto reposted1 = p.b.receives_reposted();
  CHECK(reposted1 - held == 13);
  for (std::uint64_t i = 200; i < 202; ++i) {
    auto s = ab.send(make_record(i));
    auto r = ba.receive();
    REQUIRE(r.wait(20s) == std::error_code{});
    REQUIRE(s.wait(20s) == std::error_code{});
  }
  CHECK(p.b.receives_reposted() == reposted1);  // two held back
  auto s = ab.send(make_record(202));
  auto v = ba.receive_view();
  REQUIRE(v.wait(20s) == std::error_code{});
  REQUIRE(s.wait(20s) == std::error_code{});
  CHECK(same(v.view()[0], make_record(202)));
  CHECK(p.b.receives_reposted() - reposted1 == 2);  // the two, when the view took its buffer
  CHECK_FALSE(p.a.failed());
  CHECK_FALSE(p.b.failed());
}

TEST_CASE("receive_view: the message read where the NIC put it, its credit held until release") {
  pair p(rdx::connection_attr{.recv_depth = 4, .message_size = 256}, no_rnr_retry());
  rdx::channel<record> tx(p.a), rx(p.b);
  const auto reposted0 = p.b.receives_reposted();
  // Four views hold all four of b's buffers.
  std::vector<rdx::message_view<record>> views;
  views.reserve(4);
  for (std::uint64_t i = 0; i < 4; ++i) {
    auto s = tx.send(make_record(i));
    views.push_back(rx.receive_view());
    REQUIRE(views.back().wait(20s) == std::error_code{});
    REQUIRE(s.wait(20s) == std::error_code{});
    REQUIRE(views.back().holds());
    REQUIRE(views.back().view().size() == 1);
    CHECK(same(views.back().view()[0], make_record(i)));
  }
  CHECK(p.b.receives_reposted() == reposted0);  // nothing copied out, nothing reposted
  // No buffer is free at b: a fifth message waits at a for a credit (no
  // receiver-not-ready), however long the views are held.
  auto fifth = tx.send(make_record(4));
  CHECK(fifth.deferred());
  for (int i = 0; i < 200; ++i) {
    (void)p.a.progress();
    (void)p.b.progress();
  }
  CHECK(fifth.deferred());
  // A moved view carries its loan; releasing it reposts the buffer and the credit lets the fifth go.
  rdx::message_view<record> moved = std::move(views[1]);
  CHECK_FALSE(views[1].holds());
  CHECK(same(moved.view()[0], make_record(1)));
  moved.release();
  CHECK_FALSE(moved.holds());
  CHECK(moved.view().empty());
  CHECK(p.b.receives_reposted() - reposted0 == 1);
  REQUIRE(fifth.wait(20s) == std::error_code{});  // a sees the credit and posts it
  auto r5 = rx.receive_view();
  REQUIRE(r5.wait(20s) == std::error_code{});
  CHECK(same(r5.view()[0], make_record(4)));
  // The other views go by destruction and by move-assignment.
  views[0] = std::move(r5);  // views[0]'s old buffer goes back, r5's moves in
  CHECK(same(views[0].view()[0], make_record(4)));
  views.clear();
  CHECK(p.b.receives_reposted() - reposted0 == 5);
  // Every credit comes back (b reports them by an RDMA write): four more
  // messages go without waiting.
  const auto end = std::chrono::steady_clock::now() + 20s;
  while (p.a.credits() < 4 && std::chrono::steady_clock::now() < end) {
    (void)p.a.progress();
    (void)p.b.progress();
  }
  REQUIRE(p.a.credits() == 4);
  for (std::uint64_t i = 10; i < 14; ++i) {
    auto s = tx.send(make_record(i));
    CHECK_FALSE(s.deferred());
    auto r = rx.receive_view();
    REQUIRE(r.wait(20s) == std::error_code{});
    CHECK(same(r.view()[0], make_record(i)));
    REQUIRE(s.wait(20s) == std::error_code{});
  }
  CHECK_FALSE(p.a.failed());
  CHECK_FALSE(p.b.failed());
}

TEST_CASE("receive_view: a message that is not a whole number of T fails and frees its buffer") {
  pair p(rdx::connection_attr{.recv_depth = 2, .message_size = 256}, no_rnr_retry());
  rdx::channel<std::byte> tx(p.a);
  rdx::channel<std::uint64_t> rx(p.b);
  const std::array<std::byte, 12> twelve{};
  auto s = tx.send(std::span<const std::byte>(twelve));
  auto v = rx.receive_view();
  REQUIRE(v.wait(20s) == rdx::errc::limit_exceeded);
  CHECK_FALSE(v.holds());
  CHECK(v.view().empty());
  REQUIRE(s.wait(20s) == std::error_code{});
  // Its buffer went back: both credits are usable again.
  const std::array<std::byte, 16> sixteen{};
  auto s1 = tx.send(std::span<const std::byte>(sixteen));
  auto s2 = tx.send(std::span<const std::byte>(sixteen));
  REQUIRE(s1.wait(20s) == std::error_code{});  // a posts both once the credit is back
  REQUIRE(s2.wait(20s) == std::error_code{});
  auto v1 = rx.receive_view();
  auto v2 = rx.receive_view();
  REQUIRE(v1.wait(20s) == std::error_code{});
  REQUIRE(v2.wait(20s) == std::error_code{});
  CHECK(v1.view().size() == 2);
  CHECK(v2.view().size() == 2);
}
