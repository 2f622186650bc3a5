// The version of lunajit, for programs linking the installed library
// (find_package(lunajit), lunajit::lunajit).
#pragma once

namespace lunajit {

// "0.1.0" (the CMake project version).
const char* version();

}  // namespace lunajit
