#include "common/yaml_text.h"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include <yaml-cpp/eventhandler.h>

#include "common/error.h"

namespace tpusim {
namespace {

// Counts the documents of a YAML stream and notices when the parser stops advancing: yaml-cpp
// 0.7 (Debian 12) answers a ',' outside a flow collection at document level (",", "- a\n,",
// "'x',") with an empty document without consuming the ',', forever, so YAML::LoadAll allocates
// until memory runs out. A document that starts where the previous one started is that case.
class DocumentCounter : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark& mark) override {
    if (documents_ > 0 && mark.pos == last_start_.pos) {
      throw YAML::ParserException(mark, "',' outside a flow collection ([a, b] or {a: b})");
    }
    last_start_ = mark;
    ++documents_;
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}

  size_t documents() const { return documents_; }

 private:
  size_t documents_ = 0;
  YAML::Mark last_start_;
};

}  // namespace

std::string read_text_file(const std::string& path) {
  // Only regular files (links followed): a directory, a FIFO or /dev/zero would fail late or
  // never end; a size cap keeps a wrong path from exhausting memory.
  constexpr std::uintmax_t kMaxBytes = std::uintmax_t{8} << 30;
  std::error_code error;
  const std::filesystem::file_status status = std::filesystem::status(path, error);
  if (!error && std::filesystem::exists(status) &&
      status.type() != std::filesystem::file_type::regular) {
    throw UserError("'" + path + "' is not a regular file (a directory, device or FIFO)");
  }
  if (!error && std::filesystem::exists(status) &&
      std::filesystem::file_size(path, error) > kMaxBytes) {
    throw UserError("'" + path + "' is larger than 8 GiB, more than tpusim reads");
  }
  std::ifstream stream(path, std::ios::binary);
  if (!stream) {
    throw UserError("cannot read file '" + path + "'");
  }
  std::ostringstream buffer;
  buffer << stream.rdbuf();
  return buffer.str();
}

YAML::Node parse_yaml(std::string_view text, std::string_view origin) {
  try {
    // Count the documents first (see DocumentCounter), then load the one there is.
    std::istringstream stream{std::string(text)};
    YAML::Parser parser(stream);
    DocumentCounter counter;
    while (parser.HandleNextDocument(counter)) {
    }
    if (counter.documents() > 1) {
      throw UserError(std::string(origin) + " holds " + std::to_string(counter.documents()) +
                      " YAML documents (separated by ---); a config is one document");
    }
    return counter.documents() == 0 ? YAML::Node() : YAML::Load(std::string(text));
  } catch (const YAML::Exception& error) {
    throw UserError("malformed YAML in " + std::string(origin) + " at line " +
                    std::to_string(error.mark.line + 1) + ", column " +
                    std::to_string(error.mark.column + 1) + ": " + error.msg);
  }
}

std::string yaml_location(const YAML::Node& node, std::string_view origin) {
  const YAML::Mark mark = node.Mark();
  if (mark.is_null()) {
    return std::string(origin);
  }
  return std::string(origin) + ":" + std::to_string(mark.line + 1);
}

}  // namespace tpusim
