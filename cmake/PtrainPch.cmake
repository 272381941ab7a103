# ptrain_reuse_pch(<target> [FROM <pch target>])
#
# Gives <target> the shared precompiled header (cmake/ptrain_pch.h, which
# holds <torch/torch.h>), but only for the sources that reach a libtorch
# header. The header is 0.6 GB: a source that includes torch compiles in about
# half the time with it, while one that never does (the recipe parser, the
# launcher, most test drivers) compiles three times slower with it than
# without, GCC paying to load and emit what it never uses. Measured on two
# cores: recipe.cpp 35 s with, 11 s without; attention.cpp 25 s with, 47 s
# without.
#
# "Reaches" is decided at configure time by following #include lines through
# the project's own headers (resolved against the including file's folder and
# the include roots below) until one names torch/, ATen/ or c10/. A source it
# gets wrong still compiles, only at the other speed. FROM names the target
# whose header to reuse: ptrain_pch (the default, compiled as the libraries
# are) or ptrain_test_pch (the same header at -O0, for the test drivers:
# tests/CMakeLists.txt). Call it after every source of the target has been
# added.
#
# Unity batches (PTRAIN_UNITY_BUILD, on by default): the sources that take the
# header are compiled PTRAIN_UNITY_BATCH_SIZE at a time as one translation
# unit. Even an empty source costs 5.4 s with the header (7.3 s at -O0): at
# the end of every translation unit GCC instantiates the templates that
# libtorch's inline code names (90% of that time, -ftime-report), and a
# precompiled header does not keep those instantiations. A batch pays it once.
# The sources of a batch share one translation unit, so names at file scope
# (anonymous namespaces included) must differ between the files of a target;
# the compiler says where they do not. -DPTRAIN_UNITY_BUILD=OFF compiles each
# source alone, which suits editing one file and rebuilding.
#
# Sources that never reach libtorch are compiled without its flags, as an
# object library of their own (<target>_libtorch_free) whose objects the
# target links: the project's include folders and definitions, C++17, and
# none of libtorch's include folders or language level (PyPI's libtorch asks
# for C++20, and ships fmt headers of its own). Their commands are then the
# same in the Debian and the PyPI build, so with ccache (cmake/ccache.cmake)
# the second build takes them from the first instead of compiling them again:
# measured on two cores, 108 sources and 2.5 of the PyPI build's 13 minutes.
# -DPTRAIN_SHARED_OBJECTS=OFF leaves them in their target.
option(PTRAIN_UNITY_BUILD "Compile the sources that include libtorch in batches" ON)
option(PTRAIN_SHARED_OBJECTS "Compile the sources that never include libtorch without its flags" ON)
set(PTRAIN_UNITY_BATCH_SIZE 6 CACHE STRING "Sources per unity batch (PTRAIN_UNITY_BUILD)")

set(PTRAIN_PCH_INCLUDE_ROOTS
  ${CMAKE_SOURCE_DIR}/framework/include
  ${CMAKE_SOURCE_DIR}/framework/src
  ${CMAKE_SOURCE_DIR}/datasets/include
  ${CMAKE_SOURCE_DIR}/tests
  ${CMAKE_SOURCE_DIR}/trainers
  ${CMAKE_SOURCE_DIR}/plugins
  ${CMAKE_SOURCE_DIR})
