// common/csv.h: a small RFC 4180 CSV reader (quoted fields, doubled quotes, embedded commas), and a
// reader of plain tab-separated tables.
//
// Example:
//   CsvTable table = parse_csv(read_text_file("published.csv"), "published.csv");
//   table.column("measured_step_s");          // index, or UserError naming the missing column
//   table.rows[0][table.column("id")];        // "V4-1"
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tpusim {

struct CsvTable {
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;
  std::string origin;

  // Index of a column; UserError naming the file and the column when it is missing.
  size_t column(std::string_view name) const;
  // Index of a column, or nullopt when the table has none of that name.
  std::optional<size_t> find_column(std::string_view name) const;
};

// UserError naming the file and line for an unterminated quote or a row with the wrong number of
// fields.
CsvTable parse_csv(std::string_view text, std::string_view origin);

// Tab-separated values with no quoting (fields may hold quotes and commas, e.g. YAML values as
// MaxText writes them: "llama2", ['norm', 'fsdp']); lines starting with '#' are comments; the
// first other line is the header. UserError naming the file and line for a row with the wrong
// number of fields.
//   parse_tsv("# note\nkey\tvalue\nmodel_name\t\"default\"\n", "keys.tsv").rows[0][1]  // "default"
//   quoted
CsvTable parse_tsv(std::string_view text, std::string_view origin);

}  // namespace tpusim
