// rdx::cuda: the vocabulary of same-host GPU peers, without CUDA: what a
// process says about itself (boot id, process id, the GPUs it sees), the
// choice between the same-host path and RDMA made from both ends' facts, and
// the frames the two processes exchange over their Unix-domain socket.
#pragma once

#include <rdx/detail/hex.hpp>
#include <rdx/error.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <unistd.h>

namespace rdx::cuda {

//! A GPU's 16-byte UUID (cudaDeviceProp::uuid), the same in every process of a host.
using gpu_uuid = std::array<std::uint8_t, 16>;

//! "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi -L prints it.
[[nodiscard]] inline std::string to_string(const gpu_uuid& u) {
  static constexpr char hex[] = "0123456789abcdef";
  std::string s = "GPU-";
  for (std::size_t i = 0; i < u.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) {
      s += '-';
    }
    s += hex[u[i] >> 4];
    s += hex[u[i] & 15];
  }
  return s;
}

//! A GPU's UUID from its text as to_string() and `nvidia-smi -L` write it: "GPU-" and 32 hex
//! digits (either case) grouped 8-4-4-4-12. Empty for any other text.
[[nodiscard]] inline std::optional<gpu_uuid> parse_gpu_uuid(std::string_view text) {
  if (text.size() != 40 || text.substr(0, 4) != "GPU-") {
    return std::nullopt;
  }
  gpu_uuid u{};
  std::size_t at = 4;
  for (std::size_t i = 0; i < u.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) {
      if (text[at++] != '-') {
        return std::nullopt;
      }
    }
    const int hi = rdx::detail::hex_value(text[at]);
    const int lo = rdx::detail::hex_value(text[at + 1]);
    if (hi < 0 || lo < 0) {
      return std::nullopt;
    }
    u[i] = static_cast<std::uint8_t>(hi * 16 + lo);
    at += 2;
  }
  return u;
}

//! The CUDA ordinal of GPU u in a process whose GPUs are `gpus`, by ordinal (visible_gpus()
//! or a peer's hello), or -1 when u is not among them.
[[nodiscard]] inline int ordinal_in(const std::vector<gpu_uuid>& gpus, const gpu_uuid& u) noexcept {
  const auto it = std::find(gpus.begin(), gpus.end(), u);
  return it == gpus.end() ? -1 : static_cast<int>(it - gpus.begin());
}

//! How a window's copies reach memory that lies on a GPU of the host.
enum class gpu_route : std::uint8_t {
  same_gpu,      //!< the memory is on this process's GPU
  peer_to_peer,  //!< on another GPU this one reaches by P2P (NVLink or PCIe): mapped here, copied directly
  staged,        //!< on another GPU without P2P from this one: copied through host memory by the driver
};
//! Where a window maps the memory and how it copies (choose_gpu_route()).
struct gpu_route_choice {
  gpu_route route = gpu_route::same_gpu;  //!< the route
  int map_on = 0;                         //!< the CUDA device the mapping is made on (given access)
  std::string why;                        //!< what the window's route() says
};
//! The route from this process's GPU `local` to memory on GPU `memory` (CUDA ordinals here):
//! `p2p` is whether local can access memory's GPU (cudaDeviceCanAccessPeer). Without P2P the
//! mapping is made on the memory's own GPU and each copy goes by cudaMemcpyPeerAsync, which the
//! driver stages through host memory.
[[nodiscard]] inline gpu_route_choice choose_gpu_route(int local, int memory, bool p2p) {
  if (local == memory) {
    return {gpu_route::same_gpu, local, "same GPU (CUDA device " + std::to_string(local) + ")"};
  }
  const std::string pair = "GPU " + std::to_string(local) + " to GPU " + std::to_string(memory);
  if (p2p) {
    return {gpu_route::peer_to_peer, local, "P2P from " + pair};
  }
  return {gpu_route::staged, memory,
          "staged through host memory: no P2P access from " + pair + " (cudaDeviceCanAccessPeer)"};
}

//! This boot's id (/proc/sys/kernel/random/boot_id): equal in two processes only on one host
//! since its last boot (containers of one host share it). "" when unreadable.
[[nodiscard]] inline std::string read_boot_id() {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string s;
  std::getline(f, s);
  return s.size() == 36 ? s : std::string{};
}

//! 64 random bits drawn once per process: two processes of one host may share a pid number in
//! different PID namespaces, never this.
[[nodiscard]] inline std::uint64_t process_token() {
  static const std::uint64_t t = [] {
    std::random_device rd;
    return (std::uint64_t{rd()} << 32) ^ rd() ^ static_cast<std::uint64_t>(::getpid());
  }();
  return t;
}

