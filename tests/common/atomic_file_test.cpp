#include "common/atomic_file.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "common/error.h"
#include "common/yaml_text.h"

namespace tpusim {
namespace {

TEST(AtomicFile, WritesWholeContentAndLeavesNoTemporary) {
  const auto directory = std::filesystem::temp_directory_path() / "tpusim_atomic_test";
  std::filesystem::create_directories(directory);
  const std::string path = (directory / "out.txt").string();
  write_file_atomically(path, "first");
  write_file_atomically(path, "second version");
  EXPECT_EQ(read_text_file(path), "second version");
  int files = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(directory)) {
    ++files;
  }
  EXPECT_EQ(files, 1);
  std::filesystem::remove_all(directory);
}

// The rename would replace whatever the path is: a device, a directory or a link is refused, and
// left as it was.
TEST(AtomicFile, RefusesToReplaceWhatIsNotARegularFile) {
  EXPECT_THROW(write_file_atomically("/dev/null", "a"), UserError);
  EXPECT_TRUE(std::filesystem::is_character_file("/dev/null"));
  const auto directory = std::filesystem::temp_directory_path() / "tpusim_atomic_link_test";
  std::filesystem::remove_all(directory);
  std::filesystem::create_directories(directory / "sub");
  const auto target = directory / "target.txt";
  write_file_atomically(target.string(), "kept");
  std::filesystem::create_symlink(target, directory / "link.txt");
  EXPECT_THROW(write_file_atomically((directory / "link.txt").string(), "new"), UserError);
  EXPECT_THROW(write_file_atomically((directory / "sub").string(), "new"), UserError);
  EXPECT_TRUE(std::filesystem::is_symlink(directory / "link.txt"));
  EXPECT_EQ(read_text_file(target.string()), "kept");
  std::filesystem::remove_all(directory);
}

TEST(AtomicFile, UnwritableDirectoryIsUserError) {
  EXPECT_THROW(write_file_atomically("/nonexistent_dir_tpusim/x.txt", "a"), UserError);
}

TEST(YamlText, MalformedYamlNamesOriginAndLine) {
  try {
    parse_yaml("a: 1\nb: [unclosed\n", "bad.yml");
    FAIL() << "expected UserError";
  } catch (const UserError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("bad.yml"), std::string::npos) << message;
    EXPECT_NE(message.find("line"), std::string::npos) << message;
  }
}

// yaml-cpp 0.7 loops on a ',' at document level, allocating until memory runs out (found by
// fuzz/config_fuzz.cpp): each such text is a UserError at the ','.
TEST(YamlText, CommaAtDocumentLevelIsUserErrorNotEndlessDocuments) {
  for (const char* text : {",", ",defaults:# gemm ", "- a\n,", "# c\n,", "'x',", "&a ,"}) {
    try {
      parse_yaml(text, "comma.yml");
      FAIL() << "expected UserError for " << text;
    } catch (const UserError& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find("comma.yml"), std::string::npos) << message;
      EXPECT_NE(message.find("','"), std::string::npos) << message;
    }
  }
  // Commas where YAML allows them still parse, and several documents are still counted.
  EXPECT_EQ(parse_yaml("a: [1, 2]\nb: x, y\n", "ok.yml")["b"].as<std::string>(), "x, y");
  EXPECT_TRUE(parse_yaml("", "empty.yml").IsNull());
  try {
    parse_yaml("a: 1\n---\nb: 2\n---\nc: 3\n", "three.yml");
    FAIL() << "expected UserError";
  } catch (const UserError& error) {
    EXPECT_NE(std::string(error.what()).find("3 YAML documents"), std::string::npos)
        << error.what();
  }
}

}  // namespace
}  // namespace tpusim
