// rdx::cuda: what two GPUs of one host can do for each other (P2P access,
// native atomics, the driver's performance rank) and how they are linked
// (NVLink or PCIe, as `nvidia-smi topo -m` shows it), for rdx-doctor and for
// programs choosing where same-host peers copy.
#pragma once

#include <rdx/cuda/check.hpp>
#include <rdx/cuda/path.hpp>
#include <rdx/cuda/shareable_buffer.hpp>

#include <cctype>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace rdx::cuda {

//! Two distinct GPUs, as the driver sees them.
struct gpu_pair_report {
  int a = 0;                    //!< CUDA device ordinal
  int b = 0;                    //!< CUDA device ordinal
  bool p2p_access = false;      //!< a can map b's memory (cudaDeviceCanAccessPeer)
  bool native_atomics = false;  //!< atomics over the link (cudaDevP2PAttrNativeAtomicSupported)
  int performance_rank = -1;    //!< cudaDevP2PAttrPerformanceRank; lower is faster; -1 unknown
  std::string link;             //!< "NVLink (NV18)", "PCIe (PIX)", ... or "unknown"
};

//! P2P facts of devices a and b, which must differ (CUDA refuses to answer for one device with
//! itself). The link is filled in by gpu_links().
//! @throws rdx::error (invalid_argument) for a == b; rdx::cuda::cuda_error when CUDA fails
[[nodiscard]] inline gpu_pair_report probe_gpu_pair(int a, int b) {
  if (a == b) {
    rdx::detail::throw_rdx(errc::invalid_argument, "probe_gpu_pair: a device with itself");
  }
  gpu_pair_report r;
  r.a = a;
  r.b = b;
  int v = 0;
  RDX_CUDA_TRY(cudaDeviceCanAccessPeer(&v, a, b));
  r.p2p_access = v != 0;
  RDX_CUDA_TRY(cudaDeviceGetP2PAttribute(&v, cudaDevP2PAttrNativeAtomicSupported, a, b));
  r.native_atomics = v != 0;
  RDX_CUDA_TRY(cudaDeviceGetP2PAttribute(&v, cudaDevP2PAttrPerformanceRank, a, b));
  r.performance_rank = v;
  r.link = "unknown";
  return r;
}

//! "NVLink (NV4)" for an nvidia-smi topo cell NV<n>, "PCIe (<cell>)" for PIX, PXB, PHB, NODE or
//! SYS, "" for anything else.
[[nodiscard]] inline std::string link_of_topo_cell(const std::string& cell) {
  if (cell.size() > 2 && cell.compare(0, 2, "NV") == 0 &&
      std::isdigit(static_cast<unsigned char>(cell[2])) != 0) {
    return "NVLink (" + cell + ")";
  }
  for (const char* p : {"PIX", "PXB", "PHB", "NODE", "SYS"}) {
    if (cell == p) {
      return "PCIe (" + cell + ")";
    }
  }
  return {};
}

//! The links between GPUs from `nvidia-smi topo -m` text: (row GPU index, column GPU index) to
//! link_of_topo_cell(), in nvidia-smi's numbering. Empty when the text has no GPU matrix.
[[nodiscard]] inline std::map<std::pair<int, int>, std::string> parse_topo_matrix(const std::string& text) {
  std::map<std::pair<int, int>, std::string> links;
  std::istringstream in(text);
  std::string line;
  std::vector<int> columns;  // the GPU index of each header column, -1 for others
  while (std::getline(in, line)) {
    // A terminal gets the header underlined (ESC [ 4 m ... ESC [ 0 m): drop such sequences.
    for (std::size_t e = 0; (e = line.find('\x1b')) != std::string::npos;) {
      const std::size_t m = line.find('m', e);
      line.erase(e, m == std::string::npos ? std::string::npos : m - e + 1);
    }
    std::istringstream words(line);
    std::vector<std::string> w;
    for (std::string x; words >> x;) {
      w.push_back(x);
    }
    if (w.empty()) {
      continue;
    }
    if (columns.empty()) {
      if (w[0].rfind("GPU", 0) == 0 && line[0] != 'G') {  // the header row is indented
        for (const std::string& c : w) {
          columns.push_back(c.size() > 3 && c.rfind("GPU", 0) == 0 &&
                                    std::isdigit(static_cast<unsigned char>(c[3])) != 0
                                ? std::stoi(c.substr(3))
                                : -1);
        }
      }
      continue;
    }
    if (w[0].size() <= 3 || w[0].rfind("GPU", 0) != 0 ||
        std::isdigit(static_cast<unsigned char>(w[0][3])) == 0) {
      continue;
    }
    const int row = std::stoi(w[0].substr(3));
    for (std::size_t i = 0; i + 1 < w.size() && i < columns.size(); ++i) {
      if (columns[i] >= 0 && columns[i] != row) {
        const std::string l = link_of_topo_cell(w[i + 1]);
        if (!l.empty()) {
          links[{row, columns[i]}] = l;
        }
      }
    }
  }
  return links;
}

