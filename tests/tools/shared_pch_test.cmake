# Every translation unit that sees LibTorch's headers compiles with hp_torch_pch's one
# precompiled header (cmake/hp_torch.cmake, hp_share_torch_pch): a target left out parses
# those headers again in each of its sources, about twice their compile time. Sources
# compiled with -fopenmp are the exception (the header is built without it, and
# at::parallel_for's body depends on it): src/hp/tensor/CMakeLists.txt names them.
#   cmake -DCOMPILE_COMMANDS=<build>/compile_commands.json -DTORCH_INCLUDE=<torch>/include -P shared_pch_test.cmake
file(READ ${COMPILE_COMMANDS} json)
string(JSON count LENGTH "${json}")
math(EXPR last "${count} - 1")
set(torch_sources 0)
set(missing "")
foreach(i RANGE ${last})
  string(JSON entry GET "${json}" ${i})
  string(JSON command GET "${entry}" command)
  string(FIND "${command}" "${TORCH_INCLUDE}" sees_torch)
  if(sees_torch EQUAL -1)
    continue()
  endif()
  math(EXPR torch_sources "${torch_sources} + 1")
  string(FIND "${command}" " -fopenmp" openmp)
  if(NOT openmp EQUAL -1)
    continue()
  endif()
  string(FIND "${command}" "/hp_torch_pch.dir/cmake_pch.hxx" shares)
  if(shares EQUAL -1)
    string(JSON file GET "${entry}" file)
    string(APPEND missing "\n  ${file}")
  endif()
endforeach()
if(torch_sources EQUAL 0)
  message(FATAL_ERROR "no source of ${COMPILE_COMMANDS} includes ${TORCH_INCLUDE}: nothing was checked")
endif()
if(missing)
  message(FATAL_ERROR "these LibTorch sources compile without the shared precompiled header (call "
                      "hp_share_torch_pch for their targets):${missing}")
endif()
message(STATUS "${torch_sources} LibTorch sources, all with the shared precompiled header")
