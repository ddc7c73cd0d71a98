#include "arbiter/tuning/plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "arbiter/size.h"
#include "text.h"

namespace arbiter::tuning {
namespace {

using detail::us_text;
using detail::xml_escaped;

constexpr double kWidth = 900;
constexpr double kPanelHeight = 470;
constexpr double kHeader = 50;
// The plot area of a panel, relative to the panel's top left corner.
constexpr double kLeft = 80, kRight = 660, kTop = 70, kBottom = 410;
constexpr double kLegendX = 680;

constexpr const char* kPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd",
                                    "#ff7f0e", "#17becf", "#8c564b", "#e377c2"};

struct BandStyle {
  const char* name;
  const char* fill;
};
constexpr BandStyle kFusedOneshot{"fused one-shot", "#dcefd6"};
constexpr BandStyle kFusedTwoshot{"fused two-shot", "#d8e6f5"};
constexpr BandStyle kFusedNative{"fused (native)", "#f6ecc8"};
constexpr BandStyle kUnfused{"unfused", "#ececec"};
constexpr BandStyle kNoBackend{"no backend", "#f5d5d5"};

const BandStyle& band_style(const Decision& d) {
  if (d.backend == Backend::kNone) return kNoBackend;
  if (!d.fused) return kUnfused;
  if (d.algorithm == Algorithm::kOneshot) return kFusedOneshot;
  if (d.algorithm == Algorithm::kTwoshot) return kFusedTwoshot;
  return kFusedNative;
}

std::string num(double v) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.1f", v);
  return buffer;
}

// Log axes: bytes on powers of two, latency on 1-2-5 steps.
struct Axes {
  double x_lo = 0, x_hi = 0;  // log2 of bytes
  double y_lo = 0, y_hi = 0;  // log10 of us
  double top = 0;             // the panel's offset

  double x(double bytes) const {
    return kLeft + (std::log2(bytes) - x_lo) / (x_hi - x_lo) * (kRight - kLeft);
  }
  double y(double us) const {
    return top + kBottom - (std::log10(us) - y_lo) / (y_hi - y_lo) * (kBottom - kTop);
  }
};

// The 1-2-5 step at or below (up = false) or above (up = true) `v`.
double nice(double v, bool up) {
  const double decade = std::pow(10.0, std::floor(std::log10(v)));
  const double steps[] = {1, 2, 5, 10};
  if (up) {
    for (double s : steps) {
      if (s * decade >= v * (1 - 1e-12)) return s * decade;
    }
    return 10 * decade;
  }
  for (int i = 3; i >= 0; --i) {
    if (steps[i] * decade <= v * (1 + 1e-12)) return steps[i] * decade;
  }
  return decade;
}

// "bytes <= 4 MiB", "4 MiB < bytes <= 16 MiB", for a band that starts at
// `first` on an axis that starts at `axis_first`.
std::string band_range(std::uint64_t first, std::uint64_t last, std::uint64_t axis_first) {
  if (first <= axis_first) return "bytes <= " + format_size(last);
  return format_size(first - 1) + " < bytes <= " + format_size(last);
}

std::string us_label(double us) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%g us", us);
  return buffer;
}

void text(std::string& s, double x, double y, const std::string& content, const char* extra = "") {
  s += "<text x=\"" + num(x) + "\" y=\"" + num(y) + "\"" + extra + ">" + xml_escaped(content) +
       "</text>\n";
}

// The colour of each option, the same in every panel.
using Colours = std::map<Option, std::string>;

