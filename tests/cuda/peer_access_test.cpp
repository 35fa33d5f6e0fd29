// rdx-doctor's link facts from nvidia-smi's text, without a GPU: the topology
// matrix (NVLink or PCIe per GPU pair) and the PCI bus ids that match
// nvidia-smi's GPU numbers to CUDA's.
#include <rdx/cuda/peer_access.hpp>

#include <catch2/catch.hpp>

#include <string>

TEST_CASE("nvidia-smi topo -m: NVLink and PCIe links per GPU pair", "[unit][cuda]") {
  const std::string text =
      "\t\x1b[4mGPU0\tGPU1\tGPU2\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
      "GPU0\t X \tNV18\tSYS\tPIX\t0-47\t0\t\tN/A\n"
      "GPU1\tNV18\t X \tPXB\tSYS\t0-47\t0\t\tN/A\n"
      "GPU2\tSYS\tPXB\t X \tNODE\t48-95\t1\t\tN/A\n"
      "NIC0\tPIX\tSYS\tNODE\t X \n"
      "\nLegend:\n\n  X    = Self\n  NV#  = Connection traversing a bonded set of # NVLinks\n";
  const auto links = rdx::cuda::parse_topo_matrix(text);
  CHECK(links.at({0, 1}) == "NVLink (NV18)");
  CHECK(links.at({1, 0}) == "NVLink (NV18)");
  CHECK(links.at({0, 2}) == "PCIe (SYS)");
  CHECK(links.at({1, 2}) == "PCIe (PXB)");
  CHECK(links.count({0, 0}) == 0);
  CHECK(links.size() == 6);  // the NIC column and row are not GPU pairs
  CHECK(rdx::cuda::parse_topo_matrix("No devices were found\n").empty());
  CHECK(rdx::cuda::link_of_topo_cell("NV4") == "NVLink (NV4)");
  CHECK(rdx::cuda::link_of_topo_cell("NODE") == "PCIe (NODE)");
  CHECK(rdx::cuda::link_of_topo_cell("X").empty());
}

TEST_CASE("nvidia-smi bus ids, cut to CUDA's form", "[unit][cuda]") {
  const auto ids =
      rdx::cuda::parse_nvidia_smi_bus_ids("0, 00000000:19:00.0\n1, 00000000:3B:00.0\nbad line\n");
  CHECK(ids.at(0) == "0000:19:00.0");
  CHECK(ids.at(1) == "0000:3b:00.0");
  CHECK(ids.size() == 2);
}

TEST_CASE("a device with itself is refused before CUDA is asked", "[unit][cuda]") {
  CHECK_THROWS_AS(rdx::cuda::probe_gpu_pair(0, 0), rdx::error);
}
