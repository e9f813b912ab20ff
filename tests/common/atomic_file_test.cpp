#include "common/atomic_file.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>

#include "common/error.h"
#include "common/input_files.h"
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

// Issue 35, item 14: the temporary was "<out>.tmp.<pid>", opened without O_EXCL | O_NOFOLLOW, so a
// link planted at that name had its target overwritten and the output became the link. Now the
// name is unpredictable and a planted name is never written through.
TEST(RedTeam, Item14_PlantedLinkAtTheTemporaryIsNotWrittenThrough) {
  const auto directory = std::filesystem::temp_directory_path() / "tpusim_atomic_plant_test";
  std::filesystem::remove_all(directory);
  std::filesystem::create_directories(directory);
  const auto victim = directory / "victim.txt";
  write_file_atomically(victim.string(), "precious");
  const auto out = directory / "out.html";
  std::filesystem::create_symlink(victim, out.string() + ".tmp." + std::to_string(::getpid()));
  write_file_atomically(out.string(), "page");
  EXPECT_EQ(read_text_file(victim.string()), "precious");
  EXPECT_TRUE(std::filesystem::is_regular_file(std::filesystem::symlink_status(out)));
  EXPECT_EQ(read_text_file(out.string()), "page");
  std::filesystem::remove_all(directory);
}

TEST(AtomicFile, OutputThatIsAnInputIsRefused) {
  const auto directory = std::filesystem::temp_directory_path() / "tpusim_atomic_input_test";
  std::filesystem::remove_all(directory);
  std::filesystem::create_directories(directory / "inputs");
  const auto config = directory / "my.yml";
  write_file_atomically(config.string(), "model_name: x\n");
  note_input(config.string());
  note_input((directory / "inputs").string());
  EXPECT_THROW(write_file_atomically(config.string(), "clobbered"), UserError);
  // Another spelling of the same file, and a file inside an input directory.
  EXPECT_THROW(write_file_atomically((directory / "inputs" / ".." / "my.yml").string(), "x"),
               UserError);
  EXPECT_THROW(write_file_atomically((directory / "inputs" / "new.txt").string(), "x"), UserError);
  EXPECT_EQ(read_text_file(config.string()), "model_name: x\n");
  write_file_atomically((directory / "other.txt").string(), "fine");
  clear_inputs();
  write_file_atomically(config.string(), "now an output");
  std::filesystem::remove_all(directory);
}

// Two spellings of one output path are one file; different paths are not, also when neither
// exists yet or one cannot be resolved.
TEST(AtomicFile, SameOutputPathSeesThroughSpellingsAndLinks) {
  const std::filesystem::path directory =
      std::filesystem::path(::testing::TempDir()) / ("same_output_" + std::to_string(::getpid()));
  std::filesystem::create_directories(directory / "sub");
  const std::string file = (directory / "out.json").string();
  EXPECT_TRUE(same_output_path(file, (directory / "sub" / ".." / "out.json").string()));
  EXPECT_TRUE(same_output_path(file, (directory / "." / "out.json").string()));
  std::filesystem::create_directory_symlink(directory, directory / "link");
  EXPECT_TRUE(same_output_path(file, (directory / "link" / "out.json").string()));
  EXPECT_FALSE(same_output_path(file, (directory / "other.json").string()));
  EXPECT_FALSE(same_output_path(file, std::string(4096, 'x')));  // does not resolve: not equal
  std::filesystem::remove_all(directory);
}

TEST(AtomicFile, SeveralFilesMoveInOnlyWhenAllAreWritten) {
  const auto directory = std::filesystem::temp_directory_path() / "tpusim_atomic_several_test";
  std::filesystem::remove_all(directory);
  std::filesystem::create_directories(directory / "b.txt");  // b cannot be replaced
  write_file_atomically((directory / "a.txt").string(), "old a");
  EXPECT_THROW(write_files_atomically({{(directory / "a.txt").string(), "new a"},
                                       {(directory / "b.txt").string(), "new b"}}),
               UserError);
  EXPECT_EQ(read_text_file((directory / "a.txt").string()), "old a");
  int files = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(directory)) {
    ++files;
  }
  EXPECT_EQ(files, 2);  // a.txt and b.txt: no temporary left
  std::filesystem::remove(directory / "b.txt");
  write_files_atomically(
      {{(directory / "a.txt").string(), "new a"}, {(directory / "b.txt").string(), "new b"}});
  EXPECT_EQ(read_text_file((directory / "b.txt").string()), "new b");
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
