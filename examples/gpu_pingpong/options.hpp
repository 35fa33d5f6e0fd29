// gpu_pingpong's command line.
#pragma once

#include <cstddef>
#include <cstdio>
#include <string>

namespace gpu_pingpong {

struct options {
  std::string path = "auto";  // auto | direct | staged
  std::size_t size = std::size_t{64} << 20;
  int iters = 10;
  int warmup = 2;
  int gpu = 0;
  std::size_t chunk = std::size_t{16} << 20;
  std::size_t depth = 2;
  std::string connect;  // peer host (client); empty: server
  unsigned port = 18515;
  bool local = false;  // GPU halves only, even where an RDMA device exists
  int timeout_s = 30;
  std::string same_host;  // Unix socket path: the same-host mode
  bool sm_copy = false;
};

void usage(std::FILE* f);

//! The options of argv; prints --help and exits at -h or --help.
//! @throws app::usage_error for an unknown option or a bad value
options parse(int argc, char** argv);

}  // namespace gpu_pingpong
