// kv_window's client: reads the server's table, rewrites some records, bumps
// every version atomically, reads it all back and checks it, then asks the
// server for its own verdict.
#include <rdx/channel/channel.hpp>
#include <rdx/channel/exchange.hpp>
#include <rdx/channel/window.hpp>
#include <rdx/connect/tcp_bootstrap.hpp>
#include <rdx/rdx.hpp>
#if RDX_EXAMPLES_CM
#include <rdx/cm/cm.hpp>
#endif

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>

#include "cli.hpp"
#include "kv_window.hpp"
#include "options.hpp"
#include "psk_setup.hpp"
#include "record.hpp"

namespace kv {

int run_client(const options& o) {
  const app::setup_key key(o.psk_file);  // before any socket
  rdx::context ctx = app::open_device(o.device);
  rdx::protection_domain pd(ctx);
  rdx::connection_attr attr = attr_of(o);
  attr.events = o.events;  // -e: expect_ok sleeps on the connection's descriptor
  rdx::connection conn(pd, attr);
  rdx::channel<std::uint64_t> ctl(conn);
  const std::uint64_t stride = o.all ? 1 : stride_for(o.records);
  rdx::peer_offer offer;
  std::string peer;
  std::function<void()> finish = [] {};
#if RDX_EXAMPLES_CM
  if (o.cm) {
    // The server may start a moment after its clients: wait for it, up to --timeout.
    offer = rdx::cm::connect(conn, o.server, o.port, {},
                             rdx::cm::options{.timeout = o.timeout, .wait_for_listener = true});
    peer = rdx::detail::host_port(o.server, o.port) + " over rdma_cm";
  }
#endif
  if (!o.cm) {
    auto sock = std::make_shared<rdx::tcp::socket>(app::bootstrap_socket(o.server, o.port, o.timeout));
    offer = key.exchange_and_connect(*sock, conn, {}, rdx::exchange_options{.timeout = o.timeout});
    peer = sock->peer() + (key ? ", authenticated with --psk-file" : "");
    finish = [sock, &o] { rdx::tcp::barrier(*sock, o.timeout); };
  }
  if (offer.windows.size() != 2)
    throw failure("the server granted " + std::to_string(offer.windows.size()) + " windows, expected 2");
  rdx::remote_window<record, rdx::rights::read | rdx::rights::write> table(conn, offer.windows[0]);
  rdx::remote_window<std::uint64_t, rdx::rights::atomic> words(conn, offer.windows[1]);
  if (table.size() != o.records)
    throw failure("the server's table has " + std::to_string(table.size()) + " records");
  std::printf("kv_window client: %zu records at %s over %u queue pair(s), %s\n", table.size(), peer.c_str(),
              conn.queue_pair_count(), o.events ? "sleeping on its descriptor" : "polling");

  rdx::registered_buffer<record> local(pd, o.records);
  // 1. Read the whole table in one operation (striped when large).
  auto r1 = table.read(local, 0);
  expect_ok(r1, o, "reading the table");
  for (std::uint64_t i = 0; i < o.records; ++i) {
    if (local[i].key != i || local[i].version != 0 || std::string(local[i].value) != initial_value(i))
      throw failure("record " + std::to_string(i) + " read back wrong before any change");
  }
  // 2. Rewrite the even records, one write each.
  std::uint64_t n_written = 0, n_bumped = 0;
  for (std::uint64_t i = 0; i < o.records; i += stride) {
    if (!rewritten(i, stride)) continue;
    ++n_written;
    set_value(local[i], updated_value(i));
    auto w = table.write(rdx::local_span<const record>(local).subspan(i, 1), i);
    expect_ok(w, o, "writing record " + std::to_string(i));
  }
  // 3. Bump every version: fetch_add 0 -> 1, then compare_swap 1 -> final.
  for (std::uint64_t i = 0; i < o.records; i += stride) {
    ++n_bumped;
    const std::size_t v = i * words_per_record + 1;
    auto fa = words.fetch_add(v, 1);
    expect_ok(fa, o, "fetch_add on record " + std::to_string(i));
    if (fa.old_value() != 0)
      throw failure("fetch_add on record " + std::to_string(i) + " saw " + std::to_string(fa.old_value()));
    auto cs = words.compare_swap(v, 1, final_version);
    expect_ok(cs, o, "compare_swap on record " + std::to_string(i));
    if (cs.old_value() != 1)
      throw failure("compare_swap on record " + std::to_string(i) + " saw " + std::to_string(cs.old_value()));
  }
  // A compare_swap that must not swap.
  auto miss = words.compare_swap(1, 0, 99);
  expect_ok(miss, o, "compare_swap expected to miss");
  if (miss.old_value() != final_version)
    throw failure("the missing compare_swap saw " + std::to_string(miss.old_value()));
  // A range outside the table is refused here, before the NIC sees it.
  auto outside = table.read(local, 1);
  if (outside.error() != rdx::errc::out_of_range) throw failure("a read past the table was not refused");
  // 4. Read everything back and check it.
  std::memset(static_cast<void*>(local.data()), 0, local.size_bytes());
  auto r2 = table.read(local, 0);
  expect_ok(r2, o, "reading the table back");
  for (std::uint64_t i = 0; i < o.records; ++i) {
    const std::string p = final_problem(local[i], i, stride);
    if (!p.empty()) throw failure("record " + std::to_string(i) + " read back: " + p);
  }
  // 5. Tell the server, which checks its own memory.
  auto report = ctl.send(std::uint64_t{o.records});
  expect_ok(report, o, "sending the report");
  auto verdict = ctl.receive();
  expect_ok(verdict, o, "waiting for the server's verdict");
  finish();
  if (verdict.value() != 0)
    throw failure("the server found " + std::to_string(verdict.value()) + " wrong records");
  std::printf("client: %u records read, %llu written, %llu bumped twice, all checked on both sides\n",
              o.records, static_cast<unsigned long long>(n_written),
              static_cast<unsigned long long>(n_bumped));
  return 0;
}

}  // namespace kv
