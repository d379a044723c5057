# Third-party libraries, all from Debian packages installed by scripts/setup. The core-only
# build (EXPERTD_CORE_ONLY) needs only Abseil, nlohmann-json, CLI11, xxHash and googletest; for the
# Windows cross-build scripts/windows-check builds or stages them in its own prefix.
# EXPERTD_ABSEIL_SOURCE / EXPERTD_GOOGLETEST_SOURCE: source trees built as part of the project
# (only the targets it links) instead of installed packages, for a cross-build that has none.
set(EXPERTD_ABSEIL_SOURCE "" CACHE PATH "An Abseil source tree to build with the project")
set(EXPERTD_GOOGLETEST_SOURCE "" CACHE PATH "A googletest source tree to build with the project")
if(EXPERTD_ABSEIL_SOURCE)
  set(ABSL_PROPAGATE_CXX_STD ON)
  set(BUILD_TESTING OFF CACHE BOOL "Abseil's own tests" FORCE)
  # Third-party code: its warnings are not the project's (the flags stay in its own scope).
  set(expertd_saved_cxx_flags "${CMAKE_CXX_FLAGS}")
  string(APPEND CMAKE_CXX_FLAGS " -w")
  add_subdirectory(${EXPERTD_ABSEIL_SOURCE} ${CMAKE_BINARY_DIR}/_deps/abseil EXCLUDE_FROM_ALL SYSTEM)
  set(CMAKE_CXX_FLAGS "${expertd_saved_cxx_flags}")
else()
  find_package(absl REQUIRED CONFIG)
endif()
find_package(nlohmann_json 3.10 QUIET CONFIG)
if(NOT nlohmann_json_FOUND)
  # Header-only; a cross prefix holds just the headers.
  find_path(EXPERTD_NLOHMANN_JSON_INCLUDE nlohmann/json.hpp REQUIRED)
  add_library(nlohmann_json::nlohmann_json INTERFACE IMPORTED)
  target_include_directories(nlohmann_json::nlohmann_json INTERFACE ${EXPERTD_NLOHMANN_JSON_INCLUDE})
endif()
# expertd_xxhash: the shared library where pkg-config finds it, else the header compiled inline
# (XXH_INLINE_ALL), which needs no library at all.
add_library(expertd_xxhash INTERFACE)
find_package(PkgConfig QUIET)
if(PKG_CONFIG_FOUND AND NOT CMAKE_CROSSCOMPILING)
  pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)
  target_link_libraries(expertd_xxhash INTERFACE PkgConfig::XXHASH)
else()
  find_path(EXPERTD_XXHASH_INCLUDE xxhash.h REQUIRED)
  target_include_directories(expertd_xxhash INTERFACE ${EXPERTD_XXHASH_INCLUDE})
  target_compile_definitions(expertd_xxhash INTERFACE XXH_INLINE_ALL)
endif()
if(EXPERTD_BUILD_TESTS AND EXPERTD_GOOGLETEST_SOURCE)
  set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
  set(expertd_saved_cxx_flags "${CMAKE_CXX_FLAGS}")
  string(APPEND CMAKE_CXX_FLAGS " -w")
  add_subdirectory(${EXPERTD_GOOGLETEST_SOURCE} ${CMAKE_BINARY_DIR}/_deps/googletest
                   EXCLUDE_FROM_ALL SYSTEM)
  set(CMAKE_CXX_FLAGS "${expertd_saved_cxx_flags}")
elseif(EXPERTD_BUILD_TESTS)
  find_package(GTest REQUIRED CONFIG)
endif()
find_package(CLI11 QUIET CONFIG)
if(NOT CLI11_FOUND)
  # Header-only, like nlohmann-json: expertctl's file tools in the cross-build.
  find_path(EXPERTD_CLI11_INCLUDE CLI/CLI.hpp REQUIRED)
  add_library(CLI11::CLI11 INTERFACE IMPORTED)
  target_include_directories(CLI11::CLI11 INTERFACE ${EXPERTD_CLI11_INCLUDE})
endif()
if(EXPERTD_CORE_ONLY)
  return()
endif()
# The service: protobuf + gRPC (protoc and grpc_cpp_plugin generate proto/), spdlog for the
# daemon's log, libsystemd for sd_notify, cpp-httplib for the metrics listener.
find_package(Protobuf REQUIRED)
find_package(gRPC CONFIG REQUIRED)
find_program(EXPERTD_GRPC_CPP_PLUGIN grpc_cpp_plugin REQUIRED)
find_package(spdlog CONFIG REQUIRED)
pkg_check_modules(SYSTEMD REQUIRED IMPORTED_TARGET libsystemd)
pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)
