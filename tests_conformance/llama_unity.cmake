# Included by CMake after llama.cpp's project() (CMAKE_PROJECT_INCLUDE, tests_conformance/servers.py);
# needs CMake >= 3.19 (cmake_language DEFER; Debian 12 has 3.25).
include_guard(GLOBAL)
# A unity build (CMAKE_UNITY_BUILD) of llama-server, but for the sources that cannot share a batch:
# common/json.cpp specializes common_json::get<T> after other files of common instantiate it, and
# mtmd's public helpers refuse (#error) the internal headers the rest of mtmd includes.
cmake_language(DEFER DIRECTORY ${CMAKE_SOURCE_DIR} CALL set_source_files_properties
  ${CMAKE_SOURCE_DIR}/common/json.cpp DIRECTORY ${CMAKE_SOURCE_DIR}/common PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
cmake_language(DEFER DIRECTORY ${CMAKE_SOURCE_DIR} CALL set_source_files_properties
  ${CMAKE_SOURCE_DIR}/tools/mtmd/mtmd-helper.cpp ${CMAKE_SOURCE_DIR}/tools/mtmd/mtmd-helper-gen.cpp
  DIRECTORY ${CMAKE_SOURCE_DIR}/tools/mtmd PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
