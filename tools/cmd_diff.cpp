// arbiter diff: which decisions differ between two tables, in words a
// reviewer of a table change can read.
//
// Every decision depends on (capability, world size, nodes, pattern, dtype,
// topology, residual, buffers, whether the call has fewer tokens than ranks,
// size). The capabilities and world sizes worth visiting are those with a
// cell in either table, and, for the calls no cell covers (they fall back,
// but which backend takes them is up to the backends' rules), one of each
// kind the rules of either table tell apart: world sizes by the backends'
// world_sizes, capabilities by their min_capability. Nodes are 1, every
// nodes key in a cell, and one multi-node count that no cell names (all such
// counts decide alike); each with NVLink and multicast, NVLink alone,
// neither, and multicast alone (a backend's needs_* rules tell them apart).
// World sizes above kMaxWorldSize are one more kind. Within each, sizes are
// compared band by band, so the comparison is exact, not sampled.
#include <algorithm>
#include <array>
#include <iostream>
#include <map>
#include <optional>
#include <set>

#include "arbiter/size.h"
#include "cli.h"
#include "ranges_text.h"

namespace arbiter::cli {
namespace {

struct Difference {
  std::uint64_t first, last;
  Decision a, b;
};

std::vector<Difference> compare(const Policy& a, const Policy& b, const Request& r,
                                std::uint64_t to) {
  std::vector<Band> ba = sweep(a, r, 1, to), bb = sweep(b, r, 1, to);
  std::vector<Difference> out;
  std::size_t i = 0, j = 0;
  std::uint64_t first = 1;
  while (i < ba.size() && j < bb.size()) {
    const std::uint64_t last = std::min(ba[i].last, bb[j].last);
    const Decision& da = ba[i].decision;
    const Decision& db = bb[j].decision;
    if (!da.same_choice(db)) {
      // The reasons too, as sweep's bands: each line's label is its own.
      if (!out.empty() && out.back().last + 1 == first && out.back().a.same_choice(da) &&
          out.back().b.same_choice(db) && out.back().a.reason == da.reason &&
          out.back().b.reason == db.reason) {
        out.back().last = last;
      } else {
        out.push_back({first, last, da, db});
      }
    }
    if (ba[i].last == last) ++i;
    if (bb[j].last == last) ++j;
    first = last + 1;
  }
  return out;
}

std::string describe(const std::vector<Difference>& diffs, std::uint64_t to) {
  std::string s;
  for (const Difference& d : diffs) {
    s += "    " + band_text(d.first, d.last, 1, to) + ": " + decision_summary(d.a) + "  ->  " +
         decision_summary(d.b) + "\n";
  }
  return s;
}

// The topologies a GPU job of `nodes` nodes may have: NVLink everywhere
// with and without multicast, and no NVLink (a PCIe board; nodes joined by
// a network only). CPU ranks: one node; NVLink and multicast mean nothing.
struct Topology {
  std::uint32_t nodes;
  bool nvlink;
  bool multicast;
};

std::string topology_text(const Topology& t) {
  std::string s = std::to_string(t.nodes) + (t.nodes == 1 ? " node" : " nodes");
  if (t.nodes == 1) {
    if (!t.nvlink) return s + (t.multicast ? " (no NVLink, multicast)" : " (no NVLink)");
    return t.multicast ? s + " (multicast)" : s;
  }
  if (!t.nvlink)
    return s + (t.multicast ? " (no NVLink domain, multicast)" : " (no NVLink domain)");
  return s + (t.multicast ? " (NVLink domain, multicast)" : " (NVLink domain, no multicast)");
}

std::string names_text(const std::set<int>& items, int count, bool pattern) {
  if (static_cast<int>(items.size()) == count) return pattern ? "all patterns" : "all dtypes";
  std::string s;
  for (int i : items) {
    if (!s.empty()) s += ", ";
    s += pattern ? pattern_name(static_cast<Pattern>(i)) : dtype_name(static_cast<Dtype>(i));
  }
  return s;
}

// What the backends' rules of both tables say of a world size: whether each
// backend may take it. World sizes alike here, and without a cell, decide
// alike.
// Above kMaxWorldSize no cell or list names a world size: only backends
// without a world_sizes rule take one, and all such world sizes decide
// alike (kMaxWorldSize + 1 stands for them).
std::string world_size_kind(const Policy& a, const Policy& b, std::uint32_t ws) {
  // One rank: no few-tokens variant; above the lists: a kind of its own.
  std::string kind(1, ws == 1 ? '1' : ws > kMaxWorldSize ? 'L' : 'n');
  for (const Policy* p : {&a, &b}) {
    for (const BackendRules& rules : p->tables().backends) {
      const bool listed = ws <= kMaxWorldSize && rules.world_sizes.test(ws);
      kind += rules.world_sizes.none() || listed ? '+' : '-';
    }
  }
  return kind;
}

// GPU capabilities worth a visit without a cell: one per kind that the
// min_capability rules of both tables tell apart, with the capabilities it
// stands for.
std::map<std::uint16_t, std::vector<std::uint32_t>> capability_kinds(
    const Policy& a, const Policy& b, const std::set<std::uint16_t>& with_cells) {
  std::set<std::uint16_t> thresholds;
  for (const Policy* p : {&a, &b}) {
    for (const BackendRules& rules : p->tables().backends) {
      for (std::uint16_t t : rules.min_capability) {
        if (t != 0) thresholds.insert(t);
      }
    }
  }
  std::map<std::vector<bool>, std::vector<std::uint32_t>> kinds;
  for (std::uint32_t code = Capability::kMinSm; code <= Capability::kMaxSm; ++code) {
    if (with_cells.count(static_cast<std::uint16_t>(code))) continue;
    std::vector<bool> kind;
    for (std::uint16_t t : thresholds) kind.push_back(code >= t);
    kinds[kind].push_back(code);
  }
  std::map<std::uint16_t, std::vector<std::uint32_t>> out;
  for (auto& [kind, codes] : kinds) out[static_cast<std::uint16_t>(codes.front())] = codes;
  return out;
}

}  // namespace

int cmd_diff(const Args& args) {
  po::options_description desc("arbiter diff options");
  desc.add_options()("file", po::value<std::vector<std::string>>(), "A.yaml B.yaml")(
      "standalone", po::bool_switch(),
      "read A and B as complete tables, not as site layers over the default")("help,h",
                                                                              "this help");
  po::positional_options_description positional;
  positional.add("file", 2);
  po::variables_map vm = parse(args, desc, &positional);
  if (vm.count("help")) {
    std::cout << "usage: arbiter diff A.yaml B.yaml\n"
                 "A or B may be preset:NAME, a preset shipped with arbiter; preset:default is\n"
                 "the embedded default alone (arbiter diff preset:default preset:NAME: what a\n"
                 "preset changes)\n"
                 "exit 0: no decision differs; 1: some do; 2: error\n\n"
              << desc;
    return kExitOk;
  }
  if (!vm.count("file") || vm["file"].as<std::vector<std::string>>().size() != 2) {
    throw UsageError{"give exactly two table files"};
  }
  const auto files = vm["file"].as<std::vector<std::string>>();
  std::optional<Policy> policies[2];
  for (int k = 0; k < 2; ++k) {
    LoadOptions options;
    options.with_default = !vm["standalone"].as<bool>();
    options.site_files = {files[k]};
    LoadResult r = Policy::load(options);
    for (const Diagnostic& d : r.diagnostics) std::cerr << d.to_string() << "\n";
    if (!r.policy) return kExitUsage;
    policies[k] = std::move(r.policy);
  }
  const Policy& a = *policies[0];
  const Policy& b = *policies[1];

  // (capability, ws) -> the world sizes it stands for ("" : itself, a cell's)
  std::map<std::pair<std::uint16_t, std::uint32_t>, std::string> shapes;
  std::set<std::uint32_t> keyed_nodes;
  std::map<std::uint16_t, std::set<std::uint32_t>> cell_world_sizes;  // by capability
  for (const Policy* p : {&a, &b}) {
    for (const auto* cells : {&p->tables().fusion, &p->tables().oneshot}) {
      for (const Cell& c : *cells) {
        shapes[{c.key.capability.code(), c.key.world_size}];
        cell_world_sizes[c.key.capability.code()].insert(c.key.world_size);
        if (c.key.nodes > 1) keyed_nodes.insert(c.key.nodes);
      }
    }
  }
  // The calls no cell covers: one world size of each kind per capability.
  std::set<std::uint16_t> capabilities = {0};  // cpu
  std::set<std::uint16_t> gpu_with_cells;
  for (const auto& [code, sizes] : cell_world_sizes) {
    capabilities.insert(code);
    if (code != 0) gpu_with_cells.insert(code);
  }
  std::map<std::uint16_t, std::string> capability_stands_for;
  for (const auto& [code, codes] : capability_kinds(a, b, gpu_with_cells)) {
    capabilities.insert(code);
    if (codes.size() > 1) capability_stands_for[code] = " (as for " + ranges_text(codes) + ")";
  }
  for (std::uint16_t code : capabilities) {
    std::map<std::string, std::vector<std::uint32_t>> kinds;
    const std::set<std::uint32_t>& named = cell_world_sizes[code];
    for (std::uint32_t ws = 1; ws <= kMaxWorldSize + 1; ++ws) {
      if (!named.count(ws)) kinds[world_size_kind(a, b, ws)].push_back(ws);
    }
    for (const auto& [kind, sizes] : kinds) {
      shapes[{code, sizes.front()}] =
          sizes.front() > kMaxWorldSize
              ? "no cell; as for every world size above " + std::to_string(kMaxWorldSize)
          : sizes.size() == 1 ? "no cell"
                              : "no cell; as for world sizes " + ranges_text(sizes);
    }
  }
  const std::uint64_t to = kMaxSizeBytes;
  int differing = 0;
  for (const auto& [shape, stands_for] : shapes) {
    const auto [code, ws] = shape;
    const Capability cap = code == 0 ? Capability::cpu() : Capability::sm(code);
    std::vector<std::uint32_t> node_counts = {1};
    if (!cap.is_cpu()) {
      for (std::uint32_t n : keyed_nodes) {
        if (n <= ws) node_counts.push_back(n);
      }
      for (std::uint32_t n = 2; n <= ws; ++n) {
        if (!keyed_nodes.count(n)) {
          node_counts.push_back(n);  // stands for every unkeyed multi-node count
          break;
        }
      }
    }
    std::vector<Topology> topologies;
    for (std::uint32_t nodes : node_counts) {
      if (cap.is_cpu()) {
        topologies.push_back({nodes, true, false});
        continue;
      }
      // One node: an NVL72 tray has multicast, an HGX board not.
      topologies.push_back({nodes, true, nodes > 1});
      topologies.push_back({nodes, true, nodes == 1});
      topologies.push_back({nodes, false, false});
      // Multicast without NVLink says nothing real, but requests may say
      // it and a backend's needs_* rules tell it apart: shown only where
      // it decides otherwise than no NVLink.
      topologies.push_back({nodes, false, true});
    }
    const char* const kNoDifference = "  no difference\n";
    using Groups = std::array<std::map<std::string, std::map<int, std::set<int>>>, 8>;
    Groups without_nvlink;
    for (const Topology& topology : topologies) {
      // Same differences -> the (pattern, dtype) pairs that share them, per
      // variant of the call, a set of bits: a replicated residual, registered
      // buffers, fewer tokens than ranks (a backend's two-shot may need a
      // token per rank), in every combination. A variant is listed only
      // where its differences are not those of any variant with one bit
      // less (the plain call first): what they show explains it.
      constexpr int kReplicated = 1, kRegistered = 2, kFewTokens = 4, kVariants = 8;
      Groups groups;
      for (int pt = 0; pt < kPatternCount; ++pt) {
        for (int dt = 0; dt < kDtypeCount; ++dt) {
          std::array<std::optional<std::vector<Difference>>, kVariants> diffs;
          std::array<std::string, kVariants> text;
          for (int variant = 0; variant < kVariants; ++variant) {
            if ((variant & kReplicated) && pt == static_cast<int>(Pattern::kAllreduce)) continue;
            if ((variant & kFewTokens) && ws < 2) continue;
            Request r;
            r.capability = cap;
            r.world_size = ws;
            r.nodes = topology.nodes;
            r.nvlink_domain = topology.nvlink;
            r.multicast = topology.multicast;
            r.pattern = static_cast<Pattern>(pt);
            r.dtype = static_cast<Dtype>(dt);
            r.residual_replicated = (variant & kReplicated) != 0;
            r.buffers_registered = (variant & kRegistered) != 0;
            if (variant & kFewTokens) r.tokens = 1;
            diffs[variant] = compare(a, b, r, to);
            if (!diffs[variant]->empty()) text[variant] = describe(*diffs[variant], to);
          }
          if (!diffs[0]->empty()) groups[0][text[0]][pt].insert(dt);
          for (int variant = 1; variant < kVariants; ++variant) {
            if (!diffs[variant]) continue;
            bool explained = false;
            for (int bit = 1; bit < kVariants; bit <<= 1) {
              if ((variant & bit) && text[variant & ~bit] == text[variant]) explained = true;
            }
            if (!explained) {
              groups[variant][diffs[variant]->empty() ? kNoDifference : text[variant]][pt].insert(
                  dt);
            }
          }
        }
      }
      if (!topology.nvlink && !topology.multicast) without_nvlink = groups;
      if (!topology.nvlink && topology.multicast && groups == without_nvlink) continue;
      for (int variant = 0; variant < kVariants; ++variant)
        for (const auto& [text, by_pattern] : groups[variant]) {
          // Collapse patterns that share the same dtype set.
          std::map<std::set<int>, std::set<int>> by_dtypes;
          for (const auto& [pt, dts] : by_pattern) by_dtypes[dts].insert(pt);
          for (const auto& [dts, pts] : by_dtypes) {
            // A variant where the plain call's differences vanish is shown,
            // but it is not a group of decisions that differ.
            if (text != kNoDifference) ++differing;
            std::cout << "capability " << capability_name(cap) << capability_stands_for[code]
                      << ", world size " << ws
                      << (stands_for.empty() ? "" : " (" + stands_for + ")") << ", "
                      << topology_text(topology) << ", " << names_text(pts, kPatternCount, true)
                      << ", " << names_text(dts, kDtypeCount, false)
                      << (variant & kReplicated ? ", residual replicated" : "")
                      << (variant & kRegistered ? ", registered buffers" : "")
                      << (variant & kFewTokens ? ", fewer tokens than ranks" : "") << ":\n"
                      << text;
          }
        }
    }
  }
  if (differing == 0) {
    std::cout << "no decision differs between " << files[0] << " and " << files[1] << "\n";
    return kExitOk;
  }
  std::cout << differing << " group(s) of decisions differ (" << files[0] << " -> " << files[1]
            << ")\n";
  return kExitFailed;
}

}  // namespace arbiter::cli
