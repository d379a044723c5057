# Debian packages with CPack's DEB generator (scripts/package runs it): expertd (component
# daemon) and libexpertd-client-dev (component sdk). CPack rather than a debian/ folder: the
# install rules above already say what goes where, so the packages cannot drift from
# `cmake --install`; dependencies are computed by dpkg-shlibdeps from the binaries.
set(expertd_deb_contact "expertd developers <expertd-dev@example.org>")
string(TIMESTAMP expertd_deb_date "%a, %d %b %Y %H:%M:%S +0000" UTC)
set(expertd_deb_dir ${PROJECT_BINARY_DIR}/deb)

# Per package: copyright and a compressed changelog in /usr/share/doc/PACKAGE (changelog.gz:
# the packages are native, made from this tree).
foreach(pair "daemon;expertd" "sdk;libexpertd-client-dev")
  list(GET pair 0 component)
  list(GET pair 1 package)
  set(VERSION ${PROJECT_VERSION})
  set(DATE ${expertd_deb_date})
  configure_file(${PROJECT_SOURCE_DIR}/packaging/deb/changelog
                 ${expertd_deb_dir}/${component}/changelog @ONLY)
  file(READ ${expertd_deb_dir}/${component}/changelog changelog)
  string(REPLACE "expertd (" "${package} (" changelog "${changelog}")
  file(WRITE ${expertd_deb_dir}/${component}/changelog "${changelog}")
  execute_process(COMMAND gzip -9nf ${expertd_deb_dir}/${component}/changelog)
  install(FILES ${PROJECT_SOURCE_DIR}/packaging/deb/copyright
                ${expertd_deb_dir}/${component}/changelog.gz
          DESTINATION ${CMAKE_INSTALL_DATAROOTDIR}/doc/${package} COMPONENT ${component})
endforeach()

# The maintainer scripts and conffiles list, under the names dpkg wants.
foreach(name postinst prerm postrm conffiles)
  configure_file(${PROJECT_SOURCE_DIR}/packaging/deb/expertd.${name}
                 ${expertd_deb_dir}/daemon/control/${name} COPYONLY)
endforeach()

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME expertd)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT ${expertd_deb_contact})
# Each package's synopsis is the first line of its own description below. CPack prepends the
# summary unless it is CPack's default, which it would otherwise take from the project's
# description: keep the default.
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "${CMAKE_PROJECT_NAME} built using CMake")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL daemon sdk)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_SECTION misc)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_STRIP_FILES ON)

set(CPACK_DEBIAN_DAEMON_PACKAGE_NAME expertd)
set(CPACK_DEBIAN_DAEMON_PACKAGE_SECTION misc)
# First line: the synopsis; then the extended description (lines under 80 characters; CPack
# indents them).
set(CPACK_DEBIAN_DAEMON_DESCRIPTION
    "Mixture-of-Experts weight streaming daemon
expertd owns the model and pack files of MoE models, stages routed experts
in pinned host memory and copies them into GPU (or host) slots; inference
engines lease the experts each layer routed to and read them in place.
Includes expertctl, the systemd unit and the default configuration.
Installing it starts nothing.")
set(CPACK_DEBIAN_DAEMON_PACKAGE_CONTROL_EXTRA
    "${expertd_deb_dir}/daemon/control/postinst;${expertd_deb_dir}/daemon/control/prerm;${expertd_deb_dir}/daemon/control/postrm;${expertd_deb_dir}/daemon/control/conffiles")
# procps: /bin/kill of the unit's ExecReload (minimal Debian systems lack it).
set(CPACK_DEBIAN_DAEMON_PACKAGE_DEPENDS "adduser | systemd, procps")

set(CPACK_DEBIAN_SDK_PACKAGE_NAME libexpertd-client-dev)
set(CPACK_DEBIAN_SDK_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_SDK_DESCRIPTION
    "client library of expertd (C API) and its development files
The library engines link to lease MoE expert slots from expertd: the C
API (expertd_client.h), a pkg-config file (expertd-client) and a CMake
package (find_package(expertd), target expertd::client).")
# A shared library: its shlibs file, and ldconfig run by trigger.
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)  # only the sdk package has a library
file(WRITE ${expertd_deb_dir}/sdk/control/triggers "activate-noawait ldconfig\n")
set(CPACK_DEBIAN_SDK_PACKAGE_CONTROL_EXTRA "${expertd_deb_dir}/sdk/control/triggers")

include(CPack)
