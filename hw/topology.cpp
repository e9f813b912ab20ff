#include "hw/topology.h"

#include <algorithm>
#include <deque>
#include <sstream>

#include "common/error.h"
#include "hw/network_model.h"

namespace tpusim {
namespace {

constexpr double kGiga = 1e9;
constexpr double kMicro = 1e-6;

std::vector<int> coords_of(int chip, const std::vector<int>& shape) {
  std::vector<int> coords(shape.size());
  for (size_t axis = 0; axis < shape.size(); ++axis) {
    coords[axis] = chip % shape[axis];
    chip /= shape[axis];
  }
  return coords;
}

}  // namespace

int Topology::chip_index(const std::vector<int>& coords) const {
  int index = 0;
  for (size_t axis = coords.size(); axis-- > 0;) {
    index = index * slice_.shape[axis] + coords[axis];
  }
  return index;
}

Topology::Topology(const Slice& slice) : slice_(slice) {
  const ChipSpec& chip = *slice.chip;
  const int per_chip = slice.devices_per_chip;
  const int devices_per_slice = slice.devices();
  const double link_bw = ici_link_peak_bytes_per_s(slice) / per_chip;

  // Devices first (vertex index == device index), then hosts, then the DCN fabric.
  for (int slice_index = 0; slice_index < slice.num_slices; ++slice_index) {
    for (int chip_id = 0; chip_id < slice.chips; ++chip_id) {
      for (int chiplet = 0; chiplet < per_chip; ++chiplet) {
        TopologyVertex vertex;
        vertex.slice_index = slice_index;
        vertex.coords = coords_of(chip_id, slice.shape);
        vertex.chiplet = chiplet;
        vertex.host = chip_id / slice.chips_per_host;
        boost::add_vertex(vertex, graph_);
      }
    }
  }
  const int first_host = slice.total_devices();
  for (int slice_index = 0; slice_index < slice.num_slices; ++slice_index) {
    for (int host = 0; host < slice.hosts; ++host) {
      TopologyVertex vertex;
      vertex.kind = VertexKind::kHost;
      vertex.slice_index = slice_index;
      vertex.host = host;
      boost::add_vertex(vertex, graph_);
    }
  }

  for (int slice_index = 0; slice_index < slice.num_slices; ++slice_index) {
    const int base = slice_index * devices_per_slice;
    for (int chip_id = 0; chip_id < slice.chips; ++chip_id) {
      const std::vector<int> coords = coords_of(chip_id, slice.shape);
      // A GPU node: one switch hop joins every pair, at the GPU's whole link bandwidth.
      for (int other = chip_id + 1; slice.switched && other < slice.chips; ++other) {
        TopologyEdge edge;
        edge.kind = LinkKind::kIci;
        edge.bandwidth_uni_bytes_per_s = link_bw * chip.ici_links_per_chip;
        edge.latency_s = ici_hop_latency_s(slice);
        edge.axis = 0;
        boost::add_edge(base + chip_id, base + other, edge, graph_);
      }
      for (size_t axis = 0; axis < slice.shape.size() && !slice.switched; ++axis) {
        const int size = slice.shape[axis];
        if (size < 2) {
          continue;
        }
        const bool last = coords[axis] == size - 1;
        // The last chip links back to the first only on a closed ring (hw/network_model.h).
        if (last && !torus_ring(slice, static_cast<int>(axis), size, /*whole_axis=*/true).wraps) {
          continue;
        }
        std::vector<int> neighbour = coords;
        neighbour[axis] = (coords[axis] + 1) % size;
        const int neighbour_chip = chip_index(neighbour);
        for (int chiplet = 0; chiplet < per_chip; ++chiplet) {
          TopologyEdge edge;
          edge.kind = LinkKind::kIci;
          edge.bandwidth_uni_bytes_per_s = link_bw;
          edge.latency_s = ici_hop_latency_s(slice);
          edge.axis = static_cast<int>(axis);
          edge.wraparound = last;
          boost::add_edge(base + chip_id * per_chip + chiplet,
                          base + neighbour_chip * per_chip + chiplet, edge, graph_);
        }
      }
      if (per_chip == 2) {
        TopologyEdge edge;
        edge.kind = LinkKind::kD2d;
        edge.bandwidth_uni_bytes_per_s = chip.d2d_bandwidth_uni_gbps * kGiga;
        edge.latency_s = chip.d2d_latency_us * kMicro;
        boost::add_edge(base + chip_id * per_chip, base + chip_id * per_chip + 1, edge, graph_);
      }
      for (int chiplet = 0; chiplet < per_chip; ++chiplet) {
        TopologyEdge edge;
        edge.kind = LinkKind::kPcie;
        edge.bandwidth_uni_bytes_per_s = chip.pcie_bandwidth_gbps * kGiga / per_chip;
        boost::add_edge(base + chip_id * per_chip + chiplet,
                        first_host + slice_index * slice.hosts + chip_id / slice.chips_per_host,
                        edge, graph_);
      }
    }
  }

  if (slice.num_slices > 1) {
    TopologyVertex fabric;
    fabric.kind = VertexKind::kDcnFabric;
    const auto fabric_vertex = boost::add_vertex(fabric, graph_);
    for (int host = 0; host < slice.total_hosts(); ++host) {
      TopologyEdge edge;
      edge.kind = LinkKind::kDcn;
      edge.bandwidth_uni_bytes_per_s =
          chip.dcn_bandwidth_per_chip_gbps * kGiga * slice.chips_per_host;
      edge.latency_s = dcn_latency_s(slice);
      boost::add_edge(first_host + host, fabric_vertex, edge, graph_);
    }
  }
}

int Topology::hop_distance(int device_a, int device_b) const {
  const int devices = num_devices();
  if (device_a < 0 || device_b < 0 || device_a >= devices || device_b >= devices) {
    throw UserError("device index out of range (0.." + std::to_string(devices - 1) + ")");
  }
  if (graph_[device_a].slice_index != graph_[device_b].slice_index) {
    throw UserError("devices " + std::to_string(device_a) + " and " + std::to_string(device_b) +
                    " are in different slices (connected over DCN, not ICI)");
  }
  std::vector<int> distance(boost::num_vertices(graph_), -1);
  std::deque<int> frontier = {device_a};
  distance[device_a] = 0;
  while (!frontier.empty()) {
    const int vertex = frontier.front();
    frontier.pop_front();
    if (vertex == device_b) {
      return distance[vertex];
    }
    for (const auto& edge : boost::make_iterator_range(boost::out_edges(vertex, graph_))) {
      const LinkKind kind = graph_[edge].kind;
      if (kind != LinkKind::kIci && kind != LinkKind::kD2d) {
        continue;
      }
      const int next = static_cast<int>(boost::target(edge, graph_));
      if (distance[next] < 0) {
        distance[next] = distance[vertex] + 1;
        frontier.push_back(next);
      }
    }
  }
  return -1;
}

AxisBandwidth Topology::axis_bandwidth(int axis) const {
  if (axis < 0 || axis >= static_cast<int>(slice_.shape.size())) {
    throw UserError("torus axis " + std::to_string(axis) + " does not exist in shape " +
                    shape_to_text(slice_.shape));
  }
  AxisBandwidth result;
  result.axis = axis;
  result.size = slice_.shape[axis];
  result.wraps = slice_.wraparound[axis];
  result.link_bandwidth_uni_bytes_per_s = ici_link_peak_bytes_per_s(slice_);
  if (result.size < 2) {
    return result;
  }
  const RingPath ring = torus_ring(slice_, axis, result.size, /*whole_axis=*/true);
  result.ring_bandwidth_bytes_per_s = ring.bandwidth(result.link_bandwidth_uni_bytes_per_s);
  result.max_hops = ring.max_hops;
  return result;
}

double Topology::bisection_bandwidth_bytes_per_s() const {
  const auto longest = std::max_element(slice_.shape.begin(), slice_.shape.end());
  const int axis = static_cast<int>(longest - slice_.shape.begin());
  const int size = *longest;
  if (size < 2) {
    return 0;
  }
  if (slice_.switched) {
    // A non-blocking switch: half the GPUs send to the other half at their whole link bandwidth.
    return slice_.chip->ici_link_bandwidth_uni_gbps * kGiga * slice_.chip->ici_links_per_chip *
           (size / 2);
  }
  // Devices with coordinate < size/2 on `axis` form one half of each slice.
  const int half = size / 2;
  double total = 0;
  for (const auto& edge : boost::make_iterator_range(boost::edges(graph_))) {
    const TopologyEdge& link = graph_[edge];
    if (link.kind != LinkKind::kIci || link.axis != axis) {
      continue;
    }
    const TopologyVertex& from = graph_[boost::source(edge, graph_)];
    const TopologyVertex& to = graph_[boost::target(edge, graph_)];
    if ((from.coords[axis] < half) != (to.coords[axis] < half)) {
      total += link.bandwidth_uni_bytes_per_s;
    }
  }
  return total / slice_.num_slices;
}

int Topology::ici_links_per_chip() const {
  if (slice_.switched) {
    return static_cast<int>(slice_.chip->ici_links_per_chip);  // to the switch (NVLink ports)
  }
  int most = 0;
  const int per_chip = slice_.devices_per_chip;
  for (int chip_id = 0; chip_id < slice_.chips; ++chip_id) {
    int count = 0;
    const int first_device = chip_id * per_chip;
    for (const auto& edge : boost::make_iterator_range(boost::out_edges(first_device, graph_))) {
      if (graph_[edge].kind == LinkKind::kIci) {
        ++count;
      }
    }
    most = std::max(most, count);
  }
  return most;
}

double Topology::dcn_bandwidth_per_slice_bytes_per_s() const {
  return slice_.chip->dcn_bandwidth_per_chip_gbps * kGiga * slice_.chips;
}

std::string Topology::to_dot() const {
  std::ostringstream out;
  out << "graph \"" << slice_.name << "\" {\n  node [shape=box, fontsize=9];\n";
  for (const auto vertex : boost::make_iterator_range(boost::vertices(graph_))) {
    const TopologyVertex& info = graph_[vertex];
    out << "  v" << vertex << " [label=\"";
    switch (info.kind) {
      case VertexKind::kDevice:
        out << "s" << info.slice_index << " (" << shape_to_text(info.coords) << ")";
        if (slice_.devices_per_chip > 1) {
          out << " c" << info.chiplet;
        }
        break;
      case VertexKind::kHost:
        out << "s" << info.slice_index << " host " << info.host << "\", shape=ellipse";
        out << "];\n";
        continue;
      case VertexKind::kDcnFabric:
        out << "DCN\", shape=diamond];\n";
        continue;
    }
    out << "\"];\n";
  }
  for (const auto& edge : boost::make_iterator_range(boost::edges(graph_))) {
    const TopologyEdge& link = graph_[edge];
    static const char* const kStyles[] = {"solid", "bold", "dotted", "dashed"};
    out << "  v" << boost::source(edge, graph_) << " -- v" << boost::target(edge, graph_)
        << " [style=" << kStyles[static_cast<int>(link.kind)] << "];\n";
  }
  out << "}\n";
  return out.str();
}

}  // namespace tpusim
