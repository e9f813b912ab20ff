// python/module.cpp: the extension `tpusim._tpusim`, the C++ half of `import tpusim`.
//
// Each function calls what the CLI calls for its --json output (sim/cli/command_json.h) and
// returns that JSON as Python objects (python/json_to_python.h); python/tpusim/ wraps them in
// typed result classes. Arguments arrive as bytes, exactly the argv tokens the CLI would get.
// The GIL is released while tpusim computes, so other Python threads run meanwhile and several
// threads may estimate at once. Bad input raises tpusim.ConfigError (message, key), as the CLI
// exits 2; anything else is an internal error (RuntimeError), as the CLI exits 1.
//
// Example (what python/tpusim/__init__.py does):
//   report, notes = _tpusim.estimate([b"model_name=llama3.1-8b", b"compile_topology=v5p-8"],
//                                    b"", [])
//   report["step_time_s"]
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <yaml-cpp/yaml.h>

#include "common/error.h"
#include "hw/slice.h"
#include "python/json_to_python.h"
#include "sim/cli/command_json.h"
#include "sim/cli/hardware_json.h"

namespace tpusim {
namespace {

namespace py = pybind11;

// Bad input, on its way from C++ to tpusim.ConfigError.
struct ConfigFailure {
  std::string message;
  std::string key;  // "" when the message names no single key
};

// tpusim.ConfigError, set once by the package (python/tpusim/__init__.py); never released, so
// nothing touches it after the interpreter ends.
PyObject* config_error_class = nullptr;

void set_config_error_class(const py::object& error_class) {
  Py_XDECREF(config_error_class);
  config_error_class = error_class.inc_ref().ptr();
}

// Runs `body` without the GIL; bad input leaves as a ConfigFailure (the CLI's exit 2).
template <typename Body>
auto run_without_gil(Body&& body) -> decltype(body()) {
  try {
    const py::gil_scoped_release release;
    return body();
  } catch (const UserError& error) {
    throw ConfigFailure{error.what(), error.key()};
  } catch (const YAML::Exception& error) {
    // run_cli's wording for a YAML value yaml-cpp cannot read.
    throw ConfigFailure{std::string("malformed value: ") + error.what(), ""};
  }
}

void raise_config_error(const ConfigFailure& failure) {
  const py::object key =
      failure.key.empty() ? py::object(py::none()) : py::object(text_to_python(failure.key));
  const py::tuple arguments = py::make_tuple(text_to_python(failure.message), key);
  PyErr_SetObject(config_error_class != nullptr ? config_error_class : PyExc_ValueError,
                  arguments.ptr());
}

py::tuple estimate_report(const std::vector<std::string>& args, const std::string& xla_flags,
                          const std::vector<std::string>& without) {
  std::ostringstream notes;
  const nlohmann::json json = run_without_gil([&] {
    return run_estimate(EstimateRequest{args, xla_flags, without}, notes).json;
  });
  return py::make_tuple(json_to_python(json), text_to_python(notes.str()));
}

py::tuple explore_report(const ExploreRequest& request) {
  std::ostringstream notes;
  const nlohmann::json json = run_without_gil([&] { return explore_json(request, notes); });
  return py::make_tuple(json_to_python(json), text_to_python(notes.str()));
}

py::tuple plan_report(const PlanCommandRequest& request) {
  std::ostringstream notes;
  const nlohmann::json json = run_without_gil([&] { return plan_command_json(request, notes); });
  return py::make_tuple(json_to_python(json), text_to_python(notes.str()));
}

py::object validate_report(const std::string& path, const std::string& pairs_path,
                           const std::vector<std::string>& without) {
  return json_to_python(run_without_gil([&] { return validate_json(path, pairs_path, without); }));
}

py::object topology_report(const std::string& slice_name, int num_slices) {
  return json_to_python(
      run_without_gil([&] { return topology_json(parse_slice(slice_name, num_slices)); }));
}

py::object hw_report(const std::string& chip_name) {
  return json_to_python(run_without_gil([&] { return hw_json(chip_name); }));
}

}  // namespace
}  // namespace tpusim

