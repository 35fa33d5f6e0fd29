// gpu_pingpong's two runs, the network one and the GPU halves alone, and what
// they share: the failure that ends a run and how a wrong byte is reported.
#pragma once

#include <rdx/cuda/pattern.hpp>

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <vector>

#include "options.hpp"

namespace gpu_pingpong {

struct failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

inline bool report_check(const char* where, const rdx::cuda::pattern_result& r, int iter) {
  if (r.ok()) {
    return true;
  }
  std::fprintf(stderr, "gpu_pingpong: FAIL: %s, iteration %d: %llu wrong 8-byte words, first at byte %llu\n",
               where, iter, static_cast<unsigned long long>(r.mismatches),
               static_cast<unsigned long long>(r.first_bad_offset));
  return false;
}

// The GPU halves on one machine: A --stage out--> wire --stage in--> B, B checks;
// then back to A, which checks. The host memcpy into and out of `wire`
// stands in for the RDMA write of each chunk.
int run_local(const options& o);

//! Two nodes, one RC queue pair: the GPU buffer goes direct or staged, and back.
int run_network(const options& o);

}  // namespace gpu_pingpong
