#include "common/csv.h"

#include "common/error.h"
#include "common/suggest.h"

namespace tpusim {

std::optional<size_t> CsvTable::find_column(std::string_view name) const {
  for (size_t index = 0; index < header.size(); ++index) {
    if (header[index] == name) {
      return index;
    }
  }
  return std::nullopt;
}

size_t CsvTable::column(std::string_view name) const {
  if (const std::optional<size_t> index = find_column(name)) {
    return *index;
  }
  throw UserError(origin + ": missing column '" + std::string(name) + "'" +
                  did_you_mean(name, header));
}

CsvTable parse_csv(std::string_view text, std::string_view origin) {
  // A UTF-8 byte order mark, as spreadsheets save CSV, is not part of the first column's name
  // (with it, "missing column 'id'" named a column the file has).
  constexpr std::string_view kByteOrderMark = "\xEF\xBB\xBF";
  if (text.starts_with(kByteOrderMark)) {
    text.remove_prefix(kByteOrderMark.size());
  }
  CsvTable table;
  table.origin = std::string(origin);
  std::vector<std::string> row;
  std::string field;
  bool quoted = false;
  bool field_started = false;
  int line = 1;
  int row_line = 1;
  auto end_row = [&] {
    row.push_back(field);
    field.clear();
    field_started = false;
    const bool blank = row.size() == 1 && row[0].empty();
    if (!blank) {
      if (table.header.empty()) {
        table.header = row;
      } else if (row.size() != table.header.size()) {
        throw UserError(table.origin + ":" + std::to_string(row_line) + ": " +
                        std::to_string(row.size()) + " fields, expected " +
                        std::to_string(table.header.size()));
      } else {
        table.rows.push_back(row);
      }
    }
    row.clear();
    row_line = line;
  };
  for (size_t index = 0; index < text.size(); ++index) {
    const char character = text[index];
    if (quoted) {
      if (character == '"') {
        if (index + 1 < text.size() && text[index + 1] == '"') {
          field += '"';
          ++index;
        } else {
          quoted = false;
        }
      } else {
        if (character == '\n') {
          ++line;
        }
        field += character;
      }
      continue;
    }
    switch (character) {
      case '"':
        if (field_started && !field.empty()) {
          throw UserError(table.origin + ":" + std::to_string(line) +
                          ": a quote inside an unquoted field");
        }
        quoted = true;
        field_started = true;
        break;
      case ',':
        row.push_back(field);
        field.clear();
        field_started = false;
        break;
      case '\r':
        break;
      case '\n':
        ++line;
        end_row();
        break;
      default:
        field += character;
        field_started = true;
    }
  }
  if (quoted) {
    throw UserError(table.origin + ":" + std::to_string(row_line) + ": unterminated quoted field");
  }
  if (!field.empty() || !row.empty()) {
    end_row();
  }
  if (table.header.empty()) {
    throw UserError(table.origin + ": empty CSV file");
  }
  return table;
}

CsvTable parse_tsv(std::string_view text, std::string_view origin) {
  CsvTable table;
  table.origin = std::string(origin);
  size_t start = 0;
  int line = 0;
  while (start < text.size()) {
    const size_t end = std::min(text.find('\n', start), text.size());
    std::string_view row_text = text.substr(start, end - start);
    start = end + 1;
    ++line;
    if (!row_text.empty() && row_text.back() == '\r') {
      row_text.remove_suffix(1);
    }
    if (row_text.empty() || row_text.front() == '#') {
      continue;
    }
    std::vector<std::string> fields;
    size_t field_start = 0;
    while (true) {
      const size_t tab = row_text.find('\t', field_start);
      fields.emplace_back(row_text.substr(
          field_start, tab == std::string_view::npos ? std::string_view::npos : tab - field_start));
      if (tab == std::string_view::npos) {
        break;
      }
      field_start = tab + 1;
    }
    if (table.header.empty()) {
      table.header = std::move(fields);
      continue;
    }
    if (fields.size() != table.header.size()) {
      throw UserError(table.origin + ":" + std::to_string(line) + ": " +
                      std::to_string(fields.size()) + " fields, the header has " +
                      std::to_string(table.header.size()));
    }
    table.rows.push_back(std::move(fields));
  }
  if (table.header.empty()) {
    throw UserError(table.origin + ": empty table");
  }
  return table;
}

}  // namespace tpusim
