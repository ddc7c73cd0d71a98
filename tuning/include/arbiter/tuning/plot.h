// Latency charts: one SVG 1.1 document (plain elements only: rect, line,
// polyline, circle, text, g, title), one panel per group, stacked.
//
// Each panel plots latency (us) against message size on log-log axes, with
// binary size ticks (16 KiB, 1 MiB, ...). Every option measured is one
// <polyline> (unfused options dashed) with a <circle> per point; the legend
// names backend, algorithm and fused. Behind the curves, bands show what the
// tables decide over each size range (fused one-shot, fused two-shot, fused
// native, unfused, no backend) for the group's request without a token
// count, and dashed vertical lines mark the fusion cap and the one-shot cap
// those tables imply, when they fall inside the plotted range.
#pragma once

#include <string>
#include <vector>

#include "arbiter/policy.h"
#include "arbiter/tuning/groups.h"
#include "arbiter/tuning/regret.h"

namespace arbiter::tuning {

struct PlotOptions {
  TopologyFlags topology;
  std::string title = "arbiter plot";
  // Shown under the title: which tables the bands and caps come from.
  std::string tables = "the default tables";
};

std::string plot_svg(const std::vector<Group>& groups, const Policy& policy,
                     const PlotOptions& options);

}  // namespace arbiter::tuning
