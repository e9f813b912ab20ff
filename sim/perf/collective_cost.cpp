#include "sim/perf/collective_cost.h"

#include <algorithm>
#include <vector>

#include "common/mechanisms.h"
#include "hw/network_model.h"
#include "model/ir/op_kind_traits.h"

namespace tpusim {
namespace {

constexpr double kMicro = 1e-6;

// Bandwidth term of an all-gather of V over N devices on bandwidth W.
double gather_seconds(double bytes, double devices, double bandwidth) {
  if (devices <= 1 || bandwidth <= 0) {
    return 0;
  }
  return (devices - 1) / devices * bytes / bandwidth;
}

// A ring across TPU slices: each of its N - 1 steps is a message from HBM through PCIe, the
// host's NIC and the network into the peer's HBM, sent after the previous step's chunk arrived
// (and, in a reduction, was added). With `add_latency` (dcn_step_latency) its latency comes on
// top of its bytes (Hockney's alpha-beta model), where ICI hops pipeline and cost the larger of
// the two; without, the larger of the two as for ICI.
struct DcnRing {
  double bandwidth = 0;  // bytes/s per device
  double latency = 0;    // s per message
  bool add_latency = true;
  double latency_seconds = 0;  // the steps' latency summed over the calls, with add_latency

  // `rings` scales the bytes: 2 for an all-reduce (a reduce-scatter, then an all-gather), 1/2 for
  // an all-to-all (each device keeps its own part and the rest crosses once); `message_rounds`
  // counts the N - 1 messages sent one after the other (2 for an all-reduce, 1 for a gather or a
  // reduce-scatter, 1 / (N - 1) for an all-to-all or a permute, whose messages leave at once).
  double seconds(double size, double devices, double rings, double message_rounds) {
    if (devices <= 1) {
      return 0.0;
    }
    const double bytes_seconds = gather_seconds(size, devices, bandwidth);
    if (!add_latency) {
      return rings * std::max((devices - 1) * latency, bytes_seconds);
    }
    const double steps_latency = message_rounds * (devices - 1) * latency;
    latency_seconds += steps_latency;
    return steps_latency + rings * bytes_seconds;
  }
};

}  // namespace

CollectiveTime collective_time(OpKind kind, double bytes, const std::vector<std::string>& mesh_axes,
                               const DeviceMesh& mesh, const Slice& slice,
                               const MechanismSet& mechanisms) {
  const ChipSpec& chip = *slice.chip;
  // The devices of one chip (v7x chiplets) each run their ring on their share of the chip's links
  // (hw/topology.h draws every ICI link as one edge per chiplet with that share).
  const double link = ici_link_achievable_bytes_per_s(slice);
  double ici_bandwidth = 0;
  double chip_link_bandwidth = 0;  // of the torus links only (no D2D)
  double chiplet_devices = 1;      // devices of one chip in the group (the D2D portion)
  double ici_hops = 0;
  double ici_devices = 1;
  bool d2d_only = true;
  double dcn_devices = 1;
  bool all_wrap = true;
  // The group's extent along each torus axis: mesh axes that split one physical axis share its
  // links, so the group runs one ring over the product of their portions there, not one ring per
  // portion (which would count the same links once per mesh axis).
  std::vector<int> extent(slice.shape.size(), 1);
  for (const std::string& name : mesh_axes) {
    const MeshAxisPlacement& axis = mesh.axis(name);
    dcn_devices *= axis.dcn_size;
    ici_devices *= axis.ici_size;
    for (const PhysicalPortion& portion : axis.portions) {
      if (portion.physical_axis == kChipletAxis) {
        const RingPath ring = chiplet_ring(slice);
        ici_bandwidth += ring.bandwidth(link);
        chiplet_devices *= static_cast<double>(portion.size);
        ici_hops += ring.latency_steps;
        continue;
      }
      extent[static_cast<size_t>(portion.physical_axis)] *= portion.size;
    }
  }
  for (size_t physical = 0; physical < extent.size(); ++physical) {
    if (extent[physical] == 1) {
      continue;
    }
    d2d_only = false;
    const RingPath ring = torus_ring(slice, static_cast<int>(physical), extent[physical],
                                     extent[physical] == slice.shape[physical]);
    all_wrap = all_wrap && ring.wraps;
    ici_bandwidth += ring.bandwidth(link);
    chip_link_bandwidth += ring.bandwidth(link);
    ici_hops += ring.latency_steps;
  }
  const double hop_latency = ici_hop_latency_s(slice);
  const double dcn_bandwidth = dcn_achievable_bytes_per_s(slice);
  auto gather = [&](double size, double devices, double bandwidth, double hops, double latency) {
    return std::max(hops * latency, gather_seconds(size, devices, bandwidth));
  };
  // A GPU's inter-node fabric (GPUDirect RDMA over InfiniBand) pipelines its steps as ICI does.
  DcnRing dcn_ring{dcn_bandwidth, dcn_latency_s(slice),
                   mechanisms.enabled(Mechanism::kDcnStepLatency) && !slice.switched};
  // A group spanning the chiplet pair and torus axes cannot route more through the fast D2D link
  // than the partner holds: every byte the chip lacks enters over its torus links, shared by its
  // devices. So the group is also bounded by the chip's ingress, (N - c)/N x V over c x W_torus.
  auto chip_ingress_bound = [&](double size) {
    if (chiplet_devices <= 1 || chip_link_bandwidth <= 0 || ici_devices <= chiplet_devices ||
        !mechanisms.enabled(Mechanism::kChipIngressBound)) {
      return 0.0;
    }
    return (ici_devices - chiplet_devices) / ici_devices * size /
           (chiplet_devices * chip_link_bandwidth);
  };
  // An all-to-all's ICI stage moves the slice's part: V / (DCN devices).
  const double ici_bytes = bytes / std::max(1.0, dcn_devices);
  double ici = 0;
  double dcn = 0;
  switch (op_kind_traits(kind).collective) {
    case Collective::kAllGather:
    case Collective::kReduceScatter:
      // Across slices the small shards cross DCN (each device swaps its shard with its peers
      // in the other slices), then ICI gathers the slice's V / DCN-sized pieces into V (a
      // reduce-scatter runs the same stages in reverse): DCN carries V / N of each peer.
      if (!mechanisms.enabled(Mechanism::kDcnShardsFirst)) {
        // Ablation: the ICI stage first, then the whole array over DCN.
        ici = std::max(gather(ici_bytes, ici_devices, ici_bandwidth, ici_hops, hop_latency),
                       chip_ingress_bound(ici_bytes));
        dcn = dcn_ring.seconds(bytes, dcn_devices, 1, 1);
        break;
      }
      ici = std::max(gather(bytes, ici_devices, ici_bandwidth, ici_hops, hop_latency),
                     chip_ingress_bound(bytes));
      dcn = dcn_ring.seconds(bytes / std::max(1.0, ici_devices), dcn_devices, 1, 1);
      break;
    case Collective::kAllReduce:
      // ICI reduce-scatter of V, DCN all-reduce of the V / ICI shard, ICI all-gather of V.
      ici = 2 * std::max(gather(bytes, ici_devices, ici_bandwidth, ici_hops, hop_latency),
                         chip_ingress_bound(bytes));
      dcn = dcn_ring.seconds(bytes / std::max(1.0, ici_devices), dcn_devices, 2, 2);
      break;
    case Collective::kAllToAll:
    case Collective::kCollectivePermute:
      // A switch carries each device's (N-1)/N x V at its link bandwidth, like a gather.
      ici = gather(ici_bytes, ici_devices, ici_bandwidth, ici_hops, hop_latency) /
            (slice.switched ? 1.0 : (all_wrap && !d2d_only ? 4.0 : 2.0));
      // Its messages to the other slices leave at once: one message's latency.
      dcn = dcn_ring.seconds(bytes, dcn_devices, 0.5, 1.0 / std::max(1.0, dcn_devices - 1));
      break;
    case Collective::kNone:
      break;
  }
  CollectiveTime time;
  time.ici_seconds = ici;
  time.dcn_seconds = dcn;
  time.dcn_latency_seconds = dcn_ring.latency_seconds;
  time.seconds = ici + dcn + (ici + dcn > 0 ? chip.collective_launch_us * kMicro : 0);
  time.link = dcn > ici                     ? LinkKind::kDcn
              : d2d_only && ici_devices > 1 ? LinkKind::kD2d
                                            : LinkKind::kIci;
  return time;
}

}  // namespace tpusim
