// twonode test: windows and channels between two hosts. Run on both nodes
// (RDX_NODE=0 serves, 1 connects to RDX_PEER_ADDR). For K = 1, 2 and 4 queue
// pairs: striped window write and read of 2 MiB + 4 KiB (one doorbell per
// queue pair), fetch_add started in a batch and compare_swap, channel
// messages echoed (half sent from registered memory, half received as views
// of the ring), notifications with data; every byte checked. Exit 0 when
// all passed, 1 otherwise.
#include <rdx/channel/channel.hpp>
#include <rdx/channel/exchange.hpp>
#include <rdx/channel/window.hpp>
#include <rdx/connect/tcp_bootstrap.hpp>
#include <rdx/rdx.hpp>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

using namespace std::chrono_literals;
using rdx::rights;

namespace {

constexpr std::size_t words = (2u << 20) / 8 + 512;  // 2 MiB + 4 KiB of uint64
constexpr int messages = 50;
constexpr int notes = 10;

std::uint64_t pattern(std::size_t i, std::uint32_t k) {
  return (i * 0x9e3779b97f4a7c15ull) ^ k;
}

void ok(rdx::operation& op, const std::string& what) {
  if (std::error_code ec = op.wait(60s)) throw std::runtime_error(what + ": " + ec.message());
}
void require(bool c, const std::string& what) {
  if (!c) throw std::runtime_error(what);
}

void run(bool server, const std::string& peer, std::uint32_t k) {
  rdx::context ctx = rdx::context::open_default();
  rdx::protection_domain pd(ctx);
  rdx::connection conn(pd, rdx::connection_attr{.queue_pairs = k, .recv_depth = 8, .message_size = 256});
  rdx::channel<std::uint64_t> ch(conn);
  auto win = rdx::make_window_buffer<std::uint64_t, rights::read | rights::write>(pd, words);
  auto counters = rdx::make_window_buffer<std::uint64_t, rights::atomic>(pd, 16);
  const rdx::grant<std::uint64_t, rights::read | rights::write> gw(conn, win);
  const rdx::grant<std::uint64_t, rights::atomic> gc(conn, counters);
  const rdx::window_descriptor grants[] = {gw.descriptor(), gc.descriptor()};
  const std::uint16_t port = static_cast<std::uint16_t>(18600 + k);
  rdx::tcp::socket s;
  if (server) {
    auto l = rdx::tcp::listener::bind("", port);
    s = l.accept(60s);
  } else {
    s = rdx::tcp::connect(peer, port, 60s);
  }
  const rdx::peer_offer offer = rdx::exchange_and_connect(s, conn, grants, 60s);
  require(offer.windows.size() == 2, "two windows expected");

  if (server) {
    counters[3] = 1000;
    // Echo messages (values + 1), then take notifications and check their data.
    for (int i = 0; i < messages; ++i) {
      std::uint64_t v = 0;
      if (i % 2 == 0) {
        auto r = ch.receive();
        ok(r, "receive");
        v = r.value();
      } else {
        auto r = ch.receive_view();  // read in the ring, its buffer back when r goes
        ok(r, "receive_view");
        require(r.view().size() == 1, "a view of one value");
        v = r.view()[0];
      }
      auto e = ch.send(v + 1);
      ok(e, "echo");
    }
    for (int i = 0; i < notes; ++i) {
      auto n = ch.next_notification();
      ok(n, "notification");
      require(n.tag() == 0x7000u + static_cast<std::uint32_t>(i), "notification tag in order");
      require(n.byte_count() == static_cast<std::uint32_t>(8 * (i + 1)), "notification byte count");
      for (int j = 0; j <= i; ++j) {
        require(win[static_cast<std::size_t>(100 * i + j)] == pattern(static_cast<std::size_t>(j), 77),
                "notification data");
      }
    }
    auto checked = ch.send(2);  // the client may now overwrite the window
    ok(checked, "notifications checked");
    auto done = ch.receive();
    ok(done, "final message");
    require(counters[3] == 1000 + 5 && counters[4] == 42, "atomics landed in the server's memory");
    for (std::size_t i = 0; i < words; ++i) require(win[i] == pattern(i, k), "window data at the server");
    auto bye = ch.send(1);
    ok(bye, "final reply");
    rdx::tcp::barrier(s, 60s);
    std::printf("K=%u server: messages, notifications, atomics and %zu striped bytes checked\n", k,
                words * 8);
    return;
  }

  rdx::remote_window<std::uint64_t, rights::read | rights::write> w(conn, offer.windows[0]);
  rdx::remote_window<std::uint64_t, rights::atomic> c(conn, offer.windows[1]);
  rdx::registered_buffer<std::uint64_t> src(pd, words), back(pd, words);
  for (int i = 0; i < messages; ++i) {
    // Half from registered memory, no staging copy (the value stays put until the send is done).
    src[static_cast<std::size_t>(i)] = static_cast<std::uint64_t>(i) * 3;
    auto snd = i % 2 == 0 ? ch.send(static_cast<std::uint64_t>(i) * 3)
                          : ch.send_registered(rdx::local_span<const std::uint64_t>(src).subspan(
                                static_cast<std::size_t>(i), 1));
    auto r = ch.receive();
    ok(r, "echo receive");
    require(r.value() == static_cast<std::uint64_t>(i) * 3 + 1, "echoed value");
    ok(snd, "send");
  }
  for (int i = 0; i < notes; ++i) {
    for (int j = 0; j <= i; ++j) src[static_cast<std::size_t>(j)] = pattern(static_cast<std::size_t>(j), 77);
    auto n =
        ch.notify(w, rdx::local_span<const std::uint64_t>(src).subspan(0, static_cast<std::size_t>(i) + 1),
                  static_cast<std::size_t>(100 * i), 0x7000u + static_cast<std::uint32_t>(i));
    ok(n, "notify");
  }
  auto checked = ch.receive();
  ok(checked, "the server checked the notifications");
  // Striped write of the whole window, then read back.
  for (std::size_t i = 0; i < words; ++i) src[i] = pattern(i, k);
  const auto posted = conn.posted_count();
  const auto bells = conn.send_doorbells();
  auto wr = w.write(src, 0);
  require(conn.send_doorbells() - bells == k, "one doorbell per queue pair for the striped write");
  ok(wr, "striped write");
  require(conn.posted_count() - posted >= 5, "the write was split in chunks");
  auto rd = w.read(back, 0);
  ok(rd, "striped read");
  require(std::memcmp(back.data(), src.data(), words * 8) == 0, "read back equals written");
  // Five fetch_adds started in one batch: one doorbell, old values in order.
  std::array<rdx::operation, 5> adds;
  const auto bells_batch = conn.send_doorbells();
  conn.batch([&] {
    for (auto& fa : adds) fa = c.fetch_add(3, 1);
  });
  require(conn.send_doorbells() - bells_batch == 1, "one doorbell for the batch");
  for (std::size_t i = 0; i < adds.size(); ++i) {
    ok(adds[i], "fetch_add");
    require(adds[i].old_value() == 1000u + i, "fetch_add old value");
  }
  auto cs = c.compare_swap(4, 0, 42);
  ok(cs, "compare_swap");
  require(cs.old_value() == 0, "compare_swap old value");
  auto cs_miss = c.compare_swap(4, 0, 43);
  ok(cs_miss, "compare_swap (miss)");
  require(cs_miss.old_value() == 42, "compare_swap miss sees 42");
  require(w.read(back, 1).error() == rdx::errc::out_of_range, "range checked locally");
  auto fin = ch.send(0);
  ok(fin, "final message");
  auto bye = ch.receive();
  ok(bye, "final reply");
  rdx::tcp::barrier(s, 60s);
  std::printf("K=%u client: write, read, fetch_add, compare_swap, %d messages, %d notifications checked\n", k,
              messages, notes);
}

}  // namespace

int main() {
  const char* node = std::getenv("RDX_NODE");
  const char* peer = std::getenv("RDX_PEER_ADDR");
  if (node == nullptr || peer == nullptr) {
    std::fprintf(stderr, "SKIP: needs RDX_NODE and RDX_PEER_ADDR (run through rdx-vm --nodes 2)\n");
    return 77;
  }
  const bool server = std::string(node) == "0";
  try {
    for (std::uint32_t k : {1u, 2u, 4u}) run(server, peer, k);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "FAILED (node %s): %s\n", node, e.what());
    return 1;
  }
  std::printf("node %s: all channel and window checks passed for K = 1, 2, 4\n", node);
  return 0;
}
