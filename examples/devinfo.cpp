// rdx devinfo: what a device and its ports report (as ibv_devinfo -v does),
// plus each port's GID table with entry types and the GID rdx would choose,
// with the reason.
#include <rdx/rdx.hpp>

#include <cinttypes>
#include <cstdio>
#include <optional>
#include <string>

#include "cli.hpp"
#include <arpa/inet.h>
#include <net/if.h>

#if __has_include(<rdx/cuda/config.hpp>)
#include <rdx/cuda/config.hpp>
#endif
#if defined(RDX_HAS_CUDA) && RDX_HAS_CUDA()
#include <rdx/cuda/probe.hpp>
#define RDX_DEVINFO_GPUS 1
#else
#define RDX_DEVINFO_GPUS 0
#endif

namespace {

void usage(const char* argv0) {
  std::printf(
      "Usage: %s [options]\n"
      "\n"
      "Prints each RDMA device's attributes and its ports' attributes, the GID\n"
      "table of every port with entry types and network devices, and the GID\n"
      "index rdx would choose (and why). Built with rdx::cuda, it also prints the\n"
      "GPUDirect probe of every GPU: which path (dma-buf, peermem, staged) works\n"
      "with each RDMA device, and why.\n"
      "\n"
      "Options:\n"
      "  -d, --ib-dev DEV   only this device (default: all)\n"
      "  -i, --ib-port N    only this port (default: all)\n"
      "  -l, --list         only list device names\n"
      "  -g, --gpu          only the GPUDirect probe of each GPU (rdx::cuda builds)\n"
      "  -v, --verbose      accepted for ibv_devinfo's users (always verbose)\n"
      "  -h, --help         this text\n"
      "\n"
      "Exit status: 0 on success, 1 when a device cannot be opened or queried, or\n"
      "none exists, 2 for a usage error.\n",
      argv0);
}

const char* transport_name(ibv_transport_type t) {
  switch (t) {
    case IBV_TRANSPORT_IB: return "InfiniBand";
    case IBV_TRANSPORT_IWARP: return "iWARP";
    case IBV_TRANSPORT_USNIC: return "usNIC";
    case IBV_TRANSPORT_USNIC_UDP: return "usNIC UDP";
    case IBV_TRANSPORT_UNSPECIFIED: return "unspecified";
    default: return "unknown";
  }
}

const char* atomic_name(ibv_atomic_cap a) {
  switch (a) {
    case IBV_ATOMIC_NONE: return "ATOMIC_NONE";
    case IBV_ATOMIC_HCA: return "ATOMIC_HCA";
    case IBV_ATOMIC_GLOB: return "ATOMIC_GLOB";
  }
  return "unknown";
}

const char* link_layer_name(std::uint8_t l) {
  switch (l) {
    case IBV_LINK_LAYER_INFINIBAND: return "InfiniBand";
    case IBV_LINK_LAYER_ETHERNET: return "Ethernet";
    default: return "unspecified";
  }
}

const char* width_name(std::uint8_t w) {
  switch (w) {
    case 1: return "1X";
    case 2: return "4X";
    case 4: return "8X";
    case 8: return "12X";
    case 16: return "2X";
    default: return "invalid width";
  }
}

const char* speed_name(std::uint8_t s) {
  switch (s) {
    case 1: return "2.5 Gbps";
    case 2: return "5.0 Gbps";
    case 4:
    case 8: return "10.0 Gbps";
    case 16: return "14.0 Gbps";
    case 32: return "25.0 Gbps";
    case 64: return "50.0 Gbps";
    case 128: return "100.0 Gbps";
    default: return "invalid speed";
  }
}

const char* phys_state_name(std::uint8_t s) {
  switch (s) {
    case 1: return "SLEEP";
    case 2: return "POLLING";
    case 3: return "DISABLED";
    case 4: return "PORT_CONFIGURATION TRAINNING";
    case 5: return "LINK_UP";
    case 6: return "LINK_ERROR_RECOVERY";
    case 7: return "PHY TEST";
    default: return "invalid physical state";
  }
}

std::string guid_text(std::uint64_t be) {
  const std::uint64_t g = be64toh(be);
  char buf[24];
  std::snprintf(buf, sizeof buf, "%04x:%04x:%04x:%04x", static_cast<unsigned>(g >> 48) & 0xffff,
                static_cast<unsigned>(g >> 32) & 0xffff, static_cast<unsigned>(g >> 16) & 0xffff,
                static_cast<unsigned>(g) & 0xffff);
  return buf;
}

std::string netdev_name(std::uint32_t ifindex) {
  if (ifindex == 0) return "-";
  char buf[IF_NAMESIZE] = {};
  return ::if_indextoname(ifindex, buf) != nullptr ? std::string(buf) : "ifindex " + std::to_string(ifindex);
}

void print_device(const rdx::context& ctx, int only_port) {
  const rdx::device_attributes a = ctx.query_device();
  const ibv_device_attr& o = a.raw.orig_attr;
  ibv_device* dev = ctx.native_handle()->device;
  std::printf("hca_id:\t%s\n", ctx.name().c_str());
  std::printf("\ttransport:\t\t\t%s (%d)\n", transport_name(dev->transport_type), dev->transport_type);
  std::printf("\tfw_ver:\t\t\t\t%s\n", a.fw_ver.empty() ? "-" : a.fw_ver.c_str());
  std::printf("\tnode_guid:\t\t\t%s\n", guid_text(a.node_guid).c_str());
  std::printf("\tsys_image_guid:\t\t\t%s\n", guid_text(o.sys_image_guid).c_str());
  std::printf("\tvendor_id:\t\t\t0x%04x\n", a.vendor_id);
  std::printf("\tvendor_part_id:\t\t\t%u\n", a.vendor_part_id);
  std::printf("\thw_ver:\t\t\t\t0x%X\n", a.hw_ver);
  std::printf("\tphys_port_cnt:\t\t\t%u\n", a.phys_port_cnt);
  std::printf("\tmax_mr_size:\t\t\t0x%" PRIx64 "\n", a.max_mr_size);
  std::printf("\tpage_size_cap:\t\t\t0x%" PRIx64 "\n", static_cast<std::uint64_t>(o.page_size_cap));
  std::printf("\tmax_qp:\t\t\t\t%d\n", a.max_qp);
  std::printf("\tmax_qp_wr:\t\t\t%d\n", a.max_qp_wr);
  std::printf("\tdevice_cap_flags:\t\t0x%08x\n", o.device_cap_flags);
  std::printf("\tmax_sge:\t\t\t%d\n", a.max_sge);
  std::printf("\tmax_sge_rd:\t\t\t%d\n", o.max_sge_rd);
  std::printf("\tmax_cq:\t\t\t\t%d\n", a.max_cq);
  std::printf("\tmax_cqe:\t\t\t%d\n", a.max_cqe);
  std::printf("\tmax_mr:\t\t\t\t%d\n", a.max_mr);
  std::printf("\tmax_pd:\t\t\t\t%d\n", a.max_pd);
  std::printf("\tmax_qp_rd_atom:\t\t\t%d\n", a.max_qp_rd_atom);
  std::printf("\tmax_res_rd_atom:\t\t%d\n", o.max_res_rd_atom);
  std::printf("\tmax_qp_init_rd_atom:\t\t%d\n", a.max_qp_init_rd_atom);
  std::printf("\tatomic_cap:\t\t\t%s (%d)\n", atomic_name(a.atomic_cap), a.atomic_cap);
  std::printf("\tmax_mw:\t\t\t\t%d\n", o.max_mw);
  std::printf("\tmax_mcast_grp:\t\t\t%d\n", o.max_mcast_grp);
  std::printf("\tmax_ah:\t\t\t\t%d\n", o.max_ah);
  std::printf("\tmax_srq:\t\t\t%d\n", a.max_srq);
  std::printf("\tmax_srq_wr:\t\t\t%d\n", a.max_srq_wr);
  std::printf("\tmax_srq_sge:\t\t\t%d\n", o.max_srq_sge);
  std::printf("\tmax_pkeys:\t\t\t%u\n", o.max_pkeys);
  std::printf("\tlocal_ca_ack_delay:\t\t%u\n", o.local_ca_ack_delay);
  std::printf("\tnum_comp_vectors:\t\t%d\n", ctx.native_handle()->num_comp_vectors);
  std::printf("\tcompletion_timestamp_mask:\t0x%016" PRIx64 "\n", a.raw.completion_timestamp_mask);
  std::printf("\todp_caps.general_caps:\t\t0x%" PRIx64 "\n", a.raw.odp_caps.general_caps);

  for (unsigned p = 1; p <= a.phys_port_cnt; ++p) {
    if (only_port != 0 && static_cast<unsigned>(only_port) != p) continue;
    const rdx::port_attributes pa = ctx.query_port(static_cast<std::uint8_t>(p));
    const ibv_port_attr& r = pa.raw;
    std::printf("\t\tport:\t%u\n", p);
    std::printf("\t\t\tstate:\t\t\t%s (%d)\n", ("PORT_" + std::string(rdx::to_string(pa.state))).c_str(),
                r.state);
    std::printf("\t\t\tmax_mtu:\t\t%d (%d)\n", rdx::mtu_bytes(r.max_mtu), r.max_mtu);
    std::printf("\t\t\tactive_mtu:\t\t%d (%d)\n", rdx::mtu_bytes(r.active_mtu), r.active_mtu);
    std::printf("\t\t\tsm_lid:\t\t\t%u\n", r.sm_lid);
    std::printf("\t\t\tport_lid:\t\t%u\n", r.lid);
    std::printf("\t\t\tport_lmc:\t\t0x%02x\n", r.lmc);
    std::printf("\t\t\tlink_layer:\t\t%s\n", link_layer_name(r.link_layer));
    std::printf("\t\t\tmax_msg_sz:\t\t0x%x\n", r.max_msg_sz);
    std::printf("\t\t\tport_cap_flags:\t\t0x%08x\n", r.port_cap_flags);
    std::printf("\t\t\tport_cap_flags2:\t0x%04x\n", r.port_cap_flags2);
    std::printf("\t\t\tmax_vl_num:\t\t%u\n", r.max_vl_num);
    std::printf("\t\t\tbad_pkey_cntr:\t\t0x%x\n", r.bad_pkey_cntr);
    std::printf("\t\t\tqkey_viol_cntr:\t\t0x%x\n", r.qkey_viol_cntr);
    std::printf("\t\t\tsm_sl:\t\t\t%u\n", r.sm_sl);
    std::printf("\t\t\tpkey_tbl_len:\t\t%u\n", r.pkey_tbl_len);
    std::printf("\t\t\tgid_tbl_len:\t\t%d\n", r.gid_tbl_len);
    std::printf("\t\t\tsubnet_timeout:\t\t%u\n", r.subnet_timeout);
    std::printf("\t\t\tinit_type_reply:\t%u\n", r.init_type_reply);
    std::printf("\t\t\tactive_width:\t\t%s (%u)\n", width_name(r.active_width), r.active_width);
    std::printf("\t\t\tactive_speed:\t\t%s (%u)\n", speed_name(r.active_speed), r.active_speed);
    if (pa.is_ethernet() || r.phys_state != 0)
      std::printf("\t\t\tphys_state:\t\t%s (%u)\n", phys_state_name(r.phys_state), r.phys_state);

    const auto table = rdx::gid_table(ctx, static_cast<std::uint8_t>(p));
    std::printf("\t\t\tGID table (%zu valid of %d entries):\n", table.size(), r.gid_tbl_len);
    std::printf("\t\t\t\t%-5s %-8s %-40s %-10s %s\n", "index", "type", "GID", "netdev", "note");
    for (const rdx::gid_entry& e : table) {
      const char* note = e.link_local() ? "link-local: never chosen" : e.ipv4_mapped() ? "IPv4-mapped" : "";
      std::printf("\t\t\t\t%-5u %-8s %-40s %-10s %s\n", e.index, std::string(rdx::to_string(e.type)).c_str(),
                  rdx::to_string(e.gid).c_str(), netdev_name(e.ndev_ifindex).c_str(), note);
    }
    try {
      const rdx::gid_choice c = rdx::select_gid(ctx, static_cast<std::uint8_t>(p));
      std::printf("\t\t\trdx would use: %s\n", c.reason.c_str());
    } catch (const rdx::error& e) {
      std::printf("\t\t\trdx would use: nothing: %s\n", e.what());
    }
  }
  std::printf("\n");
}

#if RDX_DEVINFO_GPUS
//! The GPUDirect probe of every GPU, against dev (nullptr: no RDMA device).
//! Returns false when CUDA reports no GPU.
bool print_gpus(ibv_context* dev) {
  const int n = rdx::cuda::device_count();
  if (n <= 0) {
    std::printf("GPUDirect: no CUDA GPU visible (driver missing or no device)\n");
    return false;
  }
  for (int d = 0; d < n; ++d) {
    try {
      const auto report = dev != nullptr ? rdx::cuda::probe_gpudirect(d, dev) : rdx::cuda::probe_gpudirect(d);
      std::printf("%s\n", report.to_string().c_str());
    } catch (const rdx::error& e) {
      std::printf("GPU %d: probe failed: %s\n", d, e.what());
    }
  }
  return true;
}
#endif

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // keep stdout and stderr in order in logs
  std::string device;
  int port = 0;
  bool list_only = false;
  bool gpus_only = false;
  try {
    app::arg_reader r(argc, argv);
    std::string v;
    while (!r.done()) {
      if (r.match({"-h", "--help"})) {
        usage(argv[0]);
        return 0;
      } else if (r.match({"-d", "--ib-dev"}, &v)) {
        device = v;
      } else if (r.match({"-i", "--ib-port"}, &v)) {
        port = static_cast<int>(app::parse_number("--ib-port", v, 1, 255));
      } else if (r.match({"-v", "--verbose"})) {
        // Accepted for ibv_devinfo's users: the output is always the verbose one.
      } else if (r.match({"-l", "--list"})) {
        list_only = true;
      } else if (r.match({"-g", "--gpu"})) {
        gpus_only = true;
      } else {
        throw app::usage_error("unexpected argument " + std::string(r.peek()));
      }
    }
  } catch (const app::usage_error& e) {
    std::fprintf(stderr, "%s: %s (see --help)\n", argv[0], e.what());
    return 2;
  }
  try {
    rdx::device_list list;
#if RDX_DEVINFO_GPUS
    if (gpus_only || list.empty()) {
      // A GPU machine without an RDMA device still gets its probe.
      std::optional<rdx::context> ctx;
      if (!list.empty())
        ctx.emplace(device.empty() ? rdx::context::open_default() : rdx::context::open(device));
      const bool any = print_gpus(ctx ? ctx->native_handle() : nullptr);
      if (gpus_only) return any ? 0 : 1;
    }
#else
    if (gpus_only) {
      std::fprintf(stderr, "%s: built without rdx::cuda: no GPU probe (configure with the CUDA Toolkit)\n",
                   argv[0]);
      return 1;
    }
#endif
    if (list.empty()) {
      std::fprintf(
          stderr,
          "%s: no RDMA devices found (is a driver loaded, e.g. rdma link add rxe0 type rxe netdev eth0?)\n",
          argv[0]);
      return 1;
    }
    if (list_only) {
      std::printf("%zu device%s found:\n", list.size(), list.size() == 1 ? "" : "s");
      for (ibv_device* d : list)
        std::printf("\t%s\tnode GUID %s\n", std::string(rdx::device_name(d)).c_str(),
                    guid_text(::ibv_get_device_guid(d)).c_str());
      return 0;
    }
    if (!device.empty()) {
      print_device(rdx::context::open(device), port);
    } else {
      for (ibv_device* d : list) print_device(rdx::context(d), port);
    }
#if RDX_DEVINFO_GPUS
    (void)print_gpus(device.empty() ? rdx::context::open_default().native_handle()
                                    : rdx::context::open(device).native_handle());
#endif
    return 0;
  } catch (const rdx::error& e) {
    std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
  }
  return 1;
}
