// Helpers for the rdma_cm tests on one node: server and clients use the
// node's own address, which the Soft-RoCE VMs set in RDX_NODE_ADDR.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

namespace cm_test {

//! RDX_NODE_ADDR; exits 77 (ctest: skipped) with a reason where it is not set.
inline std::string node_address() {
  const char* a = std::getenv("RDX_NODE_ADDR");
  if (a == nullptr || *a == '\0') {
    std::fprintf(stderr,
                 "SKIP: RDX_NODE_ADDR is not set (run inside cmake/softroce/rdx-vm, whose VMs set it)\n");
    std::exit(77);
  }
  return a;
}

}  // namespace cm_test