PYBIND11_MODULE(_tpusim, module) {
  namespace py = pybind11;
  using tpusim::ExploreRequest;
  module.doc() = "tpusim's C++ functions behind `import tpusim` (use the tpusim package)";
  // pybind11's translator type takes the exception_ptr by value.
  // NOLINTNEXTLINE(performance-unnecessary-value-param)
  py::register_exception_translator([](std::exception_ptr pointer) {
    try {
      if (pointer) {
        std::rethrow_exception(pointer);
      }
    } catch (const tpusim::ConfigFailure& failure) {
      tpusim::raise_config_error(failure);
    }
  });
  module.def("_set_config_error", &tpusim::set_config_error_class,
             "The exception class bad input raises (tpusim.ConfigError)");
  module.def("estimate", &tpusim::estimate_report, py::arg("args"), py::arg("xla_flags"),
             py::arg("without"), "(estimate --json as a dict, the notes the CLI prints on stderr)");
  py::class_<ExploreRequest>(module, "ExploreRequest")
      .def(py::init<>())
      .def_readwrite("args", &ExploreRequest::args)
      .def_readwrite("xla_flags", &ExploreRequest::xla_flags)
      .def_readwrite("objective", &ExploreRequest::objective)
      .def_readwrite("top", &ExploreRequest::top)
      .def_readwrite("global_batch_size", &ExploreRequest::global_batch_size)
      .def_readwrite("max_per_device_batch", &ExploreRequest::max_per_device_batch)
      .def_readwrite("min_hbm_headroom", &ExploreRequest::min_hbm_headroom)
      .def_readwrite("threads", &ExploreRequest::threads)
      .def_readwrite("branch_and_bound", &ExploreRequest::branch_and_bound)
      .def_readwrite("exact_schedules", &ExploreRequest::exact_schedules);
  module.def("explore", &tpusim::explore_report, py::arg("request"),
             "(explore --json as a dict, the notes the CLI prints on stderr)");
  using tpusim::PlanCommandRequest;
  py::class_<PlanCommandRequest>(module, "PlanRequest")
      .def(py::init<>())
      .def_readwrite("args", &PlanCommandRequest::args)
      .def_readwrite("xla_flags", &PlanCommandRequest::xla_flags)
      .def_readwrite("tokens", &PlanCommandRequest::tokens)
      .def_readwrite("deadline", &PlanCommandRequest::deadline)
      .def_readwrite("hardware", &PlanCommandRequest::hardware)
      .def_readwrite("max_chips", &PlanCommandRequest::max_chips)
      .def_readwrite("max_slices", &PlanCommandRequest::max_slices)
      .def_readwrite("prices", &PlanCommandRequest::prices)
      .def_readwrite("consumption", &PlanCommandRequest::consumption)
      .def_readwrite("objective", &PlanCommandRequest::objective)
      .def_readwrite("global_batch_tokens", &PlanCommandRequest::global_batch_tokens)
      .def_readwrite("full_front", &PlanCommandRequest::full_front)
      .def_readwrite("threads", &PlanCommandRequest::threads);
  module.def("plan", &tpusim::plan_report, py::arg("request"),
             "(plan --json as a dict, the notes the CLI prints on stderr)");
  module.def("validate", &tpusim::validate_report, py::arg("path"), py::arg("pairs_path"),
             py::arg("without"), "validate --json (or validate --pairs --json) as a dict");
  module.def("topology", &tpusim::topology_report, py::arg("slice_name"), py::arg("num_slices"),
             "topology --json as a dict");
  module.def("hw", &tpusim::hw_report, py::arg("chip_name"),
             "hw --json as a dict (one chip) or a list (every chip, when the name is empty)");
}