//! The PCI bus id of each nvidia-smi GPU index, from `nvidia-smi --query-gpu=index,pci.bus_id`
//! text ("0, 00000000:19:00.0" lines), lower-cased and cut to domain:bus:device.function.
[[nodiscard]] inline std::map<int, std::string> parse_nvidia_smi_bus_ids(const std::string& text) {
  std::map<int, std::string> ids;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const auto comma = line.find(',');
    if (comma == std::string::npos || comma == 0 || std::isdigit(static_cast<unsigned char>(line[0])) == 0) {
      continue;
    }
    std::string id = line.substr(comma + 1);
    id.erase(0, id.find_first_not_of(' '));
    for (char& c : id) {
      c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    }
    if (id.size() > 12) {  // 8-digit domain: keep its last 4 digits, as CUDA prints it
      id = id.substr(id.size() - 12);
    }
    ids[std::stoi(line.substr(0, comma))] = id;
  }
  return ids;
}

namespace detail {
inline std::string run_text(const char* command) {
  std::string out;
  if (FILE* p = ::popen(command, "r")) {
    char buf[4096];
    for (std::size_t n = 0; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) {
      out.append(buf, n);
    }
    (void)::pclose(p);
  }
  return out;
}
}  // namespace detail

//! Every pair of distinct visible GPUs with its P2P facts and link (nvidia-smi's, matched to CUDA
//! ordinals by PCI bus id; "unknown" where nvidia-smi is absent).
//! @throws rdx::cuda::cuda_error when CUDA fails
[[nodiscard]] inline std::vector<gpu_pair_report> probe_gpu_pairs() {
  std::vector<gpu_pair_report> out;
  const int n = device_count();
  if (n < 2) {
    return out;
  }
  const auto links = parse_topo_matrix(detail::run_text("nvidia-smi topo -m 2>/dev/null"));
  const auto bus = parse_nvidia_smi_bus_ids(
      detail::run_text("nvidia-smi --query-gpu=index,pci.bus_id --format=csv,noheader 2>/dev/null"));
  std::vector<int> smi_index(static_cast<std::size_t>(n), -1);
  for (int d = 0; d < n; ++d) {
    char id[32] = {};
    if (cudaDeviceGetPCIBusId(id, sizeof id, d) != cudaSuccess) {
      (void)cudaGetLastError();
      continue;
    }
    std::string mine = id;
    for (char& c : mine) {
      c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    }
    for (const auto& [index, b] : bus) {
      if (b == mine) {
        smi_index[static_cast<std::size_t>(d)] = index;
      }
    }
  }
  for (int a = 0; a < n; ++a) {
    for (int b = 0; b < n; ++b) {
      if (a == b) {
        continue;
      }
      gpu_pair_report r = probe_gpu_pair(a, b);
      const auto it =
          links.find({smi_index[static_cast<std::size_t>(a)], smi_index[static_cast<std::size_t>(b)]});
      if (it != links.end()) {
        r.link = it->second;
      }
      out.push_back(std::move(r));
    }
  }
  return out;
}

}  // namespace rdx::cuda