//! What a process says about itself so that a peer can choose a path.
struct host_facts {
  std::string boot_id;              //!< read_boot_id(); "" when unknown
  std::int64_t pid = 0;             //!< getpid() (in the process's own PID namespace)
  std::uint64_t process_token = 0;  //!< process_token(): tells processes apart across PID namespaces
  std::vector<gpu_uuid> gpus;       //!< the GPUs this process sees, by CUDA ordinal
  std::uint32_t device = 0;         //!< the device its copies run on, an index into gpus
  //! Field by field.
  friend bool operator==(const host_facts&, const host_facts&) = default;
};

//! How two ends move GPU memory between them.
enum class transport {
  same_host,     //!< a mapping of the peer's GPU memory, copies by the GPU (rdx/cuda/same_host.hpp)
  same_process,  //!< one process: use the device pointer directly (CUDA cannot import its own handles)
  rdma,          //!< over the network, as registered or staged GPU memory
};

//! "same-host", "same-process" or "rdma".
[[nodiscard]] constexpr std::string_view to_string(transport t) noexcept {
  switch (t) {
    case transport::same_host: return "same-host";
    case transport::same_process: return "same-process";
    case transport::rdma: return "rdma";
  }
  return "unknown";
}

//! The path chosen and why, in words a log can carry.
struct transport_choice {
  transport path = transport::rdma;  //!< the path
  std::string reason;                //!< why, naming the facts that decided
};

//! Whether memory is on a GPU (the same-host path shares only GPU memory).
enum class memory_kind { host, gpu };

//! Chooses between the same-host path and RDMA from both ends' facts: same-host when both
//! ends read one boot id and the GPU holding the peer's memory (peer_gpu, an index into
//! peer.gpus) is visible here; one process when the process ids match too; RDMA otherwise,
//! and for host memory.
[[nodiscard]] inline transport_choice choose_transport(const host_facts& local, const host_facts& peer,
                                                       memory_kind memory, std::size_t peer_gpu = 0) {
  if (memory == memory_kind::host) {
    return {transport::rdma, "host memory: the same-host path shares GPU memory only"};
  }
  if (local.boot_id.empty() || peer.boot_id.empty()) {
    return {transport::rdma, std::string("boot id unknown on the ") +
                                 (local.boot_id.empty() ? "local" : "peer's") +
                                 " side (/proc/sys/kernel/random/boot_id unreadable): cannot tell one host"};
  }
  if (local.boot_id != peer.boot_id) {
    return {transport::rdma,
            "different hosts: boot id " + local.boot_id + " here, " + peer.boot_id + " there"};
  }
  if (peer_gpu >= peer.gpus.size()) {
    return {transport::rdma, "the peer named no GPU for its memory (GPU " + std::to_string(peer_gpu) +
                                 " of " + std::to_string(peer.gpus.size()) + ")"};
  }
  const gpu_uuid& want = peer.gpus[peer_gpu];
  std::size_t here = local.gpus.size();
  for (std::size_t i = 0; i < local.gpus.size(); ++i) {
    if (local.gpus[i] == want) {
      here = i;
      break;
    }
  }
  if (here == local.gpus.size()) {
    return {transport::rdma, "one host (boot id " + peer.boot_id + ") but the peer's GPU " + to_string(want) +
                                 " is not visible here (CUDA_VISIBLE_DEVICES or a container hides it)"};
  }
  if (local.process_token == peer.process_token && local.pid == peer.pid) {
    return {transport::same_process, "one process (pid " + std::to_string(peer.pid) +
                                         "): use the device pointer directly (CUDA refuses to import a "
                                         "process's own handles)"};
  }
  return {transport::same_host, "one host (boot id " + peer.boot_id + ") and the peer's GPU " +
                                    to_string(want) + " is visible here as CUDA device " +
                                    std::to_string(here)};
}

