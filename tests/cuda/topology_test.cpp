// GPU to RDMA device topology over fake sysfs trees: no GPU needed.
#include <rdx/cuda/nic_probe.hpp>
#include <rdx/cuda/topology.hpp>

#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

namespace fs = std::filesystem;

namespace {
// A sysfs tree in a temporary folder: devices/<chain>, bus/pci/devices links,
// class/infiniband/<name>/device links, numa_node files, port states.
class fake_sysfs {
public:
  fake_sysfs() {
    char tmpl[] = "/tmp/rdx-sysfs-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) {
      throw std::runtime_error("mkdtemp failed");
    }
    root_ = tmpl;
    fs::create_directories(root_ / "bus/pci/devices");
    fs::create_directories(root_ / "class/infiniband");
  }
  ~fake_sysfs() {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  fake_sysfs(const fake_sysfs&) = delete;
  fake_sysfs& operator=(const fake_sysfs&) = delete;

  [[nodiscard]] const fs::path& root() const { return root_; }

  //! Adds a PCI function at devices/<chain>, its bus link and numa_node.
  fs::path pci(const std::string& chain, int numa) {
    const fs::path dir = root_ / "devices" / chain;
    fs::create_directories(dir);
    write(dir / "numa_node", std::to_string(numa));
    const std::string addr = fs::path(chain).filename().string();
    fs::create_symlink(fs::relative(dir, root_ / "bus/pci/devices"), root_ / "bus/pci/devices" / addr);
    return dir;
  }
  //! Adds an RDMA device on the PCI function at chain.
  void ib(const std::string& name, const std::string& chain, int numa, bool active = true) {
    const fs::path dir = pci(chain, numa);
    const fs::path cls = root_ / "class/infiniband" / name;
    fs::create_directories(cls / "ports/1");
    write(cls / "ports/1/state", active ? "4: ACTIVE" : "1: DOWN");
    fs::create_symlink(fs::relative(dir, cls), cls / "device");
  }
  //! An RDMA device with no PCI parent (a software device, say).
  void soft_ib(const std::string& name) {
    const fs::path dir = root_ / "devices/virtual/infiniband" / name;
    fs::create_directories(dir);
    const fs::path cls = root_ / "class/infiniband" / name;
    fs::create_directories(cls / "ports/1");
    write(cls / "ports/1/state", "4: ACTIVE");
  }

private:
  static void write(const fs::path& p, const std::string& s) {
    std::ofstream out(p);
    out << s << "\n";
  }
  fs::path root_;
};

using rdx::cuda::pci_distance;
}  // namespace

TEST_CASE("PCI addresses are normalized to sysfs's form", "[topology]") {
  using rdx::cuda::detail::normalize_pci_address;
  REQUIRE(normalize_pci_address("0000:3B:00.0") == "0000:3b:00.0");
  REQUIRE(normalize_pci_address("00000000:3b:00.0") == "0000:3b:00.0");
  REQUIRE(normalize_pci_address("0001:c1:1f.7") == "0001:c1:1f.7");
  REQUIRE_FALSE(normalize_pci_address("pci0000:00").has_value());
  REQUIRE_FALSE(normalize_pci_address("0000:3b:00").has_value());
  REQUIRE_FALSE(normalize_pci_address("zz00:3b:00.0").has_value());
}

TEST_CASE("RDMA devices are ranked by PCI distance from the GPU", "[topology]") {
  fake_sysfs s;
  // Root complex pci0000:16 (NUMA 0): a switch with the GPU and mlx5_1 below it,
  // and mlx5_2 on another root port of the same root complex.
  s.pci("pci0000:16/0000:16:01.0/0000:17:00.0/0000:18:00.0/0000:19:00.0", 0);  // GPU
  s.ib("mlx5_1", "pci0000:16/0000:16:01.0/0000:17:00.0/0000:18:04.0/0000:1a:00.0", 0);
  s.ib("mlx5_2", "pci0000:16/0000:16:02.0/0000:30:00.0", 0);
  // Another root complex on NUMA 0, and one on NUMA 1.
  s.ib("mlx5_0", "pci0000:40/0000:40:01.0/0000:41:00.0", 0);
  s.ib("mlx5_3", "pci0000:80/0000:80:01.0/0000:81:00.0", 1);

  const auto t = rdx::cuda::locate_gpu("0000:19:00.0", s.root());
  REQUIRE(t.gpu_pci_address == "0000:19:00.0");
  REQUIRE(t.gpu_numa_node == 0);
  REQUIRE(t.rdma_devices.size() == 4);
  REQUIRE(t.rdma_devices[0].name == "mlx5_1");
  REQUIRE(t.rdma_devices[0].distance == pci_distance::same_switch);
  REQUIRE(t.rdma_devices[0].pci_address == "0000:1a:00.0");
  REQUIRE(t.rdma_devices[1].name == "mlx5_2");
  REQUIRE(t.rdma_devices[1].distance == pci_distance::same_root_complex);
  REQUIRE(t.rdma_devices[2].name == "mlx5_0");
  REQUIRE(t.rdma_devices[2].distance == pci_distance::same_numa_node);
  REQUIRE(t.rdma_devices[3].name == "mlx5_3");
  REQUIRE(t.rdma_devices[3].distance == pci_distance::across_numa);
  REQUIRE(t.rdma_devices[3].numa_node == 1);
  REQUIRE(t.nearest()->name == "mlx5_1");
  REQUIRE(t.to_string().find("same PCIe switch") != std::string::npos);
}

