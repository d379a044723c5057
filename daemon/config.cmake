# expertd_config: the daemon's typed TOML configuration (config.h). Included from
# daemon/CMakeLists.txt; a library of its own so config_test links it without the gRPC service.
if(NOT TARGET expertd_config)
  # GLOBAL: the imported target must be visible where config_test (tests/) links this library.
  pkg_check_modules(TOMLPP REQUIRED IMPORTED_TARGET GLOBAL tomlplusplus)
  add_library(expertd_config STATIC ${CMAKE_CURRENT_LIST_DIR}/config.cpp
                             ${CMAKE_CURRENT_LIST_DIR}/config_values.cpp)
  target_include_directories(expertd_config PUBLIC ${CMAKE_CURRENT_LIST_DIR})
  target_link_libraries(expertd_config
    PUBLIC expertd_util
    PRIVATE PkgConfig::TOMLPP expertd_warnings)
endif()
