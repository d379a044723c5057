# Third-party libraries, all from Debian packages installed by scripts/setup.
find_package(absl REQUIRED CONFIG)
find_package(CLI11 REQUIRED CONFIG)
find_package(nlohmann_json 3.10 REQUIRED CONFIG)
find_package(PkgConfig REQUIRED)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)
if(EXPERTD_BUILD_TESTS)
  find_package(GTest REQUIRED CONFIG)
endif()
# The service: protobuf + gRPC (protoc and grpc_cpp_plugin generate proto/), spdlog for the
# daemon's log, libsystemd for sd_notify, cpp-httplib for the metrics listener.
find_package(Protobuf REQUIRED)
find_package(gRPC CONFIG REQUIRED)
find_program(EXPERTD_GRPC_CPP_PLUGIN grpc_cpp_plugin REQUIRED)
find_package(spdlog CONFIG REQUIRED)
pkg_check_modules(SYSTEMD REQUIRED IMPORTED_TARGET libsystemd)
pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)
