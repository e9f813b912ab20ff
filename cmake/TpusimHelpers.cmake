# Helpers shared by every folder's CMakeLists.txt.
#
# tpusim_library(NAME SOURCES ... DEPS ...): one static library per top-level folder, with the
# project root on its include path (so includes read "hw/slice.h") and warnings on.
function(tpusim_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR}/generated)
  target_link_libraries(${name} PUBLIC ${ARG_DEPS} PRIVATE tpusim_warnings)
endfunction()

# tpusim_test(NAME SOURCES ... DEPS ... [LABELS ...] [TIMEOUT S]): one GoogleTest executable, each
# test case registered with ctest. LABELS "slow" keeps it out of the default tier; TIMEOUT bounds
# each case's seconds. Every test process gets a temporary directory of its own
# (tests/support/private_temp_dir.cpp).
function(tpusim_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES} ${PROJECT_SOURCE_DIR}/tests/support/private_temp_dir.cpp)
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gmock GTest::gtest_main tpusim_allocator tpusim_warnings)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  set(labels fast)
  if(ARG_LABELS)
    set(labels ${ARG_LABELS})
  endif()
  target_compile_definitions(${name} PRIVATE TPUSIM_DEFAULT_BINARY="$<TARGET_FILE:tpusim>"
                                             TPUSIM_DEFAULT_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  set(properties LABELS "${labels}")
  if(ARG_TIMEOUT)
    # Per test (case), in seconds; a sanitizer build runs TPUSIM_TEST_TIME_SCALE times longer.
    math(EXPR timeout "${ARG_TIMEOUT} * ${TPUSIM_TEST_TIME_SCALE}")
    list(APPEND properties TIMEOUT ${timeout})
  endif()
  gtest_discover_tests(${name} PROPERTIES ${properties} DISCOVERY_TIMEOUT 60)
endfunction()

# tpusim_embed_files(OUT_CPP ROOT FILES ...): generates a .cpp that holds the text of FILES (paths
# relative to ROOT) so the binary carries its default configs and works from any directory.
function(tpusim_embed_files out_cpp root)
  set(files ${ARGN})
  set(abs_files)
  foreach(f ${files})
    list(APPEND abs_files ${root}/${f})
  endforeach()
  string(REPLACE ";" "|" files_arg "${files}")
  add_custom_command(
    OUTPUT ${out_cpp}
    COMMAND ${CMAKE_COMMAND} -DROOT=${root} "-DFILES=${files_arg}" -DOUT=${out_cpp}
            -P ${PROJECT_SOURCE_DIR}/cmake/EmbedFiles.cmake
    DEPENDS ${abs_files} ${PROJECT_SOURCE_DIR}/cmake/EmbedFiles.cmake
    COMMENT "Embedding ${root} configs"
    VERBATIM)
endfunction()
