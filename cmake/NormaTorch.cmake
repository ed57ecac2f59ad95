# libnorma_torch: norma's kernels as PyTorch operators (src/torch/).  Included by the top-level
# CMakeLists.txt unless NORMA_WITH_TORCH=OFF; sets NORMA_TORCH_BUILT and NORMA_TORCH_REASON.
#
# Torch is found through its CMake package (TorchConfig.cmake: Debian's libtorch-dev, a pip
# wheel's torch/share/cmake), with the prefix that the chosen Python's torch reports
# (torch.utils.cmake_prefix_path) tried first, so that the operators are built for the torch
# that Python imports.  With NORMA_WITH_TORCH=AUTO a missing piece only leaves the operators
# out (the Python package then uses its ctypes binding, and says so); with ON it is an error.
set(NORMA_TORCH_SOURCES
  src/torch/common.cpp
  src/torch/bn_ops.cpp
  src/torch/sync_ops.cpp
  src/torch/norms_ops.cpp
)

macro(norma_torch_missing why)
  if(NORMA_WITH_TORCH STREQUAL "ON")
    message(FATAL_ERROR "NORMA_WITH_TORCH=ON but ${why}")
  endif()
  set(NORMA_TORCH_REASON "${why}")
endmacro()

include(CheckLanguage)
check_language(CXX)
if(NOT CMAKE_CXX_COMPILER)
  norma_torch_missing("no C++ compiler found (Debian: g++)")
else()
  enable_language(CXX)
  if(NOT NORMA_PYTHON)
    if(EXISTS /usr/bin/python3)
      set(NORMA_PYTHON /usr/bin/python3)
    else()
      find_program(NORMA_PYTHON_FOUND python3)
      set(NORMA_PYTHON "${NORMA_PYTHON_FOUND}")
    endif()
  endif()
  set(_norma_torch_version "")
  if(NORMA_PYTHON)
    execute_process(
      COMMAND ${NORMA_PYTHON} -c "import torch, torch.utils; print(torch.__version__); print(torch.utils.cmake_prefix_path)"
      OUTPUT_VARIABLE _norma_py_torch RESULT_VARIABLE _norma_py_rc ERROR_QUIET
      OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(_norma_py_rc EQUAL 0)
      string(REPLACE "\n" ";" _norma_py_torch "${_norma_py_torch}")
      list(GET _norma_py_torch 0 _norma_torch_version)
      list(GET _norma_py_torch 1 _norma_torch_prefix)
      if(EXISTS "${_norma_torch_prefix}")
        list(PREPEND CMAKE_PREFIX_PATH "${_norma_torch_prefix}")
      endif()
    endif()
  endif()
  find_package(Torch CONFIG QUIET)
  if(NOT Torch_FOUND)
    norma_torch_missing("Torch's CMake package (TorchConfig.cmake) was not found (Debian: libtorch-dev, which python3-torch recommends)")
  elseif(_norma_torch_version STREQUAL "")
    norma_torch_missing("${NORMA_PYTHON} cannot import torch: the operators would have no torch to load into")
  else()
    # Torch's package reports its version as e.g. 1.13.1; Python's as 1.13.0a0 (Debian):
    # compare major.minor only
    string(REGEX MATCH "^[0-9]+\\.[0-9]+" _norma_py_mm "${_norma_torch_version}")
    string(REGEX MATCH "^[0-9]+\\.[0-9]+" _norma_cm_mm "${Torch_VERSION}")
    if(Torch_VERSION AND NOT _norma_py_mm STREQUAL _norma_cm_mm)
      norma_torch_missing("Torch's CMake package is version ${Torch_VERSION} but ${NORMA_PYTHON} imports torch ${_norma_torch_version}")
    else()
      add_library(norma_torch SHARED ${NORMA_TORCH_SOURCES})
      target_include_directories(norma_torch PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/include)
      # the public header only: libnorma's internals are not visible here
      target_link_libraries(norma_torch PRIVATE norma ${TORCH_LIBRARIES})
      target_compile_features(norma_torch PRIVATE cxx_std_17)
      target_compile_options(norma_torch PRIVATE -Wall -Wextra -Wno-unused-parameter)
      # the Python package loads it with torch.ops.load_library; libnorma is found beside it
      set_target_properties(norma_torch PROPERTIES CXX_VISIBILITY_PRESET default
        BUILD_RPATH "\$ORIGIN" INSTALL_RPATH "\$ORIGIN")
      set(NORMA_TORCH_BUILT ON)
    endif()
  endif()
endif()
