// The site file `arbiter tune` writes: the caps derived from measurements as
// a table layer in the format of schema/FORMAT.md.
//
// Cells are keyed so that a measurement changes only what it measured:
//   fusion   {capability, world_size, nodes, pattern, max}: a GPU cell names
//            its node count, one node included, so that a one-node
//            measurement leaves multi-node calls to the cells that covered
//            them (and a one-node replicated cell and a 2-node cell cannot
//            both match a call). cpu cells carry no `nodes` key (shm runs on
//            one node only).
//   oneshot  {capability, world_size, pattern, max}: single-node trtllm's
//            one-shot cap, and on cpu shm's one-shot split (below).
// The tables are not keyed by dtype: each cell's comment names the dtype
// measured. When several dtypes of one (capability, world size, nodes,
// pattern) give different caps the smaller is written (`off` is smaller than
// any size) and the comment says so. A one-shot cap above the fusion cap
// written for the same cell is lowered to it (above the fusion cap nothing
// is fused). A one-shot split that is `off` (two-shot won from the smallest
// size) writes no cell: a one-shot cell cannot say `off`.
//
// Backends with `algorithm: threshold` (shm, mnnvl) take one threshold for
// every world size: `backends.<name>.oneshot_max_total`, one-shot while
// bytes x world size <= it. shm on CPU ranks reads a cpu one-shot cell
// first, so each cpu group's split is such a cell {capability: cpu,
// world_size, pattern, max: split} (a 2-rank call no longer runs the
// two-shot a 4-rank split sets), and the threshold stays as it was for the
// world sizes not measured. mnnvl's (GPU) groups measuring both algorithms
// give their split x world size; the smallest is written, so one-shot runs
// only where every group measured it winning. A group where one-shot lost
// from the smallest size writes none (the note says so).
//
// Groups measured with a replicated residual (ARBITER_RUN_RESIDUAL_REPLICATED,
// `arbiter bench --residual-replicated`) write cells keyed `residual:
// replicated`, which win over the unkeyed cells for such calls only; the
// other groups write no residual key. Their split never feeds
// oneshot_max_total (it serves every call): on capability cpu it is a
// one-shot cell keyed `residual: replicated` as above. On GPUs (mnnvl) such
// a split is a note: only cpu one-shot cells set a threshold backend's
// split.
//
// Fusion caps weigh the fused option the tables run at each size (the
// backend their preference picks, one-shot or two-shot by the one-shot cells
// and thresholds written here): `arbiter tune` derives the one-shot rules
// first, loads them over the current tables, then the fusion caps
// (OverlayOptions::fused_run). A faster fused backend the tables would not
// run never raises a cap.
//
// Groups measured in registered memory (`arbiter bench --registered`) are
// treated the same way with the key `buffers: registered` (both keys for a
// group that is both): their cells win over the unkeyed ones for calls whose
// input is registered, and on cpu their shm split is a one-shot cell keyed
// so.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "arbiter/tuning/groups.h"
#include "arbiter/tuning/results.h"

namespace arbiter::tuning {

struct OverlayOptions {
  double margin_pct = 0;
  // Used as the provenance date when no results file has a `# date:` line.
  std::string date;
  // Provenance `tool`; empty: "arbiter tune VERSION".
  std::string tool;
  // The fused option the tables run, by group and size (see fusion_cap());
  // empty: the best fused option measured.
  std::function<FusedRun(const Group&)> fused_run;
  // The fused cap the current tables give the group's calls (std::nullopt:
  // none). Where fused won at every size measured and this cap is at least
  // the largest of them, no fusion cell is written (a note says so): nothing
  // measured argues for lowering it. Empty: cells are always written.
  std::function<std::optional<std::uint64_t>(const Group&)> current_cap;
  // false: no fusion cells (nor one-shot cells lowered to them): the one-shot
  // rules alone, the tables fused_run must read.
  bool fusion_cells = true;
};

struct OverlayCell {
  Capability capability;
  std::uint32_t world_size = 0;
  std::uint32_t nodes = 0;  // 0: no nodes key
  Pattern pattern = Pattern::kAllreduce;
  std::optional<Residual> residual;   // set (replicated) for replicated groups only
  std::optional<BufferKind> buffers;  // set (registered) for registered groups only
  bool off = false;
  std::uint64_t bytes = 0;
  std::string comment;  // without the leading '#'
};

// backends.<backend>.oneshot_max_total.
struct OverlayThreshold {
  std::string backend;
  std::uint64_t bytes = 0;
  std::string comment;  // without the leading '#'
};

struct Overlay {
  std::vector<OverlayCell> fusion;
  std::vector<OverlayCell> oneshot;
  std::vector<OverlayThreshold> thresholds;
  // What a reader of the report should know: dtypes that disagreed, caps
  // lowered, scopes left without a cell and why.
  std::vector<std::string> notes;
  std::string yaml;  // the whole file
};

// `groups` as accepted by group_results(); `files` give the provenance.
Overlay make_overlay(const std::vector<Group>& groups, const std::vector<ResultsFile>& files,
                     const OverlayOptions& options);

}  // namespace arbiter::tuning
