// lunajit::version() (common/version.h). The one source of liblunajit.so, which
// otherwise holds the static component libraries whole (cmake/LunajitInstall.cmake).
#include "common/version.h"

namespace lunajit {

const char* version() { return LUNAJIT_VERSION; }

}  // namespace lunajit
