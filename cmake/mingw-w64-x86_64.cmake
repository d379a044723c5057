# Cross-compiling for 64-bit Windows with Debian's mingw-w64 (g++-mingw-w64-x86-64-posix: the
# posix thread model, which std::thread and std::mutex need). Executables link the GCC and
# winpthread runtimes statically, so a built .exe runs with nothing beside it (under wine, or
# copied to a Windows machine). scripts/windows-check uses this file.
set(CMAKE_SYSTEM_NAME Windows)
set(CMAKE_SYSTEM_PROCESSOR x86_64)
set(EXPERTD_MINGW_TRIPLE x86_64-w64-mingw32)
set(CMAKE_C_COMPILER ${EXPERTD_MINGW_TRIPLE}-gcc-posix)
set(CMAKE_CXX_COMPILER ${EXPERTD_MINGW_TRIPLE}-g++-posix)
set(CMAKE_RC_COMPILER ${EXPERTD_MINGW_TRIPLE}-windres)

# Windows 10 and later: WaitOnAddress, FileStorageInfo, AF_UNIX.
add_compile_definitions(_WIN32_WINNT=0x0A00 WINVER=0x0A00 NOMINMAX WIN32_LEAN_AND_MEAN)
# GCC 12's -Wrestrict misfires on libstdc++'s own string code when it is inlined at -O2
# (GCC bug 105329); the native build is not affected.
add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-Wno-restrict>)
# Abseil's symbolizer needs dbghelp.
set(CMAKE_EXE_LINKER_FLAGS_INIT "-static -static-libgcc -static-libstdc++")
link_libraries(dbghelp)

# Libraries and headers come only from the cross prefixes (CMAKE_FIND_ROOT_PATH, e.g. the
# prefix windows-check installs Abseil and googletest into), never from the build machine's
# /usr; programs (cmake, python) come from the build machine.
set(CMAKE_FIND_ROOT_PATH /usr/${EXPERTD_MINGW_TRIPLE})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
