// gpu_pingpong's command line: --help's text and the parser.
#include "options.hpp"

#include <rdx/cuda/device_select.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "cli.hpp"

namespace gpu_pingpong {

void usage(std::FILE* f) {
  std::fprintf(
      f,
      "usage: gpu_pingpong [options]            (server, node 1)\n"
      "       gpu_pingpong [options] --connect HOST (client, node 0)\n"
      "  --path auto|direct|staged  how GPU memory meets the NIC (default auto: direct if the probe finds a "
      "path)\n"
      "  --size N[K|M|G]            bytes per message (default 64M)\n"
      "  --iters N                  timed round trips (default 10), --warmup N (default 2)\n"
      "  --gpu N|UUID               CUDA device by ordinal (default 0) or UUID (GPU-..., nvidia-smi -L);\n"
      "                             the RDMA device is RDX_DEVICE or the nearest\n"
      "  --chunk N[K|M]             largest staging chunk, a multiple of 4K (default 16M); --depth N bounce "
      "buffers "
      "(default 2)\n"
      "  --port N                   TCP port of the bootstrap (default 18515); --timeout S per step (default "
      "30)\n"
      "  --local                    run the GPU halves on this machine only, no network\n"
      "  --same-host PATH           two processes of this host, no NIC: the server listens on the Unix\n"
      "                             socket PATH ('@name': abstract), `--same-host PATH --connect local`\n"
      "                             connects; prints the path chosen and why; --sm-copy copies by kernel\n");
}

// The examples' one argument parser (apps/cli.hpp): -x V, --name V, --name=V;
// sizes take K, M and G.
options parse(int argc, char** argv) {
  using app::parse_number;
  options o;
  app::arg_reader r(argc, argv);
  while (!r.done()) {
    std::string v;
    if (r.match({"-h", "--help"})) {
      usage(stdout);
      std::exit(0);
    } else if (r.match({"--path"}, &v)) {
      if (v != "auto" && v != "direct" && v != "staged")
        throw app::usage_error("--path: auto, direct or staged, not " + v);
      o.path = v;
    } else if (r.match({"--size"}, &v)) {
      o.size = parse_number("--size", v, 1, std::uint64_t{1} << 40, true);
    } else if (r.match({"--iters"}, &v)) {
      o.iters = static_cast<int>(parse_number("--iters", v, 1, 1u << 30));
    } else if (r.match({"--warmup"}, &v)) {
      o.warmup = static_cast<int>(parse_number("--warmup", v, 0, 1u << 30));
    } else if (r.match({"--gpu"}, &v)) {
      // An ordinal this process sees, or a UUID (nvidia-smi -L), which names the same GPU in
      // every process whatever CUDA_VISIBLE_DEVICES says; either refused naming what is seen.
      o.gpu = rdx::cuda::select_device(v);
    } else if (r.match({"--chunk"}, &v)) {
      o.chunk = parse_number("--chunk", v, 1, std::uint64_t{1} << 32, true);
    } else if (r.match({"--depth"}, &v)) {
      o.depth = parse_number("--depth (bounce buffers)", v, 2, 64);
    } else if (r.match({"--connect"}, &v)) {
      o.connect = v;
    } else if (r.match({"--port"}, &v)) {
      o.port = static_cast<unsigned>(parse_number("--port", v, 1, 65535));
    } else if (r.match({"--timeout"}, &v)) {
      o.timeout_s = static_cast<int>(parse_number("--timeout", v, 1, 3600));
    } else if (r.match({"--local"})) {
      o.local = true;
    } else if (r.match({"--same-host"}, &v)) {
      o.same_host = v;
    } else if (r.match({"--sm-copy"})) {
      o.sm_copy = true;
    } else {
      throw app::usage_error("unknown option " + std::string(r.peek()));
    }
  }
  return o;
}

}  // namespace gpu_pingpong
