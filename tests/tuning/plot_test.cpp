// Charts: a well-formed SVG 1.1 document with one polyline per option
// measured, binary size ticks, and what the tables decide behind the curves.
#define BOOST_TEST_MODULE tuning_plot
#include <boost/test/unit_test.hpp>

#include <vector>

#include "arbiter/tuning/overlay.h"
#include "arbiter/tuning/plot.h"
#include "tune_data.h"

using namespace arbiter;
using namespace arbiter::tuning;
using namespace arbiter::test;

namespace {

int count(const std::string& haystack, const std::string& needle) {
  int n = 0;
  for (std::size_t at = haystack.find(needle); at != std::string::npos;
       at = haystack.find(needle, at + 1)) {
    ++n;
  }
  return n;
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// A minimal XML check: one root element, tags that balance, attributes
// quoted, no raw '>' or unknown entity in text. Empty when well formed.
std::string xml_problem(const std::string& s) {
  if (!s.starts_with("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n")) return "no XML declaration";
  std::vector<std::string> open;
  bool root_closed = false;
  for (std::size_t i = s.find('\n') + 1; i < s.size();) {
    if (s[i] == '<') {
      const std::size_t end = s.find('>', i);
      if (end == std::string::npos) return "unclosed tag";
      const std::string tag = s.substr(i + 1, end - i - 1);
      if (count(tag, "\"") % 2 != 0) return "unbalanced quotes in <" + tag + ">";
      if (tag.starts_with("/")) {
        if (open.empty() || open.back() != tag.substr(1)) return "mismatched <" + tag + ">";
        open.pop_back();
        root_closed = open.empty();
      } else {
        if (root_closed || (open.empty() && !tag.starts_with("svg "))) return "a second root";
        if (!tag.ends_with("/")) open.push_back(tag.substr(0, tag.find(' ')));
      }
      i = end + 1;
    } else if (s[i] == '&') {
      const std::size_t end = s.find(';', i);
      const std::string entity = s.substr(i, end - i + 1);
      if (entity != "&amp;" && entity != "&lt;" && entity != "&gt;" && entity != "&quot;" &&
          entity != "&apos;") {
        return "unknown entity " + entity;
      }
      i = end + 1;
    } else {
      if (s[i] == '>') return "raw '>' in text";
      if (open.empty() && s[i] != '\n') return "text outside the root";
      ++i;
    }
  }
  if (!open.empty()) return "unclosed <" + open.back() + ">";
  return root_closed ? "" : "no root element";
}

// The text of the <title> children of every <polyline>.
std::vector<std::string> polyline_titles(const std::string& svg) {
  std::vector<std::string> titles;
  for (std::size_t at = svg.find("<polyline "); at != std::string::npos;
       at = svg.find("<polyline ", at + 1)) {
    const std::size_t open = svg.find("<title>", at);
    const std::size_t close = svg.find("</title>", open);
    titles.push_back(svg.substr(open + 7, close - open - 7));
  }
  return titles;
}

}  // namespace

BOOST_AUTO_TEST_CASE(one_polyline_per_option_in_a_well_formed_svg) {
  const auto data = load_fixtures({"crossover.csv"});
  const std::string svg = plot_svg(data->grouping.groups, tables_with(), PlotOptions{});
  BOOST_TEST(xml_problem(svg) == "");
  BOOST_TEST(contains(svg, "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\""));
  BOOST_TEST(svg.ends_with("</svg>\n"));
  BOOST_TEST(count(svg, "<polyline ") == 3);
  const std::vector<std::string> titles = polyline_titles(svg);
  BOOST_TEST(titles == (std::vector<std::string>{"nccl native unfused", "trtllm oneshot fused",
                                                 "trtllm twoshot fused"}),
             boost::test_tools::per_element());
  // Each polyline has a point per measured size.
  const std::size_t at = svg.find("<polyline points=\"");
  const std::string points = svg.substr(at + 18, svg.find('"', at + 18) - at - 18);
  BOOST_TEST(count(points, ",") == 9);
  BOOST_TEST(count(svg, "<circle ") == 27);
  // The legend names backend, algorithm and fused.
  BOOST_TEST(contains(svg, ">trtllm twoshot fused</text>"));
  BOOST_TEST(contains(svg, ">nccl native unfused</text>"));
}

BOOST_AUTO_TEST_CASE(axes_have_binary_size_ticks) {
  const auto data = load_fixtures({"crossover.csv"});
  const std::string svg = plot_svg(data->grouping.groups, tables_with(), PlotOptions{});
  for (const char* tick : {">64 KiB<", ">128 KiB<", ">512 KiB<", ">1 MiB<", ">16 MiB<"}) {
    BOOST_TEST(contains(svg, tick), tick);
  }
  BOOST_TEST(contains(svg, ">10 us<"));
  BOOST_TEST(contains(svg, ">100 us<"));
}

BOOST_AUTO_TEST_CASE(bands_and_caps_show_what_the_tables_decide) {
  const auto data = load_fixtures({"crossover.csv"});
  // Default (100, 4): one-shot up to 4 MiB, then two-shot; fused up to 32 MiB.
  const std::string defaults = plot_svg(data->grouping.groups, tables_with(), PlotOptions{});
  BOOST_TEST(
      contains(defaults, "<title>fused one-shot: trtllm oneshot fused, bytes &lt;= 4 MiB</title>"));
  BOOST_TEST(contains(defaults,
                      "<title>fused two-shot: trtllm twoshot fused, 4 MiB &lt; bytes &lt;= 16 "
                      "MiB</title>"));
  BOOST_TEST(contains(defaults, ">one-shot cap 4 MiB</text>"));
  BOOST_TEST(contains(defaults, "fusion cap 32 MiB (off the chart)"));
  BOOST_TEST(!contains(defaults, ">fusion cap"));

  // With the tuned overlay: one-shot to 256 KiB, fused to 4 MiB, then unfused.
  OverlayOptions options;
  const Overlay o = make_overlay(data->grouping.groups, data->files, options);
  const std::string tuned = plot_svg(data->grouping.groups, tables_with(o.yaml), PlotOptions{});
  BOOST_TEST(xml_problem(tuned) == "");
  BOOST_TEST(contains(tuned, ">one-shot cap 256 KiB</text>"));
  BOOST_TEST(contains(tuned, ">fusion cap 4 MiB</text>"));
  BOOST_TEST(contains(tuned, "<title>unfused: nccl native unfused"));
  BOOST_TEST(contains(tuned, ">unfused</text>"));  // in the legend
  BOOST_TEST(count(tuned, "stroke-dasharray=\"4 3\"") == 2);
}

BOOST_AUTO_TEST_CASE(one_panel_per_group) {
  const auto data =
      load_fixtures({"crossover.csv", "noisy.csv", "gb300_ws16_vllm46392.csv", "dtypes.csv"});
  PlotOptions options;
  options.topology = TopologyFlags{true, true};
  const std::string svg = plot_svg(data->grouping.groups, tables_with(), options);
  BOOST_TEST(xml_problem(svg) == "");
  BOOST_TEST(count(svg, "<g id=\"panel-") == 5);
  BOOST_TEST(count(svg, "<polyline ") == 3 + 3 + 2 + 2 + 2);
  BOOST_TEST(contains(svg, ">capability 103, world size 16, 4 nodes, allreduce, bf16</text>"));
  // The multi-node panel, with NVLink domain and multicast: mnnvl two-shot.
  BOOST_TEST(contains(svg, "<title>fused two-shot: mnnvl twoshot fused"));
}

BOOST_AUTO_TEST_CASE(text_is_escaped) {
  const std::string csv = "# device: <GPU & \"co\">\n" + std::string(kHeader) +
                          "90,2,1,bf16,4096,32,262144,allreduce,trtllm,oneshot,1,10\n"
                          "90,2,1,bf16,4096,32,262144,allreduce,<b>&amp;,x'y,0,12\n"
                          "90,2,1,bf16,4096,64,524288,allreduce,trtllm,oneshot,1,14\n";
  const auto data = parse_csv(csv);
  PlotOptions options;
  options.title = "a < b & c";
  const std::string svg = plot_svg(data->grouping.groups, tables_with(), options);
  BOOST_TEST(xml_problem(svg) == "", svg);
  BOOST_TEST(contains(svg, "device &lt;GPU &amp; &quot;co&quot;&gt;"));
  BOOST_TEST(contains(svg, ">&lt;b&gt;&amp;amp; x&apos;y unfused</text>"));
  BOOST_TEST(contains(svg, "<title>a &lt; b &amp; c</title>"));
}
