#include "hw/network_model.h"

#include "hw/chip_spec.h"

namespace tpusim {
namespace {

constexpr double kGiga = 1e9;
constexpr double kMicro = 1e-6;

}  // namespace

RingPath torus_ring(const Slice& slice, int axis, int size, bool whole_axis) {
  RingPath ring;
  if (slice.switched) {
    // Through the switch each GPU uses all its links whatever the group, and a ring of N takes
    // N - 1 steps of one switch hop.
    ring.links = slice.chip->ici_links_per_chip;
    ring.latency_steps = size - 1.0;
    ring.max_hops = 1;
    return ring;
  }
  ring.wraps = whole_axis && slice.wraparound[static_cast<size_t>(axis)] && size > 2;
  // Both neighbours of a wrapped ring take a share; an open line is one direction's worth.
  ring.links = ring.wraps ? 2.0 : 1.0;
  ring.latency_steps = ring.wraps ? size / 2.0 : size - 1.0;
  ring.max_hops = ring.wraps ? size / 2 : size - 1;
  return ring;
}

RingPath chiplet_ring(const Slice& slice) {
  RingPath ring;
  ring.d2d_bytes_per_s = slice.chip->d2d_bandwidth_uni_gbps * kGiga;
  ring.latency_steps = 1;
  ring.max_hops = 1;
  return ring;
}

double ici_link_peak_bytes_per_s(const Slice& slice) {
  return slice.chip->ici_link_bandwidth_uni_gbps * kGiga;
}

double ici_link_achievable_bytes_per_s(const Slice& slice) {
  const ChipSpec& chip = *slice.chip;
  return chip.ici_link_bandwidth_uni_gbps * kGiga * chip.ici_achievable_fraction /
         slice.devices_per_chip;
}

double dcn_achievable_bytes_per_s(const Slice& slice) {
  const ChipSpec& chip = *slice.chip;
  return chip.dcn_bandwidth_per_chip_gbps * kGiga * chip.dcn_achievable_fraction /
         slice.devices_per_chip;
}

double ici_hop_latency_s(const Slice& slice) {
  return slice.chip->ici_hop_latency_us * kMicro;
}

double dcn_latency_s(const Slice& slice) {
  return slice.chip->dcn_latency_us * kMicro;
}

}  // namespace tpusim
