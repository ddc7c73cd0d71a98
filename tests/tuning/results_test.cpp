// Reading benchmark CSVs: what is accepted, what is skipped with a note, and
// errors that name the file, the line and the column.
#define BOOST_TEST_MODULE tuning_results
#include <boost/test/unit_test.hpp>

#include "arbiter/size.h"
#include "arbiter/tuning/results.h"
#include "tune_data.h"

using namespace arbiter;
using namespace arbiter::tuning;
using namespace arbiter::test;

namespace {

bool contains_text(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// The single error of parsing `body` under the standard header.
Diagnostic only_error(const std::string& body, const std::string& header = kHeader) {
  const ReadResult r = parse_results("r.csv", header + body);
  BOOST_TEST(!r.file.has_value());
  BOOST_TEST_REQUIRE(r.diagnostics.size() == 1u);
  return r.diagnostics.front();
}

const std::string kGoodRow = "90,2,1,bf16,4096,32,262144,residual_rmsnorm,trtllm,oneshot,1,10\n";

}  // namespace

BOOST_AUTO_TEST_CASE(columns_in_any_order_with_extras_and_provenance) {
  const ReadResult r = read_results(tune_path("crossover.csv"));
  BOOST_TEST_REQUIRE(r.file.has_value());
  const ResultsFile& f = *r.file;
  BOOST_TEST(f.rows.size() == 27u);
  BOOST_TEST(f.notes.empty());
  BOOST_TEST(f.provenance_value("device") == "NVIDIA B200");
  BOOST_TEST(f.provenance_value("driver") == "570.86");
  BOOST_TEST(f.provenance_value("nccl_version") == "2.26.2");
  BOOST_TEST(f.provenance_value("date") == "2025-08-01");
  const Row& first = f.rows.front();
  BOOST_TEST(first.line == 12u);
  BOOST_TEST(first.capability.code() == 100);
  BOOST_TEST(first.world_size == 4u);
  BOOST_TEST(first.nodes == 1u);
  BOOST_TEST((first.dtype == Dtype::kBf16));
  BOOST_TEST((first.pattern == Pattern::kResidualRmsnorm));
  BOOST_TEST(first.backend == "trtllm");
  BOOST_TEST(first.algorithm == "oneshot");
  BOOST_TEST(first.fused);
  BOOST_TEST(first.bytes == 64 * kKiB);
  BOOST_TEST(first.num_tokens == 8u);
  BOOST_TEST(first.hidden == 4096u);
  BOOST_TEST(first.latency_us == 8.0);
  BOOST_TEST(first.device == "NVIDIA B200");  // from `# device:`
}

BOOST_AUTO_TEST_CASE(skipped_rows_are_left_out_with_a_note_naming_the_line) {
  const ReadResult r = read_results(tune_path("skipped.csv"));
  BOOST_TEST_REQUIRE(r.file.has_value());
  BOOST_TEST(r.file->rows.size() == 6u);
  BOOST_TEST_REQUIRE(r.file->notes.size() == 2u);
  // The reason is a quoted field holding a comma.
  BOOST_TEST(ends_with(r.file->notes[0],
                       "skipped.csv:9: note: row skipped (status skipped: workspace of 64 MiB "
                       "failed, out of memory)"),
             r.file->notes[0]);
  BOOST_TEST(ends_with(r.file->notes[1], "skipped.csv:10: note: row skipped (no latency_us)"),
             r.file->notes[1]);
}

BOOST_AUTO_TEST_CASE(a_skipped_column_and_its_reason) {
  const ReadResult r = parse_results(
      "r.csv", std::string(kHeader).insert(std::string(kHeader).size() - 1, ",skipped,reason") +
                   "90,2,1,bf16,4096,32,262144,residual_rmsnorm,trtllm,oneshot,1,10,0,\n"
                   "90,2,1,bf16,4096,32,262144,residual_rmsnorm,mnnvl,oneshot,1,,1,no multicast\n"
                   "90,2,1,bf16,4096,32,262144,residual_rmsnorm,nccl,native,0,12,false,\n");
  BOOST_TEST_REQUIRE(r.file.has_value());
  BOOST_TEST(r.file->rows.size() == 2u);
  BOOST_TEST_REQUIRE(r.file->notes.size() == 1u);
  BOOST_TEST(r.file->notes[0] == "r.csv:3: note: row skipped (skipped: no multicast)");
}

BOOST_AUTO_TEST_CASE(a_missing_column_is_named_at_the_header_line) {
  const ReadResult r = read_results(tune_path("bad_missing_column.csv"));
  BOOST_TEST(!r.file.has_value());
  BOOST_TEST(!r.unreadable);
  BOOST_TEST_REQUIRE(r.diagnostics.size() == 1u);
  BOOST_TEST(r.diagnostics[0].line == 2u);
  BOOST_TEST(r.diagnostics[0].message == "header: missing column latency_us");
  BOOST_TEST(ends_with(r.diagnostics[0].file, "bad_missing_column.csv"));
}

BOOST_AUTO_TEST_CASE(a_bad_number_names_file_line_and_column) {
  const ReadResult r = read_results(tune_path("bad_number.csv"));
  BOOST_TEST(!r.file.has_value());
  BOOST_TEST_REQUIRE(r.diagnostics.size() == 1u);
  const std::string text = r.diagnostics[0].to_string();
  BOOST_TEST(
      ends_with(text, "bad_number.csv:14: error: column latency_us: \"abc\" is not a number"),
      text);
}

BOOST_AUTO_TEST_CASE(a_bad_capability_names_file_line_and_column) {
  const ReadResult r = read_results(tune_path("bad_capability.csv"));
  BOOST_TEST_REQUIRE(r.diagnostics.size() == 1u);
  BOOST_TEST(r.diagnostics[0].line == 5u);
  BOOST_TEST(r.diagnostics[0].message.starts_with("column capability: unknown capability 'sm_90a'"),
             r.diagnostics[0].message);
}

BOOST_AUTO_TEST_CASE(capabilities_are_spelled_as_in_the_tables) {
  const ReadResult r = parse_results(
      "r.csv", std::string(kHeader) +
                   "\"10.3\",2,1,bf16,4096,32,262144,allreduce,trtllm,oneshot,true,10\n"
                   "sm_100,2,1,bf16,4096,32,262144,allreduce,trtllm,oneshot,TRUE,10\n"
                   "sm90,2,1,bf16,4096,32,262144,allreduce,nccl,native,false,10\n"
                   "cpu,2,1,fp32,4096,32,524288,allreduce,shm,native,0,10\n");
  BOOST_TEST_REQUIRE(r.file.has_value());
  BOOST_TEST(r.file->rows[0].capability.code() == 103);
  BOOST_TEST(r.file->rows[1].capability.code() == 100);
  BOOST_TEST(r.file->rows[2].capability.code() == 90);
  BOOST_TEST(r.file->rows[3].capability.is_cpu());
  BOOST_TEST(r.file->rows[0].fused);
  BOOST_TEST(!r.file->rows[2].fused);
}

BOOST_AUTO_TEST_CASE(each_field_is_checked_and_named) {
  struct Case {
    const char* row;
    const char* message;
  };
  const Case cases[] = {
      {"90,1,1,bf16,4096,32,262144,allreduce,trtllm,oneshot,1,10",
       "column world_size: \"1\" is outside 2..1024"},
      {"90,2,3,bf16,4096,32,262144,allreduce,trtllm,oneshot,1,10",
       "column nodes: \"3\" is more than the world size 2"},
      {"90,2,1,fp8,4096,32,262144,allreduce,trtllm,oneshot,1,10", "column dtype: unknown dtype"},
      {"90,2,1,BF16,4096,32,262144,allreduce,trtllm,oneshot,1,10", "column dtype: unknown dtype"},
      {"90,2,1,bf16,4096,32,262144,rmsnorm,trtllm,oneshot,1,10", "column pattern: unknown pattern"},
      {"90,2,1,bf16,4096,32,262144,allreduce,baseline,oneshot,1,10",
       "column backend: a fused row must name a backend the tables can choose"},
      {"90,2,1,bf16,4096,32,262144,allreduce,trtllm,auto,1,10",
       "column algorithm: a fused row must name oneshot, twoshot or native"},
      {"90,2,1,bf16,4096,32,262144,allreduce,trtllm,oneshot,yes,10",
       "column fused: \"yes\" is not 1, 0, true or false"},
      {"90,2,1,bf16,4096,32,262145,allreduce,trtllm,oneshot,1,10",
       "column bytes: \"262145\" is not num_tokens x hidden x element size (32 x 4096 x 2 for "
       "bf16)"},
      {"90,2,1,fp32,4096,32,262144,allreduce,trtllm,oneshot,1,10",
       "column bytes: \"262144\" is not num_tokens x hidden x element size (32 x 4096 x 4 for "
       "fp32)"},
      {"90,2,1,bf16,4096,32,2.5e5,allreduce,trtllm,oneshot,1,10",
       "column bytes: \"2.5e5\" is not a whole number"},
      {"90,2,1,bf16,4096,-32,262144,allreduce,trtllm,oneshot,1,10",
       "column num_tokens: \"-32\" is not a whole number"},
      {"90,2,1,bf16,0,32,262144,allreduce,trtllm,oneshot,1,10",
       "column hidden: \"0\" is outside 1..4294967295"},
      {"90,2,1,bf16,4096,32,262144,allreduce,trtllm,oneshot,1,0",
       "column latency_us: \"0\" is not positive"},
      {"90,2,1,bf16,4096,32,262144,allreduce,trtllm,oneshot,1,-3",
       "column latency_us: \"-3\" is not positive"},
      {"90,2,1,bf16,4096,32,262144,allreduce,trtllm,oneshot,1,nan",
       "column latency_us: \"nan\" is not a number"},
      {"90,2,1,bf16,4096,32,262144,allreduce,trtllm,oneshot,1,inf",
       "column latency_us: \"inf\" is not a number"},
      {"90,2,1,bf16,4096,32,262144,allreduce,trtllm,oneshot,1,10us",
       "column latency_us: \"10us\" is not a number"},
      {"90,2,1,bf16,4096,32,262144,allreduce,,native,0,10", "column backend: empty"},
      {"90,2,1,bf16,4096,32,262144,allreduce,trtllm,oneshot,1", "the row has 11 fields"},
      {"90,2,1,bf16,4096,32,262144,allreduce,trtllm,oneshot,1,10,7", "the row has 13 fields"},
      {"90,2,1,bf16,4096,32,262144,allreduce,trtl\"lm,oneshot,1,10",
       "a quote inside an unquoted field"},
      {"90,2,1,bf16,4096,32,262144,allreduce,\"trtllm\"x,oneshot,1,10",
       "unexpected text after a quoted field"},
      {"90,2,1,bf16,4096,32,262144,allreduce,\"trtllm,oneshot,1,10",
       "a quoted field is not closed before the end of the file"},
  };
  for (const Case& c : cases) {
    BOOST_TEST_CONTEXT(c.row) {
      const Diagnostic d = only_error(std::string(c.row) + "\n");
      BOOST_TEST(d.line == 2u);
      BOOST_TEST(d.file == "r.csv");
      BOOST_TEST(d.message.starts_with(c.message), d.message);
    }
  }
}

BOOST_AUTO_TEST_CASE(unfused_rows_may_name_any_baseline) {
  const ReadResult r = parse_results(
      "r.csv", std::string(kHeader) +
                   "90,2,1,bf16,4096,32,262144,allreduce,baseline,sum+norm,0,10\n"
                   "90,2,1,bf16,4096,32,262144,allreduce,\"torch, compiled\",\"native\",0,11\n");
  BOOST_TEST_REQUIRE(r.file.has_value());
  BOOST_TEST(r.file->rows[0].backend == "baseline");
  BOOST_TEST(r.file->rows[0].algorithm == "sum+norm");
  BOOST_TEST(r.file->rows[1].backend == "torch, compiled");
}

BOOST_AUTO_TEST_CASE(the_header_must_name_each_column_once) {
  const ReadResult twice = parse_results("t.csv", "capability,capability,world_size\n");
  BOOST_TEST_REQUIRE(!twice.diagnostics.empty());
  BOOST_TEST(twice.diagnostics[0].message == "header: column capability appears twice");
  BOOST_TEST(twice.diagnostics[0].line == 1u);
  const ReadResult empty = parse_results("e.csv", "# only comments\n\n");
  BOOST_TEST_REQUIRE(empty.diagnostics.size() == 1u);
  BOOST_TEST(empty.diagnostics[0].message.starts_with("no header line"));
  const ReadResult several = parse_results("m.csv", "capability,bytes\n");
  BOOST_TEST_REQUIRE(several.diagnostics.size() == 1u);
  BOOST_TEST(several.diagnostics[0].message.starts_with(
      "header: missing columns world_size, nodes, dtype, hidden"));
}

BOOST_AUTO_TEST_CASE(crlf_line_ends_blank_lines_and_later_comments_are_fine) {
  const ReadResult r = parse_results(
      "r.csv", "# device: X\r\n" +
                   std::string(kHeader).insert(std::string(kHeader).size() - 1, "\r") + "\r\n" +
                   "90,2,1,bf16,4096,32,262144,allreduce,trtllm,oneshot,1,10\r\n" +
                   "# a note written while measuring\r\n" +
                   "90,2,1,bf16,4096,64,524288,allreduce,trtllm,oneshot,1,12.5\r\n");
  BOOST_TEST_REQUIRE(r.file.has_value());
  BOOST_TEST(r.file->rows.size() == 2u);
  BOOST_TEST(r.file->rows[1].line == 6u);
  BOOST_TEST(r.file->rows[1].latency_us == 12.5);
  BOOST_TEST(r.file->rows[1].device == "X");
}

BOOST_AUTO_TEST_CASE(a_device_column_wins_over_the_provenance_line) {
  const ReadResult r = parse_results(
      "r.csv", "# device: from the comment\n" +
                   std::string(kHeader).insert(std::string(kHeader).size() - 1, ",device") +
                   "90,2,1,bf16,4096,32,262144,allreduce,trtllm,oneshot,1,10,H100\n"
                   "90,2,1,bf16,4096,32,262144,allreduce,nccl,native,0,10,\n");
  BOOST_TEST_REQUIRE(r.file.has_value());
  BOOST_TEST(r.file->rows[0].device == "H100");
  BOOST_TEST(r.file->rows[1].device == "from the comment");
}

BOOST_AUTO_TEST_CASE(every_error_of_a_file_is_reported) {
  const ReadResult r = parse_results(
      "r.csv", std::string(kHeader) + kGoodRow + "90,2,1,bf16,4096,32,262144,allreduce,x,y,1,1\n" +
                   kGoodRow + "sm_1,2,1,bf16,1,1,2,allreduce,a,b,0,1\n");
  BOOST_TEST(!r.file.has_value());
  BOOST_TEST_REQUIRE(r.diagnostics.size() == 3u);
  BOOST_TEST(r.diagnostics[0].line == 3u);
  BOOST_TEST(r.diagnostics[1].line == 3u);
  BOOST_TEST(r.diagnostics[2].line == 5u);
}

BOOST_AUTO_TEST_CASE(unreadable_files_and_files_given_twice) {
  const ReadResult missing = read_results(tune_path("no_such_file.csv"));
  BOOST_TEST(missing.unreadable);
  BOOST_TEST_REQUIRE(missing.diagnostics.size() == 1u);
  BOOST_TEST(missing.diagnostics[0].message == "cannot read the file");
  BOOST_TEST(read_results(data_path("tune")).unreadable);
  // /dev/zero was read until memory ran out.
  const ReadResult endless = read_results("/dev/zero");
  BOOST_TEST(endless.unreadable);
  BOOST_TEST_REQUIRE(endless.diagnostics.size() == 1u);
  BOOST_TEST(endless.diagnostics[0].message ==
             "the file is larger than 256 MiB: not a results CSV");

  const ResultsSet twice = read_all_results(
      {tune_path("crossover.csv"), tune_path("noisy.csv"), tune_path("crossover.csv")});
  BOOST_TEST(twice.unreadable);
  BOOST_TEST(twice.files.size() == 2u);
  BOOST_TEST_REQUIRE(twice.errors.size() == 1u);
  BOOST_TEST(twice.errors[0].message.starts_with("given more than once"));
}

// The optional residual column: replicated or distinct for the residual
// patterns (empty or absent: distinct), nothing for allreduce.
BOOST_AUTO_TEST_CASE(the_residual_column_is_optional_and_distinct_by_default) {
  const std::string header =
      std::string(kHeader).insert(std::string(kHeader).size() - 1, ",residual");
  const ReadResult r =
      parse_results("r.csv", header +
                                 "cpu,2,1,bf16,4096,1,8192,residual_rmsnorm,shm,oneshot,1,10,"
                                 "replicated\n"
                                 "cpu,2,1,bf16,4096,1,8192,residual_rmsnorm,shm,oneshot,1,10,"
                                 "distinct\n"
                                 "cpu,2,1,bf16,4096,1,8192,residual_rmsnorm_fp8,shm,oneshot,1,10,\n"
                                 "cpu,2,1,bf16,4096,1,8192,allreduce,shm,oneshot,1,10,\n");
  BOOST_TEST_REQUIRE(r.file.has_value());
  BOOST_TEST_REQUIRE(r.file->rows.size() == 4u);
  BOOST_TEST((r.file->rows[0].residual == Residual::kReplicated));
  BOOST_TEST((r.file->rows[1].residual == Residual::kDistinct));
  BOOST_TEST((r.file->rows[2].residual == Residual::kDistinct));
  BOOST_TEST(!r.file->rows[3].residual.has_value());

  // Without the column (files written before it): distinct, or none.
  const ReadResult old =
      parse_results("old.csv", std::string(kHeader) + kGoodRow +
                                   "90,2,1,bf16,4096,32,262144,allreduce,trtllm,oneshot,1,10\n");
  BOOST_TEST_REQUIRE(old.file.has_value());
  BOOST_TEST((old.file->rows[0].residual == Residual::kDistinct));
  BOOST_TEST(!old.file->rows[1].residual.has_value());
}

BOOST_AUTO_TEST_CASE(a_bad_residual_names_file_line_and_column) {
  const ReadResult r = read_results(tune_path("bad_residual.csv"));
  BOOST_TEST(!r.file.has_value());
  BOOST_TEST(!r.unreadable);
  BOOST_TEST_REQUIRE(r.diagnostics.size() == 2u);
  const std::string unknown = r.diagnostics[0].to_string();
  BOOST_TEST(contains_text(unknown,
                           "bad_residual.csv:7: error: column residual: unknown residual "
                           "'Replicated'"),
             unknown);
  const std::string allreduce = r.diagnostics[1].to_string();
  BOOST_TEST(contains_text(allreduce,
                           "bad_residual.csv:8: error: column residual: \"replicated\" given for "
                           "pattern allreduce, which has no residual; leave it empty"),
             allreduce);
  // A refused pattern says nothing about the residual: one error, the pattern's.
  const std::string header =
      std::string(kHeader).insert(std::string(kHeader).size() - 1, ",residual");
  const Diagnostic d =
      only_error("cpu,2,1,bf16,4096,1,8192,rmsnorm,shm,oneshot,1,10,replicated\n", header);
  BOOST_TEST(d.message.starts_with("column pattern: unknown pattern"), d.message);
}

// The optional buffers column: registered or copied (empty or absent:
// copied); anything else is refused, naming the line and the column.
BOOST_AUTO_TEST_CASE(the_buffers_column_is_optional_and_copied_by_default) {
  const std::string header =
      std::string(kHeader).insert(std::string(kHeader).size() - 1, ",buffers");
  const ReadResult r =
      parse_results("r.csv", header +
                                 "cpu,2,1,bf16,4096,1,8192,residual_rmsnorm,shm,oneshot,1,10,"
                                 "registered\n"
                                 "cpu,2,1,bf16,4096,1,8192,residual_rmsnorm,shm,oneshot,1,10,"
                                 "copied\n"
                                 "cpu,2,1,bf16,4096,1,8192,allreduce,shm,oneshot,1,10,\n");
  BOOST_TEST_REQUIRE(r.file.has_value());
  BOOST_TEST_REQUIRE(r.file->rows.size() == 3u);
  BOOST_TEST(r.file->rows[0].registered);
  BOOST_TEST(!r.file->rows[1].registered);
  BOOST_TEST(!r.file->rows[2].registered);
  const ReadResult old = parse_results("old.csv", std::string(kHeader) + kGoodRow);
  BOOST_TEST_REQUIRE(old.file.has_value());
  BOOST_TEST(!old.file->rows[0].registered);

  const Diagnostic d =
      only_error("cpu,2,1,bf16,4096,1,8192,residual_rmsnorm,shm,oneshot,1,10,Registered\n", header);
  BOOST_TEST(d.to_string().starts_with("r.csv:2: error: column buffers: \"Registered\" is not "
                                       "registered or copied"),
             d.to_string());
}

// Found by feeding `arbiter tune` what spreadsheets and typos produce: a
// byte-order mark hid the first column's name; a number too large for 64
// bits was 'not a whole number'; a latency near the double's limit was
// taken, and regrets then printed inf%.
BOOST_AUTO_TEST_CASE(a_byte_order_mark_a_huge_number_and_an_absurd_latency) {
  const ReadResult bom = parse_results("b.csv", "\xEF\xBB\xBF" + std::string(kHeader) + kGoodRow);
  BOOST_TEST_REQUIRE(bom.file.has_value());
  BOOST_TEST(bom.file->rows.size() == 1u);
  const Diagnostic huge = only_error(
      "90,2,1,bf16,4096,32,99999999999999999999999,residual_rmsnorm,trtllm,oneshot,1,10\n");
  BOOST_TEST(contains_text(huge.message, "is too large (at most"), huge.message);
  const Diagnostic absurd =
      only_error("90,2,1,bf16,4096,32,262144,residual_rmsnorm,trtllm,oneshot,1,1e308\n");
  BOOST_TEST(contains_text(absurd.message, "not a measured latency"), absurd.message);
  // And absurdly small: a denormal made the cap "off" and the regrets inf%.
  const Diagnostic tiny =
      only_error("90,2,1,bf16,4096,32,262144,residual_rmsnorm,trtllm,oneshot,1,4.9e-324\n");
  BOOST_TEST(contains_text(tiny.message, "under 0.001 us (1 ns): not a measured latency"),
             tiny.message);
}
