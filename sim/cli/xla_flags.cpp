#include "sim/cli/xla_flags.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <map>
#include <optional>
#include <ostream>

#include "common/error.h"
#include "common/utf8.h"
#include "sim/perf/xla_switch_flags.h"

namespace tpusim {
namespace {

struct Flag {
  std::string name;  // without the leading dashes
  std::string value;
  std::string text;    // as given
  std::string source;  // "--xla-flags", "LIBTPU_INIT_ARGS" or "XLA_FLAGS"
};

// A modeled boolean flag's value as XLA reads it (absl's SimpleAtob, case-insensitive): bare
// --flag is true; true/t/yes/y/1 and false/f/no/n/0. Anything else ("maybe", "ture") is a
// UserError naming the flag and the value, not silently false: libtpu itself refuses it.
bool flag_bool(const Flag& flag) {
  std::string value = flag.value;
  for (char& character : value) {
    character = static_cast<char>(std::tolower(static_cast<unsigned char>(character)));
  }
  if (value.empty() || value == "true" || value == "t" || value == "yes" || value == "y" ||
      value == "1") {
    return true;
  }
  if (value == "false" || value == "f" || value == "no" || value == "n" || value == "0") {
    return false;
  }
  throw UserError("XLA flags (" + flag.source + "): --" + flag.name + ": '" + flag.value +
                  "' is not a boolean (true or false)");
}

// Whitespace-separated tokens, a "..." or '...' part kept whole (--xla_foo="a b") and unquoted.
std::vector<std::string> split_tokens(const std::string& text, const std::string& source) {
  std::vector<std::string> tokens;
  std::string token;
  bool in_token = false;
  char quote = 0;
  for (const char character : text) {
    if (quote != 0) {
      if (character == quote) {
        quote = 0;
      } else {
        token += character;
      }
    } else if (character == '"' || character == '\'') {
      quote = character;
      in_token = true;
    } else if (std::isspace(static_cast<unsigned char>(character)) != 0) {
      if (in_token) {
        tokens.push_back(token);
        token.clear();
        in_token = false;
      }
    } else {
      token += character;
      in_token = true;
    }
  }
  if (quote != 0) {
    throw UserError("XLA flags (" + source + "): unterminated " + std::string(1, quote) +
                    " quote in '" + text + "'");
  }
  if (in_token) {
    tokens.push_back(token);
  }
  return tokens;
}

std::vector<Flag> parse_flags(const std::string& text, const std::string& source) {
  std::vector<Flag> flags;
  for (const std::string& token : split_tokens(text, source)) {
    if (!token.starts_with("--") || token.size() == 2) {
      throw UserError("XLA flags (" + source + "): '" + token + "' is not a --flag[=value]");
    }
    const size_t equals = token.find('=');
    Flag flag;
    flag.name = token.substr(2, equals == std::string::npos ? std::string::npos : equals - 2);
    flag.value = equals == std::string::npos ? "" : token.substr(equals + 1);
    flag.text = token;
    flag.source = source;
    flags.push_back(flag);
  }
  return flags;
}

// One of the flags the recipes (and explore's LIBTPU_INIT_ARGS) set beside the fusion flag.
bool is_fusion_companion(const std::string& name) {
  const std::vector<std::string>& companions = async_collective_fusion_companion_flags();
  return std::any_of(companions.begin(), companions.end(), [&name](const std::string& flag) {
    return flag.starts_with("--" + name + "=");
  });
}

bool user_sets(const std::vector<std::string>& user_overrides, const std::string& key) {
  return std::any_of(user_overrides.begin(), user_overrides.end(),
                     [&](const std::string& item) { return item.starts_with(key + "="); });
}

}  // namespace

XlaFlagReport xla_flag_overrides(const std::string& flags,
                                 const std::vector<std::string>& user_overrides,
                                 bool read_environment) {
  XlaFlagReport report;
  std::vector<Flag> all;
  auto take = [&](const std::string& text, const std::string& source) {
    if (text.find_first_not_of(" \t\n") == std::string::npos) {
      return;
    }
    // Flag names are listed in --json output, which must be UTF-8.
    if (!is_valid_utf8(text)) {
      throw UserError(source + ": the flags are not valid UTF-8 text");
    }
    report.sources.push_back(source);
    const std::vector<Flag> parsed = parse_flags(text, source);
    all.insert(all.end(), parsed.begin(), parsed.end());
  };
  // The environment first, then --xla-flags: where they set one switch both ways, the command
  // line wins (the environment's won, so a recipe's exported LIBTPU_INIT_ARGS silently undid
  // --xla-flags).
  if (read_environment) {
    for (const char* variable : {"LIBTPU_INIT_ARGS", "XLA_FLAGS"}) {
      if (const char* value = std::getenv(variable)) {
        take(value, variable);
      }
    }
  }
  take(flags, "--xla-flags");
  // The switches the modeled flags set: the offload is on when any collective kind is offloaded
  // (tpusim's switch covers all kinds); for async collective fusion the last flag wins.
  std::optional<bool> sparse_core_offload;
  std::optional<bool> async_collective_fusion;
  std::map<std::string, std::string> modeled_text;
  for (const Flag& flag : all) {
    if (flag.name.find("sparse_core_collective_offload") != std::string::npos) {
      // Any offloaded collective kind turns tpusim's (all-kinds) offload on: the three kinds
      // explore writes (sparse_core_offload_flag_names) and the 2d/3d all-gather variants the
      // Ironwood recipes add.
      const bool offloaded = flag_bool(flag);  // checked even when an earlier kind is on
      sparse_core_offload = sparse_core_offload.value_or(false) || offloaded;
      modeled_text[flag.name] = flag.text;
    } else if (flag.name == kAsyncCollectiveFusionFlag) {
      async_collective_fusion = flag_bool(flag);
      modeled_text[flag.name] = flag.text;
    } else if (is_fusion_companion(flag.name)) {
      modeled_text[flag.name] = flag.text;  // part of the fusion switch; sets nothing alone
    } else if (flag.name.find("_tracing") != std::string::npos ||
               flag.name.starts_with("xla_dump")) {
      report.no_effect.push_back(flag.name);
    } else {
      report.not_modeled.push_back(flag.name);
    }
  }
  if (sparse_core_offload && !user_sets(user_overrides, "sparse_core_collective_offload")) {
    report.overrides.push_back(std::string("sparse_core_collective_offload=") +
                               (*sparse_core_offload ? "on" : "off"));
  }
  if (async_collective_fusion && !user_sets(user_overrides, "collective_matmul")) {
    report.overrides.push_back(std::string("collective_matmul=") +
                               (*async_collective_fusion ? "true" : "false"));
  }
  for (const auto& [name, text] : modeled_text) {
    report.modeled.push_back(text);
  }
  return report;
}

void report_xla_flags(const XlaFlagReport& report, std::ostream& out) {
  if (report.empty()) {
    return;
  }
  std::string sources;
  for (const std::string& source : report.sources) {
    sources += (sources.empty() ? "" : ", ") + source;
  }
  out << "tpusim: XLA flags (" << sources << "): ";
  std::string applied;
  for (const std::string& item : report.overrides) {
    applied += (applied.empty() ? "" : ", ") + item;
  }
  out << (applied.empty() ? "none changes a modeled switch" : "set " + applied) << "; "
      << report.not_modeled.size() << " not modeled";
  if (!report.not_modeled.empty()) {
    out << " (";
    for (size_t index = 0; index < report.not_modeled.size(); ++index) {
      out << (index == 0 ? "" : ", ") << report.not_modeled[index];
    }
    out << ")";
  }
  out << "\n";
}

nlohmann::json xla_flags_json(const XlaFlagReport& report) {
  return {{"sources", report.sources},
          {"overrides", report.overrides},
          {"modeled", report.modeled},
          {"no_effect", report.no_effect},
          {"not_modeled", report.not_modeled}};
}

}  // namespace tpusim
