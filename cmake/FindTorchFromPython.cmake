# Locates LibTorch inside the pip-installed torch wheel via torch.utils.cmake_prefix_path.
# Sets Torch_FOUND. Quietly does nothing when python3 or torch is missing.
set(Torch_FOUND OFF)
find_package(Python3 COMPONENTS Interpreter QUIET)
if(Python3_Interpreter_FOUND)
  execute_process(
    COMMAND ${Python3_EXECUTABLE} -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
    OUTPUT_VARIABLE _torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE _torch_rc ERROR_QUIET)
  if(_torch_rc EQUAL 0 AND _torch_prefix)
    list(APPEND CMAKE_PREFIX_PATH "${_torch_prefix}")
    find_package(Torch QUIET)
  endif()
endif()
