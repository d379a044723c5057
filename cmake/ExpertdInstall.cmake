# What `cmake --install` puts where (GNUInstallDirs; docs/operations.md, "Installing"):
#   bin/expertd, bin/expertctl
#   lib/libexpertd_client.so.0 (the C API, EXPERTD_*), include/expertd/expertd_client.h
#   lib/pkgconfig/expertd-client.pc, lib/cmake/expertd/ (find_package(expertd CONFIG): the
#   imported target expertd::client)
#   lib/systemd/system/expertd.service, lib/sysusers.d/expertd.conf (the expertd user and group)
#   etc/expertd/expertd.toml (/etc/expertd when configured with the prefix /usr),
#   share/doc/expertd/
# Components (Debian packages, cmake/ExpertdPackage.cmake): daemon (the programs, unit, sysusers
# entry, config, docs) and sdk (the library, header, pkg-config and CMake files).
# The C++ API (client.h) and the static client library are not installed: they expose the
# generated protocol classes and Abseil types of this build, which an engine built elsewhere
# cannot be expected to match; engines use the C API.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS expertd expertctl RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT daemon)

set_target_properties(expertd_client_shared PROPERTIES
  EXPORT_NAME client VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR})
install(TARGETS expertd_client_shared EXPORT expertdTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT sdk
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/expertd)
install(FILES ${PROJECT_SOURCE_DIR}/client/lib/expertd_client.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/expertd COMPONENT sdk)

set(expertd_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/expertd)
install(EXPORT expertdTargets NAMESPACE expertd:: DESTINATION ${expertd_cmake_dir} COMPONENT sdk)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/expertdConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/expertdConfig.cmake
                              INSTALL_DESTINATION ${expertd_cmake_dir})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/expertdConfigVersion.cmake
                                 COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/expertdConfig.cmake
              ${PROJECT_BINARY_DIR}/expertdConfigVersion.cmake
        DESTINATION ${expertd_cmake_dir} COMPONENT sdk)

# Relocatable: the prefix is found from where the .pc file lies (pkg-config's ${pcfiledir}), so
# `cmake --install --prefix P` and DESTDIR work whatever prefix was configured.
file(RELATIVE_PATH expertd_pc_to_prefix "/p/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/p")
configure_file(${PROJECT_SOURCE_DIR}/cmake/expertd-client.pc.in
               ${PROJECT_BINARY_DIR}/expertd-client.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/expertd-client.pc
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT sdk)

# systemd's own folders are under the prefix's lib/, not the multiarch libdir.
install(FILES ${PROJECT_SOURCE_DIR}/configs/expertd.service DESTINATION lib/systemd/system
        COMPONENT daemon)
install(FILES ${PROJECT_SOURCE_DIR}/configs/expertd.sysusers DESTINATION lib/sysusers.d
        RENAME expertd.conf COMPONENT daemon)
# /etc/expertd when configured with CMAKE_INSTALL_PREFIX=/usr (GNUInstallDirs' rule for /usr),
# else PREFIX/etc/expertd.
install(FILES ${PROJECT_SOURCE_DIR}/configs/expertd.toml
        DESTINATION ${CMAKE_INSTALL_FULL_SYSCONFDIR}/expertd COMPONENT daemon)
install(FILES ${PROJECT_SOURCE_DIR}/README.md ${PROJECT_SOURCE_DIR}/docs/operations.md
              ${PROJECT_SOURCE_DIR}/docs/protocol.md ${PROJECT_SOURCE_DIR}/docs/integration.md
              ${PROJECT_SOURCE_DIR}/docs/device.md
        DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT daemon)

# Manual pages, made from each program's own --help and --version by help2man (Debian package
# help2man) and compressed as Debian wants them; without help2man there are none, and the
# configure step says so.
find_program(EXPERTD_HELP2MAN help2man)
if(EXPERTD_HELP2MAN)
  set(expertd_man_pages)
  foreach(program expertd expertctl)
    if(program STREQUAL "expertd")
      set(summary "Mixture-of-Experts weight streaming daemon")
    else()
      set(summary "tools for the expertd daemon: inspect, synth, index, bench, health, stats")
    endif()
    add_custom_command(
      OUTPUT ${PROJECT_BINARY_DIR}/man/${program}.1.gz
      COMMAND ${CMAKE_COMMAND} -E make_directory ${PROJECT_BINARY_DIR}/man
      COMMAND ${EXPERTD_HELP2MAN} --no-info --name "${summary}"
              --output ${PROJECT_BINARY_DIR}/man/${program}.1 $<TARGET_FILE:${program}>
      COMMAND gzip -9nf ${PROJECT_BINARY_DIR}/man/${program}.1
      DEPENDS ${program}
      COMMENT "Manual page of ${program} (help2man)")
    list(APPEND expertd_man_pages ${PROJECT_BINARY_DIR}/man/${program}.1.gz)
  endforeach()
  add_custom_target(expertd_man_pages ALL DEPENDS ${expertd_man_pages})
  install(FILES ${expertd_man_pages} DESTINATION ${CMAKE_INSTALL_MANDIR}/man1 COMPONENT daemon)
else()
  message(STATUS "help2man not found: no manual pages")
endif()
