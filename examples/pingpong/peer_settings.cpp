// pingpong's settings block: written, read and compared with ours.
#include "peer_settings.hpp"

#include <string>

#include "settings.hpp"

namespace pingpong {

namespace {
constexpr char magic[] = "RDXP";
constexpr const char* program = "an rdx pingpong";
}  // namespace

void encode_settings(std::byte* out, const settings& mine) {
  app::settings_writer(std::span<std::byte>(out, settings_size))
      .magic(magic)
      .u32(mine.mode)
      .u64(mine.size)
      .u32(mine.iters)
      .u32(mine.seed);
}

settings decode_settings(std::span<const std::byte> in, const settings& mine, const std::string& who) {
  app::settings_reader r(in);
  if (in.size() < settings_size || !r.magic(magic)) throw failure(app::not_a_peer(who, program));
  settings peer;
  peer.mode = r.u32();
  peer.size = r.u64();
  peer.iters = r.u32();
  peer.seed = r.u32();
  std::string diff;
  auto mode_text = [](std::uint32_t m) {
    return m >= 1 && m <= 4 ? std::string(mode_name(static_cast<mode>(m))) : "mode " + std::to_string(m);
  };
  if (peer.mode != mine.mode)
    diff += " --mode " + mode_text(mine.mode) + " here, " + mode_text(peer.mode) + " there;";
  if (peer.size != mine.size)
    diff += " -s " + std::to_string(mine.size) + " here, " + std::to_string(peer.size) + " there;";
  if (peer.iters != mine.iters)
    diff += " -n " + std::to_string(mine.iters) + " here, " + std::to_string(peer.iters) + " there;";
  if (!diff.empty()) {
    diff.pop_back();
    throw failure("settings differ from the peer's at " + who + ":" + diff +
                  " (run both sides with the same -s, -n and --mode)");
  }
  return peer;
}

settings exchange_settings(const rdx::tcp::socket& s, const settings& mine, steady::time_point deadline) {
  std::byte out[settings_size] = {};
  encode_settings(out, mine);
  std::byte in[settings_size] = {};
  app::exchange_settings<failure>(s, out, in, deadline, program);
  return decode_settings(in, mine, s.peer());
}

}  // namespace pingpong
