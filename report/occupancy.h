// The report's occupancy is the cost model's: codegen/occupancy.h.
#pragma once

#include "codegen/occupancy.h"

namespace lunajit::report {
using lunajit::Occupancy;
using lunajit::OccupancyInput;
using lunajit::theoretical_occupancy;
}  // namespace lunajit::report
