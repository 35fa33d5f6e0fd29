// Writes the fuzz targets' seed corpora: valid messages made by rdx's own
// encoders, plus a few near misses that lead into the decoders' branches.
//   fuzz_seed_writer <dir>   writes <dir>/<target>/<seed>
// tests/fuzz/corpus holds its output; the fuzz_seeds test checks that the
// committed files are still what the encoders make.
#include <rdx/auth/detail/message.hpp>
#include <rdx/cm/private_data.hpp>
#include <rdx/connect/rc_pingpong_exchange.hpp>
#include <rdx/connect/settings.hpp>
#include <rdx/connect/wire.hpp>

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
namespace w = rdx::wire;
namespace rcp = rdx::rc_pingpong;

void write(const fs::path& dir, const std::string& name, std::span<const std::byte> bytes) {
  fs::create_directories(dir);
  std::ofstream f(dir / name, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!f) {
    throw std::runtime_error("cannot write " + (dir / name).string());
  }
}

void write(const fs::path& dir, const std::string& name, std::span<const char> text) {
  write(dir, name, std::as_bytes(text));
}

rdx::endpoint roce_endpoint() {
  rdx::endpoint e;
  const unsigned char gid[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 168, 7, 2};
  std::memcpy(e.gid.raw, gid, sizeof gid);
  e.qpn = 0x000123;
  e.psn = 0xabcdef;
  e.mtu = IBV_MTU_4096;
  e.port = 1;
  e.gid_index = 3;
  return e;
}

rdx::endpoint ib_endpoint() {
  rdx::endpoint e;
  e.lid = 0x001a;
  e.qpn = 0xffffff;
  e.psn = 0;
  e.mtu = IBV_MTU_256;
  e.port = 2;
  return e;
}

std::vector<rdx::remote_descriptor> descriptors(std::size_t n) {
  std::vector<rdx::remote_descriptor> d(n);
  for (std::size_t i = 0; i < n; ++i) {
    d[i] = {.addr = 0x7f3a00000000ull + (i << 20),
            .rkey = 0x1000u + static_cast<std::uint32_t>(i),
            .length = 4096ull << (i % 12)};
  }
  return d;
}

void wire_seeds(const fs::path& dir) {
  write(dir, "endpoint", w::encode(roce_endpoint()));
  write(dir, "endpoint_ib_1_descriptor", w::encode(ib_endpoint(), descriptors(1)));
  write(dir, "endpoint_4_descriptors", w::encode(roce_endpoint(), descriptors(4)));
  // The descriptor that ends exactly at the top of the address space.
  const rdx::remote_descriptor top{.addr = 0xfffffffffffff000ull, .rkey = 7, .length = 0x1000};
  write(dir, "endpoint_top_descriptor", w::encode(roce_endpoint(), std::span(&top, 1)));
  write(dir, "endpoint_256_descriptors", w::encode(roce_endpoint(), descriptors(w::max_descriptors)));
  // Foreign peers the decoder names: ibv_rc_pingpong's text, a settings block.
  write(dir, "foreign_rc_pingpong", rcp::format(roce_endpoint()));
  write(dir, "foreign_settings",
        w::encode_settings({.queue_pairs = 1, .recv_depth = 64, .message_size = 4096}));
}

void rc_pingpong_seeds(const fs::path& dir) {
  write(dir, "address_roce", rcp::format(roce_endpoint()));
  write(dir, "address_ib", rcp::format(ib_endpoint()));
  rcp::message_t upper = rcp::format(roce_endpoint());
  for (char& c : upper) {
    if (c >= 'a' && c <= 'f') {
      c = static_cast<char>(c - 'a' + 'A');
    }
  }
  write(dir, "address_upper_case", upper);
  write(dir, "done", rcp::done_message);
  write(dir, "foreign_rdx_endpoint", w::encode(roce_endpoint()));
}