namespace detail {

inline constexpr std::uint32_t frame_magic = 0x52445848;  // "RDXH"
inline constexpr std::uint16_t frame_version = 1;
inline constexpr std::size_t max_frame_gpus = 16;

enum class frame_type : std::uint16_t { hello = 1, grant = 2, revoke = 3, notify = 4, bye = 5 };

//! How an export reaches the importer.
enum class share_kind : std::uint8_t { vmm = 1, legacy_ipc = 2 };

//! The one frame both processes exchange (same host, so same layout); every field is checked on
//! arrival before use.
struct frame {
  std::uint32_t magic = frame_magic;
  std::uint16_t version = frame_version;
  frame_type type = frame_type::bye;
  std::int64_t pid = 0;           // hello: sender's pid
  std::uint64_t token = 0;        // hello: sender's process_token()
  std::uint64_t id = 0;           // grant, revoke, notify: the grant's id
  std::uint64_t serial = 0;       // grant: the exporter's allocation serial
  std::uint64_t alloc_bytes = 0;  // grant: bytes the importer maps (whole allocation)
  std::uint64_t offset = 0;       // grant: offset of the granted range in the allocation
  std::uint64_t length = 0;       // grant: granted bytes
  std::uint32_t tag = 0;          // notify
  std::uint32_t rights = 0;       // grant: rdx::rights bits
  std::uint32_t element_size = 0;
  std::uint32_t gpu_count = 0;  // hello
  std::uint32_t device = 0;     // hello: the sender's copying device, an index into gpus
  share_kind kind = share_kind::vmm;
  std::uint8_t pad[7] = {};
  char boot_id[40] = {};               // hello
  gpu_uuid gpu{};                      // grant: the GPU holding the memory
  std::byte ipc_handle[64] = {};       // grant, legacy_ipc: the cudaIpcMemHandle_t
  gpu_uuid gpus[max_frame_gpus] = {};  // hello
};
static_assert(sizeof(frame) <= 512);

//! Why f cannot be accepted ("" when it can), given n, the bytes that arrived.
[[nodiscard]] inline std::string frame_problem(const frame& f, std::size_t n) {
  if (n != sizeof(frame)) {
    return "a frame of " + std::to_string(n) + " bytes, not " + std::to_string(sizeof(frame));
  }
  if (f.magic != frame_magic || f.version != frame_version) {
    return "a frame with magic " + std::to_string(f.magic) + " version " + std::to_string(f.version) +
           " (not an rdx same-host peer of this version)";
  }
  switch (f.type) {
    case frame_type::hello:
      if (f.gpu_count > max_frame_gpus) {
        return "a hello naming " + std::to_string(f.gpu_count) + " GPUs";
      }
      if (f.gpu_count > 0 && f.device >= f.gpu_count) {
        return "a hello whose device is not among its GPUs";
      }
      if (f.boot_id[sizeof f.boot_id - 1] != '\0') {
        return "a hello whose boot id is not terminated";
      }
      return {};
    case frame_type::grant:
      if (f.kind != share_kind::vmm && f.kind != share_kind::legacy_ipc) {
        return "a grant of unknown kind";
      }
      if (f.length == 0 || f.offset > f.alloc_bytes || f.length > f.alloc_bytes - f.offset) {
        return "a grant of " + std::to_string(f.length) + " bytes at " + std::to_string(f.offset) +
               " outside its allocation of " + std::to_string(f.alloc_bytes);
      }
      if (f.element_size == 0 || f.length % f.element_size != 0) {
        return "a grant of partial elements";
      }
      if (f.rights == 0 || f.rights > 7) {
        return "a grant with rights " + std::to_string(f.rights);
      }
      return {};
    case frame_type::revoke:
    case frame_type::notify:
    case frame_type::bye: return {};
  }
  return "a frame of unknown type " + std::to_string(static_cast<unsigned>(f.type));
}

//! This process's hello (its GPUs are filled in by the caller, which has CUDA).
[[nodiscard]] inline frame hello_frame(const host_facts& me) {
  frame f;
  f.type = frame_type::hello;
  f.pid = me.pid;
  f.token = me.process_token;
  f.device = me.device;
  std::memcpy(f.boot_id, me.boot_id.data(), std::min(me.boot_id.size(), sizeof f.boot_id - 1));
  f.gpu_count = static_cast<std::uint32_t>(std::min(me.gpus.size(), max_frame_gpus));
  for (std::size_t i = 0; i < f.gpu_count; ++i) {
    f.gpus[i] = me.gpus[i];
  }
  return f;
}

//! The facts a checked hello carries.
[[nodiscard]] inline host_facts facts_of(const frame& f) {
  host_facts h;
  h.pid = f.pid;
  h.process_token = f.token;
  h.device = f.device;
  h.boot_id = f.boot_id;
  h.gpus.assign(f.gpus, f.gpus + f.gpu_count);
  return h;
}

}  // namespace detail
}  // namespace rdx::cuda
