# Locates LibTorch inside the pip-installed torch wheel (torch/share/cmake, the folder that
# torch.utils.cmake_prefix_path names) and defines the interface target `trainplan_torch`.
# Sets Torch_FOUND and TRAINPLAN_EXEC_CUDA. Quietly does nothing when python3 or torch is missing.
#
# Two ways to build (TRAINPLAN_EXEC_CUDA = AUTO | ON | OFF):
#  - CUDA: torch's own TorchConfig.cmake (find_package(Torch)), linking libtorch + libtorch_cuda,
#    with NCCL. AUTO picks it when `import torch` works and torch.cuda.is_available() (a GPU
#    machine with the full torch install and its nvidia-* wheels).
#  - CPU: only libtorch_cpu.so and libc10.so from the wheel. This is what a CPU machine with
#    `pip install --no-deps torch` can load (libtorch.so pulls libtorch_cuda.so and the CUDA/cuDNN/
#    NCCL wheels, which are not installed there). We do not call TorchConfig.cmake here because it
#    requires the CUDA toolkit (and finds the system one on build machines that have it).
# Both add exec/gloo_shim: the wheel ships ProcessGroupGloo.hpp but not Gloo's headers.
set(Torch_FOUND OFF)
set(TRAINPLAN_EXEC_CUDA_MODE AUTO CACHE STRING "Build exec/ with CUDA and NCCL: AUTO, ON or OFF")
set_property(CACHE TRAINPLAN_EXEC_CUDA_MODE PROPERTY STRINGS AUTO ON OFF)
set(TRAINPLAN_EXEC_CUDA OFF)

find_package(Python3 COMPONENTS Interpreter QUIET)
if(Python3_Interpreter_FOUND)
  # Find the package folder without importing torch (importing needs the CUDA wheels).
  execute_process(
    COMMAND ${Python3_EXECUTABLE} -c
      "import importlib.util as u, os; s = u.find_spec('torch'); print(os.path.dirname(s.origin))"
    OUTPUT_VARIABLE _torch_dir OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE _torch_rc ERROR_QUIET)
  if(_torch_rc EQUAL 0 AND EXISTS "${_torch_dir}/include/torch/csrc/api/include/torch/torch.h")
    set(_want_cuda ${TRAINPLAN_EXEC_CUDA_MODE})
    if(_want_cuda STREQUAL "AUTO")
      execute_process(
        COMMAND ${Python3_EXECUTABLE} -c
          "import sys, torch; sys.exit(0 if torch.version.cuda and torch.cuda.is_available() else 1)"
        RESULT_VARIABLE _cuda_rc OUTPUT_QUIET ERROR_QUIET)
      if(_cuda_rc EQUAL 0)
        set(_want_cuda ON)
      else()
        set(_want_cuda OFF)
      endif()
    endif()

    add_library(trainplan_torch INTERFACE)
    target_include_directories(trainplan_torch SYSTEM INTERFACE
      "${CMAKE_SOURCE_DIR}/exec/gloo_shim")
    target_compile_definitions(trainplan_torch INTERFACE USE_C10D_GLOO USE_DISTRIBUTED)

    if(_want_cuda)
      list(APPEND CMAKE_PREFIX_PATH "${_torch_dir}/share/cmake")
      # trainplan compiles no CUDA kernels; naming the architectures skips Caffe2's try_run GPU
      # detection (which fails under CMAKE_CXX_STANDARD 20: "CUDA20" dialect unknown to CMake).
      if(NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
        set(TORCH_CUDA_ARCH_LIST "8.0;9.0")
      endif()
      find_package(Torch QUIET)
      if(Torch_FOUND OR TORCH_FOUND)
        # nccl.h: from the nvidia-nccl wheel, else the CUDA toolkit or the system.
        find_path(TRAINPLAN_NCCL_INCLUDE nccl.h
          HINTS "${_torch_dir}/../nvidia/nccl/include" "${CUDAToolkit_INCLUDE_DIRS}"
                "${CUDA_TOOLKIT_ROOT_DIR}/include" /usr/local/cuda/include)
        target_link_libraries(trainplan_torch INTERFACE ${TORCH_LIBRARIES})
        target_include_directories(trainplan_torch SYSTEM INTERFACE ${TORCH_INCLUDE_DIRS})
        target_compile_definitions(trainplan_torch INTERFACE TRAINPLAN_EXEC_CUDA=1)
        if(TRAINPLAN_NCCL_INCLUDE)
          target_include_directories(trainplan_torch SYSTEM INTERFACE "${TRAINPLAN_NCCL_INCLUDE}")
          target_compile_definitions(trainplan_torch INTERFACE USE_C10D_NCCL)
        endif()
        set(TRAINPLAN_EXEC_CUDA ON)
        set(Torch_FOUND ON)
      else()
        message(WARNING "trainplan: TorchConfig.cmake failed with CUDA; building exec/ for CPU")
      endif()
    endif()

    if(NOT TRAINPLAN_EXEC_CUDA)
      find_library(TRAINPLAN_TORCH_CPU_LIB torch_cpu PATHS "${_torch_dir}/lib" NO_DEFAULT_PATH)
      find_library(TRAINPLAN_C10_LIB c10 PATHS "${_torch_dir}/lib" NO_DEFAULT_PATH)
      if(TRAINPLAN_TORCH_CPU_LIB AND TRAINPLAN_C10_LIB)
        target_include_directories(trainplan_torch SYSTEM INTERFACE
          "${_torch_dir}/include" "${_torch_dir}/include/torch/csrc/api/include")
        target_link_libraries(trainplan_torch INTERFACE
          "${TRAINPLAN_TORCH_CPU_LIB}" "${TRAINPLAN_C10_LIB}" Threads::Threads)
        # The wheel's libraries find their neighbours through RPATH $ORIGIN; ours need the folder.
        target_link_options(trainplan_torch INTERFACE "LINKER:-rpath,${_torch_dir}/lib")
        set(Torch_FOUND ON)
      endif()
    endif()
    if(Torch_FOUND)
      message(STATUS "trainplan: LibTorch from ${_torch_dir} (CUDA ${TRAINPLAN_EXEC_CUDA})")
    endif()
  endif()
endif()
