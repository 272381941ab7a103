# Finding libtorch, and the few fix-ups that let one source tree build against
# both libtorch builds ptrain supports:
#
#   Debian's libtorch 1.13 (CPU only)      the default: no extra arguments
#   PyTorch 2.x from PyPI (CUDA)           -DCMAKE_PREFIX_PATH=$(python -c 'import torch;
#                                          print(torch.utils.cmake_prefix_path)'), which
#                                          `make TORCH=pypi` passes
#
# Sets PTRAIN_TORCH_VERSION, PTRAIN_WITH_CUDA (libtorch has CUDA and nvcc exists;
# the CUDA language is then enabled) and PTRAIN_WITH_NCCL (c10d ProcessGroupNCCL
# is present). Source code differences between the two versions live in
# framework/include/ptrain/core/torch_compat.h, not here.

# Our CUDA kernels are built for Ampere and Hopper; libtorch's own CMake reads
# this list (and ignores CMAKE_CUDA_ARCHITECTURES).
if(NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  set(TORCH_CUDA_ARCH_LIST "8.0;9.0")
endif()
set(PTRAIN_CUDA_ARCHITECTURES "80;90" CACHE STRING "GPU architectures of ptrain's CUDA kernels")

# A libtorch with CUDA enables the CUDA language inside its config, and only
# when it can find nvcc: point CMake at the toolkit every machine has.
if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
  set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
endif()

# TorchConfig finds its Caffe2 config with PATHS, which come after the system
# folders: given only Torch_DIR, a machine with Debian's libtorch too would mix
# the two. Take the Caffe2 config beside the Torch one.
if(Torch_DIR AND NOT Caffe2_DIR AND EXISTS "${Torch_DIR}/../Caffe2/Caffe2Config.cmake")
  get_filename_component(Caffe2_DIR "${Torch_DIR}/../Caffe2" ABSOLUTE)
endif()
find_package(Torch REQUIRED)
if(TORCH_INSTALL_PREFIX)
  set(PTRAIN_TORCH_PREFIX "${TORCH_INSTALL_PREFIX}")
else()
  get_filename_component(PTRAIN_TORCH_PREFIX "${Torch_DIR}/../../.." ABSOLUTE)
endif()
set(PTRAIN_TORCH_VERSION "${Torch_VERSION}")

# TorchConfig looks for libc10 with find_library(... PATHS <its prefix>/lib),
# and PATHS come after the system folders: on a machine that also has Debian's
# libtorch, a PyPI libtorch would be linked with Debian's libc10. Pin every
# library to the libtorch that was found.
set(_ptrain_torch_libs)
foreach(_lib IN LISTS TORCH_LIBRARIES)
  if(_lib MATCHES "/lib(c10|c10_cuda|torch|torch_cpu|torch_cuda)\\.so$"
     AND NOT _lib MATCHES "^${PTRAIN_TORCH_PREFIX}/")
    get_filename_component(_name "${_lib}" NAME)
    if(EXISTS "${PTRAIN_TORCH_PREFIX}/lib/${_name}")
      set(_lib "${PTRAIN_TORCH_PREFIX}/lib/${_name}")
    endif()
  endif()
  list(APPEND _ptrain_torch_libs "${_lib}")
endforeach()
set(TORCH_LIBRARIES ${_ptrain_torch_libs})

# PyPI's libtorch ships fmt 12 headers in its include folder, which precedes
# /usr/include; spdlog and libfmt from Debian are fmt 9. Code that saw fmt 12
# headers but linked Debian's libfmt would break the one-definition rule, so a
# folder holding only Debian's fmt is searched before libtorch's.
if(EXISTS "${PTRAIN_TORCH_PREFIX}/include/fmt")
  get_target_property(_fmt_includes fmt::fmt INTERFACE_INCLUDE_DIRECTORIES)
  if(NOT _fmt_includes)
    set(_fmt_includes /usr/include)
  endif()
  foreach(_dir IN LISTS _fmt_includes)
    if(EXISTS "${_dir}/fmt/format.h" AND NOT _dir STREQUAL "${PTRAIN_TORCH_PREFIX}/include")
      set(_ptrain_fmt_shadow "${CMAKE_BINARY_DIR}/include-first")
      file(MAKE_DIRECTORY "${_ptrain_fmt_shadow}")
      file(CREATE_LINK "${_dir}/fmt" "${_ptrain_fmt_shadow}/fmt" SYMBOLIC)
      include_directories(BEFORE SYSTEM "${_ptrain_fmt_shadow}")
      break()
    endif()
  endforeach()
endif()

set(CMAKE_CUDA_STANDARD 17)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
set(PTRAIN_WITH_CUDA OFF)
if(TORCH_CUDA_LIBRARIES OR TARGET torch_cuda)
  if(CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    set(PTRAIN_WITH_CUDA ON)
  else()
    message(STATUS "ptrain: libtorch has CUDA but nvcc was not found; building the CPU path only")
  endif()
endif()

# PyPI's libtorch loads CUDA, cuDNN and NCCL from NVIDIA's wheels beside it
# (its RUNPATH). The linker must check libtorch_cuda's symbols against those
# too, not against an older NCCL of the toolkit that sits on the link path.
if(PTRAIN_WITH_CUDA)
  file(GLOB _nvidia_lib_dirs LIST_DIRECTORIES true "${PTRAIN_TORCH_PREFIX}/../nvidia/*/lib")
  foreach(_dir IN LISTS _nvidia_lib_dirs)
    get_filename_component(_dir "${_dir}" ABSOLUTE)
    add_link_options("LINKER:-rpath-link,${_dir}")
    # The CUDA runtime libtorch was built with, ahead of the toolkit's, for
    # ptrain's own kernels too: one libcudart in the process.
    list(APPEND CMAKE_BUILD_RPATH "${_dir}")
  endforeach()
endif()

# A libtorch outside the system folders (PyPI's): installed binaries find it,
# and NVIDIA's libraries beside it, through their RUNPATH.
if(NOT PTRAIN_TORCH_PREFIX MATCHES "^/usr(/|$)")
  list(APPEND CMAKE_INSTALL_RPATH "${PTRAIN_TORCH_PREFIX}/lib")
  if(PTRAIN_WITH_CUDA)
    foreach(_dir IN LISTS _nvidia_lib_dirs)
      get_filename_component(_dir "${_dir}" ABSOLUTE)
      list(APPEND CMAKE_INSTALL_RPATH "${_dir}")
    endforeach()
  endif()
endif()

# ptrain's host kernels (cpu.kernels: ptrain) call the BLAS libtorch exports:
# Debian's libtorch exports OpenBLAS. PyPI's keeps its MKL to itself, so the
# core links OpenBLAS for them (libopenblas0-pthread, a Debian dependency).
set(PTRAIN_HOST_BLAS "")
if(NOT PTRAIN_TORCH_PREFIX MATCHES "^/usr(/|$)")
  find_library(PTRAIN_OPENBLAS NAMES openblas libopenblas.so.0)
  if(PTRAIN_OPENBLAS)
    set(PTRAIN_HOST_BLAS "-Wl,--no-as-needed" "${PTRAIN_OPENBLAS}" "-Wl,--as-needed")
  else()
    message(STATUS "ptrain: no OpenBLAS found; cpu.kernels: ptrain will fall back to libtorch's ops")
  endif()
endif()

set(PTRAIN_WITH_NCCL OFF)
if(PTRAIN_WITH_CUDA AND EXISTS "${PTRAIN_TORCH_PREFIX}/include/torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp")
  set(PTRAIN_WITH_NCCL ON)
endif()

if(PTRAIN_WITH_CUDA)
  add_compile_definitions(PTRAIN_WITH_CUDA=1)
else()
  add_compile_definitions(PTRAIN_WITH_CUDA=0)
endif()

message(STATUS "ptrain: libtorch ${PTRAIN_TORCH_VERSION} at ${PTRAIN_TORCH_PREFIX} "
               "(CUDA ${PTRAIN_WITH_CUDA}, NCCL ${PTRAIN_WITH_NCCL})")
