# Warnings for the project's own targets (not for third-party code).
add_library(expertd_warnings INTERFACE)
target_compile_options(expertd_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor
                            -Wimplicit-fallthrough>)
# Warnings as errors (the Windows cross-build, scripts/windows-check, keeps its code clean).
option(EXPERTD_WERROR "Treat warnings in the project's own code as errors" OFF)
if(EXPERTD_WERROR)
  target_compile_options(expertd_warnings INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
endif()
