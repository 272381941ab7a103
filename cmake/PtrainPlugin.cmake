# ptrain_add_plugin(<kind> <name> SOURCES <files...> [LIBRARIES <libs...>] [OUTPUT_DIR <dir>])
#
# Builds one plugin as a shared library named ptrain_<kind>_<name> into
# <build>/lib/ptrain/plugins/<kind>/ (or OUTPUT_DIR), linked to the core and
# compiled with the shared precompiled header, so every plugin has the same
# flags, visibility and build tag as the core that loads it.
#
# `cmake --install` puts it in <prefix>/${PTRAIN_PLUGIN_INSTALL_DIR}/<kind>
# (default lib/ptrain/plugins: beside an installed libptrain_core.so, that is
# the core's own plugin folder). Set PTRAIN_PLUGIN_INSTALL to OFF before the
# call for a plugin that is not to be installed.
function(ptrain_add_plugin kind name)
  cmake_parse_arguments(ARG "" "OUTPUT_DIR" "SOURCES;LIBRARIES" ${ARGN})
  set(target ptrain_${kind}_${name})
  add_library(${target} MODULE ${ARG_SOURCES})
  target_link_libraries(${target} PRIVATE ptrain_core ${ARG_LIBRARIES})
  if(COMMAND ptrain_reuse_pch)
    ptrain_reuse_pch(${target})
  endif()
  if(NOT ARG_OUTPUT_DIR)
    set(ARG_OUTPUT_DIR ${PTRAIN_PLUGIN_OUTPUT_DIR}/${kind})
  endif()
  set_target_properties(${target} PROPERTIES
    PREFIX "lib"
    LIBRARY_OUTPUT_DIRECTORY ${ARG_OUTPUT_DIR}
    # <prefix>/lib/ptrain/plugins/<kind> -> <prefix>/lib, where libptrain_core.so is.
    INSTALL_RPATH "$ORIGIN/../../.."
    INSTALL_RPATH_USE_LINK_PATH ON)
  if(NOT DEFINED PTRAIN_PLUGIN_INSTALL OR PTRAIN_PLUGIN_INSTALL)
    if(NOT PTRAIN_PLUGIN_INSTALL_DIR)
      set(PTRAIN_PLUGIN_INSTALL_DIR lib/ptrain/plugins)
    endif()
    install(TARGETS ${target} LIBRARY DESTINATION ${PTRAIN_PLUGIN_INSTALL_DIR}/${kind})
  endif()
  if(TARGET ptrain_plugins_all)
    add_dependencies(ptrain_plugins_all ${target})
  endif()
endfunction()
