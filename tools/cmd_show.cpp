// arbiter show: the effective tables as capability x world size grids.
#include <algorithm>
#include <iomanip>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#include "arbiter/size.h"
#include "cli.h"

namespace arbiter::cli {
namespace {

// A site file's text as the terminal should show it: control characters
// (an escape sequence in a provenance string) as \xNN, not obeyed.
std::string printable(const std::string& text) {
  static const char* kHex = "0123456789abcdef";
  std::string out;
  for (unsigned char c : text) {
    if (c < 0x20 || c == 0x7f) {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

// Marks which layer set a grid cell.
char layer_mark(const Policy& p, std::uint16_t origin) {
  const Origin* o = p.tables().find_origin(origin);
  if (!o) return '?';
  switch (o->layer) {
    case Layer::kDefault:
      return ' ';
    case Layer::kSite:
      return '*';
    case Layer::kOverride:
      return '+';
    case Layer::kEnvironment:
      return '!';
  }
  return '?';
}

std::string cell_value(const Cell& c) { return c.off ? "off" : format_size(c.max_bytes); }

void print_grid(std::ostream& out, const Policy& p, const std::vector<Cell>& cells,
                const std::string& title) {
  std::set<std::uint16_t> caps;  // by code; cpu (0) sorts first
  std::set<std::uint32_t> sizes;
  std::map<std::pair<std::uint16_t, std::uint32_t>, const Cell*> grid;
  std::vector<const Cell*> keyed;
  for (const Cell& c : cells) {
    if (c.key.specificity() > 0) {
      keyed.push_back(&c);
      continue;
    }
    caps.insert(c.key.capability.code());
    sizes.insert(c.key.world_size);
    grid[{c.key.capability.code(), c.key.world_size}] = &c;
  }
  out << title << "\n";
  out << std::left << std::setw(12) << "capability";
  for (std::uint32_t ws : sizes) out << std::setw(11) << ("ws=" + std::to_string(ws));
  out << "\n";
  // GPU capabilities in order, cpu last.
  std::vector<std::uint16_t> rows(caps.begin(), caps.end());
  std::stable_partition(rows.begin(), rows.end(), [](std::uint16_t c) { return c != 0; });
  for (std::uint16_t code : rows) {
    const Capability cap = code == 0 ? Capability::cpu() : Capability::sm(code);
    out << std::setw(12) << capability_name(cap);
    for (std::uint32_t ws : sizes) {
      auto it = grid.find({code, ws});
      std::string text = "-";
      if (it != grid.end()) text = cell_value(*it->second) + layer_mark(p, it->second->origin);
      out << std::setw(11) << text;
    }
    out << "\n";
  }
  if (!keyed.empty()) {
    out << "cells keyed by nodes, pattern, dtype, residual or buffers (more specific; they win):\n";
    for (const Cell* c : keyed) {
      out << "  " << c->key.to_string() << " = " << cell_value(*c) << "  ["
          << p.origin_text(c->origin) << "]\n";
    }
  }
}

std::string list_text(const std::vector<Backend>& list) {
  std::string s = "[";
  for (std::size_t i = 0; i < list.size(); ++i) {
    if (i) s += ", ";
    s += backend_name(list[i]);
  }
  return s + "]";
}

std::string mask_text(std::uint8_t mask, int count, std::string_view (*name)(int)) {
  if (mask == 0) return "all";
  std::string s;
  for (int i = 0; i < count; ++i) {
    if ((mask >> i) & 1u) s += (s.empty() ? "" : " ") + std::string(name(i));
  }
  return s;
}

void print_backends(std::ostream& out, const Policy& p) {
  const Tables& t = p.tables();
  std::vector<Backend> enabled, allowed;
  for (int b = 0; b < kBackendCount; ++b) {
    if ((t.enabled_mask >> b) & 1u) enabled.push_back(static_cast<Backend>(b));
    if ((t.allowed_mask >> b) & 1u) allowed.push_back(static_cast<Backend>(b));
  }
  out << "enabled: " << list_text(enabled) << "  [" << p.origin_text(t.enabled_origin) << "]\n";
  if (t.backends_env) {
    out << "allowed: " << list_text(allowed) << "  (ARBITER_BACKENDS=" << *t.backends_env << ")\n";
  }
  for (int k = 0; k < kTopologyCount; ++k) {
    out << "preference " << topology_name(static_cast<Topology>(k)) << ": "
        << list_text(t.preference[k]) << "  [" << p.origin_text(t.preference_origin[k]) << "]\n";
  }
  for (int k = 0; k < kDeviceKindCount; ++k) {
    out << "fallback " << device_kind_name(static_cast<DeviceKind>(k)) << ": "
        << backend_name(t.fallback[k]) << "  [" << p.origin_text(t.fallback_origin[k]) << "]\n";
  }
  for (int b = 0; b < kBackendCount; ++b) {
    const BackendRules& r = t.backends[b];
    if (!r.defined) continue;
    out << "backend " << backend_name(static_cast<Backend>(b)) << ": " << device_kind_name(r.device)
        << ", world sizes " << (r.world_sizes.none() ? "any" : r.world_sizes_text) << ", nodes "
        << nodes_rule_name(r.nodes);
    if (r.needs_nvlink) out << ", needs NVLink";
    if (r.needs_multicast) out << ", needs multicast";
    out << ", dtypes " << mask_text(r.dtype_mask, kDtypeCount, [](int i) {
      return dtype_name(static_cast<Dtype>(i));
    });
    out << ", patterns " << mask_text(r.pattern_mask, kPatternCount, [](int i) {
      return pattern_name(static_cast<Pattern>(i));
    });
    for (int pt = 0; pt < kPatternCount; ++pt) {
      if (r.min_capability[pt]) {
        out << ", " << pattern_name(static_cast<Pattern>(pt))
            << " needs capability >= " << r.min_capability[pt];
      }
    }
    out << ", algorithm " << algorithm_rule_name(r.algorithm);
    if (r.algorithm == AlgorithmRule::kThreshold) {
      out << " (one-shot while bytes x world size <= " << format_size(r.oneshot_max_total) << ")";
    }
    if (r.twoshot_needs_tokens_ge_world_size) out << ", two-shot needs tokens >= world size";
    out << "\n";
  }
}

}  // namespace

int cmd_show(const Args& args) {
  po::options_description desc("arbiter show options");
  add_config_option(desc);
  desc.add_options()("help,h", "this help");
  po::variables_map vm = parse(args, desc);
  if (vm.count("help")) {
    std::cout << "usage: arbiter show [--config FILE]...\n\n" << desc;
    return kExitOk;
  }
  std::optional<Policy> policy = load_policy(vm);
  if (!policy) return kExitFailed;
  const Tables& t = policy->tables();
  std::ostringstream out;
  out << "arbiter effective tables, fingerprint " << policy->fingerprint_hex() << "\n";
  out << "sizes are per-rank input bytes, inclusive caps; '-' = no entry (falls back);\n"
         "marks: '*' set by a site file, '+' by an override, unmarked: default.yaml\n\n";
  print_grid(out, *policy, t.fusion, "fusion cap (largest fused message)");
  out << "\n";
  print_grid(out, *policy, t.oneshot,
             "one-shot cap (backends with algorithm oneshot_table: single-node trtllm); "
             "missing cell = " +
                 std::string(algorithm_name(t.oneshot_default)) + " [" +
                 policy->origin_text(t.oneshot_default_origin) + "]");
  out << "\n";
  print_backends(out, *policy);
  if (!t.provenance.empty()) {
    out << "\nprovenance:\n";
    for (const std::string& line : t.provenance) out << "  " << printable(line) << "\n";
  }
  std::cout << out.str();
  return kExitOk;
}

}  // namespace arbiter::cli
