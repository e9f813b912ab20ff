// sim/cli/table_values.h: the small readings and summaries of validate's tables.
//
// Example:
//   parse_table_number("13.83", "published.csv row 2 measured_step_s");  // 13.83
//   parse_table_number("n/a", "...");   // UserError: "...: 'n/a' is not a number"
//   split_words("a=1  b=2");            // {"a=1", "b=2"}
//   median({3, 1, 2});                  // 2
#pragma once

#include <string>
#include <vector>

namespace tpusim {

// The whole text as a finite number; UserError naming `what` otherwise.
double parse_table_number(const std::string& text, const std::string& what);

// Whitespace-separated words (a row's override string).
std::vector<std::string> split_words(const std::string& text);

// The median (0 for none).
double median(std::vector<double> values);

}  // namespace tpusim
