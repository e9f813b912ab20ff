#include "common/csv.h"

#include "common/error.h"
#include "common/suggest.h"

namespace tpusim {

size_t CsvTable::column(std::string_view name) const {
  for (size_t index = 0; index < header.size(); ++index) {
    if (header[index] == name) {
      return index;
    }
  }
  throw UserError(origin + ": missing column '" + std::string(name) + "'" +
                  did_you_mean(name, header));
}

CsvTable parse_csv(std::string_view text, std::string_view origin) {
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

}  // namespace tpusim
