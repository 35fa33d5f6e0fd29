// gpu_pingpong's settings block, and the path both sides agree on.
#include "peer_settings.hpp"

#include <string>

#include "runs.hpp"
#include "settings.hpp"

namespace gpu_pingpong {

namespace {
constexpr char magic[] = "RDXG";
}  // namespace

settings exchange_settings(const rdx::tcp::socket& sock, const settings& mine, std::chrono::seconds timeout) {
  std::byte out[settings_bytes] = {};
  app::settings_writer(out)
      .magic(magic)
      .u32(mine.path)
      .u32(mine.forced)
      .u64(mine.size)
      .u32(mine.iters)
      .u32(mine.warmup)
      .u64(mine.chunk)
      .u32(mine.depth);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::byte in[settings_bytes] = {};
  app::exchange_settings<failure>(sock, out, in, deadline, "a gpu_pingpong");
  app::settings_reader r(in);
  (void)r.magic(magic);  // checked by the exchange
  settings p;
  p.path = r.u32();
  p.forced = r.u32();
  p.size = r.u64();
  p.iters = r.u32();
  p.warmup = r.u32();
  p.chunk = r.u64();
  p.depth = r.u32();
  return p;
}

std::uint32_t agree_path(const settings& client, const settings& server) {
  if (client.forced != 0 && server.forced != 0 && client.forced != server.forced) {
    throw failure("--path direct on one side and --path staged on the other");
  }
  const std::uint32_t forced = client.forced != 0 ? client.forced : server.forced;
  if (forced == path_direct && (client.path != path_direct || server.path != path_direct)) {
    throw failure(std::string("--path direct, but ") +
                  (client.path != path_direct ? "the client" : "the server") +
                  " cannot register its GPU memory (see its probe output)");
  }
  if (forced != 0) {
    return forced;
  }
  return client.path == path_direct && server.path == path_direct ? path_direct : path_staged;
}

}  // namespace gpu_pingpong
