// A consumer of rdx: includes the umbrella header, uses the error types and
// links libibverbs through rdx::rdx. With RDX_CONSUMER_CM it also links
// librdmacm through rdx::cm. Needs no RDMA device.
#include <rdx/rdx.hpp>

#include <infiniband/verbs.h>

#include <cstdio>
#include <string>
#include <system_error>

#ifdef RDX_CONSUMER_CM
#include <rdma/rdma_cma.h>
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
  auto* create_channel = &rdma_create_event_channel;
  if (create_channel == nullptr) return 1;
  std::puts("consumer: rdx::cm linked");
#endif
  std::printf("consumer: ok (%s: %s)\n", ec.category().name(), ec.message().c_str());
  return 0;
}