TEST_CASE("an active device wins at equal distance; names break ties", "[topology]") {
  fake_sysfs s;
  s.pci("pci0000:00/0000:00:01.0/0000:01:00.0", 0);  // GPU
  s.ib("mlx5_0", "pci0000:00/0000:00:02.0/0000:02:00.0", 0, /*active=*/false);
  s.ib("mlx5_1", "pci0000:00/0000:00:03.0/0000:03:00.0", 0);
  s.ib("mlx5_2", "pci0000:00/0000:00:04.0/0000:04:00.0", 0);
  const auto t = rdx::cuda::locate_gpu("0000:01:00.0", s.root());
  REQUIRE(t.rdma_devices.size() == 3);
  REQUIRE(t.rdma_devices[0].name == "mlx5_1");
  REQUIRE(t.rdma_devices[1].name == "mlx5_2");
  REQUIRE(t.rdma_devices[2].name == "mlx5_0");
  REQUIRE_FALSE(t.rdma_devices[2].active);
  for (const auto& d : t.rdma_devices) {
    REQUIRE(d.distance == pci_distance::same_root_complex);
  }
}

TEST_CASE("unknown NUMA nodes count as across NUMA; devices without PCI parent are last", "[topology]") {
  fake_sysfs s;
  s.pci("pci0000:00/0000:00:01.0/0000:01:00.0", -1);  // GPU, NUMA unknown
  s.ib("mlx5_0", "pci0000:80/0000:80:01.0/0000:81:00.0", -1);
  s.soft_ib("rxe0");
  const auto t = rdx::cuda::locate_gpu("0000:01:00.0", s.root());
  REQUIRE(t.gpu_numa_node == -1);
  REQUIRE(t.rdma_devices.size() == 2);
  REQUIRE(t.rdma_devices[0].name == "mlx5_0");
  REQUIRE(t.rdma_devices[0].distance == pci_distance::across_numa);
  REQUIRE(t.rdma_devices[1].name == "rxe0");
  REQUIRE(t.rdma_devices[1].pci_address.empty());
}

TEST_CASE("no RDMA devices: an empty ranking, no choice", "[topology]") {
  fake_sysfs s;
  s.pci("pci0000:00/0000:00:01.0/0000:01:00.0", 0);
  const auto t = rdx::cuda::locate_gpu("0000:01:00.0", s.root());
  REQUIRE(t.rdma_devices.empty());
  REQUIRE(t.nearest() == nullptr);
  ::unsetenv("RDX_DEVICE");
  REQUIRE_FALSE(rdx::cuda::rdma_device_for_gpu("0000:01:00.0", s.root()).has_value());
  REQUIRE(t.to_string().find("no RDMA devices") != std::string::npos);
}

TEST_CASE("RDX_DEVICE overrides the nearest choice", "[topology]") {
  fake_sysfs s;
  s.pci("pci0000:00/0000:00:01.0/0000:01:00.0", 0);
  s.ib("mlx5_0", "pci0000:00/0000:00:01.0/0000:01:00.1", 0);
  ::unsetenv("RDX_DEVICE");
  REQUIRE(rdx::cuda::rdma_device_for_gpu("0000:01:00.0", s.root()) == "mlx5_0");
  ::setenv("RDX_DEVICE", "mlx5_7", 1);
  REQUIRE(rdx::cuda::rdma_device_for_gpu("0000:01:00.0", s.root()) == "mlx5_7");
  ::unsetenv("RDX_DEVICE");
}

TEST_CASE("bad addresses and missing GPUs are clear errors", "[topology]") {
  fake_sysfs s;
  REQUIRE_THROWS_WITH(rdx::cuda::locate_gpu("not-a-bus-id", s.root()), Catch::Contains("not a PCI address"));
  try {
    (void)rdx::cuda::locate_gpu("0000:99:00.0", s.root());
    FAIL("a missing GPU was located");
  } catch (const rdx::error& e) {
    REQUIRE(e.code() == rdx::errc::no_device);
    REQUIRE(std::string(e.what()).find("0000:99:00.0") != std::string::npos);
  }
}

TEST_CASE("peermem's version files are read from the sysfs root given", "[topology]") {
  fake_sysfs s;
  REQUIRE_FALSE(rdx::cuda::read_peermem(s.root()).loaded());
  fs::create_directories(s.root() / "module/nvidia_peermem");
  std::ofstream(s.root() / "module/nvidia_peermem/version") << "580.00\n";
  const auto pm = rdx::cuda::read_peermem(s.root());
  REQUIRE(pm.loaded());
  REQUIRE(pm.nvidia_peermem_version == "580.00");
  REQUIRE(pm.nv_mem_version.empty());
}
