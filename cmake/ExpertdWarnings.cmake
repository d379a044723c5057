# Warnings for the project's own targets (not for third-party code).
add_library(expertd_warnings INTERFACE)
target_compile_options(expertd_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor
                            -Wimplicit-fallthrough>)
