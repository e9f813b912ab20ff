// python/json_to_python.h: a JSON value (nlohmann::json) as the Python object that json.loads
// gives for the text the CLI prints (`json.dump(2)`), without printing and parsing it.
//
// Objects become dicts, arrays lists, integers ints, floats floats, and a float that is not
// finite None (nlohmann::json writes NaN and infinities as null). Strings are UTF-8; bytes that
// are not (a value the user typed) become U+FFFD, as the CLI's error objects write them.
//
// Example:
//   py::object report = json_to_python(nlohmann::json{{"mfu", 0.5}, {"fits", true}});
//   // {'fits': True, 'mfu': 0.5}
#pragma once

#include <string>

#include <nlohmann/json.hpp>
#include <pybind11/pybind11.h>

namespace tpusim {

pybind11::object json_to_python(const nlohmann::json& json);

// A C++ string as Python text (bytes that are not UTF-8 as U+FFFD).
pybind11::str text_to_python(const std::string& text);

}  // namespace tpusim