file(GLOB _ptrain_pch_trainer_dirs LIST_DIRECTORIES true ${CMAKE_SOURCE_DIR}/trainers/*)
list(APPEND PTRAIN_PCH_INCLUDE_ROOTS ${_ptrain_pch_trainer_dirs}
  ${CMAKE_SOURCE_DIR}/plugins/precision/common ${CMAKE_SOURCE_DIR}/plugins/comm/c10d)

# Sets <out> to TRUE when <file> includes a libtorch header, directly or
# through the project's headers. Results are memoised per file in global
# properties (which also stops include cycles).
function(ptrain_reaches_torch file out)
  get_property(known GLOBAL PROPERTY "PTRAIN_REACHES_TORCH:${file}" SET)
  if(known)
    get_property(result GLOBAL PROPERTY "PTRAIN_REACHES_TORCH:${file}")
    set(${out} ${result} PARENT_SCOPE)
    return()
  endif()
  set_property(GLOBAL PROPERTY "PTRAIN_REACHES_TORCH:${file}" FALSE)
  set(result FALSE)
  get_filename_component(here ${file} DIRECTORY)
  set(roots ${here} ${PTRAIN_PCH_INCLUDE_ROOTS})
  file(STRINGS ${file} includes REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]")
  foreach(line IN LISTS includes)
    if(line MATCHES "[<\"](torch|ATen|c10)/")
      set(result TRUE)
      break()
    endif()
    if(NOT line MATCHES "[<\"]([^>\"]+)[>\"]")
      continue()
    endif()
    set(name ${CMAKE_MATCH_1})
    foreach(root IN LISTS roots)
      if(EXISTS ${root}/${name} AND NOT IS_DIRECTORY ${root}/${name})
        get_filename_component(header ${root}/${name} REALPATH)
        ptrain_reaches_torch(${header} sub)
        if(sub)
          set(result TRUE)
        endif()
        break()
      endif()
    endforeach()
    if(result)
      break()
    endif()
  endforeach()
  set_property(GLOBAL PROPERTY "PTRAIN_REACHES_TORCH:${file}" ${result})
  set(${out} ${result} PARENT_SCOPE)
endfunction()

# libtorch's include folders, and the folder that puts Debian's fmt ahead of
# the one inside PyPI's libtorch (cmake/torch.cmake): what a source that never
# includes libtorch is compiled without. Each is matched whole.
set(_ptrain_torch_only_dirs ${TORCH_INCLUDE_DIRS} "${CMAKE_BINARY_DIR}/include-first")
set(_ptrain_torch_only_dirs_regex)
foreach(_dir IN LISTS _ptrain_torch_only_dirs)
  string(REGEX REPLACE "([][+.*()^$?|\\\\])" "\\\\\\1" _dir "${_dir}")
  list(APPEND _ptrain_torch_only_dirs_regex "${_dir}")
endforeach()
list(JOIN _ptrain_torch_only_dirs_regex "|" _ptrain_torch_only_dirs_regex)
set(PTRAIN_TORCH_ONLY_DIRS_REGEX "^(${_ptrain_torch_only_dirs_regex})/?$")

# Moves <sources> (which never reach libtorch) of <target> into the object
# library <target>_libtorch_free, compiled with <target>'s include folders but
# libtorch's, its definitions and options, and the project's C++ level.
function(ptrain_share_libtorch_free_objects target sources)
  set(objects ${target}_libtorch_free)
  add_library(${objects} OBJECT ${sources})
  set(t ${target})
  set_target_properties(${objects} PROPERTIES
    INCLUDE_DIRECTORIES
      "$<FILTER:$<TARGET_PROPERTY:${t},INCLUDE_DIRECTORIES>,EXCLUDE,${PTRAIN_TORCH_ONLY_DIRS_REGEX}>"
    COMPILE_DEFINITIONS "$<TARGET_PROPERTY:${t},COMPILE_DEFINITIONS>"
    COMPILE_OPTIONS "$<TARGET_PROPERTY:${t},COMPILE_OPTIONS>")
  get_target_property(kept ${target} SOURCES)
  list(REMOVE_ITEM kept ${sources})
  set_property(TARGET ${target} PROPERTY SOURCES ${kept} $<TARGET_OBJECTS:${objects}>)
  # A target left with objects only (a test driver without libtorch) still links as C++.
  set_property(TARGET ${target} PROPERTY LINKER_LANGUAGE CXX)
endfunction()

function(ptrain_reuse_pch target)
  cmake_parse_arguments(ARG "" "FROM" "" ${ARGN})
  set(pch ptrain_pch)
  if(ARG_FROM)
    set(pch ${ARG_FROM})
  endif()
  if(NOT TARGET ${pch})
    return()
  endif()
  target_precompile_headers(${target} REUSE_FROM ${pch})
  if(PTRAIN_UNITY_BUILD)
    set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE ${PTRAIN_UNITY_BATCH_SIZE})
  endif()
  get_target_property(sources ${target} SOURCES)
  get_target_property(source_dir ${target} SOURCE_DIR)
  set(libtorch_free)
  foreach(source IN LISTS sources)
    if(NOT source MATCHES "\\.(cpp|cc|cxx)$")
      continue()
    endif()
    get_filename_component(path ${source} ABSOLUTE BASE_DIR ${source_dir})
    ptrain_reaches_torch(${path} reaches)
    if(NOT reaches)
      # Alone and without the header: a batch would give it the header's cost.
      set_source_files_properties(${source} TARGET_DIRECTORY ${target} PROPERTIES
                                  SKIP_PRECOMPILE_HEADERS ON SKIP_UNITY_BUILD_INCLUSION ON)
      list(APPEND libtorch_free ${source})
    endif()
  endforeach()
  if(PTRAIN_SHARED_OBJECTS AND libtorch_free)
    ptrain_share_libtorch_free_objects(${target} "${libtorch_free}")
  endif()
endfunction()