void panel(std::string& s, const Group& g, const Policy& policy, const PlotOptions& options,
           const Colours& colours, std::size_t index) {
  const double top = kHeader + kPanelHeight * static_cast<double>(index);
  Axes a;
  a.top = top;
  double lat_min = 0, lat_max = 0;
  for (const Curve& c : g.curves) {
    for (const Point& p : c.points) {
      lat_min = lat_min == 0 ? p.latency_us : std::min(lat_min, p.latency_us);
      lat_max = std::max(lat_max, p.latency_us);
    }
  }
  const std::uint64_t bytes_lo = g.sizes.front(), bytes_hi = g.sizes.back();
  a.x_lo = std::floor(std::log2(static_cast<double>(bytes_lo)));
  a.x_hi = std::ceil(std::log2(static_cast<double>(bytes_hi)));
  if (a.x_hi <= a.x_lo) a.x_hi = a.x_lo + 1;
  double y_lo = nice(lat_min, false), y_hi = nice(lat_max, true);
  if (y_hi <= y_lo) y_hi = nice(y_lo * 1.5, true);
  a.y_lo = std::log10(y_lo);
  a.y_hi = std::log10(y_hi);
  const auto range_lo = static_cast<std::uint64_t>(std::exp2(a.x_lo));
  const auto range_hi = static_cast<std::uint64_t>(std::exp2(a.x_hi));

  s += "<g id=\"panel-" + std::to_string(index + 1) + "\">\n";
  // Title and what the tables say.
  text(s, kLeft, top + 24, g.key.to_string(), " font-size=\"15\" font-weight=\"bold\"");
  const Request request = group_request(g.key, options.topology);
  const std::vector<Band> bands = sweep(policy, request, range_lo, range_hi);
  const std::optional<std::uint64_t> fusion_cap = policy.max_fused_bytes(request);
  std::vector<std::pair<std::uint64_t, std::string>> caps;  // bytes, label
  if (fusion_cap) caps.emplace_back(*fusion_cap, "fusion cap " + format_size(*fusion_cap));
  for (std::size_t i = 0; i + 1 < bands.size(); ++i) {
    const Decision& d = bands[i].decision;
    const Decision& next = bands[i + 1].decision;
    if (d.fused && next.fused && d.algorithm == Algorithm::kOneshot &&
        next.algorithm == Algorithm::kTwoshot) {
      caps.emplace_back(bands[i].last, "one-shot cap " + format_size(bands[i].last));
    }
  }
  std::string subtitle = "device " + (g.device.empty() ? std::string("unknown") : g.device) + "; " +
                         options.tables + ": ";
  if (!fusion_cap) {
    subtitle += "no fusion here";
  } else {
    std::string list;
    for (const auto& [bytes, label] : caps) {
      list += (list.empty() ? "" : ", ") + label;
      if (bytes < range_lo || bytes > range_hi) list += " (off the chart)";
    }
    subtitle += list;
  }
  text(s, kLeft, top + 44, subtitle, " font-size=\"12\" fill=\"#444\"");

  // Bands.
  for (const Band& b : bands) {
    const double x0 = a.x(static_cast<double>(std::max(b.first, range_lo)));
    const double x1 = a.x(static_cast<double>(std::min(b.last + 1, range_hi)));
    const BandStyle& style = band_style(b.decision);
    s += "<rect x=\"" + num(x0) + "\" y=\"" + num(top + kTop) + "\" width=\"" +
         num(std::max(0.0, x1 - x0)) + "\" height=\"" + num(kBottom - kTop) + "\" fill=\"" +
         style.fill + "\"><title>" + xml_escaped(style.name) + ": " +
         xml_escaped(decision_label(b.decision) + ", " + band_range(b.first, b.last, range_lo)) +
         "</title></rect>\n";
  }
  s += "<rect x=\"" + num(kLeft) + "\" y=\"" + num(top + kTop) + "\" width=\"" +
       num(kRight - kLeft) + "\" height=\"" + num(kBottom - kTop) +
       "\" fill=\"none\" stroke=\"#333\"/>\n";

  // Ticks and grid.
  const int x_count = static_cast<int>(a.x_hi - a.x_lo);
  const int x_step = std::max(1, (x_count + 9) / 10);
  for (int e = static_cast<int>(a.x_lo); e <= static_cast<int>(a.x_hi); e += x_step) {
    const double bytes = std::exp2(e);
    const double x = a.x(bytes);
    s += "<line x1=\"" + num(x) + "\" y1=\"" + num(top + kTop) + "\" x2=\"" + num(x) + "\" y2=\"" +
         num(top + kBottom) + "\" stroke=\"#ffffff\" stroke-width=\"1\"/>\n";
    s += "<line x1=\"" + num(x) + "\" y1=\"" + num(top + kBottom) + "\" x2=\"" + num(x) +
         "\" y2=\"" + num(top + kBottom + 5) + "\" stroke=\"#333\"/>\n";
    text(s, x, top + kBottom + 18, format_size(static_cast<std::uint64_t>(bytes)),
         " font-size=\"11\" text-anchor=\"middle\"");
  }
  text(s, (kLeft + kRight) / 2, top + kBottom + 38, "message size per rank (bytes, log scale)",
       " font-size=\"12\" text-anchor=\"middle\"");
  const double decades = a.y_hi - a.y_lo;
  for (double decade = std::floor(a.y_lo); decade <= std::ceil(a.y_hi); decade += 1) {
    for (double step : {1.0, 2.0, 5.0}) {
      if (decades > 3 && step != 1.0) continue;
      const double us = step * std::pow(10.0, decade);
      const double l = std::log10(us);
      if (l < a.y_lo - 1e-9 || l > a.y_hi + 1e-9) continue;
      const double y = a.y(us);
      s += "<line x1=\"" + num(kLeft) + "\" y1=\"" + num(y) + "\" x2=\"" + num(kRight) +
           "\" y2=\"" + num(y) + "\" stroke=\"#ffffff\" stroke-width=\"1\"/>\n";
      s += "<line x1=\"" + num(kLeft - 5) + "\" y1=\"" + num(y) + "\" x2=\"" + num(kLeft) +
           "\" y2=\"" + num(y) + "\" stroke=\"#333\"/>\n";
      text(s, kLeft - 8, y + 4, us_label(us), " font-size=\"11\" text-anchor=\"end\"");
    }
  }
  text(s, 18, top + (kTop + kBottom) / 2, "latency (us, log scale)",
       (" font-size=\"12\" text-anchor=\"middle\" transform=\"rotate(-90 18 " +
        num(top + (kTop + kBottom) / 2) + ")\"")
           .c_str());

  // Caps the tables imply; labels staggered so that close caps stay legible.
  double label_y = top + kTop + 12;
  for (const auto& [bytes, label] : caps) {
    if (bytes < range_lo || bytes > range_hi) continue;
    const double x = a.x(static_cast<double>(bytes));
    s += "<line x1=\"" + num(x) + "\" y1=\"" + num(top + kTop) + "\" x2=\"" + num(x) + "\" y2=\"" +
         num(top + kBottom) +
         "\" stroke=\"#000\" stroke-width=\"1.5\" stroke-dasharray=\"4 3\"><title>" +
         xml_escaped(label) + "</title></line>\n";
    text(s, x + 3, label_y, label, " font-size=\"11\"");
    label_y += 14;
  }

  // Curves, then the legend.
  double legend_y = top + kTop + 4;
  for (std::size_t i = 0; i < g.curves.size(); ++i) {
    const Curve& c = g.curves[i];
    const std::string& colour = colours.at(c.option);
    const std::string dash = c.option.fused ? "" : " stroke-dasharray=\"6 3\"";
    std::string points;
    for (const Point& p : c.points) {
      if (!points.empty()) points += ' ';
      points += num(a.x(static_cast<double>(p.bytes))) + "," + num(a.y(p.latency_us));
    }
    s += "<polyline points=\"" + points + "\" fill=\"none\" stroke=\"" + colour +
         "\" stroke-width=\"2\"" + dash + "><title>" + xml_escaped(c.option.label()) +
         "</title></polyline>\n";
    for (const Point& p : c.points) {
      s += "<circle cx=\"" + num(a.x(static_cast<double>(p.bytes))) + "\" cy=\"" +
           num(a.y(p.latency_us)) + "\" r=\"3\" fill=\"" + colour + "\"><title>" +
           xml_escaped(c.option.label() + ", " + format_size(p.bytes) + ": " +
                       us_text(p.latency_us)) +
           "</title></circle>\n";
    }
    legend_y += 18;
    s += "<line x1=\"" + num(kLegendX) + "\" y1=\"" + num(legend_y - 4) + "\" x2=\"" +
         num(kLegendX + 24) + "\" y2=\"" + num(legend_y - 4) + "\" stroke=\"" + colour +
         "\" stroke-width=\"2\"" + dash + "/>\n";
    text(s, kLegendX + 30, legend_y, c.option.label(), " font-size=\"12\"");
  }
  legend_y += 26;
  text(s, kLegendX, legend_y, "the tables decide:", " font-size=\"12\" font-weight=\"bold\"");
  for (const BandStyle* style :
       {&kFusedOneshot, &kFusedTwoshot, &kFusedNative, &kUnfused, &kNoBackend}) {
    const bool used = std::any_of(bands.begin(), bands.end(),
                                  [&](const Band& b) { return &band_style(b.decision) == style; });
    if (!used) continue;
    legend_y += 18;
    s += "<rect x=\"" + num(kLegendX) + "\" y=\"" + num(legend_y - 11) +
         "\" width=\"24\" height=\"12\" fill=\"" + style->fill + "\" stroke=\"#999\"/>\n";
    text(s, kLegendX + 30, legend_y, style->name, " font-size=\"12\"");
  }
  s += "</g>\n";
}

}  // namespace

std::string plot_svg(const std::vector<Group>& groups, const Policy& policy,
                     const PlotOptions& options) {
  const double height = kHeader + kPanelHeight * static_cast<double>(groups.size());
  std::string s = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  s += "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"" + num(kWidth) +
       "\" height=\"" + num(height) + "\" viewBox=\"0 0 " + num(kWidth) + " " + num(height) +
       "\" font-family=\"sans-serif\">\n";
  s += "<title>" + xml_escaped(options.title) + "</title>\n";
  s += "<rect x=\"0\" y=\"0\" width=\"" + num(kWidth) + "\" height=\"" + num(height) +
       "\" fill=\"#ffffff\"/>\n";
  text(s, kLeft, 30, options.title, " font-size=\"18\" font-weight=\"bold\"");
  Colours colours;
  for (const Group& g : groups) {
    for (const Curve& c : g.curves) colours.emplace(c.option, std::string());
  }
  std::size_t next = 0;
  for (auto& [option, colour] : colours) colour = kPalette[next++ % std::size(kPalette)];
  for (std::size_t i = 0; i < groups.size(); ++i) {
    panel(s, groups[i], policy, options, colours, i);
  }
  s += "</svg>\n";
  return s;
}

}  // namespace arbiter::tuning
