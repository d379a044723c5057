# EXPERTD_CUDA=AUTO builds the CUDA device backend when a toolkit is found; ON requires it; OFF
# skips it. The result is EXPERTD_HAVE_CUDA, and EXPERTD_NO_CUDA_REASON says why when it is OFF.
# CUDA code lives only in the expertd_device_cuda target; nothing here adds directory-wide
# definitions.
set(EXPERTD_HAVE_CUDA OFF)
set(EXPERTD_NO_CUDA_REASON "configured with -DEXPERTD_CUDA=OFF")
if(NOT EXPERTD_CUDA MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "EXPERTD_CUDA must be AUTO, ON or OFF (got '${EXPERTD_CUDA}')")
endif()
if(NOT EXPERTD_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER)
    find_program(EXPERTD_NVCC nvcc HINTS ENV CUDA_PATH PATHS /usr/local/cuda/bin NO_CACHE)
    if(EXPERTD_NVCC)
      set(CMAKE_CUDA_COMPILER ${EXPERTD_NVCC})
    endif()
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      # Hopper by default (H100/H200); override with -DCMAKE_CUDA_ARCHITECTURES=...
      set(CMAKE_CUDA_ARCHITECTURES 90)
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(EXPERTD_HAVE_CUDA ON)
  elseif(EXPERTD_CUDA STREQUAL "ON")
    message(FATAL_ERROR "EXPERTD_CUDA=ON but no CUDA toolkit (nvcc) was found; "
                        "install it or configure with -DEXPERTD_CUDA=AUTO|OFF")
  else()
    set(EXPERTD_NO_CUDA_REASON
        "no CUDA toolkit (nvcc in PATH, $CUDA_PATH/bin or /usr/local/cuda/bin) at configure time")
    message(STATUS "CUDA toolkit not found: building without the CUDA device backend")
  endif()
endif()