void settings_seeds(const fs::path& dir) {
  write(dir, "no_windows", w::encode_settings({.queue_pairs = 1, .recv_depth = 64, .message_size = 4096}));
  write(dir, "three_windows",
        w::encode_settings({.queue_pairs = 4,
                            .recv_depth = 128,
                            .message_size = 65536,
                            .windows = {{1, 8}, {3, 64}, {7, 8}}}));
  w::settings many{.queue_pairs = 64, .recv_depth = 1, .message_size = 1, .windows = {}};
  for (std::uint32_t i = 0; i < w::max_settings_windows; ++i) {
    many.windows.push_back({i % 8, 1u << (i % 13)});
  }
  write(dir, "255_windows", w::encode_settings(many));
  write(dir, "foreign_endpoint", w::encode(roce_endpoint()));
}

void auth_seeds(const fs::path& dir) {
  namespace ad = rdx::auth::detail;
  std::array<std::byte, ad::body_size> body{};
  for (std::size_t i = 0; i < body.size(); ++i) {
    body[i] = std::byte(0x5a ^ (i * 37));
  }
  std::array<std::byte, ad::message_size> m{};
  ad::encode_message(ad::message_type::hello, body, m);
  write(dir, "hello", m);
  ad::encode_message(ad::message_type::proof, body, m);
  write(dir, "proof", m);
  ad::encode_message(ad::message_type::transcript_mac, body, m);
  write(dir, "transcript_mac", m);
  // Key texts: as `openssl rand -hex 32` prints one, spaced out in upper case, one byte too short.
  const std::string hex32 = "3f9c0b7e41d2a86c5e17f0b39a4d6c2e8b1f7a05d3c9e6b24a8f1d0c7e3b5a96\n";
  write(dir, "key_hex", std::span(hex32.data(), hex32.size()));
  const std::string spaced = "3F9C 0B7E 41D2 A86C\t5E17 F0B3 9A4D 6C2E\r\n";
  write(dir, "key_spaced_upper", std::span(spaced.data(), spaced.size()));
  const std::string short_key = "3f9c0b7e41d2a86c5e17f0b39a4d6c";
  write(dir, "key_too_short", std::span(short_key.data(), short_key.size()));
}

void cm_private_data_seeds(const fs::path& dir) {
  namespace cm = rdx::cm;
  const cm::window_entry window{
      .addr = 0x7f3a00000000ull, .length = 1 << 20, .key = 0x1000, .rights = 3, .element_size = 8};
  const cm::hello request{.kind = cm::message_kind::request,
                          .qp_index = 0,
                          .qp_count = 2,
                          .tag = 0x5eed1234,
                          .recv_depth = 64,
                          .message_size = 4096,
                          .credit_key = 0x2000,
                          .credit_addr = 0x7f3b00000040ull,
                          .windows = {window},
                          .keys = {}};
  write(dir, "request", cm::encode_hello(request));
  cm::hello reply = request;
  reply.kind = cm::message_kind::reply;
  reply.windows.assign(cm::max_windows(cm::message_kind::reply), window);
  for (std::size_t i = 0; i < reply.windows.size(); ++i) {
    reply.windows[i].key += static_cast<std::uint32_t>(i);
    reply.windows[i].rights = static_cast<std::uint8_t>(1 + i % 7);
  }
  write(dir, "reply_most_windows", cm::encode_hello(reply));
  const cm::hello later{.kind = cm::message_kind::request,
                        .qp_index = 1,
                        .qp_count = 2,
                        .tag = 0x5eed1234,
                        .windows = {},
                        .keys = {0x1001}};
  write(dir, "request_queue_pair_1", cm::encode_hello(later));
  write(dir, "reject", cm::encode_rejection(cm::reject_reason::settings, "recv_depth 64, this side 128"));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus directory>\n", argv[0]);
    return 2;
  }
  const fs::path root = argv[1];
  wire_seeds(root / "fuzz_wire");
  rc_pingpong_seeds(root / "fuzz_rc_pingpong");
  settings_seeds(root / "fuzz_settings");
  auth_seeds(root / "fuzz_auth");
  cm_private_data_seeds(root / "fuzz_cm_private_data");
  return 0;
}
