#include "python/json_to_python.h"

#include <cmath>

namespace tpusim {

namespace py = pybind11;

py::str text_to_python(const std::string& text) {
  PyObject* decoded =
      PyUnicode_DecodeUTF8(text.data(), static_cast<Py_ssize_t>(text.size()), "replace");
  if (decoded == nullptr) {
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::str>(decoded);
}

py::object json_to_python(const nlohmann::json& json) {
  switch (json.type()) {
    case nlohmann::json::value_t::object: {
      py::dict dict;
      for (const auto& [key, value] : json.items()) {
        dict[text_to_python(key)] = json_to_python(value);
      }
      return dict;
    }
    case nlohmann::json::value_t::array: {
      py::list list(json.size());
      size_t index = 0;
      for (const nlohmann::json& value : json) {
        list[index++] = json_to_python(value);
      }
      return list;
    }
    case nlohmann::json::value_t::string:
      return text_to_python(json.get_ref<const std::string&>());
    case nlohmann::json::value_t::boolean:
      return py::bool_(json.get<bool>());
    case nlohmann::json::value_t::number_integer:
      return py::int_(json.get<int64_t>());
    case nlohmann::json::value_t::number_unsigned:
      return py::int_(json.get<uint64_t>());
    case nlohmann::json::value_t::number_float: {
      const double value = json.get<double>();
      return std::isfinite(value) ? py::object(py::float_(value)) : py::none();
    }
    case nlohmann::json::value_t::null:
    case nlohmann::json::value_t::discarded:
      return py::none();
    case nlohmann::json::value_t::binary:
      break;
  }
  // Nothing tpusim reports holds binary data; as the CLI's dump would, refuse it.
  throw std::logic_error("json_to_python: a binary JSON value");
}

}  // namespace tpusim
