// A consumer of rdx: includes the umbrella header, uses the error types and
// links libibverbs through rdx::rdx. With RDX_CONSUMER_CM it also links
// librdmacm through rdx::cm, with RDX_CONSUMER_AUTH OpenSSL's libcrypto
// through rdx::auth. Needs no RDMA device.
#include <rdx/rdx.hpp>

#include <infiniband/verbs.h>

#include <cstdio>
#include <string>
#include <system_error>

#ifdef RDX_CONSUMER_CM
#include <rdx/cm/cm.hpp>

#include <rdma/rdma_cma.h>
#endif
#ifdef RDX_CONSUMER_AUTH
#include <rdx/auth/psk.hpp>

#include <array>
#include <cstddef>
#endif

int main() {
  const std::error_code ec = rdx::make_error_code(rdx::errc::no_device);
  if (ec.category().name() == nullptr || ec.message().empty()) {
    std::puts("consumer: rdx error category is broken");
    return 1;
  }
  // Taking the address makes the link against libibverbs real.
  auto* get_devices = &ibv_get_device_list;
  if (get_devices == nullptr) return 1;
#ifdef RDX_CONSUMER_CM
  // The cm header's private data round-trips; connecting would need a device.
  rdx::cm::hello h;
  h.recv_depth = 64;
  h.message_size = 4096;
  if (rdx::cm::decode_hello(rdx::cm::encode_hello(h), rdx::cm::message_kind::request) != h) return 1;
  // Taking the address of a connect makes the link against librdmacm real.
  rdx::peer_offer (*connect)(rdx::connection&, std::string_view, std::uint16_t,
                             std::span<const rdx::window_descriptor>, const rdx::cm::options&) =
      &rdx::cm::connect;
  if (connect == nullptr) return 1;
  std::puts("consumer: rdx::cm linked (rdx/cm/cm.hpp)");
#endif
#ifdef RDX_CONSUMER_AUTH
  // Making a key fetches HMAC from libcrypto: the link is real.
  const std::array<std::byte, 32> key{};
  const rdx::auth::psk_key k(key);
  if (k.size() != key.size()) return 1;
  std::puts("consumer: rdx::auth linked");
#endif
  std::printf("consumer: ok (%s: %s)\n", ec.category().name(), ec.message().c_str());
  return 0;
}
