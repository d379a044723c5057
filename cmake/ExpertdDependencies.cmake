# Third-party libraries, all from Debian packages installed by scripts/setup.
find_package(absl REQUIRED CONFIG)
find_package(CLI11 REQUIRED CONFIG)
find_package(nlohmann_json 3.10 REQUIRED CONFIG)
find_package(PkgConfig REQUIRED)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)
if(EXPERTD_BUILD_TESTS)
  find_package(GTest REQUIRED CONFIG)
endif()
